// The loader: seeded determinism, disjoint rank slices, exact resume, sequences across shard
// boundaries, and open_dataset on text folders (including the repository's docs/) and on shards.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>

#include "core/error.h"
#include "data/loader.h"
#include "data/prepare.h"
#include "data/token_shard.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace smelt {
namespace {

using testing_support::TemporaryFolder;

// Shards whose token at stream index i is i (vocabulary large enough for u32 storage).
TokenStream counting_stream(const TemporaryFolder& folder, const std::vector<size_t>& shard_sizes) {
  TokenStream stream;
  int32_t next = 0;
  for (size_t s = 0; s < shard_sizes.size(); ++s) {
    std::vector<int32_t> ids(shard_sizes[s]);
    for (auto& id : ids) id = next++;
    const std::string path = folder.path("train_" + std::to_string(s) + ".tok");
    write_shard(path, ids, 1 << 20);
    stream.add(std::make_shared<const TokenShard>(path));
  }
  return stream;
}

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

Batch next(DataLoader& loader, int64_t batch, int64_t seq_len) {
  Batch result{std::vector<int32_t>(batch * seq_len, -1), std::vector<int32_t>(batch * seq_len, -1)};
  loader.next_batch(result.inputs.data(), result.targets.data());
  return result;
}

TEST(Loader, SequencesCrossShardBoundariesAndTargetsAreShiftedInputs) {
  TemporaryFolder folder;
  const int64_t batch = 3, seq_len = 16;
  auto loader = make_sequence_loader(counting_stream(folder, {37, 5, 41, 29, 50}), SequenceOrder::shuffled, batch,
                                     seq_len, 11, 0, 1);
  EXPECT_EQ(loader->total_tokens(), 162);
  for (int step = 0; step < 20; ++step) {
    Batch b = next(*loader, batch, seq_len);
    for (int64_t row = 0; row < batch; ++row) {
      const int32_t start = b.inputs[row * seq_len];
      EXPECT_EQ(start % seq_len, 0) << "sequences start at multiples of T";
      for (int64_t t = 0; t < seq_len; ++t) {
        EXPECT_EQ(b.inputs[row * seq_len + t], start + t);
        EXPECT_EQ(b.targets[row * seq_len + t], start + t + 1);
      }
    }
  }
}

TEST(Loader, SameSeedSameBatchesOtherSeedOtherOrder) {
  TemporaryFolder folder;
  const int64_t batch = 4, seq_len = 8;
  const auto stream = counting_stream(folder, {1000, 700});
  auto first = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 42, 0, 1);
  auto second = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 42, 0, 1);
  auto other = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 43, 0, 1);
  int differing = 0;
  for (int step = 0; step < 100; ++step) {  // more than one epoch (212 sequences / 4)
    Batch a = next(*first, batch, seq_len);
    EXPECT_EQ(a, next(*second, batch, seq_len));
    differing += !(a == next(*other, batch, seq_len));
  }
  EXPECT_GT(differing, 90);
  EXPECT_GE(first->state().epoch, 1u);
}

TEST(Loader, RanksTakeDisjointSlicesCoveringTheEpoch) {
  TemporaryFolder folder;
  const int64_t batch = 2, seq_len = 10;
  const int world = 4;
  const auto stream = counting_stream(folder, {333, 401, 99});  // 83 sequences: 10 global batches per epoch
  std::vector<std::unique_ptr<DataLoader>> ranks;
  for (int rank = 0; rank < world; ++rank)
    ranks.push_back(make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 5, rank, world));
  std::set<int32_t> seen;
  for (int step = 0; step < 10; ++step)
    for (auto& loader : ranks) {
      Batch b = next(*loader, batch, seq_len);
      for (int64_t row = 0; row < batch; ++row)
        EXPECT_TRUE(seen.insert(b.inputs[row * seq_len]).second) << "sequence given twice in one epoch";
    }
  EXPECT_EQ(seen.size(), 80u);
  for (auto& loader : ranks) EXPECT_EQ(loader->state().epoch, 0u);
  next(*ranks[0], batch, seq_len);
  EXPECT_EQ(ranks[0]->state().epoch, 1u);
}

TEST(Loader, RestoredStateContinuesIdentically) {
  TemporaryFolder folder;
  const int64_t batch = 3, seq_len = 12;
  const auto stream = counting_stream(folder, {500, 123, 260});
  auto loader = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 9, 1, 2);
  for (int step = 0; step < 17; ++step) next(*loader, batch, seq_len);
  const LoaderState saved = loader->state();
  std::vector<Batch> expected;
  for (int step = 0; step < 30; ++step) expected.push_back(next(*loader, batch, seq_len));  // crosses an epoch
  EXPECT_GT(loader->state().epoch, saved.epoch);

  auto resumed = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 9, 1, 2);
  resumed->restore(saved);
  for (const auto& batch_expected : expected) EXPECT_EQ(next(*resumed, batch, seq_len), batch_expected);
  loader->restore(saved);
  EXPECT_EQ(next(*loader, batch, seq_len), expected[0]);

  auto other_seed = make_sequence_loader(stream, SequenceOrder::shuffled, batch, seq_len, 10, 1, 2);
  EXPECT_THROW(other_seed->restore(saved), Error);
}

