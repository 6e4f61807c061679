// Sequence loaders over token streams, and open_dataset (shards, or text tokenized into a cache).
#include "data/loader.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "data/prepare.h"
#include "data/text_source.h"

namespace smelt {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) from 64 random bits (multiply-shift; identical on every platform).
uint64_t below(uint64_t& state, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(splitmix64(state)) * bound) >> 64);
}

class SequenceLoader final : public DataLoader {
 public:
  SequenceLoader(TokenStream stream, SequenceOrder order, int64_t batch_size, int64_t seq_len, uint64_t seed,
                 int rank, int world_size)
      : stream_(std::move(stream)),
        order_(order),
        batch_size_(static_cast<uint64_t>(batch_size)),
        seq_len_(static_cast<uint64_t>(seq_len)),
        rank_(static_cast<uint64_t>(rank)),
        world_size_(static_cast<uint64_t>(world_size)),
        buffer_(seq_len_ + 1) {
    state_.seed = seed;
    sequences_ = stream_.size() > seq_len_ ? (stream_.size() - 1) / seq_len_ : 0;
  }

  void next_batch(int32_t* inputs, int32_t* targets) override {
    const uint64_t global_batch = batch_size_ * world_size_;
    if (order_ == SequenceOrder::shuffled && state_.position + global_batch > sequences_) {
      ++state_.epoch;
      state_.position = 0;
    }
    if (order_ == SequenceOrder::shuffled && (permutation_.empty() || permutation_epoch_ != state_.epoch))
      build_permutation();
    for (uint64_t b = 0; b < batch_size_; ++b) {
      const uint64_t slot = state_.position + rank_ * batch_size_ + b;
      const uint64_t sequence = order_ == SequenceOrder::shuffled ? permutation_[slot] : slot % sequences_;
      stream_.read(sequence * seq_len_, seq_len_ + 1, buffer_.data());
      std::copy(buffer_.begin(), buffer_.end() - 1, inputs + b * seq_len_);
      std::copy(buffer_.begin() + 1, buffer_.end(), targets + b * seq_len_);
    }
    state_.position += global_batch;
    if (order_ == SequenceOrder::sequential && state_.position >= sequences_) {
      state_.epoch += state_.position / sequences_;
      state_.position %= sequences_;
    }
  }

  LoaderState state() const override { return state_; }

  void restore(const LoaderState& state) override {
    if (order_ == SequenceOrder::shuffled && state.seed != state_.seed)
      fail(ErrorKind::config, "data loader: the saved position was made with seed " + std::to_string(state.seed) +
                                  ", this run uses seed " + std::to_string(state_.seed) +
                                  "; resume with the original seed to continue the same data order");
    if (state.position > sequences_)
      fail(ErrorKind::input, "data loader: the saved position " + std::to_string(state.position) +
                                 " is past the " + std::to_string(sequences_) +
                                 " sequences of this dataset; resume on the same dataset and sequence length");
    const uint64_t seed = state_.seed;
    state_ = state;
    state_.seed = seed;
  }

  int64_t total_tokens() const override { return static_cast<int64_t>(stream_.size()); }

 private:
  void build_permutation() {
    permutation_.resize(sequences_);
    std::iota(permutation_.begin(), permutation_.end(), uint64_t{0});
    uint64_t random = state_.seed ^ (0xD1B54A32D192ED03ull * (state_.epoch + 1));
    for (uint64_t i = sequences_; i > 1; --i) std::swap(permutation_[i - 1], permutation_[below(random, i)]);
    permutation_epoch_ = state_.epoch;
  }

  TokenStream stream_;
  SequenceOrder order_;
  uint64_t batch_size_, seq_len_, rank_, world_size_;
  uint64_t sequences_ = 0;
  LoaderState state_;
  std::vector<uint64_t> permutation_;  // sequence index for each slot of the epoch
  uint64_t permutation_epoch_ = 0;
  std::vector<int32_t> buffer_;  // (T + 1) tokens of one sequence
};

std::string hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

uint64_t fnv1a(uint64_t hash, std::string_view bytes) {
  for (unsigned char c : bytes) hash = (hash ^ c) * 0x100000001B3ull;
  return hash;
}

// The cache folder of `path`'s text tokenized with `tokenizer`, `fraction` of it held out.
std::string cache_key(const std::string& path, double fraction, const DatasetOptions& options,
                      const Tokenizer& tokenizer) {
  namespace fs = std::filesystem;
  uint64_t hash = 0xCBF29CE484222325ull;
  hash = fnv1a(hash, tokenizer.name() + "|" + std::to_string(tokenizer.vocab_size()) + "|" +
                         std::to_string(fraction) + "|" + options.text_field);
  for (const auto& file : list_text_files({path})) {
    const auto time = fs::last_write_time(file.path).time_since_epoch().count();
    std::string entry = fs::absolute(file.path).string();
    for (const std::string& part : {std::to_string(file.bytes), std::to_string(time)}) entry.append("|").append(part);
    hash = fnv1a(hash, entry);
  }
  return "tokens-" + hex(hash);
}

