// Unicode character classes for pre-tokenization: letter (\p{L}), number (\p{N}), white space,
// and strict UTF-8 decoding of one code point.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace smelt {

struct CodePointRange {
  uint32_t first, last;  // inclusive
};

extern const CodePointRange letter_ranges[];
extern const size_t letter_range_count;
extern const CodePointRange number_ranges[];
extern const size_t number_range_count;
extern const CodePointRange space_ranges[];
extern const size_t space_range_count;

enum class CharClass : uint8_t { letter, number, space, newline, other };  // newline: '\r' or '\n'

// The class of a code point (ASCII by table, the rest by binary search of the generated ranges).
CharClass classify(uint32_t code_point);

// Decodes the code point starting at text[offset] (strict UTF-8: no overlong forms, surrogates or
// values above U+10FFFF). Returns its length in bytes (1..4), or 0 when the bytes there are invalid.
int decode_utf8(std::string_view text, size_t offset, uint32_t* code_point);

// The offset of the first invalid byte sequence, or text.size() when the text is valid UTF-8.
size_t find_invalid_utf8(std::string_view text);

}  // namespace smelt
