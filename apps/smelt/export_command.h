// `smelt export`: weights from a run, a checkpoint or a Hugging Face folder, written as a
// Hugging Face Llama folder (--format hf) or as smelt's model.safetensors (--format smelt).
#pragma once
#include <cstdint>
#include <string>

namespace smelt {

struct ExportCommandOptions {
  std::string from;               // run folder, model.safetensors, checkpoint, folder of checkpoints, or HF folder
  std::string output;             // folder (hf) or file (smelt)
  std::string format = "hf";      // hf or smelt
  std::string dtype = "bfloat16"; // hf tensors: float32 or bfloat16
  std::string tokenizer = "byte"; // smelt format from an HF folder: the tokenizer spec to record
  int64_t seq_len = 0;            // context recorded; 0: as the source says (HF: 2048 at most)
};

int run_export(const ExportCommandOptions& options);

}  // namespace smelt
