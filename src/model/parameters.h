// ParameterLayout: every weight of the model in one flat buffer (fp32 master,
// gradients, AdamW moments and compute copies all share this layout), with
// torchtitan's names, and the initialisation torchtitan uses.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/layer_graph.h"

namespace smelt {

struct ParameterInfo {
  std::string name;   // "layers.3.attention.wq.weight"
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // in elements from the start of the flat buffer
  int64_t numel() const { return rows * cols; }
};

class ParameterLayout {
 public:
  explicit ParameterLayout(const ModelConfig& model);

  const std::vector<ParameterInfo>& parameters() const { return parameters_; }
  int64_t total() const { return total_; }
  const ParameterInfo& embedding() const { return parameters_[0]; }
  const ParameterInfo& layer(int64_t layer, LayerWeight weight) const {
    return parameters_[1 + layer * kLayerWeightCount + static_cast<int64_t>(weight)];
  }
  const ParameterInfo& final_norm() const { return parameters_[parameters_.size() - 2]; }
  const ParameterInfo& output() const { return parameters_.back(); }

  // The view of parameter `info` inside a flat buffer (any dtype) laid out like this.
  static TensorView slice(const TensorView& flat, const ParameterInfo& info);

 private:
  std::vector<ParameterInfo> parameters_;
  int64_t total_ = 0;
};

// Fills `host` (total() floats) with torchtitan's initialisation: embedding N(0, 1);
// wq, wk, wv, w1 N(0, 0.02); wo, w2, w3 N(0, 0.02 / sqrt(2 (layer + 1))) (depth init);
// norms 1; output truncated normal, std dim^-0.5, cut at 3 std. Every 2^20-element
// chunk of a parameter draws from its own stream seeded by (seed, parameter, chunk), so
// the result depends neither on the thread count nor on the order of initialisation.
void initialize_parameters(const ParameterLayout& layout, const ModelConfig& model, uint64_t seed, float* host);

// Rotary frequencies (seq_len, Dh/2, 2) as cos, sin pairs, with Llama-3.1 scaling when enabled.
void rope_frequencies(const ModelConfig& model, int64_t seq_len, float* host);

}  // namespace smelt
