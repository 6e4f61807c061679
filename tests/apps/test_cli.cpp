// The smelt command line: exit codes and messages for bad input, and `smelt plan`
// output for a model far larger than this machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/run_command.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace {

namespace fs = std::filesystem;
using smelt::testing_support::Outcome;
using smelt::testing_support::run_command;

Outcome run_smelt(const std::string& arguments) { return run_command(std::string(SMELT_BINARY_DIR) + "/smelt " + arguments); }

std::string config(const char* name) { return std::string(SMELT_SOURCE_DIR) + "/configs/" + name; }

// The JSON a command prints (`smelt plan --format json ...`); a run that fails fails the test and
// gives null.
nlohmann::json run_json(const std::string& arguments) {
  Outcome o = run_smelt(arguments);
  EXPECT_EQ(o.exit_code, 0) << arguments << "\n" << o.output;
  return o.exit_code == 0 ? nlohmann::json::parse(o.output) : nlohmann::json();
}

TEST(Cli, PlanPrintsTheBreakdownForEightBillion) {
  Outcome o = run_smelt("plan --config " + config("llama3_8b.toml") + " --activation_checkpoint.mode=selective-op");
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* expected : {"llama3_8b: 32 layers", "selective-op", "parameters", "gradients", "optimizer state",
                               "activations", "recompute", "peak at step", "checkpointing policies", "full"})
    EXPECT_NE(o.output.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << o.output;
}

TEST(Cli, PlanJsonIsMachineReadable) {
  const auto j = run_json("plan --config " + config("llama3_8b_proxy.toml") + " --format json --memory-budget-gb 80");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["model"]["n_layers"], 8);
  EXPECT_GT(j["arena_bytes"].get<double>(), 40e9);
  EXPECT_EQ(j["policies"].size(), 4u);
  for (const auto& p : j["policies"]) EXPECT_TRUE(p["fits"].is_boolean());
  // The planner's head choices at batch 1: one loss chunk, bf16 linear gradients, and the output
  // projection's copy persistent (the head is the peak); at batch 2 its peak is elsewhere.
  EXPECT_EQ(j["loss_chunk_tokens"], 8192);
  EXPECT_EQ(j["linear_gradients_dtype"], "bf16");
  EXPECT_EQ(j["output_weight_copy"], "persistent");
  // smelt eval's forward-only arena: the weights in bf16, far less than the training step's
  EXPECT_LT(j["evaluation_arena_bytes"].get<double>(), j["arena_bytes"].get<double>() - 20e9);
  EXPECT_GT(j["evaluation_arena_bytes"].get<double>(), 2.79e9 * 2);  // bf16 weights
  // (the batch's largest under the budget: a positive count for every fixed policy)
  for (const auto& p : j["policies"]) EXPECT_GE(p["largest_batch"]["local_batch_size"].get<int64_t>(), 1);
  const auto two = run_json("plan --config " + config("llama3_8b_proxy.toml") + " --format json --training.local_batch_size=2");
  EXPECT_EQ(two["output_weight_copy"], "per_step");
  const auto f32 = run_json("plan --config " + config("llama3_8b_proxy.toml") +
                            " --format json --training.mixed_precision_param=float32");
  EXPECT_EQ(f32["output_weight_copy"], "none");
}

