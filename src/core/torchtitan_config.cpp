// torchtitan job configs read as smelt configs (torchtitan_config.h). One table says what becomes
// of every torchtitan key smelt's schema lacks; a handful of keys need more than a rename and are
// resolved together at the end (the checkpointing mode, the float8 converter, the dataset, ...).
#include "core/torchtitan_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>

#include "core/config.h"
#include "core/config_toml.h"
#include "core/error.h"
#include "core/torchtitan_keys.h"

namespace smelt {
namespace {

using torchtitan::find_torchtitan_key;
using torchtitan::is_torchtitan_section;
using torchtitan::Kind;
using torchtitan::smelt_flavor;
using torchtitan::TorchtitanKey;


std::string line_of(const std::string& path, const toml::node& node) {
  return path + ":" + std::to_string(node.source().begin.line);
}

// The key as found: where, and the node.
struct Found {
  const toml::node* node = nullptr;
  std::string where;  // path:line
  std::string text() const { return node ? node_literal(*node) : ""; }
};

class Importer {
 public:
  Importer(std::string path) : path_(std::move(path)), schema_(config_schema()) {}

  TorchtitanImport run(const toml::table& root) {
    for (const auto& [section_key, section_node] : root) read_section(std::string(section_key.str()), section_key, section_node);
    resolve_flavor();
    resolve_checkpointing();
    resolve_float8();
    resolve_tokenizer();
    resolve_dataset();
    resolve_async();
    resolve_validation();
    write_defaults();
    for (auto* notes : {&result_.translated, &result_.defaults, &result_.set_aside, &result_.warnings}) by_line(*notes);
    result_.toml = emit();
    // The translation must be a config smelt accepts; anything else is a bug here.
    try {
      validate_config(load_config_text(result_.toml, path_ + " (imported)"));
    } catch (const Error& e) {
      fail(ErrorKind::internal, path_ + ": the imported config does not load (a bug in the import): " + e.what());
    }
    return std::move(result_);
  }

 private:
  struct Setting {
    ConfigValue value;
    std::string comment;  // "" when copied as is
  };

  void read_section(const std::string& section, const toml::key& section_key, const toml::node& node) {
    const bool smelt_section = std::find(sections_.begin(), sections_.end(), section) != sections_.end();
    const toml::table& table =
        config_section(section_key, node, smelt_section || is_torchtitan_section(section), path_,
                       "a torchtitan config holds [section] tables", "neither smelt's nor torchtitan's; remove it or fix its name");
    for (const auto& [key_name, value] : table) {
      const std::string key(key_name.str());
      const std::string name = section + "." + key;
      const TorchtitanKey* entry = find_torchtitan_key(section, key);
      const ConfigField* field = find_field(schema_, section, key);
      if ((entry && entry->kind == Kind::special) || name == "model.flavor" || name == "activation_checkpoint.mode") {
        const std::string canonical = entry && *entry->target ? entry->target : name;
        if (found_.count(canonical))
          fail(ErrorKind::config, toml_location(path_, value.source()) + ": " + name + " repeats " + canonical +
                                      " (" + found_[canonical].where + "); keep one");
        found_[canonical] = Found{&value, line_of(path_, value)};
        continue;
      }
      if (value.is_table() && !field && !entry) {  // a nested table: [quantize.linear.float8]
        read_section(name, key_name, value);
        continue;
      }
      if (field) {
        set_from_file(*field, value, "");
        continue;
      }
      if (!entry)
        fail(ErrorKind::config, toml_location(path_, key_name.source()) + ": unknown key " + name +
                                    ": neither smelt's (`smelt config-keys`) nor one torchtitan's config has; "
                                    "remove it or fix its name");
      switch (entry->kind) {
        case Kind::rename: {
          const std::string target = entry->target;
          const size_t dot = target.find('.');
          const ConfigField* to = find_field(schema_, target.substr(0, dot), target.substr(dot + 1));
          SMELT_CHECK(to != nullptr, "torchtitan rename to an unknown key " + target);
          set_from_file(*to, value, "torchtitan's " + name);
          result_.translated.push_back(line_of(path_, value) + ": " + name + " = " + node_literal(value) + " -> " +
                                       target + " = " + node_literal(value));
          if (*entry->why) result_.warnings.push_back(line_of(path_, value) + ": " + name + ": " + entry->why);
          break;
        }
        case Kind::set_aside:
          result_.set_aside.push_back(line_of(path_, value) + ": " + name + " = " + node_literal(value) + " (" +
                                      entry->why + ")");
          break;
        case Kind::neutral: {
          // `target`: the accepted values, '|'-separated; the first is torchtitan's default.
          const std::string accepted = "|" + std::string(entry->target) + "|";
          if (accepted.find("|" + node_literal(value) + "|") == std::string::npos)
            fail(ErrorKind::config, toml_location(path_, value.source()) + ": " + name + " = " + node_literal(value) +
                                        ": " + entry->why + "; set it to " +
                                        std::string(entry->target).substr(0, std::string(entry->target).find('|')) +
                                        " or remove it");
          result_.set_aside.push_back(line_of(path_, value) + ": " + name + " = " + node_literal(value) +
                                      " (nothing to do: " + entry->why + ")");
          break;
        }
        case Kind::special:
          break;
      }
    }
  }

