// TensorBoard event files: CRC-32C against its published check value, and a file
// read back record by record (framing, CRCs, the Event fields) by a decoder written here.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/temporary_folder.h"
#include "train/tensorboard.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

TEST(TensorBoard, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
}

uint64_t read_varint(const std::string& s, size_t& at) {
  uint64_t value = 0;
  for (int shift = 0;; shift += 7) {
    const auto byte = static_cast<uint8_t>(s.at(at++));
    value |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return value;
  }
}

struct Scalar {
  std::string tag;
  float value = 0;
  int64_t step = -1;
  bool has_version = false;
};

// Decodes an Event: wall_time (1), step (2), file_version (3), summary (5) { value (1) { tag (1), simple_value (2) } }.
Scalar decode_event(const std::string& event) {
  Scalar out;
  size_t at = 0;
  while (at < event.size()) {
    const uint64_t key = read_varint(event, at);
    const int field = int(key >> 3), wire = int(key & 7);
    if (wire == 1) {
      at += 8;
    } else if (wire == 0) {
      const uint64_t v = read_varint(event, at);
      if (field == 2) out.step = int64_t(v);
    } else if (wire == 2) {
      const uint64_t length = read_varint(event, at);
      const std::string body = event.substr(at, length);
      at += length;
      if (field == 3) out.has_version = body == "brain.Event:2";
      if (field == 5) {
        size_t s = 0;
        read_varint(body, s);  // Summary.value, length-delimited
        const uint64_t value_length = read_varint(body, s);
        const std::string value = body.substr(s, value_length);
        size_t v = 0;
        while (v < value.size()) {
          const uint64_t k = read_varint(value, v);
          if ((k >> 3) == 1) {
            const uint64_t n = read_varint(value, v);
            out.tag = value.substr(v, n);
            v += n;
          } else {
            std::memcpy(&out.value, value.data() + v, 4);
            v += 4;
          }
        }
      }
    } else {
      ADD_FAILURE() << "unexpected wire type " << wire;
      return out;
    }
  }
  return out;
}

TEST(TensorBoard, WritesFramedEventsWithScalars) {
  const testing_support::TemporaryFolder temporary;  // removed with what it holds, however the test ends
  const fs::path folder = temporary.path();
  std::string path;
  {
    TensorBoardWriter writer(folder.string());
    writer.scalar("loss/train", 3.25, 7);
    writer.scalar("throughput/tokens_per_second", 33602, 8);
    writer.flush();
    path = writer.path();
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string file = buffer.str();
  std::vector<Scalar> events;
  size_t at = 0;
  while (at < file.size()) {
    ASSERT_LE(at + 12, file.size());
    uint64_t length = 0;
    for (int i = 0; i < 8; ++i) length |= uint64_t(uint8_t(file[at + i])) << (8 * i);
    uint32_t length_crc, data_crc;
    std::memcpy(&length_crc, file.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(file.data() + at, 8));
    const std::string payload = file.substr(at + 12, length);
    std::memcpy(&data_crc, file.data() + at + 12 + length, 4);
    EXPECT_EQ(data_crc, masked_crc32c(payload.data(), payload.size()));
    events.push_back(decode_event(payload));
    at += 12 + length + 4;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_TRUE(events[0].has_version);
  EXPECT_EQ(events[1].tag, "loss/train");
  EXPECT_FLOAT_EQ(events[1].value, 3.25f);
  EXPECT_EQ(events[1].step, 7);
  EXPECT_EQ(events[2].tag, "throughput/tokens_per_second");
  EXPECT_FLOAT_EQ(events[2].value, 33602.0f);
  EXPECT_EQ(events[2].step, 8);
}

}  // namespace
}  // namespace smelt
