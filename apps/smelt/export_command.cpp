// `smelt export`: reads weights from any source smelt knows and writes them for other tools.
#include "export_command.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "model/parameters.h"
#include "train/checkpoint.h"
#include "train/hf_weights.h"
#include "train/model_weights.h"
#include "train/safetensors.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

SavedModel read_source(const ExportCommandOptions& options) {
  const std::string& from = options.from;
  if (is_hf_folder(from)) {
    const HfConfig hf = read_hf_config(from);
    SavedModel saved;
    saved.model = hf.model;
    saved.tokenizer = options.tokenizer;
    saved.seq_len = options.seq_len > 0 ? options.seq_len : std::min<int64_t>(hf.max_position_embeddings, 2048);
    saved.parameters = load_hf_weights(from, hf.model);
    return saved;
  }
  std::string source = from;
  if (fs::is_directory(from)) {
    if (fs::exists(fs::path(from) / "model.safetensors")) {
      source = (fs::path(from) / "model.safetensors").string();  // a run folder or one checkpoint
    } else if (!fs::exists(fs::path(from) / "index.json")) {    // (index.json alone: a sharded checkpoint)
      const std::string newest = find_newest_checkpoint(from);
      if (newest.empty())
        fail(ErrorKind::input, "--from '" + from + "' holds no model.safetensors, no checkpoint and no config.json; "
                               "expected a run folder, a checkpoint (folder) or a Hugging Face folder");
      source = newest;  // its model.safetensors, or every rank's model files of a sharded one
    }
  }
  SavedModel saved = load_model_weights(source);
  if (options.seq_len > 0) saved.seq_len = options.seq_len;
  return saved;
}

}  // namespace

int run_export(const ExportCommandOptions& options) {
  if (options.format != "hf" && options.format != "smelt")
    fail(ErrorKind::config, "--format should be hf or smelt, found '" + options.format + "'");
  if (options.dtype != "float32" && options.dtype != "bfloat16")
    fail(ErrorKind::config, "--dtype should be float32 or bfloat16, found '" + options.dtype + "'");
  SavedModel saved = read_source(options);
  if (options.format == "hf") {
    save_hf_folder(options.output, saved.model, saved.parameters.data(),
                   options.dtype == "float32" ? DType::f32 : DType::bf16, std::max<int64_t>(saved.seq_len, 1));
    std::cout << "smelt: exported " << describe(saved.model) << " to the Hugging Face folder " << options.output
              << " (" << options.dtype << ")" << std::endl;
    return 0;
  }
  ParameterLayout layout(saved.model);
  std::vector<NamedTensor> tensors;
  for (const auto& p : layout.parameters())
    tensors.push_back({p.name, DType::f32,
                       p.rows == 1 ? std::vector<int64_t>{p.cols} : std::vector<int64_t>{p.rows, p.cols},
                       saved.parameters.data() + p.offset});
  std::string output = options.output;
  if (fs::is_directory(output)) output = (fs::path(output) / "model.safetensors").string();
  save_safetensors(output, tensors,
                   {{"format", "pt"},
                    {"smelt.version", SMELT_VERSION},
                    {"smelt.model", model_config_to_json(saved.model)},
                    {"smelt.tokenizer", saved.tokenizer},
                    {"smelt.seq_len", std::to_string(saved.seq_len)}});
  std::cout << "smelt: exported " << describe(saved.model) << " to " << output << std::endl;
  return 0;
}

}  // namespace smelt
