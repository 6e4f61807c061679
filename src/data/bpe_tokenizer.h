// Byte-pair encoding in the tiktoken file format with Llama-3's pre-tokenization and special tokens.
#pragma once
#include <memory>
#include <string>

#include "data/tokenizer.h"

namespace smelt {

// Reads a tiktoken-format file (one `base64(token) rank` per line) and appends Llama-3's 256 special
// tokens after the last rank. A malformed file is an input error naming the file and line.
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path);

}  // namespace smelt
