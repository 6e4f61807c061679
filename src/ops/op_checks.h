// Argument checks shared by every backend: an op called with a wrong shape or
// dtype is a bug in the caller, reported with both shapes before memory is touched.
#pragma once
#include <initializer_list>
#include <span>
#include <string>

#include "core/tensor.h"
#include "ops/op_args.h"

namespace smelt {

void expect_dtype(const TensorView& view, std::initializer_list<DType> allowed, const char* op, const char* argument);
void expect_same_shape(const TensorView& a, const TensorView& b, const char* op, const char* a_name, const char* b_name);
void expect_elements(const TensorView& view, int64_t count, const char* op, const char* argument);
void expect_device(const TensorView& view, Device device, const char* op, const char* argument);

// AdamW's copy runs (AdamwArgs::copy_ranges): consecutive, in order, covering [0, count), each
// copied run inside a copy of `copy_count` elements, and every begin, count and copy_offset a
// multiple of `alignment` elements. An empty span is one run, copied at 0 when copy_count > 0.
void expect_copy_ranges(std::span<const ParameterRun> ranges, int64_t count, int64_t copy_count, int64_t alignment,
                        const char* op);
// AdamW's amax slots: every run's amax_slot below weight_amax's length, and weight_amax f32 when
// a run names a slot. Device placement is the caller's to check.
void expect_amax_slots(std::span<const ParameterRun> ranges, const TensorView& weight_amax, const char* op);
// AdamW's gradients: without runs, `grads` holds all n; with runs, each run's gradients lie inside
// grads, or with low_grad inside low_grads (bf16), at a grad_offset that is a multiple of
// `alignment`. Dtypes of grads and placement are the caller's to check.
void expect_gradient_runs(const AdamwArgs& args, int64_t alignment, const char* op);

}  // namespace smelt