// Each row of the policy comparison is the plan that policy would run: its arena and predicted
// step time equal those `smelt plan` reports with that policy configured (the planner's loss chunk
// and output copy chosen for it, not carried over from the configured policy). At batch 2 the
// policies differ there: selective-layer:2 takes 4096-token chunks, selective-op 2048; at batch 1
// with float8 every policy keeps the output copy.
TEST(Cli, EachPolicyRowIsThePlanThatPolicyRuns) {
  for (const char* variant : {" --training.local_batch_size=2", " --float8.recipe=tensorwise"}) {
    SCOPED_TRACE(variant);
    const std::string base = "plan --config " + config("llama3_8b_proxy.toml") + " --format json" + variant;
    const auto j = run_json(base);
    ASSERT_FALSE(j.is_null());
    ASSERT_EQ(j["policies"].size(), 4u);
    std::set<int64_t> chunks;
    std::set<std::string> copies;
    for (const auto& row : j["policies"]) {
      const std::string policy = row["policy"].get<std::string>();
      const auto k = run_json(base + " --activation_checkpoint.mode=" + policy);
      ASSERT_FALSE(k.is_null());
      EXPECT_EQ(row["arena_bytes"], k["arena_bytes"]) << policy;
      EXPECT_EQ(row["prediction"]["step_seconds"], k["prediction"]["step_seconds"]) << policy;
      chunks.insert(k["loss_chunk_tokens"].get<int64_t>());
      copies.insert(k["output_weight_copy"].get<std::string>());
    }
    if (std::string(variant).find("batch_size=2") != std::string::npos) {
      EXPECT_GT(chunks.size(), 1u) << "the batch-2 policies should choose different loss chunks";
    } else {
      EXPECT_EQ(copies, std::set<std::string>{"persistent"});
    }
  }
}

// `smelt plan` lists the loss chunks the planner weighs: each row is the plan that chunk runs
// (its arena and step time as `smelt plan` reports with the chunk set), and the marked one is the
// largest whose arena is within the allowance above the first's. Accumulating four microbatches
// (f32 gradients added to) the proxy takes 4096 there.
TEST(Cli, EachLossChunkRowIsThePlanThatChunkRuns) {
  const std::string base = "plan --config " + config("llama3_8b_proxy.toml") +
                           " --format json --float8.recipe=tensorwise --training.global_batch_size=4";
  const auto j = run_json(base);
  ASSERT_FALSE(j.is_null());
  const auto& rows = j["loss_chunks"];
  ASSERT_EQ(rows.size(), 3u);
  const double first = rows[0]["arena_bytes"].get<double>();
  int64_t expected = 0, marked = 0;
  for (const auto& row : rows) {
    const int64_t chunk = row["loss_chunk_tokens"].get<int64_t>();
    if (row["arena_bytes"].get<double>() <= first * 1.02) expected = chunk;
    if (row["this_config"].get<bool>()) marked = chunk;
    const auto k = run_json(base + " --training.loss_chunk_tokens=" + std::to_string(chunk));
    ASSERT_FALSE(k.is_null());
    EXPECT_EQ(row["arena_bytes"], k["arena_bytes"]) << chunk;
    EXPECT_EQ(row["step_seconds"], k["prediction"]["step_seconds"]) << chunk;
  }
  EXPECT_EQ(marked, j["loss_chunk_tokens"].get<int64_t>());
  EXPECT_EQ(marked, expected);
  EXPECT_EQ(marked, 4096);
  EXPECT_LT(rows[2]["step_seconds"].get<double>(), rows[0]["step_seconds"].get<double>())
      << "fewer chunks read the output projection's f32 gradient back fewer times";
}

