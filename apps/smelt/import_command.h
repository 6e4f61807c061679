// `smelt import-config`: a torchtitan job config (TOML) written as a smelt config, with a report
// of what was translated, filled in with torchtitan's defaults, set aside, and should be checked.
#pragma once
#include <string>

namespace smelt {

struct ImportCommandOptions {
  std::string from;     // torchtitan TOML
  std::string output;   // smelt TOML to write; "" prints it to stdout (the report then goes to stderr)
  bool force = false;   // overwrite an existing output
};

int run_import_config(const ImportCommandOptions& options);

}  // namespace smelt
