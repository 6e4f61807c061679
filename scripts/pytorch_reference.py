#!/usr/bin/env python3
"""Measures PyTorch's training step for a smelt config on this GPU and writes a reference table.

The step is the one configs/reference/pytorch_h200.toml describes: a Llama-3 model in plain
PyTorch with fp32 master weights, bf16 autocast, causal SDPA (K and V repeated to the query heads,
as torchtitan's model does), cross-entropy on fp32 logits, gradient clipping at 1.0 and fused
AdamW; torch.compile per transformer block, per linear layer (the public report's "linear layers
only"; smelt's float8 fusion "linear" is its analogue) or eager; activation checkpointing none, selective-op
(every matrix product's and attention's output kept except every second matrix product, the rest
recomputed) or full. Precision bf16, or float8 through torchao's `convert_to_float8_training`
(recipe by name, the output projection kept in bf16, converted before compiling), when torchao can
be imported (put its source folder on PYTHONPATH; the script asks for nothing to be installed).

Each run is its own process (a clean allocator and compile cache), so peak_gb is that run's
torch.cuda.max_memory_allocated; a run that fails (or does not fit the GPU) is left out of the table,
said so, and makes the exit status 1. tokens/s is the median over the timed steps (CUDA events).
The output is a table in the format `smelt bench --reference FILE` reads (docs/benchmarks.md,
"Comparing with PyTorch"), with `gpu` set to this GPU's name:

  python3 scripts/pytorch_reference.py --config configs/llama3_8b_proxy.toml \\
      --smelt build-gpu/smelt --runs "precision=bf16,fp8-tensorwise compile=none,block ac=none,selective-op" \\
      --steps 8 --warmup 3 \\
      --out runs/pytorch.toml
  build-gpu/smelt bench --config configs/llama3_8b_proxy.toml --reference runs/pytorch.toml ...
"""
import argparse
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMPILE_LABELS = {"none": "none (eager)", "block": "full (per block)", "linear": "linear layers only"}
AC_MODES = ("none", "selective-op", "full")
PRECISIONS = {"bf16": None, "fp8-tensorwise": "tensorwise", "fp8-rowwise": "rowwise",
              "fp8-rowwise_with_gw_hp": "rowwise_with_gw_hp"}  # smelt's name -> torchao's recipe


def fail(message):
    print(f"pytorch_reference: {message}", file=sys.stderr)
    sys.exit(2)