TEST(Loader, TooLittleDataIsAnInputError) {
  TemporaryFolder folder;
  try {
    make_sequence_loader(counting_stream(folder, {40}), SequenceOrder::shuffled, 4, 16, 0, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::input);
    EXPECT_NE(std::string(error.what()).find("40 tokens"), std::string::npos) << error.what();
  }
}

std::string random_text(std::mt19937& random, size_t bytes) {
  const char* words[] = {"the", "union", "of", "states", "congress", "1789", "liberty", "and", "law", "people"};
  std::string text;
  while (text.size() < bytes) {
    text += words[random() % 10];
    text += random() % 9 == 0 ? "\n" : " ";
  }
  text.resize(bytes);
  return text;
}

TEST(OpenDataset, TextFolderIsTokenizedSplitAndCached) {
  TemporaryFolder folder;
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(7)));
  for (int d = 0; d < 20; ++d) folder.write("corpus/" + std::to_string(1000 + d) + ".txt", random_text(random, 3000));
  folder.write("corpus/notes.jsonl", "{\"text\": \"first\"}\n\n{\"text\": \"second one\"}\n");
  ByteTokenizer tokenizer;
  DatasetOptions options;
  options.path = folder.path("corpus");
  options.batch_size = 4;
  options.seq_len = 64;
  options.seed = 1;
  options.cache_dir = folder.path("cache");
  options.validation_fraction = 0.1;
  Dataset dataset = open_dataset(options, tokenizer);
  ASSERT_TRUE(dataset.train);
  ASSERT_TRUE(dataset.validation);
  const int64_t total = dataset.train->total_tokens() + dataset.validation->total_tokens();
  EXPECT_EQ(total, 20 * 3000 + 5 + 10 + 22) << "bytes plus one EOS per document";
  EXPECT_NEAR(static_cast<double>(dataset.validation->total_tokens()) / total, 0.1, 0.06);
  Batch b = next(*dataset.train, 4, 64);
  for (int32_t id : b.inputs) EXPECT_TRUE(id >= 0 && id <= ByteTokenizer::eos);
  EXPECT_NE(dataset.description.find("cached"), std::string::npos);

  // A second open reuses the cache (same files): same first batch.
  Dataset again = open_dataset(options, tokenizer);
  EXPECT_EQ(next(*again.train, 4, 64), b);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(folder.path("cache")), {}), 1);

  // Validation batches are sequential and repeatable from a reset state.
  Batch v1 = next(*dataset.validation, 4, 64);
  dataset.validation->restore(LoaderState{});
  EXPECT_EQ(next(*dataset.validation, 4, 64), v1);
}

TEST(OpenDataset, RepositoryDocsTrainWithTheByteTokenizer) {
  ByteTokenizer tokenizer;
  DatasetOptions options;
  options.path = std::string(SMELT_SOURCE_DIR) + "/docs";
  options.batch_size = 2;
  options.seq_len = 32;
  options.model_vocab_size = tokenizer.vocab_size();
  Dataset dataset = open_dataset(options, tokenizer);
  ASSERT_TRUE(dataset.train);
  EXPECT_GT(dataset.train->total_tokens(), 1000);
  Batch b = next(*dataset.train, 2, 32);
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>(b.inputs.begin() + 1, b.inputs.begin() + 32)),
            tokenizer.decode(std::vector<int32_t>(b.targets.begin(), b.targets.begin() + 31)));
}

TEST(OpenDataset, PreparedShardsOpenAndVocabularyIsChecked) {
  TemporaryFolder folder;
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(3)));
  folder.write("in/a.txt", random_text(random, 5000));
  folder.write("in/b.txt", random_text(random, 5000));
  folder.write("in/c.txt", random_text(random, 1000));
  PrepareOptions prepare;
  prepare.inputs = {folder.path("in")};
  prepare.output_dir = folder.path("shards");
  prepare.shard_tokens = 1500;
  const PrepareSummary summary = prepare_dataset(prepare);
  EXPECT_EQ(summary.train_documents, 2u);
  EXPECT_EQ(summary.validation_documents, 1u);
  EXPECT_EQ(summary.train_tokens, 10002u);
  EXPECT_EQ(summary.train_shards, 7);
  EXPECT_EQ(read_dataset_summary(prepare.output_dir).train_tokens, summary.train_tokens);
  ByteTokenizer tokenizer;
  DatasetOptions options;
  options.path = prepare.output_dir;
  options.batch_size = 2;
  options.seq_len = 100;
  options.model_vocab_size = 258;
  Dataset dataset = open_dataset(options, tokenizer);
  EXPECT_EQ(dataset.train->total_tokens(), 10002);
  ASSERT_TRUE(dataset.validation);
  EXPECT_EQ(dataset.validation->total_tokens(), 1001);
  options.model_vocab_size = 200;
  EXPECT_THROW(open_dataset(options, tokenizer), Error);
}

