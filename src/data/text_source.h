// Finding and reading the documents of text inputs: plain text and Markdown files (one document
// each) and JSON Lines files (one document per line, text in a named field), alone or in folders.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace smelt {

enum class TextFormat { plain, json_lines };

struct TextFile {
  std::string path;
  TextFormat format = TextFormat::plain;
  uint64_t bytes = 0;
};

// Expands files and folders (recursively; .txt, .md, .text, .jsonl) into a list sorted by path within
// each input, in the order given. A missing path or a folder without text files is an input error.
std::vector<TextFile> list_text_files(const std::vector<std::string>& inputs);

// The whole file as bytes.
std::string read_file_bytes(const std::string& path);

// Calls visit(document, byte offset of the document in the file) for each document of the file.
// JSON Lines: each non-empty line is an object whose `field` is a string; anything else is an
// input error naming the file and line.
void read_documents(const TextFile& file, const std::string& field,
                    const std::function<void(std::string_view document, uint64_t offset)>& visit);

}  // namespace smelt