// `smelt plan` gives each fixed policy's largest batch under the budget: the run configured with
// that batch plans the same arena and step time and fits; one sequence more does not fit.
TEST(Cli, EachPolicysLargestBatchFitsAndOneMoreDoesNot) {
  const std::string base = "plan --config " + config("llama3_8b_proxy.toml") +
                           " --format json --float8.recipe=tensorwise --memory-budget-gb 80";
  const auto j = run_json(base);
  ASSERT_FALSE(j.is_null());
  ASSERT_EQ(j["policies"].size(), 4u);
  int64_t smallest = 1 << 30, largest = 0;
  for (const auto& row : j["policies"]) {
    const std::string policy = row["policy"].get<std::string>();
    const auto& headroom = row["largest_batch"];
    const int64_t batch = headroom["local_batch_size"].get<int64_t>();
    ASSERT_GE(batch, 1) << policy;
    EXPECT_FALSE(headroom["at_search_limit"].get<bool>()) << policy;
    smallest = std::min(smallest, batch);
    largest = std::max(largest, batch);
    const std::string alone = base + " --activation_checkpoint.mode=" + policy + " --training.local_batch_size=";
    const auto k = run_json(alone + std::to_string(batch));
    ASSERT_FALSE(k.is_null());
    EXPECT_TRUE(k["fits"].get<bool>()) << policy;
    EXPECT_EQ(headroom["arena_bytes"], k["arena_bytes"]) << policy;
    EXPECT_EQ(headroom["step_seconds"], k["prediction"]["step_seconds"]) << policy;
    const auto more = run_json(alone + std::to_string(batch + 1));
    ASSERT_FALSE(more.is_null());
    EXPECT_FALSE(more["fits"].get<bool>()) << policy << " at batch " << batch + 1;
  }
  EXPECT_GT(largest, smallest) << "recomputing more should fit a larger batch";
}

// `smelt eval` refuses weights that are not there (naming them) and a batch count below one.
TEST(Cli, EvalNamesMissingWeightsAndRefusesZeroBatches) {
  const smelt::testing_support::TemporaryFolder folder;
  Outcome missing = run_smelt("eval --weights " + folder.path("no_run"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("--weights"), std::string::npos) << missing.output;
  EXPECT_NE(missing.output.find(folder.path("no_run")), std::string::npos) << missing.output;
  Outcome zero = run_smelt("eval --weights " + folder.path() + " --batches 0");
  EXPECT_EQ(zero.exit_code, 2) << zero.output;
  EXPECT_NE(zero.output.find("--batches"), std::string::npos) << zero.output;
  Outcome none = run_smelt("eval");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("--weights"), std::string::npos) << none.output;
}

TEST(Cli, UnknownOverrideKeyExitsWithTwoAndNamesTheKey) {
  Outcome o = run_smelt("plan --training.sequence_length=4");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("training.sequence_length"), std::string::npos) << o.output;
}

TEST(Cli, BadValueInAFileNamesFileLineAndKey) {
  const smelt::testing_support::TemporaryFolder folder;
  const fs::path file = folder.write("bad_value.toml", "[training]\nsteps = 10\nseq_len = \"long\"\n");
  Outcome o = run_smelt("train --config " + file.string());
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("seq_len"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(file.filename().string()), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(":3"), std::string::npos) << o.output;
}

TEST(Cli, MissingConfigFileExitsWithTwo) {
  Outcome o = run_smelt("train --config /nonexistent/smelt.toml");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_NE(o.output.find("/nonexistent/smelt.toml"), std::string::npos) << o.output;
}

TEST(Cli, BadPolicyAndOutOfRangeValuesExitWithTwo) {
  Outcome policy = run_smelt("plan --activation_checkpoint.mode=sometimes");
  EXPECT_EQ(policy.exit_code, 2);
  EXPECT_NE(policy.output.find("activation_checkpoint.mode"), std::string::npos) << policy.output;
  Outcome range = run_smelt("plan --training.local_batch_size=0");
  EXPECT_EQ(range.exit_code, 2);
  EXPECT_NE(range.output.find("training.local_batch_size"), std::string::npos) << range.output;
}

