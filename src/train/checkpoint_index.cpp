// The checkpoint index: JSON out, validated JSON in, and the smelt-hash64 checksum.
#include "train/checkpoint_index.h"

#include <cmath>
#include <cstring>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace smelt {

namespace {

constexpr uint64_t kPrime1 = 0x9e3779b185ebca87ull;
constexpr uint64_t kPrime2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kPrime3 = 0x165667b19e3779f9ull;
constexpr uint64_t kPrime4 = 0x85ebca77c2b2ae63ull;
constexpr size_t kMaxFiles = 4096;
constexpr size_t kMaxLossWindow = 1 << 16;
constexpr int64_t kMaxShardRanks = 1 << 16;
constexpr size_t kMaxShardUnits = 1 << 16;

uint64_t rotate_left(uint64_t x, int bits) { return (x << bits) | (x >> (64 - bits)); }

uint64_t read_word(const unsigned char* p) {
  uint64_t word = 0;
  for (int i = 0; i < 8; ++i) word |= static_cast<uint64_t>(p[i]) << (8 * i);
  return word;
}

uint64_t mix_lane(uint64_t lane, uint64_t word) { return rotate_left(lane ^ (word * kPrime1), 31) * kPrime2; }

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  fail(ErrorKind::input, "checkpoint index '" + source + "': " + what +
                             "; the checkpoint is damaged or not a smelt checkpoint: resume from another one");
}

}  // namespace

void Checksum::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  if (pending_bytes_ > 0) {
    const size_t take = std::min(bytes, sizeof(pending_) - pending_bytes_);
    std::memcpy(pending_ + pending_bytes_, p, take);
    pending_bytes_ += take;
    p += take;
    bytes -= take;
    if (pending_bytes_ < sizeof(pending_)) return;
    for (int lane = 0; lane < 4; ++lane) lanes_[lane] = mix_lane(lanes_[lane], read_word(pending_ + 8 * lane));
    pending_bytes_ = 0;
  }
  while (bytes >= 32) {
    for (int lane = 0; lane < 4; ++lane) lanes_[lane] = mix_lane(lanes_[lane], read_word(p + 8 * lane));
    p += 32;
    bytes -= 32;
  }
  std::memcpy(pending_, p, bytes);
  pending_bytes_ = bytes;
}

uint64_t Checksum::finish() const {
  uint64_t h = rotate_left(lanes_[0], 1) + rotate_left(lanes_[1], 7) + rotate_left(lanes_[2], 12) +
               rotate_left(lanes_[3], 18);
  h = (h ^ total_) * kPrime3;
  for (size_t i = 0; i < pending_bytes_; ++i) h = rotate_left(h ^ (pending_[i] * kPrime4), 11) * kPrime1;
  h ^= h >> 33;
  h *= kPrime2;
  h ^= h >> 29;
  h *= kPrime3;
  h ^= h >> 32;
  return h;
}

uint64_t checksum64(const void* data, size_t bytes) {
  Checksum c;
  c.update(data, bytes);
  return c.finish();
}

std::string checksum_hex(uint64_t value) {
  static const char digits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) text[static_cast<size_t>(i)] = digits[value & 15];
  return text;
}

std::string rank_file_name(const std::string& kind, int64_t rank, int64_t world_size) {
  auto digits = [](int64_t value) {
    std::string text = std::to_string(value);
    return std::string(text.size() < 5 ? 5 - text.size() : 0, '0') + text;
  };
  return kind + ".rank-" + digits(rank) + "-of-" + digits(world_size) + ".safetensors";
}

