// Hugging Face interop: names, config.json, the Q/K RoPE permutation (checked by the attention
// scores it must preserve), and a folder round trip in float32 (exact) and bfloat16.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "core/random.h"
#include "model/parameters.h"
#include "support/fresh_random.h"
#include "support/temporary_folder.h"
#include "train/checkpoint.h"
#include "train/hf_weights.h"

namespace smelt {
namespace {

using testing_support::TemporaryFolder;

ModelConfig small_model() {
  ModelConfig m;
  m.flavor = "test";
  m.dim = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.vocab_size = 40;
  m.ffn_dim = 48;
  m.norm_eps = 1e-5;
  m.rope_theta = 500000;
  m.rope_scaling = true;
  return m;
}

std::vector<float> random_parameters(const ModelConfig& m, uint64_t seed) {
  ParameterLayout layout(m);
  std::vector<float> p(static_cast<size_t>(layout.total()), 0.0f);  // alignment padding stays zero
  Random random(testing_support::fresh(seed), 0);
  for (const auto& info : layout.parameters())
    for (int64_t i = 0; i < info.numel(); ++i) p[static_cast<size_t>(info.offset + i)] = static_cast<float>(random.uniform() * 2 - 1);
  return p;
}

TEST(HfNames, MapEveryParameterToTransformersLlamaNames) {
  EXPECT_EQ(hf_parameter_name("tok_embeddings.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(hf_parameter_name("layers.11.attention.wk.weight"), "model.layers.11.self_attn.k_proj.weight");
  EXPECT_EQ(hf_parameter_name("layers.0.feed_forward.w1.weight"), "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(hf_parameter_name("layers.0.feed_forward.w3.weight"), "model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(hf_parameter_name("layers.0.feed_forward.w2.weight"), "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(hf_parameter_name("layers.2.ffn_norm.weight"), "model.layers.2.post_attention_layernorm.weight");
  EXPECT_EQ(hf_parameter_name("output.weight"), "lm_head.weight");
  ParameterLayout layout(small_model());
  std::set<std::string> names;
  for (const auto& p : layout.parameters()) names.insert(hf_parameter_name(p.name));
  EXPECT_EQ(names.size(), layout.parameters().size()) << "two parameters map to one name";
}

// q . k after smelt's RoPE (pairs 2i, 2i+1) equals q . k after Hugging Face's rotate-half RoPE
// (pairs i, i + Dh/2) with the permuted weights: the export preserves attention exactly.
TEST(HfPermutation, PreservesRotaryAttentionScores) {
  const int64_t heads = 2, head_dim = 8, cols = 5, half = head_dim / 2;
  Random random(testing_support::fresh(11), 0);
  std::vector<float> wq(heads * head_dim * cols), wk(wq.size()), x(cols), y(cols);
  for (auto* v : {&wq, &wk, &x, &y})
    for (auto& e : *v) e = static_cast<float>(random.uniform() * 2 - 1);
  std::vector<float> wq_hf(wq.size()), wk_hf(wk.size()), back(wq.size());
  permute_rope_rows(wq.data(), wq_hf.data(), heads, head_dim, cols, true);
  permute_rope_rows(wk.data(), wk_hf.data(), heads, head_dim, cols, true);
  permute_rope_rows(wq_hf.data(), back.data(), heads, head_dim, cols, false);
  EXPECT_EQ(back, wq);
  EXPECT_NE(wq_hf, wq);
  auto project = [&](const std::vector<float>& w, const std::vector<float>& in) {
    std::vector<double> out(static_cast<size_t>(heads * head_dim), 0.0);
    for (int64_t r = 0; r < heads * head_dim; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r] += double(w[r * cols + c]) * in[c];
    return out;
  };
  auto angle = [&](int64_t position, int64_t i) { return position * std::pow(10000.0, -2.0 * i / head_dim); };
  auto rope_interleaved = [&](std::vector<double> v, int64_t position) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double* p = v.data() + h * head_dim + 2 * i;
        const double c = std::cos(angle(position, i)), s = std::sin(angle(position, i)), a = p[0], b = p[1];
        p[0] = a * c - b * s;
        p[1] = a * s + b * c;
      }
    return v;
  };
  auto rope_rotate_half = [&](std::vector<double> v, int64_t position) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        double* p = v.data() + h * head_dim;
        const double c = std::cos(angle(position, i)), s = std::sin(angle(position, i)), a = p[i], b = p[i + half];
        p[i] = a * c - b * s;
        p[i + half] = b * c + a * s;
      }
    return v;
  };
  for (int64_t position : {0, 3, 17}) {
    auto q = rope_interleaved(project(wq, x), position), k = rope_interleaved(project(wk, y), position + 2);
    auto q_hf = rope_rotate_half(project(wq_hf, x), position), k_hf = rope_rotate_half(project(wk_hf, y), position + 2);
    for (int64_t h = 0; h < heads; ++h) {
      double score = 0, score_hf = 0;
      for (int64_t d = 0; d < head_dim; ++d) {
        score += q[h * head_dim + d] * k[h * head_dim + d];
        score_hf += q_hf[h * head_dim + d] * k_hf[h * head_dim + d];
      }
      EXPECT_NEAR(score, score_hf, 1e-9) << "head " << h << " position " << position;
    }
  }
}

TEST(HfConfig, RoundTripsAndRefusesWhatSmeltCannotTrain) {
  const ModelConfig m = small_model();
  HfConfig back = hf_config_from_json(hf_config_to_json(m, 2048, "bfloat16"), "test");
  EXPECT_EQ(back.model.dim, m.dim);
  EXPECT_EQ(back.model.n_kv_heads, m.n_kv_heads);
  EXPECT_EQ(back.model.ffn_dim, m.ffn_dim);
  EXPECT_EQ(back.model.rope_scaling, true);
  EXPECT_EQ(back.max_position_embeddings, 2048);
  for (const char* bad : {R"({"model_type": "mistral", "hidden_size": 32})",
                          R"({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 40,
                              "intermediate_size": 48, "attention_bias": true})",
                          R"({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 3, "vocab_size": 40,
                              "intermediate_size": 48})",
                          R"({"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 40,
                              "intermediate_size": 48, "rope_scaling": {"rope_type": "linear", "factor": 2}})",
                          R"([1, 2])", "{"})
    EXPECT_THROW(hf_config_from_json(bad, "test"), Error) << bad;
}

