// The config schema table (one line per `section.key`), its rules, and the text forms of
// config values: how they are parsed from the command line and printed in messages.
#include "core/config_schema.h"

#include <charconv>
#include <cmath>

namespace smelt {
namespace {

// ---- binding a JobConfig member to a schema entry ----

template <class Field>
constexpr ConfigType type_of() {
  if constexpr (std::is_same_v<Field, int64_t>)
    return ConfigType::integer;
  else if constexpr (std::is_same_v<Field, double>)
    return ConfigType::real;
  else if constexpr (std::is_same_v<Field, bool>)
    return ConfigType::boolean;
  else if constexpr (std::is_same_v<Field, std::string>)
    return ConfigType::text;
  else if constexpr (std::is_same_v<Field, std::vector<std::string>>)
    return ConfigType::text_list;
  else if constexpr (std::is_same_v<Field, std::optional<double>>)
    return ConfigType::optional_real;
  else {
    static_assert(std::is_same_v<Field, std::optional<bool>>, "no ConfigType for this field type");
    return ConfigType::optional_boolean;
  }
}

template <class Field>
ConfigValue to_value(const Field& field) {
  if constexpr (std::is_same_v<Field, std::optional<double>> || std::is_same_v<Field, std::optional<bool>>) {
    if (!field) return std::monostate{};
    return ConfigValue(*field);
  } else {
    return ConfigValue(field);
  }
}

template <class Field>
void from_value(const ConfigValue& value, Field& field) {
  if constexpr (std::is_same_v<Field, std::optional<double>>) {
    if (std::holds_alternative<std::monostate>(value))
      field.reset();
    else
      field = std::get<double>(value);
  } else if constexpr (std::is_same_v<Field, std::optional<bool>>) {
    if (std::holds_alternative<std::monostate>(value))
      field.reset();
    else
      field = std::get<bool>(value);
  } else {
    field = std::get<Field>(value);
  }
}

template <class Section, class Field>
ConfigField bind(const char* section, const char* key, Section JobConfig::*part, Field Section::*member,
                 const char* help, ConfigRule rule = {}) {
  ConfigField field;
  field.section = section;
  field.key = key;
  field.type = type_of<Field>();
  field.help = help;
  field.rule = std::move(rule);
  field.get = [part, member](const JobConfig& config) { return to_value(config.*part.*member); };
  field.set = [part, member](JobConfig& config, const ConfigValue& value) {
    from_value(value, config.*part.*member);
  };
  return field;
}

// ---- rule shorthands ----

ConfigRule at_least(double minimum) { return ConfigRule{.minimum = minimum}; }
ConfigRule above(double minimum) { return ConfigRule{.minimum = minimum, .minimum_exclusive = true}; }
ConfigRule between(double minimum, double maximum) {
  return ConfigRule{.minimum = minimum, .maximum = maximum};
}
ConfigRule one_of(std::vector<std::string> choices) { return ConfigRule{.choices = std::move(choices)}; }
ConfigRule not_empty() { return ConfigRule{.nonempty = true}; }

// The checkpoint policy: a named mode, or "selective-layer:N" with N >= 1.
bool is_checkpoint_mode(const std::string& mode) {
  if (mode == "none" || mode == "full" || mode == "selective-op" || mode == "auto") return true;
  const std::string prefix = "selective-layer:";
  if (mode.rfind(prefix, 0) != 0) return false;
  const char* first = mode.data() + prefix.size();
  const char* last = mode.data() + mode.size();
  int64_t every = 0;
  auto [end, error] = std::from_chars(first, last, every);
  return error == std::errc() && end == last && first != last && every >= 1;
}

// A run name becomes a folder name: no path separators.
bool is_run_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

// The shortest text that reads back as the same double.
std::string format_number(double number) {
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), number);
  return error == std::errc() ? std::string(buffer, end) : std::to_string(number);
}

std::string trim(const std::string& text) {
  const char* space = " \t\r\n";
  size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  size_t last = text.find_last_not_of(space);
  return text.substr(first, last - first + 1);
}

}  // namespace

