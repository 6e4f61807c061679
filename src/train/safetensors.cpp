// Reading and writing safetensors files.
#include "train/safetensors.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/metrics.h"

namespace smelt {

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f64: return "F64";
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::e4m3: return "F8_E4M3";
    case DType::e5m2: return "F8_E5M2";
    case DType::i32: return "I32";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType& out) {
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::e4m3, DType::e5m2, DType::i32})
    if (name == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail(ErrorKind::input, "safetensors file '" + path + "': " + what);
}

}  // namespace

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  size_t offset = 0;
  for (const auto& t : tensors) {
    size_t bytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  while (json.size() % 8) json += ' ';  // data starts 8-byte aligned
  std::string file(8, '\0');
  const uint64_t length = json.size();
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((length >> (8 * i)) & 0xff);
  file += json;
  file.reserve(file.size() + offset);
  for (const auto& t : tensors) {
    size_t bytes = dtype_size(t.dtype);
    for (int64_t d : t.shape) bytes *= static_cast<size_t>(d);
    file.append(static_cast<const char*>(t.data), bytes);
  }
  write_file_atomically(path, file);
}

const SafetensorsFile::Entry& SafetensorsFile::entry(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) bad(path, "has no tensor named '" + name + "'");
  return it->second;
}

const uint8_t* SafetensorsFile::bytes_of(const std::string& name) const { return data.data() + entry(name).offset; }

SafetensorsFile load_safetensors(const std::string& path) {
  SafetensorsFile file;
  file.path = path;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) bad(path, "cannot be opened; check the path");
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size < 8) bad(path, "is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  in.seekg(0);
  uint8_t prefix[8];
  in.read(reinterpret_cast<char*>(prefix), 8);
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= static_cast<uint64_t>(prefix[i]) << (8 * i);
  if (header_length > kMaxHeaderBytes || header_length > size - 8)
    bad(path, "header length " + std::to_string(header_length) + " exceeds the file (" + std::to_string(size) +
                  " bytes) or the 100 MiB limit; the file is truncated or not safetensors");
  std::string header(header_length, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_length));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "header is not a JSON object");
  const uint64_t data_bytes = size - 8 - header_length;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) bad(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) bad(path, "__metadata__." + m.key() + " is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const auto& t = it.value();
    const std::string where = "tensor '" + it.key() + "'";
    if (!t.is_object() || !t.contains("dtype") || !t.contains("shape") || !t.contains("data_offsets"))
      bad(path, where + " needs dtype, shape and data_offsets");
    SafetensorsFile::Entry e;
    if (!t["dtype"].is_string() || !parse_safetensors_dtype(t["dtype"].get<std::string>(), e.dtype))
      bad(path, where + " has an unsupported dtype " + t["dtype"].dump());
    if (!t["shape"].is_array() || t["shape"].size() > 8) bad(path, where + " has a malformed shape");
    uint64_t elements = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 40)) bad(path, where + " has a malformed shape");
      e.shape.push_back(d.get<int64_t>());
      elements *= d.get<uint64_t>();
      if (elements > (1ull << 40)) bad(path, where + " is implausibly large");
    }
    const auto& offsets = t["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned())
      bad(path, where + " has malformed data_offsets");
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_bytes)
      bad(path, where + " data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "] lie outside the " +
                    std::to_string(data_bytes) + " data bytes");
    if (end - begin != elements * dtype_size(e.dtype))
      bad(path, where + " holds " + std::to_string(end - begin) + " bytes but its dtype and shape need " +
                    std::to_string(elements * dtype_size(e.dtype)));
    e.offset = begin;
    e.bytes = end - begin;
    ranges.emplace_back(begin, end);
    file.tensors[it.key()] = e;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) bad(path, "two tensors' data ranges overlap");
  file.data.resize(data_bytes);
  in.read(reinterpret_cast<char*>(file.data.data()), static_cast<std::streamsize>(data_bytes));
  if (!in) bad(path, "could not read its data");
  return file;
}

}  // namespace smelt
