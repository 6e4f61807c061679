// Flat parameter layout, initialisation and rotary frequency tables.
#include "model/parameters.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>
#include <vector>
#include <numbers>

#include "core/random.h"

namespace smelt {

ParameterLayout::ParameterLayout(const ModelConfig& model) {
  auto add = [&](std::string name, int64_t rows, int64_t cols) {
    parameters_.push_back({std::move(name), rows, cols, total_});
    total_ += rows * cols;
    total_ = (total_ + 63) / 64 * 64;  // 256-byte alignment of every fp32 parameter
  };
  add("tok_embeddings.weight", model.vocab_size, model.dim);
  for (int64_t layer = 0; layer < model.n_layers; ++layer)
    for (int w = 0; w < kLayerWeightCount; ++w) {
      auto spec = layer_weight_spec(static_cast<LayerWeight>(w), model);
      add("layers." + std::to_string(layer) + "." + std::string(layer_weight_name(static_cast<LayerWeight>(w))),
          spec.dims[0], spec.dims[1]);
    }
  add("norm.weight", 1, model.dim);
  add("output.weight", model.vocab_size, model.dim);
}

TensorView ParameterLayout::slice(const TensorView& flat, const ParameterInfo& info) {
  auto* base = static_cast<char*>(flat.data) + static_cast<size_t>(info.offset) * dtype_size(flat.dtype);
  Shape shape = info.rows == 1 ? Shape{info.cols} : Shape{info.rows, info.cols};
  return TensorView(base, flat.dtype, shape, flat.device);
}

namespace {

struct InitRule {
  bool ones = false;
  double std = 0.02, cutoff = 1e30;  // cutoff in standard deviations
};

InitRule init_rule(const ParameterInfo& p, const ModelConfig& model) {
  const std::string& name = p.name;
  auto ends_with = [&](const char* suffix) {
    std::string s(suffix);
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  InitRule rule;
  if (ends_with("norm.weight")) {
    rule.ones = true;
  } else if (name == "tok_embeddings.weight") {
    rule.std = 1.0;
  } else if (name == "output.weight") {
    rule.std = 1.0 / std::sqrt(static_cast<double>(model.dim));
    rule.cutoff = 3.0;
  } else if (ends_with("wo.weight") || ends_with("w2.weight") || ends_with("w3.weight")) {
    int64_t layer = std::stoll(name.substr(7, name.find('.', 7) - 7));
    rule.std = 0.02 / std::sqrt(2.0 * static_cast<double>(layer + 1));
    rule.cutoff = 2.0 / rule.std;  // torch trunc_normal_'s default bounds are +-2 (absolute)
  } else {
    rule.cutoff = 2.0 / rule.std;
  }
  return rule;
}

constexpr int64_t kInitChunk = 1 << 20;  // elements per random stream

}  // namespace

void initialize_parameters(const ParameterLayout& layout, const ModelConfig& model, uint64_t seed, float* host) {
  // Work items: (parameter, chunk); each chunk draws from its own stream, so the values do
  // not depend on how many threads fill them.
  std::vector<std::pair<size_t, int64_t>> chunks;
  const auto& params = layout.parameters();
  for (size_t index = 0; index < params.size(); ++index)
    for (int64_t first = 0; first < params[index].numel(); first += kInitChunk) chunks.emplace_back(index, first);
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t c = next++; c < chunks.size(); c = next++) {
      const auto [index, first] = chunks[c];
      const auto& p = params[index];
      const InitRule rule = init_rule(p, model);
      float* out = host + p.offset + first;
      const int64_t count = std::min(kInitChunk, p.numel() - first);
      if (rule.ones) {
        std::fill(out, out + count, 1.0f);
        continue;
      }
      Random random(seed, (static_cast<uint64_t>(index) << 24) + static_cast<uint64_t>(first / kInitChunk));
      for (int64_t i = 0; i < count; ++i) {
        double z;
        do z = random.normal();
        while (std::fabs(z) > rule.cutoff);
        out[i] = static_cast<float>(z * rule.std);
      }
    }
  };
  const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void rope_frequencies(const ModelConfig& model, int64_t seq_len, float* host) {
  const int64_t half = model.head_dim() / 2;
  for (int64_t i = 0; i < half; ++i) {
    double frequency = 1.0 / std::pow(model.rope_theta, static_cast<double>(2 * i) / static_cast<double>(model.head_dim()));
    if (model.rope_scaling) {
      // Llama-3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
      const double factor = 8, low_frequency_factor = 1, high_frequency_factor = 4, original_context = 8192;
      const double low_wavelength = original_context / low_frequency_factor;
      const double high_wavelength = original_context / high_frequency_factor;
      const double wavelength = 2 * std::numbers::pi / frequency;
      if (wavelength > low_wavelength) {
        frequency /= factor;
      } else if (wavelength >= high_wavelength) {
        double smooth = (original_context / wavelength - low_frequency_factor) / (high_frequency_factor - low_frequency_factor);
        frequency = (1 - smooth) * frequency / factor + smooth * frequency;
      }
    }
    // torchtitan computes the angles in float32 (outer product of float32 tensors).
    float f = static_cast<float>(frequency);
    for (int64_t pos = 0; pos < seq_len; ++pos) {
      float angle = static_cast<float>(pos) * f;
      host[(pos * half + i) * 2 + 0] = std::cos(angle);
      host[(pos * half + i) * 2 + 1] = std::sin(angle);
    }
  }
}

}  // namespace smelt
