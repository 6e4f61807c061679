// AdamW, sum of squares and mean on the CPU: several AdamW steps against a
// scalar re-implementation in double (clipping on and off), AdamW over copy runs against
// AdamW over the whole range (bit for bit), and deterministic reductions.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <random>
#include <span>

#include "cpu/finite_difference.h"
#include "cpu/random_copy_runs.h"

namespace smelt::test {
namespace {

constexpr int64_t kCount = 1037;

struct ScalarAdamw {
  std::vector<double> params, exp_avg, exp_avg_sq;

  // torch.nn.utils.clip_grad_norm_ then torch.optim.AdamW, written out per element.
  void step(std::vector<double>& grads, const AdamwArgs& h) {
    double sum_squares = 0;
    for (double g : grads) sum_squares += g * g;
    if (h.max_norm > 0) {
      const double clip = std::min(1.0, double(h.max_norm) / (std::sqrt(sum_squares) + 1e-6));
      for (double& g : grads) g *= clip;
    }
    const double lr = h.lr, beta1 = h.beta1, beta2 = h.beta2;
    const double bias_correction1 = 1 - std::pow(beta1, double(h.step));
    const double bias_correction2 = 1 - std::pow(beta2, double(h.step));
    for (size_t i = 0; i < params.size(); ++i) {
      params[i] *= 1 - lr * double(h.weight_decay);
      exp_avg[i] = beta1 * exp_avg[i] + (1 - beta1) * grads[i];
      exp_avg_sq[i] = beta2 * exp_avg_sq[i] + (1 - beta2) * grads[i] * grads[i];
      const double denominator = std::sqrt(exp_avg_sq[i]) / std::sqrt(bias_correction2) + double(h.eps);
      params[i] -= lr / bias_correction1 * exp_avg[i] / denominator;
    }
  }
};

void run_steps(DType dtype, float max_norm, double tolerance) {
  SCOPED_TRACE(std::string(dtype_name(dtype)) + " max_norm " + std::to_string(max_norm));
  BackendFixture backend;
  const Shape shape{kCount};
  ScalarAdamw reference{random_values(kCount, 1), std::vector<double>(kCount, 0.0), std::vector<double>(kCount, 0.0)};
  Buffer params(reference.params, dtype, shape), exp_avg(reference.exp_avg, dtype, shape);
  Buffer exp_avg_sq(reference.exp_avg_sq, dtype, shape), sum_squares(dtype, Shape{1});
  reference.params = params.values();
  bool clipped = false;
  for (int64_t step = 1; step <= 5; ++step) {
    auto grad_values = rounded(random_values(kCount, 100 + step, -0.2 * double(step), 0.2 * double(step)), dtype);
    Buffer grads(grad_values, dtype, shape);
    const auto grad_bits = grads.bits();
    backend->sum_squares(SumSquaresArgs{grads.view(), sum_squares.view()});
    AdamwArgs args;
    args.params = params.view();
    args.grads = grads.view();
    args.exp_avg = exp_avg.view();
    args.exp_avg_sq = exp_avg_sq.view();
    args.grad_sum_squares = sum_squares.view();
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    args.max_norm = max_norm;
    args.step = step;
    backend->adamw(args);
    double norm = 0;
    for (double g : grad_values) norm += g * g;
    clipped = clipped || (max_norm > 0 && std::sqrt(norm) > max_norm);
    reference.step(grad_values, args);
    EXPECT_EQ(grads.bits(), grad_bits) << "the optimizer wrote the gradients; it only reads them";
    expect_close(params.values(), reference.params, tolerance, "params");
    expect_close(exp_avg.values(), reference.exp_avg, tolerance, "exp_avg");
    expect_close(exp_avg_sq.values(), reference.exp_avg_sq, tolerance, "exp_avg_sq");
  }
  if (max_norm > 0) {
    EXPECT_TRUE(clipped) << "the clipping case never clipped; the test would prove nothing";
  }
}

TEST(Adamw, MatchesScalarReferenceWithoutClipping) {
  run_steps(DType::f64, 0.0f, 1e-12);
  run_steps(DType::f32, 0.0f, 1e-5);
}

TEST(Adamw, MatchesScalarReferenceWithClipping) {
  run_steps(DType::f64, 3.0f, 1e-12);
  run_steps(DType::f32, 3.0f, 1e-5);
}

std::vector<ParameterRun> random_runs(int64_t count, uint64_t seed, int64_t& copy_count) {
  return testing_support::random_copy_runs(count, seed, seed % 2 == 0, copy_count);
}

// The optimizer's state for one run of the comparison: four flat buffers, the sum of squares, a copy.
struct AdamwState {
  Buffer params, grads, exp_avg, exp_avg_sq, sum_squares;
  std::vector<uint16_t> copy;
  // Random parameters in [-param_range, param_range] and moments (the same for the same seed
  // within a test), room for grad_count gradients and a compute copy of copy_count poisoned
  // elements.
  static AdamwState random(DType dtype, int64_t count, int64_t grad_count, int64_t copy_count, double param_range = 1.0) {
    const Shape shape{count};
    return AdamwState{Buffer(random_values(size_t(count), 1, -param_range, param_range), dtype, shape),
                      Buffer(dtype, Shape{grad_count}), Buffer(random_values(size_t(count), 2, -0.1, 0.1), dtype, shape),
                      Buffer(random_values(size_t(count), 3, 0.0, 0.01), dtype, shape), Buffer(dtype, Shape{1}),
                      std::vector<uint16_t>(size_t(copy_count), 0xFFFF)};
  }
  AdamwArgs args(std::span<const ParameterRun> runs) {
    AdamwArgs a;
    a.params = params.view();
    a.grads = grads.view();
    a.exp_avg = exp_avg.view();
    a.exp_avg_sq = exp_avg_sq.view();
    a.grad_sum_squares = sum_squares.view();
    a.compute_copy = TensorView(copy.data(), DType::bf16, Shape{int64_t(copy.size())});
    a.copy_ranges = runs;
    a.lr = 3e-2f;
    a.weight_decay = 0.1f;
    return a;
  }
};

TEST(Adamw, CopyRunsGiveTheSameUpdateAsOneCopyOfEverything) {
  BackendFixture backend;
  const int64_t count = 4 * 2011;
  for (DType dtype : {DType::f32, DType::f64})
    for (float max_norm : {0.0f, 2.0f}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " max_norm " + std::to_string(max_norm));
      int64_t copy_count = 0;
      const auto runs = random_runs(count, 7 + uint64_t(max_norm), copy_count);
      ASSERT_GT(runs.size(), 20u);
      ASSERT_GT(copy_count, 0);
      ASSERT_LT(copy_count, count);
      AdamwState whole = AdamwState::random(dtype, count, count, count);
      AdamwState ranged = AdamwState::random(dtype, count, count, copy_count);
      bool clipped = false;
      for (int64_t step = 1; step <= 3; ++step) {
        const auto grads = random_values(count, 10 + uint64_t(step), -0.1, 0.1);
        for (AdamwState* state : {&whole, &ranged}) {
          state->grads.assign(grads);
          backend->sum_squares(SumSquaresArgs{state->grads.view(), state->sum_squares.view()});
          std::fill(state->copy.begin(), state->copy.end(), uint16_t(0xFFFF));  // poison: NaN bf16
        }
        clipped = clipped || (max_norm > 0 && std::sqrt(whole.sum_squares.get(0)) > max_norm);
        AdamwArgs a = whole.args({}), b = ranged.args(runs);
        a.max_norm = b.max_norm = max_norm;
        a.step = b.step = step;
        backend->adamw(a);
        backend->adamw(b);
        EXPECT_EQ(whole.params.bits(), ranged.params.bits()) << "params, step " << step;
        EXPECT_EQ(whole.grads.bits(), ranged.grads.bits()) << "gradients (read only), step " << step;
        EXPECT_EQ(whole.exp_avg.bits(), ranged.exp_avg.bits()) << "exp_avg, step " << step;
        EXPECT_EQ(whole.exp_avg_sq.bits(), ranged.exp_avg_sq.bits()) << "exp_avg_sq, step " << step;
        int64_t compared = 0;
        for (const auto& run : runs) {
          if (!run.copied()) continue;
          for (int64_t i = 0; i < run.count; ++i, ++compared)
            ASSERT_EQ(ranged.copy[size_t(run.copy_offset + i)], whole.copy[size_t(run.begin + i)])
                << "copy of element " << run.begin + i << ", step " << step;
        }
        EXPECT_EQ(compared, copy_count) << "every element of the packed copy written";
        for (int64_t i = 0; i < count; ++i)
          ASSERT_NE(whole.copy[size_t(i)], 0xFFFF) << "the whole copy left element " << i << " unwritten";
      }
      if (max_norm > 0) {
        EXPECT_TRUE(clipped) << "the clipping case never clipped; the test would prove nothing";
      }
    }
}

// Runs with amax slots: the update is bit-identical to the same runs without slots, and each slot
// holds the largest |p| after the update over the runs naming it (0 for a slot none names).
TEST(Adamw, AmaxSlotsHoldTheLargestUpdatedMagnitude) {
  BackendFixture backend;
  const int64_t count = 4 * 2011;
  const int32_t slots = 5;
  int64_t copy_count = 0;
  const auto plain_runs = random_runs(count, 21, copy_count);
  auto slot_runs = plain_runs;
  testing_support::assign_amax_slots(slot_runs, slots, 22);
  std::vector<int> named(slots, 0);
  for (const auto& run : slot_runs)
    if (run.amax_slot >= 0 && run.count > 0) ++named[size_t(run.amax_slot)];
  for (int32_t s = 0; s + 1 < slots; ++s) ASSERT_GT(named[size_t(s)], 1) << "slot " << s << " should gather several runs";
  AdamwState with = AdamwState::random(DType::f32, count, count, copy_count, 3.0);
  AdamwState without = AdamwState::random(DType::f32, count, count, copy_count, 3.0);
  for (int64_t step = 1; step <= 3; ++step) {
    const auto grads = random_values(count, 30 + uint64_t(step), -0.5, 0.5);
    for (AdamwState* state : {&with, &without}) {
      state->grads.assign(grads);
      backend->sum_squares(SumSquaresArgs{state->grads.view(), state->sum_squares.view()});
    }
    std::vector<float> amax(slots, std::numeric_limits<float>::quiet_NaN());  // poison
    AdamwArgs a = with.args(slot_runs), b = without.args(plain_runs);
    a.weight_amax = TensorView(amax.data(), DType::f32, Shape{slots});
    a.max_norm = b.max_norm = 1.0f;
    a.step = b.step = step;
    backend->adamw(a);
    backend->adamw(b);
    EXPECT_EQ(with.params.bits(), without.params.bits()) << "params, step " << step;
    EXPECT_EQ(with.exp_avg.bits(), without.exp_avg.bits()) << "exp_avg, step " << step;
    std::vector<float> expected(slots, 0.0f);
    for (const auto& run : slot_runs)
      if (run.amax_slot >= 0)
        for (int64_t i = run.begin; i < run.begin + run.count; ++i)
          expected[size_t(run.amax_slot)] = std::max(expected[size_t(run.amax_slot)], std::fabs(float(with.params.get(i))));
    for (int32_t s = 0; s < slots; ++s) {
      EXPECT_EQ(std::bit_cast<uint32_t>(amax[size_t(s)]), std::bit_cast<uint32_t>(expected[size_t(s)]))
          << "slot " << s << ", step " << step << ": " << amax[size_t(s)] << " against " << expected[size_t(s)];
    }
    EXPECT_GT(expected[0], 0.0f);
    EXPECT_EQ(amax[size_t(slots - 1)], 0.0f) << "a slot no run names is 0";
  }
  // A slot past weight_amax is refused.
  std::vector<float> short_amax(2);
  AdamwArgs bad = with.args(slot_runs);
  bad.weight_amax = TensorView(short_amax.data(), DType::f32, Shape{2});
  bad.step = 4;
  EXPECT_THROW(backend->adamw(bad), Error);
}

// Runs whose gradients are packed elsewhere, about half of them in bf16 (a plan's block linears):
// the same update, bit for bit, as the whole range reading f32 gradients that hold the same
// (bf16-representable) values at each element's own offset; every gradient buffer only read.
TEST(Adamw, GradientsPackedInF32AndBf16GiveTheUpdateOfTheFlatGradients) {
  BackendFixture backend;
  const int64_t count = 4 * 2011;
  int64_t copy_count = 0, grad_count = 0, low_count = 0;
  auto runs = random_runs(count, 51, copy_count);
  testing_support::assign_gradient_places(runs, 52, grad_count, low_count);
  ASSERT_GT(grad_count, 0);
  ASSERT_GT(low_count, 0);
  AdamwState flat = AdamwState::random(DType::f32, count, count, copy_count);
  AdamwState packed = AdamwState::random(DType::f32, count, grad_count, copy_count);
  for (int64_t step = 1; step <= 3; ++step) {
    // Every gradient bf16-representable, so that the flat f32 ones hold exactly the packed values.
    const auto grads = rounded(random_values(count, 60 + uint64_t(step), -0.3, 0.3), DType::bf16);
    std::vector<double> f32_part(size_t(grad_count), std::nan("")), low_part(size_t(low_count), std::nan(""));
    for (const auto& run : runs)
      for (int64_t i = 0; i < run.count; ++i)
        (run.low_grad ? low_part : f32_part)[size_t(run.grad_offset + i)] = grads[size_t(run.begin + i)];
    flat.grads.assign(grads);
    packed.grads.assign(f32_part);
    Buffer low(low_part, DType::bf16, Shape{low_count});
    const auto packed_bits = packed.grads.bits(), low_bits = low.bits();
    backend->sum_squares(SumSquaresArgs{flat.grads.view(), flat.sum_squares.view()});
    backend->sum_squares(SumSquaresArgs{flat.grads.view(), packed.sum_squares.view()});
    std::vector<ParameterRun> flat_runs = runs;  // the same runs, gradients at their own offsets in f32
    for (auto& run : flat_runs) run.low_grad = false, run.grad_offset = -1;
    AdamwArgs a = flat.args(flat_runs), b = packed.args(runs);
    b.low_grads = low.view();
    a.max_norm = b.max_norm = 1.5f;
    a.step = b.step = step;
    backend->adamw(a);
    backend->adamw(b);
    EXPECT_EQ(flat.params.bits(), packed.params.bits()) << "params, step " << step;
    EXPECT_EQ(flat.exp_avg.bits(), packed.exp_avg.bits()) << "exp_avg, step " << step;
    EXPECT_EQ(flat.exp_avg_sq.bits(), packed.exp_avg_sq.bits()) << "exp_avg_sq, step " << step;
    EXPECT_EQ(flat.copy, packed.copy) << "compute copy, step " << step;
    EXPECT_EQ(packed.grads.bits(), packed_bits) << "f32 gradients written, step " << step;
    EXPECT_EQ(low.bits(), low_bits) << "bf16 gradients written, step " << step;
  }
  // A bf16 run without low_grads to read, or reaching past them, is refused.
  AdamwArgs missing = packed.args(runs);
  missing.step = 4;
  EXPECT_THROW(backend->adamw(missing), Error);
  Buffer short_low(DType::bf16, Shape{low_count - 4});
  AdamwArgs too_short = packed.args(runs);
  too_short.low_grads = short_low.view();
  too_short.step = 4;
  EXPECT_THROW(backend->adamw(too_short), Error);
}

TEST(Adamw, RejectsCopyRunsThatDoNotTileTheRange) {
  BackendFixture backend;
  const int64_t count = 64;
  const Shape shape{count};
  AdamwState state{Buffer(random_values(count, 1), DType::f32, shape), Buffer(random_values(count, 2), DType::f32, shape),
                   Buffer(std::vector<double>(count, 0.0), DType::f32, shape),
                   Buffer(std::vector<double>(count, 0.0), DType::f32, shape), Buffer(DType::f32, Shape{1}),
                   std::vector<uint16_t>(32)};
  auto attempt = [&](std::vector<ParameterRun> runs) { backend->adamw(state.args(runs)); };
  EXPECT_NO_THROW(attempt({{0, 32, -1}, {32, 32, 0}}));
  EXPECT_THROW(attempt({{0, 28, -1}, {32, 32, 0}}), Error) << "a gap";
  EXPECT_THROW(attempt({{0, 32, -1}, {32, 16, 0}}), Error) << "short of the end";
  EXPECT_THROW(attempt({{0, 30, -1}, {30, 34, 0}}), Error) << "not a multiple of 4";
  EXPECT_THROW(attempt({{0, 16, -1}, {16, 48, 0}}), Error) << "past the end of the copy";
  EXPECT_THROW(attempt({}), Error) << "no runs: a copy of every element, which this one is not";
}

TEST(Reduce, SumSquaresAndMeanMatchAndIgnoreThreads) {
  BackendFixture backend;
  const int64_t count = 100003;
  const auto values = random_values(count, 41);
  Buffer x(values, DType::f32, Shape{count}), out(DType::f32, Shape{1}), mean_out(DType::f32, Shape{1});
  const auto stored = x.values();
  double expected_sum = 0, expected_mean = 0;
  for (double v : stored) {
    expected_sum += v * v;
    expected_mean += v;
  }
  expected_mean /= double(count);
  const int saved = omp_get_max_threads();
  std::vector<float> sums, means;
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    out.poison();
    backend->sum_squares(SumSquaresArgs{x.view(), out.view()});
    backend->mean(MeanArgs{x.view(), mean_out.view()});
    sums.push_back(float(out.get(0)));
    means.push_back(float(mean_out.get(0)));
  }
  omp_set_num_threads(saved);
  EXPECT_NEAR(sums[0], expected_sum, 1e-6 * expected_sum);
  EXPECT_NEAR(means[0], expected_mean, 1e-6);
  for (size_t i = 1; i < sums.size(); ++i) {
    EXPECT_EQ(sums[i], sums[0]);
    EXPECT_EQ(means[i], means[0]);
  }
  backend->sum_squares(SumSquaresArgs{x.view(), out.view(), true});  // accumulate: twice the sum
  EXPECT_NEAR(out.get(0), 2 * expected_sum, 2e-6 * expected_sum);
}

