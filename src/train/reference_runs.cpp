// Reference runs: the TOML table's reading (every key checked, errors at their line) and the
// match between a benchmarked step and the runs that describe the same step.
#include "train/reference_runs.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "core/config_toml.h"
#include "core/error.h"
#include "model/fp8_linear.h"
#include "plan/checkpoint_policy.h"

namespace smelt {

const char* builtin_reference_text();  // generated from configs/reference/pytorch_h200.toml

namespace {

const char* kFormatHint = "see configs/reference/pytorch_h200.toml for the format";

class TableReader {
 public:
  explicit TableReader(std::string path) : path_(std::move(path)) {}

  std::string at(const toml::node& node) const { return toml_location(path_, node.source()); }

  [[noreturn]] void error(const toml::node& node, const std::string& message) const {
    fail(ErrorKind::config, at(node) + ": " + message);
  }

  // Every key of `table` must be one of `known`.
  void only(const toml::table& table, const std::set<std::string>& known, const std::string& what) const {
    for (const auto& [key, value] : table) {
      if (known.count(std::string(key.str()))) continue;
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      fail(ErrorKind::config, toml_location(path_, key.source()) + ": unknown key '" + std::string(key.str()) +
                                  "' in " + what + "; expected one of: " + list);
    }
  }

  const toml::node& required(const toml::table& table, const std::string& key, const std::string& what) const {
    const toml::node* node = table.get(key);
    if (!node) error(table, what + " has no '" + key + "'; add it (" + kFormatHint + ")");
    return *node;
  }

  std::string text(const toml::node& node, const std::string& key) const {
    if (!node.is_string()) error(node, "'" + key + "' must be a string in quotes");
    return node.as_string()->get();
  }

  int64_t positive_integer(const toml::node& node, const std::string& key) const {
    if (!node.is_integer() || node.as_integer()->get() <= 0)
      error(node, "'" + key + "' must be a positive integer, e.g. " + key + " = 8");
    return node.as_integer()->get();
  }

  double positive_number(const toml::node& node, const std::string& key) const {
    double value = 0;
    if (node.is_integer()) value = static_cast<double>(node.as_integer()->get());
    else if (node.is_floating_point()) value = node.as_floating_point()->get();
    else error(node, "'" + key + "' must be a number");
    if (!(value > 0)) error(node, "'" + key + "' must be positive, found " + std::to_string(value));
    return value;
  }

  ReferenceModel model(const std::string& name, const toml::node& node) const {
    if (!node.is_table()) error(node, "[models." + name + "] must be a table of the model's shapes");
    const toml::table& table = *node.as_table();
    const std::string what = "[models." + name + "]";
    only(table, {"dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"}, what);
    ReferenceModel m;
    m.name = name;
    m.dim = positive_integer(required(table, "dim", what), "dim");
    m.n_layers = positive_integer(required(table, "n_layers", what), "n_layers");
    m.n_heads = positive_integer(required(table, "n_heads", what), "n_heads");
    m.n_kv_heads = positive_integer(required(table, "n_kv_heads", what), "n_kv_heads");
    m.ffn_dim = positive_integer(required(table, "ffn_dim", what), "ffn_dim");
    m.vocab_size = positive_integer(required(table, "vocab_size", what), "vocab_size");
    return m;
  }

