// Finding, verifying and loading checkpoints (smelt's own, whole-model or per rank, or a Hugging
// Face Llama folder).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "model/parameters.h"
#include "train/checkpoint.h"
#include "train/checkpoint_shards.h"
#include "train/hf_weights.h"
#include "train/safetensors.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxIndexBytes = uintmax_t(64) << 20;

bool read_index(const fs::path& folder, CheckpointIndex& index, std::string& problem) {
  const fs::path path = folder / "index.json";
  std::error_code error;
  const uintmax_t size = fs::file_size(path, error);
  if (error || size > kMaxIndexBytes) {
    problem = error ? "has no readable index.json" : "has an index.json over 64 MiB";
    return false;
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  try {
    index = parse_checkpoint_index(text.str(), path.string());
  } catch (const Error& e) {
    problem = e.what();
    return false;
  }
  for (const auto& f : index.files) {
    const uintmax_t bytes = fs::file_size(folder / f.name, error);
    if (error || bytes != f.bytes) {
      problem = "file '" + f.name + "' is missing or not " + std::to_string(f.bytes) + " bytes";
      return false;
    }
  }
  return true;
}

}  // namespace

void verify_checksum(const fs::path& path, const CheckpointFile& file) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(size_t(16) << 20);
  Checksum checksum;
  uint64_t total = 0;
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    checksum.update(buffer.data(), n);
    total += n;
  }
  if (total != file.bytes || checksum.finish() != file.checksum)
    fail(ErrorKind::input, "checkpoint file '" + path.string() + "' has checksum smelt-hash64:" +
                               checksum_hex(checksum.finish()) + " over " + std::to_string(total) +
                               " bytes, but the index records " + checksum_hex(file.checksum) + " over " +
                               std::to_string(file.bytes) + "; the file is corrupted: resume from an older checkpoint");
}

namespace {

// Every shape field that differs, as "dim 256 vs 512"; empty when the models match.
std::string model_differences(const ModelConfig& saved, const ModelConfig& current) {
  std::string text;
  auto compare = [&](const char* name, auto a, auto b) {
    if (a != b) {
      std::ostringstream s;
      s << (text.empty() ? "" : ", ") << name << " " << a << " (saved) vs " << b << " (this run)";
      text += s.str();
    }
  };
  compare("dim", saved.dim, current.dim);
  compare("n_layers", saved.n_layers, current.n_layers);
  compare("n_heads", saved.n_heads, current.n_heads);
  compare("n_kv_heads", saved.n_kv_heads, current.n_kv_heads);
  compare("vocab_size", saved.vocab_size, current.vocab_size);
  compare("ffn_dim", saved.ffn_dim, current.ffn_dim);
  compare("norm_eps", saved.norm_eps, current.norm_eps);
  compare("rope_theta", saved.rope_theta, current.rope_theta);
  compare("rope_scaling", saved.rope_scaling, current.rope_scaling);
  return text;
}

void copy_tensors(const SafetensorsFile& file, const ParameterLayout& layout, const std::string& prefix,
                  std::vector<float>& out) {
  out.assign(static_cast<size_t>(layout.total()), 0.0f);
  for (const auto& p : layout.parameters()) {
    const std::string name = prefix + p.name;
    const auto& entry = file.entry(name);
    if (entry.dtype != DType::f32 || entry.bytes != static_cast<size_t>(p.numel()) * sizeof(float))
      fail(ErrorKind::input, "checkpoint file '" + file.path + "': tensor '" + name + "' should be F32 with " +
                                 std::to_string(p.numel()) + " elements; the checkpoint is not from this model");
    std::memcpy(out.data() + p.offset, file.bytes_of(name), entry.bytes);
  }
}

}  // namespace

std::string find_newest_checkpoint(const std::string& folder) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) return "";
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder, error)) {
    const std::string name = entry.path().filename().string();
    if (name.size() == 13 && name.rfind("step-", 0) == 0 && entry.is_directory()) names.push_back(name);
  }
  std::sort(names.rbegin(), names.rend());
  for (const auto& name : names) {
    CheckpointIndex index;
    std::string problem;
    if (read_index(fs::path(folder) / name, index, problem)) return (fs::path(folder) / name).string();
  }
  return "";
}

CheckpointIndex read_checkpoint_index(const std::string& folder) {
  CheckpointIndex index;
  std::string problem;
  if (!read_index(folder, index, problem))
    fail(ErrorKind::input, "checkpoint '" + folder + "' is incomplete or damaged: " + problem +
                               "; resume from an older checkpoint");
  return index;
}

namespace {

// The checkpoint folder `path` names (itself, or the newest complete one inside it), its index
// checked against this smelt and `model`.
CheckpointIndex open_checkpoint(const std::string& path, const ModelConfig& model, fs::path& folder) {
  folder = path;
  if (!fs::exists(folder / "index.json")) {
    if (!fs::is_directory(folder))
      fail(ErrorKind::input, "checkpoint.load = '" + path + "' is not a folder; expected a checkpoint (a folder with "
                             "index.json), a folder of checkpoints, or a Hugging Face folder (with config.json)");
    const std::string newest = find_newest_checkpoint(path);
    if (newest.empty())
      fail(ErrorKind::input, "'" + path + "' holds no complete checkpoint (step-* folders with a valid index.json) "
                             "and is not a Hugging Face folder (no config.json); check the path");
    folder = newest;
  }
  CheckpointIndex index = read_checkpoint_index(folder.string());
  if (index.smelt_version != SMELT_VERSION)
    fail(ErrorKind::input, "checkpoint '" + folder.string() + "' was written by smelt " + index.smelt_version +
                               "; this is smelt " + SMELT_VERSION + ". Resume it with smelt " + index.smelt_version +
                               ", or continue from its weights alone: smelt export --format hf, then load that folder");
  const ModelConfig saved = model_config_from_json(index.model_json, folder.string() + "/index.json");
  const std::string differences = model_differences(saved, model);
  if (!differences.empty())
    fail(ErrorKind::input, "checkpoint '" + folder.string() + "' is of another model: " + differences +
                               "; use the config it was trained with, or start a fresh run folder");
  if (index.sharding.sharded()) {
    check_sharding_matches(folder.string(), index, ParameterLayout(model));
    return index;
  }
  for (const char* required : {"model.safetensors", "optimizer.safetensors"}) {
    bool listed = false;
    for (const auto& f : index.files) listed = listed || f.name == required;
    if (!listed) fail(ErrorKind::input, "checkpoint '" + folder.string() + "' index lists no " + required);
  }
  return index;
}

}  // namespace

