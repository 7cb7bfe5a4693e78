"""bench/memory_table.py: will full-fine-tuning GRPO of a given model fit on one 24 GB GPU?

Arithmetic only (no model is loaded): parameter counts from each model's published config, then
bytes per item, then the cheapest set of switches that brings the peak under the budget:

    1. plain fp32                          (GRPOConfig defaults)
    2. + bf16 autocast                     (--autocast-bf16: activations and matmuls in bf16)
    3. + gradient checkpointing            (--gradient-checkpointing: keep only layer inputs)
    4. + smaller micro-batch               (--micro-batch 4)
    5. + beta = 0                          (--beta 0: no reference model at all)

What is counted (N = policy parameters, every matrix once, tied embedding included):
    policy weights fp32 4N, gradients fp32 4N, AdamW moments fp32 8N (the "fp32 master" state);
    frozen reference 2N and reward model 2N, both bf16 (the reward model is assumed to be as large
    as the policy, as in stage 1 where it starts from the same base model);
    with autocast, the bf16 copies of the weights that autocast caches during a forward: 2N;
    training activations of one micro-batch of `micro_batch` sequences of P + C tokens, per layer
    and token (elements; 4 bytes in fp32, 2 in bf16 except the fp32 residual stream and norms):
        fp32:      6h + 2kv + 4I elements x 4 bytes  (norm in/out x2, q k v + attention out,
                                                      gate, up, silu(gate), gate*up)
        autocast:  24h + 4kv + 8I bytes              (norms and residual stay fp32, matmuls bf16)
        checkpointing: 4h bytes per layer (the layer input) + one layer's full set, recomputed;
    completion logits kept for backward: micro_batch x C x V x 4 bytes (completion_logprobs only
    scores the C completion positions) plus one 512-row chunk's gradient while backward runs;
    generation (before training, so the peak is the larger of the two phases): the KV cache of all
    B rows, 2 x layers x kv x (P + C) x B x (4 or 2) bytes, and the last position's logits.
Not counted: the CUDA context and allocator slack (we keep 2 GiB of the 24 back for them), the
attention score matrix (SDPA / flash attention never stores it), the reward model's own
activations (no grad, one batch), optimiser temporaries (for-each AdamW briefly holds ~1 more
copy of one parameter group). Treat the numbers as estimates good to about +-20%.

Run from the repo root:
    python bench/memory_table.py                       # the README table
    python bench/memory_table.py --rollouts 32 --prompt-len 1024 --gpu-gib 80
"""

from __future__ import annotations

import argparse

# Published configs (config.json of each hub model). kv = key/value width = kv_heads x head_dim.
MODELS = {
    "SmolLM2-135M": dict(h=576, layers=30, heads=9, kv_heads=3, inter=1536, vocab=49152, qkv_bias=False),
    "SmolLM2-360M": dict(h=960, layers=32, heads=15, kv_heads=5, inter=2560, vocab=49152, qkv_bias=False),
    "Qwen2.5-0.5B": dict(h=896, layers=24, heads=14, kv_heads=2, inter=4864, vocab=151936, qkv_bias=True),
    "Qwen2.5-1.5B": dict(h=1536, layers=28, heads=12, kv_heads=2, inter=8960, vocab=151936, qkv_bias=True),
}
GIB = 1024**3
STEPS = [  # (label, autocast, checkpointing, micro-batch override, beta > 0)
    ("fp32", False, False, None, True),
    ("+ bf16 autocast", True, False, None, True),
    ("+ grad. checkpointing", True, True, None, True),
    ("+ micro-batch 4", True, True, 4, True),
    ("+ beta 0 (no reference)", True, True, 4, False),
]


