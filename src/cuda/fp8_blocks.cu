// Block-scaled float8 quantisation on the GPU (the blockwise recipe): one read of src per 128x128
// tile gives dst in 1x128 tiles (or 128x128 blocks) and dst^T in src's 128x1 tiles (or the same
// blocks), each amax taken and each scale computed in the kernel. Scales and codes come from
// core/float8_blocks.h, so the results are bit-identical to the CPU reference.
#include <type_traits>

#include "core/float8_blocks.h"
#include "cuda/cuda_common.cuh"

namespace smelt::cuda {
namespace {

// One thread block per 128x128 tile of src, 256 threads; each thread holds an 8x8 patch in
// registers (8 rows x 8 consecutive columns): patch column t % 16, patch row t / 16.
constexpr int kTile = int(kFloat8BlockSize);
constexpr int kPatch = 8;
constexpr int kPatchesPerRow = kTile / kPatch;  // 16: a half-warp spans one row of the tile
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// |x| as float bits: for non-negative floats the unsigned order is the numeric order, and every
// NaN sorts above infinity, so an unsigned max propagates NaN as the CPU reference does.
__device__ __forceinline__ uint32_t magnitude_bits(float x) { return __float_as_uint(x) & 0x7FFFFFFFu; }

__device__ __forceinline__ uint32_t max_across_lanes(uint32_t value, int first_offset) {
  for (int offset = first_offset; offset > 0; offset >>= 1)
    value = max(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// ---- the patch a thread holds: raw src bits, converted to float when used -------------------

template <typename T>
struct Patch;

// bf16: two elements per 32-bit word (the lower half is the earlier column), 32 registers.
template <>
struct Patch<__nv_bfloat16> {
  uint32_t words[kPatch][kPatch / 2];

  __device__ __forceinline__ float at(int i, int j) const {
    const uint32_t word = words[i][j / 2];
    return __uint_as_float(j % 2 ? word & 0xFFFF0000u : word << 16);
  }
  __device__ __forceinline__ void load_vector(int i, const __nv_bfloat16* p) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    words[i][0] = v.x, words[i][1] = v.y, words[i][2] = v.z, words[i][3] = v.w;
  }
  // The first `count` columns from p, zeros after them.
  __device__ __forceinline__ void load_elements(int i, const __nv_bfloat16* p, int count) {
    const auto* bits = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int w = 0; w < kPatch / 2; ++w) {
      const uint32_t low = 2 * w < count ? bits[2 * w] : 0u, high = 2 * w + 1 < count ? bits[2 * w + 1] : 0u;
      words[i][w] = low | high << 16;
    }
  }
};

template <>
struct Patch<float> {
  float values[kPatch][kPatch];

