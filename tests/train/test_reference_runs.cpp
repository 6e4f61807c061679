// Reference runs: the built-in table reads, every run is found from its own description and no
// other description finds it, and a bad table is an error naming its file, line and key.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "support/fresh_random.h"
#include "train/reference_runs.h"

namespace smelt {
namespace {

ReferenceQuery query_for(const ReferenceRun& run, const std::string& gpu_name) {
  ReferenceQuery q;
  q.gpu_name = gpu_name;
  q.model = run.model;
  q.batch = run.batch;
  q.seq_len = run.seq_len;
  q.precision = run.precision;
  q.activation_checkpoint = run.activation_checkpoint;
  q.fusion = run.fusion.empty() ? "full" : run.fusion;
  return q;
}

// The device name a table's runs were on ("H200" -> "NVIDIA H200").
std::string device_of(const ReferenceTable& table) {
  return table.gpu.rfind("NVIDIA", 0) == 0 ? table.gpu : "NVIDIA " + table.gpu;
}

// True when `run` (of `table`) describes the step `q` asks about (what find_reference promises of
// its answer).
bool describes(const ReferenceTable& table, const ReferenceRun& run, const ReferenceQuery& q) {
  const ReferenceModel& a = run.model;
  const ReferenceModel& b = q.model;
  return q.gpu_name.find(table.gpu) != std::string::npos && a.dim == b.dim && a.n_layers == b.n_layers &&
         a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads && a.ffn_dim == b.ffn_dim &&
         a.vocab_size == b.vocab_size && run.batch == q.batch && run.seq_len == q.seq_len &&
         run.precision == q.precision && run.activation_checkpoint == q.activation_checkpoint &&
         (run.fusion.empty() || run.fusion == q.fusion) && q.single_device_step &&
         (q.precision.rfind("fp8-", 0) != 0 || q.all_block_linears_in_float8);
}

TEST(ReferenceRuns, TheBuiltInTablesAreOnePerGpu) {
  const std::vector<ReferenceTable> tables = builtin_reference_tables();
  ASSERT_GE(tables.size(), 2u);
  std::vector<std::string> gpus;
  for (const auto& table : tables) {
    EXPECT_FALSE(table.source.empty()) << table.path;
    EXPECT_FALSE(table.runs.empty()) << table.path;
    for (const auto& other : gpus) EXPECT_NE(other, table.gpu) << "two built-in tables for one GPU";
    gpus.push_back(table.gpu);
    for (const auto& run : table.runs) {
      EXPECT_GT(run.tokens_per_second, 1000) << run.place;
      EXPECT_GT(run.peak_gb, 1.0) << run.place;
      EXPECT_TRUE(run.model.name == "llama3_8b_proxy" || run.model.name == "llama3_1b") << run.place;
      // Each run's place names its own file (the table's path without " (built in)").
      EXPECT_EQ(run.place.rfind(table.path.substr(0, table.path.find(' ')), 0), 0u) << run.place << " in " << table.path;
    }
  }
  const ReferenceTable h200 = builtin_reference_table("NVIDIA H200");
  EXPECT_EQ(h200.gpu, "H200");
  EXPECT_NE(h200.path.find("pytorch_h200.toml"), std::string::npos);
  EXPECT_GE(h200.runs.size(), 14u);
  const ReferenceTable h100 = builtin_reference_table("NVIDIA H100 80GB HBM3");
  EXPECT_NE(h100.path.find("pytorch_h100.toml"), std::string::npos);
  EXPECT_TRUE(runs_on(h100, "NVIDIA H100 80GB HBM3"));
  EXPECT_FALSE(runs_on(h100, "NVIDIA H100 PCIe")) << "a PCIe H100 (350 W) is not the SXM part the runs were on";
  EXPECT_FALSE(runs_on(h100, "NVIDIA H200"));
  EXPECT_FALSE(runs_on(h200, "NVIDIA H100 80GB HBM3"));
  EXPECT_TRUE(runs_on(h200, "nvidia h200"));
  // A GPU no table was measured on gets a table whose runs match none of its steps.
  const ReferenceTable other = builtin_reference_table("cpu");
  ASSERT_FALSE(other.runs.empty());
  EXPECT_FALSE(find_reference(other, query_for(other.runs.front(), "cpu")));
}

// The proxy's bf16 steps on an H100 compare with PyTorch compiled on the H100, not the H200's figures.
TEST(ReferenceRuns, AnH100StepFindsTheH100sRun) {
  const ReferenceTable h100 = builtin_reference_table("NVIDIA H100 80GB HBM3");
  const ReferenceTable h200 = builtin_reference_table("NVIDIA H200");
  for (const char* policy : {"none", "selective-op"}) {
    ReferenceQuery q = query_for(h100.runs.front(), "NVIDIA H100 80GB HBM3");
    q.precision = "bf16";
    q.activation_checkpoint = policy;
    const auto found = find_reference(h100, q);
    ASSERT_TRUE(found) << policy;
    EXPECT_NE(found->place.find("pytorch_h100.toml"), std::string::npos);
    EXPECT_EQ(found->compile, "full (per block)") << "compiled is faster than eager";
    EXPECT_FALSE(find_reference(h200, q)) << "the H200's runs describe another GPU";
    q.gpu_name = "NVIDIA H200";
    const auto there = find_reference(h200, q);
    ASSERT_TRUE(there) << policy;
    EXPECT_NE(there->tokens_per_second, found->tokens_per_second);
  }
}

TEST(ReferenceRuns, EachRunIsFoundFromItsOwnDescriptionAsTheFastestThatMatches) {
  for (const ReferenceTable& table : builtin_reference_tables()) {
    const std::string device = device_of(table);
    for (const auto& run : table.runs) {
      const auto found = find_reference(table, query_for(run, device));
      ASSERT_TRUE(found) << run.place;
      EXPECT_TRUE(describes(table, *found, query_for(run, device))) << run.place << " found " << found->place;
      EXPECT_GE(found->tokens_per_second, run.tokens_per_second) << run.place;
      // The fastest of those that match (bf16 eager and compiled describe one step: compiled wins).
      for (const auto& other : table.runs)
        if (describes(table, other, query_for(run, device))) {
          EXPECT_GE(found->tokens_per_second, other.tokens_per_second);
        }
    }
    // The proxy's bf16 step without checkpointing: PyTorch compiled, not eager.
    ReferenceQuery proxy = query_for(table.runs.front(), device);
    proxy.precision = "bf16";
    proxy.activation_checkpoint = "none";
    ASSERT_TRUE(find_reference(table, proxy)) << table.path;
    EXPECT_EQ(find_reference(table, proxy)->compile, "full (per block)") << table.path;
  }
}

TEST(ReferenceRuns, AnyOtherStepFindsOnlyARunThatDescribesIt) {
  testing_support::FreshRandom random;
  const std::vector<ReferenceTable> tables = builtin_reference_tables();
  int unmatched = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const ReferenceTable& table = tables[random.below(tables.size())];
    const ReferenceRun& run = table.runs[random.below(table.runs.size())];
    ReferenceQuery q = query_for(run, device_of(table));
    const int64_t step = int64_t(random.below(3)) + 1;
    switch (random.below(13)) {
      case 0: {
        const char* gpus[] = {"NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H100 PCIe", "cpu"};
        q.gpu_name = gpus[random.below(4)];
        break;
      }
      case 1: q.model.dim += 256 * step; break;
      case 2: q.model.n_layers += step; break;
      case 3: q.model.n_heads = q.model.n_heads * 2; break;
      case 4: q.model.n_kv_heads = q.model.n_kv_heads / 2; break;
      case 5: q.model.ffn_dim -= 256 * step; break;
      case 6: q.model.vocab_size = 32000; break;
      case 7: q.batch += step; break;
      case 8: q.seq_len = random.below(2) ? q.seq_len / 2 : q.seq_len * 2; break;
      case 9: {
        const char* precisions[] = {"bf16", "f32", "fp8-tensorwise", "fp8-rowwise", "fp8-blockwise"};
        q.precision = precisions[random.below(5)];
        break;
      }
      case 10: {
        const char* policies[] = {"none", "full", "selective-op", "selective-layer:2"};
        q.activation_checkpoint = policies[random.below(4)];
        break;
      }
      case 11: q.fusion = q.fusion == "full" ? "linear" : "full"; break;
      default:
        if (random.below(2)) q.single_device_step = false;
        else q.all_block_linears_in_float8 = false;
    }
    const auto found = find_reference(table, q);
    if (!found) {
      ++unmatched;
      for (const auto& other : table.runs)
        EXPECT_FALSE(describes(table, other, q)) << other.place << " describes the step";
      continue;
    }
    EXPECT_TRUE(describes(table, *found, q)) << "found " << found->place << " for a step it does not describe";
  }
  EXPECT_GT(unmatched, 100);  // most changes describe a step no reference ran
}

const char* kGoodTable = R"(source = "an engine"
gpu = "H200"
[models.small]
dim = 256
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 768
vocab_size = 258
[[runs]]
model = "small"
batch = 2
seq_len = 128
precision = "fp8-tensorwise"
activation_checkpoint = "selective-op"
fusion = "linear"
tokens_per_second = 1234.5
)";

