// The hand-written matcher for Llama-3's pre-tokenization pattern (see pretokenize.h).
#include "data/pretokenize.h"

#include <cstdio>
#include <string>

#include "core/error.h"
#include "data/unicode_class.h"

namespace smelt {
namespace {

struct Char {
  CharClass kind;
  size_t length;
};

[[noreturn]] void invalid_utf8(std::string_view text, size_t offset) {
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[offset]));
  fail(ErrorKind::input, "tokenizer: expected UTF-8 text, found an invalid byte sequence at byte offset " +
                             std::to_string(offset) + " (byte " + byte + "); convert the text to UTF-8");
}

inline Char char_at(std::string_view text, size_t offset) {
  const auto lead = static_cast<unsigned char>(text[offset]);
  if (lead < 0x80) return {classify(lead), 1};
  uint32_t code_point;
  const int length = decode_utf8(text, offset, &code_point);
  if (length == 0) invalid_utf8(text, offset);
  return {classify(code_point), static_cast<size_t>(length)};
}

inline bool is_space(CharClass kind) { return kind == CharClass::space || kind == CharClass::newline; }

inline char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

// 's 't 're 've 'm 'll 'd, any case: the length matched at text[begin] == '\'', or 0.
size_t contraction(std::string_view text, size_t begin) {
  if (begin + 1 >= text.size()) return 0;
  const char first = lower(text[begin + 1]);
  if (first == 's' || first == 't' || first == 'm' || first == 'd') return 2;
  if (begin + 2 >= text.size()) return 0;
  const char second = lower(text[begin + 2]);
  if ((first == 'r' && second == 'e') || (first == 'v' && second == 'e') || (first == 'l' && second == 'l')) return 3;
  return 0;
}

size_t letters_end(std::string_view text, size_t offset) {
  while (offset < text.size()) {
    const Char next = char_at(text, offset);
    if (next.kind != CharClass::letter) break;
    offset += next.length;
  }
  return offset;
}

}  // namespace

size_t pretoken_end(std::string_view text, size_t begin) {
  const size_t size = text.size();
  if (text[begin] == '\'') {
    const size_t length = contraction(text, begin);
    if (length > 0) return begin + length;
  }
  const Char first = char_at(text, begin);
  const size_t after_first = begin + first.length;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (first.kind == CharClass::letter) return letters_end(text, after_first);
  if ((first.kind == CharClass::space || first.kind == CharClass::other) && after_first < size &&
      char_at(text, after_first).kind == CharClass::letter)
    return letters_end(text, after_first);
  // \p{N}{1,3}
  if (first.kind == CharClass::number) {
    size_t end = after_first;
    for (int count = 1; count < 3 && end < size; ++count) {
      const Char next = char_at(text, end);
      if (next.kind != CharClass::number) break;
      end += next.length;
    }
    return end;
  }
  // ' '?[^\s\p{L}\p{N}]+[\r\n]*
  size_t symbols = begin;
  if (text[begin] == ' ' && after_first < size && char_at(text, after_first).kind == CharClass::other)
    symbols = after_first;
  if (char_at(text, symbols).kind == CharClass::other) {
    size_t end = symbols;
    while (end < size) {
      const Char next = char_at(text, end);
      if (next.kind != CharClass::other) break;
      end += next.length;
    }
    while (end < size && (text[end] == '\r' || text[end] == '\n')) ++end;
    return end;
  }
  // The rest start with white space: \s*[\r\n]+ | \s+(?!\S) | \s+
  size_t end = begin, last_newline_end = 0, last_start = begin;
  while (end < size) {
    const Char next = char_at(text, end);
    if (!is_space(next.kind)) break;
    last_start = end;
    end += next.length;
    if (next.kind == CharClass::newline) last_newline_end = end;
  }
  if (last_newline_end > 0) return last_newline_end;
  if (end == size || last_start == begin) return end;
  return last_start;  // leave the last space to prefix the following word
}

}  // namespace smelt
