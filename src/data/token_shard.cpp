// Writing and validating token shards (format in token_shard.h).
#include "data/token_shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace smelt {
namespace {

void put_u32(unsigned char* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}
void put_u64(unsigned char* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(value >> (8 * i));
}
uint32_t get_u32(const unsigned char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<uint32_t>(in[i]) << (8 * i);
  return value;
}
uint64_t get_u64(const unsigned char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

size_t dtype_bytes(TokenDtype dtype) { return dtype == TokenDtype::u16 ? 2 : 4; }

void write_all(int fd, const unsigned char* data, size_t bytes, const std::string& path) {
  while (bytes > 0) {
    ssize_t written = ::write(fd, data, bytes);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0)
      fail(ErrorKind::input, "token shard " + path + ": write failed (" + std::strerror(errno) +
                                 "); check free disk space and permissions of the output folder");
    data += written;
    bytes -= static_cast<size_t>(written);
  }
}

}  // namespace

TokenDtype token_dtype_for(int64_t vocab_size) { return vocab_size <= 65536 ? TokenDtype::u16 : TokenDtype::u32; }

void write_shard(const std::string& path, const std::vector<int32_t>& ids, int64_t vocab_size) {
  SMELT_CHECK(vocab_size > 0 && vocab_size <= (int64_t{1} << 31), "vocabulary size out of range");
  const TokenDtype dtype = token_dtype_for(vocab_size);
  const size_t width = dtype_bytes(dtype);
  std::vector<unsigned char> bytes(shard_header_bytes + ids.size() * width);
  std::memcpy(bytes.data(), shard_magic, 8);
  put_u32(bytes.data() + 8, shard_version);
  put_u32(bytes.data() + 12, static_cast<uint32_t>(dtype));
  put_u64(bytes.data() + 16, ids.size());
  put_u64(bytes.data() + 24, static_cast<uint64_t>(vocab_size));
  unsigned char* body = bytes.data() + shard_header_bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    SMELT_CHECK(ids[i] >= 0 && ids[i] < vocab_size, "token id " + std::to_string(ids[i]) + " outside the vocabulary");
    const uint32_t id = static_cast<uint32_t>(ids[i]);
    for (size_t b = 0; b < width; ++b) body[i * width + b] = static_cast<unsigned char>(id >> (8 * b));
  }
  const std::string temporary = path + ".tmp";
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(ErrorKind::input, "token shard " + temporary + ": cannot create it (" + std::strerror(errno) +
                               "); check that the output folder exists and is writable");
  write_all(fd, bytes.data(), bytes.size(), temporary);
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    fail(ErrorKind::input, "token shard " + temporary + ": fsync/close failed (" + std::strerror(errno) + ")");
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    fail(ErrorKind::input, "token shard " + path + ": rename from " + temporary + " failed (" + std::strerror(errno) + ")");
}

TokenShard::TokenShard(const std::string& path, int64_t model_vocab_size) : path_(path) {
  const std::string where = "token shard " + path + ": ";
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail(ErrorKind::input, where + "cannot open it (" + std::strerror(errno) + "); check the dataset path");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    fail(ErrorKind::input, where + "cannot stat it (" + std::strerror(errno) + ")");
  }
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  if (file_bytes < shard_header_bytes) {
    ::close(fd);
    fail(ErrorKind::input, where + "truncated header: expected at least " + std::to_string(shard_header_bytes) +
                               " bytes, found " + std::to_string(file_bytes) + "; run `smelt prepare` again");
  }
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) fail(ErrorKind::input, where + "mmap failed (" + std::strerror(errno) + ")");
  mapping_ = mapping;
  mapping_bytes_ = file_bytes;
  const auto* header = static_cast<const unsigned char*>(mapping);
  try {
    if (std::memcmp(header, shard_magic, 8) != 0)
      fail(ErrorKind::input, where + "wrong magic: expected the file to start with \"SMELTTOK\", found other bytes; "
                                     "this is not a smelt token shard (make one with `smelt prepare`)");
    const uint32_t version = get_u32(header + 8);
    if (version != shard_version)
      fail(ErrorKind::input, where + "expected format version " + std::to_string(shard_version) + ", found " +
                                 std::to_string(version) + "; prepare the data again with this smelt");
    const uint32_t dtype = get_u32(header + 12);
    if (dtype != static_cast<uint32_t>(TokenDtype::u16) && dtype != static_cast<uint32_t>(TokenDtype::u32))
      fail(ErrorKind::input, where + "expected token dtype 1 (u16) or 2 (u32), found " + std::to_string(dtype) +
                                 "; the file is corrupt: prepare the data again");
    dtype_ = static_cast<TokenDtype>(dtype);
    count_ = get_u64(header + 16);
    vocab_size_ = static_cast<int64_t>(get_u64(header + 24));
    const uint64_t expected = shard_header_bytes + count_ * dtype_bytes(dtype_);
    if (count_ > (file_bytes - shard_header_bytes) / dtype_bytes(dtype_) || expected != file_bytes)
      fail(ErrorKind::input, where + "truncated or padded body: the header promises " + std::to_string(count_) +
                                 " tokens (" + std::to_string(expected) + " bytes), the file has " +
                                 std::to_string(file_bytes) + " bytes; prepare the data again");
    if (model_vocab_size > 0 && vocab_size_ > model_vocab_size)
      fail(ErrorKind::input, where + "vocabulary of " + std::to_string(vocab_size_) +
                                 " tokens is larger than the model's " + std::to_string(model_vocab_size) +
                                 "; set model.vocab_size to at least " + std::to_string(vocab_size_) +
                                 " or prepare the data with the model's tokenizer");
  } catch (...) {
    ::munmap(mapping_, mapping_bytes_);
    mapping_ = nullptr;
    throw;
  }
  tokens_ = header + shard_header_bytes;
}

TokenShard::~TokenShard() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_bytes_);
}

int32_t TokenShard::at(uint64_t index) const {
  SMELT_CHECK(index < count_, "shard index out of range");
  if (dtype_ == TokenDtype::u16) return static_cast<int32_t>(tokens_[2 * index] | (tokens_[2 * index + 1] << 8));
  return static_cast<int32_t>(get_u32(tokens_ + 4 * index));
}

void TokenShard::read(uint64_t begin, uint64_t count, int32_t* out) const {
  SMELT_CHECK(begin + count <= count_, "shard read out of range");
  if (dtype_ == TokenDtype::u16) {
    const unsigned char* p = tokens_ + 2 * begin;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(p[2 * i] | (p[2 * i + 1] << 8));
  } else {
    const unsigned char* p = tokens_ + 4 * begin;
    for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(get_u32(p + 4 * i));
  }
}

}  // namespace smelt
