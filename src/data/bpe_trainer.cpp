// Byte-pair encoding training: parallel pre-token counting, then merges driven by a lazy max-heap of
// pair counts, updating only the words that contain the merged pair.
#include "data/bpe_trainer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "data/pretokenize.h"
#include "data/text_source.h"
#include "data/tiktoken_file.h"
#include "data/unicode_class.h"

namespace smelt {
namespace {

constexpr int64_t special_token_count = 256;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}

struct Word {
  std::vector<int32_t> symbols;
  uint64_t count;
};

struct Candidate {
  int64_t count;
  uint64_t pair;
  bool operator<(const Candidate& other) const {  // max-heap: larger count, then smaller pair first
    return count != other.count ? count < other.count : pair > other.pair;
  }
};

using PieceCounts = std::unordered_map<std::string, uint64_t>;

PieceCounts count_pieces(const std::vector<TextFile>& files, const std::string& field, int threads,
                         const TrainCallback& progress, uint64_t total_bytes) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes_done{0};
  std::mutex report;
  std::vector<PieceCounts> partial(static_cast<size_t>(threads));
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&](int thread) {
    try {
      PieceCounts& counts = partial[static_cast<size_t>(thread)];
      for (size_t f = next++; f < files.size() && !failed; f = next++) {
        read_documents(files[f], field, [&](std::string_view document, uint64_t offset) {
          const size_t invalid = find_invalid_utf8(document);
          if (invalid != document.size())
            fail(ErrorKind::input, files[f].path + ": expected UTF-8 text, found an invalid byte sequence at byte " +
                                       std::to_string(offset + invalid) + "; convert the file to UTF-8");
          for_each_pretoken(document, [&](std::string_view piece) { ++counts[std::string(piece)]; });
        });
        const uint64_t done = bytes_done += files[f].bytes;
        if (progress) {
          std::lock_guard<std::mutex> lock(report);
          TrainProgress state;
          state.bytes_done = done;
          state.bytes_total = total_bytes;
          progress(state);
        }
      }
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
  PieceCounts total = std::move(partial[0]);
  for (size_t t = 1; t < partial.size(); ++t)
    for (auto& [piece, count] : partial[t]) total[piece] += count;
  return total;
}

}  // namespace

