// Token shards: the on-disk format `smelt prepare` writes and the loader reads.
// A 32-byte little-endian header (magic, version, token dtype, token count, vocabulary size), then the ids.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace smelt {

// How ids are stored: two bytes when the vocabulary fits in 65536, four otherwise.
enum class TokenDtype : uint32_t { u16 = 1, u32 = 2 };

constexpr char shard_magic[8] = {'S', 'M', 'E', 'L', 'T', 'T', 'O', 'K'};
constexpr uint32_t shard_version = 1;
constexpr size_t shard_header_bytes = 32;

// The smallest dtype that holds ids below vocab_size.
TokenDtype token_dtype_for(int64_t vocab_size);

// Writes `path.tmp`, fsyncs it, renames it to `path`: an interrupted write never leaves a shard under
// its final name. Ids must be in [0, vocab_size).
void write_shard(const std::string& path, const std::vector<int32_t>& ids, int64_t vocab_size);

// A shard mapped read-only into memory. Validates on open: wrong magic, unknown version or dtype,
// truncated header or body, and (when model_vocab_size > 0) a vocabulary larger than the model's
// are input errors naming the file.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path, int64_t model_vocab_size = 0);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  uint64_t size() const { return count_; }  // number of tokens
  int64_t vocab_size() const { return vocab_size_; }
  TokenDtype dtype() const { return dtype_; }
  int32_t at(uint64_t index) const;
  // Copies tokens [begin, begin + count) into out.
  void read(uint64_t begin, uint64_t count, int32_t* out) const;

 private:
  std::string path_;
  uint64_t count_ = 0;
  int64_t vocab_size_ = 0;
  TokenDtype dtype_ = TokenDtype::u16;
  void* mapping_ = nullptr;
  size_t mapping_bytes_ = 0;
  const unsigned char* tokens_ = nullptr;
};

}  // namespace smelt
