// Shared command-line plumbing: --config plus `--section.key=value` overrides.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/config.h"

namespace smelt {

struct ConfigOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // "section.key=value"
};

// Adds --config and accepts unknown `--section.key=value` / `--section.key value` arguments.
void add_config_options(CLI::App& command, ConfigOptions& options);
// Loads the file (or the built-in debug defaults), applies the overrides and validates.
JobConfig resolve_config(CLI::App& command, ConfigOptions& options);
// The help epilogue listing every config key.
std::string config_keys_help();

}  // namespace smelt