TEST(HfFolder, Float32RoundTripIsExactAndBfloat16IsClose) {
  TemporaryFolder folder;
  const ModelConfig m = small_model();
  const std::vector<float> parameters = random_parameters(m, 3);
  save_hf_folder(folder.path("f32"), m, parameters.data(), DType::f32, 4096);
  ASSERT_TRUE(is_hf_folder(folder.path("f32")));
  EXPECT_EQ(load_hf_weights(folder.path("f32"), m), parameters);
  // Loading through load_checkpoint: weights only, refused for another model.
  LoadedCheckpoint loaded = load_checkpoint(folder.path("f32"), m);
  EXPECT_TRUE(loaded.from_hf);
  EXPECT_EQ(loaded.parameters, parameters);
  ModelConfig other = m;
  other.n_layers = 3;
  EXPECT_THROW(load_checkpoint(folder.path("f32"), other), Error);

  save_hf_folder(folder.path("bf16"), m, parameters.data(), DType::bf16, 4096);
  const std::vector<float> rounded = load_hf_weights(folder.path("bf16"), m);
  ASSERT_EQ(rounded.size(), parameters.size());
  for (size_t i = 0; i < rounded.size(); ++i) ASSERT_NEAR(rounded[i], parameters[i], 1.0 / 128) << i;
}

}  // namespace
}  // namespace smelt

namespace smelt {
namespace {

TEST(HfFolder, ARunFolderWithItsJobConfigIsNotAHuggingFaceFolder) {
  const testing_support::TemporaryFolder folder;
  folder.write("config.json", R"({"job": {"name": "debug"}, "model": {"flavor": "debugmodel"}})");
  EXPECT_FALSE(is_hf_folder(folder.path()));
  folder.write("config.json", R"({"model_type": "llama", "hidden_size": 64})");
  EXPECT_TRUE(is_hf_folder(folder.path()));
  folder.write("config.json", "{ not json");
  EXPECT_FALSE(is_hf_folder(folder.path()));
}

}  // namespace
}  // namespace smelt
