// Hugging Face Llama weight folders (config.json + model*.safetensors) to and from smelt's flat
// ParameterLayout: the name mapping, and the Q/K row permutation between smelt's (torchtitan's)
// RoPE on interleaved pairs (2i, 2i+1) and Hugging Face's rotate-half pairs (i, i + Dh/2).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "train/hf_config.h"

namespace smelt {

// "layers.3.attention.wq.weight" -> "model.layers.3.self_attn.q_proj.weight"; every smelt name maps.
std::string hf_parameter_name(const std::string& smelt_name);

// Rows of a q or k projection, (heads * Dh, cols): smelt row h*Dh + 2i + j goes to Hugging Face row
// h*Dh + j*Dh/2 + i (j in {0, 1}); `to_hf` false applies the inverse.
void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, int64_t cols, bool to_hf);

// True when `path` is a folder with a config.json (and no smelt index.json).
bool is_hf_folder(const std::string& path);
HfConfig read_hf_config(const std::string& folder);

// The weights of a Hugging Face folder (model.safetensors, or shards listed in
// model.safetensors.index.json; F32 or BF16) as smelt's flat fp32 parameters for `model`.
std::vector<float> load_hf_weights(const std::string& folder, const ModelConfig& model);

// Writes config.json and model.safetensors (dtype f32 or bf16) that transformers' LlamaForCausalLM loads.
void save_hf_folder(const std::string& folder, const ModelConfig& model, const float* parameters, DType dtype,
                    int64_t max_position_embeddings);

}  // namespace smelt