// `table` with the line starting with `key` replaced by `line` ("" removes it).
std::string with_line(const std::string& key, const std::string& line) {
  std::string text = kGoodTable;
  const size_t at = text.find("\n" + key) + 1;
  const size_t end = text.find('\n', at);
  return text.substr(0, at) + line + (line.empty() ? "" : "\n") + text.substr(end + 1);
}

void expect_error(const std::string& text, const std::vector<std::string>& expected) {
  try {
    parse_reference_table(text, "mine.toml");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::config);
    for (const auto& part : expected) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << "'" << part << "' not in: " << e.what();
  }
}

// The line bench and plan print: the run's figures, smelt's ratio to its tokens/s and the memory
// difference, each from fresh figures; no memory part when the run has no peak or smelt no bytes.
TEST(ReferenceRuns, TheComparisonLineSetsSmeltsFiguresBesideTheRuns) {
  testing_support::FreshRandom random;
  for (int trial = 0; trial < 20; ++trial) {
    ReferenceRun run;
    run.compile = "compile " + std::to_string(random.below(100));
    run.place = "t.toml:" + std::to_string(1 + random.below(90));
    run.tokens_per_second = random.uniform(1e3, 1e5);
    run.peak_gb = random.uniform(1, 140);
    const double ours = random.uniform(1e3, 1e5), bytes = random.uniform(1, 140) * 1e9;
    const std::string line = compare_with_reference("an engine", run, "smelt", ours, bytes);
    char want[256];
    std::snprintf(want, sizeof want, "reference: an engine (%s; %s): %.0f tokens/s at %.1f GB peak; smelt %.2fx its tokens/s, %.1f GB %s memory",
                  ("compile " + run.compile).c_str(), run.place.c_str(), run.tokens_per_second, run.peak_gb,
                  ours / run.tokens_per_second, std::abs(run.peak_gb - bytes / 1e9),
                  bytes / 1e9 <= run.peak_gb ? "less" : "more");
    EXPECT_EQ(line, want);
    EXPECT_EQ(compare_with_reference("an engine", run, "predicted", ours, 0).find("memory"), std::string::npos);
    EXPECT_NE(compare_with_reference("an engine", run, "predicted", ours, 0).find("; predicted "), std::string::npos);
    run.peak_gb = 0;
    const std::string no_peak = compare_with_reference("an engine", run, "smelt", ours, bytes);
    EXPECT_EQ(no_peak.find(" GB"), std::string::npos) << no_peak;
  }
}

