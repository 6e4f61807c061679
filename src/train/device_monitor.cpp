#include "train/device_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <type_traits>

#include "core/median.h"

namespace smelt {

// The few NVML entry points the monitor calls, declared here so that building needs no NVML
// header; every one returns nvmlReturn_t, 0 on success.
class Nvml {
 public:
  using Device = void*;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci_bus_id)(const char*, Device*) = nullptr;
  int (*clock)(Device, int, unsigned*) = nullptr;      // nvmlDeviceGetClockInfo
  int (*max_clock)(Device, int, unsigned*) = nullptr;  // nvmlDeviceGetMaxClockInfo
  int (*power)(Device, unsigned*) = nullptr;           // milliwatts
  int (*power_limit)(Device, unsigned*) = nullptr;     // nvmlDeviceGetEnforcedPowerLimit, milliwatts
  int (*temperature)(Device, int, unsigned*) = nullptr;
  int (*reasons)(Device, unsigned long long*) = nullptr;
  int (*energy)(Device, unsigned long long*) = nullptr;  // nvmlDeviceGetTotalEnergyConsumption, mJ; optional
  static constexpr int kClockSm = 1, kTemperatureGpu = 0;

  // Loads the library and initializes it; on failure `error` says why.
  static std::shared_ptr<Nvml> open(std::string& error) {
    void* library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
      error = "NVML (libnvidia-ml.so.1, part of the NVIDIA driver) could not be loaded";
      return nullptr;
    }
    auto nvml = std::make_shared<Nvml>();
    bool complete = true;
    auto find = [&](auto& entry, const char* name, const char* fallback = nullptr) {
      void* symbol = dlsym(library, name);
      if (!symbol && fallback) symbol = dlsym(library, fallback);
      if (!symbol) complete = false;
      entry = reinterpret_cast<std::remove_reference_t<decltype(entry)>>(symbol);
    };
    find(nvml->init, "nvmlInit_v2");
    find(nvml->shutdown, "nvmlShutdown");
    find(nvml->by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2");
    find(nvml->clock, "nvmlDeviceGetClockInfo");
    find(nvml->max_clock, "nvmlDeviceGetMaxClockInfo");
    find(nvml->power, "nvmlDeviceGetPowerUsage");
    find(nvml->power_limit, "nvmlDeviceGetEnforcedPowerLimit");
    find(nvml->temperature, "nvmlDeviceGetTemperature");
    find(nvml->reasons, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons");
    nvml->energy = reinterpret_cast<decltype(nvml->energy)>(dlsym(library, "nvmlDeviceGetTotalEnergyConsumption"));
    if (!complete) {
      error = "this NVML lacks an entry point the monitor needs (an old driver?)";
      return nullptr;
    }
    if (const int status = nvml->init(); status != 0) {
      error = "nvmlInit failed (NVML error " + std::to_string(status) + ")";
      return nullptr;
    }
    return std::shared_ptr<Nvml>(nvml.get(), [nvml](Nvml*) { nvml->shutdown(); });
  }
};

DeviceReport summarize_device_samples(const std::vector<DeviceSample>& samples, double sm_clock_max_mhz,
                                      double power_limit_watts) {
  DeviceReport r;
  r.sm_clock_max_mhz = sm_clock_max_mhz;
  r.power_limit_watts = power_limit_watts;
  r.samples = static_cast<int>(samples.size());
  if (samples.empty()) {
    r.unavailable = "no samples were taken";
    return r;
  }
  std::vector<double> clocks, power;
  int capped = 0, hot = 0;
  for (const DeviceSample& s : samples) {
    clocks.push_back(s.sm_clock_mhz);
    power.push_back(s.power_watts);
    r.temperature_c = std::max(r.temperature_c, s.temperature_c);
    if (s.reasons & (clock_reason::kSoftwarePowerCap | clock_reason::kPowerBrake)) ++capped;
    if (s.reasons & (clock_reason::kSoftwareThermal | clock_reason::kHardwareThermal)) ++hot;
  }
  r.sm_clock_mhz = median(clocks);
  r.power_watts = median(power);
  r.power_capped = static_cast<double>(capped) / static_cast<double>(samples.size());
  r.thermal = static_cast<double>(hot) / static_cast<double>(samples.size());
  return r;
}

std::string describe_device_report(const DeviceReport& r) {
  if (!r.available()) return "GPU clocks and power: not sampled (" + r.unavailable + ")";
  char line[400];
  std::snprintf(line, sizeof line,
                "GPU while timed: SM clock %.0f MHz median (max %.0f), %.0f W median of %.0f, power-capped in %.0f%% "
                "and thermally limited in %.0f%% of %d samples, %.0f C at most",
                r.sm_clock_mhz, r.sm_clock_max_mhz, r.power_watts, r.power_limit_watts, 100.0 * r.power_capped,
                100.0 * r.thermal, r.samples, r.temperature_c);
  std::string text = line;
  if (r.has_energy()) {
    std::snprintf(line, sizeof line, "; %.1f J in %.2f s by the energy counter (%.0f W mean)", r.energy_joules,
                  r.seconds, r.energy_joules / r.seconds);
    text += line;
  }
  return text;
}

DeviceMonitor::DeviceMonitor(const std::string& pci_bus_id, int interval_ms) : interval_ms_(std::max(1, interval_ms)) {
  if (pci_bus_id.empty()) {
    unavailable_ = "not a GPU run";
    return;
  }
  nvml_ = Nvml::open(unavailable_);
  if (!nvml_) return;
  if (const int status = nvml_->by_pci_bus_id(pci_bus_id.c_str(), &device_); status != 0) {
    unavailable_ = "NVML does not know the GPU at PCI bus id " + pci_bus_id + " (NVML error " + std::to_string(status) + ")";
    nvml_.reset();
    return;
  }
  unsigned value = 0;
  if (nvml_->max_clock(device_, Nvml::kClockSm, &value) == 0) sm_clock_max_mhz_ = value;
  if (nvml_->power_limit(device_, &value) == 0) power_limit_watts_ = value / 1000.0;
}

DeviceMonitor::~DeviceMonitor() { stop(); }

bool DeviceMonitor::read_energy(unsigned long long& millijoules) const {
  return nvml_ && nvml_->energy && nvml_->energy(device_, &millijoules) == 0;
}

void DeviceMonitor::start() {
  if (!available() || thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    samples_.clear();
    running_ = true;
    has_energy_mark_ = read_energy(energy_mark_);
    window_start_ = std::chrono::steady_clock::now();
  }
  thread_ = std::thread([this] { sample_loop(); });
}

DeviceReport DeviceMonitor::stop() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      running_ = false;
    }
    wake_.notify_all();
    thread_.join();
  }
  return take();
}

