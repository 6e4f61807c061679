// PlanBuilder: how build_step_plan records buffers (with the steps that use them) and steps, then
// packs the buffers into one arena; plus small helpers the plan's parts share.
#pragma once
#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/step_plan.h"

namespace smelt::plan_detail {

class PlanBuilder {
 public:
  explicit PlanBuilder(StepPlan& plan) : plan_(plan) {}

  int buffer(std::string name, DType dtype, Shape shape, BufferClass kind, bool persistent = false) {
    PlannedBuffer b;
    b.request.name = std::move(name);
    b.request.bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    b.request.kind = kind;
    b.dtype = dtype;
    b.shape = shape;
    plan_.buffers.push_back(b);
    first_.push_back(INT_MAX);
    last_.push_back(-1);
    persistent_.push_back(persistent);
    return static_cast<int>(plan_.buffers.size()) - 1;
  }

  void emit(Step step, std::initializer_list<int> ids) { emit(step, std::vector<int>(ids)); }
  void emit(Step step, const std::vector<int>& ids) {
    int index = static_cast<int>(plan_.steps.size());
    plan_.steps.push_back(step);
    for (int id : ids) {
      if (id < 0) continue;
      first_[id] = std::min(first_[id], index);
      last_[id] = std::max(last_[id], index);
    }
  }

  void finish() {
    const int count = static_cast<int>(plan_.steps.size());
    std::vector<BufferRequest> requests;
    for (size_t i = 0; i < plan_.buffers.size(); ++i) {
      auto& r = plan_.buffers[i].request;
      if (persistent_[i]) {
        r.first_step = 0;
        r.last_step = count - 1;
      } else {
        SMELT_CHECK(last_[i] >= 0, "buffer '" + r.name + "' is never used by any step");
        r.first_step = first_[i];
        r.last_step = last_[i];
      }
      requests.push_back(r);
    }
    plan_.memory = pack_buffers(requests, count);
  }

 private:
  StepPlan& plan_;
  std::vector<int> first_, last_;
  std::vector<bool> persistent_;
};

inline Shape spec_shape(const TensorSpec& spec) {
  return spec.dims[1] == 1 ? Shape{spec.dims[0]} : Shape{spec.dims[0], spec.dims[1]};
}

// Weights gathered in e4m3: sharded, tensorwise, asked for.
inline bool float8_gather_wanted(const StepPlan& plan) {
  return plan.sharded() && plan.options.float8_all_gather && plan.options.float8.recipe == Float8Recipe::tensorwise;
}

}  // namespace smelt::plan_detail
