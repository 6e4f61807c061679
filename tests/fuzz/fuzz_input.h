// Shared by the fuzz targets: the input bytes as a file (the parsers under test read paths), and
// the rule that a parser may reject input only with smelt::Error; anything else is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace smelt::fuzzing {

// A file holding `data`, rewritten for every input; one per fuzzing process.
inline std::string input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = std::string(access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp") +
                                  "/smelt-fuzz-" + std::to_string(getpid()) + suffix;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

template <class Parse>
void expect_no_crash(Parse&& parse) {
  try {
    parse();
  } catch (const smelt::Error&) {
    // A clean rejection, with a message: what the parsers promise for malformed input.
  }
}

}  // namespace smelt::fuzzing
