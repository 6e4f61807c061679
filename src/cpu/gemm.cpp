// CPU GEMM: out = op(a) @ op(b) (+ addend), row-major, through OpenBLAS.
// f64 -> dgemm, f32 -> sgemm; bf16 and float8 operands are first converted to f32
// in the workspace (float8 dequantized as code / scale, or code * scale when block-scaled),
// then sgemm, then rounded.
#include <cblas.h>

#include <cstring>
#include <string>

#include "cpu/fp8.h"
#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

constexpr size_t kWorkspaceAlignment = 64;

size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment; }

struct GemmShape {
  int64_t m = 0, k = 0, n = 0;  // op(a): (m, k), op(b): (k, n), out: (m, n)
};

std::string describe(const GemmArgs& args) {
  return "a " + args.a.str() + (args.transpose_a ? " transposed" : "") + ", b " + args.b.str() +
         (args.transpose_b ? " transposed" : "") + ", out " + args.out.str();
}

[[noreturn]] void reject(const GemmArgs& args, const std::string& problem) {
  fail(ErrorKind::internal, "gemm: " + problem + " (" + describe(args) + "); fix the shapes or dtypes the caller passes");
}

GemmShape validate(const GemmArgs& args) {
  if (args.a.empty() || args.b.empty() || args.out.empty()) reject(args, "expected a, b and out, found an empty view");
  for (const TensorView* t : {&args.a, &args.b, &args.out, &args.addend, &args.scale_a, &args.scale_b})
    expect_host(*t, "gemm", "operand");
  GemmShape s;
  s.m = args.transpose_a ? args.a.cols() : args.a.rows();
  s.k = args.transpose_a ? args.a.rows() : args.a.cols();
  int64_t k_of_b = args.transpose_b ? args.b.cols() : args.b.rows();
  s.n = args.transpose_b ? args.b.rows() : args.b.cols();
  if (s.k != k_of_b)
    reject(args, "expected op(a) columns (" + std::to_string(s.k) + ") to equal op(b) rows (" +
                     std::to_string(k_of_b) + ")");
  if (args.out.rows() != s.m || args.out.cols() != s.n)
    reject(args, "expected out of (" + std::to_string(s.m) + ", " + std::to_string(s.n) + ")");
  if (!args.addend.empty() && !(args.addend.rows() == s.m && args.addend.cols() == s.n && args.addend.dtype == args.out.dtype))
    reject(args, "expected addend like out, found " + args.addend.str());
  if (!args.addend.empty() && args.accumulate)
    reject(args, "expected either addend or accumulate, found both");

  DType in = args.a.dtype, out = args.out.dtype;
  bool float8 = is_float8(in) && is_float8(args.b.dtype);
  if (!float8 && args.b.dtype != in) reject(args, "expected a and b of the same dtype");
  bool ok = (in == DType::f64 && out == DType::f64) || (in == DType::f32 && out == DType::f32) ||
            ((in == DType::bf16 || float8) && (out == DType::f32 || out == DType::bf16));
  if (!ok) reject(args, "expected f64->f64, f32->f32, or bf16/float8 -> f32/bf16");

  auto check_scale = [&](const TensorView& operand, const TensorView& scale, OperandScaling scaling, const char* name) {
    if (!is_float8(operand.dtype)) {
      if (scaling != OperandScaling::none) reject(args, std::string("expected no scaling of non-float8 operand ") + name);
      return;
    }
    if (scaling == OperandScaling::none) reject(args, std::string("expected a scaling for float8 operand ") + name);
    const bool blocks = scaling == OperandScaling::tile_1x128 || scaling == OperandScaling::block_128x128;
    if (blocks && args.fast_accumulation)
      reject(args, "expected fast accumulation off with block scaling (cuBLASLt supports it only so)");
    if (blocks && (&operand == &args.a ? args.transpose_a : !args.transpose_b))
      reject(args, std::string("expected block-scaled operand ") + name + " K-major (the TN form a @ b^T)");
    int64_t count = scaling == OperandScaling::tensorwise ? 1
                    : blocks ? block_scaled_scale_count(scaling, operand.rows(), operand.cols())
                             : operand.rows();
    if (scale.empty() || scale.dtype != DType::f32 || scale.numel() != count)
      reject(args, std::string("expected f32 scale of ") + std::to_string(count) + " element(s) for operand " + name +
                       ", found " + (scale.empty() ? std::string("none") : scale.str()));
  };
  check_scale(args.a, args.scale_a, args.scaling_a, "a");
  check_scale(args.b, args.scale_b, args.scaling_b, "b");
  return s;
}

