// Checkpoint policies as keep-sets, and the recompute closure of a keep-set.
#include "plan/checkpoint_policy.h"

#include "core/error.h"

namespace smelt {

std::string CheckpointPolicy::str() const {
  switch (mode) {
    case CheckpointMode::none: return "none";
    case CheckpointMode::full: return "full";
    case CheckpointMode::selective_layer: return "selective-layer:" + std::to_string(layer_frequency);
    case CheckpointMode::selective_op: return "selective-op";
    case CheckpointMode::automatic: return "auto";
  }
  return "?";
}

CheckpointPolicy parse_checkpoint_policy(const std::string& text) {
  CheckpointPolicy p;
  if (text == "none") return p;
  if (text == "full") {
    p.mode = CheckpointMode::full;
    return p;
  }
  if (text == "selective-op" || text == "selective" || text == "op") {
    p.mode = CheckpointMode::selective_op;
    return p;
  }
  if (text == "auto") {
    p.mode = CheckpointMode::automatic;
    return p;
  }
  const std::string prefix = "selective-layer:";
  if (text.rfind(prefix, 0) == 0) {
    std::string number = text.substr(prefix.size());
    bool digits = !number.empty() && number.find_first_not_of("0123456789") == std::string::npos && number.size() < 6;
    if (digits && std::stoi(number) >= 1) {
      p.mode = CheckpointMode::selective_layer;
      p.layer_frequency = std::stoi(number);
      return p;
    }
  }
  fail(ErrorKind::config, "activation_checkpoint.mode: expected none, full, selective-op, selective-layer:N (N >= 1) "
                          "or auto, found '" + text + "'");
}

KeepSet needed_by_backward() {
  KeepSet needed{};
  for (int op = 0; op < kBackwardOpCount; ++op)
    for (Activation a : backward_op_info(static_cast<BackwardOp>(op)).reads) needed[static_cast<int>(a)] = true;
  return needed;
}

KeepSet keep_set(const CheckpointPolicy& policy, int64_t layer) {
  KeepSet keep{};
  keep[static_cast<int>(Activation::layer_input)] = true;
  auto keep_all = [&] { keep = needed_by_backward(); };
  switch (policy.mode) {
    case CheckpointMode::none: keep_all(); break;
    case CheckpointMode::full: break;
    case CheckpointMode::selective_layer:
      // torchtitan's numbering: the N-th, 2N-th, ... blocks (1-based) are checkpointed.
      if ((layer + 1) % policy.layer_frequency != 0) keep_all();
      break;
    case CheckpointMode::selective_op: {
      // Matmul outputs at odd positions (1st, 3rd, ...) in forward order are kept, the
      // even ones recomputed; attention outputs (with the log-sum-exp) are kept.
      int matmul_index = 0;
      for (int op = 0; op < kForwardOpCount; ++op) {
        const auto& info = forward_op_info(static_cast<ForwardOp>(op));
        bool save = false;
        if (info.is_matmul) save = (++matmul_index % 2) == 1;
        if (static_cast<ForwardOp>(op) == ForwardOp::attention) save = true;
        if (save)
          for (Activation a : info.outputs) keep[static_cast<int>(a)] = true;
      }
      keep[static_cast<int>(Activation::layer_output)] = false;  // the next block's input: kept there
      break;
    }
    case CheckpointMode::automatic:
      fail(ErrorKind::internal, "keep_set: the automatic policy is resolved by the planner, not here");
  }
  return keep;
}

std::array<bool, kForwardOpCount> recompute_ops(const KeepSet& kept) {
  std::array<bool, kForwardOpCount> run{};
  KeepSet required = needed_by_backward();
  for (int a = 0; a < kActivationCount; ++a)
    if (kept[a]) required[a] = false;
  for (int op = kForwardOpCount - 1; op >= 0; --op) {
    const auto& info = forward_op_info(static_cast<ForwardOp>(op));
    bool produces_required = false;
    for (Activation a : info.outputs) produces_required |= required[static_cast<int>(a)];
    if (!produces_required) continue;
    run[op] = true;
    for (Activation a : info.inputs)
      if (!kept[static_cast<int>(a)]) required[static_cast<int>(a)] = true;
  }
  return run;
}

}  // namespace smelt