std::vector<ConfigField> config_schema() {
  using C = JobConfig;
  std::vector<ConfigField> fields = {
      bind("job", "name", &C::job, &JobSection::name, "run name: the run folder is dump_folder/name",
           ConfigRule{.accepts = is_run_name, .pattern = "a non-empty name without '/'"}),
      bind("job", "description", &C::job, &JobSection::description, "free text describing the run"),
      bind("job", "dump_folder", &C::job, &JobSection::dump_folder, "where run folders go", not_empty()),
      bind("job", "device", &C::job, &JobSection::device, "backend to train on", one_of({"cpu", "cuda"})),

      bind("model", "name", &C::model, &ModelSection::name, "model family", one_of({"llama3"})),
      bind("model", "flavor", &C::model, &ModelSection::flavor, "model size preset",
           one_of({"debugmodel", "llama3_1b", "llama3_8b", "llama3_70b", "llama3_405b"})),
      bind("model", "dim", &C::model, &ModelSection::dim, "hidden dim; 0: from the preset", at_least(0)),
      bind("model", "n_layers", &C::model, &ModelSection::n_layers, "transformer blocks; 0: from the preset",
           at_least(0)),
      bind("model", "n_heads", &C::model, &ModelSection::n_heads, "attention heads; 0: from the preset",
           at_least(0)),
      bind("model", "n_kv_heads", &C::model, &ModelSection::n_kv_heads, "key/value heads; 0: from the preset",
           at_least(0)),
      bind("model", "vocab_size", &C::model, &ModelSection::vocab_size,
           "vocabulary size; 0: from the tokenizer", at_least(0)),
      bind("model", "ffn_dim", &C::model, &ModelSection::ffn_dim,
           "feed-forward hidden dim; 0: from dim, ffn_dim_multiplier and multiple_of", at_least(0)),
      bind("model", "ffn_dim_multiplier", &C::model, &ModelSection::ffn_dim_multiplier,
           "scales the feed-forward dim; unset: from the preset", above(0)),
      bind("model", "multiple_of", &C::model, &ModelSection::multiple_of,
           "feed-forward dim is rounded up to this; 0: from the preset", at_least(0)),
      bind("model", "norm_eps", &C::model, &ModelSection::norm_eps, "RMSNorm epsilon; 0: from the preset",
           at_least(0)),
      bind("model", "rope_theta", &C::model, &ModelSection::rope_theta, "RoPE base; 0: from the preset",
           at_least(0)),
      bind("model", "rope_scaling", &C::model, &ModelSection::rope_scaling,
           "Llama-3.1 RoPE frequency scaling; unset: from the preset"),
      bind("model", "tokenizer_path", &C::model, &ModelSection::tokenizer_path,
           "\"byte\" (built-in byte tokenizer) or a tiktoken file", not_empty()),

      bind("training", "local_batch_size", &C::training, &TrainingSection::local_batch_size,
           "sequences per step on each device", at_least(1)),
      bind("training", "global_batch_size", &C::training, &TrainingSection::global_batch_size,
           "sequences per optimizer step over all ranks; -1: local_batch_size x data-parallel ranks. A "
           "multiple of that accumulates gradients over global_batch_size / (local_batch_size x ranks) "
           "forward-backward passes per step, in the memory of one (runs of one rank)",
           ConfigRule{.minimum = 1.0, .sentinel = -1.0}),
      bind("training", "seq_len", &C::training, &TrainingSection::seq_len, "tokens per sequence",
           at_least(1)),
      bind("training", "steps", &C::training, &TrainingSection::steps, "optimizer steps to train",
           at_least(1)),
      bind("training", "max_norm", &C::training, &TrainingSection::max_norm,
           "global gradient-norm clip; 0 disables", at_least(0)),
      bind("training", "seed", &C::training, &TrainingSection::seed, "random seed for weights and data order",
           at_least(0)),
      bind("training", "dataset_path", &C::training, &TrainingSection::dataset_path,
           "a folder or file of text, or of token shards (*.tok, `smelt prepare`)", not_empty()),
      bind("training", "mixed_precision_param", &C::training, &TrainingSection::mixed_precision_param,
           "activation and compute-weight dtype", one_of({"float32", "bfloat16"})),
      bind("training", "linear_grad_dtype", &C::training, &TrainingSection::linear_grad_dtype,
           "dtype the block linears' weight gradients are kept in: bfloat16 is what their grad-weight GEMMs "
           "round to in PyTorch's mixed precision, in half the memory, read in half the time by the gradient "
           "norm and AdamW; so is the output projection's when the loss head runs in one chunk "
           "(loss_chunk_tokens >= tokens per step), the embedding's and norms' stay float32. auto: bfloat16 "
           "when mixed_precision_param is bfloat16, the run is not data parallel (FSDP and replicas "
           "reduce in parallelism.reduce_dtype) and does not accumulate gradients (global_batch_size), "
           "float32 otherwise",
           one_of({"auto", "float32", "bfloat16"})),
      bind("training", "output_weight_copy", &C::training, &TrainingSection::output_weight_copy,
           "the output projection's bfloat16 copy (runs of one whole model per rank with mixed_precision_param "
           "bfloat16): persistent (written by the optimizer with the other weights' copies, held across the "
           "step), per_step (cast from the float32 master by the output head, held only there: one more pass "
           "over the master per step), auto (default): persistent where that raises no peak, i.e. where the "
           "output head is the step's peak",
           one_of({"auto", "persistent", "per_step"})),
      bind("training", "loss_chunk_tokens", &C::training, &TrainingSection::loss_chunk_tokens,
           "rows of the output projection computed at once: each doubling adds a chunk of bf16 logits "
           "(V x chunk) and halves the passes over the output projection's f32 gradient; 0 (default): "
           "the largest of 2048, 4096, 8192 and one chunk (a step of at most 8192 tokens) whose arena is "
           "at most 2% above 2048's and within the memory budget; `smelt plan` lists each with its "
           "memory and time (one chunk with bf16 linear gradients writes the output projection's gradient "
           "once, in bf16)",
           at_least(0)),
      bind("training", "cuda_graph", &C::training, &TrainingSection::cuda_graph,
           "CUDA: capture the forward and backward once as a CUDA graph and replay it every step"),
      bind("training", "gemm_autotune", &C::training, &TrainingSection::gemm_autotune,
           "CUDA: on a GEMM shape's first call, time cuBLASLt's candidate algorithms (up to 8) and keep the "
           "fastest; off takes the heuristic's first choice. The choice can differ between processes, so a "
           "resumed run matches the uninterrupted one to rounding, not bit for bit"),
      bind("training", "on_nonfinite", &C::training, &TrainingSection::on_nonfinite,
           "non-finite loss or gradient norm: skip the update, or stop the run", one_of({"skip", "stop"})),
      bind("training", "loss_spike_window", &C::training, &TrainingSection::loss_spike_window,
           "recent losses a spike is judged against; 0 disables spike detection", at_least(0)),
      bind("training", "loss_spike_zscore", &C::training, &TrainingSection::loss_spike_zscore,
           "a loss this many standard deviations above the window's mean is a spike", above(0)),
      bind("training", "on_loss_spike", &C::training, &TrainingSection::on_loss_spike,
           "loss spike: skip the update, or stop the run", one_of({"skip", "stop"})),
      bind("training", "max_consecutive_skips", &C::training, &TrainingSection::max_consecutive_skips,
           "more skipped updates in a row than this stops the run", at_least(1)),

      bind("optimizer", "name", &C::optimizer, &OptimizerSection::name, "optimizer", one_of({"AdamW"})),
      bind("optimizer", "lr", &C::optimizer, &OptimizerSection::lr, "peak learning rate", at_least(0)),
      bind("optimizer", "eps", &C::optimizer, &OptimizerSection::eps, "AdamW epsilon", above(0)),
      bind("optimizer", "beta1", &C::optimizer, &OptimizerSection::beta1, "AdamW first-moment decay",
           ConfigRule{.minimum = 0.0, .maximum = 1.0, .maximum_exclusive = true}),
      bind("optimizer", "beta2", &C::optimizer, &OptimizerSection::beta2, "AdamW second-moment decay",
           ConfigRule{.minimum = 0.0, .maximum = 1.0, .maximum_exclusive = true}),
      bind("optimizer", "weight_decay", &C::optimizer, &OptimizerSection::weight_decay,
           "decoupled weight decay", at_least(0)),

      bind("lr_scheduler", "warmup_steps", &C::lr_scheduler, &LrSchedulerSection::warmup_steps,
           "steps of linear warmup", at_least(0)),
      bind("lr_scheduler", "decay_ratio", &C::lr_scheduler, &LrSchedulerSection::decay_ratio,
           "fraction of steps spent decaying at the end; negative: all steps after warmup",
           ConfigRule{.maximum = 1.0}),
      bind("lr_scheduler", "decay_type", &C::lr_scheduler, &LrSchedulerSection::decay_type,
           "shape of the decay", one_of({"linear", "cosine", "sqrt"})),
      bind("lr_scheduler", "min_lr_factor", &C::lr_scheduler, &LrSchedulerSection::min_lr_factor,
           "final lr = lr * min_lr_factor", between(0, 1)),

      bind("activation_checkpoint", "mode", &C::activation_checkpoint, &ActivationCheckpointSection::mode,
           "which activations are recomputed in backward",
           ConfigRule{.accepts = is_checkpoint_mode,
                      .pattern = "one of: none, full, selective-op, auto, selective-layer:N with N >= 1"}),
      bind("activation_checkpoint", "memory_budget_gb", &C::activation_checkpoint,
           &ActivationCheckpointSection::memory_budget_gb,
           "memory budget for mode auto; 0: device memory minus a margin", at_least(0)),
      bind("activation_checkpoint", "op_timings", &C::activation_checkpoint, &ActivationCheckpointSection::op_timings,
           "per-op timings measured on this GPU (smelt bench --trace T --calibrate FILE) for auto's cost model; "
           "empty: FLOP and byte ceilings"),

      bind("float8", "recipe", &C::float8, &Float8Section::recipe,
           "which GEMMs run in float8, with which scaling",
           one_of({"none", "tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"})),
      bind("float8", "filter_fqns", &C::float8, &Float8Section::filter_fqns,
           "linear layers (by name) kept out of float8; \"auto_filter_small_kn\" also keeps those too small to "
           "gain (torchao's size thresholds per recipe)"),
      bind("float8", "fusion", &C::float8, &Float8Section::fusion,
           "full: with tensorwise scaling, the amax of w2's input and of w1's and w3's output gradients is "
           "taken by SwiGLU forward and backward in the same pass, so those casts skip their amax pass (other "
           "recipes: as linear); linear: standalone amax and cast kernels inside the float8 linears (one input "
           "read by consecutive linears is cast once)",
           one_of({"full", "linear"})),
      bind("float8", "save_inputs_in_float8", &C::float8, &Float8Section::save_inputs_in_float8,
           "keep a float8 linear's input for the backward as the grad-weight GEMM's float8 x^T, written by the "
           "forward, instead of in bf16 (half the bytes; the same values), where only float8 linears read it "
           "there: the norms' and SwiGLU's outputs, when kept; recipes with a bf16 grad-weight GEMM keep bf16"),
      bind("float8", "keep_transposed_weights", &C::float8, &Float8Section::keep_transposed_weights,
           "tensorwise: keep a float8 W^T copy of every float8 linear beside W (1 byte per parameter more) "
           "instead of transposing W's codes into scratch at each backward use (the same bytes); the other "
           "recipes always keep W^T, whose scales are its own"),
      bind("float8", "all_gather", &C::float8, &Float8Section::all_gather,
           "sharded runs with the tensorwise recipe: all-gather float8 linears' weights in e4m3 (scales from "
           "one all-reduce of every weight's amax) instead of bf16; other recipes gather in bf16"),

      bind("parallelism", "data_parallel_shard_degree", &C::parallelism,
           &ParallelismSection::data_parallel_shard_degree,
           "FSDP ranks the weights are sharded over; -1: the ranks left after replication (WORLD_SIZE / "
           "data_parallel_replicate_degree; 1 outside a launch)",
           ConfigRule{.minimum = 1.0, .sentinel = -1.0}),
      bind("parallelism", "data_parallel_replicate_degree", &C::parallelism,
           &ParallelismSection::data_parallel_replicate_degree,
           "data-parallel replicas: plain data parallel (shard degree 1) or HSDP (replicas of shard groups); "
           "shard degree x replicate degree must equal the number of ranks", at_least(1)),
      bind("parallelism", "reduce_dtype", &C::parallelism, &ParallelismSection::reduce_dtype,
           "dtype gradients are reduce-scattered in (FSDP); the optimizer's shards stay float32",
           one_of({"float32", "bfloat16"})),
      bind("parallelism", "shard_single_rank", &C::parallelism, &ParallelismSection::shard_single_rank,
           "run the FSDP schedule (gathers, reduce-scatters) even on one rank, to measure its cost"),
      bind("parallelism", "reshard_after_forward_policy", &C::parallelism,
           &ParallelismSection::reshard_after_forward_policy,
           "FSDP: 'default' and 'always' gather each block's weights again for its backward; 'never' keeps them "
           "gathered from forward to backward (a buffer per block, no backward gathers)",
           one_of({"default", "always", "never"})),

      bind("checkpoint", "enable", &C::checkpoint, &CheckpointSection::enable, "write checkpoints"),
      bind("checkpoint", "folder", &C::checkpoint, &CheckpointSection::folder,
           "checkpoint folder, inside the run folder", not_empty()),
      bind("checkpoint", "interval", &C::checkpoint, &CheckpointSection::interval,
           "steps between checkpoints", at_least(1)),
      bind("checkpoint", "keep_latest_k", &C::checkpoint, &CheckpointSection::keep_latest_k,
           "checkpoints kept; 0 keeps all", at_least(0)),
      bind("checkpoint", "load", &C::checkpoint, &CheckpointSection::load,
           "checkpoint, folder of checkpoints or Hugging Face folder to start from; empty: the newest "
           "checkpoint in checkpoint.folder, if any"),
      bind("checkpoint", "async", &C::checkpoint, &CheckpointSection::async,
           "write checkpoints in a background thread while training continues"),

      bind("metrics", "log_freq", &C::metrics, &MetricsSection::log_freq, "steps between metric lines",
           at_least(1)),
      bind("metrics", "enable_tensorboard", &C::metrics, &MetricsSection::enable_tensorboard,
           "also write TensorBoard event files"),

      bind("validation", "enable", &C::validation, &ValidationSection::enable,
           "run validation during training"),
      bind("validation", "freq", &C::validation, &ValidationSection::freq, "steps between validations",
           at_least(1)),
      bind("validation", "steps", &C::validation, &ValidationSection::steps, "batches per validation",
           at_least(1)),
      bind("validation", "dataset_path", &C::validation, &ValidationSection::dataset_path,
           "validation data of its own: text, or token shards (their validation split if they have one); "
           "empty: the held-out part of training.dataset_path (with it, training text is all for training)"),

      bind("profiling", "enable_profiling", &C::profiling, &ProfilingSection::enable_profiling,
           "write a Chrome trace of the steps"),
      bind("profiling", "trace_file", &C::profiling, &ProfilingSection::trace_file,
           "trace file; empty: trace.json in the run folder"),
  };
  return fields;
}

