// Encoding throughput of a tokenizer on one core: `tokenizer_throughput TOKENIZER TEXT_FILES_OR_FOLDERS...`
// prints MB/s and tokens per byte (a measurement, not a test).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/text_source.h"
#include "data/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER (byte or tokenizer.model) TEXT_FILES_OR_FOLDERS...\n", argv[0]);
    return 2;
  }
  try {
    auto tokenizer = smelt::load_tokenizer(argv[1]);
    std::vector<std::string> texts;
    size_t bytes = 0;
    for (const auto& file : smelt::list_text_files(std::vector<std::string>(argv + 2, argv + argc))) {
      smelt::read_documents(file, "text", [&](std::string_view document, uint64_t) {
        texts.emplace_back(document);
        bytes += document.size();
      });
    }
    for (int round = 0; round < 2; ++round) {  // the first round warms caches
      size_t tokens = 0;
      const auto start = std::chrono::steady_clock::now();
      for (const auto& text : texts) tokens += tokenizer->encode(text).size();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("%s: %.1f MB in %.2f s on one core: %.1f MB/s, %.3f tokens per byte%s\n", tokenizer->name().c_str(),
                  bytes / 1e6, seconds, bytes / 1e6 / seconds, static_cast<double>(tokens) / bytes,
                  round == 0 ? " (warm-up)" : "");
    }
  } catch (const smelt::Error& error) {
    std::fprintf(stderr, "error: %s\n", error.what());
    return error.exit_code();
  }
}
