// Model shapes the planner and cost-model tests share: Llama-3 8B's blocks (dim 4096, 32 heads,
// 8 KV heads, FFN 14336, vocabulary 128256) with as many layers as a test needs; 8 of them are
// BENCHMARKS.md's proxy.
#pragma once
#include <cstdint>

#include "core/config.h"
#include "model/model_config.h"

namespace smelt::testing_support {

inline ModelConfig llama3_8b_layers(int64_t layers) {
  ModelSection section;
  section.flavor = "llama3_8b";
  section.n_layers = layers;
  return make_model_config(section, 0);
}

}  // namespace smelt::testing_support
