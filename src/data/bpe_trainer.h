// Training a byte-pair encoding on the user's text with Llama-3's pre-tokenization: the vocabulary is
// written in the tiktoken format, so load_tokenizer reads it like Llama-3's own. Deterministic.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace smelt {

struct TrainTokenizerOptions {
  std::vector<std::string> inputs;  // files and folders of .txt/.md/.jsonl
  std::string output;               // the tiktoken file to write
  int64_t vocab_size = 8192;        // including Llama-3's 256 special tokens
  std::string text_field = "text";  // JSON Lines field holding the document
  int threads = 0;                  // 0: all hardware threads
};

enum class TrainStage { counting, merging, done };

struct TrainProgress {
  TrainStage stage = TrainStage::counting;
  uint64_t bytes_done = 0, bytes_total = 0;  // counting
  int64_t merges_done = 0, merges_total = 0;  // merging
};

struct TrainTokenizerSummary {
  int64_t vocab_size = 0;
  uint64_t input_bytes = 0, distinct_pieces = 0;
  double seconds = 0;
};

using TrainCallback = std::function<void(const TrainProgress&)>;

// Counts the pre-tokens of the inputs, learns vocab_size - 256 - 256 merges and writes the file.
TrainTokenizerSummary train_tokenizer(const TrainTokenizerOptions& options, const TrainCallback& progress = {});

// The learning step alone: pre-tokens with their counts -> ranked tokens (the 256 bytes first, then
// one token per merge, most frequent pair first; ties go to the smaller pair of ids).
std::vector<std::string> train_bpe(const std::vector<std::pair<std::string, uint64_t>>& piece_counts,
                                   int64_t ranked_tokens, const TrainCallback& progress = {});

}  // namespace smelt
