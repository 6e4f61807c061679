#!/usr/bin/env python3
"""Float8 training quality: trains one config once per float8 recipe and compares each run's final
validation loss with the bf16 run's (recipe "none").

Every run uses the same seed, data order and schedule; only `float8.recipe` changes. Writes the
loss curves of every run to one JSON file (the input of scripts/plot_loss_curves.py), prints a table
and exits 1 when a recipe ends further than --tolerance (relative) above the bf16 validation loss.

  scripts/float8_quality.py --smelt build-gpu/smelt --config configs/float8_quality.toml \\
      --recipes none,tensorwise,rowwise --output quality.json
  scripts/float8_quality.py --smelt build/smelt --config configs/debug.toml \\
      --set training.mixed_precision_param=bfloat16 --output debug_quality.json   # CPU, emulated
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def read_metrics(path):
    """The (step, loss), (step, validation loss) and tokens/s series of one run's metrics.jsonl."""
    train, validation, speed = [], [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                m = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"float8_quality: {path}:{number}: not JSON ({e})")
            train.append([m["step"], m["loss"]])
            if "validation_loss" in m:
                validation.append([m["step"], m["validation_loss"]])
            if m.get("tokens_per_second", 0) > 0:
                speed.append(m["tokens_per_second"])
    return train, validation, speed


def train(args, recipe, folder):
    name = f"quality_{recipe}"
    cmd = [args.smelt, "train", "--config", args.config, f"--float8.recipe={recipe}", f"--job.name={name}",
           f"--job.dump_folder={folder}"] + [f"--{s}" for s in args.set]
    print("+", " ".join(cmd), flush=True)
    log_path = os.path.join(folder, f"{name}.log")
    started = time.time()
    with open(log_path, "w") as log:
        run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in run.stdout:
            log.write(line)
            if "val_loss" in line or "error" in line.lower():
                print(f"  [{recipe}] {line.rstrip()}", flush=True)
        run.wait()
    if run.returncode != 0:
        with open(log_path) as f:
            tail = f.read().strip().splitlines()[-5:]
        sys.exit(f"float8_quality: the {recipe} run failed (exit {run.returncode}); its log ends:\n" + "\n".join(tail))
    metrics = os.path.join(folder, name, "metrics.jsonl")
    if not os.path.isfile(metrics):
        sys.exit(f"float8_quality: the {recipe} run wrote no {metrics}")
    loss, validation, speed = read_metrics(metrics)
    if not validation:
        sys.exit(f"float8_quality: the {recipe} run logged no validation loss; enable [validation] in {args.config}")
    tail = [l for _, l in loss[-5:]]
    result = {
        "recipe": recipe,
        "loss": loss,
        "validation_loss": validation,
        "final_validation_loss": validation[-1][1],
        "final_training_loss": statistics.mean(tail),
        "tokens_per_second": statistics.median(speed[len(speed) // 4:]) if speed else 0.0,
        "seconds": time.time() - started,
    }
    print(f"  [{recipe}] validation loss {result['final_validation_loss']:.4f}, training loss (last 5 logs) "
          f"{result['final_training_loss']:.4f}, {result['tokens_per_second']:.0f} tokens/s, "
          f"{result['seconds']:.0f} s", flush=True)
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smelt", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--recipes", default="none,tensorwise,rowwise",
                   help="comma-separated float8 recipes; the first is the baseline (default: none, i.e. bf16)")
    p.add_argument("--set", action="append", default=[], help="section.key=value override, repeatable")
    p.add_argument("--tolerance", type=float, default=0.015, help="relative validation-loss gap allowed")
    p.add_argument("--output", required=True, help="JSON file of every run's curves")
    p.add_argument("--runs", default="", help="folder for the run folders and logs (default: a temporary one)")
    args = p.parse_args()
    recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
    if len(recipes) < 2:
        sys.exit("float8_quality: --recipes needs a baseline and at least one recipe to compare")
    if not os.access(args.smelt, os.X_OK):
        sys.exit(f"float8_quality: --smelt {args.smelt} is not an executable; build smelt first")
    if not os.path.isfile(args.config):
        sys.exit(f"float8_quality: --config {args.config} does not exist")

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.runs or scratch
        os.makedirs(folder, exist_ok=True)
        runs = [train(args, recipe, folder) for recipe in recipes]

    base = runs[0]["final_validation_loss"]
    failed = []
    for r in runs:
        r["relative_gap"] = (r["final_validation_loss"] - base) / base
        r["within_tolerance"] = r["relative_gap"] <= args.tolerance
        if not r["within_tolerance"]:
            failed.append(r["recipe"])
    temporary = args.output + ".tmp"
    with open(temporary, "w") as f:
        json.dump({"config": args.config, "set": args.set, "tolerance": args.tolerance, "runs": runs}, f, indent=1)
    os.replace(temporary, args.output)

    print(f"\n| recipe | validation loss | vs {recipes[0]} | training loss | tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for r in runs:
        print(f"| {r['recipe']} | {r['final_validation_loss']:.4f} | {100 * r['relative_gap']:+.2f}% | "
              f"{r['final_training_loss']:.4f} | {r['tokens_per_second']:.0f} |")
    if failed:
        print(f"float8_quality: {', '.join(failed)} ended more than {100 * args.tolerance:.1f}% above "
              f"the {recipes[0]} validation loss", file=sys.stderr)
        sys.exit(1)
    print(f"every recipe within {100 * args.tolerance:.1f}% of the {recipes[0]} validation loss")


if __name__ == "__main__":
    main()
