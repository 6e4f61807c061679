// The in-process communicator: ranks as threads; all-reduce, all-gather and
// reduce-scatter against sums computed here, identical bits on every rank.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/numerics.h"
#include "core/random.h"
#include "dist/communicator.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

std::vector<float> random_values(uint64_t seed, size_t n) {
  Random random(testing_support::fresh(seed));
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(random.normal());
  return v;
}

template <typename Body>
void run_ranks(int world, Body body) {
  LocalGroup group(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) threads.emplace_back([&, r] { body(group.communicator(r)); });
  for (auto& t : threads) t.join();
}

class LocalCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalCommunicatorTest, AllReduceSumsInRankOrderOnEveryRank) {
  const int world = GetParam();
  const size_t n = 1037;
  std::vector<std::vector<float>> data(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) data[static_cast<size_t>(r)] = random_values(100 + static_cast<uint64_t>(r), n);
  std::vector<float> expected(n, 0.0f);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i) expected[i] += data[static_cast<size_t>(r)][i];
  run_ranks(world, [&](Communicator& c) {
    EXPECT_EQ(c.world_size(), world);
    auto& mine = data[static_cast<size_t>(c.rank())];
    c.all_reduce_sum(TensorView(mine.data(), DType::f32, Shape{static_cast<int64_t>(n)}));
  });
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(data[static_cast<size_t>(r)][i], expected[i]) << "rank " << r << " element " << i;
}

TEST_P(LocalCommunicatorTest, AllGatherConcatenatesShardsInRankOrder) {
  const int world = GetParam();
  const size_t shard = 129;
  std::vector<std::vector<float>> shards(static_cast<size_t>(world)), full(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    shards[static_cast<size_t>(r)] = random_values(200 + static_cast<uint64_t>(r), shard);
    full[static_cast<size_t>(r)].assign(shard * static_cast<size_t>(world), std::nanf(""));
  }
  run_ranks(world, [&](Communicator& c) {
    const auto r = static_cast<size_t>(c.rank());
    c.all_gather(TensorView(shards[r].data(), DType::f32, Shape{static_cast<int64_t>(shard)}),
                 TensorView(full[r].data(), DType::f32, Shape{static_cast<int64_t>(shard) * world}));
  });
  for (int r = 0; r < world; ++r)
    for (int s = 0; s < world; ++s)
      for (size_t i = 0; i < shard; ++i)
        ASSERT_EQ(full[static_cast<size_t>(r)][static_cast<size_t>(s) * shard + i], shards[static_cast<size_t>(s)][i]);
}

TEST_P(LocalCommunicatorTest, ReduceScatterLeavesEachRankItsSliceOfTheSum) {
  const int world = GetParam();
  const size_t shard = 67, n = shard * static_cast<size_t>(world);
  std::vector<std::vector<float>> full(static_cast<size_t>(world)), out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    full[static_cast<size_t>(r)] = random_values(300 + static_cast<uint64_t>(r), n);
    out[static_cast<size_t>(r)].assign(shard, std::nanf(""));
  }
  run_ranks(world, [&](Communicator& c) {
    const auto r = static_cast<size_t>(c.rank());
    c.reduce_scatter_sum(TensorView(full[r].data(), DType::f32, Shape{static_cast<int64_t>(n)}),
                         TensorView(out[r].data(), DType::f32, Shape{static_cast<int64_t>(shard)}));
  });
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < shard; ++i) {
      float sum = 0;
      for (int s = 0; s < world; ++s) sum += full[static_cast<size_t>(s)][static_cast<size_t>(r) * shard + i];
      ASSERT_EQ(out[static_cast<size_t>(r)][i], sum) << "rank " << r << " element " << i;
    }
}

TEST_P(LocalCommunicatorTest, AverageInBf16AndTextExchange) {
  const int world = GetParam();
  const size_t shard = 33, n = shard * static_cast<size_t>(world);
  std::vector<std::vector<uint16_t>> full(static_cast<size_t>(world)), out(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const auto values = random_values(400 + static_cast<uint64_t>(r), n);
    for (float v : values) full[static_cast<size_t>(r)].push_back(float_to_bf16(v));
    out[static_cast<size_t>(r)].assign(shard, 0x7FC0);  // NaN
  }
  std::vector<std::vector<std::string>> texts(static_cast<size_t>(world));
  run_ranks(world, [&](Communicator& c) {
    const auto r = static_cast<size_t>(c.rank());
    c.wait(c.reduce_scatter(TensorView(full[r].data(), DType::bf16, Shape{static_cast<int64_t>(n)}),
                            TensorView(out[r].data(), DType::bf16, Shape{static_cast<int64_t>(shard)}), ReduceOp::average));
    texts[r] = c.exchange_text("rank " + std::to_string(r));
  });
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < shard; ++i) {
      float sum = 0;  // rank order, in float, rounded to bf16 once
      for (int s = 0; s < world; ++s) sum += bf16_to_float(full[static_cast<size_t>(s)][static_cast<size_t>(r) * shard + i]);
      ASSERT_EQ(out[static_cast<size_t>(r)][i], float_to_bf16(sum / static_cast<float>(world))) << "rank " << r << " element " << i;
    }
    for (int s = 0; s < world; ++s) EXPECT_EQ(texts[static_cast<size_t>(r)][static_cast<size_t>(s)], "rank " + std::to_string(s));
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalCommunicatorTest, ::testing::Values(1, 2, 4));

TEST(LocalCommunicator, ARankThatFailsReleasesTheOthers) {
  LocalGroup group(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        if (r == 1) throw Error(ErrorKind::internal, "rank 1 broke");
        group.communicator(r).barrier();  // would wait forever for rank 1
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
        group.abandon();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("another rank failed"), std::string::npos) << errors[0];
  EXPECT_NE(errors[2].find("another rank failed"), std::string::npos) << errors[2];
}

TEST(LocalCommunicator, RejectsDeviceOrMismatchedViews) {
  LocalGroup group(1);
  std::vector<float> a(8), b(3);
  EXPECT_THROW(group.communicator(0).all_gather(TensorView(a.data(), DType::f32, Shape{8}),
                                                TensorView(b.data(), DType::f32, Shape{3})),
               Error);
  EXPECT_THROW(group.communicator(0).all_reduce_sum(TensorView(a.data(), DType::i32, Shape{8})), Error);
}

}  // namespace
}  // namespace smelt