std::string checkpoint_index_to_json(const CheckpointIndex& index) {
  nlohmann::ordered_json j;
  j["format"] = index.format;
  j["smelt_version"] = index.smelt_version;
  j["step"] = index.progress.step;
  j["optimizer_steps"] = index.progress.optimizer_steps;
  j["skipped_steps"] = index.progress.skipped_steps;
  j["data_loader"] = {{"epoch", index.progress.loader.epoch},
                      {"position", index.progress.loader.position},
                      {"seed", index.progress.loader.seed}};
  j["loss_window"] = index.progress.loss_window;
  j["rng"] = "none: data order derives from the seed and the data_loader position; no other random state";
  j["model"] = nlohmann::json::parse(index.model_json);
  j["config"] = index.config_json.empty() ? nlohmann::json::object() : nlohmann::json::parse(index.config_json);
  if (index.sharding.sharded()) {
    nlohmann::ordered_json units = nlohmann::ordered_json::array();
    for (const auto& u : index.sharding.units)
      units.push_back({{"name", u.name}, {"offset", u.offset}, {"length", u.length}, {"shard", u.shard}});
    j["sharding"] = {{"world_size", index.sharding.world_size}, {"units", units}};
  }
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (const auto& f : index.files) {
    nlohmann::ordered_json file = {{"name", f.name}};
    if (f.rank >= 0) file["rank"] = f.rank;
    file["bytes"] = f.bytes;
    file["checksum"] = "smelt-hash64:" + checksum_hex(f.checksum);
    files.push_back(file);
  }
  j["files"] = files;
  return j.dump(1) + "\n";
}

