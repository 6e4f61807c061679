// Per-rank checkpoint files: the pieces each rank holds, writing them, and reading flat ranges
// back from whichever rank files hold them.
#include "train/checkpoint_shards.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "train/safetensors.h"

namespace smelt {

namespace fs = std::filesystem;

namespace {

// Where unit `u`'s shard starts in a rank's local buffers: the shards of the units before it.
std::vector<int64_t> local_offsets(const CheckpointSharding& sharding) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& u : sharding.units) {
    offsets.push_back(total);
    total += u.shard;
  }
  return offsets;
}

// The unit holding each parameter (index into sharding.units); check_sharding_matches ensures one does.
std::vector<size_t> unit_of_parameters(const ParameterLayout& layout, const CheckpointSharding& sharding) {
  std::vector<size_t> unit_of;
  size_t u = 0;
  for (const auto& p : layout.parameters()) {
    while (u < sharding.units.size() && p.offset >= sharding.units[u].offset + sharding.units[u].length) ++u;
    SMELT_CHECK(u < sharding.units.size(), "parameter " + p.name + " lies outside the checkpoint's shard units");
    unit_of.push_back(u);
  }
  return unit_of;
}

std::string tensor_prefix(CheckpointPart part) {
  switch (part) {
    case CheckpointPart::parameters: return "";
    case CheckpointPart::exp_avg: return "exp_avg.";
    case CheckpointPart::exp_avg_sq: return "exp_avg_sq.";
  }
  return "";
}

// One copy out of a rank file: `count` elements of tensor `name` from element `source` to `out`.
struct CopyOperation {
  std::string name;
  int64_t source = 0, count = 0, expected_elements = 0;
  float* out = nullptr;
};

}  // namespace

CheckpointSharding describe_sharding(const ShardLayout& shards) {
  CheckpointSharding sharding;
  sharding.world_size = shards.ranks();
  for (const auto& u : shards.units()) sharding.units.push_back({u.name(), u.offset, u.length, u.shard});
  return sharding;
}

std::vector<ShardPiece> shard_pieces(const ParameterLayout& layout, const CheckpointSharding& sharding, int64_t rank) {
  const std::vector<int64_t> local = local_offsets(sharding);
  const std::vector<size_t> unit_of = unit_of_parameters(layout, sharding);
  std::vector<ShardPiece> pieces;
  const auto& parameters = layout.parameters();
  for (size_t i = 0; i < parameters.size(); ++i) {
    const ParameterInfo& p = parameters[i];
    const CheckpointShardUnit& u = sharding.units[unit_of[i]];
    const int64_t low = u.offset + rank * u.shard, high = u.offset + std::min((rank + 1) * u.shard, u.length);
    const int64_t first = std::max(p.offset, low), last = std::min(p.offset + p.numel(), high);
    if (last <= first) continue;
    pieces.push_back({i, first - p.offset, last - p.offset, local[unit_of[i]] + (first - low)});
  }
  return pieces;
}

std::vector<CheckpointFile> write_rank_files(const fs::path& folder, const ParameterLayout& layout,
                                             const CheckpointSharding& sharding, int64_t rank, const float* parameters,
                                             const float* exp_avg, const float* exp_avg_sq,
                                             const std::map<std::string, std::string>& model_metadata) {
  std::vector<TensorSource> weights, moments, second_moments;
  for (const ShardPiece& piece : shard_pieces(layout, sharding, rank)) {
    const std::string& name = layout.parameters()[piece.parameter].name;
    const int64_t elements = piece.end - piece.begin;
    const size_t bytes = static_cast<size_t>(elements) * sizeof(float);
    weights.push_back({name, {elements}, parameters + piece.local, bytes});
    moments.push_back({"exp_avg." + name, {elements}, exp_avg + piece.local, bytes});
    second_moments.push_back({"exp_avg_sq." + name, {elements}, exp_avg_sq + piece.local, bytes});
  }
  moments.insert(moments.end(), second_moments.begin(), second_moments.end());
  std::map<std::string, std::string> metadata = model_metadata;
  metadata["smelt.rank"] = std::to_string(rank);
  metadata["smelt.world_size"] = std::to_string(sharding.world_size);
  std::vector<CheckpointFile> files;
  files.push_back(write_tensor_file(folder / rank_file_name("model", rank, sharding.world_size), weights, metadata));
  files.push_back(write_tensor_file(folder / rank_file_name("optimizer", rank, sharding.world_size), moments,
                                    {{"format", "pt"},
                                     {"smelt.rank", std::to_string(rank)},
                                     {"smelt.world_size", std::to_string(sharding.world_size)}}));
  for (auto& f : files) f.rank = rank;
  return files;
}

