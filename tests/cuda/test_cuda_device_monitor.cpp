// The benchmark's GPU monitor on a real GPU: NVML finds the backend's device by its PCI bus id,
// and samples taken while a kernel load runs lie within the device's own limits, as does the mean
// power its energy counter gives over each window.
#include <chrono>
#include <thread>

#include "cuda_test_support.h"
#include "train/device_monitor.h"

namespace smelt::test {
namespace {

class CudaDeviceMonitor : public CudaOpsTest {};

TEST_F(CudaDeviceMonitor, SamplesTheBackendsGpuWithinItsLimits) {
  const std::string bus = cuda_->pci_bus_id();
  ASSERT_FALSE(bus.empty());
  DeviceMonitor monitor(bus, 5);
  ASSERT_TRUE(monitor.available()) << "NVML could not open the GPU at " << bus;
  const int64_t n = 1024;
  TensorView a = upload(random_tensor(DType::bf16, Shape{n, n}, 11)), b = upload(random_tensor(DType::bf16, Shape{n, n}, 12));
  TensorView c = poisoned(DType::f32, Shape{n, n});
  auto load = [&](int milliseconds) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(milliseconds);
    while (std::chrono::steady_clock::now() < until) {
      for (int i = 0; i < 20; ++i) cuda_->gemm({a, false, b, true, c, {}, false, {}, {}});
      cuda_->synchronize();
    }
  };
  monitor.start();
  load(150);
  const DeviceReport first = monitor.take();  // a window; sampling goes on
  load(150);
  const DeviceReport r = monitor.stop();
  ASSERT_TRUE(first.available()) << first.unavailable;
  EXPECT_GE(first.samples, 5);
  EXPECT_LE(first.samples, 150 / 5 + 10);  // the window held only its own samples
  ASSERT_TRUE(r.available()) << r.unavailable;
  EXPECT_GE(r.samples, 5);
  EXPECT_LE(r.samples, 150 / 5 + 10);
  EXPECT_GT(r.sm_clock_max_mhz, 0);
  EXPECT_GT(r.sm_clock_mhz, 0);
  EXPECT_LE(r.sm_clock_mhz, r.sm_clock_max_mhz);
  EXPECT_GT(r.power_limit_watts, 0);
  EXPECT_GT(r.power_watts, 0);
  EXPECT_LT(r.power_watts, 1.5 * r.power_limit_watts);
  EXPECT_GT(r.temperature_c, 0);
  EXPECT_LT(r.temperature_c, 120);
  // The energy counter over each window: the window's own length, and a mean power between idle
  // and the cap (NVML reads it on Volta and later; the H200 has it).
  for (const DeviceReport* window : {&first, &r}) {
    ASSERT_TRUE(window->has_energy()) << "no energy counter";
    EXPECT_GT(window->seconds, 0.14);
    EXPECT_LT(window->seconds, 1.0);
    const double mean_watts = window->energy_joules / window->seconds;
    EXPECT_GT(mean_watts, 20);
    EXPECT_LT(mean_watts, 1.2 * r.power_limit_watts);
  }
}

}  // namespace
}  // namespace smelt::test