// `smelt import-config`: a torchtitan file becomes a smelt config that `smelt plan` runs; an
// existing output is kept unless --force; a file smelt cannot honour exits 2 and writes nothing.
TEST(Cli, ImportConfigWritesASmeltConfigThatPlans) {
  const smelt::testing_support::TemporaryFolder folder;
  const std::string torchtitan = folder.write(
      "tt.toml", "[model]\nflavor = \"8B\"\nconverters = [\"float8\"]\n[training]\nseq_len = 4096\n"
                 "[activation_checkpoint]\nmode = \"selective\"\nselective_ac_option = \"op\"\n[compile]\nenable = true\n");
  const std::string output = folder.path("smelt.toml");
  Outcome o = run_smelt("import-config --from " + torchtitan + " --output " + output);
  ASSERT_EQ(o.exit_code, 0) << o.output;
  for (const char* expected : {"translated:", "model.flavor = \"8B\" -> model.flavor = \"llama3_8b\"",
                               "set aside", "compile.enable", "wrote "})
    EXPECT_NE(o.output.find(expected), std::string::npos) << "missing '" << expected << "' in:\n" << o.output;
  const auto j = run_json("plan --config " + output + " --format json");
  ASSERT_FALSE(j.is_null());
  EXPECT_EQ(j["model"]["n_layers"], 32);
  EXPECT_EQ(j["policy"], "selective-op");
  // An existing output is kept.
  { std::ofstream(output) << "# mine\n"; }
  Outcome again = run_smelt("import-config --from " + torchtitan + " --output " + output);
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--force"), std::string::npos) << again.output;
  std::ifstream kept(output);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "# mine\n");
  // Tensor parallelism: exit 2, the key and line named, nothing written.
  const std::string parallel = folder.write("tp.toml", "[parallelism]\ntensor_parallel_degree = 8\n");
  Outcome refused = run_smelt("import-config --from " + parallel + " --output " + folder.path("tp_smelt.toml"));
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.output.find("tp.toml:2:"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(folder.path("tp_smelt.toml")));
  // An output folder that does not exist: said before anything is read.
  Outcome nowhere = run_smelt("import-config --from " + torchtitan + " --output " + folder.path("missing/smelt.toml"));
  EXPECT_EQ(nowhere.exit_code, 3);
  EXPECT_NE(nowhere.output.find("does not exist"), std::string::npos) << nowhere.output;
  EXPECT_EQ(nowhere.output.find("translated:"), std::string::npos) << nowhere.output;
}

TEST(Cli, CudaWithoutAGpuIsAClearError) {
  if (fs::exists("/dev/nvidia0")) GTEST_SKIP() << "a GPU is present";
  Outcome o = run_smelt("train --job.device=cuda --training.steps=1");
  EXPECT_NE(o.exit_code, 0);
  EXPECT_NE(o.output.find("cuda"), std::string::npos) << o.output;
}

}  // namespace

// Calibration: the per-op times a traced bench measures become the planner's costs, so the
// calibrated prediction lands near the measured speed (the uncalibrated one is a roofline guess).
TEST(Cli, BenchCalibrationFeedsThePlannersCostModel) {
  const smelt::testing_support::TemporaryFolder temporary;  // removed with what it holds, however the test ends
  const fs::path folder = temporary.path();
  const std::string model = " --config " + config("debug.toml") +
                            " --model.tokenizer_path=byte --model.n_layers=2 --training.seq_len=64";
  const std::string cache = (folder / "timings.json").string();
  Outcome missing_trace = run_smelt("bench" + model + " --steps 1 --warmup 0 --calibrate " + cache);
  EXPECT_EQ(missing_trace.exit_code, 2) << missing_trace.output;
  EXPECT_NE(missing_trace.output.find("--calibrate needs --trace"), std::string::npos) << missing_trace.output;
  EXPECT_FALSE(fs::exists(cache));

  Outcome bench = run_smelt("bench" + model + " --steps 3 --warmup 1 --trace " + (folder / "trace.json").string() +
                            " --calibrate " + cache + " --output " + (folder / "bench.json").string());
  ASSERT_EQ(bench.exit_code, 0) << bench.output;
  ASSERT_TRUE(fs::exists(cache)) << bench.output;
  const auto entries = nlohmann::json::parse(std::ifstream(cache))["entries"];
  EXPECT_GT(entries.size(), 10u);
  for (const auto& e : entries) EXPECT_GT(e["seconds"].get<double>(), 0) << e.dump();

  const auto j = run_json("plan" + model + " --format json --op-timings " + cache);
  ASSERT_FALSE(j.is_null());
  EXPECT_GT(j["prediction"]["calibrated_steps"].get<int>(), 10) << j.dump();
  Outcome bad = run_smelt("plan" + model + " --activation_checkpoint.op_timings=" + (folder / "trace.json").string());
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("op timing cache"), std::string::npos) << bad.output;
}

