// Character classes by code point and strict UTF-8 decoding.
#include "data/unicode_class.h"

#include <algorithm>
#include <array>

namespace smelt {
namespace {

bool in_ranges(const CodePointRange* ranges, size_t count, uint32_t code_point) {
  const CodePointRange* end = ranges + count;
  const CodePointRange* it =
      std::upper_bound(ranges, end, code_point, [](uint32_t cp, const CodePointRange& r) { return cp < r.first; });
  return it != ranges && code_point <= (it - 1)->last;
}

constexpr std::array<CharClass, 128> ascii_classes = [] {
  std::array<CharClass, 128> table{};
  for (int c = 0; c < 128; ++c) {
    CharClass value = CharClass::other;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) value = CharClass::letter;
    else if (c >= '0' && c <= '9') value = CharClass::number;
    else if (c == '\r' || c == '\n') value = CharClass::newline;
    else if (c == ' ' || (c >= 0x09 && c <= 0x0d)) value = CharClass::space;
    table[c] = value;
  }
  return table;
}();

}  // namespace

CharClass classify(uint32_t code_point) {
  if (code_point < 128) return ascii_classes[code_point];
  if (in_ranges(letter_ranges, letter_range_count, code_point)) return CharClass::letter;
  if (in_ranges(number_ranges, number_range_count, code_point)) return CharClass::number;
  if (in_ranges(space_ranges, space_range_count, code_point)) return CharClass::space;
  return CharClass::other;
}

int decode_utf8(std::string_view text, size_t offset, uint32_t* code_point) {
  const size_t left = text.size() - offset;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[offset + i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  const auto continuation = [&](size_t i) { return i < left && (byte(i) & 0xC0) == 0x80; };
  if (lead >= 0xC2 && lead <= 0xDF) {
    if (!continuation(1)) return 0;
    *code_point = ((lead & 0x1Fu) << 6) | (byte(1) & 0x3Fu);
    return 2;
  }
  if (lead >= 0xE0 && lead <= 0xEF) {
    if (!continuation(1) || !continuation(2)) return 0;
    const uint32_t cp = ((lead & 0x0Fu) << 12) | ((byte(1) & 0x3Fu) << 6) | (byte(2) & 0x3Fu);
    if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;  // overlong or surrogate
    *code_point = cp;
    return 3;
  }
  if (lead >= 0xF0 && lead <= 0xF4) {
    if (!continuation(1) || !continuation(2) || !continuation(3)) return 0;
    const uint32_t cp = ((lead & 0x07u) << 18) | ((byte(1) & 0x3Fu) << 12) | ((byte(2) & 0x3Fu) << 6) | (byte(3) & 0x3Fu);
    if (cp < 0x10000 || cp > 0x10FFFF) return 0;
    *code_point = cp;
    return 4;
  }
  return 0;
}

size_t find_invalid_utf8(std::string_view text) {
  size_t offset = 0;
  uint32_t code_point;
  while (offset < text.size()) {
    const int length = decode_utf8(text, offset, &code_point);
    if (length == 0) return offset;
    offset += static_cast<size_t>(length);
  }
  return text.size();
}

}  // namespace smelt