  __device__ __forceinline__ float at(int i, int j) const { return values[i][j]; }
  __device__ __forceinline__ void load_vector(int i, const float* p) {
    const float4 a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
    values[i][0] = a.x, values[i][1] = a.y, values[i][2] = a.z, values[i][3] = a.w;
    values[i][4] = b.x, values[i][5] = b.y, values[i][6] = b.z, values[i][7] = b.w;
  }
  __device__ __forceinline__ void load_elements(int i, const float* p, int count) {
#pragma unroll
    for (int j = 0; j < kPatch; ++j) values[i][j] = j < count ? p[j] : 0.0f;
  }
};

// ---- the kernel -----------------------------------------------------------------------------

// Outputs of one launch (null pointers: not asked for) and which store widths the shapes and
// pointers allow.
struct BlockOutputs {
  uint8_t* dst = nullptr;             // (rows, cols)
  float* scale = nullptr;
  uint8_t* dst_transposed = nullptr;  // (cols, rows)
  float* scale_transposed = nullptr;
  bool weight_blocks = false;
  bool vector_load = false;              // src 16-byte aligned, cols % 8 == 0
  bool vector_store = false;             // dst 8-byte aligned, cols % 8 == 0
  bool vector_store_transposed = false;  // dst_transposed 16-byte aligned, rows % 16 == 0
};

// Where thread `threadIdx.x` sits in its tile.
struct PatchPlace {
  int patch_row, patch_column;         // 0..15 each
  int64_t row0, column0;               // the tile's first src row and column
  int64_t first_row, first_column;     // the patch's
  int columns;                         // how many of the patch's 8 columns exist (0..8)
};

__device__ __forceinline__ PatchPlace patch_place(int64_t cols) {
  PatchPlace place;
  place.patch_row = threadIdx.x / kPatchesPerRow;
  place.patch_column = threadIdx.x % kPatchesPerRow;
  place.row0 = int64_t(blockIdx.y) * kTile;
  place.column0 = int64_t(blockIdx.x) * kTile;
  place.first_row = place.row0 + place.patch_row * kPatch;
  place.first_column = place.column0 + place.patch_column * kPatch;
  const int64_t left = cols - place.first_column;
  place.columns = left <= 0 ? 0 : left >= kPatch ? kPatch : int(left);
  return place;
}

// Rows and columns past src's edge read as zeros (they never raise an amax).
template <typename T>
__device__ __forceinline__ void load_patch(Patch<T>& patch, const T* src, int64_t rows, int64_t cols,
                                           const PatchPlace& place, bool vector_load) {
#pragma unroll
  for (int i = 0; i < kPatch; ++i) {
    const int64_t row = place.first_row + i;
    const int count = row < rows ? place.columns : 0;
    const T* p = src + row * cols + place.first_column;
    if (vector_load && count == kPatch) patch.load_vector(i, p);
    else patch.load_elements(i, p, count);
  }
}

// Maximum over the block of one value per thread; every thread gets it.
__device__ __forceinline__ uint32_t block_max_bits(uint32_t value, uint32_t* partial) {
  value = max_across_lanes(value, 16);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = value;
  __syncthreads();
  value = partial[0];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) value = max(value, partial[w]);
  return value;
}

// 8 codes as two little-endian words: byte k is code k.
__device__ __forceinline__ uint2 pack_codes(const uint8_t (&codes)[kPatch]) {
  uint32_t words[2];
#pragma unroll
  for (int w = 0; w < 2; ++w)
    words[w] = uint32_t(codes[4 * w]) | uint32_t(codes[4 * w + 1]) << 8 | uint32_t(codes[4 * w + 2]) << 16 |
               uint32_t(codes[4 * w + 3]) << 24;
  return make_uint2(words[0], words[1]);
}

__device__ __forceinline__ uint8_t byte_of(const uint4& v, int b) {
  const uint32_t word = b < 4 ? v.x : b < 8 ? v.y : b < 12 ? v.z : v.w;
  return uint8_t(word >> (8 * (b % 4)));
}

// dst (rows, cols), patch row i with its 1x128 tile's (or block's) scale: one 8-byte store per row.
template <typename T, Float8Format Format>
__device__ __forceinline__ void store_rows(const Patch<T>& patch, const float (&row_scale)[kPatch], int64_t rows,
                                           int64_t cols, const PatchPlace& place, const BlockOutputs& out) {
#pragma unroll
  for (int i = 0; i < kPatch; ++i) {
    const int64_t row = place.first_row + i;
    if (row >= rows || place.columns == 0) continue;
    uint8_t codes[kPatch];
#pragma unroll
    for (int j = 0; j < kPatch; ++j) codes[j] = block_quantize(patch.at(i, j), row_scale[i], Format);
    uint8_t* target = out.dst + row * cols + place.first_column;
    if (out.vector_store) {
      *reinterpret_cast<uint2*>(target) = pack_codes(codes);
    } else {
#pragma unroll
      for (int j = 0; j < kPatch; ++j)
        if (j < place.columns) target[j] = codes[j];
    }
  }
}

// The transposed codes of a tile in shared memory, [src column][8-row chunk]: chunk a of column c
// sits in slot a ^ (c / 8), so that the 16 patches of a half-warp (same patch row, columns c / 8 =
// 0..15) write 16 different bank pairs, and a row of 128 codes still reads as 8 aligned 16-byte slots.
using TransposedCodes = uint2[kTile][kTile / kPatch];

template <typename T, Float8Format Format>
__device__ __forceinline__ void stage_transposed(const Patch<T>& patch, const float (&column_scale)[kPatch],
                                                 const PatchPlace& place, TransposedCodes& codes_by_column) {
#pragma unroll
  for (int j = 0; j < kPatch; ++j) {
    uint8_t codes[kPatch];
#pragma unroll
    for (int i = 0; i < kPatch; ++i) codes[i] = block_quantize(patch.at(i, j), column_scale[j], Format);
    codes_by_column[place.patch_column * kPatch + j][place.patch_row ^ place.patch_column] = pack_codes(codes);
  }
}

// dst_transposed (cols, rows) from the staged codes: 8 threads per src column, 16 rows each, so a
// quarter-warp writes 128 consecutive bytes of one dst_transposed row.
__device__ __forceinline__ void store_transposed(const TransposedCodes& codes_by_column, int64_t rows, int64_t cols,
                                                 const PatchPlace& place, const BlockOutputs& out) {
  const int chunk = threadIdx.x % 8;  // rows 16 * chunk .. + 15 of the tile
#pragma unroll
  for (int pass = 0; pass < kTile / (kThreads / 8); ++pass) {
    const int c = threadIdx.x / 8 + pass * (kThreads / 8), group = c / kPatch;
    uint4 v = reinterpret_cast<const uint4*>(codes_by_column[c])[chunk ^ (group >> 1)];
    if (group & 1) v = make_uint4(v.z, v.w, v.x, v.y);  // the two 8-row halves sit swapped
    const int64_t column = place.column0 + c, row = place.row0 + 16 * chunk;
    if (column >= cols || row >= rows) continue;
    uint8_t* target = out.dst_transposed + column * rows + row;
    if (out.vector_store_transposed) {
      *reinterpret_cast<uint4*>(target) = v;
    } else {
      const int64_t count = rows - row;
#pragma unroll
      for (int b = 0; b < 16; ++b)
        if (b < count) target[b] = byte_of(v, b);
    }
  }
}

// Per-row amax over a 1x128 tile: the 16 threads of a half-warp hold one row of the tile.
template <Float8Format Format>
__device__ __forceinline__ void row_tile_scales(const uint32_t (&row_bits)[kPatch], float (&row_scale)[kPatch],
                                                int64_t rows, const PatchPlace& place, float* scale_out) {
#pragma unroll
  for (int i = 0; i < kPatch; ++i) {
    const uint32_t bits = max_across_lanes(row_bits[i], kPatchesPerRow / 2);
    row_scale[i] = block_dequantization_scale(__uint_as_float(bits), Format);
    const int64_t row = place.first_row + i;
    if (place.patch_column == 0 && row < rows) scale_out[tile_scale_index(row, place.column0, rows)] = row_scale[i];
  }
}

// Per-column amax over src's 128x1 tile: lanes l and l + 16 of a warp, then the 8 warps through
// shared memory ([warp][j][patch column], so the writes fall in different banks).
template <Float8Format Format>
__device__ __forceinline__ void column_tile_scales(const uint32_t (&column_bits)[kPatch], float (&column_scale)[kPatch],
                                                   int64_t cols, const PatchPlace& place, float* scale_out,
                                                   uint32_t (&partial)[kWarps][kTile], float (&scales)[kTile]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPatch; ++j) {
    const uint32_t bits = max(column_bits[j], __shfl_xor_sync(0xffffffffu, column_bits[j], 16));
    if (lane < 16) partial[warp][j * kPatchesPerRow + place.patch_column] = bits;
  }
  __syncthreads();
  if (threadIdx.x < kTile) {
    const int c = threadIdx.x;
    uint32_t bits = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) bits = max(bits, partial[w][(c % kPatch) * kPatchesPerRow + c / kPatch]);
    const float scale = block_dequantization_scale(__uint_as_float(bits), Format);
    scales[c] = scale;
    // dst_transposed is (cols, rows): its row is src's column, its 1x128 tiles run along src's rows.
    if (place.column0 + c < cols) scale_out[tile_scale_index(place.column0 + c, place.row0, cols)] = scale;
  }
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kPatch; ++j) column_scale[j] = scales[place.patch_column * kPatch + j];
}

