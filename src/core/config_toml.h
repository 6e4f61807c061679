// Reading smelt's config schema out of TOML: the file's text, its parse, a value converted to a
// key's type; and writing values back as TOML text. Errors name the file, line and column. Shared by config loading (config.cpp) and
// the torchtitan import (torchtitan_config.cpp).
#pragma once
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "core/config_schema.h"

namespace smelt {

// The text of a config file; a missing path, a folder or an unreadable file is a config error.
std::string read_config_source(const std::string& path);
// The TOML document in `contents` (read from `path`); a syntax error is a config error at its line.
toml::table parse_config_toml(const std::string& contents, const std::string& path);
// "path:line:column" of a place in a TOML file.
std::string toml_location(const std::string& path, const toml::source_region& region);
// The checks on a top-level entry of a config file, shared by smelt's loader and the torchtitan
// import: it must be a [section] table (else "key 'K' is outside any section; `expected`") and a
// known one (`known`, else "unknown section [S]: `advice`"); both are config errors at its place.
const toml::table& config_section(const toml::key& key, const toml::node& node, bool known, const std::string& path,
                                  const std::string& expected, const std::string& advice);
// `node` converted to the field's type (integers are fine for floats; nothing else converts); a
// wrong type is a config error naming the key and its place.
ConfigValue read_toml_value(const ConfigField& field, const toml::node& node, const std::string& path);
// A value as written in a TOML file: strings quoted and escaped, lists of strings, numbers.
std::string toml_string(const std::string& text);
std::string toml_literal(const ConfigValue& value);
// A node as TOML text on one line (tables inline), for comparing values and quoting them in notes.
std::string node_literal(const toml::node& node);
// The schema's field section.key, or nullptr.
const ConfigField* find_field(const std::vector<ConfigField>& schema, const std::string& section,
                              const std::string& key);

}  // namespace smelt
