// Byte-pair encoding with tiktoken semantics: each pre-token is one token when the vocabulary has it,
// otherwise its bytes are merged pairwise, lowest rank first (leftmost among equals).
#include "data/bpe_tokenizer.h"

#include <cstring>
#include <filesystem>
#include <queue>

#include "core/error.h"
#include "data/pretokenize.h"
#include "data/tiktoken_file.h"

namespace smelt {
namespace {

constexpr uint32_t no_rank = UINT32_MAX;

uint64_t hash_bytes(std::string_view bytes) {
  uint64_t hash = 0x9E3779B97F4A7C15ull ^ (bytes.size() * 0xFF51AFD7ED558CCDull);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (true) {
    uint64_t chunk = 0;
    const size_t take = left < 8 ? left : 8;
    std::memcpy(&chunk, p, take);
    hash = (hash ^ chunk) * 0xBF58476D1CE4E5B9ull;
    hash ^= hash >> 29;
    if (left <= 8) break;
    p += 8;
    left -= 8;
  }
  return hash ^ (hash >> 32);
}

// Token bytes -> rank, open addressing over one buffer holding every token's bytes.
class RankTable {
 public:
  explicit RankTable(const std::vector<std::string>& tokens) {
    offsets_.reserve(tokens.size() + 1);
    for (const auto& token : tokens) {
      offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
      bytes_ += token;
    }
    offsets_.push_back(static_cast<uint32_t>(bytes_.size()));
    size_t capacity = 16;
    while (capacity < tokens.size() * 2) capacity *= 2;
    slots_.assign(capacity, no_rank);
    mask_ = capacity - 1;
    for (uint32_t rank = 0; rank < tokens.size(); ++rank) {
      size_t slot = hash_bytes(tokens[rank]) & mask_;
      while (slots_[slot] != no_rank) slot = (slot + 1) & mask_;
      slots_[slot] = rank;
    }
  }
  uint32_t find(std::string_view bytes) const {
    for (size_t slot = hash_bytes(bytes) & mask_;; slot = (slot + 1) & mask_) {
      const uint32_t rank = slots_[slot];
      if (rank == no_rank) return no_rank;
      if (token(rank) == bytes) return rank;
    }
  }
  std::string_view token(uint32_t rank) const {
    return std::string_view(bytes_).substr(offsets_[rank], offsets_[rank + 1] - offsets_[rank]);
  }
  size_t size() const { return offsets_.size() - 1; }

 private:
  std::string bytes_;
  std::vector<uint32_t> offsets_;
  std::vector<uint32_t> slots_;
  size_t mask_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const std::vector<std::string>& tokens, std::string name)
      : table_(tokens), specials_(llama3_special_tokens()), name_(std::move(name)) {}

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3);
    std::vector<Part> parts;
    for_each_pretoken(text, [&](std::string_view piece) { encode_piece(piece, ids, parts); });
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    for (int32_t id : ids) {
      if (id >= 0 && static_cast<size_t>(id) < table_.size()) {
        text += table_.token(static_cast<uint32_t>(id));
      } else if (id >= 0 && id < vocab_size()) {
        text += specials_[static_cast<size_t>(id) - table_.size()];
      } else {
        fail(ErrorKind::input, "tokenizer " + name_ + ": expected token ids in 0.." + std::to_string(vocab_size() - 1) +
                                   ", found " + std::to_string(id) + "; decode ids with the tokenizer that made them");
      }
    }
    return text;
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(table_.size() + specials_.size()); }
  int32_t bos_id() const override { return static_cast<int32_t>(table_.size()); }
  int32_t eos_id() const override { return static_cast<int32_t>(table_.size() + 1); }
  std::string name() const override { return name_; }

 private:
  struct Part {
    size_t start;
    uint32_t rank;  // rank of this part joined with the next one
  };

  void encode_piece(std::string_view piece, std::vector<int32_t>& ids, std::vector<Part>& parts) const {
    const uint32_t whole = table_.find(piece);
    if (whole != no_rank) {
      ids.push_back(static_cast<int32_t>(whole));
      return;
    }
    if (piece.size() > 64) return encode_long_piece(piece, ids);
    parts.clear();
    for (size_t i = 0; i + 1 < piece.size(); ++i) parts.push_back({i, table_.find(piece.substr(i, 2))});
    parts.push_back({piece.size() - 1, no_rank});
    parts.push_back({piece.size(), no_rank});
    // rank of parts[i] joined with parts[i + 1], skipping `skip` parts after i.
    auto joined_rank = [&](size_t i, size_t skip) {
      if (i + skip + 2 >= parts.size()) return no_rank;
      return table_.find(piece.substr(parts[i].start, parts[i + skip + 2].start - parts[i].start));
    };
    while (parts.size() > 2) {
      uint32_t best = no_rank;
      size_t at = 0;
      for (size_t i = 0; i + 2 < parts.size(); ++i)
        if (parts[i].rank < best) {
          best = parts[i].rank;
          at = i;
        }
      if (best == no_rank) break;
      if (at > 0) parts[at - 1].rank = joined_rank(at - 1, 1);
      parts[at].rank = joined_rank(at, 1);
      parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
    }
    for (size_t i = 0; i + 1 < parts.size(); ++i)
      ids.push_back(static_cast<int32_t>(table_.find(piece.substr(parts[i].start, parts[i + 1].start - parts[i].start))));
  }

  // The same merge order with a heap and a linked list: O(n log n) for long runs (of spaces, digits' neighbours...).
  void encode_long_piece(std::string_view piece, std::vector<int32_t>& ids) const {
    const size_t n = piece.size();
    std::vector<size_t> start(n + 1), next(n + 1), previous(n + 1);
    std::vector<bool> alive(n + 1, true);
    for (size_t i = 0; i <= n; ++i) {
      start[i] = i;
      next[i] = i + 1;
      previous[i] = i == 0 ? SIZE_MAX : i - 1;
    }
    struct Candidate {
      uint32_t rank;
      size_t left, right, after;  // part indices; valid while left, right, after are still consecutive
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : left > other.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
    auto push = [&](size_t left) {
      if (left == SIZE_MAX || left >= n) return;
      const size_t right = next[left];
      if (right >= n) return;
      const uint32_t rank = table_.find(piece.substr(start[left], start[next[right]] - start[left]));
      if (rank != no_rank) heap.push({rank, left, right, next[right]});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const Candidate candidate = heap.top();
      heap.pop();
      if (!alive[candidate.left] || !alive[candidate.right] || next[candidate.left] != candidate.right ||
          next[candidate.right] != candidate.after)
        continue;
      alive[candidate.right] = false;
      next[candidate.left] = next[candidate.right];
      previous[next[candidate.right]] = candidate.left;
      push(previous[candidate.left]);
      push(candidate.left);
    }
    for (size_t i = 0; i < n; i = next[i])
      ids.push_back(static_cast<int32_t>(table_.find(piece.substr(start[i], start[next[i]] - start[i]))));
  }

  RankTable table_;
  std::vector<std::string> specials_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) {
  const std::vector<std::string> tokens = read_tiktoken_file(path);
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const auto& token : tokens) hash = (hash ^ hash_bytes(token)) * 0x100000001B3ull;
  char digest[17];
  std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(hash));
  const std::string name = "bpe:" + std::filesystem::path(path).filename().string() + ":" +
                           std::to_string(tokens.size() + 256) + ":" + std::string(digest, 8);
  return std::make_unique<BpeTokenizer>(tokens, name);
}

}  // namespace smelt
