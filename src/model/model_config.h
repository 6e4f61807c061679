// ModelConfig: the shapes of a Llama-3 model, the torchtitan presets, and the
// FLOP count torchtitan reports (so MFU figures compare directly).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace smelt {

struct ModelConfig {
  std::string flavor;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t vocab_size = 0;
  int64_t ffn_dim = 0;
  int64_t multiple_of = 256;
  double ffn_dim_multiplier = 0;  // 0: none
  double norm_eps = 1e-5;
  double rope_theta = 500000;
  bool rope_scaling = false;      // Llama-3.1 frequency scaling (factor 8, low 1, high 4, 8192 context)

  int64_t head_dim() const { return dim / n_heads; }
  int64_t kv_dim() const { return n_kv_heads * head_dim(); }

  // Parameter counts.
  int64_t layer_parameters() const;
  int64_t embedding_parameters() const { return vocab_size * dim; }
  int64_t total_parameters() const;  // embedding + layers + final norm + output projection

  // torchtitan: 6 * (parameters without the embedding) + 12 * layers * heads * head_dim * seq_len.
  double training_flops_per_token(int64_t seq_len) const;
};

// The FFN width torchtitan derives: 2/3 * 4 * dim, times the multiplier, rounded up to multiple_of.
int64_t llama_ffn_dim(int64_t dim, double ffn_dim_multiplier, int64_t multiple_of);

std::vector<std::string> model_flavors();
// The preset `flavor` with the overrides of the [model] section applied; vocab_size
// comes from the tokenizer when the preset and the config leave it open (0).
ModelConfig make_model_config(const ModelSection& section, int64_t tokenizer_vocab_size);
// A [model] section that make_model_config turns back into `model`'s shapes (the flavor kept when
// it names a preset, else debugmodel's with every shape overridden): weights' shapes as a config.
ModelSection model_section_of(const ModelConfig& model);
std::string describe(const ModelConfig& config);  // one line: "debugmodel: 6 layers, dim 256, ... 6.4 M parameters"

}  // namespace smelt

namespace smelt {
// The shapes as a JSON string (saved with weights) and back; errors name what is missing.
std::string model_config_to_json(const ModelConfig& config);
ModelConfig model_config_from_json(const std::string& json, const std::string& source);
}  // namespace smelt
