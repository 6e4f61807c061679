// Importing and exporting Hugging Face Llama weight folders.
#include "train/hf_weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/numerics.h"
#include "model/parameters.h"
#include "train/metrics.h"
#include "train/safetensors.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxConfigBytes = 1 << 20;

std::string read_small_file(const std::string& path, const std::string& what) {
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  if (error) fail(ErrorKind::input, "cannot read " + what + " '" + path + "': " + error.message());
  if (size > kMaxConfigBytes)
    fail(ErrorKind::input, what + " '" + path + "' is " + std::to_string(size) + " bytes, over the 1 MiB a JSON config needs");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// q (heads = H) and k (heads = KV) carry rotary pairs; every other weight maps row for row.
int64_t rope_heads(const std::string& smelt_name, const ModelConfig& model) {
  if (ends_with(smelt_name, "attention.wq.weight")) return model.n_heads;
  if (ends_with(smelt_name, "attention.wk.weight")) return model.n_kv_heads;
  return 0;
}

}  // namespace

std::string hf_parameter_name(const std::string& name) {
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  static const std::pair<const char*, const char*> layer_names[] = {
      {"attention_norm.weight", "input_layernorm.weight"}, {"attention.wq.weight", "self_attn.q_proj.weight"},
      {"attention.wk.weight", "self_attn.k_proj.weight"},  {"attention.wv.weight", "self_attn.v_proj.weight"},
      {"attention.wo.weight", "self_attn.o_proj.weight"},  {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"feed_forward.w1.weight", "mlp.gate_proj.weight"},  {"feed_forward.w3.weight", "mlp.up_proj.weight"},
      {"feed_forward.w2.weight", "mlp.down_proj.weight"}};
  if (name.rfind("layers.", 0) == 0) {
    const size_t dot = name.find('.', 7);
    if (dot != std::string::npos)
      for (const auto& [smelt_suffix, hf_suffix] : layer_names)
        if (name.compare(dot + 1, std::string::npos, smelt_suffix) == 0)
          return "model." + name.substr(0, dot + 1) + hf_suffix;
  }
  fail(ErrorKind::internal, "no Hugging Face name for parameter '" + name + "'; extend hf_parameter_name");
}

void permute_rope_rows(const float* in, float* out, int64_t heads, int64_t head_dim, int64_t cols, bool to_hf) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t smelt_row = h * head_dim + 2 * i + j, hf_row = h * head_dim + j * half + i;
        const int64_t from = to_hf ? smelt_row : hf_row, to = to_hf ? hf_row : smelt_row;
        std::memcpy(out + to * cols, in + from * cols, static_cast<size_t>(cols) * sizeof(float));
      }
}

bool is_hf_folder(const std::string& path) {
  const fs::path config = fs::path(path) / "config.json";
  if (!fs::is_directory(path) || !fs::exists(config) || fs::exists(fs::path(path) / "index.json")) return false;
  // A smelt run folder also holds a config.json (the job's); a Hugging Face model's names hidden_size.
  std::error_code error;
  const auto size = fs::file_size(config, error);
  if (error || size > kMaxConfigBytes) return false;
  std::ifstream in(config);
  const auto json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  return json.is_object() && json.contains("hidden_size");
}

HfConfig read_hf_config(const std::string& folder) {
  const std::string path = (fs::path(folder) / "config.json").string();
  return hf_config_from_json(read_small_file(path, "Hugging Face config"), path);
}