// A run written as bench.json writes it reads back field for field.
TEST(ReferenceRuns, ARunComesBackFromItsJson) {
  const ReferenceTable table = builtin_reference_table("NVIDIA H200");
  ASSERT_FALSE(table.runs.empty());
  for (const ReferenceRun& run : table.runs) {
    const nlohmann::json j = nlohmann::json::parse(reference_run_json(table.source, run).dump());
    EXPECT_EQ(j["source"], table.source);
    const ReferenceRun back = reference_run_from_json(j);
    EXPECT_TRUE(find_reference({table.source, table.gpu, "back", {back}}, query_for(run, "NVIDIA H200")).has_value())
        << run.place;
    EXPECT_EQ(back.place, run.place);
    EXPECT_EQ(back.compile, run.compile);
    EXPECT_EQ(back.model.name, run.model.name);
    EXPECT_DOUBLE_EQ(back.tokens_per_second, run.tokens_per_second);
    EXPECT_DOUBLE_EQ(back.peak_gb, run.peak_gb);
  }
}

TEST(ReferenceRuns, AGoodTableReadsAsWritten) {
  const ReferenceTable table = parse_reference_table(kGoodTable, "mine.toml");
  ASSERT_EQ(table.runs.size(), 1u);
  const ReferenceRun& run = table.runs[0];
  EXPECT_EQ(run.model.dim, 256);
  EXPECT_EQ(run.model.n_kv_heads, 2);
  EXPECT_EQ(run.batch, 2);
  EXPECT_EQ(run.fusion, "linear");
  EXPECT_DOUBLE_EQ(run.tokens_per_second, 1234.5);
  EXPECT_EQ(run.peak_gb, 0);
  EXPECT_EQ(run.place, "mine.toml:10:1");
}

