// Saving and loading the final weights of a run (or of a checkpoint, whole-model or per rank).
#include "train/model_weights.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "train/checkpoint.h"
#include "train/hf_weights.h"
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

namespace {

void read_metadata(SavedModel& saved, const std::map<std::string, std::string>& metadata, const std::string& file) {
  auto meta = [&](const char* key) {
    auto it = metadata.find(key);
    if (it == metadata.end())
      fail(ErrorKind::input, "'" + file + "' has no '" + key + "' metadata: it was not written by smelt train");
    return it->second;
  };
  saved.model = model_config_from_json(meta("smelt.model"), file);
  saved.tokenizer = meta("smelt.tokenizer");
  try {
    saved.seq_len = std::stoll(meta("smelt.seq_len"));
  } catch (const std::exception&) {
    fail(ErrorKind::input, "'" + file + "': smelt.seq_len is not a number");
  }
  if (saved.seq_len <= 0 || saved.seq_len > (1 << 20)) fail(ErrorKind::input, "'" + file + "': smelt.seq_len out of range");
}

}  // namespace

SavedModel load_model_weights(const std::string& path) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path)) {
    file = (fs::path(path) / "model.safetensors").string();
    if (!fs::exists(file) && fs::exists(fs::path(path) / "index.json")) {  // a sharded checkpoint: every rank's files
      const CheckpointIndex index = read_checkpoint_index(path);
      if (!index.sharding.sharded())
        fail(ErrorKind::input, "checkpoint '" + path + "' lists no model.safetensors; the checkpoint is damaged");
      SavedModel saved;
      saved.model = model_config_from_json(index.model_json, path + "/index.json");
      std::map<std::string, std::string> metadata;
      saved.parameters = read_sharded_parameters(path, index, saved.model, &metadata);
      const std::string first = (fs::path(path) / rank_file_name("model", 0, index.sharding.world_size)).string();
      read_metadata(saved, metadata, first);
      if (model_config_to_json(saved.model) != model_config_to_json(model_config_from_json(index.model_json, path)))
        fail(ErrorKind::input, "'" + first + "' describes another model than its index.json; the checkpoint is damaged");
      return saved;
    }
  }
  SafetensorsFile st = load_safetensors(file);
  SavedModel saved;
  read_metadata(saved, st.metadata, file);
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

SavedModel load_weights_from(const std::string& path, const std::string& option, const std::string& hf_tokenizer,
                             int64_t seq_len) {
  namespace fs = std::filesystem;
  if (is_hf_folder(path)) {
    const HfConfig hf = read_hf_config(path);
    SavedModel saved;
    saved.model = hf.model;
    saved.tokenizer = hf_tokenizer;
    saved.seq_len = seq_len > 0 ? seq_len : std::min<int64_t>(hf.max_position_embeddings, 2048);
    saved.parameters = load_hf_weights(path, hf.model);
    return saved;
  }
  std::string source = path;
  if (fs::is_directory(path)) {
    if (fs::exists(fs::path(path) / "model.safetensors")) {
      source = (fs::path(path) / "model.safetensors").string();  // a run folder or one checkpoint
    } else if (!fs::exists(fs::path(path) / "index.json")) {    // (index.json alone: a sharded checkpoint)
      const std::string newest = find_newest_checkpoint(path);
      if (newest.empty())
        fail(ErrorKind::input, option + " '" + path + "' holds no model.safetensors, no checkpoint and no config.json; "
                               "expected a run folder, a checkpoint (folder) or a Hugging Face folder");
      source = newest;  // its model.safetensors, or every rank's model files of a sharded one
    }
  } else if (!fs::exists(path)) {
    fail(ErrorKind::input, option + " '" + path + "': no such file or folder; expected a run folder, model.safetensors, "
                           "a checkpoint (folder) or a Hugging Face folder");
  }
  SavedModel saved = load_model_weights(source);
  if (seq_len > 0) saved.seq_len = seq_len;
  return saved;
}

}  // namespace smelt