def model_shapes(smelt, config_path, overrides):
    """The model and step smelt plans for this config (`smelt plan --format json`): one source of shapes."""
    command = [smelt, "plan", "--config", config_path, "--format", "json"] + overrides
    try:
        plan = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as error:
        fail(f"cannot run {smelt} ({error}); name the binary with --smelt")
    if plan.returncode != 0:
        fail(f"`{' '.join(command)}` failed (exit {plan.returncode}):\n{plan.stderr.strip()}")
    j = json.loads(plan.stdout)
    shapes = {key: int(j["model"][key]) for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")}
    shapes["rope_theta"] = 500000.0  # Llama 3's; the step's speed does not depend on it
    name = os.path.splitext(os.path.basename(config_path))[0]
    return name, shapes, int(j["batch_size"]), int(j["seq_len"])


def parse_runs(text):
    """'precision=bf16 compile=none,block ac=none,selective-op' -> every (precision, compile, ac)."""
    axes = {"precision": ["bf16"], "compile": ["block"], "ac": ["selective-op"]}
    for part in text.split():
        key, _, values = part.partition("=")
        if key not in axes or not values:
            fail(f"--runs: '{part}' is not precision=..., compile=... or ac=...")
        chosen = values.split(",")
        allowed = {"precision": PRECISIONS, "compile": COMPILE_LABELS, "ac": AC_MODES}[key]
        for value in chosen:
            if value not in allowed:
                fail(f"--runs: {key} '{value}' is not one of {', '.join(allowed)}")
        axes[key] = chosen
    return list(itertools.product(axes["precision"], axes["compile"], axes["ac"]))


# ----------------------------------------------------------------------------- one run (child)

def run_one(shapes, batch, seq_len, precision, compile_mode, ac, steps, warmup, seed):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    dim, heads, kv_heads = shapes["dim"], shapes["n_heads"], shapes["n_kv_heads"]
    head_dim = dim // heads

    class RMSNorm(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(width))

        def forward(self, x):
            x32 = x.float()
            return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * self.weight

    def rotate(x, cos, sin):  # pairs (2i, 2i+1) turned by the position's angle
        pairs = x.float().unflatten(-1, (-1, 2))
        even, odd = pairs[..., 0], pairs[..., 1]
        turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return turned.flatten(-2).type_as(x)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm = RMSNorm(dim)
            self.wq = nn.Linear(dim, heads * head_dim, bias=False)
            self.wk = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wv = nn.Linear(dim, kv_heads * head_dim, bias=False)
            self.wo = nn.Linear(heads * head_dim, dim, bias=False)
            self.ffn_norm = RMSNorm(dim)
            self.w1 = nn.Linear(dim, shapes["ffn_dim"], bias=False)
            self.w2 = nn.Linear(shapes["ffn_dim"], dim, bias=False)
            self.w3 = nn.Linear(dim, shapes["ffn_dim"], bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.attention_norm(x)
            q = rotate(self.wq(h).view(b, t, heads, head_dim), cos, sin)
            k = rotate(self.wk(h).view(b, t, kv_heads, head_dim), cos, sin)
            v = self.wv(h).view(b, t, kv_heads, head_dim)
            repeat = heads // kv_heads
            k = k.repeat_interleave(repeat, dim=2)
            v = v.repeat_interleave(repeat, dim=2)
            attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=True)
            x = x + self.wo(attended.transpose(1, 2).reshape(b, t, dim))
            h = self.ffn_norm(x)
            return x + self.w2(F.silu(self.w1(h)) * self.w3(h))

    # Saved under selective-op: the matrix products (float8 ones dispatch as aten.mm on torchao's
    # tensors), attention, and the maxima float8 scales come from.
    saved_ops = {torch.ops.aten.mm.default, torch.ops.aten.max.default}
    for name in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention"):
        if hasattr(torch.ops.aten, name):
            saved_ops.add(getattr(torch.ops.aten, name).default)

    def selective_contexts():
        counts = {"forward": 0, "recompute": 0}

        def policy(ctx, op, *args, **kwargs):
            phase = "recompute" if ctx.is_recompute else "forward"
            if op == torch.ops.aten.mm.default:
                counts[phase] += 1
                if counts[phase] % 2 == 0:  # every second product is recomputed
                    return CheckpointPolicy.PREFER_RECOMPUTE
            return CheckpointPolicy.MUST_SAVE if op in saved_ops else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    class Checkpointed(nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, x, cos, sin):
            if ac == "full":
                return checkpoint(self.block, x, cos, sin, use_reentrant=False)
            return checkpoint(self.block, x, cos, sin, use_reentrant=False, context_fn=selective_contexts)

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok_embeddings = nn.Embedding(shapes["vocab_size"], dim)
            self.layers = nn.ModuleList(Block() for _ in range(shapes["n_layers"]))
            self.norm = RMSNorm(dim)
            self.output = nn.Linear(dim, shapes["vocab_size"], bias=False)

        def forward(self, tokens, cos, sin):
            x = self.tok_embeddings(tokens)
            for layer in self.layers:
                x = layer(x, cos, sin)
            return self.output(self.norm(x))

    torch.manual_seed(seed)
    device = torch.device("cuda")
    with device:
        model = Llama()
        for parameter in model.parameters():
            if parameter.dim() > 1:
                nn.init.normal_(parameter, std=0.02)
        positions = torch.arange(seq_len, dtype=torch.float32)
        inverse = 1.0 / (shapes["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        angles = torch.outer(positions, inverse)[None, :, None, :]  # (1, T, 1, Dh/2)
        cos, sin = angles.cos(), angles.sin()
        # Fresh tokens every step (a repeated batch is memorised within a few steps).
        tokens = torch.randint(0, shapes["vocab_size"], (warmup + steps, batch, seq_len + 1))
    if PRECISIONS[precision]:
        try:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except ImportError as error:
            fail(f"precision {precision} needs torchao ({error}); put its source folder on PYTHONPATH")
        convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(PRECISIONS[precision]),
                                   module_filter_fn=lambda module, fqn: fqn != "output")
    for index, block in enumerate(model.layers):  # checkpointing wraps the block, compiling wraps both
        if compile_mode == "linear":  # each linear layer compiled on its own, inside the eager block
            for child_name, child in list(block.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(block, child_name, torch.compile(child))
        wrapped = block if ac == "none" else Checkpointed(block)
        model.layers[index] = torch.compile(wrapped, fullgraph=True) if compile_mode == "block" else wrapped
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                  fused=True)

    def step(index):
        inputs, labels = tokens[index, :, :-1], tokens[index, :, 1:]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(inputs, cos, sin)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        return loss

    torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for index in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began = time.time()
        start.record()
        try:
            loss = step(index)
        except torch.cuda.OutOfMemoryError as error:
            print(f"pytorch_reference: does not fit this GPU: {str(error).splitlines()[0]}", file=sys.stderr)
            sys.exit(3)
        end.record()
        end.synchronize()
        milliseconds = start.elapsed_time(end)
        losses.append(loss.item())
        if index >= warmup:
            times.append(milliseconds)
        print(f"  step {index + 1}/{warmup + steps}: {milliseconds:.1f} ms (wall {time.time() - began:.1f} s), "
              f"loss {losses[-1]:.4f}{' (warm-up)' if index < warmup else ''}", file=sys.stderr, flush=True)
    if not all(math.isfinite(x) for x in losses):
        fail(f"a loss was not finite: {losses}")
    median_ms = statistics.median(times)
    return {
        "tokens_per_second": batch * seq_len / (median_ms / 1e3),
        "step_ms": median_ms,
        "peak_gb": torch.cuda.max_memory_allocated() / 1e9,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }


# ----------------------------------------------------------------------------- the table (parent)

def table_text(name, shapes, batch, seq_len, results, source, gpu):
    lines = [
        "# PyTorch's step on this GPU, measured by scripts/pytorch_reference.py (bf16 autocast, fp32 master",
        "# weights, fused AdamW, clipping at 1.0, causal SDPA, fp32 cross-entropy). `smelt bench --reference`",
        "# reads this file.",
        "",
        f"source = {json.dumps(source)}",
        f"gpu = {json.dumps(gpu)}",
        "",
        f"[models.{name}]",
    ]
    lines += [f"{key} = {shapes[key]}" for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size")]
    for (precision, compile_mode, ac), result in results:
        lines += [
            "",
            "[[runs]]",
            f"model = \"{name}\"",
            f"batch = {batch}",
            f"seq_len = {seq_len}",
            f"precision = \"{precision}\"",
            f"activation_checkpoint = \"{ac}\"",
            f"compile = \"{COMPILE_LABELS[compile_mode]}\"",
        ]
        if PRECISIONS[precision] and compile_mode != "none":  # what smelt's float8 fusion compares with
            lines.append(f"fusion = \"{'full' if compile_mode == 'block' else 'linear'}\"")
        lines += [
            f"tokens_per_second = {result['tokens_per_second']:.0f}",
            f"peak_gb = {result['peak_gb']:.2f}",
        ]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="a smelt config file (its [model] and [training] keys)")
    parser.add_argument("--runs", default="precision=bf16 compile=block ac=none,selective-op",
                        help="precision=bf16,fp8-tensorwise,fp8-rowwise compile=none,block,linear "
                             "ac=none,selective-op,full (every combination runs)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per run (median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    parser.add_argument("--smelt", default="build/smelt", help="the smelt binary whose plan gives the shapes")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override passed to smelt plan, e.g. training.local_batch_size=2 (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="the reference table to write (TOML)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: the run (JSON) a child measures
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1:
        fail("--steps and --warmup must be at least 1 (the first step compiles)")
    if args.one:  # a child: the parent's description of the run, so smelt plan runs once
        run = json.loads(args.one)
        print(json.dumps(run_one(run["shapes"], run["batch"], run["seq_len"], run["precision"], run["compile"],
                                 run["ac"], args.steps, args.warmup, args.seed)))
        return
    overrides = []
    for item in args.set:
        if "=" not in item:
            fail(f"--set '{item}' is not KEY=VALUE")
        overrides.append("--" + item)
    name, shapes, batch, seq_len = model_shapes(args.smelt, args.config, overrides)

    runs = parse_runs(args.runs)
    results, failed, gpu, version = [], [], None, None
    for precision, compile_mode, ac in runs:
        print(f"pytorch_reference: {name}, batch {batch}, seq {seq_len}, {precision}, compile {compile_mode}, AC {ac}",
              file=sys.stderr, flush=True)
        run = {"shapes": shapes, "batch": batch, "seq_len": seq_len, "precision": precision, "compile": compile_mode,
               "ac": ac}
        command = [sys.executable, os.path.abspath(__file__), "--config", args.config, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--seed", str(args.seed), "--out", args.out,
                   "--one", json.dumps(run)]
        child = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if child.returncode != 0:  # the others still run; the table holds the runs that completed
            what = "did not fit the GPU" if child.returncode == 3 else f"failed (exit {child.returncode})"
            print(f"pytorch_reference:   precision={precision} compile={compile_mode} ac={ac} {what}",
                  file=sys.stderr, flush=True)
            failed.append(f"precision={precision} compile={compile_mode} ac={ac}")
            continue
        result = json.loads(child.stdout.strip().splitlines()[-1])
        gpu, version = result["gpu"], result["torch"]
        print(f"pytorch_reference:   {result['tokens_per_second']:.0f} tokens/s ({result['step_ms']:.1f} ms), "
              f"peak {result['peak_gb']:.2f} GB", file=sys.stderr, flush=True)
        results.append(((precision, compile_mode, ac), result))

    if not results:
        fail("no run completed; nothing written")
    float8 = " + torchao float8" if any(PRECISIONS[precision] for (precision, _, _), _ in results) else ""
    text = table_text(name, shapes, batch, seq_len, results, f"PyTorch {version}{float8}, torchtitan-style step", gpu)
    folder = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(folder, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
        f.write(text)
    os.replace(f.name, args.out)  # whole or not at all
    print(f"pytorch_reference: wrote {args.out} ({len(results)} runs)", file=sys.stderr)
    if failed:
        print(f"pytorch_reference: not in the table: {'; '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