std::vector<std::string> config_sections() {
  std::vector<std::string> sections;
  for (const ConfigField& field : config_schema())
    if (sections.empty() || sections.back() != field.section) sections.push_back(field.section);
  return sections;
}

std::string config_type_name(ConfigType type) {
  switch (type) {
    case ConfigType::integer:
      return "int";
    case ConfigType::real:
      return "float";
    case ConfigType::boolean:
      return "bool";
    case ConfigType::text:
      return "string";
    case ConfigType::text_list:
      return "string list";
    case ConfigType::optional_real:
      return "float (optional)";
    case ConfigType::optional_boolean:
      return "bool (optional)";
  }
  return "unknown";
}

std::string describe_config_rule(const ConfigRule& rule) {
  if (!rule.pattern.empty()) return rule.pattern;
  if (!rule.choices.empty()) {
    std::string text = "one of: ";
    for (size_t i = 0; i < rule.choices.size(); ++i) text += (i ? ", " : "") + rule.choices[i];
    return text;
  }
  std::string low =
      rule.minimum ? (rule.minimum_exclusive ? "> " : ">= ") + format_number(*rule.minimum) : "";
  std::string high =
      rule.maximum ? (rule.maximum_exclusive ? "< " : "<= ") + format_number(*rule.maximum) : "";
  if (rule.minimum && rule.maximum) {
    return "in " + std::string(rule.minimum_exclusive ? "(" : "[") + format_number(*rule.minimum) + ", " +
           format_number(*rule.maximum) + (rule.maximum_exclusive ? ")" : "]");
  }
  if (!low.empty()) return low + (rule.sentinel ? " or " + format_number(*rule.sentinel) : "");
  if (!high.empty()) return high;
  if (rule.nonempty) return "not empty";
  return "";
}

