// Shape, dtype and device checks for op arguments.
#include "ops/op_checks.h"

#include "core/error.h"

namespace smelt {

void expect_dtype(const TensorView& view, std::initializer_list<DType> allowed, const char* op, const char* argument) {
  for (DType d : allowed)
    if (view.dtype == d) return;
  std::string names;
  for (DType d : allowed) names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
  fail(ErrorKind::internal, std::string(op) + ": " + argument + " must be one of {" + names + "}, found " + view.str());
}

void expect_same_shape(const TensorView& a, const TensorView& b, const char* op, const char* a_name, const char* b_name) {
  if (a.numel() != b.numel() || a.rows() != b.rows())
    fail(ErrorKind::internal, std::string(op) + ": " + a_name + " " + a.str() + " and " + b_name + " " + b.str() +
                                  " must have the same shape");
}

void expect_elements(const TensorView& view, int64_t count, const char* op, const char* argument) {
  if (view.numel() != count)
    fail(ErrorKind::internal, std::string(op) + ": " + argument + " must hold " + std::to_string(count) +
                                  " elements, found " + view.str());
}

void expect_device(const TensorView& view, Device device, const char* op, const char* argument) {
  if (view.device != device)
    fail(ErrorKind::internal, std::string(op) + ": " + argument + " " + view.str() + " is on the wrong device for this backend");
}

void expect_copy_ranges(std::span<const ParameterRun> ranges, int64_t count, int64_t copy_count, int64_t alignment,
                        const char* op) {
  if (ranges.empty()) {
    if (copy_count > 0 && copy_count != count)
      fail(ErrorKind::internal, std::string(op) + ": expected a compute copy of " + std::to_string(count) +
                                    " elements (no copy_ranges: every element is copied), found " +
                                    std::to_string(copy_count) + "; pass the copy's runs in copy_ranges");
    return;
  }
  if (copy_count == 0)
    fail(ErrorKind::internal, std::string(op) + ": copy_ranges given without a compute_copy to write; pass both or neither");
  int64_t next = 0;
  for (size_t r = 0; r < ranges.size(); ++r) {
    const ParameterRun& range = ranges[r];
    const std::string where = std::string(op) + ": copy_ranges[" + std::to_string(r) + "] {begin " +
                              std::to_string(range.begin) + ", count " + std::to_string(range.count) + ", copy_offset " +
                              std::to_string(range.copy_offset) + "}";
    if (range.begin != next || range.count < 0)
      fail(ErrorKind::internal, where + ": expected consecutive runs, this one beginning at " + std::to_string(next) +
                                    "; build them in order over the flat range");
    if (range.begin % alignment != 0 || range.count % alignment != 0 ||
        (range.copied() && range.copy_offset % alignment != 0))
      fail(ErrorKind::internal, where + ": expected multiples of " + std::to_string(alignment) +
                                    " elements; parameters are laid out in 64-element steps");
    if (range.amax_slot < -1)
      fail(ErrorKind::internal, where + ": expected amax_slot -1 (none) or a slot index, found " +
                                    std::to_string(range.amax_slot));
    if (range.copied() && range.copy_offset + range.count > copy_count)
      fail(ErrorKind::internal, where + ": reaches past the compute copy of " + std::to_string(copy_count) +
                                    " elements; size the copy from the same runs");
    next = range.begin + range.count;
  }
  if (next != count)
    fail(ErrorKind::internal, std::string(op) + ": copy_ranges cover [0, " + std::to_string(next) + "), expected [0, " +
                                  std::to_string(count) + "); the runs must cover every parameter");
}

void expect_amax_slots(std::span<const ParameterRun> ranges, const TensorView& weight_amax, const char* op) {
  for (size_t r = 0; r < ranges.size(); ++r) {
    if (ranges[r].amax_slot < 0) continue;
    if (weight_amax.empty())
      fail(ErrorKind::internal, std::string(op) + ": copy_ranges[" + std::to_string(r) + "] names amax slot " +
                                    std::to_string(ranges[r].amax_slot) + " but no weight_amax was given; pass it");
    if (weight_amax.dtype != DType::f32 || ranges[r].amax_slot >= weight_amax.numel())
      fail(ErrorKind::internal, std::string(op) + ": copy_ranges[" + std::to_string(r) + "] names amax slot " +
                                    std::to_string(ranges[r].amax_slot) + ", expected an f32 weight_amax longer than "
                                    "that, found " + weight_amax.str());
  }
}

void expect_gradient_runs(const AdamwArgs& args, int64_t alignment, const char* op) {
  const int64_t count = args.params.numel();
  if (args.copy_ranges.empty()) {
    if (args.grads.numel() != count)
      fail(ErrorKind::internal, std::string(op) + ": expected grads of " + std::to_string(count) +
                                    " elements (no copy_ranges: laid out like params), found " + args.grads.str());
    if (!args.low_grads.empty())
      fail(ErrorKind::internal, std::string(op) + ": low_grads " + args.low_grads.str() +
                                    " given without copy_ranges to say which runs they hold; pass both or neither");
    return;
  }
  if (!args.low_grads.empty() && args.low_grads.dtype != DType::bf16)
    fail(ErrorKind::internal, std::string(op) + ": expected bf16 low_grads, found " + args.low_grads.str());
  for (size_t r = 0; r < args.copy_ranges.size(); ++r) {
    const ParameterRun& run = args.copy_ranges[r];
    const TensorView& grads = run.low_grad ? args.low_grads : args.grads;
    const std::string where = std::string(op) + ": copy_ranges[" + std::to_string(r) + "] {begin " +
                              std::to_string(run.begin) + ", count " + std::to_string(run.count) + ", grad_offset " +
                              std::to_string(run.grad_offset) + (run.low_grad ? ", low_grad}" : "}");
    if (run.own_grad)
      fail(ErrorKind::internal, where + ": a run with a gradient buffer of its own; call AdamW for it alone, "
                                        "with that buffer as grads and no copy_ranges");
    if (run.low_grad && run.grad_offset < 0)
      fail(ErrorKind::internal, where + ": a run with its gradients in low_grads needs a grad_offset");
    if (run.gradient_offset() % alignment != 0)
      fail(ErrorKind::internal, where + ": expected a grad_offset that is a multiple of " + std::to_string(alignment) +
                                    " elements; parameters are laid out in 64-element steps");
    if (run.gradient_offset() + run.count > grads.numel())
      fail(ErrorKind::internal, where + ": reaches past " + (run.low_grad ? "low_grads " : "grads ") + grads.str() +
                                    "; size the gradient buffers from the same runs");
  }
}

}  // namespace smelt