DeviceReport DeviceMonitor::take() {
  if (!available()) {
    DeviceReport r;
    r.unavailable = unavailable_;
    return r;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  DeviceReport r = summarize_device_samples(samples_, sm_clock_max_mhz_, power_limit_watts_);
  samples_.clear();
  const auto now = std::chrono::steady_clock::now();
  unsigned long long energy = 0;
  const bool read = read_energy(energy);
  if (read && has_energy_mark_ && energy >= energy_mark_) {
    r.energy_joules = static_cast<double>(energy - energy_mark_) / 1000.0;
    r.seconds = std::chrono::duration<double>(now - window_start_).count();
  }
  has_energy_mark_ = read;
  energy_mark_ = energy;
  window_start_ = now;
  return r;
}

void DeviceMonitor::sample_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (running_) {
    lock.unlock();
    DeviceSample s;
    unsigned clock = 0, milliwatts = 0, celsius = 0;
    unsigned long long reasons = 0;
    const bool ok = nvml_->clock(device_, Nvml::kClockSm, &clock) == 0 && nvml_->power(device_, &milliwatts) == 0 &&
                    nvml_->temperature(device_, Nvml::kTemperatureGpu, &celsius) == 0 &&
                    nvml_->reasons(device_, &reasons) == 0;
    s.sm_clock_mhz = clock;
    s.power_watts = milliwatts / 1000.0;
    s.temperature_c = celsius;
    s.reasons = reasons;
    lock.lock();
    if (ok) samples_.push_back(s);
    wake_.wait_for(lock, std::chrono::milliseconds(interval_ms_), [this] { return !running_; });
  }
}

}  // namespace smelt
