// Reading and writing Hugging Face Llama config.json files.
#include "train/hf_config.h"

#include <cmath>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace smelt {

namespace {

// Llama-3.1's frequency scaling, the one variant smelt's rope_frequencies implements.
constexpr double kRopeFactor = 8.0, kRopeLowFrequencyFactor = 1.0, kRopeHighFrequencyFactor = 4.0;
constexpr int64_t kRopeOriginalContext = 8192;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  fail(ErrorKind::input, "Hugging Face config '" + source + "': " + what);
}

}  // namespace

HfConfig hf_config_from_json(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(source, std::string("is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad(source, "is not a JSON object");
  auto integer = [&](const char* key, int64_t fallback, bool required) -> int64_t {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) {
      if (required) bad(source, std::string("has no '") + key + "'; expected a Llama config.json");
      return fallback;
    }
    if (!it->is_number_integer() || it->get<int64_t>() <= 0 || it->get<int64_t>() > (int64_t(1) << 40))
      bad(source, std::string("'") + key + "' should be a positive integer, found " + it->dump().substr(0, 64));
    return it->get<int64_t>();
  };
  auto real = [&](const char* key, double fallback) -> double {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0)
      bad(source, std::string("'") + key + "' should be a positive number, found " + it->dump().substr(0, 64));
    return it->get<double>();
  };
  auto text_field = [&](const char* key) -> std::string {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return "";
    if (!it->is_string()) bad(source, std::string("'") + key + "' should be a string");
    return it->get<std::string>();
  };
  auto flag = [&](const char* key) -> bool {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return false;
    if (!it->is_boolean()) bad(source, std::string("'") + key + "' should be true or false");
    return it->get<bool>();
  };

  const std::string model_type = text_field("model_type");
  if (!model_type.empty() && model_type != "llama")
    bad(source, "model_type is \"" + model_type.substr(0, 64) + "\"; smelt trains Llama models (model_type \"llama\")");
  const std::string activation = text_field("hidden_act");
  if (!activation.empty() && activation != "silu")
    bad(source, "hidden_act is \"" + activation.substr(0, 64) + "\"; smelt's feed-forward uses silu");
  if (flag("attention_bias") || flag("mlp_bias")) bad(source, "has biases (attention_bias or mlp_bias); smelt's Llama has none");

  HfConfig hf;
  ModelConfig& m = hf.model;
  m.flavor = "hf";
  m.dim = integer("hidden_size", 0, true);
  m.n_layers = integer("num_hidden_layers", 0, true);
  m.n_heads = integer("num_attention_heads", 0, true);
  m.n_kv_heads = integer("num_key_value_heads", m.n_heads, false);
  m.vocab_size = integer("vocab_size", 0, true);
  m.ffn_dim = integer("intermediate_size", 0, true);
  m.norm_eps = real("rms_norm_eps", 1e-6);
  m.rope_theta = real("rope_theta", 10000.0);
  m.multiple_of = 1;
  if (m.n_heads > 0 && m.dim % m.n_heads == 0) {
    const int64_t head_dim = integer("head_dim", m.dim / m.n_heads, false);
    if (head_dim != m.dim / m.n_heads)
      bad(source, "head_dim " + std::to_string(head_dim) + " differs from hidden_size / num_attention_heads = " +
                      std::to_string(m.dim / m.n_heads) + "; smelt needs them equal");
  }
  auto scaling = j.find("rope_scaling");
  if (scaling != j.end() && !scaling->is_null()) {
    if (!scaling->is_object()) bad(source, "'rope_scaling' should be an object or null");
    std::string type;
    for (const char* key : {"rope_type", "type"})
      if (scaling->contains(key) && (*scaling)[key].is_string()) type = (*scaling)[key].get<std::string>();
    auto number = [&](const char* key) {
      return scaling->contains(key) && (*scaling)[key].is_number() ? (*scaling)[key].get<double>() : -1.0;
    };
    const bool llama31 = type == "llama3" && number("factor") == kRopeFactor &&
                         number("low_freq_factor") == kRopeLowFrequencyFactor &&
                         number("high_freq_factor") == kRopeHighFrequencyFactor &&
                         number("original_max_position_embeddings") == static_cast<double>(kRopeOriginalContext);
    if (!llama31)
      bad(source, "rope_scaling " + scaling->dump().substr(0, 200) +
                      " is not Llama-3.1's (rope_type llama3, factor 8, low_freq_factor 1, high_freq_factor 4, "
                      "original_max_position_embeddings 8192), the only scaling smelt implements");
    m.rope_scaling = true;
  }
  hf.tied_embeddings = flag("tie_word_embeddings");
  hf.max_position_embeddings = integer("max_position_embeddings", 8192, false);
  hf.torch_dtype = text_field("torch_dtype");
  // The shape rules (divisibility, limits) are the ones smelt's own model descriptions obey.
  hf.model = model_config_from_json(model_config_to_json(m), "Hugging Face config '" + source + "'");
  hf.model.multiple_of = 1;
  return hf;
}

std::string hf_config_to_json(const ModelConfig& m, int64_t max_position_embeddings, const std::string& torch_dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = m.dim;
  j["intermediate_size"] = m.ffn_dim;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.n_kv_heads;
  j["head_dim"] = m.head_dim();
  j["vocab_size"] = m.vocab_size;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  if (m.rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", kRopeFactor},
                         {"low_freq_factor", kRopeLowFrequencyFactor},
                         {"high_freq_factor", kRopeHighFrequencyFactor},
                         {"original_max_position_embeddings", kRopeOriginalContext}};
  else
    j["rope_scaling"] = nullptr;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["tie_word_embeddings"] = false;
  j["initializer_range"] = 0.02;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j.dump(2) + "\n";
}

}  // namespace smelt