// The reference column: a run of the table that describes the benchmarked step (here a CPU table
// of the test's own) is set beside it with the ratio of the measured tokens/s; a matrix cell it
// does not describe gets none; a bad table stops the bench before it runs, writing nothing.
TEST(Cli, BenchSetsTheMatchingReferenceRunBesideItsResult) {
  const smelt::testing_support::TemporaryFolder temporary;
  smelt::testing_support::FreshRandom random;
  const std::string model = " --config " + config("debug.toml") +
                            " --model.tokenizer_path=byte --model.n_layers=2 --training.seq_len=64";
  const auto plan = run_json("plan" + model + " --format json");
  ASSERT_FALSE(plan.is_null());
  const auto& m = plan["model"];
  const double reference_speed = random.uniform(100, 100000), reference_gb = random.uniform(0.1, 50);
  // Every digit of a double (std::to_string keeps six decimals, which the checks below would see).
  const auto exact = [](double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", value);
    return std::string(text);
  };
  std::string table = "source = \"a test engine\"\ngpu = \"cpu\"\n[models.tiny]\n";
  for (const char* key : {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"})
    table += std::string(key) + " = " + std::to_string(m[key].get<int64_t>()) + "\n";
  table += "[[runs]]\nmodel = \"tiny\"\nbatch = " + std::to_string(plan["batch_size"].get<int64_t>()) +
           "\nseq_len = 64\nprecision = \"bf16\"\nactivation_checkpoint = \"none\"\ntokens_per_second = " +
           exact(reference_speed) + "\npeak_gb = " + exact(reference_gb) + "\n";
  const std::string file = temporary.write("reference.toml", table);

  const std::string output = temporary.path("bench.json");
  Outcome matrix = run_smelt("bench" + model + " --training.mixed_precision_param=bfloat16 --steps 1 --warmup 0"
                             " --matrix ac=none,full --reference " + file + " --output " + output);
  ASSERT_EQ(matrix.exit_code, 0) << matrix.output;
  EXPECT_NE(matrix.output.find("reference: a test engine"), std::string::npos) << matrix.output;
  const auto cells = nlohmann::json::parse(std::ifstream(output));
  ASSERT_EQ(cells.size(), 2u);
  const auto& matched = cells[0]["reference"];
  ASSERT_TRUE(matched.is_object()) << cells.dump(2);
  EXPECT_NEAR(matched["tokens_per_second"].get<double>(), reference_speed, 1e-6 * reference_speed);
  EXPECT_NEAR(matched["peak_gb"].get<double>(), reference_gb, 1e-6 * reference_gb);
  const double speedup = cells[0]["tokens_per_second"].get<double>() / reference_speed;
  EXPECT_NEAR(matched["speedup"].get<double>(), speedup, 1e-12 * speedup);
  EXPECT_NE(matched["entry"].get<std::string>().find("reference.toml:"), std::string::npos);
  EXPECT_TRUE(cells[1]["reference"].is_null()) << "full checkpointing is not the reference's step";
  EXPECT_NE(matrix.output.find("reference: none of the 1 runs of " + file + " (cpu) describes this step on cpu"),
            std::string::npos) << matrix.output;
  EXPECT_NE(matrix.output.find("scripts/pytorch_reference.py"), std::string::npos) << "how to measure one";
  EXPECT_EQ(cells[0]["gpu_name"], "cpu");

  fs::remove(output);
  Outcome off = run_smelt("bench" + model + " --training.mixed_precision_param=bfloat16 --steps 1 --warmup 0"
                          " --reference none --output " + output);
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(output))["reference"].is_null());

  fs::remove(output);
  const std::string bad = temporary.write("bad.toml", table + "speed = 3\n");
  for (const std::string& matrix_axis : {std::string(), std::string(" --matrix ac=none,full")}) {
    Outcome refused = run_smelt("bench" + model + " --steps 1 --warmup 0 --reference " + bad + " --output " + output +
                                matrix_axis);
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("bad.toml:"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find("unknown key 'speed'"), std::string::npos) << refused.output;
    EXPECT_EQ(refused.output.find("step 1"), std::string::npos) << "the bench ran:\n" << refused.output;
    EXPECT_FALSE(fs::exists(output));
  }
}

