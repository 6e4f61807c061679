// The Tokenizer interface the trainer and the data layer share, and load_tokenizer,
// which turns a spec ("byte" or a tiktoken-format file) into one.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace smelt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ordinary text to ids: special-token strings in the text are encoded as plain text; no BOS/EOS added.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids back to bytes; decode(encode(s)) == s. Ids outside the vocabulary are an input error.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;  // including special tokens
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  // "byte", or "bpe:<file name>:<vocab size>": cache keys use it, so it names the vocabulary.
  virtual std::string name() const = 0;
};

// Byte-level tokenizer: ids 0..255 are the bytes, 256 is BOS, 257 is EOS (vocabulary 258).
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr int32_t bos = 256;
  static constexpr int32_t eos = 257;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 258; }
  int32_t bos_id() const override { return bos; }
  int32_t eos_id() const override { return eos; }
  std::string name() const override { return "byte"; }
};

// "byte" gives the ByteTokenizer; anything else is read as a tiktoken-format file
// (one `base64(token) rank` per line) with Llama-3's 256 special tokens appended.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace smelt
