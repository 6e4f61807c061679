// Llama-3 presets as torchtitan names them, and their derived sizes.
#include "model/model_config.h"

#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace smelt {

int64_t llama_ffn_dim(int64_t dim, double ffn_dim_multiplier, int64_t multiple_of) {
  int64_t hidden = 4 * dim;
  hidden = static_cast<int64_t>(2 * hidden / 3);
  if (ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(ffn_dim_multiplier * static_cast<double>(hidden));
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

int64_t ModelConfig::layer_parameters() const {
  int64_t attention = dim * dim * 2 + dim * kv_dim() * 2;  // wq, wo, wk, wv
  int64_t ffn = 3 * dim * ffn_dim;                         // w1, w2, w3
  int64_t norms = 2 * dim;
  return attention + ffn + norms;
}

int64_t ModelConfig::total_parameters() const {
  return embedding_parameters() + n_layers * layer_parameters() + dim + vocab_size * dim;
}

double ModelConfig::training_flops_per_token(int64_t seq_len) const {
  double parameters = static_cast<double>(total_parameters() - embedding_parameters());
  return 6.0 * parameters + 12.0 * static_cast<double>(n_layers * n_heads * head_dim() * seq_len);
}

namespace {

struct Preset {
  const char* flavor;
  int64_t dim, n_layers, n_heads, n_kv_heads, vocab_size;
  double ffn_dim_multiplier;
  int64_t multiple_of;
  bool rope_scaling;
};

// Shapes as published for Llama 3 / 3.1 / 3.2; debugmodel as torchtitan defines it.
constexpr Preset kPresets[] = {
    {"debugmodel", 256, 6, 16, 8, 0, 0.0, 256, false},
    {"llama3_1b", 2048, 16, 32, 8, 128256, 1.5, 256, true},
    {"llama3_8b", 4096, 32, 32, 8, 128256, 1.3, 1024, true},
    {"llama3_70b", 8192, 80, 64, 8, 128256, 1.3, 4096, true},
    {"llama3_405b", 16384, 126, 128, 8, 128256, 1.2, 4096, true},
};

}  // namespace

std::vector<std::string> model_flavors() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.flavor);
  return names;
}

ModelConfig make_model_config(const ModelSection& section, int64_t tokenizer_vocab_size) {
  const Preset* preset = nullptr;
  for (const auto& p : kPresets)
    if (section.flavor == p.flavor) preset = &p;
  if (!preset) {
    std::string known;
    for (const auto& p : kPresets) known += std::string(known.empty() ? "" : ", ") + p.flavor;
    fail(ErrorKind::config, "model.flavor: unknown preset '" + section.flavor + "' (known: " + known + ")");
  }
  ModelConfig c;
  c.flavor = preset->flavor;
  c.dim = section.dim ? section.dim : preset->dim;
  c.n_layers = section.n_layers ? section.n_layers : preset->n_layers;
  c.n_heads = section.n_heads ? section.n_heads : preset->n_heads;
  c.n_kv_heads = section.n_kv_heads ? section.n_kv_heads : preset->n_kv_heads;
  c.vocab_size = section.vocab_size ? section.vocab_size : (preset->vocab_size ? preset->vocab_size : tokenizer_vocab_size);
  c.multiple_of = section.multiple_of ? section.multiple_of : preset->multiple_of;
  c.ffn_dim_multiplier = section.ffn_dim_multiplier.value_or(preset->ffn_dim_multiplier);
  c.ffn_dim = section.ffn_dim ? section.ffn_dim : llama_ffn_dim(c.dim, c.ffn_dim_multiplier, c.multiple_of);
  if (section.norm_eps > 0) c.norm_eps = section.norm_eps;
  if (section.rope_theta > 0) c.rope_theta = section.rope_theta;
  c.rope_scaling = section.rope_scaling.value_or(preset->rope_scaling);

  auto require = [](bool ok, const std::string& message) {
    if (!ok) fail(ErrorKind::config, message);
  };
  require(c.vocab_size > 0, "model.vocab_size: preset '" + c.flavor + "' takes its vocabulary from the tokenizer, but none was given");
  require(c.n_heads > 0 && c.dim % c.n_heads == 0,
          "model.dim (" + std::to_string(c.dim) + ") must be a multiple of model.n_heads (" + std::to_string(c.n_heads) + ")");
  require(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0,
          "model.n_heads (" + std::to_string(c.n_heads) + ") must be a multiple of model.n_kv_heads (" +
              std::to_string(c.n_kv_heads) + ")");
  require(c.head_dim() % 2 == 0, "model: head dimension dim / n_heads = " + std::to_string(c.head_dim()) +
                                     " must be even for rotary embeddings");
  require(c.n_layers > 0, "model.n_layers must be at least 1");
  return c;
}

