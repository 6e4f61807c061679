// ShardLayout: how FSDP divides the flat parameter layout among ranks. A unit (the embedding,
// one block, or the final norm with the output projection) is a contiguous range of the flat
// layout that is gathered and reduce-scattered as one; each rank holds 1/N of every unit.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/parameters.h"
#include "plan/step_plan.h"

namespace smelt {

enum class ShardUnitKind : uint8_t { embedding, block, head };

struct ShardUnit {
  ShardUnitKind kind = ShardUnitKind::block;
  int layer = -1;            // blocks only
  int64_t offset = 0;        // first element in the flat (unsharded) layout
  int64_t length = 0;        // elements of the flat layout it covers (padding between parameters included)
  int64_t padded = 0;        // length rounded up to ranks * 64 elements: what one all-gather moves
  int64_t shard = 0;         // padded / ranks: this rank's part
  int64_t shard_offset = 0;  // where that part starts in a rank's local (sharded) flat buffers
  // Element ranges [first, last) of the gathered unit (relative to `offset`) that belong to no
  // parameter: alignment gaps and the tail padding. Gradients there must be zero.
  std::vector<std::pair<int64_t, int64_t>> gaps;
  // Float8 all-gather (ShardLayout::gather_in_float8): the unit-relative ranges of its float8
  // linears' weights, gathered in e4m3; the unit's other parameters (norms) travel apart, each
  // rank's part packed into `remainder` elements (the most any rank holds).
  std::vector<std::pair<int64_t, int64_t>> float8_ranges;
  int64_t remainder = 0;
  bool float8_gathered() const { return !float8_ranges.empty(); }
  std::string name() const;  // "tok_embeddings", "layers.3", "norm+output"
};

class ShardLayout {
 public:
  ShardLayout(const ParameterLayout& layout, int64_t ranks);

  int64_t ranks() const { return ranks_; }
  const std::vector<ShardUnit>& units() const { return units_; }
  const ShardUnit& unit(int index) const { return units_.at(static_cast<size_t>(index)); }
  // Unit indices: 0 the embedding, 1 + i block i, blocks + 1 the head.
  int embedding_unit() const { return 0; }
  int block_unit(int64_t layer) const { return 1 + static_cast<int>(layer); }
  int head_unit() const { return static_cast<int>(units_.size()) - 1; }
  int64_t local_total() const { return local_total_; }  // elements of one rank's sharded flat buffers
  int64_t largest_padded() const;

  // Marks the float8 linears whose weights are gathered in e4m3 (per block, LayerBuffers::float8).
  void gather_in_float8(const ParameterLayout& layout, const std::vector<std::array<bool, kLayerWeightCount>>& float8);
  // Runs (unit-relative first element, count) of the parameter elements in `rank`'s part of `unit`
  // that are not float8 weights, in order: what that rank packs into its remainder.
  std::vector<std::pair<int64_t, int64_t>> remainder_runs(const ShardUnit& unit, int64_t rank) const;
  int64_t largest_remainder() const;

 private:
  int64_t ranks_;
  std::vector<ShardUnit> units_;
  int64_t local_total_ = 0;
};

// What a sharded plan's collectives move in one step, every accumulated pass's (zero for
// unsharded plans). Sizes are of the
// gathered / reduced buffers (nccl-tests' "size"); a ring moves (N-1)/N of that per rank.
// Plain data parallel and HSDP plans add the all-reduces of gradients over replicas; float8
// all-gather plans gather their float8 linears in e4m3 (gather_dtype e4m3; the rest of those
// units, the norms, and the other units in the compute dtype: `all_gather_bytes` counts both).
struct CommunicationVolume {
  DType gather_dtype = DType::f32, reduce_dtype = DType::f32;
  double all_gather_bytes = 0, reduce_scatter_bytes = 0, all_reduce_bytes = 0;
  double total_bytes() const { return all_gather_bytes + reduce_scatter_bytes + all_reduce_bytes; }
};
CommunicationVolume communication_volume(const StepPlan& plan);

}  // namespace smelt
