"""bench/memory_table.py: which models fit full-fine-tuning GRPO (stage 1) in a given GPU memory?

Arithmetic only: the parameters from each model's config (published ones below, or --config), the
bytes that `mascot.py train --stage 1` holds during GRPO, and the peak after each switch, cumulative:
all fp32 (--dtype float32); the CUDA defaults (--dtype auto: bf16 frozen models and sampling copy);
+ --autocast-bf16; + --gradient-checkpointing; + --micro-batch 4. Counted (N = policy parameters,
tied embedding once): the policy, gradients and AdamW's two moments, fp32: 16N; the frozen base
model (KL reference, candidate sampler) and the reward model (the same base), N x --dtype's bytes
each; the bf16 sampling copy 2N; autocast's cached bf16 weight casts 2N. Per micro-batch of mb
rows: activations per layer and token (fp32: 6h + 2kv + 4I elements x 4 bytes; autocast: 24h +
4kv + 8I bytes, norms and residual fp32) over ceil(mb / G) x P + mb x C tokens (each group's
prompt once: grpo.completion_hidden), or with checkpointing mb x (P + C) tokens at 4h bytes a
layer plus one layer's full set; the logits completion_logprobs keeps for backward, mb x C x V x 4
bytes. Generation (its own phase): the KV cache of all B rows, 2 x layers x kv x (P + C) x B x 2
bytes (4 in fp32). Not counted: CUDA context and allocator slack (--reserve-gib), the sentence
encoder (~0.1 GiB), the reward model's no-grad scoring, optimiser temporaries. Good to about +-20%.

    python bench/memory_table.py                                 # 24 GiB, the defaults below
    python bench/memory_table.py --gpu-gib 80 --prompt-len 1024 --config path/to/model/config.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

MODELS = {
    "SmolLM2-135M": dict(h=576, layers=30, heads=9, kv_heads=3, inter=1536, vocab=49152, qkv_bias=False, tied=True),
    "SmolLM2-360M": dict(h=960, layers=32, heads=15, kv_heads=5, inter=2560, vocab=49152, qkv_bias=False, tied=True),
    "Qwen2.5-0.5B": dict(h=896, layers=24, heads=14, kv_heads=2, inter=4864, vocab=151936, qkv_bias=True, tied=True),
    "Qwen2.5-1.5B": dict(h=1536, layers=28, heads=12, kv_heads=2, inter=8960, vocab=151936, qkv_bias=True, tied=True)}
GIB = 1024**3
STEPS = [  # (label, frozen models in bf16, autocast, checkpointing, micro-batch override)
    ("all fp32", False, False, False, None), ("defaults on CUDA", True, False, False, None),
    ("+ autocast", True, True, False, None), ("+ checkpointing", True, True, True, None),
    ("+ micro-batch 4", True, True, True, 4)]


def from_config(path: str) -> dict:
    """A Llama/Qwen2-style config.json (or the folder holding it) in the form of MODELS."""
    file = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    try:
        c = json.loads(file.read_text(encoding="utf-8"))
        return dict(h=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                    kv_heads=c.get("num_key_value_heads", c["num_attention_heads"]), inter=c["intermediate_size"],
                    vocab=c["vocab_size"], qkv_bias=c.get("model_type") == "qwen2" or c.get("attention_bias", False),
                    tied=c.get("tie_word_embeddings", True))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SystemExit(f"--config {path}: not a readable Llama/Qwen2-style config.json ({type(err).__name__}: {err})")


def kv_width(m: dict) -> int:                                                 # key/value width
    return m["kv_heads"] * (m["h"] // m["heads"])


def n_params(m: dict) -> int:
    """Parameters of a Llama/Qwen2-style decoder (SmolLM2-135M: 134,515,008, as the model counts)."""
    h, kv, inter = m["h"], kv_width(m), m["inter"]
    attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if m["qkv_bias"] else 0)   # q, o + k, v (+ biases)
    layer = attn + 3 * h * inter + 2 * h                                     # + SwiGLU MLP + 2 norms
    return m["vocab"] * h * (1 if m["tied"] else 2) + m["layers"] * layer + h


def breakdown(m: dict, a, mb: int, bf16: bool, autocast: bool, checkpointing: bool) -> dict:
    """Bytes of each item; 'peak' = the static state + the larger of the training and generation phases."""
    N, h, kv, inter, L, V = n_params(m), m["h"], kv_width(m), m["inter"], m["layers"], m["vocab"]
    P, C, B, G = a.prompt_len, a.completion_len, a.prompts * a.group_size, a.group_size
    per_layer_token = (24 * h + 4 * kv + 8 * inter) if autocast else 4 * (6 * h + 2 * kv + 4 * inter)
    if checkpointing:
        activations = mb * (P + C) * (L * 4 * h + per_layer_token)
    else:   # each group's prompt once, and its keys and values copied to every row of the group
        activations = (math.ceil(mb / G) * P + mb * C) * L * per_layer_token + 2 * L * kv * mb * P * (2 if autocast else 4)
    static = {"policy+grads+AdamW (fp32)": 16 * N, "reference": (2 if bf16 else 4) * N,
              "reward model": (2 if bf16 else 4) * N, "sampling copy (bf16)": 2 * N if bf16 else 0,
              "autocast weight casts": 2 * N if autocast else 0}
    train = {"activations": activations, "logits": mb * C * V * 4 + 512 * V * 4}   # + one chunk's gradient
    generation = 2 * L * kv * (P + C) * B * (2 if bf16 or autocast else 4) + B * V * 4   # KV, the last logits
    return {**static, **train, "generation KV": generation, "params": N,
            "peak": sum(static.values()) + max(sum(train.values()), generation)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu-gib", type=float, default=24.0, help="GPU memory in GiB")
    p.add_argument("--reserve-gib", type=float, default=2.0, help="kept back for the CUDA context and allocator slack")
    p.add_argument("--prompts", type=int, default=16, help="--prompts-per-step")
    p.add_argument("--group-size", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--prompt-len", type=int, default=512, help="P: prompt tokens")
    p.add_argument("--completion-len", type=int, default=128, help="C: completion tokens")
    p.add_argument("--micro-batch", type=int, default=16, help="completions per forward/backward")
    p.add_argument("--config", nargs="*", default=[], help="more models: config.json files or model folders")
    args = p.parse_args()
    models = {**MODELS, **{str(c): from_config(c) for c in args.config}}
    budget = (args.gpu_gib - args.reserve_gib) * GIB
    print(f"Stage 1 GRPO, full fine-tuning: {args.prompts} prompts x G {args.group_size} per step, P {args.prompt_len} "
          f"+ C {args.completion_len} tokens, micro-batch {args.micro_batch}; {args.gpu_gib:g} GiB, {args.reserve_gib:g} kept back\n")
    print("| model | params | " + " | ".join(label for label, *_ in STEPS) + " | needs |")
    print("|" + "---|" * (len(STEPS) + 3))
    details = []
    for name, m in models.items():
        peaks = {label: breakdown(m, args, mb or args.micro_batch, *switches) for label, *switches, mb in STEPS}
        cells = [f"{b['peak'] / GIB:.1f}" + ("" if b["peak"] <= budget else " x") for b in peaks.values()]
        needs = next((label for label, b in peaks.items() if b["peak"] <= budget), None)
        details += [(name, needs, peaks[needs])] if needs else []
        verdict = {None: "does not fit: LoRA, 8-bit AdamW or a larger GPU", "all fp32": "fits as it is"}.get(needs, needs)
        print(f"| {name} | {peaks['all fp32']['params'] / 1e6:.0f}M | " + " | ".join(cells) + f" | {verdict} |")
    print("\n(x = over budget.) Breakdown of the first configuration that fits, GiB:")
    for name, label, b in details:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in b.items() if k not in ("peak", "params") and v)
        print(f"  {name} [{label}]: {parts}; peak {b['peak'] / GIB:.1f}")


if __name__ == "__main__":
    main()
