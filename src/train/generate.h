// Text generation from trained weights: temperature and nucleus (top-p) sampling,
// one forward pass of the whole context per new token (simple and exact).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace smelt {

struct GenerateOptions {
  std::string checkpoint;   // run folder, checkpoint (folder), model.safetensors or Hugging Face folder (load_weights_from)
  std::string tokenizer;    // tokenizer spec; empty: the one the weights record (an HF folder records none)
  std::string prompt;
  int64_t max_tokens = 100;
  double temperature = 0.8;  // 0: greedy
  double top_p = 0.95;
  uint64_t seed = 0;
  std::string device = "cpu";
};

// Returns the generated continuation; `on_text` receives it piece by piece as it is decoded.
std::string generate(const GenerateOptions& options, const std::function<void(const std::string&)>& on_text);

}  // namespace smelt
