// Text to token shards: document splitting into train/validation, parallel encoding, shard writing.
#include "data/prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "data/text_source.h"
#include "data/token_shard.h"
#include "data/unicode_class.h"

namespace smelt {
namespace {

constexpr size_t piece_bytes = size_t{1} << 20;   // documents are cut into pieces of about this size
constexpr size_t batch_bytes = size_t{8} << 20;   // text encoded between two progress reports

bool is_ascii_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

// A cut at p is safe when text[p-1] is '\n' and text[p] a letter or digit: no pre-token spans it.
size_t safe_cut_before(std::string_view text, size_t limit) {
  for (size_t p = std::min(limit, text.size() - 1); p > 0; --p)
    if (text[p - 1] == '\n' && is_ascii_alnum(text[p])) return p;
  return 0;
}

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

// Accumulates a split's tokens and writes a shard whenever shard_tokens are buffered.
class ShardWriter {
 public:
  ShardWriter(std::string folder, std::string split, uint64_t shard_tokens, int64_t vocab_size)
      : folder_(std::move(folder)), split_(std::move(split)), shard_tokens_(shard_tokens), vocab_size_(vocab_size) {}

  void append(const std::vector<int32_t>& ids, int32_t eos) {
    buffer_.insert(buffer_.end(), ids.begin(), ids.end());
    buffer_.push_back(eos);
    tokens_ += ids.size() + 1;
    ++documents_;
    while (buffer_.size() >= shard_tokens_) {
      std::vector<int32_t> shard(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(shard_tokens_));
      buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(shard_tokens_));
      write(shard);
    }
  }
  void finish() {
    if (!buffer_.empty()) write(buffer_);
    buffer_.clear();
  }
  uint64_t tokens() const { return tokens_; }
  uint64_t documents() const { return documents_; }
  int shards() const { return shards_; }

 private:
  void write(const std::vector<int32_t>& ids) {
    char name[64];
    std::snprintf(name, sizeof name, "%s_%05d.tok", split_.c_str(), shards_);
    write_shard((std::filesystem::path(folder_) / name).string(), ids, vocab_size_);
    ++shards_;
  }
  std::string folder_, split_;
  uint64_t shard_tokens_;
  int64_t vocab_size_;
  std::vector<int32_t> buffer_;
  uint64_t tokens_ = 0, documents_ = 0;
  int shards_ = 0;
};

struct PendingDocument {
  std::string text;
  bool validation = false;
};

void write_summary(const std::string& folder, const PrepareSummary& summary) {
  nlohmann::json json = {
      {"format", "smelt token shards"},         {"tokenizer", summary.tokenizer},
      {"vocab_size", summary.vocab_size},       {"train_documents", summary.train_documents},
      {"validation_documents", summary.validation_documents}, {"train_tokens", summary.train_tokens},
      {"validation_tokens", summary.validation_tokens},       {"train_shards", summary.train_shards},
      {"validation_shards", summary.validation_shards},       {"input_bytes", summary.input_bytes},
  };
  const std::string path = (std::filesystem::path(folder) / "dataset.json").string();
  {
    std::ofstream out(path + ".tmp");
    out << json.dump(2) << "\n";
    if (!out) fail(ErrorKind::input, "cannot write " + path + ".tmp; check free disk space");
  }
  std::filesystem::rename(path + ".tmp", path);
}

}  // namespace