  ReferenceRun run(const toml::table& table, const std::map<std::string, ReferenceModel>& models) const {
    const std::string what = "a [[runs]] entry";
    only(table, {"model", "batch", "seq_len", "precision", "activation_checkpoint", "fusion", "compile",
                 "tokens_per_second", "peak_gb"},
         what);
    ReferenceRun r;
    r.place = at(table);
    const toml::node& model_node = required(table, "model", what);
    const std::string model = text(model_node, "model");
    auto found = models.find(model);
    if (found == models.end()) {
      std::string list;
      for (const auto& [name, shapes] : models) list += (list.empty() ? "" : ", ") + name;
      error(model_node, "model '" + model + "' is not among the [models.*] tables (" +
                            (list.empty() ? std::string("none") : list) + "); add [models." + model + "]");
    }
    r.model = found->second;
    r.batch = positive_integer(required(table, "batch", what), "batch");
    r.seq_len = positive_integer(required(table, "seq_len", what), "seq_len");
    const toml::node& precision = required(table, "precision", what);
    r.precision = text(precision, "precision");
    const bool float8 = r.precision.rfind("fp8-", 0) == 0;
    if (float8) {
      try {
        parse_float8_recipe(r.precision.substr(4));
      } catch (const Error& e) {
        error(precision, "precision '" + r.precision + "': " + e.what());
      }
    } else if (r.precision != "bf16" && r.precision != "f32") {
      error(precision, "precision must be bf16, f32 or fp8-<recipe> (fp8-tensorwise, ...), found '" + r.precision + "'");
    }
    const toml::node& policy_node = required(table, "activation_checkpoint", what);
    const std::string policy_text = text(policy_node, "activation_checkpoint");
    CheckpointPolicy policy;
    try {
      policy = parse_checkpoint_policy(policy_text);
    } catch (const Error& e) {
      error(policy_node, "activation_checkpoint '" + policy_text + "': " + e.what());
    }
    if (policy.mode == CheckpointMode::automatic)
      error(policy_node, "activation_checkpoint 'auto' describes no fixed step; name the policy the run used");
    r.activation_checkpoint = policy.str();
    if (const toml::node* fusion = table.get("fusion")) {
      r.fusion = text(*fusion, "fusion");
      if (!float8) error(*fusion, "'fusion' applies to float8 runs only (precision fp8-<recipe>); remove it");
      if (r.fusion != "full" && r.fusion != "linear") error(*fusion, "fusion must be \"full\" or \"linear\", found '" + r.fusion + "'");
    }
    if (const toml::node* compile = table.get("compile")) r.compile = text(*compile, "compile");
    r.tokens_per_second = positive_number(required(table, "tokens_per_second", what), "tokens_per_second");
    if (const toml::node* peak = table.get("peak_gb")) r.peak_gb = positive_number(*peak, "peak_gb");
    return r;
  }