// One 128x128 tile of src: amaxes, scales, dst codes (straight from registers), dst_transposed
// codes (through shared memory). RowFormat is dst's, ColumnFormat dst_transposed's.
template <typename T, Float8Format RowFormat, Float8Format ColumnFormat>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_block_tiles(const T* src, int64_t rows, int64_t cols, BlockOutputs out) {
  __shared__ __align__(16) TransposedCodes codes_by_column;  // 16 KB
  __shared__ uint32_t column_partial[kWarps][kTile];
  __shared__ float column_scales[kTile];
  __shared__ uint32_t block_partial[kWarps];

  const PatchPlace place = patch_place(cols);
  Patch<T> patch;
  load_patch(patch, src, rows, cols, place, out.vector_load);

  uint32_t row_bits[kPatch], column_bits[kPatch];
#pragma unroll
  for (int k = 0; k < kPatch; ++k) row_bits[k] = column_bits[k] = 0;
#pragma unroll
  for (int i = 0; i < kPatch; ++i)
#pragma unroll
    for (int j = 0; j < kPatch; ++j) {
      const uint32_t bits = magnitude_bits(patch.at(i, j));
      row_bits[i] = max(row_bits[i], bits);
      column_bits[j] = max(column_bits[j], bits);
    }

  float row_scale[kPatch], column_scale[kPatch];
  if (out.weight_blocks) {  // one amax for the block, each output's scale in its own format
    uint32_t bits = 0;
#pragma unroll
    for (int i = 0; i < kPatch; ++i) bits = max(bits, row_bits[i]);
    const float amax = __uint_as_float(block_max_bits(bits, block_partial));
    const float scale = block_dequantization_scale(amax, RowFormat);
    const float scale_transposed = block_dequantization_scale(amax, ColumnFormat);
#pragma unroll
    for (int k = 0; k < kPatch; ++k) row_scale[k] = scale, column_scale[k] = scale_transposed;
    if (threadIdx.x == 0 && out.dst) out.scale[block_scale_index(place.row0, place.column0, cols)] = scale;
    if (threadIdx.x == 0 && out.dst_transposed)
      out.scale_transposed[block_scale_index(place.column0, place.row0, rows)] = scale_transposed;
  } else {
    if (out.dst) row_tile_scales<RowFormat>(row_bits, row_scale, rows, place, out.scale);
    if (out.dst_transposed)
      column_tile_scales<ColumnFormat>(column_bits, column_scale, cols, place, out.scale_transposed, column_partial,
                                       column_scales);
  }

  if (out.dst) store_rows<T, RowFormat>(patch, row_scale, rows, cols, place, out);
  if (out.dst_transposed) {
    stage_transposed<T, ColumnFormat>(patch, column_scale, place, codes_by_column);
    __syncthreads();
    store_transposed(codes_by_column, rows, cols, place, out);
  }
}

