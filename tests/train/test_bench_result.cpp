// The benchmark's JSON (bench.json, and what a matrix cell hands back to its parent): every
// field a result carries comes back from it as written, the GPU's clock, power and energy included,
// and the reference run it was set beside.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/random.h"
#include "support/fresh_random.h"
#include "train/benchmark.h"

namespace smelt {
namespace {

TEST(BenchResult, JsonCarriesEveryFieldBackAsWritten) {
  testing_support::FreshRandom random;
  auto any = [&](double low, double high) { return random.uniform(low, high); };
  BenchResult r;
  r.label = "llama3_8b x" + std::to_string(random.below(32) + 1) + " fp8-tensorwise selective-op";
  r.device = "cuda";
  r.precision = "fp8-tensorwise";
  r.policy = "selective-op";
  r.batch = int64_t(random.below(8) + 1);
  r.seq_len = int64_t(random.below(8192) + 1);
  r.layers = int64_t(random.below(32) + 1);
  r.tokens_per_second = any(1e3, 1e5);
  r.step_ms = any(10, 500);
  r.step_ms_min = any(10, 500);
  r.step_ms_max = any(10, 500);
  r.tflops = any(1, 1000);
  r.mfu_percent = any(1, 99);
  r.predicted_bytes = size_t(random.below(uint64_t(1) << 40));
  r.predicted_step_ms = any(10, 500);
  r.measured_bytes = size_t(random.below(uint64_t(1) << 40));
  r.first_loss = any(1, 12);
  r.last_loss = any(1, 12);
  r.sm_clock_mhz = any(500, 1980);
  r.sm_clock_max_mhz = any(500, 1980);
  r.power_watts = any(50, 700);
  r.power_limit_watts = any(300, 700);
  r.power_capped = any(0, 1);
  r.temperature_c = any(20, 90);
  r.joules_per_step = any(1, 500);
  r.tokens_per_joule = any(1, 100);
  r.gpu_name = random.below(2) ? "NVIDIA H200" : "NVIDIA H100 80GB HBM3";
  ReferenceRun run;
  auto between = [&](int64_t low, int64_t high) { return low + static_cast<int64_t>(random.below(uint64_t(high - low + 1))); };
  run.model = {"model " + std::to_string(random.below(100)), 64 * between(1, 64), between(1, 32), between(1, 32),
               between(1, 8), 128 * between(1, 128), between(1000, 200000)};
  run.batch = between(1, 8);
  run.seq_len = 1024 * between(1, 8);
  run.precision = random.below(2) ? "bf16" : "fp8-rowwise";
  run.activation_checkpoint = random.below(2) ? "none" : "selective-op";
  run.fusion = random.below(2) ? "full" : "linear";
  run.compile = "full (per block)";
  run.place = "table.toml:" + std::to_string(random.below(200) + 1) + ":1";
  run.tokens_per_second = any(1e3, 1e5);
  run.peak_gb = any(1, 140);
  r.reference = run;
  r.reference_source = "an engine " + std::to_string(random.below(1000));
  const BenchResult back = bench_from_json(nlohmann::json::parse(bench_to_json(r).dump()));
  EXPECT_EQ(back.label, r.label);
  EXPECT_EQ(back.device, r.device);
  EXPECT_EQ(back.precision, r.precision);
  EXPECT_EQ(back.policy, r.policy);
  EXPECT_EQ(back.batch, r.batch);
  EXPECT_EQ(back.seq_len, r.seq_len);
  EXPECT_EQ(back.layers, r.layers);
  EXPECT_EQ(back.predicted_bytes, r.predicted_bytes);
  EXPECT_EQ(back.measured_bytes, r.measured_bytes);
  const std::pair<double, double> numbers[] = {
      {back.tokens_per_second, r.tokens_per_second}, {back.step_ms, r.step_ms},
      {back.predicted_step_ms, r.predicted_step_ms},
      {back.step_ms_min, r.step_ms_min},             {back.step_ms_max, r.step_ms_max},
      {back.tflops, r.tflops},                       {back.mfu_percent, r.mfu_percent},
      {back.first_loss, r.first_loss},               {back.last_loss, r.last_loss},
      {back.sm_clock_mhz, r.sm_clock_mhz},           {back.sm_clock_max_mhz, r.sm_clock_max_mhz},
      {back.power_watts, r.power_watts},             {back.power_limit_watts, r.power_limit_watts},
      {back.power_capped, r.power_capped},           {back.temperature_c, r.temperature_c},
      {back.joules_per_step, r.joules_per_step},     {back.tokens_per_joule, r.tokens_per_joule}};
  for (size_t i = 0; i < std::size(numbers); ++i) EXPECT_DOUBLE_EQ(numbers[i].first, numbers[i].second) << "field " << i;
  EXPECT_EQ(back.gpu_name, r.gpu_name);
  ASSERT_TRUE(back.has_reference());
  EXPECT_EQ(back.reference_source, r.reference_source);
  EXPECT_EQ(back.reference->compile, run.compile);
  EXPECT_EQ(back.reference->place, run.place);
  EXPECT_DOUBLE_EQ(back.reference->tokens_per_second, run.tokens_per_second);
  EXPECT_DOUBLE_EQ(back.reference->peak_gb, run.peak_gb);
  const ReferenceModel& m = back.reference->model;
  EXPECT_EQ(m.name, run.model.name);
  EXPECT_EQ(std::vector<int64_t>({m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.ffn_dim, m.vocab_size}),
            std::vector<int64_t>({run.model.dim, run.model.n_layers, run.model.n_heads, run.model.n_kv_heads,
                                  run.model.ffn_dim, run.model.vocab_size}));
  EXPECT_EQ(back.reference->batch, run.batch);
  EXPECT_EQ(back.reference->seq_len, run.seq_len);
  EXPECT_EQ(back.reference->precision, run.precision);
  EXPECT_EQ(back.reference->activation_checkpoint, run.activation_checkpoint);
  EXPECT_EQ(back.reference->fusion, run.fusion);
  EXPECT_DOUBLE_EQ(bench_to_json(r)["reference"]["speedup"].get<double>(), r.tokens_per_second / run.tokens_per_second);
  // Without a reference, none comes back (null in the JSON).
  r.reference.reset();
  EXPECT_FALSE(bench_from_json(nlohmann::json::parse(bench_to_json(r).dump())).has_reference());
  EXPECT_TRUE(bench_to_json(r)["reference"].is_null());
}

}  // namespace
}  // namespace smelt