  // Reads `node` as `field`'s type and checks its rule, both errors naming the file's line.
  void set_from_file(const ConfigField& field, const toml::node& node, const std::string& comment) {
    ConfigValue value = read_toml_value(field, node, path_);
    const std::string problem = check_config_rule(field, value);
    if (!problem.empty())
      fail(ErrorKind::config, toml_location(path_, node.source()) + ": " + field.name() + ": " + problem +
                                  "; change the value in the file");
    // Two spellings of one setting (smelt's key and torchtitan's, or two of torchtitan's releases).
    const std::string origin = (comment.empty() ? field.name() : comment) + " (line " +
                               std::to_string(node.source().begin.line) + ")";
    auto [previous, fresh] = origins_.emplace(field.name(), origin);
    if (!fresh)
      fail(ErrorKind::config, toml_location(path_, node.source()) + ": " + field.name() + " is set twice: by " +
                                  previous->second + " and by " + origin + "; keep one");
    settings_[field.name()] = Setting{std::move(value), comment};
  }

  void set(const std::string& name, ConfigValue value, const std::string& comment) {
    settings_[name] = Setting{std::move(value), comment};
  }

  bool has(const std::string& name) const { return settings_.count(name) > 0; }
  const Found* found(const std::string& name) const {
    auto it = found_.find(name);
    return it == found_.end() ? nullptr : &it->second;
  }
  std::string text_of(const Found& f, const std::string& name) const {
    auto text = f.node->value_exact<std::string>();
    if (!text)
      fail(ErrorKind::config, toml_location(path_, f.node->source()) + ": " + name + " expects a string, found " +
                                  f.text() + "; put the value in double quotes");
    return *text;
  }

  void resolve_flavor() {
    const Found* f = found("model.flavor");
    if (!f) return;
    const std::string flavor = text_of(*f, "model.flavor");
    const ConfigField* field = find_field(schema_, "model", "flavor");
    if (check_config_rule(*field, ConfigValue(flavor)).empty()) {  // smelt's own preset name
      set("model.flavor", flavor, "");
      return;
    }
    const std::optional<std::string> preset = smelt_flavor(flavor);
    if (!preset)
      fail(ErrorKind::config, toml_location(path_, f->node->source()) + ": model.flavor = " + f->text() +
                                  ": not a Llama 3 flavour smelt has; torchtitan's debugmodel, 8B, 70B and 405B "
                                  "are smelt's debugmodel, llama3_8b, llama3_70b and llama3_405b");
    const std::string note = flavor.find("_flex_attn") != std::string::npos
                                 ? " (smelt's attention is fused scaled-dot-product attention; no FlexAttention)"
                                 : "";
    set("model.flavor", *preset, "torchtitan's flavor = " + f->text() + note);
    result_.translated.push_back(f->where + ": model.flavor = " + f->text() + " -> model.flavor = \"" + *preset + "\"" + note);
  }

