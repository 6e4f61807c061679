// Fuzz target: checkpoint index.json (parse, and a parsed index must serialise again).
#include "fuzz_input.h"
#include "train/checkpoint_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  smelt::fuzzing::expect_no_crash([&] {
    smelt::CheckpointIndex index = smelt::parse_checkpoint_index(text, "fuzz");
    (void)smelt::checkpoint_index_to_json(index);
  });
  return 0;
}