ModelSection model_section_of(const ModelConfig& model) {
  ModelSection section;
  section.flavor = "debugmodel";  // every shape below overrides it; a preset's name is kept
  for (const auto& p : kPresets)
    if (model.flavor == p.flavor) section.flavor = p.flavor;
  section.dim = model.dim;
  section.n_layers = model.n_layers;
  section.n_heads = model.n_heads;
  section.n_kv_heads = model.n_kv_heads;
  section.vocab_size = model.vocab_size;
  section.ffn_dim = model.ffn_dim;
  section.multiple_of = model.multiple_of;
  if (model.ffn_dim_multiplier > 0) section.ffn_dim_multiplier = model.ffn_dim_multiplier;  // 0: none
  section.norm_eps = model.norm_eps;
  section.rope_theta = model.rope_theta;
  section.rope_scaling = model.rope_scaling;
  return section;
}

std::string describe(const ModelConfig& c) {
  char text[512];
  std::snprintf(text, sizeof text,
                "%s: %lld layers, dim %lld, %lld heads (%lld KV, head dim %lld), FFN %lld, vocabulary %lld, %.2f M parameters",
                c.flavor.c_str(), (long long)c.n_layers, (long long)c.dim, (long long)c.n_heads,
                (long long)c.n_kv_heads, (long long)c.head_dim(), (long long)c.ffn_dim, (long long)c.vocab_size,
                static_cast<double>(c.total_parameters()) / 1e6);
  return text;
}

}  // namespace smelt

#include <nlohmann/json.hpp>

namespace smelt {

std::string model_config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"flavor", c.flavor},         {"dim", c.dim},           {"n_layers", c.n_layers},
                      {"n_heads", c.n_heads},       {"n_kv_heads", c.n_kv_heads}, {"vocab_size", c.vocab_size},
                      {"ffn_dim", c.ffn_dim},       {"norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
                      {"rope_scaling", c.rope_scaling}};
  return j.dump();
}

ModelConfig model_config_from_json(const std::string& text, const std::string& source) {
  ModelConfig c;
  try {
    auto j = nlohmann::json::parse(text);
    c.flavor = j.at("flavor").get<std::string>();
    c.dim = j.at("dim").get<int64_t>();
    c.n_layers = j.at("n_layers").get<int64_t>();
    c.n_heads = j.at("n_heads").get<int64_t>();
    c.n_kv_heads = j.at("n_kv_heads").get<int64_t>();
    c.vocab_size = j.at("vocab_size").get<int64_t>();
    c.ffn_dim = j.at("ffn_dim").get<int64_t>();
    c.norm_eps = j.at("norm_eps").get<double>();
    c.rope_theta = j.at("rope_theta").get<double>();
    c.rope_scaling = j.at("rope_scaling").get<bool>();
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorKind::input, source + ": the model description is malformed (" + e.what() + ")");
  }
  const bool sane = c.dim > 0 && c.dim <= (1 << 20) && c.n_layers > 0 && c.n_layers <= 4096 && c.n_heads > 0 &&
                    c.dim % c.n_heads == 0 && c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0 && c.vocab_size > 0 &&
                    c.vocab_size <= (1 << 24) && c.ffn_dim > 0 && c.ffn_dim <= (1 << 22) && (c.dim / c.n_heads) % 2 == 0;
  if (!sane) fail(ErrorKind::input, source + ": the model description has impossible shapes: " + text);
  return c;
}

}  // namespace smelt
