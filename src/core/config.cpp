// Loading, overriding, validating and printing a JobConfig, all driven by the schema
// table in config_schema.cpp. TOML is read with toml++; errors name the file, line and key.
#include "core/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/config_schema.h"
#include "core/config_toml.h"
#include "core/error.h"
#include "core/torchtitan_config.h"

namespace smelt {
namespace {

// Edit distance (insertions, deletions, substitutions) between two names.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

// " Did you mean training.seq_len?" for the known key closest to `section.key`, or "" if none is close.
std::string suggest_key(const std::vector<ConfigField>& schema, const std::string& section,
                        const std::string& key) {
  const std::string wanted = section.empty() ? key : section + "." + key;
  size_t best_score = SIZE_MAX;
  std::string best;
  for (const ConfigField& field : schema) {
    size_t whole = section.empty() ? SIZE_MAX : edit_distance(wanted, field.name());
    // The right key in the wrong section is a near miss too.
    size_t key_only = edit_distance(key, field.key) + (field.section == section ? 0 : 2);
    size_t score = std::min(whole, key_only);
    if (score < best_score) best_score = score, best = field.name();
  }
  size_t tolerance = std::max<size_t>(2, key.size() / 3);
  if (best_score > tolerance) return "";
  return " Did you mean " + best + "?";
}

std::string suggest_section(const std::vector<std::string>& sections, const std::string& section) {
  size_t best_score = SIZE_MAX;
  std::string best;
  for (const std::string& known : sections) {
    size_t score = edit_distance(section, known);
    if (score < best_score) best_score = score, best = known;
  }
  if (best_score > std::max<size_t>(2, section.size() / 3)) return "";
  return " Did you mean [" + best + "]?";
}

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
  return text;
}

std::string keys_of_section(const std::vector<ConfigField>& schema, const std::string& section) {
  std::vector<std::string> keys;
  for (const ConfigField& field : schema)
    if (field.section == section) keys.push_back(field.key);
  return join(keys);
}

bool is_section(const std::vector<std::string>& sections, const std::string& section) {
  return std::find(sections.begin(), sections.end(), section) != sections.end();
}

nlohmann::ordered_json to_json(const ConfigValue& value) {
  struct Converter {
    nlohmann::ordered_json operator()(std::monostate) const { return nullptr; }
    nlohmann::ordered_json operator()(int64_t integer) const { return integer; }
    nlohmann::ordered_json operator()(double real) const { return real; }
    nlohmann::ordered_json operator()(bool flag) const { return flag; }
    nlohmann::ordered_json operator()(const std::string& text) const { return text; }
    nlohmann::ordered_json operator()(const std::vector<std::string>& list) const { return list; }
  };
  return std::visit(Converter{}, value);
}

}  // namespace

JobConfig load_config_file(const std::string& path) {
  return load_config_text(read_config_source(path), path);
}

JobConfig load_config_text(const std::string& contents, const std::string& path) {
  const toml::table root = parse_config_toml(contents, path);
  const std::vector<ConfigField> schema = config_schema();
  const std::vector<std::string> sections = config_sections();
  JobConfig config;
  config.source = path;
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table& table = config_section(
        section_key, section_node, is_section(sections, section), path,
        "expected it under a [section] header (sections: " + join(sections) + ")." + suggest_key(schema, "", section),
        "remove it or fix its name (sections: " + join(sections) + ")." + suggest_section(sections, section) +
            torchtitan_hint(section, ""));
    for (const auto& [key_name, node] : table) {
      const std::string key(key_name.str());
      const ConfigField* field = find_field(schema, section, key);
      if (!field) {
        std::string suggestion = suggest_key(schema, section, key);
        if (suggestion.empty())
          suggestion = " Keys in [" + section + "]: " + keys_of_section(schema, section) + ".";
        fail(ErrorKind::config, toml_location(path, key_name.source()) + ": unknown key " + section + "." + key +
                                    " in section [" + section + "]: remove it or fix its name." + suggestion +
                                    torchtitan_hint(section, key));
      }
      ConfigValue value = read_toml_value(*field, node, path);
      std::string problem = check_config_rule(*field, value);
      if (!problem.empty())
        fail(ErrorKind::config, toml_location(path, node.source()) + ": " + field->name() + ": " + problem +
                                    "; change the value in the file" + torchtitan_hint(section, key, &value));
      field->set(config, value);
    }
  }
  return config;
}

void apply_override(JobConfig& config, const std::string& assignment) {
  const std::string text = assignment.rfind("--", 0) == 0 ? assignment.substr(2) : assignment;
  const std::string quoted = "override '" + assignment + "'";
  const size_t equals = text.find('=');
  if (equals == std::string::npos)
    fail(ErrorKind::config, quoted + " has no '='; expected section.key=value, e.g. training.steps=10");
  const std::string name = text.substr(0, equals);
  const std::string value_text = text.substr(equals + 1);
  const std::vector<ConfigField> schema = config_schema();
  const std::vector<std::string> sections = config_sections();
  const size_t dot = name.find('.');
  if (dot == std::string::npos)
    fail(ErrorKind::config, quoted + ": key '" + name + "' has no section; expected section.key=value, " +
                                "e.g. training.steps=10." + suggest_key(schema, "", name));
  const std::string section = name.substr(0, dot);
  const std::string key = name.substr(dot + 1);
  if (!is_section(sections, section))
    fail(ErrorKind::config, quoted + ": unknown section '" + section + "' in key " + name +
                                "; expected one of: " + join(sections) + "." +
                                suggest_key(schema, section, key));
  const ConfigField* field = find_field(schema, section, key);
  if (!field) {
    std::string suggestion = suggest_key(schema, section, key);
    if (suggestion.empty())
      suggestion = " Keys in [" + section + "]: " + keys_of_section(schema, section) + ".";
    fail(ErrorKind::config, quoted + ": unknown key " + name + "." + suggestion + torchtitan_hint(section, key));
  }
  std::string problem;
  std::optional<ConfigValue> value = parse_config_text(field->type, value_text, problem);
  if (!value)
    fail(ErrorKind::config, quoted + ": " + name + " (" + config_type_name(field->type) + "): " + problem +
                                "; fix the value after '='");
  problem = check_config_rule(*field, *value);
  if (!problem.empty())
    fail(ErrorKind::config, quoted + ": " + name + ": " + problem + "; fix the value after '='" +
                                torchtitan_hint(section, key, &*value));
  field->set(config, *value);
}

