// Executor: runs a StepPlan's steps on a backend, with every buffer a view into
// the one arena the MemoryPlan sized. Owns no memory of its own.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "model/llama_ops.h"
#include "plan/step_plan.h"

namespace smelt {

struct OptimizerSettings {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0, max_norm = 0;
  int64_t step = 1;
};

class Executor {
 public:
  // Allocates the arena (the run's one allocation) from the backend's memory resource.
  Executor(const StepPlan& plan, Backend& backend);

  const StepPlan& plan() const { return plan_; }
  Backend& backend() { return backend_; }
  const Arena& arena() const { return *arena_; }
  TensorView view(int buffer) const;
  const ParameterLayout& layout() const { return layout_; }

  // Host-side setup: parameters (fp32, total() floats), zeroed optimizer state, rope table.
  void load_parameters(const float* host);
  void read_parameters(float* host);
  void reset_optimizer_state();

  // Copies a batch (N ids each) into the token buffers.
  void load_batch(const int32_t* inputs, const int32_t* targets);
  // Runs every step of the plan once: run_gradients (everything but the update), then
  // run_update (the optimizer and the weight cast). A caller that inspects the loss and
  // gradient norm before deciding to update calls the two halves itself.
  void run(const OptimizerSettings& optimizer);
  void run_gradients(const OptimizerSettings& optimizer);
  void run_update(const OptimizerSettings& optimizer);
  static bool is_update(const Step& step);
  // Runs the steps that compute the loss and nothing else (validation, finite differences):
  // the forward, the output head and the loss reduction.
  void run_loss(const OptimizerSettings& optimizer);
  void run_step(const Step& step, const OptimizerSettings& optimizer);

  // Whole-step graphs: after one eager step, run_gradients' steps are captured once and
  // replayed every step (the update, whose learning rate changes, runs eagerly). Ignored by backends without graphs and while timing is enabled.
  void enable_graph(bool enabled) { graph_wanted_ = enabled; }
  bool graph_active() const { return graph_captured_; }

  // Per-step timing for traces: when enabled, run() marks the backend's timeline around
  // every step (and names an NVTX range per step); step_milliseconds() reads them back
  // after the step (it synchronises).
  void enable_timing(bool enabled);
  std::vector<double> step_milliseconds();

  // Results of the last step, read from the backend (synchronises).
  double loss();
  double gradient_norm();

 private:
  void run_indexed(size_t index, const OptimizerSettings& optimizer);
  void run_steps(bool updates, const OptimizerSettings& optimizer);
  LayerViews layer_views(const Step& step) const;
  HeadViews head_views() const;
  TensorView weight_view(const ParameterInfo& info) const;  // compute dtype
  TensorView grad_view(const ParameterInfo& info) const;

  const StepPlan& plan_;
  Backend& backend_;
  ParameterLayout layout_;
  std::unique_ptr<Arena> arena_;
  ModelContext context_;
  bool timing_ = false;
  bool graph_wanted_ = false, graph_captured_ = false, graph_failed_ = false;
  int eager_runs_ = 0;
  std::vector<std::string> step_names_;
};

}  // namespace smelt