void check_sharding_matches(const std::string& folder, const CheckpointIndex& index, const ParameterLayout& layout) {
  const ShardLayout expected(layout, index.sharding.world_size);
  bool same = expected.units().size() == index.sharding.units.size();
  for (size_t i = 0; same && i < index.sharding.units.size(); ++i) {
    const ShardUnit& e = expected.units()[i];
    const CheckpointShardUnit& u = index.sharding.units[i];
    same = e.name() == u.name && e.offset == u.offset && e.length == u.length;
  }
  if (!same)
    fail(ErrorKind::input, "checkpoint '" + folder + "': its sharding units (" + std::to_string(index.sharding.units.size()) +
                               ") do not match this model's (" + std::to_string(expected.units().size()) +
                               "); the index is damaged or from another smelt: resume from another checkpoint");
}

void read_sharded_ranges(const std::string& folder, const CheckpointIndex& index, const ParameterLayout& layout,
                         const std::vector<FlatRange>& ranges) {
  const CheckpointSharding& sharding = index.sharding;
  const std::vector<size_t> unit_of = unit_of_parameters(layout, sharding);
  const auto& parameters = layout.parameters();
  // Copies per rank file: [0] the model files, [1] the optimizer files.
  std::vector<std::vector<CopyOperation>> copies[2];
  for (auto& c : copies) c.resize(static_cast<size_t>(sharding.world_size));
  for (const FlatRange& range : ranges) {
    const int64_t a = range.first, b = range.first + range.count;
    auto& by_rank = copies[range.part == CheckpointPart::parameters ? 0 : 1];
    for (size_t i = 0; i < parameters.size(); ++i) {
      const ParameterInfo& p = parameters[i];
      const int64_t x = std::max(a, p.offset), y = std::min(b, p.offset + p.numel());
      if (y <= x) continue;
      const CheckpointShardUnit& u = sharding.units[unit_of[i]];
      for (int64_t q = (x - u.offset) / u.shard; q <= (y - 1 - u.offset) / u.shard; ++q) {
        const int64_t low = u.offset + q * u.shard, high = u.offset + std::min((q + 1) * u.shard, u.length);
        const int64_t s = std::max(x, low), e = std::min(y, high);
        if (e <= s) continue;
        const int64_t tensor_first = std::max(p.offset, low);  // the flat element the stored tensor starts at
        const int64_t tensor_last = std::min(p.offset + p.numel(), high);
        by_rank[static_cast<size_t>(q)].push_back(
            {tensor_prefix(range.part) + p.name, s - tensor_first, e - s, tensor_last - tensor_first, range.out + (s - a)});
      }
    }
  }
  for (int kind = 0; kind < 2; ++kind)
    for (int64_t q = 0; q < sharding.world_size; ++q) {
      const auto& operations = copies[kind][static_cast<size_t>(q)];
      if (operations.empty()) continue;
      const std::string name = rank_file_name(kind == 0 ? "model" : "optimizer", q, sharding.world_size);
      const auto listed = std::find_if(index.files.begin(), index.files.end(), [&](const CheckpointFile& f) { return f.name == name; });
      if (listed == index.files.end())
        fail(ErrorKind::input, "checkpoint '" + folder + "' index lists no " + name + " (rank " + std::to_string(q) + " of " +
                                   std::to_string(sharding.world_size) + "); the checkpoint is incomplete: resume from another one");
      const fs::path path = fs::path(folder) / name;
      verify_checksum(path, *listed);
      const SafetensorsFile file = load_safetensors(path.string());
      for (const CopyOperation& op : operations) {
        const auto& entry = file.entry(op.name);
        if (entry.dtype != DType::f32 || entry.bytes != static_cast<size_t>(op.expected_elements) * sizeof(float))
          fail(ErrorKind::input, "checkpoint file '" + path.string() + "': tensor '" + op.name + "' should be F32 with " +
                                     std::to_string(op.expected_elements) + " elements (rank " + std::to_string(q) +
                                     "'s part); the checkpoint is damaged or not from this model");
        std::memcpy(op.out, file.bytes_of(op.name) + static_cast<size_t>(op.source) * sizeof(float),
                    static_cast<size_t>(op.count) * sizeof(float));
      }
    }
}

std::vector<FlatRange> local_ranges(const ShardLayout& target, int64_t rank, float* parameters, float* exp_avg,
                                    float* exp_avg_sq) {
  std::vector<FlatRange> ranges;
  for (const ShardUnit& u : target.units()) {
    const int64_t first = rank * u.shard, count = std::min(u.shard, u.length - first);
    if (count <= 0) continue;
    for (auto [part, base] : {std::pair{CheckpointPart::parameters, parameters}, std::pair{CheckpointPart::exp_avg, exp_avg},
                              std::pair{CheckpointPart::exp_avg_sq, exp_avg_sq}})
      ranges.push_back({part, u.offset + first, count, base + u.shard_offset});
  }
  return ranges;
}

}  // namespace smelt