std::vector<float> load_hf_weights(const std::string& folder, const ModelConfig& model) {
  const HfConfig hf = read_hf_config(folder);
  // Which file holds each tensor: one model.safetensors, or the shards an index names.
  std::map<std::string, std::string> file_of;
  const fs::path index_path = fs::path(folder) / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(read_small_file(index_path.string(), "safetensors index"));
    } catch (const nlohmann::json::exception& e) {
      fail(ErrorKind::input, "'" + index_path.string() + "' is not valid JSON (" + e.what() + ")");
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(ErrorKind::input, "'" + index_path.string() + "' has no weight_map object; expected a safetensors shard index");
    for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
      const std::string file = it.value().is_string() ? it.value().get<std::string>() : "";
      if (file.empty() || file.find('/') != std::string::npos || file == "..")
        fail(ErrorKind::input, "'" + index_path.string() + "' maps '" + it.key() + "' to '" + file +
                                   "'; expected a file name in the same folder");
      file_of[it.key()] = file;
    }
  }
  auto file_for = [&](const std::string& name) {
    auto it = file_of.find(name);
    return it == file_of.end() ? std::string("model.safetensors") : it->second;
  };

  ParameterLayout layout(model);
  std::vector<float> flat(static_cast<size_t>(layout.total()));
  std::vector<float> staging;
  std::map<std::string, SafetensorsFile> open;  // shards read so far, kept until every tensor is placed
  for (const auto& p : layout.parameters()) {
    std::string name = hf_parameter_name(p.name);
    if (name == "lm_head.weight" && hf.tied_embeddings) name = "model.embed_tokens.weight";
    const std::string file = file_for(name);
    if (!open.count(file)) open.emplace(file, load_safetensors((fs::path(folder) / file).string()));
    const SafetensorsFile& st = open.at(file);
    const auto& entry = st.entry(name);
    const std::vector<int64_t> expected =
        p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.rows, p.cols};
    if (entry.shape != expected || (entry.dtype != DType::f32 && entry.dtype != DType::bf16)) {
      std::string found;
      for (int64_t d : entry.shape) found += (found.empty() ? "" : ", ") + std::to_string(d);
      fail(ErrorKind::input, "'" + st.path + "': tensor '" + name + "' is " + std::string(dtype_name(entry.dtype)) + " (" + found +
                                 "); this model needs F32 or BF16 of shape (" + std::to_string(p.rows) +
                                 (p.rows == 1 ? "" : ", " + std::to_string(p.cols)) + ")");
    }
    staging.resize(static_cast<size_t>(p.numel()));
    const uint8_t* bytes = st.bytes_of(name);
    if (entry.dtype == DType::f32) {
      std::memcpy(staging.data(), bytes, staging.size() * sizeof(float));
    } else {
      for (size_t i = 0; i < staging.size(); ++i) {
        uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        staging[i] = bf16_to_float(bits);
      }
    }
    float* target = flat.data() + p.offset;
    if (const int64_t heads = rope_heads(p.name, model))
      permute_rope_rows(staging.data(), target, heads, model.head_dim(), p.cols, /*to_hf=*/false);
    else
      std::memcpy(target, staging.data(), staging.size() * sizeof(float));
  }
  return flat;
}

void save_hf_folder(const std::string& folder, const ModelConfig& model, const float* parameters, DType dtype,
                    int64_t max_position_embeddings) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    fail(ErrorKind::config, std::string("Hugging Face export writes float32 or bfloat16, not ") + std::string(dtype_name(dtype)));
  fs::create_directories(folder);
  ParameterLayout layout(model);
  const size_t element = dtype_size(dtype);
  std::vector<uint8_t> converted(static_cast<size_t>(layout.total()) * element);
  std::vector<float> permuted;
  std::vector<NamedTensor> tensors;
  for (const auto& p : layout.parameters()) {
    const float* source = parameters + p.offset;
    if (const int64_t heads = rope_heads(p.name, model)) {
      permuted.resize(static_cast<size_t>(p.numel()));
      permute_rope_rows(source, permuted.data(), heads, model.head_dim(), p.cols, /*to_hf=*/true);
      source = permuted.data();
    }
    uint8_t* target = converted.data() + static_cast<size_t>(p.offset) * element;
    if (dtype == DType::f32) {
      std::memcpy(target, source, static_cast<size_t>(p.numel()) * sizeof(float));
    } else {
      for (int64_t i = 0; i < p.numel(); ++i) {
        const uint16_t bits = float_to_bf16(source[i]);
        std::memcpy(target + 2 * i, &bits, 2);
      }
    }
    NamedTensor t;
    t.name = hf_parameter_name(p.name);
    t.dtype = dtype;
    t.shape = p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.rows, p.cols};
    t.data = target;
    tensors.push_back(t);
  }
  save_safetensors((fs::path(folder) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomically((fs::path(folder) / "config.json").string(),
                        hf_config_to_json(model, max_position_embeddings, dtype == DType::bf16 ? "bfloat16" : "float32"));
}

}  // namespace smelt