// The addend (if any) copied into out, so a BLAS call with beta = 1 adds it.
bool place_addend(const GemmArgs& args) {
  if (args.accumulate) return true;
  if (args.addend.empty()) return false;
  if (args.addend.data != args.out.data) std::memcpy(args.out.data, args.addend.data, args.out.bytes());
  return true;
}

// An operand as a row-major f32 matrix in the workspace (its stored shape).
float* operand_as_f32(const TensorView& operand, const TensorView& scale, OperandScaling scaling, float* destination) {
  int64_t rows = operand.rows(), cols = operand.cols();
  TensorView as_f32(destination, DType::f32, Shape{rows, cols});
  if (is_float8(operand.dtype) && (scaling == OperandScaling::tile_1x128 || scaling == OperandScaling::block_128x128)) {
    dequantize_blocks(operand.reshaped(Shape{rows, cols}), scale, scaling, destination);
    return destination;
  }
  if (is_float8(operand.dtype)) {
    dequantize(DequantizeArgs{operand.reshaped(Shape{rows, cols}), as_f32, scale, scaling == OperandScaling::rowwise});
    return destination;
  }
  const uint16_t* source = operand.as<uint16_t>();  // bf16
  int64_t count = rows * cols;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) destination[i] = bf16_to_float(source[i]);
  return destination;
}

CBLAS_TRANSPOSE blas_transpose(bool t) { return t ? CblasTrans : CblasNoTrans; }

}  // namespace

size_t gemm_workspace_bytes(const WorkspaceShape& shape) {
  size_t m = size_t(shape.max_rows), k = size_t(shape.max_inner), n = size_t(shape.max_cols);
  return align_up(m * k * sizeof(float)) + align_up(k * n * sizeof(float)) + align_up(m * n * sizeof(float));
}

void gemm(const GemmArgs& args, TensorView workspace) {
  GemmShape s = validate(args);
  const int m = int(s.m), n = int(s.n), k = int(s.k);
  const int lda = int(args.a.cols()), ldb = int(args.b.cols()), ldc = n;
  const auto ta = blas_transpose(args.transpose_a), tb = blas_transpose(args.transpose_b);

  if (args.a.dtype == DType::f64) {
    double beta = place_addend(args) ? 1.0 : 0.0;
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, 1.0, args.a.as<double>(), lda, args.b.as<double>(), ldb, beta,
                args.out.as<double>(), ldc);
    return;
  }
  if (args.a.dtype == DType::f32) {
    float beta = place_addend(args) ? 1.0f : 0.0f;
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, args.a.as<float>(), lda, args.b.as<float>(), ldb, beta,
                args.out.as<float>(), ldc);
    return;
  }

  // bf16 / float8: operands to f32 in the workspace.
  size_t a_bytes = align_up(size_t(args.a.numel()) * sizeof(float));
  size_t b_bytes = align_up(size_t(args.b.numel()) * sizeof(float));
  size_t product_bytes = args.out.dtype == DType::f32 ? 0 : align_up(size_t(s.m * s.n) * sizeof(float));
  size_t need = a_bytes + b_bytes + product_bytes;
  if (workspace.empty() || workspace.bytes() < need)
    fail(ErrorKind::internal, "gemm: expected a workspace of at least " + std::to_string(need) + " bytes for " +
                                  describe(args) + ", found " + std::to_string(workspace.empty() ? 0 : workspace.bytes()) +
                                  "; size it with workspace_bytes() over the largest GEMM shapes");
  char* base = static_cast<char*>(workspace.data);
  float* a32 = operand_as_f32(args.a, args.scale_a, args.scaling_a, reinterpret_cast<float*>(base));
  float* b32 = operand_as_f32(args.b, args.scale_b, args.scaling_b, reinterpret_cast<float*>(base + a_bytes));

  if (args.out.dtype == DType::f32) {
    float beta = place_addend(args) ? 1.0f : 0.0f;
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a32, lda, b32, ldb, beta, args.out.as<float>(), ldc);
    return;
  }
  // bf16 out: f32 product, then addend added in f32 and one rounding.
  float* product = reinterpret_cast<float*>(base + a_bytes + b_bytes);
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 1.0f, a32, lda, b32, ldb, 0.0f, product, ldc);
  const uint16_t* addend = args.accumulate ? args.out.as<uint16_t>() : args.addend.as<uint16_t>();
  uint16_t* out = args.out.as<uint16_t>();
  int64_t count = s.m * s.n;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    float value = product[i] + (addend ? bf16_to_float(addend[i]) : 0.0f);
    out[i] = float_to_bf16(value);
  }
}

}  // namespace smelt::cpu
