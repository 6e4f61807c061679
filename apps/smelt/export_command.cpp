// `smelt export`: reads weights from any source smelt knows and writes them for other tools.
#include "export_command.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "core/error.h"
#include "model/parameters.h"
#include "train/hf_weights.h"
#include "train/model_weights.h"
#include "train/safetensors.h"

namespace smelt {

namespace fs = std::filesystem;

int run_export(const ExportCommandOptions& options) {
  if (options.format != "hf" && options.format != "smelt")
    fail(ErrorKind::config, "--format should be hf or smelt, found '" + options.format + "'");
  if (options.dtype != "float32" && options.dtype != "bfloat16")
    fail(ErrorKind::config, "--dtype should be float32 or bfloat16, found '" + options.dtype + "'");
  SavedModel saved = load_weights_from(options.from, "--from", options.tokenizer, options.seq_len);
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
