"""bench/gpu_check.py: a short, real stage 1 on one CUDA GPU: GRPO step time, tokens/s, peak memory.

Runs `mascot.py train --stage 1` in this process with --device cuda at a GPU-sized batch (16 prompts x G 8 = 128
completions a GRPO step, micro-batches of 32), --dtype bfloat16 and --autocast-bf16: every phase runs for real, in a few
minutes. Only the GRPO steps are timed (grpo.grpo_step and models.generate wrapped; behaviour unchanged):
    s/step       wall seconds of one grpo_step (the first is warm-up, not counted);
    tokens/s     B x (P + C) tokens through the training forward/backward per second of step;
    generate     the share of the step spent sampling;
    peak memory  torch.cuda.max_memory_allocated() over the GRPO phase.
Needs a CUDA build of torch (requirements.txt says how); without CUDA it prints one line, exits 0.
A benchmark beside the method (bench/README.md lists them all).
    python bench/gpu_check.py [--checkpointing]      # embedded SmolLM2-135M [+ --gradient-checkpointing]
    python bench/gpu_check.py --dry-run              # print the mascot command, checked, and stop
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, not the repository root that holds the
# project's modules: add it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def mascot_argv(args, run: str) -> list[str]:
    """The `mascot.py train --stage 1` command line this check runs."""
    return [
        "train",
        "--stage",
        "1",
        "--model",
        args.model,
        "--device",
        "cuda",
        "--dtype",
        args.dtype,
        "--run",
        run,
        "--max-steps",
        str(args.steps),
        "--prompts-per-step",
        str(args.prompts_per_step),
        "--num-generations",
        str(args.group_size),
        "--micro-batch",
        str(args.micro_batch),
        "--autocast-bf16" if args.autocast else "--no-autocast-bf16",
        "--gradient-checkpointing" if args.checkpointing else "--no-gradient-checkpointing",
        "--states",
        str(2 * args.prompts_per_step),
        "--heldout-states",
        "8",
        "--candidates",
        "4",
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--rm-epochs",
        "1",
        "--save-steps",
        str(args.steps),
        "--dump-every",
        str(args.steps),
    ]


def main() -> None:
    """Parse the flags, check the mascot command, then run stage 1 with the GRPO steps timed."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="smollm2-135m", help="smollm2-135m (embedded) | tiny | a folder"
    )
    p.add_argument(
        "--steps", type=int, default=6, help="GRPO steps (the first is warm-up, not counted)"
    )
    for flag, n in (
        ("--prompts-per-step", 16),
        ("--group-size", 8),
        ("--micro-batch", 32),
        ("--max-new-tokens", 48),
    ):
        p.add_argument(flag, type=int, default=n)
    p.add_argument(
        "--dtype",
        default="bfloat16",
        choices=["auto", "float32", "bfloat16"],
        help="mascot's --dtype",
    )
    p.add_argument(
        "--autocast",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="mascot's --autocast-bf16",
    )
    p.add_argument("--checkpointing", action="store_true", help="mascot's --gradient-checkpointing")
    p.add_argument("--run", default=None, help="run folder (default: a new temporary one)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the mascot command (checked by its parser) and stop",
    )
    args = p.parse_args()
    import torch
    from grpo_step import timed  # bench/grpo_step.py's, here with a GPU sync

    import grpo
    import mascot
    import models

    argv = mascot_argv(args, args.run or "RUN")
    mascot.build_parser().parse_args(argv)  # a wrong flag fails here, not minutes later
    if args.dry_run:
        print("python mascot.py " + " ".join(argv))
        return
    if not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to measure"
        )
        return
    run = args.run or tempfile.mkdtemp(prefix="mascot-gpu-check-")
    argv = mascot_argv(args, run)

    steps = []  # per GRPO step: its seconds, generate's share, tokens, peak memory
    gen_seconds = []  # per generate call; a step counts the calls inside it
    real_step = grpo.grpo_step

    def measured_step(policy, *a, **kw):
        if not steps:
            torch.cuda.reset_peak_memory_stats()  # the peak of the GRPO phase only
        torch.cuda.synchronize()
        n_gen = len(gen_seconds)
        t0 = time.perf_counter()
        stats, gen, rewards = real_step(policy, *a, **kw)
        torch.cuda.synchronize()
        B, P = gen.prompt_ids.shape  # rows, prompt tokens
        C = int(gen.completion_mask.sum(1).max())  # completion tokens
        s = {
            "seconds": time.perf_counter() - t0,
            "gen": sum(gen_seconds[n_gen:]),
            "tokens": B * (P + C),
            "peak": torch.cuda.max_memory_allocated() / 1024**3,
            "reserved": torch.cuda.max_memory_reserved() / 1024**3,
        }
        steps.append(s)
        print(
            f"gpu_check: GRPO step {len(steps)}: B {B}, P {P}, C {C}, {s['seconds']:.2f} s (generate "
            f"{s['gen']:.2f} s), {s['tokens'] / s['seconds']:.0f} tokens/s, {s['peak']:.2f} GiB peak so far",
            flush=True,
        )
        return stats, gen, rewards

    grpo.grpo_step = measured_step
    models.generate = timed(models.generate, gen_seconds, torch.cuda.synchronize)
    print(
        f"gpu_check: {torch.cuda.get_device_name()}; python mascot.py {' '.join(argv)}", flush=True
    )
    t0 = time.time()
    status = mascot.main(argv)
    total = time.time() - t0
    if status or len(steps) < 2:
        sys.exit(
            f"gpu_check: stage 1 exited with status {status} after {len(steps)} GRPO step(s); nothing to measure"
        )
    measured = steps[1:]  # the first step is warm-up
    secs = sum(s["seconds"] for s in measured)
    summary = {
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "dtype": args.dtype,
        "autocast_bf16": args.autocast,
        "gradient_checkpointing": args.checkpointing,
        "grpo_steps_measured": len(measured),
        "s_per_step": secs / len(measured),
        "tokens_per_s": sum(s["tokens"] for s in measured) / secs,
        "generate_fraction": sum(s["gen"] for s in measured) / secs,
        "peak_memory_gib": steps[-1]["peak"],
        "peak_reserved_gib": steps[-1]["reserved"],
        "stage1_seconds": total,
        "run": run,
    }
    print(json.dumps(summary, indent=1))
    print(
        f"gpu_check: {summary['s_per_step']:.2f} s/GRPO step, {summary['tokens_per_s']:.0f} tokens/s, generate "
        f"{summary['generate_fraction']:.0%} of the step, peak memory {summary['peak_memory_gib']:.2f} GiB "
        f"allocated ({summary['peak_reserved_gib']:.2f} reserved); whole stage 1 {total:.0f} s"
    )


if __name__ == "__main__":
    main()