  void resolve_checkpointing() {
    const Found* mode_found = found("activation_checkpoint.mode");
    const Found* option_found = found("activation_checkpoint.selective_ac_option");
    const std::string mode = mode_found ? text_of(*mode_found, "activation_checkpoint.mode") : "selective";
    const ConfigField* field = find_field(schema_, "activation_checkpoint", "mode");
    if (mode != "selective" && check_config_rule(*field, ConfigValue(mode)).empty()) {  // none, full, or smelt's own
      set("activation_checkpoint.mode", mode, "");
      if (option_found)
        result_.set_aside.push_back(option_found->where + ": activation_checkpoint.selective_ac_option = " +
                                    option_found->text() + " (used with mode = \"selective\" only)");
      return;
    }
    if (mode == "memory_budget")
      fail(ErrorKind::config, toml_location(path_, mode_found->node->source()) +
                                  ": activation_checkpoint.mode = \"memory_budget\": smelt's counterpart is mode = "
                                  "\"auto\", which keeps per block what fits activation_checkpoint.memory_budget_gb "
                                  "(gigabytes, not a fraction); set those two");
    if (mode != "selective")
      fail(ErrorKind::config, toml_location(path_, mode_found->node->source()) + ": activation_checkpoint.mode = " +
                                  mode_found->text() + ": expected none, selective or full (torchtitan), or " +
                                  describe_config_rule(field->rule) + " (smelt)");
    std::string option = "2";  // torchtitan's default
    if (option_found) {
      if (auto text = option_found->node->value_exact<std::string>()) option = *text;
      else if (auto number = option_found->node->value_exact<int64_t>()) option = std::to_string(*number);
    }
    std::string translated;
    if (option == "op") {
      translated = "selective-op";
    } else {
      const bool digits = !option.empty() && std::all_of(option.begin(), option.end(), ::isdigit) && option.size() < 6;
      if (!digits || std::stoi(option) < 1)
        fail(ErrorKind::config, (option_found ? toml_location(path_, option_found->node->source()) : path_) +
                                    ": activation_checkpoint.selective_ac_option = " +
                                    (option_found ? option_found->text() : option) +
                                    ": expected \"op\" or a whole number of blocks >= 1");
      translated = "selective-layer:" + option;
    }
    const std::string from = "mode = \"selective\"" + std::string(mode_found ? "" : " (torchtitan's default)") +
                             ", selective_ac_option = \"" + option + "\"" + (option_found ? "" : " (torchtitan's default)");
    set("activation_checkpoint.mode", translated, "torchtitan's " + from);
    const std::string line = "activation_checkpoint." + from + " -> activation_checkpoint.mode = \"" + translated + "\"";
    if (mode_found)
      result_.translated.push_back(mode_found->where + ": " + line);
    else
      result_.defaults.push_back(line);
  }