// A sum of squares over three buffers (x and the two of also) rounds to f32 once, like the sum
// over the three laid end to end: the gradient norm of a plan that splits its gradients over the
// f32 buffer, the embedding's own and the block linears' is then the norm of a plan that holds
// them in one. Summing each, rounding, and adding the next (accumulate) rounds three times and
// misses in a good share of these draws.
TEST(Reduce, SumSquaresOverThreeBuffersRoundsOnceLikeOneBuffer) {
  BackendFixture backend;
  int rounded_each_time_misses = 0;
  for (uint64_t draw = 0; draw < 24; ++draw) {
    const int64_t first = 3001 + int64_t(draw) * 17, second = 5003 - int64_t(draw) * 13, third = 1999 + int64_t(draw) * 7;
    std::vector<double> a = random_values(first, 100 + draw), b = random_values(second, 200 + draw),
                        c = random_values(third, 300 + draw);
    std::vector<double> all = a;
    all.insert(all.end(), b.begin(), b.end());
    all.insert(all.end(), c.begin(), c.end());
    Buffer x(a, DType::f32, Shape{first}), also(b, DType::f32, Shape{second}), more(c, DType::f32, Shape{third});
    Buffer whole(all, DType::f32, Shape{first + second + third});
    Buffer split(DType::f32, Shape{1}), joined(DType::f32, Shape{1}), each(DType::f32, Shape{1});
    split.poison();
    joined.poison();
    SumSquaresArgs three{x.view(), split.view()};
    three.also = {also.view(), more.view()};
    backend->sum_squares(three);
    backend->sum_squares(SumSquaresArgs{whole.view(), joined.view()});
    EXPECT_EQ(split.get(0), joined.get(0)) << "draw " << draw;
    // Only the second of also given: the first may be left empty.
    SumSquaresArgs gap{x.view(), each.view()};
    gap.also[1] = more.view();
    backend->sum_squares(gap);
    backend->sum_squares(SumSquaresArgs{also.view(), each.view(), true});
    double reference = 0;
    for (const std::vector<double>* part : {&a, &b, &c})
      for (double v : *part) reference += double(float(v)) * double(float(v));
    EXPECT_NEAR(split.get(0), reference, 1e-6 * reference) << "draw " << draw;
    EXPECT_NEAR(each.get(0), reference, 1e-6 * reference) << "draw " << draw;
    backend->sum_squares(SumSquaresArgs{x.view(), each.view()});
    backend->sum_squares(SumSquaresArgs{also.view(), each.view(), true});
    backend->sum_squares(SumSquaresArgs{more.view(), each.view(), true});
    rounded_each_time_misses += each.get(0) != joined.get(0);
  }
  EXPECT_GT(rounded_each_time_misses, 0) << "the draws never tell one rounding from three: the test would pass either way";
}

}  // namespace
}  // namespace smelt::test
