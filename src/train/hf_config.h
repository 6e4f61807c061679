// Hugging Face Llama config.json <-> smelt's ModelConfig: which fields map to which, and which
// Llama variants smelt can represent (no biases, SiLU, Llama-3.1 RoPE scaling or none).
#pragma once
#include <cstdint>
#include <string>

#include "model/model_config.h"

namespace smelt {

struct HfConfig {
  ModelConfig model;
  bool tied_embeddings = false;         // tie_word_embeddings: no lm_head.weight, the output reuses the embedding
  int64_t max_position_embeddings = 0;
  std::string torch_dtype;              // as written, e.g. "bfloat16"
};

// Errors (ErrorKind::input) name `source` and the field; variants smelt cannot train are refused.
HfConfig hf_config_from_json(const std::string& text, const std::string& source);
// config.json for LlamaForCausalLM; `torch_dtype` is "float32" or "bfloat16".
std::string hf_config_to_json(const ModelConfig& model, int64_t max_position_embeddings, const std::string& torch_dtype);

}  // namespace smelt
