// FSDP units over the flat parameter layout: ranges, padding, shard offsets and gaps.
#include "plan/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace smelt {

std::string ShardUnit::name() const {
  switch (kind) {
    case ShardUnitKind::embedding: return "tok_embeddings";
    case ShardUnitKind::block: return "layers." + std::to_string(layer);
    case ShardUnitKind::head: return "norm+output";
  }
  return "?";
}

ShardLayout::ShardLayout(const ParameterLayout& layout, int64_t ranks) : ranks_(ranks) {
  SMELT_CHECK(ranks >= 1, "ShardLayout needs at least one rank");
  const auto& parameters = layout.parameters();
  const int64_t blocks = static_cast<int64_t>(parameters.size() - 3) / kLayerWeightCount;
  // Each unit is a run of consecutive parameters: [first, last) indices into `parameters`.
  auto add = [&](ShardUnitKind kind, int layer, size_t first, size_t last) {
    ShardUnit u;
    u.kind = kind;
    u.layer = layer;
    u.offset = parameters[first].offset;
    const int64_t end = last < parameters.size() ? parameters[last].offset : layout.total();
    u.length = end - u.offset;
    const int64_t granule = 64 * ranks;  // every shard a multiple of 64 elements (256-byte aligned in f32)
    u.padded = (u.length + granule - 1) / granule * granule;
    u.shard = u.padded / ranks;
    u.shard_offset = local_total_;
    local_total_ += u.shard;
    int64_t cursor = 0;
    for (size_t p = first; p < last; ++p) {
      const int64_t begin = parameters[p].offset - u.offset;
      if (begin > cursor) u.gaps.emplace_back(cursor, begin);
      cursor = begin + parameters[p].numel();
    }
    if (u.padded > cursor) u.gaps.emplace_back(cursor, u.padded);
    units_.push_back(std::move(u));
  };
  add(ShardUnitKind::embedding, -1, 0, 1);
  for (int64_t layer = 0; layer < blocks; ++layer)
    add(ShardUnitKind::block, static_cast<int>(layer), 1 + static_cast<size_t>(layer * kLayerWeightCount),
        1 + static_cast<size_t>((layer + 1) * kLayerWeightCount));
  add(ShardUnitKind::head, -1, parameters.size() - 2, parameters.size());
}

int64_t ShardLayout::largest_padded() const {
  int64_t largest = 0;
  for (const auto& u : units_) largest = std::max(largest, u.padded);
  return largest;
}

CommunicationVolume communication_volume(const StepPlan& plan) {
  CommunicationVolume v;
  v.gather_dtype = plan.options.compute_dtype;
  v.reduce_dtype = plan.options.reduce_dtype == DType::bf16 ? DType::bf16 : master_dtype(plan.options.compute_dtype);
  if (!plan.sharded()) return v;
  const ShardLayout layout(ParameterLayout(plan.model), plan.options.shard_degree);
  for (const Step& step : plan.steps) {
    if (step.kind == StepKind::all_gather)
      v.all_gather_bytes += static_cast<double>(layout.unit(step.unit).padded) * static_cast<double>(dtype_size(v.gather_dtype));
    if (step.kind == StepKind::reduce_scatter)
      v.reduce_scatter_bytes += static_cast<double>(layout.unit(step.unit).padded) * static_cast<double>(dtype_size(v.reduce_dtype));
  }
  return v;
}

}  // namespace smelt
