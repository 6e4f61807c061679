#!/usr/bin/env python3
"""Proves smelt's Hugging Face interop with PyTorch and transformers (run on the GPU machine).

1. smelt trains a small byte-level Llama, exports it (--format hf, float32); transformers loads it
   with no missing or unexpected keys; every tensor equals smelt's weight under the independent
   permutation transformers' own Meta-to-HF conversion uses (view(H, Dh/2, 2, D).transpose(1, 2));
   greedy continuations from smelt and from transformers agree token for token.
2. transformers writes the model again (save_pretrained); smelt imports that folder back
   (export --format smelt) and gets its original fp32 weights bit for bit.
Exit status 0 when everything holds. Usage: scripts/hf_roundtrip.py [--smelt build/smelt] [--device cuda]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

BOS, EOS = 256, 257  # smelt's byte tokenizer: ids 0..255 are bytes


def run(command):
    print("+", " ".join(command), flush=True)
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result.stdout


def to_hf_rows(weight, heads):
    # smelt (torchtitan) rows per head: pairs (2i, 2i+1); transformers: (i, i + Dh/2).
    rows, cols = weight.shape
    head_dim = rows // heads
    return weight.view(heads, head_dim // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_name(name):
    if name == "tok_embeddings.weight":
        return "model.embed_tokens.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    layer, rest = name.split(".", 2)[1], name.split(".", 2)[2]
    table = {"attention_norm.weight": "input_layernorm.weight", "attention.wq.weight": "self_attn.q_proj.weight",
             "attention.wk.weight": "self_attn.k_proj.weight", "attention.wv.weight": "self_attn.v_proj.weight",
             "attention.wo.weight": "self_attn.o_proj.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
             "feed_forward.w1.weight": "mlp.gate_proj.weight", "feed_forward.w3.weight": "mlp.up_proj.weight",
             "feed_forward.w2.weight": "mlp.down_proj.weight"}
    return f"model.layers.{layer}.{table[rest]}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--smelt", default=os.path.join(os.path.dirname(__file__), "..", "build", "smelt"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    smelt = os.path.abspath(args.smelt)
    source = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "docs"))
    work = tempfile.mkdtemp(prefix="smelt-hf-")
    failures = []

    # 1. smelt -> transformers
    run([smelt, "train", f"--job.dump_folder={work}", "--job.name=tiny", f"--job.device={args.device}",
         f"--training.dataset_path={source}", "--model.dim=128", "--model.n_layers=2", "--model.n_heads=4",
         "--model.n_kv_heads=2", "--training.seq_len=128", "--training.local_batch_size=8",
         f"--training.steps={args.steps}", "--optimizer.lr=2e-3", "--model.rope_scaling=true"])
    run_folder = os.path.join(work, "tiny")
    hf_folder = os.path.join(work, "hf")
    run([smelt, "export", "--from", run_folder, "--format", "hf", "--dtype", "float32", "--output", hf_folder])
    model, info = LlamaForCausalLM.from_pretrained(hf_folder, torch_dtype=torch.float32, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            failures.append(f"transformers reports {kind}: {info[kind]}")
    config = json.load(open(os.path.join(hf_folder, "config.json")))
    smelt_weights = load_file(os.path.join(run_folder, "model.safetensors"))
    hf_state = model.state_dict()
    for name, weight in smelt_weights.items():
        expected = weight
        if name.endswith("attention.wq.weight"):
            expected = to_hf_rows(weight, config["num_attention_heads"])
        if name.endswith("attention.wk.weight"):
            expected = to_hf_rows(weight, config["num_key_value_heads"])
        if not torch.equal(hf_state[hf_name(name)].view(expected.shape), expected):
            failures.append(f"{hf_name(name)} differs from smelt's {name}")

    prompt = "The memory plan"
    model = model.to(args.device).eval()
    ids = torch.tensor([[BOS] + list(prompt.encode())], device=args.device)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=48, do_sample=False, eos_token_id=EOS, pad_token_id=EOS)
    hf_tokens = [t for t in out[0, ids.shape[1]:].tolist() if t < 256]
    hf_text = bytes(hf_tokens).decode("utf-8", errors="replace")
    smelt_text = run([smelt, "generate", "--checkpoint", run_folder, "--prompt", prompt, "--max-tokens", "48",
                      "--temperature", "0", "--device", args.device])
    print(f"transformers: {hf_text!r}\nsmelt:        {smelt_text!r}")
    if hf_text[:32] not in smelt_text:
        failures.append("greedy continuations differ (compare the two lines above)")

    # 2. transformers -> smelt
    resaved = os.path.join(work, "hf-resaved")
    model.to("cpu").save_pretrained(resaved, safe_serialization=True)
    back = os.path.join(work, "back.safetensors")
    run([smelt, "export", "--from", resaved, "--format", "smelt", "--seq-len", "128", "--output", back])
    returned = load_file(back)
    for name, weight in smelt_weights.items():
        if not torch.equal(returned[name], weight):
            failures.append(f"{name} changed on the way smelt -> transformers -> smelt")

    if failures:
        print("\n".join(["FAILED:"] + failures))
        return 1
    print(f"hf round trip OK ({len(smelt_weights)} tensors, greedy text agrees); files in {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
