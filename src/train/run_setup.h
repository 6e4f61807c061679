// From a JobConfig to what a run needs before it allocates: the tokenizer, the
// model shapes, the checkpointing policy and the StepPlan.
#pragma once
#include <memory>

#include "core/config.h"
#include "data/tokenizer.h"
#include "ops/backend.h"
#include "plan/step_plan.h"

namespace smelt {

struct RunSetup {
  JobConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
  ModelConfig model;
  PlanOptions plan_options;
};

// Validates the config, loads the tokenizer and derives the model and plan options.
// `backend` sizes the workspace; without one (planning for a device this machine
// lacks) a conservative estimate is used.
// `need_tokenizer` false (planning) skips loading it when the model's vocabulary is known.
RunSetup prepare_run(const JobConfig& config, const Backend* backend, bool need_tokenizer = true);

WorkspaceShape workspace_shape(const ModelConfig& model, const PlanOptions& options);
// Workspace estimate for a device without its backend at hand.
size_t estimated_workspace_bytes(const std::string& device, const WorkspaceShape& shape);

}  // namespace smelt
