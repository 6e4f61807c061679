// BPE: the pre-tokenizer's pieces, round trips on random valid UTF-8, invalid UTF-8 offsets,
// tiktoken file errors, and deterministic training.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "core/error.h"
#include "data/bpe_trainer.h"
#include "data/pretokenize.h"
#include "data/tiktoken_file.h"
#include "data/tokenizer.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"

namespace smelt {
namespace {

using testing_support::TemporaryFolder;

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> result;
  for_each_pretoken(text, [&](std::string_view piece) { result.emplace_back(piece); });
  return result;
}

TEST(Pretokenize, FollowsTheLlama3Pattern) {
  using P = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world!"), (P{"Hello", " world", "!"}));
  EXPECT_EQ(pieces("I'm they'LL 'sx"), (P{"I", "'m", " they", "'LL", " '", "sx"}));
  EXPECT_EQ(pieces("1234567 x12"), (P{"123", "456", "7", " x", "12"}));
  EXPECT_EQ(pieces("a  \n\n  b"), (P{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(pieces("x   y  "), (P{"x", "  ", " y", "  "}));
  EXPECT_EQ(pieces("end.\n\nNext"), (P{"end", ".\n\n", "Next"}));
  EXPECT_EQ(pieces(" ...\"quote\""), (P{" ...\"", "quote", "\""}));
  EXPECT_EQ(pieces("\"¿Qué? café"), (P{"\"¿", "Qué", "?", " café"}));
  EXPECT_EQ(pieces("\tword\r\nnext"), (P{"\tword", "\r\n", "next"}));
  EXPECT_EQ(pieces("日本語 ٣٤٥٦"), (P{"日本語", " ", "٣٤٥", "٦"}));
  EXPECT_EQ(pieces("😀😀 x"), (P{"😀😀", " x"}));
}

std::string random_utf8(std::mt19937& random, size_t code_points) {
  std::string text;
  for (size_t i = 0; i < code_points; ++i) {
    uint32_t cp;
    switch (random() % 6) {
      case 0: cp = 0x20 + random() % 0x5F; break;                 // printable ASCII
      case 1: cp = " \t\n\r'"[random() % 5]; break;               // white space and apostrophes
      case 2: cp = 0x80 + random() % (0x800 - 0x80); break;       // two bytes
      case 3: cp = 0x800 + random() % (0x10000 - 0x800); break;   // three bytes (minus surrogates below)
      case 4: cp = 0x10000 + random() % (0x110000 - 0x10000); break;  // four bytes
      default: cp = "aeiou"[random() % 5]; break;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    if (cp < 0x80) {
      text.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      text.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      text.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      text.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      text.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      text.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      text.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      text.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }
  return text;
}

std::string english_like(std::mt19937& random, size_t bytes) {
  const char* words[] = {"the", "nation", "people", "congress", "government", "we", "shall", "peace", "war",
                         "1865", "economy", "freedom", "it's", "they're", "America", "world", "(and)", "--"};
  std::string text;
  while (text.size() < bytes) {
    text += words[random() % 18];
    text += random() % 11 == 0 ? ".\n\n" : (random() % 7 == 0 ? ", " : " ");
  }
  return text;
}

// A small tokenizer trained on generated English-like text, shared by the tests below.
class TrainedTokenizer : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    folder_ = new TemporaryFolder;
    std::mt19937 random(1234);
    for (int f = 0; f < 6; ++f) folder_->write("text/" + std::to_string(f) + ".txt", english_like(random, 40000));
    folder_->write("text/utf8.txt", random_utf8(random, 3000));
    TrainTokenizerOptions options;
    options.inputs = {folder_->path("text")};
    options.output = folder_->path("trained.model");
    options.vocab_size = 1024;
    options.threads = 2;
    summary_ = train_tokenizer(options);
  }
  static void TearDownTestSuite() { delete folder_; }
  static TemporaryFolder* folder_;
  static TrainTokenizerSummary summary_;
};
TemporaryFolder* TrainedTokenizer::folder_ = nullptr;
TrainTokenizerSummary TrainedTokenizer::summary_;

TEST_F(TrainedTokenizer, HasTheRequestedVocabularyAndCompresses) {
  EXPECT_EQ(summary_.vocab_size, 1024);
  auto tokenizer = load_tokenizer(folder_->path("trained.model"));
  EXPECT_EQ(tokenizer->vocab_size(), 1024);
  EXPECT_EQ(tokenizer->bos_id(), 768);
  EXPECT_EQ(tokenizer->eos_id(), 769);
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(5)));
  const std::string text = english_like(random, 20000);
  const auto ids = tokenizer->encode(text);
  EXPECT_LT(ids.size(), text.size() / 3) << "a trained vocabulary should merge common words";
  EXPECT_EQ(tokenizer->decode(ids), text);
  EXPECT_EQ(tokenizer->decode({tokenizer->eos_id()}), "<|end_of_text|>");
}

TEST_F(TrainedTokenizer, RoundTripsRandomValidUtf8) {
  auto tokenizer = load_tokenizer(folder_->path("trained.model"));
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(77)));
  for (int trial = 0; trial < 200; ++trial) {
    const std::string text = random_utf8(random, 1 + random() % 300);
    const auto ids = tokenizer->encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < 768) << "special ids never come from text";
    ASSERT_EQ(tokenizer->decode(ids), text) << "trial " << trial;
  }
  const std::string long_run = std::string(5000, ' ') + "x" + std::string(3000, '-') + std::string(2000, '7');
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(long_run)), long_run);
}

