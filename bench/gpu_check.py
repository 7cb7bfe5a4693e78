"""bench/gpu_check.py: a short, real stage 1 on one CUDA GPU: GRPO step time, tokens/s, peak memory.

Runs `mascot.py train --stage 1` in this process with --device cuda at a GPU-sized batch (16 prompts x G 8 = 128
completions a GRPO step, micro-batches of 32), --dtype bfloat16 and --autocast-bf16: every phase runs for real, in a few
minutes. Only the GRPO steps are timed (grpo.grpo_step and models.generate wrapped; behaviour unchanged):
    s/step       wall seconds of one grpo_step (the first is warm-up, not counted);
    tokens/s     B x (P + C) tokens through the training forward/backward per second of step;
    generate     the share of the step spent sampling;
    peak memory  torch.cuda.max_memory_allocated() and max_memory_reserved() from the start of the process,
                 never reset: the reward model's training, the candidates and the held-out checks count too;
                 the peak before the first GRPO step is printed beside it (the reward model's training and
                 the held-out check before GRPO).
--model picks the model (default: the embedded SmolLM2-135M); above ~0.5B parameters (counted from its config on
the meta device, no weights loaded) the check adds --gradient-checkpointing and says so (--checkpointing /
--no-checkpointing decide instead). --offload-optimizer is passed on to mascot (plumbing/offload.py). The exact
mascot command is printed before it runs. Estimates to compare with: docs/PERFORMANCE.md, "Memory for the paper's
sizes (Qwen3)".
Needs a CUDA build of torch (requirements.txt says how); without CUDA it prints one line, exits 0.
A benchmark beside the method (bench/README.md lists them all).
    python bench/gpu_check.py [--model Qwen/Qwen3-0.6B] [--offload-optimizer] [--micro-batch 8]
    python bench/gpu_check.py --dry-run              # print the mascot command, checked, and stop
"""

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, not the repository root that holds the
# project's modules: add it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Above this many parameters the check turns on --gradient-checkpointing (docs/PERFORMANCE.md: at
# 0.6B and more the activations of a micro-batch are GiBs that checkpointing cuts to a few hundred MiB).
CHECKPOINTING_ABOVE = 0.5e9


def mascot_argv(args, run: str) -> list[str]:
    """The `mascot.py train --stage 1` command line this check runs."""
    argv = [
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
    if args.offload_optimizer:
        argv.append("--offload-optimizer")
    return argv


def count_parameters(name: str) -> int | None:
    """The parameters of --model, each shared (tied) tensor once, from its config on the meta device
    (no weights read, no memory taken); None when the config cannot be read here."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from plumbing import loading

    try:
        if name == loading.TINY:
            model = loading.load_model(name)[0]  # 2 layers, built in a moment
        else:
            source = loading.embedded_model_folder() if name == loading.EMBEDDED else name
            offline = not Path(source).exists() and not loading.hub_answers()
            config = AutoConfig.from_pretrained(source, local_files_only=offline)
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"gpu_check: cannot read the config of {name} ({first}); parameters unknown")
        return None
    return sum(p.numel() for p in model.parameters())


def choose_checkpointing(args) -> None:
    """Set args.checkpointing where the flags left it open (None): on above CHECKPOINTING_ABOVE
    parameters, and say which way it went and why."""
    n = count_parameters(args.model)
    args.parameters = n
    size = "unknown" if n is None else f"{n:,}"
    if args.checkpointing is not None:
        how = "on" if args.checkpointing else "off"
        print(
            f"gpu_check: {args.model}: {size} parameters; --gradient-checkpointing {how} (as asked)"
        )
        return
    args.checkpointing = n is not None and n > CHECKPOINTING_ABOVE
    if args.checkpointing:
        print(
            f"gpu_check: {args.model}: {size} parameters, above {CHECKPOINTING_ABOVE / 1e9:.1f}B: "
            "--gradient-checkpointing turned on automatically (--no-checkpointing keeps it off)"
        )
    else:
        print(
            f"gpu_check: {args.model}: {size} parameters; --gradient-checkpointing off (on "
            f"automatically above {CHECKPOINTING_ABOVE / 1e9:.1f}B; --checkpointing turns it on)"
        )


def parse_args() -> argparse.Namespace:
    """The check's flags; --help needs neither a GPU nor a model."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (embedded) | tiny | a folder | a hub id (Qwen/Qwen3-0.6B)",
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
    p.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="mascot's --gradient-checkpointing (default: on above ~0.5B parameters)",
    )
    p.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="mascot's --offload-optimizer: bf16 policy on the GPU, fp32 masters and AdamW in CPU memory",
    )
    p.add_argument("--run", default=None, help="run folder (default: a new temporary one)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the mascot command (checked by its parser) and stop",
    )
    return p.parse_args()


