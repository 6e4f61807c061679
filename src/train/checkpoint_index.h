// The checkpoint index (index.json): what a checkpoint holds besides tensors (step, data-loader
// position, loss window, config, model shapes, smelt version) and each file's size and checksum;
// plus the 64-bit checksum itself. Parsing validates every field: the index is untrusted input.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "data/loader.h"

namespace smelt {

// Bumped whenever the checkpoint layout changes; other formats are refused, never half-loaded.
// Format 1: one model.safetensors and one optimizer.safetensors (the whole model). Format 2: a
// sharded run's checkpoint, a pair of files per rank (see CheckpointSharding).
constexpr int64_t kCheckpointFormat = 1;
constexpr int64_t kShardedCheckpointFormat = 2;

// smelt-hash64: a streaming 64-bit checksum (not cryptographic; it catches torn and corrupted files).
// Four lanes each take every fourth little-endian 64-bit word: lane = rotl(lane ^ word * K1, 31) * K2;
// the lanes are folded, the length and the tail bytes mixed in, and a final avalanche applied.
class Checksum {
 public:
  void update(const void* data, size_t bytes);
  uint64_t finish() const;

 private:
  uint64_t lanes_[4] = {0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull};
  unsigned char pending_[32] = {};
  size_t pending_bytes_ = 0;
  uint64_t total_ = 0;
};
uint64_t checksum64(const void* data, size_t bytes);
std::string checksum_hex(uint64_t value);  // 16 lowercase hex digits

struct CheckpointFile {
  std::string name;  // a plain file name inside the checkpoint folder
  uint64_t bytes = 0;
  uint64_t checksum = 0;
  int64_t rank = -1;  // sharded checkpoints: the rank whose shards the file holds
};

// A sharded checkpoint's layout. Each unit (ShardLayout's: the embedding, one block, the head) is
// the flat range [offset, offset + length) of the whole model's parameters (ParameterLayout
// order); rank r holds unit elements [r * shard, min((r + 1) * shard, length)). Rank r's files,
// model.rank-RRRRR-of-WWWWW.safetensors and optimizer.rank-..., hold for every parameter the
// part of it inside that rank's ranges, as a 1-D F32 tensor of the parameter's name (optimizer:
// exp_avg.<name>, exp_avg_sq.<name>); a parameter with no part there is absent.
struct CheckpointShardUnit {
  std::string name;  // "tok_embeddings", "layers.3", "norm+output"
  int64_t offset = 0, length = 0, shard = 0;
};
struct CheckpointSharding {
  int64_t world_size = 0;  // ranks that wrote files; 0: not sharded
  std::vector<CheckpointShardUnit> units;
  bool sharded() const { return world_size > 0; }
};
// "model.rank-00002-of-00004.safetensors" (`kind`: model or optimizer).
std::string rank_file_name(const std::string& kind, int64_t rank, int64_t world_size);

// Where training stands: enough to continue bit-identically.
struct TrainingProgress {
  int64_t step = 0;             // training steps done (the LR schedule's position)
  int64_t optimizer_steps = 0;  // AdamW updates applied (its bias-correction step); less than step after skips
  int64_t skipped_steps = 0;    // steps whose update was skipped (non-finite or spiking loss)
  LoaderState loader;           // training data position (validation has none: every evaluation
                                // reads its split from the start)
  std::vector<double> loss_window;  // recent accepted losses, oldest first (loss-spike detection)
};

struct CheckpointIndex {
  int64_t format = kCheckpointFormat;
  std::string smelt_version;
  std::string model_json;   // model_config_to_json of the model
  std::string config_json;  // the run's effective config (for the record)
  TrainingProgress progress;
  CheckpointSharding sharding;  // format 2 only
  std::vector<CheckpointFile> files;
};

std::string checkpoint_index_to_json(const CheckpointIndex& index);
// Errors (ErrorKind::input) name `source` and the field that is missing or out of range.
CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& source);

}  // namespace smelt
