// CPU rotary position embedding, in place: pairs (2i, 2i+1) of every head vector
// rotated by the angle of (position, i); the inverse (the backward) rotates back.
#include <string>

#include "cpu/kernels.h"
#include "cpu/storage.h"

namespace smelt::cpu {
namespace {

// x: (tokens, heads, Dh) as `vectors` head vectors; frequencies: (seq_len, Dh/2, 2) cos, sin.
template <typename Storage, typename Frequency>
void rotate(const RopeArgs& args, int64_t tokens, int64_t heads, int64_t head_dim) {
  using Acc = Accumulator<Storage>;
  Storage* x = args.x.as<Storage>();
  const Frequency* frequencies = args.frequencies.as<Frequency>();
  const int64_t half = head_dim / 2, seq_len = args.seq_len;
  const Acc direction = args.inverse ? Acc(-1) : Acc(1);
#pragma omp parallel for schedule(static)
  for (int64_t token = 0; token < tokens; ++token) {
    const Frequency* angle = frequencies + (token % seq_len) * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      Storage* vector = x + (token * heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const Acc c = Acc(angle[2 * i]), s = direction * Acc(angle[2 * i + 1]);
        const Acc x0 = load(vector, 2 * i), x1 = load(vector, 2 * i + 1);
        store(vector, 2 * i, x0 * c - x1 * s);
        store(vector, 2 * i + 1, x0 * s + x1 * c);
      }
    }
  }
}

}  // namespace

void rope(const RopeArgs& args) {
  const char* op = "rope";
  expect_host(args.x, op, "x");
  expect_host(args.frequencies, op, "frequencies");
  if (args.seq_len <= 0 || args.frequencies.empty() || args.frequencies.numel() % (2 * args.seq_len) != 0)
    fail(ErrorKind::internal, "rope: expected frequencies of (seq_len, Dh/2, 2) with seq_len " +
                                  std::to_string(args.seq_len) + " > 0, found " + args.frequencies.str() +
                                  "; pass the table built for this sequence length");
  const int64_t half = args.frequencies.numel() / (2 * args.seq_len), head_dim = 2 * half;
  // Per token: (heads, Dh) for a (N, heads, Dh) or (B, T, heads, Dh) view, or (heads * Dh) for (N, heads * Dh).
  const int rank = args.x.shape.rank;
  const int64_t per_token = rank >= 3 ? args.x.shape[rank - 2] * args.x.shape[rank - 1] : args.x.cols();
  if (args.x.empty() || (rank >= 3 && args.x.shape[rank - 1] != head_dim) || per_token % head_dim != 0)
    fail(ErrorKind::internal, "rope: expected x of (N, heads, " + std::to_string(head_dim) +
                                  ") matching the frequency table " + args.frequencies.str() + ", found " + args.x.str() +
                                  "; pass the table built for this head dimension");
  const int64_t tokens = args.x.numel() / per_token, heads = per_token / head_dim;
  dispatch_activation(args.x.dtype, op, [&](auto storage) {
    using Storage = decltype(storage);
    if (args.frequencies.dtype == DType::f64) rotate<Storage, double>(args, tokens, heads, head_dim);
    else {
      expect_dtype(args.frequencies, DType::f32, op, "frequencies");
      rotate<Storage, float>(args, tokens, heads, head_dim);
    }
  });
}

}  // namespace smelt::cpu
