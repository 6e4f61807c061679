// Compatibility with Llama-3: smelt's BPE, loaded with the Llama-3 vocabulary, must give the same ids
// as an independent implementation (npm package llama3-tokenizer-js) on a few hundred varied strings.
// Skipped when npm is not installed; a failing npm install is a test failure.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "data/tokenizer.h"
#include "support/fresh_random.h"

namespace smelt {
namespace {

namespace fs = std::filesystem;

const char* package = "llama3-tokenizer-js@1.2.0";

std::string quoted(const std::string& text) { return "'" + text + "'"; }

std::vector<std::string> fixed_strings() {
  return {
      "Hello world!",
      "The quick brown fox jumps over the lazy dog.",
      "I'm sure you'll see they've done what we'd said; it's THEIR'S, 'twas.",
      "don't DON'T Don'T can't won't",
      "   leading spaces and trailing   ",
      "tabs\tand\t\ttabs",
      "line one\nline two\n\nline four\r\nwindows\r\n",
      "\n\n\n   \n  \t \n",
      "x  \n  y",
      "3.14159265358979 is pi; 1234567890 is a number; 1,000,000 and 12:30pm.",
      "2024-01-15T10:30:00Z",
      "int main(int argc, char** argv) {\n    return argc > 1 ? 0 : -1;\n}\n",
      "for (size_t i = 0; i < n; ++i) { sum += x[i] * y[i]; }",
      "def f(x):\n\treturn [y**2 for y in range(x) if y % 3 == 0]\n",
      "<div class=\"main\">&nbsp;&lt;tag&gt;</div>",
      "https://example.com/path?query=value&other=1#fragment",
      "email: someone@example.org, phone: +1 (555) 123-4567",
      "Café naïve résumé façade jalapeño Ångström Øresund straße",
      "Ελληνικά Русский язык Українська Български",
      "日本語のテキストと漢字、そして句読点。",
      "中文文本，包括标点符号！你好世界。",
      "한국어 텍스트입니다. 안녕하세요!",
      "العربية نص عربي مع أرقام ١٢٣٤",
      "עברית טקסט",
      "हिन्दी पाठ और संख्या १२३",
      "ภาษาไทยไม่มีช่องว่าง",
      "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨",
      "Mixed: naïve😀café123!!!???...",
      "Math: ∑_{i=1}^{n} x_i² ≤ ∞ ± √2 × π ≈ 3.14",
      "Fullwidth: ＡＢＣ１２３！",
      "Superscripts ¹²³ and fractions ½ ¾ and roman Ⅻ",
      "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
      "'hello' \"quoted\" «guillemets» „German“ ‘single’",
      "a'b'c'd'e ''s '''",
      "!!!???... --- ___ *** ### $$$ %%% ^^^ &&& ((()))",
      " !\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
      "                                                                                ",
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
      "0000000000000000000000000000000000000000",
      "----------------------------------------------------------------------------------------------------",
      "=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-=-",
      "😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀😀 long emoji run",
      "Pneumonoultramicroscopicsilicovolcanoconiosisandmoreletterswithoutanyspacesatalljusttobelong",
      "                                                                                          \n\n\n  x",
      "supercalifragilisticexpialidocious antidisestablishmentarianism",
      "camelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case",
      "Mr. Speaker, Mr. President, Members of Congress, my fellow Americans:",
      "\u00a0non\u00a0breaking\u2003em\u2003space\u3000ideographic",
      "zero\u200bwidth\u200cjoiner\u200d",
      "e\u0301 combining acute, n\u0303 tilde",
      "ǅungla ǈubljana titlecase",
      "",
      "a",
      " ",
      "\n",
  };
}

// Strings assembled at random from fragments of many kinds: the joints exercise the pattern's edges.
std::vector<std::string> random_strings(int count) {
  const std::vector<std::string> fragments = {
      "the", " The", "  union", "'s", "'LL", "'ve", " 42", "1234567", "3.5", " ", "  ", "\t", "\n", "\r\n", "\n\n ",
      "!", "?!", " ...", "—", "–", "(", ")", "{", "}", "\"", "'", "`", "@", "#", "$", "€", "£", "¥", "é", "ü", "ß",
      "ñ", "Ω", "ж", "語", "中文", "한", "😀", "🇺🇸", "👍🏽", "∑", "√", "½", "²", "٣", "१", "x", "Z", "_", "-", "=",
      "::", "->", "<=", "http", "://", ".com", "e\u0301", "\u00a0", "\u3000", "ǅ", "Ⅻ"};
  std::mt19937 random(static_cast<uint32_t>(testing_support::fresh(20240601)));
  std::vector<std::string> strings;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int pieces = 1 + static_cast<int>(random() % 24);
    for (int p = 0; p < pieces; ++p) text += fragments[random() % fragments.size()];
    strings.push_back(text);
  }
  return strings;
}

TEST(TokenizerCompatibility, MatchesLlama3TokenizerJs) {
  if (std::system("npm --version > /dev/null 2>&1") != 0 || std::system("node --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "npm and node are not installed: install Node.js to run the Llama-3 compatibility test";
  const fs::path folder = fs::path(SMELT_BINARY_DIR) / "npm-llama3";
  const fs::path script = fs::path(SMELT_SOURCE_DIR) / "tests" / "data" / "llama3_reference.mjs";
  fs::create_directories(folder);
  if (!fs::exists(folder / "node_modules" / "llama3-tokenizer-js" / "package.json")) {
    const std::string install = "npm install --prefix " + quoted(folder.string()) +
                                " --no-save --no-audit --no-fund --loglevel=error " + package + " > " +
                                quoted((folder / "npm.log").string()) + " 2>&1";
    ASSERT_EQ(std::system(install.c_str()), 0)
        << "`" << install << "` failed (see " << (folder / "npm.log").string()
        << "); the test needs the npm registry to fetch " << package;
  }
  const fs::path vocabulary = folder / "llama3.model";
  if (!fs::exists(vocabulary)) {
    const std::string extract = "node " + quoted(script.string()) + " " + quoted(folder.string()) + " vocab " +
                                quoted(vocabulary.string() + ".tmp");
    ASSERT_EQ(std::system(extract.c_str()), 0) << "`" << extract << "` failed";
    fs::rename(vocabulary.string() + ".tmp", vocabulary);
  }
  auto tokenizer = load_tokenizer(vocabulary.string());
  EXPECT_EQ(tokenizer->vocab_size(), 128256);
  EXPECT_EQ(tokenizer->bos_id(), 128000);
  EXPECT_EQ(tokenizer->eos_id(), 128001);

  std::vector<std::string> strings = fixed_strings();
  for (auto& text : random_strings(400)) strings.push_back(std::move(text));
  const fs::path input = folder / "strings.json", output = folder / "ids.json";
  std::ofstream(input) << nlohmann::json(strings).dump();
  const std::string encode = "node " + quoted(script.string()) + " " + quoted(folder.string()) + " encode " +
                             quoted(input.string()) + " > " + quoted(output.string());
  ASSERT_EQ(std::system(encode.c_str()), 0) << "`" << encode << "` failed";
  std::ifstream in(output);
  const nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected.size(), strings.size());
  int mismatches = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::vector<int32_t> ids = tokenizer->encode(strings[i]);
    const auto reference = expected[i].get<std::vector<int32_t>>();
    if (ids != reference && ++mismatches <= 10)
      ADD_FAILURE() << "string " << i << " \"" << strings[i] << "\": smelt " << nlohmann::json(ids).dump()
                    << ", llama3-tokenizer-js " << nlohmann::json(reference).dump();
    EXPECT_EQ(tokenizer->decode(ids), strings[i]);
  }
  EXPECT_EQ(mismatches, 0) << "of " << strings.size() << " strings";
  // Special tokens decode to their names; plain text that spells one is encoded as text.
  EXPECT_EQ(tokenizer->decode({128000, 128009}), "<|begin_of_text|><|eot_id|>");
  EXPECT_GT(tokenizer->encode("<|end_of_text|>").size(), 1u);
}

}  // namespace
}  // namespace smelt
