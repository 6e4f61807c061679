// Fuzz target: tiktoken vocabulary files (tokenizer.model).
#include "data/tiktoken_file.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = smelt::fuzzing::input_file(data, size, ".model");
  smelt::fuzzing::expect_no_crash([&] { (void)smelt::read_tiktoken_file(path); });
  return 0;
}
