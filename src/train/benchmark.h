// Benchmark: a config's training step timed on synthetic tokens, reported as
// torchtitan does (median tokens/s after warm-up, TFLOPS, MFU) with the memory
// the plan predicted next to what the driver measured.
#pragma once
#include <iosfwd>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/config.h"
#include "train/reference_runs.h"

namespace smelt {

struct BenchOptions {
  int64_t steps = 10;   // timed steps
  int64_t warmup = 3;   // untimed steps first
  std::string trace_path;  // Chrome trace of the last timed step; also prints where the time goes
  std::string calibrate_path;  // with a trace: op timing cache (JSON) the per-op means are merged into
  // The reference runs the result is set beside: "" the built-in table of the GPU it runs on
  // (configs/reference/pytorch_<gpu>.toml), "none" no comparison, else a TOML file of that form.
  std::string reference_path;
  // False on every rank but 0 of a launch of several: the same steps are run and timed (traced
  // too, so every rank's schedule is the same), but nothing is written.
  bool report = true;
};

struct BenchResult {
  std::string label;              // "llama3_8b x8 bf16 selective-op b1 s8192"
  std::string device;
  std::string gpu_name;           // the device as its driver names it ("NVIDIA H200"; "cpu")
  std::string precision;          // "bf16", "f32", "fp8-tensorwise"
  std::string policy;
  int64_t batch = 0, seq_len = 0, layers = 0;
  double tokens_per_second = 0;   // median over timed steps
  double step_ms = 0;             // median
  double step_ms_min = 0, step_ms_max = 0;
  double tflops = 0, mfu_percent = 0;
  size_t predicted_bytes = 0;     // the arena the plan sized
  double predicted_step_ms = 0;   // the planner's cost model (what `smelt plan` predicts)
  size_t measured_bytes = 0;      // device memory the run took, from the driver (CPU: the arena)
  double first_loss = 0, last_loss = 0;
  // The GPU during the timed steps (DeviceMonitor; zeros when it could not be sampled).
  double sm_clock_mhz = 0, sm_clock_max_mhz = 0;  // median, and the device's maximum
  double power_watts = 0, power_limit_watts = 0;  // median, and the enforced limit
  double power_capped = 0;                         // fraction of samples held back by the power cap
  double temperature_c = 0;                        // highest
  // The device's energy counter over the timed steps, per step (0: no counter). Under a power
  // cap, tokens per joule is what an optimisation has to raise.
  double joules_per_step = 0;
  double tokens_per_joule = 0;
  // The reference run that describes the same step on this GPU (reference_runs.h), and what its
  // table's runs were (ReferenceTable::source); none when no run does.
  std::optional<ReferenceRun> reference;
  std::string reference_source;
  bool has_reference() const { return reference.has_value(); }
};

BenchResult run_benchmark(const JobConfig& config, const BenchOptions& options, std::ostream& log);
nlohmann::json bench_to_json(const BenchResult& result);
BenchResult bench_from_json(const nlohmann::json& json);

}  // namespace smelt