// Documents of `count` random letters drawn from [first, last].
std::string letters(std::mt19937& random, size_t count, char first, char last) {
  std::string text(count, first);
  for (char& c : text) c = static_cast<char>(first + random() % (last - first + 1));
  return text;
}

// validation.dataset_path: validation reads that source (its validation split when it is prepared
// shards that have one, else all of it), and the training text is then all for training.
TEST(OpenDataset, AValidationSourceOfItsOwn) {
  TemporaryFolder folder;
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(11)));
  int64_t train_bytes = 0, validation_bytes = 0;
  // Validation documents of similar sizes, at least four: a split of half their bytes holds the last.
  const int train_documents = 3 + int(random() % 5), validation_documents = 4 + int(random() % 3);
  for (int d = 0; d < train_documents; ++d) {
    const size_t n = 2000 + random() % 2000;
    folder.write("train/" + std::to_string(d) + ".txt", letters(random, n, 'a', 'm'));
    train_bytes += int64_t(n);
  }
  for (int d = 0; d < validation_documents; ++d) {
    const size_t n = 1000 + random() % 200;
    folder.write("held/" + std::to_string(d) + ".txt", letters(random, n, 'n', 'z'));
    validation_bytes += int64_t(n);
  }
  ByteTokenizer tokenizer;
  DatasetOptions options;
  options.path = folder.path("train");
  options.validation_path = folder.path("held");
  options.batch_size = 2;
  options.seq_len = 64;
  options.cache_dir = folder.path("cache");
  Dataset dataset = open_dataset(options, tokenizer);
  ASSERT_TRUE(dataset.train);
  ASSERT_TRUE(dataset.validation);
  EXPECT_EQ(dataset.train->total_tokens(), train_bytes + train_documents) << "every training document, one EOS each";
  EXPECT_EQ(dataset.validation->total_tokens(), validation_bytes + validation_documents);
  for (int i = 0; i < 4; ++i) {
    for (int32_t id : next(*dataset.train, 2, 64).inputs) EXPECT_TRUE((id >= 'a' && id <= 'm') || id == ByteTokenizer::eos) << id;
    for (int32_t id : next(*dataset.validation, 2, 64).inputs)
      EXPECT_TRUE((id >= 'n' && id <= 'z') || id == ByteTokenizer::eos) << id;
  }
  EXPECT_NE(dataset.description.find("validation: " + options.validation_path), std::string::npos) << dataset.description;

  // Prepared shards: their validation split, when they have one; else all their tokens.
  PrepareOptions prepare;
  prepare.inputs = {folder.path("held")};
  prepare.output_dir = folder.path("held_split");
  prepare.validation_fraction = 0.5;
  const PrepareSummary split = prepare_dataset(prepare);
  ASSERT_GT(split.validation_tokens, 0u);
  options.validation_path = prepare.output_dir;
  EXPECT_EQ(open_dataset(options, tokenizer).validation->total_tokens(), int64_t(split.validation_tokens));
  prepare.output_dir = folder.path("held_whole");
  prepare.validation_fraction = 0;
  const PrepareSummary whole = prepare_dataset(prepare);
  options.validation_path = prepare.output_dir;
  EXPECT_EQ(open_dataset(options, tokenizer).validation->total_tokens(), int64_t(whole.train_tokens));

  options.validation_path = folder.path("nowhere");
  try {
    open_dataset(options, tokenizer);
    ADD_FAILURE() << "opened a missing validation source";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("validation dataset " + options.validation_path), std::string::npos) << e.what();
  }
}

TEST(ByteTokenizer, RoundTripsRandomBytes) {
  ByteTokenizer tokenizer;
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(99)));
  std::string bytes(4096, '\0');
  for (auto& c : bytes) c = static_cast<char>(random());
  const auto ids = tokenizer.encode(bytes);
  ASSERT_EQ(ids.size(), bytes.size());
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tokenizer.decode(ids), bytes);
  EXPECT_EQ(tokenizer.vocab_size(), 258);
  EXPECT_THROW(tokenizer.decode({300}), Error);
}

}  // namespace
}  // namespace smelt
