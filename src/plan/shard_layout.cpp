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

void ShardLayout::gather_in_float8(const ParameterLayout& layout,
                                   const std::vector<std::array<bool, kLayerWeightCount>>& float8) {
  for (size_t layer = 0; layer < float8.size(); ++layer) {
    ShardUnit& u = units_.at(static_cast<size_t>(block_unit(static_cast<int64_t>(layer))));
    u.float8_ranges.clear();
    for (int w = 0; w < kLayerWeightCount; ++w) {
      if (!float8[layer][static_cast<size_t>(w)]) continue;
      const ParameterInfo& p = layout.layer(static_cast<int64_t>(layer), static_cast<LayerWeight>(w));
      u.float8_ranges.emplace_back(p.offset - u.offset, p.offset - u.offset + p.numel());
    }
    std::sort(u.float8_ranges.begin(), u.float8_ranges.end());
    u.remainder = 0;
    if (!u.float8_gathered()) continue;
    for (int64_t r = 0; r < ranks_; ++r) {
      int64_t count = 0;
      for (const auto& run : remainder_runs(u, r)) count += run.second;
      u.remainder = std::max(u.remainder, count);
    }
  }
}

std::vector<std::pair<int64_t, int64_t>> ShardLayout::remainder_runs(const ShardUnit& unit, int64_t rank) const {
  // Excluded from the remainder: float8 weights and gaps (which hold no parameter).
  std::vector<std::pair<int64_t, int64_t>> excluded = unit.float8_ranges;
  excluded.insert(excluded.end(), unit.gaps.begin(), unit.gaps.end());
  std::sort(excluded.begin(), excluded.end());
  std::vector<std::pair<int64_t, int64_t>> runs;
  const int64_t first = rank * unit.shard, last = first + unit.shard;
  int64_t cursor = first;
  auto keep = [&](int64_t begin, int64_t end) {
    begin = std::max(begin, first);
    end = std::min(end, last);
    if (end > begin) runs.emplace_back(begin, end - begin);
  };
  for (const auto& [begin, end] : excluded) {
    if (begin > cursor) keep(cursor, begin);
    cursor = std::max(cursor, end);
  }
  keep(cursor, last);
  return runs;
}

int64_t ShardLayout::largest_remainder() const {
  int64_t largest = 0;
  for (const auto& u : units_) largest = std::max(largest, u.remainder);
  return largest;
}

CommunicationVolume communication_volume(const StepPlan& plan) {
  CommunicationVolume v;
  v.gather_dtype = plan.float8_gathered() ? DType::e4m3 : plan.options.compute_dtype;
  v.reduce_dtype = plan.gradient_reduce_dtype();
  if (!plan.data_parallel()) return v;
  ShardLayout layout(ParameterLayout(plan.model), plan.sharded() ? plan.options.shard_degree : 1);
  if (plan.float8_gathered()) {
    std::vector<std::array<bool, kLayerWeightCount>> float8;
    for (const auto& lb : plan.layers) float8.push_back(lb.float8);
    layout.gather_in_float8(ParameterLayout(plan.model), float8);
  }
  const double compute_width = static_cast<double>(dtype_size(plan.options.compute_dtype));
  const double reduce_width = static_cast<double>(dtype_size(v.reduce_dtype));
  // Gradient accumulation: gathers, reduce-scatters and the float8 amax in every pass; the
  // replicas' all-reduce once (of the accumulated shard, in f32, when sharded).
  const double passes = static_cast<double>(plan.options.microbatches);
  const double replica_width = static_cast<double>(dtype_size(plan.replica_reduce_dtype()));
  for (const Step& step : plan.steps) {
    if (step.kind == StepKind::all_gather) {
      const ShardUnit& u = layout.unit(step.unit);
      v.all_gather_bytes += passes * (u.float8_gathered() ? static_cast<double>(u.padded) +
                                                                static_cast<double>(u.remainder * layout.ranks()) * compute_width
                                                          : static_cast<double>(u.padded) * compute_width);
    }
    if (step.kind == StepKind::reduce_scatter)
      v.reduce_scatter_bytes += passes * static_cast<double>(layout.unit(step.unit).padded) * reduce_width;
    if (step.kind == StepKind::all_reduce_gradients)  // the unit (plain data parallel) or its shard (HSDP)
      v.all_reduce_bytes += static_cast<double>(plan.sharded() ? layout.unit(step.unit).shard
                                                               : layout.unit(step.unit).length) * replica_width;
    if (step.kind == StepKind::all_reduce_float8_amax)
      v.all_reduce_bytes += passes * static_cast<double>(plan.model.n_layers * kLayerWeightCount) * 4.0;
  }
  return v;
}

}  // namespace smelt
