// Float8 linears on the GPU against the CPU emulation: the quantised operands and scales of the
// last GEMM bit-identical, and the outputs of all three GEMMs (cuBLASLt float8, tensorwise and
// outer-vector scales) within accumulation-order tolerance.
#include "cuda_test_support.h"
#include "model/fp8_linear.h"

namespace smelt::test {
namespace {

class CudaFloat8LinearTest : public CudaOpsTest {
 protected:
  void check(Float8Recipe recipe) {
    const int64_t tokens = 64, in = 128, out = 96;
    // As float8_scratch_sizes would size them: the largest operand of the three GEMMs.
    const Float8ScratchSizes sizes{tokens * std::max(in, out), in * std::max(out, tokens), 128, 128};
    HostTensor x = random_tensor(DType::bf16, Shape{tokens, in}, 11, 2.0);
    HostTensor weight = random_tensor(DType::bf16, Shape{out, in}, 12, 0.1);
    HostTensor grad_output = random_tensor(DType::bf16, Shape{tokens, out}, 13, 1e-3);

    // CPU emulation.
    HostTensor cpu_a(DType::e4m3, Shape{sizes.operand_a}), cpu_b(DType::e4m3, Shape{sizes.operand_b});
    HostTensor cpu_scale_a(DType::f32, Shape{sizes.scale_a}), cpu_scale_b(DType::f32, Shape{sizes.scale_b});
    HostTensor cpu_y(DType::bf16, Shape{tokens, out}), cpu_dx(DType::bf16, Shape{tokens, in});
    HostTensor cpu_dw(DType::f32, Shape{out, in});
    const Float8Scratch cpu_scratch{cpu_a.view, cpu_b.view, cpu_scale_a.view, cpu_scale_b.view};
    float8_linear_forward(*cpu_, recipe, cpu_scratch, x.view, weight.view, cpu_y.view, {});
    float8_linear_backward(*cpu_, recipe, cpu_scratch, x.view, weight.view, grad_output.view, cpu_dx.view, false,
                           cpu_dw.view);

    // CUDA.
    const Float8Scratch scratch{poisoned(DType::e4m3, Shape{sizes.operand_a}),
                                poisoned(DType::e4m3, Shape{sizes.operand_b}), poisoned(DType::f32, Shape{sizes.scale_a}),
                                poisoned(DType::f32, Shape{sizes.scale_b})};
    TensorView y = poisoned(DType::bf16, Shape{tokens, out}), dx = poisoned(DType::bf16, Shape{tokens, in});
    TensorView dw = poisoned(DType::f32, Shape{out, in});
    TensorView device_x = upload(x), device_weight = upload(weight), device_grad = upload(grad_output);
    float8_linear_forward(*cuda_, recipe, scratch, device_x, device_weight, y, {});
    float8_linear_backward(*cuda_, recipe, scratch, device_x, device_weight, device_grad, dx, false, dw);
    cuda_->synchronize();

    // The grad-weight GEMM's operands are still in the scratch: dy^T (out, N) and x^T (in, N).
    expect_bits_equal(cpu_a, download(scratch.operand_a), "operand a (dy^T)");
    expect_bits_equal(cpu_b, download(scratch.operand_b), "operand b (x^T)");
    const int64_t scale_count_a = recipe == Float8Recipe::rowwise ? out : 1;
    const int64_t scale_count_b = recipe == Float8Recipe::rowwise ? in : 1;
    HostTensor scales_a = download(scratch.scale_a), scales_b = download(scratch.scale_b);
    for (int64_t i = 0; i < scale_count_a; ++i) EXPECT_EQ(scales_a.get(i), cpu_scale_a.get(i)) << "scale a " << i;
    for (int64_t i = 0; i < scale_count_b; ++i) EXPECT_EQ(scales_b.get(i), cpu_scale_b.get(i)) << "scale b " << i;
    // Same operands, so only the summation order (and fast accumulation) differs.
    expect_close(cpu_y, download(y), 1e-2, "y");
    expect_close(cpu_dx, download(dx), 1e-2, "dx");
    expect_close(cpu_dw, download(dw), 1e-4, "dW");
  }
};

TEST_F(CudaFloat8LinearTest, TensorwiseMatchesTheCpuEmulation) { check(Float8Recipe::tensorwise); }
TEST_F(CudaFloat8LinearTest, RowwiseMatchesTheCpuEmulation) { check(Float8Recipe::rowwise); }

}  // namespace
}  // namespace smelt::test