def kv_width(m: dict) -> int:
    return m["kv_heads"] * (m["h"] // m["heads"])


def n_params(m: dict) -> int:
    """Parameters of a Llama/Qwen2-style decoder with tied input/output embeddings."""
    h, kv, inter = m["h"], kv_width(m), m["inter"]
    attn = 2 * h * h + 2 * h * kv + ((h + 2 * kv) if m["qkv_bias"] else 0)   # q, o + k, v (+ biases)
    layer = attn + 3 * h * inter + 2 * h                                     # + SwiGLU MLP + 2 norms
    return m["vocab"] * h + m["layers"] * layer + h                          # + embedding, final norm


def breakdown(m: dict, rollouts: int, P: int, C: int, micro_batch: int, autocast: bool,
              checkpointing: bool, beta: bool) -> dict:
    """Bytes of each item; 'peak' = static state + the larger of the generation and training phases."""
    N, h, kv, inter, L, V = n_params(m), m["h"], kv_width(m), m["inter"], m["layers"], m["vocab"]
    tokens = micro_batch * (P + C)
    per_layer_token = (24 * h + 4 * kv + 8 * inter) if autocast else 4 * (6 * h + 2 * kv + 4 * inter)
    if checkpointing:
        activations = tokens * (L * 4 * h + per_layer_token)
    else:
        activations = tokens * L * per_layer_token
    logits = micro_batch * C * V * 4 + 512 * V * 4
    act_bytes = 2 if autocast else 4
    generation = 2 * L * kv * (P + C) * rollouts * act_bytes + rollouts * V * 4
    items = {
        "weights+grads+AdamW": 16 * N,
        "reference (bf16)": 2 * N if beta else 0,
        "reward model (bf16)": 2 * N,
        "autocast weight copies": 2 * N if autocast else 0,
        "activations": activations,
        "logits": logits,
        "generation KV": generation,
    }
    static = sum(v for k, v in items.items() if k not in ("activations", "logits", "generation KV"))
    items["peak"] = static + max(activations + logits, generation)
    items["params"] = N
    return items


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpu-gib", type=float, default=24.0, help="GPU memory in GiB")
    p.add_argument("--reserve-gib", type=float, default=2.0, help="kept back for CUDA context and allocator slack")
    p.add_argument("--rollouts", type=int, default=64, help="completions sampled per step (prompts x G)")
    p.add_argument("--prompt-len", type=int, default=512, help="P: prompt tokens")
    p.add_argument("--completion-len", type=int, default=128, help="C: completion tokens")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward")
    args = p.parse_args()
    budget = (args.gpu_gib - args.reserve_gib) * GIB
    print(f"Full fine-tuning, {args.rollouts} rollouts/step of P = {args.prompt_len} + C = "
          f"{args.completion_len} tokens, micro-batch {args.micro_batch}; budget {args.gpu_gib:g} GiB "
          f"- {args.reserve_gib:g} reserve. Peak GiB after each switch (cumulative):\n")
    head = "| model | params | " + " | ".join(label for label, *_ in STEPS) + " | needs |"
    print(head)
    print("|" + "---|" * (len(STEPS) + 3))
    details = []
    for name, m in MODELS.items():
        cells, needs = [], None
        for label, autocast, ckpt, mb, beta in STEPS:
            b = breakdown(m, args.rollouts, args.prompt_len, args.completion_len, mb or args.micro_batch,
                          autocast, ckpt, beta)
            fits = b["peak"] <= budget
            cells.append(f"{b['peak'] / GIB:.1f}" + ("" if fits else " x"))
            if fits and needs is None:
                needs = label
                details.append((name, label, b))
        print(f"| {name} | {b['params'] / 1e6:.0f}M | " + " | ".join(cells) + " | "
              + (needs if needs else "does not fit: LoRA, 8-bit AdamW or a larger GPU") + " |")
    print("\n(x = over budget.) Breakdown of the first configuration that fits, GiB:")
    for name, label, b in details:
        parts = ", ".join(f"{k} {v / GIB:.2f}" for k, v in b.items() if k not in ("peak", "params") and v)
        print(f"  {name} [{label}]: {parts}; peak {b['peak'] / GIB:.1f}")
    # sampler.generate runs its pre-fill forward without logits_to_keep, so it materialises logits
    # for every prompt position, not only the last one it samples from. Not in the table above.
    print("\nNot in the table: sampler.generate's pre-fill currently computes logits for all P prompt "
          "positions (rollouts x P x V, bf16 under autocast):")
    for name, m in MODELS.items():
        extra = args.rollouts * args.prompt_len * m["vocab"] * 2
        print(f"  {name}: +{extra / GIB:.1f} GiB during generation; passing logits_to_keep=1 removes it")


if __name__ == "__main__":
    main()
