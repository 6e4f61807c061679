// AdamW on the GPU: one pass over a flat f32 range (PyTorch's torch.optim.AdamW), with the
// gradient-clipping coefficient computed on the device from the gradients' sum of squares, the
// gradients read in f32 or, for the runs that keep them so, bf16, the bf16 compute copy written
// for every element or for the runs that have one, and the largest |p| taken for the runs with an
// amax slot (float8 weights' tensorwise amax).
#include <algorithm>
#include <cmath>

#include "core/numerics.h"
#include "cuda/cuda_common.cuh"
#include "cuda/vector_access.cuh"
#include "ops/op_checks.h"

namespace smelt::cuda {
namespace {

struct AdamwConstants {
  float beta1, beta2, eps, decay, step_size, bias_correction2_sqrt, max_norm;
};

// One element: clip g (in registers; the gradient buffer is only read), then the AdamW update
// in float, as PyTorch does for fp32 parameters.
__device__ __forceinline__ void adamw_element(float& p, float g, float& m, float& v, float clip, const AdamwConstants& k) {
  g *= clip;
  m = k.beta1 * m + (1.0f - k.beta1) * g;
  v = k.beta2 * v + (1.0f - k.beta2) * g * g;
  const float denominator = sqrtf(v) / k.bias_correction2_sqrt + k.eps;
  p = p * k.decay - k.step_size * m / denominator;
}

// The runs one launch covers, in quads (4 elements): run r is quads [first[r], first[r + 1]),
// copied to copy quads from copy_first[r] on (-1: no copy), its gradients from quad grad_first[r]
// of the f32 gradients or (low_grad[r]) of the bf16 ones. Kept under 4 KB with the other kernel
// parameters; more runs take more launches.
constexpr int kRunsPerLaunch = 96;

struct CopyRuns {
  int64_t first[kRunsPerLaunch + 1];
  int64_t copy_first[kRunsPerLaunch];
  int64_t grad_first[kRunsPerLaunch];
  int32_t amax_slot[kRunsPerLaunch];  // -1: none
  uint8_t low_grad[kRunsPerLaunch];
  int count;
};
static_assert(sizeof(CopyRuns) < 3800, "AdamW's runs must leave room for the other kernel parameters in 4 KB");

// Four bf16 gradients (8 bytes) as floats.
__device__ __forceinline__ float4 unpack_bf16x4(uint2 packed) {
  return make_float4(__uint_as_float(packed.x << 16), __uint_as_float(packed.x & 0xffff0000u),
                     __uint_as_float(packed.y << 16), __uint_as_float(packed.y & 0xffff0000u));
}

// Folds `value` (magnitude_bits) into amax[slot] once per group of lanes holding the same slot.
__device__ __forceinline__ void flush_amax(float* amax, int slot, unsigned value) {
  const unsigned peers = __match_any_sync(__activemask(), slot);
  const unsigned reduced = __reduce_max_sync(peers, value);
  if (int(threadIdx.x & 31) == __ffs(peers) - 1) atomicMax(reinterpret_cast<unsigned*>(amax) + slot, reduced);
}

// The run holding quad i (first[0] <= i < first[count]).
__device__ __forceinline__ int find_run(const CopyRuns& runs, int64_t i) {
  int low = 0, high = runs.count - 1;
  while (low < high) {
    const int middle = (low + high + 1) / 2;
    if (runs.first[middle] <= i) low = middle;
    else high = middle - 1;
  }
  return low;
}

// Four elements per thread with 16-byte loads (every run is 256-byte aligned and a multiple of
// 64 elements long); writes the bf16 copy the GEMMs use for the runs that have one. A thread's
// quads only grow, so its run is found once and then followed forward.
__global__ void adamw_update(float4* params, const float4* grads, const uint2* low_grads, float4* exp_avg, float4* exp_avg_sq, uint2* copy,
                             float* amax, const float* grad_sum_squares, const __grid_constant__ CopyRuns runs,
                             AdamwConstants k) {
  float clip = 1.0f;
  if (k.max_norm > 0) clip = fminf(1.0f, k.max_norm / (sqrtf(grad_sum_squares[0]) + 1e-6f));
  const int64_t end = runs.first[runs.count];
  int run = -1, slot = -1;
  unsigned largest = 0;  // magnitude_bits of the largest |p| of this thread's elements in `slot`
  for (int64_t i = runs.first[0] + blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < end;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (run < 0) run = find_run(runs, i);
    while (i >= runs.first[run + 1]) ++run;
    if (runs.amax_slot[run] != slot) {
      if (slot >= 0) flush_amax(amax, slot, largest);
      slot = runs.amax_slot[run];
      largest = 0;
    }
    const int64_t gradient = runs.grad_first[run] + (i - runs.first[run]);
    float4 p = params[i], m = exp_avg[i], v = exp_avg_sq[i];
    const float4 g = runs.low_grad[run] ? unpack_bf16x4(low_grads[gradient]) : grads[gradient];
    adamw_element(p.x, g.x, m.x, v.x, clip, k);
    adamw_element(p.y, g.y, m.y, v.y, clip, k);
    adamw_element(p.z, g.z, m.z, v.z, clip, k);
    adamw_element(p.w, g.w, m.w, v.w, clip, k);
    params[i] = p;
    if (slot >= 0)
      largest = max(largest, max(max(magnitude_bits(p.x), magnitude_bits(p.y)), max(magnitude_bits(p.z), magnitude_bits(p.w))));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (copy && runs.copy_first[run] >= 0) {
      uint2 packed;
      packed.x = uint32_t(float_to_bf16(p.x)) | (uint32_t(float_to_bf16(p.y)) << 16);
      packed.y = uint32_t(float_to_bf16(p.z)) | (uint32_t(float_to_bf16(p.w)) << 16);
      copy[runs.copy_first[run] + (i - runs.first[run])] = packed;
    }
  }
  if (slot >= 0) flush_amax(amax, slot, largest);
}

}  // namespace

void adamw(CudaContext& context, const AdamwArgs& args) {
  const char* op = "adamw";
  const int64_t count = args.params.numel();
  for (const TensorView* t : {&args.params, &args.exp_avg, &args.exp_avg_sq}) {
    expect_device(*t, op, "params/exp_avg/exp_avg_sq");
    expect_dtype(*t, DType::f32, op, "params/exp_avg/exp_avg_sq");
    expect_numel(*t, count, op, "params/exp_avg/exp_avg_sq");
  }
  expect_device(args.grads, op, "grads");
  expect_dtype(args.grads, DType::f32, op, "grads");
  if (!args.low_grads.empty()) expect_device(args.low_grads, op, "low_grads");
  if (args.step < 1)
    fail(ErrorKind::internal, "cuda adamw: expected a 1-based step, found " + std::to_string(args.step) +
                                  "; count steps from 1");
  if (args.max_norm > 0) {
    expect_device(args.grad_sum_squares, op, "grad_sum_squares");
    expect_dtype(args.grad_sum_squares, DType::f32, op, "grad_sum_squares");
    expect_numel(args.grad_sum_squares, 1, op, "grad_sum_squares");
  }
  if (!args.compute_copy.empty()) {
    expect_device(args.compute_copy, op, "compute_copy");
    expect_dtype(args.compute_copy, DType::bf16, op, "compute_copy");
  }
  if (count % 4 != 0)
    fail(ErrorKind::internal, "cuda adamw: the flat range must be a multiple of 4 elements, found " +
                                  std::to_string(count) + "; parameters are laid out in 64-element steps");
  expect_copy_ranges(args.copy_ranges, count, args.compute_copy.empty() ? 0 : args.compute_copy.numel(), 4, "cuda adamw");
  expect_amax_slots(args.copy_ranges, args.weight_amax, "cuda adamw");
  expect_gradient_runs(args, 4, "cuda adamw");
  if (!args.weight_amax.empty()) {
    expect_device(args.weight_amax, op, "weight_amax");
    SMELT_CUDA_CHECK(cudaMemsetAsync(args.weight_amax.data, 0, size_t(args.weight_amax.numel()) * sizeof(float),
                                     context.stream));
  }
  AdamwConstants k;
  const double lr = args.lr;
  k.beta1 = args.beta1;
  k.beta2 = args.beta2;
  k.eps = args.eps;
  k.decay = float(1.0 - lr * double(args.weight_decay));
  const double bias_correction1 = 1.0 - std::pow(double(args.beta1), double(args.step));
  const double bias_correction2 = 1.0 - std::pow(double(args.beta2), double(args.step));
  k.step_size = float(lr / bias_correction1);
  k.bias_correction2_sqrt = float(std::sqrt(bias_correction2));
  k.max_norm = args.max_norm;
  if (count == 0) return;
  // The runs, in quads: the caller's, or one over everything (copied when there is a copy).
  const ParameterRun whole{0, count, args.compute_copy.empty() ? -1 : 0};
  const std::span<const ParameterRun> ranges =
      args.copy_ranges.empty() ? std::span<const ParameterRun>(&whole, 1) : args.copy_ranges;
  for (size_t start = 0; start < ranges.size(); start += kRunsPerLaunch) {
    CopyRuns runs{};
    runs.count = static_cast<int>(std::min<size_t>(kRunsPerLaunch, ranges.size() - start));
    for (int r = 0; r < runs.count; ++r) {
      const ParameterRun& range = ranges[start + static_cast<size_t>(r)];
      runs.first[r] = range.begin / 4;
      runs.copy_first[r] = range.copied() ? range.copy_offset / 4 : -1;
      runs.amax_slot[r] = range.amax_slot;
      runs.grad_first[r] = range.gradient_offset() / 4;
      runs.low_grad[r] = range.low_grad ? 1 : 0;
      runs.first[r + 1] = (range.begin + range.count) / 4;
    }
    const int64_t quads = runs.first[runs.count] - runs.first[0];
    if (quads == 0) continue;
    adamw_update<<<grid_for(quads, 256, context.multiprocessors), 256, 0, context.stream>>>(
        reinterpret_cast<float4*>(args.params.data), reinterpret_cast<const float4*>(args.grads.data),
        args.low_grads.empty() ? nullptr : reinterpret_cast<const uint2*>(args.low_grads.data),
        reinterpret_cast<float4*>(args.exp_avg.data), reinterpret_cast<float4*>(args.exp_avg_sq.data),
        args.compute_copy.empty() ? nullptr : reinterpret_cast<uint2*>(args.compute_copy.data),
        args.weight_amax.empty() ? nullptr : args.weight_amax.as<float>(), args.max_norm > 0 ? args.grad_sum_squares.as<float>() : nullptr, runs, k);
    SMELT_CUDA_LAUNCH_CHECK("adamw_update");
  }
}

}  // namespace smelt::cuda