// smelt plan names PyTorch's run of the same step on the GPU it plans for (the bench's reference
// column, up front) with the predicted ratio; a GPU or fusion the table has no run of changes it,
// and another GPU's table gives that GPU's run.
TEST(Cli, PlanSetsThePredictionBesidePyTorchsRunOfTheSameStep) {
  const std::string proxy = "plan --config " + config("llama3_8b_proxy.toml") + " --format json --float8.recipe=tensorwise"
                            " --activation_checkpoint.mode=selective-op";
  const auto full = run_json(proxy);
  const auto linear = run_json(proxy + " --float8.fusion=linear");
  const auto h100 = run_json(proxy + " --float8.fusion=linear --gpu h100");
  const auto h100_bf16 = run_json(proxy + " --float8.recipe=none --gpu h100");
  const auto h100_blockwise = run_json(proxy + " --float8.recipe=blockwise --gpu h100");
  ASSERT_FALSE(full.is_null() || linear.is_null() || h100.is_null() || h100_bf16.is_null() || h100_blockwise.is_null());
  for (const auto* j : {&full, &linear}) {
    const auto& reference = (*j)["reference"];
    ASSERT_TRUE(reference.is_object()) << j->dump(2);
    EXPECT_NE(reference["entry"].get<std::string>().find("pytorch_h200.toml"), std::string::npos);
    EXPECT_NEAR(reference["predicted_speedup"].get<double>(),
                (*j)["prediction"]["tokens_per_second"].get<double>() / reference["tokens_per_second"].get<double>(), 1e-9);
    EXPECT_GT(reference["peak_gb"].get<double>(), 1.0);
  }
  EXPECT_EQ(full["reference"]["compile"], "full (per block)");
  EXPECT_EQ(linear["reference"]["compile"], "linear layers only");
  EXPECT_LT(linear["reference"]["tokens_per_second"].get<double>(), full["reference"]["tokens_per_second"].get<double>());
  // The H100 table has no blockwise run (torchao's float8 training has no such recipe).
  EXPECT_TRUE(h100_blockwise["reference"].is_null()) << h100_blockwise["reference"].dump();
  // On an H100, the H100's own PyTorch runs (configs/reference/pytorch_h100.toml), bf16 and float8.
  for (const auto* j : {&h100_bf16, &h100}) {
    const auto& on_h100 = (*j)["reference"];
    ASSERT_TRUE(on_h100.is_object()) << j->dump(2);
    EXPECT_NE(on_h100["entry"].get<std::string>().find("pytorch_h100.toml"), std::string::npos) << on_h100.dump();
    EXPECT_EQ(on_h100["activation_checkpoint"], "selective-op");
    EXPECT_NE(on_h100["tokens_per_second"], linear["reference"]["tokens_per_second"]) << "the H200's run";
  }
  EXPECT_EQ(h100_bf16["reference"]["precision"], "bf16");
  EXPECT_EQ(h100["reference"]["precision"], "fp8-tensorwise");
  EXPECT_EQ(h100["reference"]["compile"], "linear layers only");
  EXPECT_EQ(h100["reference"]["fusion"], "linear");
}
