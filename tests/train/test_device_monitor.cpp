// The benchmark's GPU monitor: its summary of clock, power and temperature samples against a
// count made here, and its refusal to sample where there is no GPU to name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/random.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/device_monitor.h"
#include "train/metrics.h"

namespace smelt {
namespace {

TEST(DeviceMonitor, SummaryMatchesMediansMaximaAndReasonCountsTakenHere) {
  testing_support::FreshRandom random;
  for (int count : {1, 2, 7, 40, 41}) {
    std::vector<DeviceSample> samples(static_cast<size_t>(count));
    const uint64_t reason_bits[] = {clock_reason::kIdle, clock_reason::kSoftwarePowerCap, clock_reason::kHardwareSlowdown,
                                    clock_reason::kSoftwareThermal, clock_reason::kHardwareThermal,
                                    clock_reason::kPowerBrake};
    for (auto& s : samples) {
      s.sm_clock_mhz = std::round(random.uniform(900, 1980));
      s.power_watts = random.uniform(80, 700);
      s.temperature_c = std::round(random.uniform(30, 85));
      for (uint64_t bit : reason_bits)
        if (random.uniform() < 0.3) s.reasons |= bit;
    }
    const double max_clock = random.uniform(1500, 2100), limit = random.uniform(300, 700);
    const DeviceReport r = summarize_device_samples(samples, max_clock, limit);

    std::vector<double> clocks, power;
    double hottest = -1;
    int capped = 0, thermal = 0;
    for (const auto& s : samples) {
      clocks.push_back(s.sm_clock_mhz);
      power.push_back(s.power_watts);
      hottest = std::max(hottest, s.temperature_c);
      capped += (s.reasons & 0x84) != 0;   // software power cap, power brake
      thermal += (s.reasons & 0x60) != 0;  // software and hardware thermal slowdown
    }
    std::sort(clocks.begin(), clocks.end());
    std::sort(power.begin(), power.end());
    const size_t n = clocks.size();
    const double clock_median = n % 2 ? clocks[n / 2] : (clocks[n / 2 - 1] + clocks[n / 2]) / 2;
    const double power_median = n % 2 ? power[n / 2] : (power[n / 2 - 1] + power[n / 2]) / 2;
    EXPECT_TRUE(r.available());
    EXPECT_EQ(r.samples, count);
    EXPECT_DOUBLE_EQ(r.sm_clock_mhz, clock_median) << count << " samples";
    EXPECT_DOUBLE_EQ(r.power_watts, power_median) << count << " samples";
    EXPECT_DOUBLE_EQ(r.temperature_c, hottest);
    EXPECT_DOUBLE_EQ(r.power_capped, double(capped) / count);
    EXPECT_DOUBLE_EQ(r.thermal, double(thermal) / count);
    EXPECT_DOUBLE_EQ(r.sm_clock_max_mhz, max_clock);
    EXPECT_DOUBLE_EQ(r.power_limit_watts, limit);
    const std::string line = describe_device_report(r);
    EXPECT_NE(line.find(std::to_string(count) + " samples"), std::string::npos) << line;
    EXPECT_FALSE(r.has_energy());  // samples alone carry no energy
    EXPECT_EQ(line.find("energy counter"), std::string::npos) << line;
  }
}

// With the energy counter read over a window, the line adds the joules and the mean power they
// give; the mean is computed here from the same two numbers.
TEST(DeviceMonitor, DescriptionAddsTheEnergyCountersMeanPower) {
  testing_support::FreshRandom random;
  std::vector<DeviceSample> samples(5);
  for (auto& s : samples) s.sm_clock_mhz = s.power_watts = s.temperature_c = random.uniform(50, 600);
  DeviceReport r = summarize_device_samples(samples, 1980, 700);
  r.energy_joules = std::round(random.uniform(100, 5000) * 10) / 10;
  r.seconds = std::round(random.uniform(1, 20) * 100) / 100;
  ASSERT_TRUE(r.has_energy());
  char expected[96];
  std::snprintf(expected, sizeof expected, "; %.1f J in %.2f s by the energy counter (%.0f W mean)", r.energy_joules,
                r.seconds, r.energy_joules / r.seconds);
  const std::string line = describe_device_report(r);
  EXPECT_NE(line.find(expected), std::string::npos) << line << "\nexpected: " << expected;
}

TEST(DeviceMonitor, NoSamplesIsSaidNotReportedAsZeros) {
  const DeviceReport r = summarize_device_samples({}, 1980, 700);
  EXPECT_FALSE(r.available());
  EXPECT_FALSE(r.unavailable.empty());
  EXPECT_NE(describe_device_report(r).find("not sampled"), std::string::npos);
}

TEST(DeviceMonitor, WithoutAGpuToNameItSamplesNothingAndSaysWhy) {
  DeviceMonitor cpu("");
  EXPECT_FALSE(cpu.available());
  cpu.start();  // a no-op
  const DeviceReport window = cpu.take();
  EXPECT_FALSE(window.available());
  EXPECT_FALSE(window.has_energy());
  EXPECT_NE(window.unavailable.find("not a GPU run"), std::string::npos) << window.unavailable;
  const DeviceReport r = cpu.stop();
  EXPECT_FALSE(r.available());
  EXPECT_NE(r.unavailable.find("not a GPU run"), std::string::npos) << r.unavailable;

  // A bus id no GPU has: without NVML (CI) or with it (a GPU machine), nothing to sample.
  DeviceMonitor nowhere("0000:ff:1f.7");
  EXPECT_FALSE(nowhere.available());
  nowhere.start();
  const DeviceReport none = nowhere.stop();
  EXPECT_FALSE(none.available());
  EXPECT_FALSE(none.unavailable.empty());
}

// The training log line and JSONL carry the GPU's clock and power when they were sampled, and
// leave them out when they were not.
TEST(DeviceMonitor, MetricsCarryTheGpuOnlyWhenSampled) {
  StepMetrics m;
  m.step = 7;
  m.loss = 2.5;
  EXPECT_EQ(MetricsLog::console_line(m).find("gpu:"), std::string::npos);
  testing_support::FreshRandom random;
  m.sm_clock_mhz = std::round(random.uniform(1000, 1980));
  m.power_watts = std::round(random.uniform(100, 700));
  const std::string line = MetricsLog::console_line(m);
  char expected[64];
  std::snprintf(expected, sizeof expected, "gpu: %.0f MHz %.0f W", m.sm_clock_mhz, m.power_watts);
  EXPECT_NE(line.find(expected), std::string::npos) << line;
  EXPECT_EQ(line.find("kJ"), std::string::npos) << "no energy counter, no energy: " << line;
  m.energy_joules = std::round(random.uniform(1e3, 1e7));
  std::snprintf(expected, sizeof expected, "gpu: %.0f MHz %.0f W %.1f kJ", m.sm_clock_mhz, m.power_watts,
                m.energy_joules / 1e3);
  EXPECT_NE(MetricsLog::console_line(m).find(expected), std::string::npos) << MetricsLog::console_line(m);

  const testing_support::TemporaryFolder folder;
  const std::string path = folder.path("metrics.jsonl");
  double first_energy = -1;  // the energy the first line carries
  {
    MetricsLog log(path);
    log.write(m);
    first_energy = m.energy_joules;
    m.sm_clock_mhz = m.power_watts = m.energy_joules = -1;
    log.write(m);
  }
  std::ifstream in(path);
  std::string first, second;
  std::getline(in, first);
  std::getline(in, second);
  EXPECT_NE(first.find("\"sm_clock_mhz\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"power_watts\""), std::string::npos) << first;
  EXPECT_NE(first.find("\"energy_joules\":" + nlohmann::json(first_energy).dump()), std::string::npos) << first;
  EXPECT_EQ(second.find("sm_clock_mhz"), std::string::npos) << second;
  EXPECT_EQ(second.find("power_watts"), std::string::npos) << second;
  EXPECT_EQ(second.find("energy_joules"), std::string::npos) << second;
}

}  // namespace
}  // namespace smelt