std::vector<std::vector<int32_t>> encode_parallel(const Tokenizer& tokenizer,
                                                  const std::vector<std::string_view>& documents, int threads) {
  struct Piece {
    size_t document;
    std::string_view text;
  };
  std::vector<Piece> pieces;
  for (size_t d = 0; d < documents.size(); ++d) {
    std::string_view rest = documents[d];
    while (rest.size() > 2 * piece_bytes) {
      size_t cut = safe_cut_before(rest, piece_bytes);
      if (cut == 0) break;
      pieces.push_back({d, rest.substr(0, cut)});
      rest.remove_prefix(cut);
    }
    pieces.push_back({d, rest});
  }
  std::vector<std::vector<int32_t>> piece_ids(pieces.size());
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::atomic<bool> failed{false};
  auto work = [&] {
    try {
      for (size_t i = next++; i < pieces.size() && !failed; i = next++) piece_ids[i] = tokenizer.encode(pieces[i].text);
    } catch (...) {
      if (!failed.exchange(true)) error = std::current_exception();
    }
  };
  const int count = std::min<int>(resolve_threads(threads), static_cast<int>(std::max<size_t>(pieces.size(), 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (auto& thread : pool) thread.join();
  if (error) std::rethrow_exception(error);
  std::vector<std::vector<int32_t>> result(documents.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto& out = result[pieces[i].document];
    if (out.empty()) out = std::move(piece_ids[i]);
    else out.insert(out.end(), piece_ids[i].begin(), piece_ids[i].end());
  }
  return result;
}

PrepareSummary prepare_dataset(const PrepareOptions& options, const PrepareCallback& progress) {
  auto tokenizer = load_tokenizer(options.tokenizer);
  return prepare_dataset(options, *tokenizer, progress);
}

PrepareSummary prepare_dataset(const PrepareOptions& options, const Tokenizer& tokenizer,
                               const PrepareCallback& progress) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  if (options.validation_fraction < 0 || options.validation_fraction >= 1)
    fail(ErrorKind::config, "prepare: expected a validation fraction in [0, 1), found " +
                                std::to_string(options.validation_fraction));
  if (options.shard_tokens == 0) fail(ErrorKind::config, "prepare: expected shard_tokens > 0, found 0");
  const std::vector<TextFile> files = list_text_files(options.inputs);
  uint64_t total_bytes = 0;
  for (const auto& file : files) total_bytes += file.bytes;

  fs::create_directories(options.output_dir);
  fs::remove(fs::path(options.output_dir) / "dataset.json");
  for (const auto& entry : fs::directory_iterator(options.output_dir))
    if (entry.path().extension() == ".tok" || entry.path().extension() == ".tmp") fs::remove(entry.path());

  const int64_t vocab = tokenizer.vocab_size();
  ShardWriter train(options.output_dir, "train", options.shard_tokens, vocab);
  ShardWriter validation(options.output_dir, "validation", options.shard_tokens, vocab);
  const auto cutoff = static_cast<uint64_t>(static_cast<double>(total_bytes) * (1.0 - options.validation_fraction));
  const bool want_validation = options.validation_fraction > 0;

  PrepareProgress state;
  state.bytes_total = total_bytes;
  std::vector<PendingDocument> batch;
  size_t batch_size = 0;
  auto flush = [&] {
    std::vector<std::string_view> texts;
    for (const auto& document : batch) texts.push_back(document.text);
    auto ids = encode_parallel(tokenizer, texts, options.threads);
    for (size_t i = 0; i < batch.size(); ++i) {
      (batch[i].validation ? validation : train).append(ids[i], tokenizer.eos_id());
      state.bytes_done += batch[i].text.size();
      state.tokens += ids[i].size() + 1;
      ++state.documents;
    }
    batch.clear();
    batch_size = 0;
    if (progress) progress(state);
  };
  auto add = [&](std::string text, bool is_validation) {
    batch_size += text.size();
    batch.push_back({std::move(text), is_validation});
    if (batch_size >= batch_bytes) flush();
  };

  // The last document is held back: it goes to validation when nothing else did and it is small enough.
  PendingDocument pending;
  bool has_pending = false;
  uint64_t validation_documents = 0, file_offset = 0;
  const bool check_utf8 = tokenizer.name() != "byte";
  const bool single_document = files.size() == 1 && files[0].format == TextFormat::plain;
  for (const auto& file : files) {
    read_documents(file, options.text_field, [&](std::string_view document, uint64_t offset) {
      const uint64_t begin = file_offset + offset;
      const size_t invalid = check_utf8 ? find_invalid_utf8(document) : document.size();
      if (invalid != document.size())
        fail(ErrorKind::input, file.path + ": expected UTF-8 text, found an invalid byte sequence at byte " +
                                   std::to_string(offset + invalid) +
                                   (file.format == TextFormat::json_lines ? " (of the line's text)" : "") +
                                   "; convert the file to UTF-8 (or use the byte tokenizer)");
      if (single_document && want_validation) {
        const size_t cut = document.size() > 1 ? safe_cut_before(document, cutoff) : 0;
        if (cut > 0) {
          add(std::string(document.substr(0, cut)), false);
          add(std::string(document.substr(cut)), true);
          validation_documents = 1;
        } else {
          add(std::string(document), false);
        }
        return;
      }
      if (has_pending) {
        if (pending.validation) ++validation_documents;
        add(std::move(pending.text), pending.validation);
      }
      pending = {std::string(document), want_validation && begin >= cutoff};
      has_pending = true;
    });
    file_offset += file.bytes;
  }
  if (has_pending) {
    if (want_validation && validation_documents == 0 && state.documents + batch.size() > 0 &&
        pending.text.size() * 2 < total_bytes)
      pending.validation = true;
    add(std::move(pending.text), pending.validation);
  }
  flush();
  train.finish();
  validation.finish();

  PrepareSummary summary;
  summary.train_documents = train.documents();
  summary.validation_documents = validation.documents();
  summary.train_tokens = train.tokens();
  summary.validation_tokens = validation.tokens();
  summary.train_shards = train.shards();
  summary.validation_shards = validation.shards();
  summary.input_bytes = total_bytes;
  summary.tokenizer = tokenizer.name();
  summary.vocab_size = vocab;
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  write_summary(options.output_dir, summary);
  return summary;
}

PrepareSummary read_dataset_summary(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / "dataset.json").string();
  std::ifstream in(path);
  if (!in)
    fail(ErrorKind::input, "prepared dataset " + folder + ": expected dataset.json, found none (an interrupted "
                                                          "`smelt prepare`?); run `smelt prepare` again");
  nlohmann::json json = nlohmann::json::parse(in, nullptr, false);
  if (json.is_discarded() || !json.is_object() || !json.contains("tokenizer"))
    fail(ErrorKind::input, path + ": expected the JSON summary `smelt prepare` writes, found something else; "
                                  "run `smelt prepare` again");
  PrepareSummary summary;
  summary.tokenizer = json.value("tokenizer", "");
  summary.vocab_size = json.value("vocab_size", int64_t{0});
  summary.train_documents = json.value("train_documents", uint64_t{0});
  summary.validation_documents = json.value("validation_documents", uint64_t{0});
  summary.train_tokens = json.value("train_tokens", uint64_t{0});
  summary.validation_tokens = json.value("validation_tokens", uint64_t{0});
  summary.train_shards = json.value("train_shards", 0);
  summary.validation_shards = json.value("validation_shards", 0);
  summary.input_bytes = json.value("input_bytes", uint64_t{0});
  return summary;
}

std::string describe(const PrepareSummary& summary) {
  return std::to_string(summary.train_documents + summary.validation_documents) + " documents (" +
         std::to_string(summary.train_documents) + " train, " + std::to_string(summary.validation_documents) +
         " validation), " + std::to_string(summary.train_tokens) + " train tokens in " +
         std::to_string(summary.train_shards) + " shards, " + std::to_string(summary.validation_tokens) +
         " validation tokens, tokenizer " + summary.tokenizer;
}

}  // namespace smelt
