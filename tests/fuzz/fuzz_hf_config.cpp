// Fuzz target: Hugging Face config.json (and a parsed config must serialise and parse again).
#include "fuzz_input.h"
#include "train/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  smelt::fuzzing::expect_no_crash([&] {
    smelt::HfConfig hf = smelt::hf_config_from_json(text, "fuzz");
    (void)smelt::hf_config_from_json(smelt::hf_config_to_json(hf.model, hf.max_position_embeddings, "float32"), "again");
  });
  return 0;
}
