// Fuzz target: TOML config files, read as smelt's (load_config_file, then validate_config) and as
// torchtitan's (import_torchtitan_config). The import checks that what it writes loads and
// validates, and reports a failure there as an internal error: a bug, so a crash here.
#include <cstdio>
#include <cstdlib>

#include "core/config.h"
#include "core/torchtitan_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = smelt::fuzzing::input_file(data, size, ".toml");
  smelt::fuzzing::expect_no_crash([&] { smelt::validate_config(smelt::load_config_file(path)); });
  try {
    (void)smelt::import_torchtitan_config(path);
  } catch (const smelt::Error& e) {
    if (e.kind() == smelt::ErrorKind::internal) {
      std::fprintf(stderr, "import_torchtitan_config: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
