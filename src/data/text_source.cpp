// Listing text inputs and splitting them into documents.
#include "data/text_source.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace smelt {
namespace {

bool text_extension(const std::filesystem::path& path, TextFormat* format) {
  const std::string extension = path.extension().string();
  if (extension == ".txt" || extension == ".md" || extension == ".text") {
    *format = TextFormat::plain;
    return true;
  }
  if (extension == ".jsonl") {
    *format = TextFormat::json_lines;
    return true;
  }
  return false;
}

}  // namespace

std::vector<TextFile> list_text_files(const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::vector<TextFile> files;
  for (const std::string& input : inputs) {
    std::error_code error;
    if (fs::is_regular_file(input, error)) {
      TextFile file{input, TextFormat::plain, fs::file_size(input)};
      TextFormat format;
      if (text_extension(input, &format)) file.format = format;
      files.push_back(file);
      continue;
    }
    if (!fs::is_directory(input, error))
      fail(ErrorKind::input, "text input " + input + ": expected a file or a folder, found nothing at that path; "
                                                     "check the path");
    std::vector<TextFile> found;
    for (const auto& entry : fs::recursive_directory_iterator(input, fs::directory_options::follow_directory_symlink)) {
      TextFormat format;
      if (!entry.is_regular_file() || !text_extension(entry.path(), &format)) continue;
      found.push_back({entry.path().string(), format, static_cast<uint64_t>(entry.file_size())});
    }
    if (found.empty())
      fail(ErrorKind::input, "text input " + input + ": expected .txt, .md or .jsonl files in the folder, found none; "
                                                     "point at a folder of text files");
    std::sort(found.begin(), found.end(), [](const TextFile& a, const TextFile& b) { return a.path < b.path; });
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

std::string read_file_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) fail(ErrorKind::input, "cannot open " + path + " for reading; check the path and its permissions");
  std::string bytes;
  stream.seekg(0, std::ios::end);
  bytes.resize(static_cast<size_t>(stream.tellg()));
  stream.seekg(0);
  stream.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!stream) fail(ErrorKind::input, "reading " + path + " failed part way; check the file");
  return bytes;
}

void read_documents(const TextFile& file, const std::string& field,
                    const std::function<void(std::string_view document, uint64_t offset)>& visit) {
  const std::string bytes = read_file_bytes(file.path);
  if (file.format == TextFormat::plain) {
    if (!bytes.empty()) visit(bytes, 0);
    return;
  }
  size_t line_start = 0;
  int64_t line_number = 0;
  while (line_start < bytes.size()) {
    size_t line_end = bytes.find('\n', line_start);
    if (line_end == std::string::npos) line_end = bytes.size();
    ++line_number;
    std::string_view line(bytes.data() + line_start, line_end - line_start);
    if (line.find_first_not_of(" \t\r") != std::string_view::npos) {
      const std::string where = file.path + ":" + std::to_string(line_number) + ": ";
      nlohmann::json object = nlohmann::json::parse(line, nullptr, false);
      if (object.is_discarded() || !object.is_object())
        fail(ErrorKind::input, where + "expected a JSON object on each line, found invalid JSON; fix or remove the line");
      auto text = object.find(field);
      if (text == object.end() || !text->is_string())
        fail(ErrorKind::input, where + "expected a string field \"" + field + "\", found " +
                                   (text == object.end() ? std::string("no such field") : std::string(text->type_name())) +
                                   "; choose the field with --text-field");
      const std::string& document = text->get_ref<const std::string&>();
      if (!document.empty()) visit(document, line_start);
    }
    line_start = line_end + 1;
  }
}

}  // namespace smelt
