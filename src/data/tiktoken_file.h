// The tiktoken vocabulary file format (Llama-3's tokenizer.model): one `base64(token bytes) rank` per
// line, ranks 0..N-1, and Llama-3's special tokens, which the file does not list.
#pragma once
#include <string>
#include <vector>

namespace smelt {

// Tokens indexed by rank. A malformed line, a duplicate or missing rank, or a missing single byte
// is an input error naming the file and line.
std::vector<std::string> read_tiktoken_file(const std::string& path);

// Writes tokens[rank] in rank order (temporary name, then rename).
void write_tiktoken_file(const std::string& path, const std::vector<std::string>& tokens);

std::string base64_encode(const std::string& bytes);

// Llama-3's 256 special tokens, in id order after the ranked tokens: <|begin_of_text|>,
// <|end_of_text|>, reserved 0-3, <|start_header_id|>, <|end_header_id|>, reserved 4, <|eot_id|>,
// reserved 5-250.
std::vector<std::string> llama3_special_tokens();

}  // namespace smelt
