// safetensors: round trip, and malformed files rejected with the file named.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/random.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/safetensors.h"

namespace smelt {
namespace {

TEST(Safetensors, RoundTripsTensorsAndMetadata) {
  Random random(testing_support::fresh(3));
  std::vector<float> a(6 * 7);
  std::vector<uint16_t> b(5);
  for (auto& x : a) x = static_cast<float>(random.normal());
  for (auto& x : b) x = static_cast<uint16_t>(random.below(65536));
  const testing_support::TemporaryFolder folder;
  const std::string path = folder.path("round.safetensors");
  save_safetensors(path, {{"w.a", DType::f32, {6, 7}, a.data()}, {"w.b", DType::bf16, {5}, b.data()}},
                   {{"note", "hello"}});
  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("note"), "hello");
  EXPECT_EQ(f.entry("w.a").shape, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(f.entry("w.b").dtype, DType::bf16);
  EXPECT_EQ(std::memcmp(f.bytes_of("w.a"), a.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(f.bytes_of("w.b"), b.data(), b.size() * 2), 0);
  EXPECT_THROW(f.entry("missing"), Error);
}

void expect_rejected(const std::string& bytes, const std::string& fragment) {
  const testing_support::TemporaryFolder folder;
  const std::string path = folder.write("bad.safetensors", bytes);
  try {
    load_safetensors(path);
    ADD_FAILURE() << "accepted a file that should fail with '" << fragment << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json + data;
}

TEST(Safetensors, RejectsMalformedFiles) {
  expect_rejected("abc", "shorter than");
  expect_rejected(std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}", "header length");
  expect_rejected(with_header("{not json", ""), "not valid JSON");
  expect_rejected(with_header("[1,2]", ""), "not a JSON object");
  expect_rejected(with_header(R"({"t":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", "abcd"), "dtype");
  expect_rejected(with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd"), "need");
  expect_rejected(with_header(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", "abcd"), "outside");
  expect_rejected(with_header(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"), "shape");
  expect_rejected(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", "abcdefgh"), "overlap");
  expect_rejected(with_header(R"({"t":{"dtype":"F32","shape":[1]}})", "abcd"), "data_offsets");
}

}  // namespace
}  // namespace smelt
