#!/usr/bin/env bash
# Starts one `smelt train` process per GPU on this node with the torchrun environment set
# (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), each logging to its own file;
# rank 0 writes the run folder and metrics. Extra arguments go to every rank, e.g.
#   NGPU=4 CONFIG_FILE=configs/llama3_8b.toml ./scripts/run_train.sh --training.steps=100
# Multi-node: run it on every node with NNODES, NODE_RANK and MASTER_ADDR (rank 0's node) set.
set -euo pipefail
cd "$(dirname "$0")/.."

NGPU=${NGPU:-8}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
CONFIG_FILE=${CONFIG_FILE:-configs/debug.toml}
SMELT=${SMELT:-build/smelt}
LOG_DIR=${LOG_DIR:-runs/logs}
export MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
export MASTER_PORT=${MASTER_PORT:-29500}
WORLD_SIZE=$((NGPU * NNODES))

if [[ ! -x "$SMELT" ]]; then
  echo "run_train.sh: expected the smelt binary at $SMELT; build it (scripts/build) or set SMELT=path" >&2
  exit 2
fi
if [[ ! -f "$CONFIG_FILE" ]]; then
  echo "run_train.sh: CONFIG_FILE=$CONFIG_FILE does not exist; pass a file under configs/" >&2
  exit 2
fi
mkdir -p "$LOG_DIR"

pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop_all INT TERM

for ((local_rank = 0; local_rank < NGPU; ++local_rank)); do
  rank=$((NODE_RANK * NGPU + local_rank))
  log="$LOG_DIR/rank_${rank}.log"
  # Every rank gets the same config and overrides. The shard degree defaults to -1: the ranks
  # left after replication (all of them, or WORLD_SIZE / R with
  # --parallelism.data_parallel_replicate_degree=R for HSDP); arguments given here come later and win.
  RANK=$rank WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$local_rank LOCAL_WORLD_SIZE=$NGPU \
    "$SMELT" train --config "$CONFIG_FILE" --job.device=cuda \
    --parallelism.data_parallel_shard_degree=-1 "$@" >"$log" 2>&1 &
  pids+=($!)
  echo "rank $rank (GPU $local_rank): pid ${pids[-1]}, log $log"
done

# Rank 0's log on the console while the run goes on.
if ((NODE_RANK == 0)); then
  tail -n +1 -f "$LOG_DIR/rank_0.log" --pid "${pids[0]}" &
  tail_pid=$!
fi

status=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  if ((code != 0)); then
    rank=$((NODE_RANK * NGPU + i))
    echo "run_train.sh: rank $rank failed (exit $code); see $LOG_DIR/rank_$rank.log" >&2
    status=1
    stop_all  # the others would wait for it forever
  fi
done
[[ -n "${tail_pid:-}" ]] && wait "$tail_pid" 2>/dev/null || true
exit $status