std::string check_config_rule(const ConfigField& field, const ConfigValue& value) {
  const ConfigRule& rule = field.rule;
  std::string expected = describe_config_rule(rule);
  auto complaint = [&](const std::string& found) {
    bool is_range =
        expected.rfind("in ", 0) == 0 || expected.rfind(">", 0) == 0 || expected.rfind("<", 0) == 0;
    return "expected " + std::string(is_range ? "a value " : "") + expected + ", found " + found;
  };
  if (const auto* text = std::get_if<std::string>(&value)) {
    if (rule.nonempty && text->empty()) return complaint("an empty string");
    if (!rule.choices.empty()) {
      bool known = false;
      for (const std::string& choice : rule.choices) known = known || choice == *text;
      if (!known) return complaint(format_config_value(value));
    }
    if (rule.accepts && !rule.accepts(*text)) return complaint(format_config_value(value));
    return "";
  }
  std::optional<double> number;
  if (const auto* integer = std::get_if<int64_t>(&value)) number = static_cast<double>(*integer);
  if (const auto* real = std::get_if<double>(&value)) {
    if (!std::isfinite(*real)) {
      expected = "a finite number" + (expected.empty() ? "" : " " + expected);
      return complaint(format_config_value(value));
    }
    number = *real;
  }
  if (number) {
    bool too_low =
        rule.minimum && (rule.minimum_exclusive ? *number <= *rule.minimum : *number < *rule.minimum);
    bool too_high =
        rule.maximum && (rule.maximum_exclusive ? *number >= *rule.maximum : *number > *rule.maximum);
    if ((too_low || too_high) && !(rule.sentinel && *number == *rule.sentinel))
      return complaint(format_config_value(value));
  }
  return "";
}

