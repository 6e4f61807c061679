// The smaller compute copy on the GPU: AdamW over copy runs (more runs than one launch takes)
// bit-identical to AdamW over the whole range with a full copy, with gradients packed in f32 and
// bf16 as over flat f32 ones (and the bf16 sum of squares), and the embedding forward from
// an f32 table into bf16 bit-identical to the CPU and to gathering a bf16 copy of the table.
#include <algorithm>
#include <cmath>
#include <random>

#include "cuda_test_support.h"
#include "cpu/random_copy_runs.h"

namespace smelt::test {
namespace {

class CudaComputeCopy : public CudaOpsTest {};

std::vector<ParameterRun> random_runs(int64_t count, uint64_t seed, int64_t& copy_count) {
  return testing_support::random_copy_runs(count, seed, false, copy_count);
}

TEST_F(CudaComputeCopy, AdamwOverCopyRunsEqualsTheWholeRangeBitForBit) {
  const int64_t count = 4 * 20011;
  for (float max_norm : {0.0f, 1.0f}) {
    SCOPED_TRACE("max_norm " + std::to_string(max_norm));
    int64_t copy_count = 0;
    const auto runs = random_runs(count, 5, copy_count);
    ASSERT_GT(runs.size(), 2u * 192u) << "the runs must take several launches";
    HostTensor params = random_tensor(DType::f32, Shape{count}, 70), grads = random_tensor(DType::f32, Shape{count}, 71);
    HostTensor exp_avg = random_tensor(DType::f32, Shape{count}, 72, 0.1), exp_avg_sq = random_second_moment(count, 73);
    const HostTensor sum_squares = sum_of_squares(grads);
    const double total = sum_squares.get(0);
    if (max_norm > 0) {
      ASSERT_GT(std::sqrt(total), max_norm) << "the clipping case must clip";
    }
    struct DeviceState {
      TensorView params, grads, exp_avg, exp_avg_sq, sum_squares, copy;
    };
    auto make = [&](int64_t copy_size) {
      return DeviceState{upload(params), upload(grads), upload(exp_avg), upload(exp_avg_sq), upload(sum_squares),
                    poisoned(DType::bf16, Shape{copy_size})};
    };
    DeviceState whole = make(count), ranged = make(copy_count);
    auto args = [&](const DeviceState& d) {
      AdamwArgs a;
      a.params = d.params;
      a.grads = d.grads;
      a.exp_avg = d.exp_avg;
      a.exp_avg_sq = d.exp_avg_sq;
      a.grad_sum_squares = d.sum_squares;
      a.compute_copy = d.copy;
      a.lr = 3e-3f;
      a.weight_decay = 0.1f;
      a.max_norm = max_norm;
      a.step = 4;
      return a;
    };
    cuda_->adamw(args(whole));
    AdamwArgs ranged_args = args(ranged);
    ranged_args.copy_ranges = runs;
    cuda_->adamw(ranged_args);
    cuda_->synchronize();
    expect_bits_equal(download(whole.params), download(ranged.params), "params");
    expect_bits_equal(grads, download(whole.grads), "gradients (the optimizer only reads them)");
    expect_bits_equal(grads, download(ranged.grads), "gradients (the optimizer only reads them), copy runs");
    expect_bits_equal(download(whole.exp_avg), download(ranged.exp_avg), "exp_avg");
    expect_bits_equal(download(whole.exp_avg_sq), download(ranged.exp_avg_sq), "exp_avg_sq");
    // The packed copy: each copied run's elements, in order, as the full copy holds them.
    const HostTensor full = download(whole.copy), packed = download(ranged.copy);
    HostTensor expected(DType::bf16, Shape{copy_count});
    for (const auto& run : runs)
      if (run.copied())
        for (int64_t i = 0; i < run.count; ++i)
          expected.view.as<uint16_t>()[run.copy_offset + i] = full.view.as<const uint16_t>()[run.begin + i];
    expect_bits_equal(expected, packed, "packed bf16 copy");
    int64_t unwritten = 0;
    for (int64_t i = 0; i < copy_count; ++i) unwritten += std::isnan(packed.get(i));
    EXPECT_EQ(unwritten, 0) << "elements of the packed copy left poisoned";
  }
}

// Gradients packed as a plan with bf16 linear gradients packs them (about half the runs in bf16),
// over runs taking several launches: the GPU's update bit-identical to its update over the whole
// range from flat f32 gradients holding the same bf16-representable values, and to the CPU's
// packed update; neither gradient buffer written.
TEST_F(CudaComputeCopy, AdamwOverPackedF32AndBf16GradientsEqualsTheFlatGradients) {
  const int64_t count = 4 * 20011;
  int64_t copy_count = 0, grad_count = 0, low_count = 0;
  auto runs = random_runs(count, 15, copy_count);
  testing_support::assign_gradient_places(runs, 16, grad_count, low_count);
  ASSERT_GT(runs.size(), 2u * 96u) << "the runs must take several launches";
  HostTensor params = random_tensor(DType::f32, Shape{count}, 80), grads = random_tensor(DType::bf16, Shape{count}, 81);
  HostTensor flat_grads(DType::f32, Shape{count}), packed(DType::f32, Shape{grad_count}), low(DType::bf16, Shape{low_count});
  for (int64_t i = 0; i < count; ++i) flat_grads.set(i, grads.get(i));  // bf16 values, held in f32
  for (int64_t i = 0; i < grad_count; ++i) packed.set(i, std::nan(""));
  for (int64_t i = 0; i < low_count; ++i) low.set(i, std::nan(""));
  for (const auto& run : runs)
    for (int64_t i = 0; i < run.count; ++i) (run.low_grad ? low : packed).set(run.grad_offset + i, grads.get(run.begin + i));
  HostTensor exp_avg = random_tensor(DType::f32, Shape{count}, 82, 0.1), exp_avg_sq = random_second_moment(count, 83);
  const HostTensor sum_squares = sum_of_squares(grads);
  const double total = sum_squares.get(0);
  ASSERT_GT(std::sqrt(total), 1.0) << "the update must clip";
  std::vector<ParameterRun> flat_runs = runs;
  for (auto& run : flat_runs) run.low_grad = false, run.grad_offset = -1;
  auto args = [&](const AdamwArgs& state) {
    AdamwArgs a = state;
    a.lr = 3e-3f;
    a.weight_decay = 0.1f;
    a.max_norm = 1.0f;
    a.step = 3;
    return a;
  };
  AdamwArgs flat{upload(params), upload(flat_grads), upload(exp_avg), upload(exp_avg_sq), upload(sum_squares)};
  flat.compute_copy = poisoned(DType::bf16, Shape{copy_count});
  flat.copy_ranges = flat_runs;
  AdamwArgs device{upload(params), upload(packed), upload(exp_avg), upload(exp_avg_sq), upload(sum_squares)};
  device.compute_copy = poisoned(DType::bf16, Shape{copy_count});
  device.copy_ranges = runs;
  device.low_grads = upload(low);
  cuda_->adamw(args(flat));
  cuda_->adamw(args(device));
  HostTensor cpu_copy(DType::bf16, Shape{copy_count});
  AdamwArgs host{params.view, packed.view, exp_avg.view, exp_avg_sq.view, sum_squares.view};
  host.compute_copy = cpu_copy.view;
  host.copy_ranges = runs;
  host.low_grads = low.view;
  cpu_->adamw(args(host));
  cuda_->synchronize();
  expect_bits_equal(download(flat.params), download(device.params), "params");
  expect_bits_equal(download(flat.exp_avg), download(device.exp_avg), "exp_avg");
  expect_bits_equal(download(flat.exp_avg_sq), download(device.exp_avg_sq), "exp_avg_sq");
  expect_bits_equal(download(flat.compute_copy), download(device.compute_copy), "compute copy");
  expect_bits_equal(packed, download(device.grads), "f32 gradients (read only)");
  expect_bits_equal(low, download(device.low_grads), "bf16 gradients (read only)");
  expect_close(params, download(device.params), 1e-6, "params against the CPU");
  expect_close(exp_avg_sq, download(device.exp_avg_sq), 1e-6, "exp_avg_sq against the CPU");
}

// The gradient norm of bf16 gradients (eight per load on the GPU): the sum of squares against the
// CPU's, at lengths that leave a tail past the last group of eight, added to what out held.
TEST_F(CudaComputeCopy, SumSquaresOfBf16MatchesCpuAndAccumulates) {
  for (int64_t count : {int64_t(8 * 100003), int64_t(8 * 5000 + 5)}) {
    SCOPED_TRACE("count " + std::to_string(count));
    const HostTensor x = random_tensor(DType::bf16, Shape{count}, 90, 0.01);
    HostTensor cpu_out(DType::f32, Shape{1});
    cpu_out.set(0, 0.75);
    cpu_->sum_squares({x.view, cpu_out.view, true});
    HostTensor start(DType::f32, Shape{1});
    start.set(0, 0.75);
    const TensorView out = upload(start);
    cuda_->sum_squares({upload(x), out, true});
    double expected = 0.75;
    for (int64_t i = 0; i < count; ++i) expected += x.get(i) * x.get(i);
    ASSERT_GT(expected, 1.0) << "the values must outweigh what out held";
    const double got = download(out).get(0);
    EXPECT_NEAR(got, expected, 1e-6 * expected);
    EXPECT_NEAR(got, cpu_out.get(0), 1e-6 * expected);
  }
}

// AdamW's amax slots (float8 weights' tensorwise amax) over runs taking several launches: each
// slot bit-identical to the largest |p| of the GPU's updated parameters over its runs (0 for a slot
// no run names), the amax buffer poisoned first; the update as close to the CPU's as without slots.
TEST_F(CudaComputeCopy, AdamwAmaxSlotsMatchCpuBitForBit) {
  const int64_t count = 4 * 20011;
  const int32_t slots = 7;
  int64_t copy_count = 0;
  auto runs = random_runs(count, 9, copy_count);
  testing_support::assign_amax_slots(runs, slots, 10);
  ASSERT_GT(runs.size(), 2u * 192u) << "the runs must take several launches";
  HostTensor params = random_tensor(DType::f32, Shape{count}, 80, 2.0), grads = random_tensor(DType::f32, Shape{count}, 81);
  HostTensor exp_avg = random_tensor(DType::f32, Shape{count}, 82, 0.1), exp_avg_sq = random_second_moment(count, 83);
  HostTensor sum_squares(DType::f32, Shape{1});
  sum_squares.set(0, 4.0);
  HostTensor copy(DType::bf16, Shape{copy_count}), amax(DType::f32, Shape{slots});
  TensorView d_params = upload(params), d_grads = upload(grads), d_m = upload(exp_avg), d_v = upload(exp_avg_sq);
  TensorView d_copy = poisoned(DType::bf16, Shape{copy_count}), d_amax = poisoned(DType::f32, Shape{slots});
  AdamwArgs args{params.view, grads.view, exp_avg.view, exp_avg_sq.view, sum_squares.view};
  args.compute_copy = copy.view;
  args.copy_ranges = runs;
  args.weight_amax = amax.view;
  args.lr = 3e-2f;
  args.weight_decay = 0.1f;
  args.max_norm = 1.0f;
  args.step = 3;
  AdamwArgs device_args = args;
  device_args.params = d_params;
  device_args.grads = d_grads;
  device_args.exp_avg = d_m;
  device_args.exp_avg_sq = d_v;
  device_args.grad_sum_squares = upload(sum_squares);
  device_args.compute_copy = d_copy;
  device_args.weight_amax = d_amax;
  cpu_->adamw(args);
  cuda_->adamw(device_args);
  const HostTensor updated = download(d_params);
  expect_close(params, updated, 1e-6, "params");
  HostTensor expected(DType::f32, Shape{slots});
  for (int32_t s = 0; s < slots; ++s) expected.set(s, 0.0);
  for (const auto& run : runs)
    if (run.amax_slot >= 0)
      for (int64_t i = run.begin; i < run.begin + run.count; ++i)
        expected.set(run.amax_slot, std::max(expected.get(run.amax_slot), std::fabs(updated.get(i))));
  expect_bits_equal(expected, download(d_amax), "float8 weight amax slots");
  expect_close(amax, download(d_amax), 1e-6, "float8 weight amax slots against the CPU");
  EXPECT_GT(expected.get(0), 0.0);
  EXPECT_EQ(expected.get(slots - 1), 0.0);
}

TEST_F(CudaComputeCopy, EmbeddingFromAnF32TableMatchesCpuAndTheBf16Copy) {
  const int64_t count = 300, vocabulary = 97, dim = 64;
  HostTensor tokens = random_ids(Shape{count}, 1, int32_t(vocabulary));
  HostTensor table = random_tensor(DType::f32, Shape{vocabulary, dim}, 2, 3.0);
  HostTensor copy(DType::bf16, Shape{vocabulary, dim});
  cpu_->convert({table.view, copy.view});
  HostTensor want = nan_tensor(DType::bf16, Shape{count, dim});
  cpu_->embedding_forward({tokens.view, table.view, want.view});
  const TensorView device_tokens = upload(tokens);
  const TensorView from_master = poisoned(DType::bf16, Shape{count, dim}), from_copy = poisoned(DType::bf16, Shape{count, dim});
  cuda_->embedding_forward({device_tokens, upload(table), from_master});
  cuda_->embedding_forward({device_tokens, upload(copy), from_copy});
  expect_bits_equal(want, download(from_master), "embedding forward f32 -> bf16 against the CPU");
  expect_bits_equal(download(from_copy), download(from_master), "embedding forward f32 -> bf16 against the bf16 copy");
}

}  // namespace
}  // namespace smelt::test
