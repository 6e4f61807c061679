// The CUDA embedding backward is deterministic: bit-identical to the CPU reference (both sum each
// token's gradient rows in position order) and to itself run after run, with tokens repeated
// hundreds of times (more occurrences than a block's chunk of positions). Skips without a GPU.
#include "cuda/cuda_test_support.h"

namespace smelt::test {
namespace {

class CudaEmbedding : public CudaOpsTest {};

TEST_F(CudaEmbedding, BackwardIsBitIdenticalToTheCpuAndRepeatable) {
  struct Case {
    int64_t count, vocabulary, dim;
  };
  // Few distinct tokens (each ~100-700 times), a vocabulary larger than the count, a dim that is
  // not a multiple of the block.
  for (const Case c : {Case{1500, 3, 64}, Case{2049, 17, 300}, Case{777, 4000, 96}})
    for (DType dtype : {DType::f32, DType::bf16}) {
      const std::string what = std::string(dtype_name(dtype)) + " tokens " + std::to_string(c.count) + " vocabulary " +
                               std::to_string(c.vocabulary) + " dim " + std::to_string(c.dim);
      HostTensor tokens = random_ids(Shape{c.count}, 40 + static_cast<uint64_t>(c.vocabulary), int32_t(c.vocabulary));
      HostTensor grad_out = random_tensor(dtype, Shape{c.count, c.dim}, 41 + static_cast<uint64_t>(c.dim));
      HostTensor want = nan_tensor(DType::f32, Shape{c.vocabulary, c.dim});
      cpu_->embedding_backward({tokens.view, grad_out.view, want.view});
      const TensorView device_tokens = upload(tokens), device_grad_out = upload(grad_out);
      HostTensor first;
      for (int run = 0; run < 3; ++run) {
        TensorView grad = poisoned(DType::f32, Shape{c.vocabulary, c.dim});
        cuda_->embedding_backward({device_tokens, device_grad_out, grad});
        HostTensor got = download(grad);
        expect_bits_equal(want, got, "embedding backward vs CPU, run " + std::to_string(run) + ", " + what);
        if (run == 0) first = got;
        else expect_bits_equal(first, got, "embedding backward run " + std::to_string(run) + " vs run 0, " + what);
      }
    }
}

}  // namespace
}  // namespace smelt::test