  void resolve_float8() {
    const Found* converters = found("model.converters");
    const Found* recipe = found("float8.recipe_name");
    std::string switch_text = converters ? "model.converters = " + converters->text() : "";  // what turned float8 on
    bool float8 = false;
    if (converters) {
      // A list, or (as torchtitan's command line takes it) one comma-separated string.
      std::vector<std::pair<std::string, const toml::node*>> names;
      if (const toml::array* list = converters->node->as_array()) {
        for (const toml::node& element : *list) {
          auto name = element.value_exact<std::string>();
          if (!name)
            fail(ErrorKind::config, toml_location(path_, element.source()) +
                                        ": model.converters expects strings, found " + node_literal(element));
          names.emplace_back(*name, &element);
        }
      } else if (auto text = converters->node->value_exact<std::string>()) {
        std::stringstream parts(*text);
        for (std::string name; std::getline(parts, name, ',');)
          if (!name.empty()) names.emplace_back(name, converters->node);
      } else {
        fail(ErrorKind::config, toml_location(path_, converters->node->source()) +
                                    ": model.converters expects a list of strings, e.g. [\"float8\"], found " +
                                    converters->text());
      }
      for (const auto& [name, node] : names) {
        if (name == "float8" || name == "quantize.linear.float8" || name == "quantize.dense.float8") {
          float8 = true;
        } else if (name.rfind("quantize.grouped_mm.", 0) == 0 || name.rfind("quantize.moe.", 0) == 0) {
          result_.set_aside.push_back(line_of(path_, *node) + ": model.converters: " + toml_string(name) +
                                      " (mixture-of-experts GEMMs; Llama 3 has no experts)");
        } else if (name == "mx" || name == "mxfp8" || name == "quantize.linear.mx" || name == "quantize.dense.mx") {
          fail(ErrorKind::config, toml_location(path_, node->source()) + ": model.converters: \"" + name +
                                      "\": smelt has no MX formats (they need Blackwell's block-scaled GEMMs); its "
                                      "float8 recipes: tensorwise, rowwise, rowwise_with_gw_hp and blockwise "
                                      "(float8.recipe)");
        } else {
          fail(ErrorKind::config, toml_location(path_, node->source()) + ": model.converters: " + toml_string(name) +
                                      ": smelt knows the \"float8\" converter only");
        }
      }
    }
    if (const Found* linear = found("float8.enable_float8_linear")) {  // earlier releases
      auto on = linear->node->value_exact<bool>();
      if (!on)
        fail(ErrorKind::config, toml_location(path_, linear->node->source()) +
                                    ": float8.enable_float8_linear expects a bool, found " + linear->text());
      if (*on && !float8) {
        float8 = true;
        converters = linear;
        switch_text = "float8.enable_float8_linear = true";
      }
    }
    if (const Found* mx = first_found_in_section("mx"))
      result_.set_aside.push_back(mx->where + ": [mx] (no \"mx\" converter: torchtitan ignores the section too)");
    if (!float8) {
      if (recipe)
        result_.set_aside.push_back(recipe->where + ": float8.recipe_name = " + recipe->text() +
                                    " (model.converters has no \"float8\": torchtitan trains in bf16 then)");
      return;
    }
    const std::string name = recipe ? text_of(*recipe, "float8.recipe_name") : "tensorwise";
    const ConfigField* field = find_field(schema_, "float8", "recipe");
    const std::string problem = check_config_rule(*field, ConfigValue(name));
    if (!problem.empty() || name == "none")
      fail(ErrorKind::config, toml_location(path_, recipe->node->source()) + ": float8.recipe_name = " + recipe->text() +
                                  ": expected tensorwise, rowwise or rowwise_with_gw_hp");
    if (has("float8.recipe") && std::get<std::string>(settings_["float8.recipe"].value) != name)
      fail(ErrorKind::config, converters->where + ": float8.recipe and torchtitan's float8 converter disagree (" +
                                  format_config_value(settings_["float8.recipe"].value) + " against \"" + name +
                                  "\"); keep one");
    const std::string from =
        switch_text + (recipe ? ", float8.recipe_name = " + recipe->text() : " (recipe_name unset: tensorwise)");
    set("float8.recipe", name, "torchtitan's " + from);
    result_.translated.push_back(converters->where + ": " + from + " -> float8.recipe = \"" + name + "\"");
    // torchtitan converts the output projection too unless filtered; smelt keeps it in bf16.
    std::vector<std::string> filters;
    if (has("float8.filter_fqns")) filters = std::get<std::vector<std::string>>(settings_["float8.filter_fqns"].value);
    if (std::find(filters.begin(), filters.end(), "output") == filters.end()) {
      filters.push_back("output");
      set("float8.filter_fqns", filters, "\"output\" added: smelt keeps the output projection in bf16");
      result_.defaults.push_back("float8.filter_fqns: \"output\" added (smelt's output projection has no float8 path)");
    }
  }

  const Found* first_found_in_section(const std::string& section) {
    for (const auto& [name, f] : found_)
      if (name.rfind(section + ".", 0) == 0) return &f;
    return nullptr;
  }

