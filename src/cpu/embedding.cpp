// CPU token embedding: forward gathers table rows by token id (an f32 table into a bf16 output
// rounds each element once); backward scatter-adds output gradients into the f32 (f64 in tests)
// table gradient, zeroed first unless the microbatch adds to it (gradient accumulation).
#include <algorithm>
#include <string>
#include <type_traits>

#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

// Columns handled by one task of the backward: each task owns whole columns, so
// every table element is summed over tokens in token order, whatever the threads.
constexpr int64_t kColumnBlock = 64;

void check_tokens(const TensorView& tokens, int64_t vocabulary, const char* op) {
  expect_dtype(tokens, DType::i32, op, "tokens");
  const int32_t* ids = tokens.as<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i)
    if (ids[i] < 0 || ids[i] >= vocabulary)
      fail(ErrorKind::input, std::string(op) + ": expected token ids in [0, " + std::to_string(vocabulary) +
                                 "), found " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                                 "; the data was tokenized with a larger vocabulary than the model's vocab_size");
}

// Table: the output's storage (copied as is), or float with a bf16 output (rounded).
template <typename Table, typename Storage>
void forward(const EmbeddingForwardArgs& args) {
  const int64_t tokens = args.tokens.numel(), dim = args.table.cols();
  const int32_t* ids = args.tokens.as<int32_t>();
  const Table* table = args.table.as<Table>();
  Storage* out = args.out.as<Storage>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t d = 0; d < dim; ++d) {
      if constexpr (std::is_same_v<Table, Storage>) out[t * dim + d] = table[ids[t] * dim + d];
      else store(out, t * dim + d, table[ids[t] * dim + d]);
    }
}

template <typename Storage>
void backward(const EmbeddingBackwardArgs& args) {
  using Acc = Accumulator<Storage>;
  const int64_t tokens = args.tokens.numel(), dim = args.grad_table.cols(), vocabulary = args.grad_table.rows();
  const int32_t* ids = args.tokens.as<int32_t>();
  const Storage* grad_out = args.grad_out.as<Storage>();
  Acc* grad_table = args.grad_table.as<Acc>();
  if (!args.accumulate) {
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < vocabulary; ++row)
      for (int64_t d = 0; d < dim; ++d) grad_table[row * dim + d] = 0;
  }
  const int64_t blocks = (dim + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t first = block * kColumnBlock, last = std::min(dim, first + kColumnBlock);
    for (int64_t t = 0; t < tokens; ++t) {
      Acc* destination = grad_table + ids[t] * dim;
      for (int64_t d = first; d < last; ++d) destination[d] += load(grad_out, t * dim + d);
    }
  }
}

}  // namespace

void embedding_forward(const EmbeddingForwardArgs& args) {
  const char* op = "embedding_forward";
  for (const TensorView* t : {&args.tokens, &args.table, &args.out}) expect_host(*t, op, "argument");
  expect_numel(args.out, args.tokens.numel() * args.table.cols(), op, "out");
  check_tokens(args.tokens, args.table.rows(), op);
  if (args.table.dtype == DType::f32 && args.out.dtype == DType::bf16) return forward<float, uint16_t>(args);
  expect_dtype(args.out, args.table.dtype, op, "out");
  dispatch_activation(args.table.dtype, op, [&](auto storage) { forward<decltype(storage), decltype(storage)>(args); });
}

void embedding_backward(const EmbeddingBackwardArgs& args) {
  const char* op = "embedding_backward";
  for (const TensorView* t : {&args.tokens, &args.grad_out, &args.grad_table}) expect_host(*t, op, "argument");
  expect_numel(args.grad_out, args.tokens.numel() * args.grad_table.cols(), op, "grad_out");
  check_tokens(args.tokens, args.grad_table.rows(), op);
  dispatch_activation(args.grad_out.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    expect_dtype(args.grad_table, storage_dtype<Accumulator<Storage>>(), op, "grad_table");
    backward<Storage>(args);
  });
}

}  // namespace smelt::cpu
