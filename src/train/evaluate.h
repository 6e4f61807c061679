// Evaluating trained weights (`smelt eval`): the mean next-token loss and perplexity of a run's,
// a checkpoint's or a Hugging Face folder's weights on validation data, computed exactly as the
// trainer's validation computes it (the same plan, numerics, batches and order).
#pragma once
#include <cstdint>
#include <ostream>
#include <string>

#include "core/config.h"
#include "plan/step_plan.h"

namespace smelt {

struct EvaluateOptions {
  std::string weights;    // run folder, checkpoint (folder), folder of checkpoints, model.safetensors or HF folder
  std::string tokenizer;  // tokenizer spec; empty: the one the weights record (an HF folder records none)
  int64_t batches = 0;    // 0: validation.steps; at most what the data holds
};

struct EvaluateResult {
  double loss = 0;            // mean cross-entropy per token (nats)
  double perplexity = 0;      // exp(loss)
  double bits_per_token = 0;  // loss / ln 2
  int64_t batches = 0, tokens = 0;
  bool all_data = false;      // the batches asked for were more than the data holds: all of it was read
  double seconds = 0;         // the forward passes, data loading included
  std::string model, data;    // descriptions
};

// The plan smelt eval runs for a training step's options: forward only (no gradients, optimizer
// state or recompute; activations freed after their last forward reader), one pass, the output
// projection's compute copy (if any) filled once with the others; the same shapes and loss chunk.
PlanOptions evaluation_plan_options(PlanOptions training);

// `config` gives the device, precision, float8 recipe, checkpointing policy, batch, sequence length
// and data (validation.dataset_path, else the held-out part of training.dataset_path); the model's
// shapes and tokenizer come from the weights. Progress goes to `log`.
EvaluateResult evaluate(const JobConfig& config, const EvaluateOptions& options, std::ostream& log);

}  // namespace smelt