  void resolve_tokenizer() {
    const Found* assets = found("model.hf_assets_path");
    if (assets) {
      const std::string folder = text_of(*assets, "model.hf_assets_path");
      if (has("model.tokenizer_path")) {
        result_.set_aside.push_back(assets->where + ": model.hf_assets_path = " + assets->text() +
                                    " (model.tokenizer_path names the tokenizer)");
      } else {
        const std::string path = folder + (folder.empty() || folder.back() == '/' ? "" : "/") + "original/tokenizer.model";
        set("model.tokenizer_path", path, "torchtitan's hf_assets_path: the folder's tiktoken file");
        result_.translated.push_back(assets->where + ": model.hf_assets_path = " + assets->text() +
                                     " -> model.tokenizer_path = " + toml_string(path) +
                                     " (the Llama 3 tiktoken file Hugging Face folders keep under original/)");
      }
      return;
    }
    if (has("model.tokenizer_path") || has("model.vocab_size")) return;
    // No tokenizer named: torchtitan's default path is inside its own repository. smelt's byte
    // tokenizer then stands in, in Llama 3's vocabulary, so the model has Llama 3's shapes.
    const std::string flavor = has("model.flavor") ? std::get<std::string>(settings_["model.flavor"].value) : "debugmodel";
    if (flavor == "debugmodel") return;
    set("model.vocab_size", int64_t{128256}, "Llama 3's vocabulary; no tokenizer named, so smelt's byte tokenizer");
    result_.defaults.push_back("model.vocab_size = 128256 (no tokenizer named: smelt's byte tokenizer, in Llama 3's "
                               "vocabulary; set model.tokenizer_path to the tiktoken file for real text)");
  }

  void resolve_dataset() {
    const Found* dataset = found("training.dataset");
    if (!dataset) return;
    if (has("training.dataset_path")) {
      result_.set_aside.push_back(dataset->where + ": training.dataset = " + dataset->text() +
                                  " (training.dataset_path names the data)");
      return;
    }
    set("training.dataset_path", std::string("docs"),
        "CHECK: torchtitan's dataset = " + dataset->text() + " is downloaded; smelt reads local files");
    result_.warnings.push_back(dataset->where + ": training.dataset = " + dataset->text() +
                               " names a dataset torchtitan downloads; smelt reads local files: "
                               "training.dataset_path is set to \"docs\" (smelt's own docs/ text); point it at your "
                               "data (text, JSON Lines, or token shards from `smelt prepare`)");
  }

  void resolve_async() {
    const Found* f = found("checkpoint.async_mode");
    if (!f) return;
    const std::string mode = text_of(*f, "checkpoint.async_mode");
    if (mode != "disabled" && mode != "async" && mode != "async_with_pinned_mem")
      fail(ErrorKind::config, toml_location(path_, f->node->source()) + ": checkpoint.async_mode = " + f->text() +
                                  ": expected \"disabled\", \"async\" or \"async_with_pinned_mem\"");
    const bool async = mode != "disabled";
    set("checkpoint.async", async, "torchtitan's async_mode = " + f->text());
    result_.translated.push_back(f->where + ": checkpoint.async_mode = " + f->text() + " -> checkpoint.async = " +
                                 (async ? "true" : "false"));
  }

  void resolve_validation() {
    const Found* f = found("validation.steps");
    if (!f) return;
    auto steps = f->node->value_exact<int64_t>();
    if (steps && *steps == -1) {
      result_.warnings.push_back(f->where + ": validation.steps = -1 (the whole validation split): smelt validates "
                                 "a fixed number of batches; validation.steps stays at smelt's default (4)");
      return;
    }
    set_from_file(*find_field(schema_, "validation", "steps"), *f->node, "");
  }

  // torchtitan's defaults where smelt's differ, for keys the file leaves out.
  void write_defaults() {
    struct Default {
      const char* name;
      ConfigValue value;
      const char* why;
    };
    const std::vector<Default> defaults = {
        {"job.device", std::string("cuda"), "torchtitan trains on GPUs"},
        {"training.seq_len", int64_t{2048}, "torchtitan's default"},
        {"training.steps", int64_t{10000}, "torchtitan's default"},
        {"training.mixed_precision_param", std::string("bfloat16"), "torchtitan's default"},
        {"lr_scheduler.warmup_steps", int64_t{200}, "torchtitan's default"},
        {"checkpoint.keep_latest_k", int64_t{10}, "torchtitan's default"},
        {"float8.all_gather", false, "torchtitan's enable_fsdp_float8_all_gather default"},
    };
    for (const Default& d : defaults) {
      if (has(d.name)) continue;
      set(d.name, d.value, d.why);
      result_.defaults.push_back(std::string(d.name) + " = " + toml_literal(d.value) + " (" + d.why + ")");
    }
    // torchtitan writes into dump_folder itself; smelt into dump_folder/job.name: the file's name.
    const std::string stem = std::filesystem::path(path_).stem().string();
    const ConfigField* name_field = find_field(schema_, "job", "name");
    if (!has("job.name") && !stem.empty() && check_config_rule(*name_field, ConfigValue(stem)).empty()) {
      set("job.name", stem, "the file's name: runs go to dump_folder/name");
      result_.defaults.push_back("job.name = " + toml_string(stem) + " (the file's name: runs go to dump_folder/name)");
    }
    if (!has("training.seed")) {  // torchtitan draws none; smelt needs one
      set("training.seed", int64_t{42}, "torchtitan leaves the seed unset; smelt's default");
      result_.defaults.push_back("training.seed = 42 (torchtitan leaves it unset; smelt's default)");
    }
  }