 private:
  std::string path_;
};

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

bool same_shapes(const ReferenceModel& a, const ReferenceModel& b) {
  return a.dim == b.dim && a.n_layers == b.n_layers && a.n_heads == b.n_heads && a.n_kv_heads == b.n_kv_heads &&
         a.ffn_dim == b.ffn_dim && a.vocab_size == b.vocab_size;
}

}  // namespace

ReferenceTable parse_reference_table(const std::string& text, const std::string& path) {
  const toml::table document = parse_config_toml(text, path);
  TableReader reader(path);
  reader.only(document, {"source", "gpu", "models", "runs"}, "a reference table");
  ReferenceTable table;
  table.path = path;
  table.source = reader.text(reader.required(document, "source", "the reference table"), "source");
  table.gpu = reader.text(reader.required(document, "gpu", "the reference table"), "gpu");
  if (table.gpu.empty()) reader.error(*document.get("gpu"), "'gpu' is empty; write the GPU the runs were on, e.g. gpu = \"H200\"");
  std::map<std::string, ReferenceModel> models;
  if (const toml::node* node = document.get("models")) {
    if (!node->is_table()) reader.error(*node, "'models' must be tables: [models.NAME] with the model's shapes");
    for (const auto& [name, shapes] : *node->as_table()) models[std::string(name.str())] = reader.model(std::string(name.str()), shapes);
  }
  const toml::node& runs = reader.required(document, "runs", "the reference table");
  if (!runs.is_array_of_tables()) reader.error(runs, "'runs' must be [[runs]] entries");
  for (const auto& entry : *runs.as_array()) table.runs.push_back(reader.run(*entry.as_table(), models));
  return table;
}

ReferenceTable load_reference_table(const std::string& path) {
  std::error_code status;
  if (!std::filesystem::is_regular_file(path, status))
    fail(ErrorKind::config, "reference table '" + path + "' " +
                                (std::filesystem::exists(path, status) ? "is not a file" : "does not exist") +
                                "; expected a TOML file such as configs/reference/pytorch_h200.toml, or --reference none");
  std::ifstream stream(path, std::ios::binary);
  std::ostringstream contents;
  contents << stream.rdbuf();
  if (!stream) fail(ErrorKind::config, "cannot read reference table '" + path + "'; check its permissions");
  return parse_reference_table(contents.str(), path);
}

ReferenceTable builtin_reference_table() {
  return parse_reference_table(builtin_reference_text(), "configs/reference/pytorch_h200.toml (built in)");
}

std::string precision_label(const JobConfig& config) {
  if (config.float8.recipe != "none") return "fp8-" + config.float8.recipe;
  return std::string(dtype_name(parse_dtype(config.training.mixed_precision_param)));
}

ReferenceQuery reference_query(const JobConfig& config, const ModelConfig& m, const StepPlan& plan,
                               const std::string& gpu_name, int world_size) {
  ReferenceQuery q;
  q.gpu_name = gpu_name;
  q.model = {m.flavor, m.dim, m.n_layers, m.n_heads, m.n_kv_heads, m.ffn_dim, m.vocab_size};
  q.batch = plan.options.shape.batch;
  q.seq_len = plan.options.shape.seq_len;
  q.precision = precision_label(config);
  q.activation_checkpoint = plan.options.policy.str();
  q.fusion = config.float8.fusion;
  q.all_block_linears_in_float8 = plan.block_linears().all_float8();
  q.single_device_step = world_size == 1 && !plan.data_parallel() && plan.options.microbatches == 1;
  return q;
}

std::optional<ReferenceRun> find_reference(const ReferenceTable& table, const ReferenceQuery& query) {
  const bool float8 = query.precision.rfind("fp8-", 0) == 0;
  if (!query.single_device_step || (float8 && !query.all_block_linears_in_float8)) return std::nullopt;
  if (lower(query.gpu_name).find(lower(table.gpu)) == std::string::npos) return std::nullopt;
  std::optional<ReferenceRun> best;
  for (const auto& run : table.runs) {
    if (!same_shapes(run.model, query.model) || run.batch != query.batch || run.seq_len != query.seq_len ||
        run.precision != query.precision || run.activation_checkpoint != query.activation_checkpoint)
      continue;
    if (float8 && !run.fusion.empty() && run.fusion != query.fusion) continue;
    if (!best || run.tokens_per_second > best->tokens_per_second) best = run;
  }
  return best;
}

std::string compare_with_reference(const std::string& source, const ReferenceRun& run, const std::string& label,
                                   double tokens_per_second, double bytes) {
  char line[512];
  std::snprintf(line, sizeof line, "reference: %s (compile %s; %s): %.0f tokens/s", source.c_str(),
                run.compile.empty() ? "-" : run.compile.c_str(), run.place.c_str(), run.tokens_per_second);
  std::string text = line;
  if (run.peak_gb > 0) {
    std::snprintf(line, sizeof line, " at %.1f GB peak", run.peak_gb);
    text += line;
  }
  std::snprintf(line, sizeof line, "; %s %.2fx its tokens/s", label.c_str(), tokens_per_second / run.tokens_per_second);
  text += line;
  if (run.peak_gb > 0 && bytes > 0) {
    const double difference = run.peak_gb - bytes / 1e9;
    std::snprintf(line, sizeof line, ", %.1f GB %s memory", std::abs(difference), difference >= 0 ? "less" : "more");
    text += line;
  }
  return text;
}

nlohmann::json reference_run_json(const std::string& source, const ReferenceRun& run) {
  const ReferenceModel& m = run.model;
  return {{"source", source},
          {"entry", run.place},
          {"compile", run.compile},
          {"tokens_per_second", run.tokens_per_second},
          {"peak_gb", run.peak_gb},
          {"model",
           {{"name", m.name},
            {"dim", m.dim},
            {"n_layers", m.n_layers},
            {"n_heads", m.n_heads},
            {"n_kv_heads", m.n_kv_heads},
            {"ffn_dim", m.ffn_dim},
            {"vocab_size", m.vocab_size}}},
          {"batch", run.batch},
          {"seq_len", run.seq_len},
          {"precision", run.precision},
          {"activation_checkpoint", run.activation_checkpoint},
          {"fusion", run.fusion}};
}

ReferenceRun reference_run_from_json(const nlohmann::json& j) {
  ReferenceRun run;
  run.place = j.value("entry", "");
  run.compile = j.value("compile", "");
  run.tokens_per_second = j.value("tokens_per_second", 0.0);
  run.peak_gb = j.value("peak_gb", 0.0);
  if (j.contains("model") && j["model"].is_object()) {
    const auto& m = j["model"];
    run.model = {m.value("name", ""),       m.value("dim", int64_t{0}),     m.value("n_layers", int64_t{0}),
                 m.value("n_heads", int64_t{0}), m.value("n_kv_heads", int64_t{0}), m.value("ffn_dim", int64_t{0}),
                 m.value("vocab_size", int64_t{0})};
  }
  run.batch = j.value("batch", int64_t{0});
  run.seq_len = j.value("seq_len", int64_t{0});
  run.precision = j.value("precision", "");
  run.activation_checkpoint = j.value("activation_checkpoint", "");
  run.fusion = j.value("fusion", "");
  return run;
}

}  // namespace smelt
