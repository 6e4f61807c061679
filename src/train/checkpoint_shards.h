// Per-rank checkpoint files of sharded runs: which part of which parameter each rank's files hold,
// writing one rank's files from its local shards, and reading any flat ranges back from whichever
// rank files hold them (same world size, another one, or the whole model). Internal to checkpoints.
#pragma once
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "model/parameters.h"
#include "plan/shard_layout.h"
#include "train/checkpoint_index.h"

namespace smelt {

// A tensor of a checkpoint file, streamed from host memory.
struct TensorSource {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  size_t bytes = 0;
};

// One safetensors file (fsync'd) with its size and checksum (checkpoint.cpp).
CheckpointFile write_tensor_file(const std::filesystem::path& path, const std::vector<TensorSource>& tensors,
                                 const std::map<std::string, std::string>& metadata);
// Error(input) naming the file when its size or checksum differs from the index's (checkpoint_load.cpp).
void verify_checksum(const std::filesystem::path& path, const CheckpointFile& file);

// The index's description of `shards` (units, their ranges and shard sizes, the number of ranks).
CheckpointSharding describe_sharding(const ShardLayout& shards);

// The part of one parameter that one rank's files hold.
struct ShardPiece {
  size_t parameter = 0;        // index into ParameterLayout::parameters()
  int64_t begin = 0, end = 0;  // elements of the flattened parameter
  int64_t local = 0;           // where the piece starts in that rank's local (sharded) buffers
};
// Rank `rank`'s pieces, in file order (units, then parameters, in layout order).
std::vector<ShardPiece> shard_pieces(const ParameterLayout& layout, const CheckpointSharding& sharding, int64_t rank);

// Writes rank `rank`'s model and optimizer files into `folder` from its local shards (each array
// local_total floats); returns their entries for the index (fsync'd, checksums computed).
std::vector<CheckpointFile> write_rank_files(const std::filesystem::path& folder, const ParameterLayout& layout,
                                             const CheckpointSharding& sharding, int64_t rank, const float* parameters,
                                             const float* exp_avg, const float* exp_avg_sq,
                                             const std::map<std::string, std::string>& model_metadata);

// Refuses (Error(input)) an index whose units are not this model's (names, offsets, lengths).
void check_sharding_matches(const std::string& folder, const CheckpointIndex& index, const ParameterLayout& layout);

// What to read: flat elements [first, first + count) of the whole model's parameters, exp_avg or
// exp_avg_sq into `out` (count floats). Elements that belong to no parameter are left as they are.
enum class CheckpointPart : uint8_t { parameters, exp_avg, exp_avg_sq };
struct FlatRange {
  CheckpointPart part = CheckpointPart::parameters;
  int64_t first = 0, count = 0;
  float* out = nullptr;
};
// Reads `ranges` from the rank files that hold them, one file at a time, each verified against its
// checksum first (only the files needed are opened). Errors name the file.
void read_sharded_ranges(const std::string& folder, const CheckpointIndex& index, const ParameterLayout& layout,
                         const std::vector<FlatRange>& ranges);

// The ranges rank `rank` of `target` owns (its local buffers, each local_total floats; the
// tail padding of every unit shard is not read and stays as it is).
std::vector<FlatRange> local_ranges(const ShardLayout& target, int64_t rank, float* parameters, float* exp_avg,
                                    float* exp_avg_sq);

}  // namespace smelt