LoadedCheckpoint load_checkpoint(const std::string& path, const ModelConfig& model) {
  LoadedCheckpoint loaded;
  if (is_hf_folder(path)) {
    const HfConfig hf = read_hf_config(path);
    const std::string differences = model_differences(hf.model, model);
    if (!differences.empty())
      fail(ErrorKind::input, "Hugging Face folder '" + path + "' holds another model: " + differences +
                                 "; set the [model] section to its shapes");
    loaded.path = path;
    loaded.from_hf = true;
    loaded.parameters = load_hf_weights(path, model);
    return loaded;
  }
  fs::path folder;
  const CheckpointIndex index = open_checkpoint(path, model, folder);
  const ParameterLayout layout(model);
  loaded.path = folder.string();
  loaded.progress = index.progress;
  if (index.sharding.sharded()) {  // every rank's files, assembled into the whole model
    const size_t total = static_cast<size_t>(layout.total());
    loaded.parameters.assign(total, 0.0f);
    loaded.exp_avg.assign(total, 0.0f);
    loaded.exp_avg_sq.assign(total, 0.0f);
    read_sharded_ranges(folder.string(), index, layout,
                        {{CheckpointPart::parameters, 0, layout.total(), loaded.parameters.data()},
                         {CheckpointPart::exp_avg, 0, layout.total(), loaded.exp_avg.data()},
                         {CheckpointPart::exp_avg_sq, 0, layout.total(), loaded.exp_avg_sq.data()}});
    return loaded;
  }
  for (const auto& f : index.files) verify_checksum(folder / f.name, f);
  copy_tensors(load_safetensors((folder / "model.safetensors").string()), layout, "", loaded.parameters);
  const SafetensorsFile moments = load_safetensors((folder / "optimizer.safetensors").string());
  copy_tensors(moments, layout, "exp_avg.", loaded.exp_avg);
  copy_tensors(moments, layout, "exp_avg_sq.", loaded.exp_avg_sq);
  loaded.path = folder.string();
  loaded.progress = index.progress;
  return loaded;
}

LoadedCheckpoint load_checkpoint_shards(const std::string& path, const ModelConfig& model, const ShardLayout& shards,
                                        int64_t rank) {
  if (is_hf_folder(path)) return load_checkpoint(path, model);
  fs::path folder;
  const CheckpointIndex index = open_checkpoint(path, model, folder);
  if (!index.sharding.sharded()) return load_checkpoint(folder.string(), model);  // whole model, scattered
  LoadedCheckpoint loaded;
  loaded.path = folder.string();
  loaded.progress = index.progress;
  loaded.local_shards = true;
  const size_t local = static_cast<size_t>(shards.local_total());
  loaded.parameters.assign(local, 0.0f);
  loaded.exp_avg.assign(local, 0.0f);
  loaded.exp_avg_sq.assign(local, 0.0f);
  // The same world size reads only its own files; another reads the ranges it now owns from
  // whichever files hold them.
  read_sharded_ranges(folder.string(), index, ParameterLayout(model),
                      local_ranges(shards, rank, loaded.parameters.data(), loaded.exp_avg.data(), loaded.exp_avg_sq.data()));
  return loaded;
}

std::vector<float> read_sharded_parameters(const std::string& folder, const CheckpointIndex& index,
                                           const ModelConfig& model, std::map<std::string, std::string>* metadata) {
  const ParameterLayout layout(model);
  check_sharding_matches(folder, index, layout);
  std::vector<float> parameters(static_cast<size_t>(layout.total()), 0.0f);
  read_sharded_ranges(folder, index, layout, {{CheckpointPart::parameters, 0, layout.total(), parameters.data()}});
  if (metadata) *metadata = load_safetensors((fs::path(folder) / rank_file_name("model", 0, index.sharding.world_size)).string()).metadata;
  return parameters;
}

void restore_checkpoint(Executor& executor, const LoadedCheckpoint& checkpoint) {
  executor.reset_optimizer_state();
  if (checkpoint.local_shards) {
    executor.load_local_shards(checkpoint.parameters.data(), checkpoint.exp_avg.data(), checkpoint.exp_avg_sq.data());
    return;
  }
  executor.load_parameters(checkpoint.parameters.data());
  if (checkpoint.from_hf) return;
  const TensorView exp_avg = executor.view(executor.plan().exp_avg), exp_avg_sq = executor.view(executor.plan().exp_avg_sq);
  if (exp_avg.dtype != DType::f32 || exp_avg_sq.dtype != DType::f32)
    fail(ErrorKind::config, "checkpoints hold fp32 AdamW moments; this run keeps them in " +
                                std::string(dtype_name(exp_avg.dtype)) + "; use fp32 master weights");
  executor.load_optimizer_state(checkpoint.exp_avg.data(), checkpoint.exp_avg_sq.data());  // this rank's shards when sharded
}

}  // namespace smelt