std::string format_config_value(const ConfigValue& value) {
  struct Printer {
    std::string operator()(std::monostate) const { return "unset"; }
    std::string operator()(int64_t integer) const { return std::to_string(integer); }
    std::string operator()(double real) const {
      if (std::isnan(real)) return "nan";
      if (std::isinf(real)) return real > 0 ? "inf" : "-inf";
      std::string text = format_number(real);
      bool looks_integral = text.find_first_of(".eEn") == std::string::npos;
      return looks_integral ? text + ".0" : text;
    }
    std::string operator()(bool flag) const { return flag ? "true" : "false"; }
    std::string operator()(const std::string& text) const { return "\"" + text + "\""; }
    std::string operator()(const std::vector<std::string>& list) const {
      std::string text = "[";
      for (size_t i = 0; i < list.size(); ++i) text += (i ? ", \"" : "\"") + list[i] + "\"";
      return text + "]";
    }
  };
  return std::visit(Printer{}, value);
}

std::optional<ConfigValue> parse_config_text(ConfigType type, const std::string& text, std::string& problem) {
  const std::string value = trim(text);
  const char* first = value.data();
  const char* last = value.data() + value.size();
  auto parse_integer = [&]() -> std::optional<ConfigValue> {
    int64_t integer = 0;
    auto [end, error] = std::from_chars(first, last, integer);
    if (error == std::errc::result_out_of_range) {
      problem = "expected an integer that fits in 64 bits, found \"" + value + "\"";
      return std::nullopt;
    }
    if (error != std::errc() || end != last || value.empty()) {
      problem = "expected an integer such as 8 (no decimal point), found \"" + value + "\"";
      return std::nullopt;
    }
    return ConfigValue(integer);
  };
  auto parse_real = [&]() -> std::optional<ConfigValue> {
    double real = 0;
    const char* start = (first != last && *first == '+') ? first + 1 : first;
    auto [end, error] = std::from_chars(start, last, real);
    if (error != std::errc() || end != last || value.empty() || !std::isfinite(real)) {
      problem = "expected a finite number such as 0.5 or 1e-4, found \"" + value + "\"";
      return std::nullopt;
    }
    return ConfigValue(real);
  };
  auto parse_boolean = [&]() -> std::optional<ConfigValue> {
    if (value == "true") return ConfigValue(true);
    if (value == "false") return ConfigValue(false);
    problem = "expected true or false, found \"" + value + "\"";
    return std::nullopt;
  };
  switch (type) {
    case ConfigType::integer:
      return parse_integer();
    case ConfigType::real:
      return parse_real();
    case ConfigType::boolean:
      return parse_boolean();
    case ConfigType::optional_real:
      if (value == "none") return ConfigValue(std::monostate{});
      return parse_real();
    case ConfigType::optional_boolean:
      if (value == "none") return ConfigValue(std::monostate{});
      return parse_boolean();
    case ConfigType::text:
      return ConfigValue(text);
    case ConfigType::text_list: {
      std::vector<std::string> list;
      if (value.empty()) return ConfigValue(list);
      size_t start = 0;
      while (true) {
        size_t comma = value.find(',', start);
        list.push_back(
            trim(value.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
      return ConfigValue(list);
    }
  }
  problem = "unknown config type";
  return std::nullopt;
}

}  // namespace smelt
