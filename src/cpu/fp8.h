// CPU reference of the float8 ops: amax (tensorwise or per row), quantize to e4m3/e5m2 with a
// scale, dequantize back. Element rounding comes from core/numerics.h, shared with CUDA.
#pragma once
#include "ops/op_args.h"

namespace smelt::cpu {

// amax[0] = max |x| (tensorwise) or amax[r] = max_c |x[r, c]| (rowwise; per column with transpose);
// column_amax[c] = max_r |x[r, c]| when given. NaN propagates.
void amax(const AmaxArgs& args);
// The amax of a tensor, seen as (rows, cols) by its last dimension, over its stored values, into
// result (1): what a producer that fuses the amax into its own pass gives.
void amax_of(const TensorView& x, const TensorView& result);

// dst = float_to_float8(float(src) * scale), the multiply in float32, saturating; with transpose
// dst (cols, rows) holds src^T and a rowwise scale is one per dst row. With `amax` the scale is
// amax_to_scale(amax) and is written to `scale`; dst_transposed (src^T) is a second output.
void quantize(const QuantizeArgs& args);

// scale[i] = amax_to_scale(amax[i]); in place when the views alias.
void scale_from_amax(const ScaleFromAmaxArgs& args);

// dst = float8_to_float(src) / scale in float32, then rounded to dst's dtype.
void dequantize(const DequantizeArgs& args);
void transpose(const TransposeArgs& args);

// Block-scaled float8 (core/float8_blocks.h): each tile's or block's amax, its dequantisation
// scale and its codes, for dst and/or dst_transposed (see BlockQuantizeArgs).
void quantize_blocks(const BlockQuantizeArgs& args);
// dst (rows * cols floats) = code * scale of a tile_1x128 or block_128x128 operand.
void dequantize_blocks(const TensorView& src, const TensorView& scale, OperandScaling scaling, float* dst);
// How many scales an operand of (rows, cols) has under a block scaling.
int64_t block_scaled_scale_count(OperandScaling scaling, int64_t rows, int64_t cols);

}  // namespace smelt::cpu
