#!/usr/bin/env python3
"""Tokens/s against the memory budget, for `auto` and the fixed checkpointing policies.

Runs `smelt bench` once per point (one process each) on the GPU at hand:
  1. each fixed policy (none, selective-op, full) without a budget: its tokens/s and predicted peak;
  2. each fixed policy again with activation_checkpoint.memory_budget_gb = its own peak + 1%
     (the budget is enforced: the rest of the device is held back) -- the "no cliff" check;
  3. `auto` at budgets from full's peak + 1% to none's peak + 2%.
Writes every result to one JSON file (the input of scripts/plot_memory_curve.py) and prints a table.

  scripts/memory_curve.py --smelt build-gpu/smelt --config configs/llama3_8b_proxy.toml \\
      --set float8.recipe=tensorwise --points 6 --output curve.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

FIXED = ["none", "selective-op", "full"]


def bench(args, mode, budget_gb, folder, label):
    out = os.path.join(folder, f"{label}.json")
    cmd = [args.smelt, "bench", "--config", args.config, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--output", out, f"--activation_checkpoint.mode={mode}"]
    cmd += [f"--{s}" for s in args.set]
    if budget_gb:
        cmd.append(f"--activation_checkpoint.memory_budget_gb={budget_gb:.4f}")
    print("+", " ".join(cmd), flush=True)
    run = subprocess.run(cmd, capture_output=True, text=True)
    log = run.stdout + run.stderr
    if args.logs:
        with open(os.path.join(args.logs, f"{label}.log"), "w") as f:
            f.write(log)
    if run.returncode != 0:
        reason = log.strip().splitlines()[-1] if log.strip() else f"exit {run.returncode}"
        print(f"  {label}: failed ({reason})", flush=True)
        return {"mode": mode, "budget_gb": budget_gb, "ok": False, "error": reason}
    with open(out) as f:
        result = json.load(f)
    result.update({"mode": mode, "budget_gb": budget_gb, "ok": True})
    print(f"  {label}: {result['tokens_per_second']:.0f} tokens/s, plan {result['predicted_bytes'] / 1e9:.2f} GB, "
          f"driver {result['measured_bytes'] / 1e9:.2f} GB", flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smelt", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--set", action="append", default=[], help="section.key=value override, repeatable")
    p.add_argument("--points", type=int, default=6, help="auto budgets between full's and none's peaks")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--output", required=True)
    p.add_argument("--logs", default="")
    args = p.parse_args()
    if args.points < 2:
        sys.exit("memory_curve: --points must be at least 2")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)

    with tempfile.TemporaryDirectory() as folder:
        results = []
        peaks = {}
        for mode in FIXED:
            r = bench(args, mode, 0, folder, f"{mode}-unlimited")
            results.append(r)
            if r["ok"]:
                peaks[mode] = r["predicted_bytes"] / 1e9
        for mode, peak in peaks.items():
            results.append(bench(args, mode, peak * 1.01, folder, f"{mode}-peak+1%"))
        if "full" in peaks and "none" in peaks:
            low, high = peaks["full"] * 1.01, peaks["none"] * 1.02
            for i in range(args.points):
                budget = low + (high - low) * i / (args.points - 1)
                results.append(bench(args, "auto", budget, folder, f"auto-{budget:.1f}GB"))
        results.append(bench(args, "auto", 0, folder, "auto-unlimited"))

    with open(args.output + ".tmp", "w") as f:
        json.dump({"config": args.config, "overrides": args.set, "results": results}, f, indent=1)
    os.replace(args.output + ".tmp", args.output)

    print(f"\n{'policy':<14} {'budget GB':>10} {'tokens/s':>10} {'plan GB':>9} {'driver GB':>10}")
    for r in results:
        budget = f"{r['budget_gb']:.2f}" if r["budget_gb"] else "unlimited"
        if r["ok"]:
            print(f"{r['mode']:<14} {budget:>10} {r['tokens_per_second']:>10.0f} {r['predicted_bytes'] / 1e9:>9.2f} "
                  f"{r['measured_bytes'] / 1e9:>10.2f}")
        else:
            print(f"{r['mode']:<14} {budget:>10} {'refused':>10}")


if __name__ == "__main__":
    main()