TEST_F(TrainedTokenizer, InvalidUtf8IsAnErrorWithTheByteOffset) {
  auto tokenizer = load_tokenizer(folder_->path("trained.model"));
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"abc\xC3(def", 3},         // lead byte without continuation
      {"ok \xC0\x80", 3},         // overlong NUL
      {"é\xED\xA0\x80", 2},       // surrogate
      {"hello\xF4\x90\x80\x80", 5},  // above U+10FFFF
      {"tail\xE2\x82", 4},        // truncated at the end
      {"\x80start", 0},           // stray continuation byte
  };
  for (const auto& [text, offset] : cases) {
    try {
      tokenizer->encode(text);
      ADD_FAILURE() << "expected an error for offset " << offset;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::input);
      EXPECT_NE(std::string(error.what()).find("byte offset " + std::to_string(offset) + " "), std::string::npos)
          << error.what();
    }
  }
}

TEST_F(TrainedTokenizer, TrainingIsDeterministicAcrossThreadCounts) {
  TrainTokenizerOptions options;
  options.inputs = {folder_->path("text")};
  options.output = folder_->path("again.model");
  options.vocab_size = 1024;
  options.threads = 1;
  train_tokenizer(options);
  EXPECT_EQ(read_tiktoken_file(folder_->path("again.model")), read_tiktoken_file(folder_->path("trained.model")));
  options.output = folder_->path("smaller.model");
  options.vocab_size = 900;
  train_tokenizer(options);
  const auto smaller = read_tiktoken_file(folder_->path("smaller.model"));
  const auto larger = read_tiktoken_file(folder_->path("trained.model"));
  ASSERT_EQ(smaller.size(), 900u - 256u);
  EXPECT_TRUE(std::equal(smaller.begin(), smaller.end(), larger.begin())) << "a smaller vocabulary is a prefix";
}

TEST(TiktokenFile, MalformedFilesAreInputErrorsNamingFileAndLine) {
  TemporaryFolder folder;
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  bytes.push_back("ab");
  write_tiktoken_file(folder.path("good.model"), bytes);
  EXPECT_EQ(read_tiktoken_file(folder.path("good.model")), bytes);
  auto expect_error = [&](const std::string& name, const std::string& content, const std::string& needle) {
    const std::string path = folder.write(name, content);
    try {
      load_tokenizer(path);
      ADD_FAILURE() << "expected an error for " << name;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::input);
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find(needle), std::string::npos) << error.what();
    }
  };
  expect_error("garbage.model", "IQ== 0\nnot base64!! 1\n", ":2:");
  expect_error("norank.model", "IQ==\n", ":1:");
  expect_error("duplicate.model", "IQ== 0\nIg== 0\n", "twice");
  expect_error("gap.model", "IQ== 0\nIg== 2\n", "missing");
  expect_error("huge_rank.model", "IQ== 999999999\n", "missing");  // no table sized from a rank
  expect_error("bytes.model", "IQ== 0\nIg== 1\n", "single byte");
  EXPECT_THROW(load_tokenizer(folder.path("absent.model")), Error);
}

}  // namespace
}  // namespace smelt
