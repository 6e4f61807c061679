// TFRecord framing and the few protocol-buffer fields an Event with scalars needs.
#include "train/tensorboard.h"

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace smelt {

namespace {

// Protocol buffer wire format: varints, 64-bit, 32-bit and length-delimited fields.
void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7f) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}
void put_tag(std::string& out, int field, int wire_type) { put_varint(out, (uint64_t(field) << 3) | uint64_t(wire_type)); }
void put_double(std::string& out, int field, double value) {
  put_tag(out, field, 1);
  char bytes[8];
  std::memcpy(bytes, &value, 8);
  out.append(bytes, 8);
}
void put_float(std::string& out, int field, float value) {
  put_tag(out, field, 5);
  char bytes[4];
  std::memcpy(bytes, &value, 4);
  out.append(bytes, 4);
}
void put_int64(std::string& out, int field, int64_t value) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(value));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82F63B78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t crc = 0xFFFFFFFFu;
  const auto* bytes = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder) {
  std::filesystem::create_directories(folder);
  path_ = (std::filesystem::path(folder) /
           ("events.out.tfevents." + std::to_string(static_cast<int64_t>(wall_time())) + ".smelt"))
              .string();
  file_.open(path_, std::ios::binary | std::ios::trunc);
  if (!file_) fail(ErrorKind::input, "cannot create the TensorBoard event file '" + path_ + "'; check the run folder");
  std::string event;  // Event { wall_time = 1; file_version = 3 }
  put_double(event, 1, wall_time());
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

void TensorBoardWriter::scalar(std::string_view tag, double value, int64_t step) {
  std::string summary_value;  // Summary.Value { tag = 1; simple_value = 2 }
  put_bytes(summary_value, 1, tag);
  put_float(summary_value, 2, static_cast<float>(value));
  std::string summary;  // Summary { repeated Value value = 1 }
  put_bytes(summary, 1, summary_value);
  std::string event;  // Event { wall_time = 1; step = 2; summary = 5 }
  put_double(event, 1, wall_time());
  put_int64(event, 2, step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& payload) {
  // TFRecord: length (u64 LE), masked CRC of the length, payload, masked CRC of the payload.
  const uint64_t length = payload.size();
  char header[8];
  for (int i = 0; i < 8; ++i) header[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  auto write_u32 = [&](uint32_t v) {
    char b[4];
    for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    file_.write(b, 4);
  };
  file_.write(header, 8);
  write_u32(masked_crc32c(header, 8));
  file_.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  write_u32(masked_crc32c(payload.data(), payload.size()));
}

void TensorBoardWriter::flush() { file_.flush(); }

}  // namespace smelt
