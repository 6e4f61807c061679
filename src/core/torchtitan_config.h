// Reading a torchtitan job config (its TOML train configs) as a smelt config. Keys with the same
// meaning under another name or spelling are translated (`flavor = "8B"`, `mode = "selective"` with
// `selective_ac_option`, `converters = ["float8"]` with `recipe_name`, `async_mode`, ...); keys that
// change nothing in smelt (compile, profiler folders, garbage collection, ...) are set aside with the
// reason; settings smelt cannot honour (tensor, pipeline or context parallelism, CPU offload, ...)
// are errors naming the key and its line. Where torchtitan's default differs from smelt's and the
// file leaves the key out, torchtitan's is written, so the run is the one the file describes.
// `smelt import-config` writes the result as a commented smelt config (docs/torchtitan.md).
#pragma once
#include <string>
#include <vector>

#include "core/config_schema.h"

namespace smelt {

struct TorchtitanImport {
  std::string toml;                    // the smelt config, with a comment on every key it did not copy as is
  std::vector<std::string> translated; // "path:line: a.b = x -> c.d = y"
  std::vector<std::string> defaults;   // torchtitan defaults written where smelt's differ
  std::vector<std::string> set_aside;  // "path:line: a.b (why it has no effect)"
  std::vector<std::string> warnings;   // what the user should check (the dataset, validation steps)
};

// Reads torchtitan config `path`; the result loads with load_config_text and passes validate_config.
TorchtitanImport import_torchtitan_config(const std::string& path);
// The same from TOML text read from `path` (named in errors and notes).
TorchtitanImport import_torchtitan_text(const std::string& contents, const std::string& path);

// For errors of smelt's own config loading: " This is torchtitan's key ...; `smelt import-config`
// translates torchtitan configs." when section.key (or, given `value`, that value of a smelt key,
// such as model.flavor "8B") is torchtitan's; "" otherwise.
std::string torchtitan_hint(const std::string& section, const std::string& key, const ConfigValue* value = nullptr);

}  // namespace smelt
