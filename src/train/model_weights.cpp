// Saving and loading the final weights of a run.
#include "train/model_weights.h"

#include <cstring>
#include <filesystem>

#include "train/safetensors.h"

namespace smelt {

void save_model_weights(const std::string& path, Executor& executor, const std::string& tokenizer, int64_t seq_len) {
  const auto& layout = executor.layout();
  std::vector<float> host(static_cast<size_t>(layout.total()));
  executor.read_parameters(host.data());
  std::vector<NamedTensor> tensors;
  for (const auto& p : layout.parameters()) {
    NamedTensor t;
    t.name = p.name;
    t.dtype = DType::f32;
    t.shape = p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.rows, p.cols};
    t.data = host.data() + p.offset;
    tensors.push_back(t);
  }
  save_safetensors(path, tensors,
                   {{"format", "pt"},
                    {"smelt.version", SMELT_VERSION},
                    {"smelt.model", model_config_to_json(executor.plan().model)},
                    {"smelt.tokenizer", tokenizer},
                    {"smelt.seq_len", std::to_string(seq_len)}});
}

SavedModel load_model_weights(const std::string& path) {
  std::string file = path;
  if (std::filesystem::is_directory(path)) file = (std::filesystem::path(path) / "model.safetensors").string();
  SafetensorsFile st = load_safetensors(file);
  auto meta = [&](const char* key) {
    auto it = st.metadata.find(key);
    if (it == st.metadata.end())
      fail(ErrorKind::input, "'" + file + "' has no '" + key + "' metadata: it was not written by smelt train");
    return it->second;
  };
  SavedModel saved;
  saved.model = model_config_from_json(meta("smelt.model"), file);
  saved.tokenizer = meta("smelt.tokenizer");
  try {
    saved.seq_len = std::stoll(meta("smelt.seq_len"));
  } catch (const std::exception&) {
    fail(ErrorKind::input, "'" + file + "': smelt.seq_len is not a number");
  }
  if (saved.seq_len <= 0 || saved.seq_len > (1 << 20)) fail(ErrorKind::input, "'" + file + "': smelt.seq_len out of range");
  ParameterLayout layout(saved.model);
  saved.parameters.assign(static_cast<size_t>(layout.total()), 0.0f);
  for (const auto& p : layout.parameters()) {
    const auto& e = st.entry(p.name);
    const int64_t elements = p.rows * p.cols;
    int64_t stored = 1;
    for (int64_t d : e.shape) stored *= d;
    if (e.dtype != DType::f32 || stored != elements)
      fail(ErrorKind::input, "'" + file + "': tensor '" + p.name + "' should be F32 with " + std::to_string(elements) +
                                 " elements for this model");
    std::memcpy(saved.parameters.data() + p.offset, st.bytes_of(p.name), static_cast<size_t>(elements) * sizeof(float));
  }
  return saved;
}

}  // namespace smelt
