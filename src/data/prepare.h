// `smelt prepare`: text inputs -> token shards, documents separated by end-of-text, with a held-out
// validation split (the last documents in input order) and a summary file, dataset.json.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace smelt {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files and folders of .txt/.md/.jsonl
  std::string output_dir;           // created if missing
  std::string tokenizer = "byte";   // a load_tokenizer spec (ignored by the overload taking a Tokenizer)
  std::string text_field = "text";  // JSON Lines field holding the document
  double validation_fraction = 0.05;  // of the input bytes, taken from the end
  uint64_t shard_tokens = uint64_t{1} << 26;  // tokens per shard at most
  int threads = 0;                            // 0: all hardware threads
};

struct PrepareProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t documents = 0, tokens = 0;
};

struct PrepareSummary {
  uint64_t train_documents = 0, validation_documents = 0;
  uint64_t train_tokens = 0, validation_tokens = 0;
  int train_shards = 0, validation_shards = 0;
  uint64_t input_bytes = 0;
  double seconds = 0;
  std::string tokenizer;  // Tokenizer::name()
  int64_t vocab_size = 0;
};

using PrepareCallback = std::function<void(const PrepareProgress&)>;

// Shard names: train_00000.tok, ..., validation_00000.tok, ...; dataset.json is written last (a folder
// without it is an interrupted preparation). Existing shards in the folder are replaced.
PrepareSummary prepare_dataset(const PrepareOptions& options, const PrepareCallback& progress = {});
PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer,
                               const PrepareCallback& progress = {});

// Reads dataset.json of a prepared folder; an input error if it is missing or malformed.
PrepareSummary read_dataset_summary(const std::string& folder);

// One line: "230 documents (220 train, 10 validation), 3.1M tokens in 2 shards, tokenizer ...".
std::string describe(const PrepareSummary& summary);

// Encodes documents on `threads` threads; result[i] = tokenizer.encode(documents[i]). Large documents
// are cut at line breaks followed by a letter or digit (which never changes the tokens).
std::vector<std::vector<int32_t>> encode_parallel(const Tokenizer& tokenizer,
                                                  const std::vector<std::string_view>& documents, int threads);

}  // namespace smelt
