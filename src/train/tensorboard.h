// TensorBoard event files: scalars (loss, tokens/s, MFU, memory, ...) written as TFRecord
// framed Event protocol buffers, encoded by hand (no protobuf dependency), so
// `tensorboard --logdir RUN_FOLDER` plots a run.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace smelt {

class TensorBoardWriter {
 public:
  // Creates `folder`/events.out.tfevents.<time>.smelt and writes the file-version event.
  explicit TensorBoardWriter(const std::string& folder);
  void scalar(std::string_view tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& payload);
  std::ofstream file_;
  std::string path_;
};

// CRC-32C (Castagnoli) and TFRecord's masking of it; exposed for tests.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

}  // namespace smelt