void validate_config(const JobConfig& config) {
  const std::string origin = config.source.empty() ? "config" : "config " + config.source;
  for (const ConfigField& field : config_schema()) {
    std::string problem = check_config_rule(field, field.get(config));
    if (!problem.empty())
      fail(ErrorKind::config, origin + ": " + field.name() + ": " + problem +
                                  "; set it in the file or with --" + field.name() + "=...");
  }
  // Rules across keys (only between keys that are set; presets are checked by the model).
  const ModelSection& model = config.model;
  if (model.n_heads > 0 && model.n_kv_heads > 0 && model.n_heads % model.n_kv_heads != 0)
    fail(ErrorKind::config, origin + ": model.n_heads (" + std::to_string(model.n_heads) +
                                ") must be a multiple of model.n_kv_heads, found n_kv_heads = " +
                                std::to_string(model.n_kv_heads) + "; pick n_kv_heads dividing n_heads");
  if (model.dim > 0 && model.n_heads > 0 && model.dim % model.n_heads != 0)
    fail(ErrorKind::config, origin + ": model.dim (" + std::to_string(model.dim) +
                                ") must be a multiple of model.n_heads, found n_heads = " +
                                std::to_string(model.n_heads) + "; pick n_heads dividing dim");
  const TrainingSection& training = config.training;
  if (training.output_weight_copy == "persistent" && training.mixed_precision_param != "bfloat16")
    fail(ErrorKind::config, origin + ": training.output_weight_copy = \"persistent\" keeps a bfloat16 copy, which needs "
                                "training.mixed_precision_param = \"bfloat16\", found \"" + training.mixed_precision_param +
                                "\"; set output_weight_copy to auto");
  if (training.output_weight_copy == "persistent" &&
      (config.parallelism.shard_single_rank || config.parallelism.data_parallel_shard_degree > 1))
    fail(ErrorKind::config, origin + ": training.output_weight_copy = \"persistent\" applies to unsharded runs (sharded "
                                "ones gather the output projection in bfloat16 at each use), found "
                                "parallelism.shard_single_rank = " + (config.parallelism.shard_single_rank ? "true" : "false") +
                                ", data_parallel_shard_degree = " +
                                std::to_string(config.parallelism.data_parallel_shard_degree) +
                                "; set output_weight_copy to auto");
  if (training.global_batch_size > 0 && training.global_batch_size % training.local_batch_size != 0)
    fail(ErrorKind::config, origin + ": training.global_batch_size (" + std::to_string(training.global_batch_size) +
                                ") must be a multiple of training.local_batch_size (" +
                                std::to_string(training.local_batch_size) +
                                "): each step runs global / local forward-backward passes; pick a multiple, or -1");
  if (training.linear_grad_dtype == "bfloat16" && training.mixed_precision_param != "bfloat16")
    fail(ErrorKind::config, origin + ": training.linear_grad_dtype = \"bfloat16\" needs training.mixed_precision_param = "
                                "\"bfloat16\", found \"" + training.mixed_precision_param +
                                "\"; set both to bfloat16, or linear_grad_dtype to auto");
  if (training.linear_grad_dtype == "bfloat16" &&
      (config.parallelism.shard_single_rank || config.parallelism.data_parallel_shard_degree > 1 ||
       config.parallelism.data_parallel_replicate_degree > 1))
    fail(ErrorKind::config, origin + ": training.linear_grad_dtype = \"bfloat16\" applies to runs of one whole model "
                                "per rank, found parallelism.shard_single_rank = " +
                                (config.parallelism.shard_single_rank ? "true" : "false") +
                                ", data_parallel_shard_degree = " +
                                std::to_string(config.parallelism.data_parallel_shard_degree) +
                                ", data_parallel_replicate_degree = " +
                                std::to_string(config.parallelism.data_parallel_replicate_degree) +
                                "; data-parallel runs choose their gradients' dtype with parallelism.reduce_dtype");
}

std::string config_to_json(const JobConfig& config) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  for (const ConfigField& field : config_schema())
    root[field.section][field.key] = to_json(field.get(config));
  root["source"] = config.source;
  return root.dump(2);
}

std::vector<ConfigKeyInfo> config_keys() {
  const JobConfig defaults;
  std::vector<ConfigKeyInfo> keys;
  for (const ConfigField& field : config_schema()) {
    std::string help = field.help;
    std::string allowed = describe_config_rule(field.rule);
    if (!allowed.empty()) help += " [" + allowed + "]";
    help += " (default: " + format_config_value(field.get(defaults)) + ")";
    keys.push_back({field.name(), config_type_name(field.type), help});
  }
  return keys;
}

}  // namespace smelt