  // Notes in the file's order (those without a place first, as written).
  void by_line(std::vector<std::string>& notes) const {
    auto line = [&](const std::string& note) -> long {
      return note.rfind(path_ + ":", 0) == 0 ? std::strtol(note.c_str() + path_.size() + 1, nullptr, 10) : 0;
    };
    std::stable_sort(notes.begin(), notes.end(), [&](const std::string& a, const std::string& b) { return line(a) < line(b); });
  }

  // A comment stays on its line whatever the file held (dates, tables, odd keys).
  static std::string one_line(std::string text) {
    // TOML comments hold no control characters but tabs (quoted keys may carry any).
    std::replace_if(text.begin(), text.end(), [](char c) { return (c >= 0 && c < 0x20 && c != '\t') || c == 0x7f; }, ' ');
    return text;
  }

  std::string emit() const {
    std::ostringstream out;
    out << "# smelt config imported from torchtitan's " << one_line(path_) << " (`smelt import-config`).\n"
        << "# Keys with a comment were translated or filled in with torchtitan's defaults; check the\n"
        << "# lines marked CHECK. `smelt plan --config THIS` shows what the run will hold and how fast.\n";
    for (const std::string& section : sections_) {
      bool header = false;
      for (const ConfigField& field : schema_) {
        if (field.section != section) continue;
        auto it = settings_.find(field.name());
        if (it == settings_.end() || std::holds_alternative<std::monostate>(it->second.value)) continue;
        if (!header) out << "\n[" << section << "]\n", header = true;
        out << field.key << " = " << toml_literal(it->second.value);
        if (!it->second.comment.empty()) out << "  # " << one_line(it->second.comment);
        out << "\n";
      }
    }
    if (!result_.set_aside.empty()) {
      out << "\n# Set aside from " << one_line(path_) << " (no effect in smelt):\n";
      for (const std::string& line : result_.set_aside) out << "#   " << one_line(line) << "\n";
    }
    return out.str();
  }

  std::string path_;
  std::vector<ConfigField> schema_;
  std::vector<std::string> sections_ = config_sections();
  std::map<std::string, Setting> settings_;
  std::map<std::string, std::string> origins_;  // what in the file set each of settings_, for conflicts
  std::map<std::string, Found> found_;
  TorchtitanImport result_;
};

}  // namespace

TorchtitanImport import_torchtitan_text(const std::string& contents, const std::string& path) {
  const toml::table root = parse_config_toml(contents, path);
  return Importer(path).run(root);
}

TorchtitanImport import_torchtitan_config(const std::string& path) {
  return import_torchtitan_text(read_config_source(path), path);
}

std::string torchtitan_hint(const std::string& section, const std::string& key, const ConfigValue* value) {
  const std::string tail = "; `smelt import-config --from FILE` translates a torchtitan config into smelt's keys";
  if (value) {
    const auto* text = std::get_if<std::string>(value);
    if (!text) return "";
    if (section == "model" && key == "flavor" && smelt_flavor(*text))
      return " (\"" + *text + "\" is torchtitan's name for smelt's " + *smelt_flavor(*text) + tail + ")";
    if (section == "activation_checkpoint" && key == "mode" && (*text == "selective" || *text == "memory_budget"))
      return " (\"" + *text + "\" is torchtitan's mode" + tail + ")";
    return "";
  }
  if (!key.empty() && find_torchtitan_key(section, key))
    return " " + section + "." + key + " is torchtitan's key" + tail + ".";
  if (key.empty() && is_torchtitan_section(section)) return " [" + section + "] is torchtitan's section" + tail + ".";
  return "";
}

}  // namespace smelt
