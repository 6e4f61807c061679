// Token shards: round trip in both dtypes, and every corruption case is an input error naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "data/token_shard.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace smelt {
namespace {

using testing_support::TemporaryFolder;

std::vector<int32_t> random_ids(size_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(seed)));
  std::vector<int32_t> ids(count);
  for (auto& id : ids) id = static_cast<int32_t>(random() % static_cast<uint64_t>(vocab));
  return ids;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Expects opening `path` to throw an input error whose message names the file and contains `needle`.
void expect_input_error(const std::string& path, int64_t model_vocab, const std::string& needle) {
  try {
    TokenShard shard(path, model_vocab);
    FAIL() << "expected an error opening " << path;
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::input);
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
  }
}

TEST(TokenShard, RoundTripsSixteenAndThirtyTwoBitIds) {
  TemporaryFolder folder;
  for (int64_t vocab : {int64_t{258}, int64_t{65536}, int64_t{128256}}) {
    const auto ids = random_ids(10007, vocab, static_cast<uint32_t>(vocab));
    const std::string path = folder.path("shard_" + std::to_string(vocab) + ".tok");
    write_shard(path, ids, vocab);
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    TokenShard shard(path, vocab);
    ASSERT_EQ(shard.size(), ids.size());
    EXPECT_EQ(shard.vocab_size(), vocab);
    EXPECT_EQ(shard.dtype(), vocab <= 65536 ? TokenDtype::u16 : TokenDtype::u32);
    std::vector<int32_t> back(ids.size(), -7);
    shard.read(0, ids.size(), back.data());
    EXPECT_EQ(back, ids);
    EXPECT_EQ(shard.at(1234), ids[1234]);
    EXPECT_EQ(std::filesystem::file_size(path), shard_header_bytes + ids.size() * (vocab <= 65536 ? 2 : 4));
  }
}

TEST(TokenShard, EveryCorruptionIsAnInputErrorNamingTheFile) {
  TemporaryFolder folder;
  const std::string good = folder.path("good.tok");
  write_shard(good, random_ids(1000, 5000, 3), 5000);
  const std::string bytes = read_bytes(good);

  std::string wrong_magic = bytes;
  wrong_magic[0] = 'X';
  expect_input_error(folder.write("magic.tok", wrong_magic), 0, "magic");
  expect_input_error(folder.write("header.tok", bytes.substr(0, 20)), 0, "truncated header");
  expect_input_error(folder.write("empty.tok", ""), 0, "truncated header");
  expect_input_error(folder.write("body.tok", bytes.substr(0, bytes.size() - 3)), 0, "truncated");
  expect_input_error(folder.write("padded.tok", bytes + "xy"), 0, "truncated or padded");
  std::string version = bytes;
  version[8] = 9;
  expect_input_error(folder.write("version.tok", version), 0, "version");
  std::string dtype = bytes;
  dtype[12] = 7;
  expect_input_error(folder.write("dtype.tok", dtype), 0, "dtype");
  expect_input_error(good, 4999, "larger than the model");
  expect_input_error(folder.path("missing.tok"), 0, "cannot open");
  TokenShard fits(good, 5000);
  EXPECT_EQ(fits.size(), 1000u);
}

}  // namespace
}  // namespace smelt