// ---- host side ------------------------------------------------------------------------------

template <Float8Format Value>
using FormatConstant = std::integral_constant<Float8Format, Value>;

// Calls body(FormatConstant<format>{}), so the format is a compile-time constant in the kernel.
template <typename Body>
void dispatch_format(Float8Format format, Body&& body) {
  if (format == Float8Format::e4m3) body(FormatConstant<Float8Format::e4m3>{});
  else body(FormatConstant<Float8Format::e5m2>{});
}

Float8Format float8_format_of(const TensorView& dst, const char* name) {
  if (dst.dtype == DType::e4m3) return Float8Format::e4m3;
  if (dst.dtype == DType::e5m2) return Float8Format::e5m2;
  fail(ErrorKind::internal, std::string("cuda quantize_blocks: expected `") + name + "` in e4m3 or e5m2, found " +
                                dst.str() + "; pass a float8 output view");
}

bool aligned_to(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Checks one output and its scales: (out_rows, out_cols) float8, scale_count f32 scales.
Float8Format check_output(const TensorView& dst, const TensorView& scale, int64_t out_rows, int64_t out_cols,
                          int64_t scale_count, const char* name, const char* scale_name) {
  const char* op = "quantize_blocks";
  expect_device(dst, op, name);
  const Float8Format format = float8_format_of(dst, name);
  if (dst.rows() != out_rows || dst.cols() != out_cols)
    fail(ErrorKind::internal, std::string("cuda quantize_blocks: expected `") + name + "` of (" +
                                  std::to_string(out_rows) + ", " + std::to_string(out_cols) + "), found " + dst.str() +
                                  (std::string(name) == "dst" ? "; pass a view shaped like src"
                                                              : "; pass a view shaped like src transposed"));
  expect_device(scale, op, scale_name);
  expect_dtype(scale, DType::f32, op, scale_name);
  expect_numel(scale, scale_count, op, scale_name);
  return format;
}

}  // namespace

