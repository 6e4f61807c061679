// What the GPU's clocks, power and temperature did while the benchmark timed its steps, sampled
// from NVML in a background thread. A power-capped H200 lowers its SM clock under sustained GEMMs,
// and machines of one kind differ in how far, so tokens/s is read next to the clock it ran at.
// NVML is opened at run time (libnvidia-ml.so.1, part of the driver); without it, or on the CPU,
// the report says why it is empty and the benchmark runs as before.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace smelt {

// NVML's clock event reasons (nvmlClocksEventReason*): why the clock is below its maximum.
namespace clock_reason {
constexpr uint64_t kIdle = 0x1;
constexpr uint64_t kSoftwarePowerCap = 0x4;
constexpr uint64_t kHardwareSlowdown = 0x8;
constexpr uint64_t kSoftwareThermal = 0x20;
constexpr uint64_t kHardwareThermal = 0x40;
constexpr uint64_t kPowerBrake = 0x80;
}  // namespace clock_reason

struct DeviceSample {
  double sm_clock_mhz = 0, power_watts = 0, temperature_c = 0;
  uint64_t reasons = 0;  // clock_reason bits
};

struct DeviceReport {
  std::string unavailable;  // why there are no samples; empty when there are
  int samples = 0;
  double sm_clock_mhz = 0;      // median
  double sm_clock_max_mhz = 0;  // the device's maximum SM clock
  double power_watts = 0;       // median
  double power_limit_watts = 0;
  double temperature_c = 0;     // highest
  double power_capped = 0;      // fraction of samples held back by the power cap (software cap or power brake)
  double thermal = 0;           // fraction held back by temperature (software or hardware thermal slowdown)
  // The device's energy counter over the window (nvmlDeviceGetTotalEnergyConsumption): joules
  // used from start() or the last take() to this one, and the window's length; -1 where the
  // counter cannot be read (the GPU or driver lacks it).
  double energy_joules = -1;
  double seconds = 0;
  bool available() const { return samples > 0; }
  bool has_energy() const { return energy_joules >= 0 && seconds > 0; }
};

// Medians, maxima and fractions over the samples (the device's limits passed through).
DeviceReport summarize_device_samples(const std::vector<DeviceSample>& samples, double sm_clock_max_mhz,
                                      double power_limit_watts);
// One line for the log: "SM clock 1755 MHz median (max 1980), 690 W of 700, power-capped in 85% of
// 140 samples, 61 C at most" (and the mean power from the energy counter, where there is one), or
// why there is nothing to say.
std::string describe_device_report(const DeviceReport& report);

class Nvml;  // the library's entry points (device_monitor.cpp)

class DeviceMonitor {
 public:
  // The GPU with this PCI bus id (Backend::pci_bus_id); an empty id (the CPU) samples nothing.
  explicit DeviceMonitor(const std::string& pci_bus_id, int interval_ms = 20);
  ~DeviceMonitor();
  DeviceMonitor(const DeviceMonitor&) = delete;
  DeviceMonitor& operator=(const DeviceMonitor&) = delete;

  bool available() const { return unavailable_.empty(); }
  void start();          // begins sampling (no-op when unavailable or already sampling)
  DeviceReport stop();   // ends sampling, then as take(): what it saw since start() or the last take()
  DeviceReport take();   // summarizes the samples since start() or the last take(), sampling on

 private:
  void sample_loop();
  bool read_energy(unsigned long long& millijoules) const;

  std::shared_ptr<Nvml> nvml_;
  void* device_ = nullptr;
  std::string unavailable_;
  int interval_ms_;
  double sm_clock_max_mhz_ = 0, power_limit_watts_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool running_ = false;
  std::vector<DeviceSample> samples_;
  // The energy counter (mJ) and the time at the window's start; has_energy_mark_ false when unread.
  bool has_energy_mark_ = false;
  unsigned long long energy_mark_ = 0;
  std::chrono::steady_clock::time_point window_start_{};
};

}  // namespace smelt
