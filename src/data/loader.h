// The training data loader: fixed-length sequences over a stream of token shards, in a seeded
// order, one slice per data-parallel rank, with a position that checkpoints save and restore.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/token_shard.h"
#include "data/tokenizer.h"

namespace smelt {

// Where a loader is: sequences consumed in this epoch (counted over all ranks) and the epoch.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;
  uint64_t seed = 0;  // the loader's seed; restore() refuses a state saved with another one
};

struct DatasetOptions {
  std::string path;  // a text file, a folder of .txt/.md/.jsonl, or a folder of token shards (`smelt prepare`)
  int64_t batch_size = 0, seq_len = 0;  // per rank: B sequences of T tokens
  uint64_t seed = 0;
  int rank = 0, world_size = 1;  // data-parallel slice
  int64_t model_vocab_size = 0;  // shards with a larger vocabulary are an error
  std::string cache_dir;         // where tokenized text is cached; empty: a temporary folder, removed after opening
  double validation_fraction = 0.05;  // for text inputs without a validation_path
  // A validation source of its own (text, or shards: their validation split if they have one, else
  // all of them); empty: the held-out split of `path`. With one, text at `path` is all for training.
  std::string validation_path;
  std::string text_field = "text";    // for JSON Lines inputs
};

class DataLoader {
 public:
  // Fills inputs and targets, each (B*T) int32, from B sequences of T + 1 tokens (targets = inputs
  // shifted by one), across shard and document boundaries, in a deterministic order from the seed.
  virtual void next_batch(int32_t* inputs, int32_t* targets) = 0;
  virtual LoaderState state() const = 0;
  virtual void restore(const LoaderState& state) = 0;
  virtual int64_t total_tokens() const = 0;
  virtual ~DataLoader() = default;
};

// All tokens of a list of shards, read as one stream.
class TokenStream {
 public:
  void add(std::shared_ptr<const TokenShard> shard);
  uint64_t size() const { return total_; }
  size_t shards() const { return shards_.size(); }
  void read(uint64_t begin, uint64_t count, int32_t* out) const;

 private:
  std::vector<std::shared_ptr<const TokenShard>> shards_;
  std::vector<uint64_t> starts_;  // first stream index of each shard
  uint64_t total_ = 0;
};

enum class SequenceOrder {
  shuffled,    // training: a fresh seeded permutation of all sequences each epoch; ranks take disjoint slices
  sequential,  // validation: sequences in stream order, wrapping around
};

// Sequence k of the stream is tokens [k*T, k*T + T + 1): consecutive sequences share one token.
// Training needs at least world_size * B sequences (an input error otherwise).
std::unique_ptr<DataLoader> make_sequence_loader(TokenStream stream, SequenceOrder order, int64_t batch_size,
                                                 int64_t seq_len, uint64_t seed, int rank, int world_size);

struct Dataset {
  std::unique_ptr<DataLoader> train, validation;  // validation is null when there is too little data
  std::string description;
};

// Opens prepared shards (a folder with train_*.tok / validation_*.tok, or a single .tok file) or text
// (tokenized with `tokenizer`, documents separated by EOS, a held-out validation split, cached under
// cache_dir keyed by the files, their sizes and times, the tokenizer and the split), and the
// validation source when options.validation_path names one.
Dataset open_dataset(const DatasetOptions& options, const Tokenizer& tokenizer);

// The validation data alone, as open_dataset's `validation` reads it (the same tokens in the same
// order): options.validation_path's validation split when it has one, else all of it; without a
// validation_path, the held-out part of options.path. For evaluating weights (`smelt eval`).
// Fewer tokens than one sequence is an input error naming the source.
struct ValidationData {
  std::unique_ptr<DataLoader> loader;  // sequential, wrapping around at the end
  int64_t tokens = 0;                  // in the stream
  std::string description;
};
ValidationData open_validation_data(const DatasetOptions& options, const Tokenizer& tokenizer);

}  // namespace smelt
