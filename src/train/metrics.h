// Metrics: the console line and the JSON-lines file of a run, and the
// throughput arithmetic (tokens/s, TFLOPS and MFU as torchtitan counts them).
#pragma once
#include <cstdint>
#include <fstream>
#include <string>

namespace smelt {

// Dense bf16 peak that MFU is quoted against (H100 / H200 SXM), as torchtitan does for every precision.
constexpr double kHopperPeakTflops = 989.0;

struct StepMetrics {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double lr = 0;
  double tokens_per_second = 0;
  double tflops = 0;
  double mfu_percent = 0;     // < 0 when there is no meaningful peak (CPU)
  double memory_gib = 0;      // arena size
  double elapsed_seconds = 0;
  double validation_loss = -1;  // < 0 when not measured at this step
  // The GPU over the interval (medians of DeviceMonitor samples); < 0 when not sampled.
  double sm_clock_mhz = -1, power_watts = -1;
  // The GPU's energy since this process began training (its energy counter, summed over the
  // intervals; validation and checkpoint time included); < 0 when the counter cannot be read.
  double energy_joules = -1;
  // Sharded runs (empty / < 0 otherwise): per GPU, the dtypes weights are gathered and gradients
  // reduced in, and the bytes the step's all-gathers and reduce-scatters hold.
  std::string gather_dtype, reduce_dtype;
  double communication_bytes = -1;
  int64_t ranks = 1;
};

class MetricsLog {
 public:
  // Opens `path` for JSON lines, truncating it unless `append` (a resumed run); empty path: console only.
  explicit MetricsLog(const std::string& path, bool append = false);
  void write(const StepMetrics& metrics);
  static std::string console_line(const StepMetrics& metrics);

 private:
  std::ofstream file_;
};

// Writes `text` to `path` atomically: a temporary name in the same folder, flushed, renamed.
void write_file_atomically(const std::string& path, const std::string& text);

}  // namespace smelt
