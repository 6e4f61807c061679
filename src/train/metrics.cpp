// Console and JSON-lines metrics, atomic small-file writes.
#include "train/metrics.h"

#include <cstdio>
#include <filesystem>

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace smelt {

MetricsLog::MetricsLog(const std::string& path, bool append) {
  if (path.empty()) return;
  file_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!file_) fail(ErrorKind::input, "cannot open metrics file '" + path + "' for writing; check the run folder's permissions");
}

void MetricsLog::write(const StepMetrics& m) {
  if (!file_.is_open()) return;
  nlohmann::json j;
  j["step"] = m.step;
  j["loss"] = m.loss;
  j["grad_norm"] = m.grad_norm;
  j["lr"] = m.lr;
  j["tokens_per_second"] = m.tokens_per_second;
  j["tflops"] = m.tflops;
  if (m.mfu_percent >= 0) j["mfu_percent"] = m.mfu_percent;
  j["memory_gib"] = m.memory_gib;
  j["elapsed_seconds"] = m.elapsed_seconds;
  if (m.validation_loss >= 0) j["validation_loss"] = m.validation_loss;
  if (m.sm_clock_mhz >= 0) j["sm_clock_mhz"] = m.sm_clock_mhz;
  if (m.power_watts >= 0) j["power_watts"] = m.power_watts;
  if (m.energy_joules >= 0) j["energy_joules"] = m.energy_joules;
  if (m.communication_bytes >= 0) {
    j["ranks"] = m.ranks;
    j["gather_dtype"] = m.gather_dtype;
    j["reduce_dtype"] = m.reduce_dtype;
    j["communication_bytes"] = m.communication_bytes;
  }
  file_ << j.dump() << '\n';
  file_.flush();
}

std::string MetricsLog::console_line(const StepMetrics& m) {
  char line[320];
  char mfu[32] = "-";
  if (m.mfu_percent >= 0) std::snprintf(mfu, sizeof mfu, "%.2f%%", m.mfu_percent);
  int n = std::snprintf(line, sizeof line,
                        "step: %5lld  loss: %7.4f  grad_norm: %6.3f  lr: %.2e  memory: %6.2fGiB  tps: %8.0f  "
                        "tflops: %7.2f  mfu: %s",
                        static_cast<long long>(m.step), m.loss, m.grad_norm, m.lr, m.memory_gib, m.tokens_per_second,
                        m.tflops, mfu);
  std::string out(line, static_cast<size_t>(n));
  if (m.sm_clock_mhz >= 0 && m.power_watts >= 0) {
    char g[64];
    std::snprintf(g, sizeof g, "  gpu: %.0f MHz %.0f W", m.sm_clock_mhz, m.power_watts);
    out += g;
    if (m.energy_joules >= 0) {
      std::snprintf(g, sizeof g, " %.1f kJ", m.energy_joules / 1e3);
      out += g;
    }
  }
  if (m.validation_loss >= 0) {
    char v[48];
    std::snprintf(v, sizeof v, "  val_loss: %7.4f", m.validation_loss);
    out += v;
  }
  return out;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail(ErrorKind::input, "cannot write '" + temporary + "'; check that the folder exists and is writable");
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n <= 0) {
      ::close(fd);
      std::filesystem::remove(temporary);
      fail(ErrorKind::input, "writing '" + temporary + "' failed (disk full?)");
    }
    written += static_cast<size_t>(n);
  }
  ::fsync(fd);
  ::close(fd);
  std::filesystem::rename(temporary, path);
}

}  // namespace smelt