TEST(ReferenceRuns, ABadTableNamesItsFileLineAndKey) {
  expect_error(with_line("batch", "batch = 0"), {"mine.toml:12:", "'batch' must be a positive integer"});
  expect_error(with_line("batch", "batches = 2"), {"mine.toml:12:", "unknown key 'batches'", "batch"});
  expect_error(with_line("seq_len", ""), {"mine.toml:10:", "no 'seq_len'"});
  expect_error(with_line("model", "model = \"large\""), {"mine.toml:11:", "'large'", "small"});
  expect_error(with_line("precision", "precision = \"fp16\""), {"mine.toml:14:", "fp16"});
  expect_error(with_line("precision", "precision = \"fp8-columnwise\""), {"mine.toml:14:", "columnwise"});
  expect_error(with_line("activation_checkpoint", "activation_checkpoint = \"auto\""), {"mine.toml:15:", "auto"});
  expect_error(with_line("activation_checkpoint", "activation_checkpoint = \"some\""), {"mine.toml:15:", "some"});
  expect_error(with_line("fusion", "fusion = \"partial\""), {"mine.toml:16:", "partial"});
  expect_error(with_line("precision", "precision = \"bf16\""), {"mine.toml:16:", "'fusion' applies to float8 runs"});
  expect_error(with_line("tokens_per_second", "tokens_per_second = \"fast\""), {"mine.toml:17:", "tokens_per_second"});
  expect_error(with_line("n_heads", "n_heads = -4"), {"mine.toml:6:", "n_heads"});
  expect_error(with_line("gpu", "gpu = \"\""), {"mine.toml:2:", "'gpu' is empty"});
  expect_error(with_line("gpu", "device = \"H200\""), {"mine.toml:2:", "unknown key 'device'"});
  expect_error(std::string(kGoodTable) + "[oops\n", {"mine.toml:18:", "TOML syntax error"});
}

}  // namespace
}  // namespace smelt
