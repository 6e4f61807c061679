// Predicted time of a training step: every plan step's time from its FLOPs and the
// bytes it moves against a device's ceilings (a roofline plus a launch cost), or from
// a calibrated timing measured on the GPU at hand and cached per GPU, op and shape.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "plan/step_plan.h"

namespace smelt {

// What one device sustains (effective, not datasheet, rates). Defaults: one H200
// (docs/memory_plan.md gives where each figure comes from).
struct DeviceCeilings {
  std::string gpu_name = "NVIDIA H200";
  double memory_bytes = 141e9;
  double gemm_flops = 700e12;                   // bf16 / f32-accumulate dense GEMM
  double float8_gemm_flops = 1400e12;           // fp8 GEMM (tensorwise / rowwise scaling)
  // Causal attention (causal FLOPs) at head dims 128 and 64, forward and backward; other head dims
  // interpolate the time per FLOP linearly in 1 / head_dim (a score's softmax and masking cost the
  // same at any head dim, so narrower heads run slower per FLOP).
  double attention_forward_flops = 526e12, attention_forward_flops_d64 = 360e12;
  double attention_backward_flops = 404e12, attention_backward_flops_d64 = 303e12;
  double elementwise_bytes_per_second = 3.3e12; // norms, SwiGLU, RoPE, activation casts (read + write)
  double streaming_bytes_per_second = 3.9e12;   // one long pass over all parameters: AdamW, gradient norm, weight casts
  double kernel_launch_seconds = 5e-6;          // fixed cost of one kernel (launch + tail)
  double collective_bytes_per_second = 350e9;   // per-GPU bus bandwidth of all-gather / reduce-scatter
};

// The attention rate of `ceilings` for heads of `head_dim`, forward or backward (FLOP/s).
double attention_flops(const DeviceCeilings& ceilings, int64_t head_dim, bool backward);

DeviceCeilings h200_ceilings();
DeviceCeilings h100_ceilings();  // 80 GB, H100 SXM rates
DeviceCeilings cpu_ceilings();   // a rough multi-core CPU, for plans of CPU runs
// "h200", "h100" or "cpu"; errors list the known names.
DeviceCeilings ceilings_by_name(const std::string& name);

// Calibrated per-op timings, keyed by GPU name, op and shape (the JSON file format is
// in docs/memory_plan.md). The CUDA side fills it by timing the ops; the planner reads it.
class OpTimingCache {
 public:
  static OpTimingCache load(const std::string& path);  // errors say what is wrong in which entry
  void save(const std::string& path) const;
  void set(const std::string& gpu, const std::string& op, const std::string& shape, double seconds);
  std::optional<double> find(const std::string& gpu, const std::string& op, const std::string& shape) const;
  size_t size() const { return seconds_.size(); }

 private:
  std::map<std::string, double> seconds_;  // gpu \x1f op \x1f shape
};

// The op key of a plan step in the cache: "forward attention.wq", "backward attention.sdpa",
// "output_head"; a recompute step times as its forward op. Layer numbers are left out.
std::string op_timing_key(const Step& step);
// The shape key shared by all ops of a plan: "batch=1 seq=8192 dim=4096 ... dtype=bf16 float8=none shard=1".
std::string shape_timing_key(const ModelConfig& model, const PlanOptions& options, bool float8_linears);

struct PlanTime {
  double seconds = 0;              // predicted step time
  double compute_seconds = 0;      // the plan steps, recompute included (each microbatch's)
  double recompute_seconds = 0;    // of which recompute
  double communication_seconds = 0;  // all-gather / reduce-scatter traffic (sharded plans)
  double exposed_communication_seconds = 0;  // the part not hidden behind compute
  double tokens_per_second = 0;    // per GPU
  // Each plan step's time for one run of it, in plan order; compute_seconds is their sum, the
  // steps that run per microbatch counted once for each (PlanOptions::microbatches).
  std::vector<double> step_seconds;
  int calibrated_steps = 0;        // steps timed from the cache rather than the ceilings
  bool timing_cache = false;       // a cache was given (it may match none of the plan's steps)
};

class CostModel {
 public:
  CostModel(DeviceCeilings ceilings, bool float8_linears = false, const OpTimingCache* cache = nullptr)
      : ceilings_(std::move(ceilings)), float8_linears_(float8_linears), cache_(cache) {}

  const DeviceCeilings& ceilings() const { return ceilings_; }
  bool float8_linears() const { return float8_linears_; }
  // Predicted seconds of one step of a plan with this model and these options.
  double step_seconds(const Step& step, const ModelConfig& model, const PlanOptions& options) const;
  // The time of forward op `op` of one block (what recomputing it costs).
  double forward_op_seconds(ForwardOp op, const ModelConfig& model, const PlanOptions& options) const;
  PlanTime predict(const StepPlan& plan) const;

 private:
  double roofline_seconds(const Step& step, const ModelConfig& model, const PlanOptions& options) const;
  DeviceCeilings ceilings_;
  bool float8_linears_;
  const OpTimingCache* cache_;
};

}  // namespace smelt
