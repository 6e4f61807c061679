// A training corpus of real text for tests: the project's own documents and sources (text files
// only — .md, .h, .cpp — in name order, so every checkout trains on the same bytes).
#pragma once
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "support/temporary_folder.h"

namespace smelt::testing_support {

// The concatenated text of the files directly inside each of `subfolders` (relative to the source tree).
inline std::string source_corpus(std::initializer_list<const char*> subfolders) {
  namespace fs = std::filesystem;
  std::string text;
  for (const char* sub : subfolders) {
    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(fs::path(SMELT_SOURCE_DIR) / sub)) {
      const std::string extension = entry.path().extension().string();
      if (entry.is_regular_file() && (extension == ".md" || extension == ".h" || extension == ".cpp"))
        files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      std::ifstream in(path, std::ios::binary);
      std::stringstream s;
      s << in.rdbuf();
      text += s.str() + "\n";
    }
  }
  return text;
}

// Writes source_corpus(subfolders) to `folder`/corpus.txt (creating `folder`) and returns the text.
inline std::string write_source_corpus(const std::filesystem::path& folder, std::initializer_list<const char*> subfolders) {
  std::filesystem::create_directories(folder);
  const std::string text = source_corpus(subfolders);
  std::ofstream(folder / "corpus.txt", std::ios::binary) << text;
  return text;
}

// A TemporaryFolder whose `data/corpus.txt` holds source_corpus(subfolders); `path` is its root.
struct CorpusFolder {
  TemporaryFolder temporary;
  std::filesystem::path path{temporary.path()};
  explicit CorpusFolder(std::initializer_list<const char*> subfolders) {
    write_source_corpus(path / "data", subfolders);
  }
};

}  // namespace smelt::testing_support