struct ShardFolder {
  TokenStream train, validation;
  std::string tokenizer;
};

ShardFolder open_shard_folder(const std::filesystem::path& path, int64_t model_vocab_size) {
  namespace fs = std::filesystem;
  ShardFolder folder;
  std::vector<std::string> train, validation, other;
  if (fs::is_regular_file(path)) {
    other.push_back(path.string());
  } else {
    for (const auto& entry : fs::directory_iterator(path)) {
      if (entry.path().extension() != ".tok") continue;
      const std::string name = entry.path().filename().string();
      if (name.rfind("train_", 0) == 0) train.push_back(entry.path().string());
      else if (name.rfind("validation_", 0) == 0) validation.push_back(entry.path().string());
      else other.push_back(entry.path().string());
    }
    if (!train.empty() || !validation.empty()) folder.tokenizer = read_dataset_summary(path.string()).tokenizer;
  }
  std::sort(train.begin(), train.end());
  std::sort(validation.begin(), validation.end());
  std::sort(other.begin(), other.end());
  train.insert(train.end(), other.begin(), other.end());
  for (const auto& shard : train) folder.train.add(std::make_shared<const TokenShard>(shard, model_vocab_size));
  for (const auto& shard : validation)
    folder.validation.add(std::make_shared<const TokenShard>(shard, model_vocab_size));
  return folder;
}

bool is_shard_path(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(path)) return path.extension() == ".tok";
  if (!fs::is_directory(path)) return false;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.path().extension() == ".tok") return true;
  return false;
}

}  // namespace

void TokenStream::add(std::shared_ptr<const TokenShard> shard) {
  if (shard->size() == 0) return;
  starts_.push_back(total_);
  total_ += shard->size();
  shards_.push_back(std::move(shard));
}

void TokenStream::read(uint64_t begin, uint64_t count, int32_t* out) const {
  SMELT_CHECK(begin + count <= total_, "token stream read past the end");
  size_t shard = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
  while (count > 0) {
    const uint64_t offset = begin - starts_[shard];
    const uint64_t take = std::min(count, shards_[shard]->size() - offset);
    shards_[shard]->read(offset, take, out);
    out += take;
    begin += take;
    count -= take;
    ++shard;
  }
}

std::unique_ptr<DataLoader> make_sequence_loader(TokenStream stream, SequenceOrder order, int64_t batch_size,
                                                 int64_t seq_len, uint64_t seed, int rank, int world_size) {
  if (batch_size <= 0 || seq_len <= 0 || world_size <= 0 || rank < 0 || rank >= world_size)
    fail(ErrorKind::config, "data loader: expected batch_size > 0, seq_len > 0 and 0 <= rank < world_size, found " +
                                std::to_string(batch_size) + ", " + std::to_string(seq_len) + ", rank " +
                                std::to_string(rank) + " of " + std::to_string(world_size));
  const uint64_t needed_sequences = static_cast<uint64_t>(batch_size) * static_cast<uint64_t>(world_size);
  const uint64_t sequences = stream.size() > static_cast<uint64_t>(seq_len) ? (stream.size() - 1) / seq_len : 0;
  if ((order == SequenceOrder::shuffled && sequences < needed_sequences) || sequences == 0)
    fail(ErrorKind::input, "data loader: expected at least " + std::to_string(needed_sequences) + " sequences of " +
                               std::to_string(seq_len + 1) + " tokens (" + std::to_string(world_size) + " ranks x " +
                               std::to_string(batch_size) + "), found " + std::to_string(stream.size()) +
                               " tokens; use more text, a smaller batch or a shorter sequence length");
  return std::make_unique<SequenceLoader>(std::move(stream), order, batch_size, seq_len, seed, rank, world_size);
}

