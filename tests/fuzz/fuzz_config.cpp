// Fuzz target: TOML config files (load_config_file, then validate_config).
#include "core/config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = smelt::fuzzing::input_file(data, size, ".toml");
  smelt::fuzzing::expect_no_crash([&] { smelt::validate_config(smelt::load_config_file(path)); });
  return 0;
}
