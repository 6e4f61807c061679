// Llama-3's pre-tokenization, matched by hand (no regex engine): splits text into the pieces BPE
// encodes separately. The pattern, tried in this order at each position:
//   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ' '?[^\s\p{L}\p{N}]+[\r\n]*
//   | \s*[\r\n]+ | \s+(?!\S) | \s+
#pragma once
#include <cstddef>
#include <string_view>

namespace smelt {

// The end of the piece starting at `begin` (< text.size()). Invalid UTF-8 is an input error giving
// the byte offset.
size_t pretoken_end(std::string_view text, size_t begin);

// Calls visit(piece) for each piece of text, in order; the pieces concatenate to text.
template <class Visit>
void for_each_pretoken(std::string_view text, Visit&& visit) {
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = pretoken_end(text, begin);
    visit(text.substr(begin, end - begin));
    begin = end;
  }
}

}  // namespace smelt
