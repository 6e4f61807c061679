// The trained model as one safetensors file (torchtitan's parameter names, fp32),
// with the shapes, tokenizer and context length in its metadata, and the way back.
#pragma once
#include <string>
#include <vector>

#include "model/model_config.h"
#include "train/executor.h"

namespace smelt {

struct SavedModel {
  ModelConfig model;
  std::string tokenizer;   // a tokenizer spec for load_tokenizer
  int64_t seq_len = 0;     // the context the model was trained on
  std::vector<float> parameters;  // flat, ParameterLayout order
};

void save_model_weights(const std::string& path, Executor& executor, const std::string& tokenizer, int64_t seq_len);
// `path` is a model.safetensors file or a run folder holding one.
SavedModel load_model_weights(const std::string& path);

// Weights from any source smelt reads: a run folder or one checkpoint (their model.safetensors), a
// folder of checkpoints (the newest), a sharded checkpoint (every rank's files), model.safetensors,
// or a Hugging Face Llama folder (recorded with `hf_tokenizer` as its tokenizer spec and a context
// of at most 2048). seq_len > 0 replaces the recorded context. `option` names the argument in
// errors ("--from").
SavedModel load_weights_from(const std::string& path, const std::string& option, const std::string& hf_tokenizer,
                             int64_t seq_len = 0);

}  // namespace smelt
