// Activation checkpointing policies: for every block, which activations the
// forward keeps for the backward; the rest are recomputed before the block's backward.
#pragma once
#include <array>
#include <string>
#include <vector>

#include "model/layer_graph.h"

namespace smelt {

enum class CheckpointMode {
  none,             // keep everything
  full,             // keep only each block's input; recompute the block
  selective_layer,  // every N-th block fully recomputed, the others keep everything
  selective_op,     // keep matmul, attention and amax outputs, recompute every second matmul and cheap ops
  automatic,        // the planner chooses under a memory budget
};

struct CheckpointPolicy {
  CheckpointMode mode = CheckpointMode::none;
  int layer_frequency = 1;  // N of selective-layer:N
  std::string str() const;  // as written in configs: "selective-layer:2"
};

// Parses "none", "full", "selective-op", "selective-layer:N", "auto"; errors name activation_checkpoint.mode.
CheckpointPolicy parse_checkpoint_policy(const std::string& text);

using KeepSet = std::array<bool, kActivationCount>;

// The activations a block's backward reads (everything but the block's output).
KeepSet needed_by_backward();
// What block `layer` keeps under a fixed (not automatic) policy.
KeepSet keep_set(const CheckpointPolicy& policy, int64_t layer);

// Forward ops to rerun before a block's backward so that every activation the
// backward needs exists, given what was kept: a flag per ForwardOp, in forward order.
std::array<bool, kForwardOpCount> recompute_ops(const KeepSet& kept);

}  // namespace smelt