CheckpointIndex parse_checkpoint_index(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(source, std::string("is not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) bad(source, "is not a JSON object");
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = j.find(key);
    if (it == j.end()) bad(source, std::string("has no '") + key + "' field");
    return *it;
  };
  auto count = [&](const nlohmann::json& value, const std::string& key) -> int64_t {
    if (!value.is_number_unsigned() || value.get<uint64_t>() > (uint64_t(1) << 62))
      bad(source, "'" + key + "' should be a non-negative integer, found " + value.dump().substr(0, 64));
    return value.get<int64_t>();
  };
  CheckpointIndex index;
  index.format = count(field("format"), "format");
  if (index.format != kCheckpointFormat && index.format != kShardedCheckpointFormat)
    bad(source, "has checkpoint format " + std::to_string(index.format) + ", this smelt reads formats " +
                    std::to_string(kCheckpointFormat) + " and " + std::to_string(kShardedCheckpointFormat));
  if (!field("smelt_version").is_string()) bad(source, "'smelt_version' should be a string");
  index.smelt_version = field("smelt_version").get<std::string>();
  index.progress.step = count(field("step"), "step");
  index.progress.optimizer_steps = count(field("optimizer_steps"), "optimizer_steps");
  index.progress.skipped_steps = count(field("skipped_steps"), "skipped_steps");
  if (index.progress.optimizer_steps > index.progress.step || index.progress.skipped_steps > index.progress.step)
    bad(source, "'optimizer_steps' and 'skipped_steps' cannot exceed 'step'");
  auto loader_state = [&](const nlohmann::json& loader, const std::string& key) {
    if (!loader.is_object() || !loader.contains("epoch") || !loader.contains("position") || !loader.contains("seed"))
      bad(source, "'" + key + "' should be an object with epoch, position and seed");
    LoaderState state;
    state.epoch = static_cast<uint64_t>(count(loader["epoch"], key + ".epoch"));
    state.position = static_cast<uint64_t>(count(loader["position"], key + ".position"));
    if (!loader["seed"].is_number_unsigned()) bad(source, "'" + key + ".seed' should be a non-negative integer");
    state.seed = loader["seed"].get<uint64_t>();
    return state;
  };
  index.progress.loader = loader_state(field("data_loader"), "data_loader");
  // Written by earlier versions, when validation went on through its split from one evaluation to
  // the next; every evaluation now starts at the split's beginning, so the position is checked and
  // not used.
  if (j.contains("validation_loader")) loader_state(j["validation_loader"], "validation_loader");
  const auto& window = field("loss_window");
  if (!window.is_array() || window.size() > kMaxLossWindow)
    bad(source, "'loss_window' should be an array of at most " + std::to_string(kMaxLossWindow) + " numbers");
  for (const auto& loss : window) {
    if (!loss.is_number() || !std::isfinite(loss.get<double>())) bad(source, "'loss_window' holds a non-number");
    index.progress.loss_window.push_back(loss.get<double>());
  }
  if (!field("model").is_object()) bad(source, "'model' should be an object describing the model's shapes");
  index.model_json = field("model").dump();
  if (j.contains("config")) index.config_json = j["config"].dump();
  if (index.format == kShardedCheckpointFormat) {
    const auto& sharding = field("sharding");
    if (!sharding.is_object() || !sharding.contains("world_size") || !sharding.contains("units"))
      bad(source, "'sharding' should be an object with world_size and units");
    index.sharding.world_size = count(sharding["world_size"], "sharding.world_size");
    if (index.sharding.world_size < 1 || index.sharding.world_size > kMaxShardRanks)
      bad(source, "'sharding.world_size' should be between 1 and " + std::to_string(kMaxShardRanks));
    const auto& units = sharding["units"];
    if (!units.is_array() || units.empty() || units.size() > kMaxShardUnits)
      bad(source, "'sharding.units' should be a non-empty array of at most " + std::to_string(kMaxShardUnits) + " units");
    int64_t next_offset = 0;
    for (const auto& u : units) {
      if (!u.is_object() || !u.contains("name") || !u["name"].is_string() || !u.contains("offset") ||
          !u.contains("length") || !u.contains("shard"))
        bad(source, "every entry of 'sharding.units' needs a string name, an offset, a length and a shard size");
      CheckpointShardUnit unit;
      unit.name = u["name"].get<std::string>().substr(0, 64);
      unit.offset = count(u["offset"], "sharding.units.offset");
      unit.length = count(u["length"], "sharding.units.length");
      unit.shard = count(u["shard"], "sharding.units.shard");
      if (unit.offset != next_offset || unit.length < 1)
        bad(source, "sharding unit '" + unit.name + "' should start at element " + std::to_string(next_offset) +
                        " (right after the previous unit) and hold at least one element");
      if (unit.shard < (unit.length + index.sharding.world_size - 1) / index.sharding.world_size)
        bad(source, "sharding unit '" + unit.name + "': " + std::to_string(index.sharding.world_size) +
                        " shards of " + std::to_string(unit.shard) + " elements cannot hold its " +
                        std::to_string(unit.length));
      if (unit.length > (int64_t(1) << 62) - next_offset) bad(source, "sharding units overflow");
      next_offset = unit.offset + unit.length;
      index.sharding.units.push_back(unit);
    }
  } else if (j.contains("sharding")) {
    bad(source, "has a 'sharding' section but format " + std::to_string(index.format) + " (sharded checkpoints are format " +
                    std::to_string(kShardedCheckpointFormat) + ")");
  }
  const auto& files = field("files");
  if (!files.is_array() || files.empty() || files.size() > kMaxFiles)
    bad(source, "'files' should be a non-empty array of at most " + std::to_string(kMaxFiles) + " entries");
  for (const auto& f : files) {
    if (!f.is_object() || !f.contains("name") || !f.contains("bytes") || !f.contains("checksum") ||
        !f["name"].is_string() || !f["checksum"].is_string())
      bad(source, "every entry of 'files' needs a string name, a byte count and a string checksum");
    CheckpointFile file;
    file.name = f["name"].get<std::string>();
    const bool plain = !file.name.empty() && file.name.size() <= 255 && file.name != "." && file.name != ".." &&
                       file.name.find('/') == std::string::npos && file.name.find('\0') == std::string::npos;
    if (!plain) bad(source, "file name '" + file.name.substr(0, 64) + "' is not a plain name inside the checkpoint");
    file.bytes = static_cast<uint64_t>(count(f["bytes"], "files.bytes"));
    if (f.contains("rank")) {
      file.rank = count(f["rank"], "files.rank");
      if (file.rank >= index.sharding.world_size)
        bad(source, "file '" + file.name + "' names rank " + std::to_string(file.rank) + " of a checkpoint written by " +
                        std::to_string(index.sharding.world_size) + " rank(s)");
    }
    const std::string checksum = f["checksum"].get<std::string>();
    const std::string prefix = "smelt-hash64:";
    if (checksum.size() != prefix.size() + 16 || checksum.compare(0, prefix.size(), prefix) != 0)
      bad(source, "checksum of '" + file.name + "' should be smelt-hash64: and 16 hex digits");
    for (size_t i = prefix.size(); i < checksum.size(); ++i) {
      const char c = checksum[i];
      int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) bad(source, "checksum of '" + file.name + "' has a non-hex digit");
      file.checksum = (file.checksum << 4) | static_cast<uint64_t>(digit);
    }
    for (const auto& other : index.files)
      if (other.name == file.name) bad(source, "lists '" + file.name + "' twice");
    index.files.push_back(file);
  }
  return index;
}

}  // namespace smelt
