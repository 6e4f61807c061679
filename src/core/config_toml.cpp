// TOML reading for configs (config_toml.h).
#include "core/config_toml.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace smelt {
namespace {

std::string toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::string:
      return "a string";
    case toml::node_type::integer:
      return "an integer";
    case toml::node_type::floating_point:
      return "a float";
    case toml::node_type::boolean:
      return "a bool";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

std::string toml_text(const toml::node& node) {
  std::ostringstream stream;
  node.visit([&](const auto& value) { stream << value; });
  std::string text = stream.str();
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

}  // namespace

std::string read_config_source(const std::string& path) {
  std::error_code status;
  if (!std::filesystem::exists(path, status))
    fail(ErrorKind::config, "config file '" + path + "' does not exist; expected a TOML file such as " +
                                "configs/debug.toml: check the path");
  if (std::filesystem::is_directory(path, status))
    fail(ErrorKind::config, "config path '" + path + "' is a folder; expected a TOML file such as " +
                                "configs/debug.toml: name a file inside it");
  std::ifstream stream(path, std::ios::binary);
  if (!stream)
    fail(ErrorKind::config, "cannot read config file '" + path + "': " + std::strerror(errno) +
                                "; expected a readable TOML file: check its permissions");
  std::ostringstream contents;
  contents << stream.rdbuf();
  return contents.str();
}

toml::table parse_config_toml(const std::string& contents, const std::string& path) {
  try {
    return toml::parse(contents, path);
  } catch (const toml::parse_error& error) {
    fail(ErrorKind::config, toml_location(path, error.source()) +
                                ": TOML syntax error: " + std::string(error.description()) +
                                "; fix the file (TOML syntax: https://toml.io)");
  }
}

// "path:line:column" of a place in a TOML file.
std::string toml_location(const std::string& path, const toml::source_region& region) {
  return path + ":" + std::to_string(region.begin.line) + ":" + std::to_string(region.begin.column);
}

const toml::table& config_section(const toml::key& key, const toml::node& node, bool known, const std::string& path,
                                  const std::string& expected, const std::string& advice) {
  const std::string section(key.str());
  if (!node.is_table())
    fail(ErrorKind::config, toml_location(path, key.source()) + ": key '" + section + "' is outside any section; " + expected);
  if (!known) fail(ErrorKind::config, toml_location(path, key.source()) + ": unknown section [" + section + "]: " + advice);
  return *node.as_table();
}

// Converts a TOML value to the field's type; integers are fine for floats, nothing else converts.
ConfigValue read_toml_value(const ConfigField& field, const toml::node& node, const std::string& path) {
  auto wrong_type = [&](const toml::node& found, const std::string& expected, const std::string& hint) {
    return toml_location(path, found.source()) + ": " + field.name() + " expects " + expected + ", found " +
           toml_type_name(found) + " (" + toml_text(found) + "); " + hint;
  };
  switch (field.type) {
    case ConfigType::integer:
      if (auto integer = node.value_exact<int64_t>()) return *integer;
      fail(ErrorKind::config,
           wrong_type(node, "an int",
                      "write a whole number without a decimal point, e.g. " + field.key + " = 8"));
    case ConfigType::real:
    case ConfigType::optional_real:
      if (node.is_floating_point()) return *node.value_exact<double>();
      if (node.is_integer()) return static_cast<double>(*node.value_exact<int64_t>());
      fail(ErrorKind::config, wrong_type(node, "a float", "write a number, e.g. " + field.key + " = 0.5"));
    case ConfigType::boolean:
    case ConfigType::optional_boolean:
      if (auto flag = node.value_exact<bool>()) return *flag;
      fail(ErrorKind::config, wrong_type(node, "a bool", "write true or false without quotes"));
    case ConfigType::text:
      if (auto text = node.value_exact<std::string>()) return *text;
      fail(ErrorKind::config,
           wrong_type(node, "a string", "put the value in double quotes, e.g. " + field.key + " = \"...\""));
    case ConfigType::text_list: {
      const toml::array* array = node.as_array();
      if (!array)
        fail(ErrorKind::config,
             wrong_type(node, "a list of strings", "write e.g. " + field.key + " = [\"output\"]"));
      std::vector<std::string> list;
      for (const toml::node& element : *array) {
        auto text = element.value_exact<std::string>();
        if (!text)
          fail(ErrorKind::config,
               wrong_type(element, "a list of strings", "quote every element of the list"));
        list.push_back(*text);
      }
      return list;
    }
  }
  fail(ErrorKind::internal, "config key " + field.name() + " has an unknown type");
}


const ConfigField* find_field(const std::vector<ConfigField>& schema, const std::string& section,
                              const std::string& key) {
  for (const ConfigField& field : schema)
    if (field.section == section && field.key == key) return &field;
  return nullptr;
}


std::string toml_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

std::string toml_literal(const ConfigValue& value) {
  if (const auto* text = std::get_if<std::string>(&value)) return toml_string(*text);
  if (const auto* list = std::get_if<std::vector<std::string>>(&value)) {
    std::string out = "[";
    for (size_t i = 0; i < list->size(); ++i) out += (i ? ", " : "") + toml_string((*list)[i]);
    return out + "]";
  }
  return format_config_value(value);
}

std::string node_literal(const toml::node& node) {
  if (const auto* array = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < array->size(); ++i) out += (i ? ", " : "") + node_literal(*array->get(i));
    return out + "]";
  }
  if (const auto* table = node.as_table()) {  // inline: { a = 1, b = "x" }
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : *table) {
      out += std::string(first ? " " : ", ") + std::string(key.str()) + " = " + node_literal(value);
      first = false;
    }
    return out + (first ? "}" : " }");
  }
  if (auto text = node.value_exact<std::string>()) return toml_string(*text);
  if (auto flag = node.value_exact<bool>()) return *flag ? "true" : "false";
  if (auto integer = node.value_exact<int64_t>()) return std::to_string(*integer);
  if (auto real = node.value_exact<double>()) return format_config_value(*real);
  std::ostringstream stream;
  node.visit([&](const auto& v) { stream << v; });
  return stream.str();
}

}  // namespace smelt
