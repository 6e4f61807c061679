// Fuzz target: safetensors files (header length, JSON header, offsets against the file).
#include "fuzz_input.h"
#include "train/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = smelt::fuzzing::input_file(data, size, ".safetensors");
  smelt::fuzzing::expect_no_crash([&] {
    smelt::SafetensorsFile file = smelt::load_safetensors(path);
    for (const auto& [name, entry] : file.tensors) (void)file.bytes_of(name)[entry.bytes ? entry.bytes - 1 : 0];
  });
  return 0;
}