namespace {

// A dataset source opened for reading, and how the `data:` line describes it.
struct OpenedSource {
  ShardFolder folder;
  std::string description;  // "PATH (text, cached in ...)"
};

// Shards of `path` (`what` names it in errors: "dataset", "validation dataset"): prepared shards as
// they are, or text tokenized into the cache (or a temporary folder) with `fraction` held out.
OpenedSource open_source(const std::string& path, const char* what, double fraction, const DatasetOptions& options,
                         const Tokenizer& tokenizer) {
  namespace fs = std::filesystem;
  if (!fs::exists(path))
    fail(ErrorKind::input, std::string(what) + " " + path + ": expected a text file or folder, or prepared token " +
                               "shards, found nothing at that path; check the path");
  fs::path shard_path = path;
  fs::path temporary;
  std::string source = "token shards";
  if (!is_shard_path(path)) {
    PrepareOptions prepare;
    prepare.inputs = {path};
    prepare.text_field = options.text_field;
    prepare.validation_fraction = fraction;
    if (options.cache_dir.empty()) {
      std::string pattern = (fs::temp_directory_path() / "smelt-tokens-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr)
        fail(ErrorKind::input, std::string(what) + ": cannot create a temporary folder under " +
                                   fs::temp_directory_path().string() + "; set a cache folder");
      temporary = shard_path = pattern;
      source = "text";
    } else {
      shard_path = fs::path(options.cache_dir) / cache_key(path, fraction, options, tokenizer);
      source = "text, cached in " + shard_path.string();
    }
    if (!temporary.empty() || !fs::exists(shard_path / "dataset.json")) {
      prepare.output_dir = shard_path.string();
      prepare_dataset(prepare, tokenizer);
    }
  }
  OpenedSource opened;
  try {
    opened.folder = open_shard_folder(shard_path, options.model_vocab_size);
  } catch (...) {
    if (!temporary.empty()) fs::remove_all(temporary);
    throw;
  }
  if (!temporary.empty()) fs::remove_all(temporary);  // the shards stay mapped
  opened.description = path + " (" + source + ")";
  return opened;
}

struct ValidationSource {
  TokenStream stream;
  std::string description;  // "validation: PATH (...), N tokens[ of its validation split]"
};

// options.validation_path's validation split when it has one (prepared shards), else all of it.
ValidationSource open_validation_source(const DatasetOptions& options, const Tokenizer& tokenizer) {
  OpenedSource held_out = open_source(options.validation_path, "validation dataset", 0.0, options, tokenizer);
  const bool split = held_out.folder.validation.size() > 0;
  ValidationSource source;
  source.stream = split ? std::move(held_out.folder.validation) : std::move(held_out.folder.train);
  source.description = "validation: " + held_out.description + ", " + std::to_string(source.stream.size()) +
                       (split ? " tokens of its validation split" : " tokens");
  return source;
}

}  // namespace

ValidationData open_validation_data(const DatasetOptions& options, const Tokenizer& tokenizer) {
  ValidationSource source;
  if (!options.validation_path.empty()) {
    source = open_validation_source(options, tokenizer);
  } else {
    if (options.path.empty())
      fail(ErrorKind::config, "validation data: expected a dataset path (validation.dataset_path, or "
                              "training.dataset_path for its held-out part), found none; set one");
    OpenedSource opened = open_source(options.path, "dataset", options.validation_fraction, options, tokenizer);
    source.stream = std::move(opened.folder.validation);
    source.description = "validation: the held-out part of " + opened.description + ", " +
                         std::to_string(source.stream.size()) + " tokens";
  }
  if (source.stream.size() <= static_cast<uint64_t>(options.seq_len))
    fail(ErrorKind::input, source.description + ": expected more than one sequence of " +
                               std::to_string(options.seq_len) + " tokens; use more text or a shorter sequence length");
  ValidationData data;
  data.tokens = static_cast<int64_t>(source.stream.size());
  data.description = std::move(source.description);
  data.loader = make_sequence_loader(std::move(source.stream), SequenceOrder::sequential, options.batch_size,
                                     options.seq_len, options.seed, options.rank, options.world_size);
  return data;
}

Dataset open_dataset(const DatasetOptions& options, const Tokenizer& tokenizer) {
  if (options.path.empty())
    fail(ErrorKind::config, "dataset: expected a path to text or token shards, found an empty path; set the dataset");
  // With a validation source of its own, the training text is all for training.
  const bool separate = !options.validation_path.empty();
  OpenedSource train = open_source(options.path, "dataset", separate ? 0.0 : options.validation_fraction, options, tokenizer);
  TokenStream validation = std::move(train.folder.validation);
  Dataset dataset;
  dataset.description = train.description + ": " + std::to_string(train.folder.train.size()) + " train tokens in " +
                        std::to_string(train.folder.train.shards()) + " shards";
  if (!separate) dataset.description += ", " + std::to_string(validation.size()) + " validation tokens";
  if (!train.folder.tokenizer.empty()) dataset.description += ", tokenizer " + train.folder.tokenizer;
  if (separate) {
    ValidationSource held_out = open_validation_source(options, tokenizer);
    validation = std::move(held_out.stream);
    dataset.description += "; " + held_out.description;
  }
  dataset.train = make_sequence_loader(std::move(train.folder.train), SequenceOrder::shuffled, options.batch_size,
                                       options.seq_len, options.seed, options.rank, options.world_size);
  if (validation.size() > static_cast<uint64_t>(options.seq_len))
    dataset.validation = make_sequence_loader(std::move(validation), SequenceOrder::sequential, options.batch_size,
                                              options.seq_len, options.seed, options.rank, options.world_size);
  else
    dataset.description += " (too few for validation)";
  return dataset;
}

}  // namespace smelt
