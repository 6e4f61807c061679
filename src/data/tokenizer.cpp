// The byte-level tokenizer and the spec dispatch of load_tokenizer.
#include "data/tokenizer.h"

#include "core/error.h"
#include "data/bpe_tokenizer.h"

namespace smelt {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id == bos || id == eos) continue;
    if (id < 0 || id > 255)
      fail(ErrorKind::input, "byte tokenizer: expected token ids in 0..257, found " + std::to_string(id) +
                                 "; the ids come from a different tokenizer: decode them with that one");
    text.push_back(static_cast<char>(id));
  }
  return text;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec.empty())
    fail(ErrorKind::config, "tokenizer: expected \"byte\" or the path of a tiktoken-format tokenizer file, found an "
                            "empty string; set the tokenizer (for example `byte` or `tokenizer.model`)");
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  return load_bpe_tokenizer(spec);
}

}  // namespace smelt