def main() -> None:
    """Parse the flags, check the mascot command, then run stage 1 with the GRPO steps timed."""
    args = parse_args()
    import torch
    from grpo_step import timed  # bench/grpo_step.py's, here with a GPU sync

    import grpo
    import mascot
    import models

    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to measure"
        )
        return
    choose_checkpointing(args)
    argv = mascot_argv(args, args.run or "RUN")
    mascot.build_parser().parse_args(argv)  # a wrong flag fails here, not minutes later
    if args.dry_run:
        print("python mascot.py " + shlex.join(argv))
        return
    run = args.run or tempfile.mkdtemp(prefix="mascot-gpu-check-")
    argv = mascot_argv(args, run)
    command = "python mascot.py " + shlex.join(argv)

    steps = []  # per GRPO step: its seconds, generate's share, tokens, peak memory
    gen_seconds = []  # per generate call; a step counts the calls inside it
    before_grpo = {}  # the peaks when the first GRPO step starts (no reset: they include every earlier phase)
    real_step = grpo.grpo_step

    def measured_step(policy, *a, **kw):
        torch.cuda.synchronize()
        if not steps:
            before_grpo["peak"] = torch.cuda.max_memory_allocated() / 1024**3
            before_grpo["reserved"] = torch.cuda.max_memory_reserved() / 1024**3
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
            f"{s['gen']:.2f} s), {s['tokens'] / s['seconds']:.0f} tokens/s, {s['peak']:.2f} GiB peak "
            "since the process started",
            flush=True,
        )
        return stats, gen, rewards

    grpo.grpo_step = measured_step
    models.generate = timed(models.generate, gen_seconds, torch.cuda.synchronize)
    print(f"gpu_check: {torch.cuda.get_device_name()}", flush=True)
    print(f"gpu_check: running {command}", flush=True)
    t0 = time.time()
    status = mascot.main(argv)
    total = time.time() - t0
    if status or len(steps) < 2:
        sys.exit(
            f"gpu_check: stage 1 exited with status {status} after {len(steps)} GRPO step(s); nothing to measure"
        )
    report(args, steps, before_grpo, total, run, command)


def report(args, steps: list, before_grpo: dict, total: float, run: str, command: str) -> None:
    """The summary: JSON, then one line. Peaks are the whole process's (after stage 1 has ended,
    so the held-out check after GRPO counts too)."""
    import torch

    measured = steps[1:]  # the first step is warm-up
    secs = sum(s["seconds"] for s in measured)
    summary = {
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "parameters": args.parameters,
        "dtype": args.dtype,
        "autocast_bf16": args.autocast,
        "gradient_checkpointing": args.checkpointing,
        "offload_optimizer": args.offload_optimizer,
        "micro_batch": args.micro_batch,
        "grpo_steps_measured": len(measured),
        "s_per_step": secs / len(measured),
        "tokens_per_s": sum(s["tokens"] for s in measured) / secs,
        "generate_fraction": sum(s["gen"] for s in measured) / secs,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 1024**3,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 1024**3,
        "peak_before_grpo_gib": before_grpo["peak"],
        "peak_reserved_before_grpo_gib": before_grpo["reserved"],
        "stage1_seconds": total,
        "run": run,
        "command": command,
    }
    print(json.dumps(summary, indent=1))
    print(
        f"gpu_check: {summary['s_per_step']:.2f} s/GRPO step, {summary['tokens_per_s']:.0f} tokens/s, generate "
        f"{summary['generate_fraction']:.0%} of the step; peak memory since the process started "
        f"{summary['peak_memory_gib']:.2f} GiB allocated ({summary['peak_reserved_gib']:.2f} reserved), "
        f"before the first GRPO step {summary['peak_before_grpo_gib']:.2f} GiB; whole stage 1 {total:.0f} s"
    )
    print(f"gpu_check: the command was: {command}")


if __name__ == "__main__":
    main()
