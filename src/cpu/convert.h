// CPU reference of element-wise dtype conversion between f64, f32 and bf16.
#pragma once
#include "ops/op_args.h"

namespace smelt::cpu {

// dst = src converted element by element; same element count required (shapes may differ).
// f64 -> bf16 goes through f32 (as PyTorch does); same-dtype conversion is a copy.
void convert(const ConvertArgs& args);

}  // namespace smelt::cpu
