// The config schema: one entry per `section.key` with its type, its binding into JobConfig,
// a help line and a validation rule. File parsing, overrides, validation, `config_keys()`
// and JSON output in config.cpp are all driven by this one table.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/config.h"

namespace smelt {

enum class ConfigType { integer, real, boolean, text, text_list, optional_real, optional_boolean };

// A value read from a file or an override. std::monostate is an unset optional.
using ConfigValue =
    std::variant<std::monostate, int64_t, double, bool, std::string, std::vector<std::string>>;

// What a value must satisfy. Ranges apply to integer and real keys, choices to text keys.
struct ConfigRule {
  std::optional<double> minimum = {};
  bool minimum_exclusive = false;
  std::optional<double> maximum = {};
  bool maximum_exclusive = false;
  std::optional<double> sentinel = {};    // one number allowed outside the range (-1: "automatic")
  std::vector<std::string> choices = {};  // allowed text values; empty: any text
  bool nonempty = false;                  // text must not be empty
  // A text check beyond `choices`: true if the value is allowed; `pattern` says what is.
  std::function<bool(const std::string&)> accepts = {};
  std::string pattern = {};
};

struct ConfigField {
  std::string section;
  std::string key;
  ConfigType type;
  std::string help;
  ConfigRule rule;
  std::function<ConfigValue(const JobConfig&)> get;
  std::function<void(JobConfig&, const ConfigValue&)> set;

  std::string name() const { return section + "." + key; }
};

// Every key, section by section, in the order configs are written.
std::vector<ConfigField> config_schema();
// The section names, in order.
std::vector<std::string> config_sections();

// "int", "float", "bool", "string", "string list", "float (optional)", "bool (optional)".
std::string config_type_name(ConfigType type);
// What the rule allows, e.g. "one of: cpu, cuda" or ">= 1"; "" when anything of the type goes.
std::string describe_config_rule(const ConfigRule& rule);
// "" when `value` satisfies the field's rule, else "expected ..., found ...".
std::string check_config_rule(const ConfigField& field, const ConfigValue& value);
// A value as written in TOML: 8, 0.0003, true, "cpu", ["a", "b"], or "unset".
std::string format_config_value(const ConfigValue& value);
// Parses command-line text by type (ints, floats such as 1e-4, true/false, text as-is,
// comma-separated lists; "none" unsets an optional). On failure returns nullopt and sets `problem`.
std::optional<ConfigValue> parse_config_text(ConfigType type, const std::string& text, std::string& problem);

}  // namespace smelt
