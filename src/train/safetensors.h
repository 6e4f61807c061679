// safetensors files: an 8-byte little-endian header length, a JSON header naming
// each tensor's dtype, shape and byte range, then the raw data. Writing is atomic;
// reading validates every header field against the file before trusting it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace smelt {

struct NamedTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
};

// Writes `tensors` (in the given order) with string `metadata` to `path` atomically.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata);

struct SafetensorsFile {
  struct Entry {
    DType dtype = DType::f32;
    std::vector<int64_t> shape;
    size_t offset = 0, bytes = 0;  // into `data`
  };
  std::map<std::string, Entry> tensors;
  std::map<std::string, std::string> metadata;
  std::vector<uint8_t> data;
  const uint8_t* bytes_of(const std::string& name) const;  // Error(input) naming the tensor when absent
  const Entry& entry(const std::string& name) const;
  std::string path;
};

// Reads and validates a whole file; malformed input is an Error(input) naming the file and the problem.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace smelt
