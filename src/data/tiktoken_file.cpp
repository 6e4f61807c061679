// Reading and writing tiktoken vocabulary files; Llama-3's special tokens.
#include "data/tiktoken_file.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace smelt {
namespace {

constexpr char base64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// Decodes standard base64 (with '=' padding); false on any other character or a bad length.
bool base64_decode(std::string_view text, std::string* bytes) {
  static constexpr auto values = [] {
    std::array<int8_t, 256> table{};
    table.fill(-1);
    for (int i = 0; i < 64; ++i) table[static_cast<unsigned char>(base64_alphabet[i])] = static_cast<int8_t>(i);
    return table;
  }();
  if (text.size() % 4 != 0 || text.empty()) return false;
  bytes->clear();
  for (size_t i = 0; i < text.size(); i += 4) {
    int quad[4];
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && i + 4 == text.size() && k >= 2) {
        quad[k] = 0;
        ++padding;
        continue;
      }
      if (padding > 0) return false;
      quad[k] = values[static_cast<unsigned char>(c)];
      if (quad[k] < 0) return false;
    }
    const uint32_t triple = (quad[0] << 18) | (quad[1] << 12) | (quad[2] << 6) | quad[3];
    bytes->push_back(static_cast<char>(triple >> 16));
    if (padding < 2) bytes->push_back(static_cast<char>((triple >> 8) & 0xFF));
    if (padding < 1) bytes->push_back(static_cast<char>(triple & 0xFF));
  }
  return true;
}

}  // namespace

std::string base64_encode(const std::string& bytes) {
  std::string text;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t left = bytes.size() - i;
    uint32_t triple = static_cast<unsigned char>(bytes[i]) << 16;
    if (left > 1) triple |= static_cast<unsigned char>(bytes[i + 1]) << 8;
    if (left > 2) triple |= static_cast<unsigned char>(bytes[i + 2]);
    text.push_back(base64_alphabet[(triple >> 18) & 63]);
    text.push_back(base64_alphabet[(triple >> 12) & 63]);
    text.push_back(left > 1 ? base64_alphabet[(triple >> 6) & 63] : '=');
    text.push_back(left > 2 ? base64_alphabet[triple & 63] : '=');
  }
  return text;
}

std::vector<std::string> read_tiktoken_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail(ErrorKind::input, "tokenizer " + path + ": cannot open it; expected \"byte\" or the path of a tiktoken-format "
                                                 "file (such as Llama-3's tokenizer.model)");
  // Entries are collected first and the table is sized from their count, never from a rank
  // read from the file: ranks must be exactly 0..count-1, so a huge rank is an error, not an allocation.
  std::vector<std::pair<int64_t, std::string>> entries;
  std::vector<int64_t> line_of_entry;
  std::string line, bytes;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::string where = "tokenizer " + path + ":" + std::to_string(line_number) + ": ";
    const size_t space = line.find(' ');
    long long rank = -1;
    char* end = nullptr;
    if (space != std::string::npos) rank = std::strtoll(line.c_str() + space + 1, &end, 10);
    if (space == std::string::npos || end == line.c_str() + space + 1 || *end != '\0' || rank < 0 ||
        rank >= (1 << 30) || !base64_decode(std::string_view(line).substr(0, space), &bytes))
      fail(ErrorKind::input, where + "expected `base64(token) rank`, found \"" + line.substr(0, 60) +
                                 "\"; this is not a tiktoken-format file (Llama-3's tokenizer.model is one)");
    entries.emplace_back(rank, bytes);
    line_of_entry.push_back(line_number);
  }
  std::vector<std::string> tokens(entries.size());
  std::vector<bool> seen(entries.size(), false);
  for (size_t e = 0; e < entries.size(); ++e) {
    const auto& [rank, token] = entries[e];
    const std::string where = "tokenizer " + path + ":" + std::to_string(line_of_entry[e]) + ": ";
    if (static_cast<size_t>(rank) >= entries.size())
      fail(ErrorKind::input, where + "rank " + std::to_string(rank) + " in a file of " +
                                 std::to_string(entries.size()) + " tokens: expected ranks 0.." +
                                 std::to_string(entries.size() - 1) + ", so some rank is missing; the file is corrupt");
    if (seen[static_cast<size_t>(rank)])
      fail(ErrorKind::input, where + "rank " + std::to_string(rank) + " appears twice; the file is corrupt");
    seen[static_cast<size_t>(rank)] = true;
    tokens[static_cast<size_t>(rank)] = token;
  }
  std::array<bool, 256> single{};
  for (const auto& token : tokens)
    if (token.size() == 1) single[static_cast<unsigned char>(token[0])] = true;
  for (int byte = 0; byte < 256; ++byte)
    if (!single[byte])
      fail(ErrorKind::input, "tokenizer " + path + ": expected a token for every single byte, byte " +
                                 std::to_string(byte) + " has none; the file cannot encode arbitrary text");
  return tokens;
}

void write_tiktoken_file(const std::string& path, const std::vector<std::string>& tokens) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary);
    if (!out) fail(ErrorKind::input, "tokenizer " + temporary + ": cannot create it; check the output folder");
    for (size_t rank = 0; rank < tokens.size(); ++rank) out << base64_encode(tokens[rank]) << ' ' << rank << '\n';
    if (!out) fail(ErrorKind::input, "tokenizer " + temporary + ": write failed; check free disk space");
  }
  std::filesystem::rename(temporary, path);
}

std::vector<std::string> llama3_special_tokens() {
  std::vector<std::string> tokens = {
      "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
      "<|reserved_special_token_2|>", "<|reserved_special_token_3|>", "<|start_header_id|>", "<|end_header_id|>",
      "<|reserved_special_token_4|>", "<|eot_id|>"};
  for (int i = 5; i < 256 - 5; ++i) tokens.push_back("<|reserved_special_token_" + std::to_string(i) + "|>");
  return tokens;
}

}  // namespace smelt