void quantize_blocks(CudaContext& context, const BlockQuantizeArgs& args) {
  const char* op = "quantize_blocks";
  expect_device(args.src, op, "src");
  if (args.dst.empty() && args.dst_transposed.empty())
    fail(ErrorKind::internal, "cuda quantize_blocks: expected dst or dst_transposed to write, found neither");
  const int64_t rows = args.src.rows(), cols = args.src.cols();
  const bool weights = args.weight_blocks;
  BlockOutputs out;
  out.weight_blocks = weights;
  Float8Format format = Float8Format::e4m3, transposed_format = Float8Format::e4m3;
  if (!args.dst.empty()) {
    format = check_output(args.dst, args.scale, rows, cols,
                          weights ? block_scale_count(rows, cols) : tile_scale_count(rows, cols), "dst", "scale");
    out.dst = args.dst.as<uint8_t>();
    out.scale = args.scale.as<float>();
    out.vector_store = aligned_to(out.dst, 8) && cols % kPatch == 0;
  }
  if (!args.dst_transposed.empty()) {
    transposed_format = check_output(args.dst_transposed, args.scale_transposed, cols, rows,
                                     weights ? block_scale_count(cols, rows) : tile_scale_count(cols, rows),
                                     "dst_transposed", "scale_transposed");
    out.dst_transposed = args.dst_transposed.as<uint8_t>();
    out.scale_transposed = args.scale_transposed.as<float>();
    out.vector_store_transposed = aligned_to(out.dst_transposed, 16) && rows % 16 == 0;
  }
  if (rows == 0 || cols == 0) return;
  const int64_t row_tiles = float8_block_count(rows), column_tiles = float8_block_count(cols);
  if (row_tiles > 65535 || column_tiles > int64_t(INT32_MAX))
    fail(ErrorKind::internal, "cuda quantize_blocks: expected at most 65535 * 128 rows, found src " + args.src.str() +
                                  "; quantise the rows in slices");
  out.vector_load = aligned_to(args.src.data, 16) && cols % kPatch == 0;
  const dim3 grid(static_cast<unsigned>(column_tiles), static_cast<unsigned>(row_tiles));
  dispatch_activation(args.src.dtype, op, [&](auto element) {
    using T = decltype(element);
    dispatch_format(format, [&](auto row_format) {
      dispatch_format(transposed_format, [&](auto column_format) {
        quantize_block_tiles<T, decltype(row_format)::value, decltype(column_format)::value>
            <<<grid, kThreads, 0, context.stream>>>(args.src.as<T>(), rows, cols, out);
        SMELT_CUDA_LAUNCH_CHECK("quantize_block_tiles");
      });
    });
  });
}

}  // namespace smelt::cuda