std::vector<std::string> train_bpe(const std::vector<std::pair<std::string, uint64_t>>& piece_counts,
                                   int64_t ranked_tokens, const TrainCallback& progress) {
  SMELT_CHECK(ranked_tokens >= 256, "a vocabulary needs the 256 single bytes");
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> token_ids;
  for (int byte = 0; byte < 256; ++byte) {
    tokens.emplace_back(1, static_cast<char>(byte));
    token_ids[tokens.back()] = byte;
  }
  std::vector<Word> words;
  words.reserve(piece_counts.size());
  for (const auto& [piece, count] : piece_counts) {
    if (piece.size() < 2) continue;
    Word word{{}, count};
    for (unsigned char c : piece) word.symbols.push_back(c);
    words.push_back(std::move(word));
  }
  std::unordered_map<uint64_t, int64_t> pair_counts;
  std::unordered_map<uint64_t, std::vector<uint32_t>> pair_words;  // may hold stale or repeated word indices
  for (uint32_t w = 0; w < words.size(); ++w) {
    const auto& symbols = words[w].symbols;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const uint64_t key = pair_key(symbols[i], symbols[i + 1]);
      pair_counts[key] += static_cast<int64_t>(words[w].count);
      pair_words[key].push_back(w);
    }
  }
  std::priority_queue<Candidate> heap;
  for (const auto& [pair, count] : pair_counts) heap.push({count, pair});

  const int64_t merges_total = ranked_tokens - 256;
  int64_t merges_done = 0;
  std::unordered_map<uint64_t, int64_t> delta;
  while (static_cast<int64_t>(tokens.size()) < ranked_tokens && !heap.empty()) {
    const Candidate best = heap.top();
    heap.pop();
    auto found = pair_counts.find(best.pair);
    if (found == pair_counts.end() || found->second != best.count) continue;  // stale entry
    if (best.count <= 0) break;
    const auto left = static_cast<int32_t>(best.pair >> 32), right = static_cast<int32_t>(best.pair & 0xFFFFFFFFu);
    const std::string merged = tokens[static_cast<size_t>(left)] + tokens[static_cast<size_t>(right)];
    int32_t id;
    auto existing = token_ids.find(merged);
    if (existing != token_ids.end()) {
      id = existing->second;  // the same bytes from another pair: reuse, no new rank
    } else {
      id = static_cast<int32_t>(tokens.size());
      tokens.push_back(merged);
      token_ids.emplace(merged, id);
    }
    delta.clear();
    std::vector<uint32_t> users = std::move(pair_words[best.pair]);
    pair_words.erase(best.pair);
    std::sort(users.begin(), users.end());
    users.erase(std::unique(users.begin(), users.end()), users.end());
    for (uint32_t w : users) {
      auto& symbols = words[w].symbols;
      const auto count = static_cast<int64_t>(words[w].count);
      bool contains = false;
      for (size_t i = 0; i + 1 < symbols.size() && !contains; ++i) contains = symbols[i] == left && symbols[i + 1] == right;
      if (!contains) continue;
      for (size_t i = 0; i + 1 < symbols.size(); ++i) delta[pair_key(symbols[i], symbols[i + 1])] -= count;
      size_t out = 0;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          symbols[out++] = id;
          ++i;
        } else {
          symbols[out++] = symbols[i];
        }
      }
      symbols.resize(out);
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        const uint64_t key = pair_key(symbols[i], symbols[i + 1]);
        delta[key] += count;
        if (symbols[i] == id || symbols[i + 1] == id) pair_words[key].push_back(w);
      }
    }
    std::vector<std::pair<uint64_t, int64_t>> changes(delta.begin(), delta.end());
    std::sort(changes.begin(), changes.end());
    for (const auto& [pair, change] : changes) {
      if (change == 0) continue;
      int64_t& count = pair_counts[pair];
      count += change;
      if (count > 0) heap.push({count, pair});
      else pair_counts.erase(pair);
    }
    ++merges_done;
    if (progress && (merges_done % 256 == 0)) {
      TrainProgress state;
      state.stage = TrainStage::merging;
      state.merges_done = static_cast<int64_t>(tokens.size()) - 256;
      state.merges_total = merges_total;
      progress(state);
    }
  }
  return tokens;
}

TrainTokenizerSummary train_tokenizer(const TrainTokenizerOptions& options, const TrainCallback& progress) {
  const auto start = std::chrono::steady_clock::now();
  if (options.vocab_size < 256 + special_token_count + 1 || options.vocab_size > (int64_t{1} << 24))
    fail(ErrorKind::config, "tokenizer training: expected a vocabulary size between " +
                                std::to_string(256 + special_token_count + 1) + " and 16777216, found " +
                                std::to_string(options.vocab_size) + "; it counts the 256 bytes and 256 special tokens");
  if (options.output.empty()) fail(ErrorKind::config, "tokenizer training: expected an output file, found none");
  const std::vector<TextFile> files = list_text_files(options.inputs);
  uint64_t total_bytes = 0;
  for (const auto& file : files) total_bytes += file.bytes;
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  PieceCounts counts = count_pieces(files, options.text_field, threads, progress, total_bytes);
  std::vector<std::pair<std::string, uint64_t>> pieces(std::make_move_iterator(counts.begin()),
                                                       std::make_move_iterator(counts.end()));
  counts.clear();
  std::sort(pieces.begin(), pieces.end());
  const std::vector<std::string> tokens = train_bpe(pieces, options.vocab_size - special_token_count, progress);
  write_tiktoken_file(options.output, tokens);
  TrainTokenizerSummary summary;
  summary.vocab_size = static_cast<int64_t>(tokens.size()) + special_token_count;
  summary.input_bytes = total_bytes;
  summary.distinct_pieces = pieces.size();
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) {
    TrainProgress state;
    state.stage = TrainStage::done;
    state.merges_done = state.merges_total = static_cast<int64_t>(tokens.size()) - 256;
    progress(state);
  }
  return summary;
}

}  // namespace smelt
