"""bench/grpo_step.py: one GRPO step of ours (grpo.grpo_step) against TRL's GRPOTrainer, on the CPU.

Both sides do the same work per step, each in its own process: the same model folder, tokenizer and chat template, no
gradient checkpointing; the same prompts_per_step prompts of exactly P tokens after the chat template, G completions
each, sampled in one batch at temperature 1, top-p 1, top-k off; every completion exactly C tokens (min_new_tokens = C,
stops masked until C as in HF), checked every step; the same reward (low_half_share: cheap, deterministic, different
within a group); the same beta, so both run a frozen reference; loss "grpo", eps 0.2 / 0.28, one pass and one
forward/backward of all B rows per batch, fused AdamW (weight decay 0) at a constant learning rate, gradient clipping at
1.0; TRL's defaults that would change the work are overridden (run_trl). Ours runs with mascot's train defaults: policy,
gradients and AdamW fp32; the reference and the sampling copy (models.SamplingCopy, refreshed inside every timed step)
in --dtype (`auto`: bf16 where the CPU has it natively, else fp32; `float32` gives ours exactly TRL's fp32 arithmetic).
Measured per side: seconds per step (between step ends, warm-up dropped); the CPU seconds over the same interval
(steadier on a shared machine: they do not grow while the process waits for a core, hence one thread a side by
default); tokens/s (B x (P + C) trained); the share inside `generate`; peak RSS (ru_maxrss). Sides alternate A B B A.
    make bench                  # builds .venv-bench (TRL) on first use, then runs this file with it
    python bench/grpo_step.py --models tiny --rounds 2 --steps 1     # a quick check
The file is also the worker (`--worker ours|trl`: one side, the job as JSON on stdin, one JSON line out); its top
imports only the standard library, so it runs in either virtual env. A benchmark beside the method (bench/README.md).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root
WORDS = (
    "today I feel tired and proud of my small garden but work was hard again so "
    "please help me plan the week with calm words"
).split()


def build_prompts(tokenizer, n: int, n_tokens: int) -> list[list[dict]]:
    """n different chat prompts of exactly `n_tokens` tokens: a system line and a user message grown word by word."""

    def length(conv):
        return len(
            tokenizer.apply_chat_template(
                conv, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )

    prompts = []
    empty = [{"role": "system", "content": ""}, {"role": "user", "content": ""}]
    for i in range(n):
        conv = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": ""}]
        conv = conv if length(conv) <= n_tokens else empty
        for j in range(4 * len(WORDS)):
            if length(conv) == n_tokens:
                break
            text = f"{conv[1]['content']} {WORDS[(i * 7 + j) % len(WORDS)]}".lstrip()
            if length(candidate := [conv[0], {"role": "user", "content": text}]) <= n_tokens:
                conv = candidate
        if length(conv) != n_tokens:
            sys.exit(
                f"--prompt-tokens {n_tokens}: no prompt of exactly that length (the chat template alone "
                f"takes {length(empty)} tokens)"
            )
        prompts.append(conv)
    return prompts


def low_half_share(ids: list[int], vocab_size: int) -> float:
    """The reward: share of completion tokens whose id is in the lower half of the vocabulary."""
    return sum(1 for t in ids if t < vocab_size // 2) / max(len(ids), 1)


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()  # wall, CPU seconds of this process


def timed(fn, seconds: list, sync=lambda: None):
    """Wrap fn so that each call's wall time goes to `seconds`; sync (on a GPU) waits for queued work."""

    def wrapper(*a, **kw):
        sync()
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        sync()
        seconds.append(time.perf_counter() - t0)
        return out

    return wrapper


def project_modules() -> None:
    """Put the repository root on sys.path (run as a script, Python puts bench/ there instead). Only
    the parent and our side call it: the TRL worker imports none of the project's modules, and the
    root's own modules (evaluate.py, ...) could shadow packages of its virtual env."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def peak_rss_mib() -> float:
    """This process's peak resident memory so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: ru_maxrss in KiB


def run_ours(job: dict) -> dict:
    """Our side: grpo.grpo_step with mascot's train defaults, every step timed."""
    project_modules()
    import torch

    import grpo
    import models
    from plumbing import devices, loading

    bf16 = job["dtype"] == "bfloat16" or (job["dtype"] == "auto" and devices.native_bf16("cpu"))
    policy, tok = loading.load_model(job["folder"])
    ref = None  # the frozen reference: only with a KL term
    if job["beta"] > 0:
        ref_dtype = torch.bfloat16 if bf16 else torch.float32
        ref = loading.load_model(job["folder"], dtype=ref_dtype, frozen=True)[0]
    sampling = models.SamplingCopy(policy) if bf16 else None  # what train_grpo builds for it
    B = job["prompts_per_step"] * job["group_size"]  # rows a step
    C = job["completion_tokens"]
    cfg = grpo.GRPOConfig(
        seed=0,
        max_new_tokens=C,
        prompts_per_step=job["prompts_per_step"],
        num_generations=job["group_size"],
        learning_rate=job["lr"],
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=job["beta"],
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="grpo",
        scale_rewards="group",
        num_iterations=1,
        micro_batch=B,
        temperature=1.0,
        top_p=1.0,
        sample_bf16=bf16,
    )
    optimizer = models.adamw(policy, cfg.learning_rate, cfg.weight_decay)  # train_grpo's

    # grpo_step calls models.generate: time it, and fix the length as TRL's min_new_tokens does.
    gen_seconds, plain_generate = [], models.generate
    models.generate = timed(
        lambda *a, **kw: plain_generate(*a, options=models.DecodeOptions(min_new_tokens=C), **kw),
        gen_seconds,
    )

    def reward_fn(meta, texts, gen):
        ids = [
            gen.completion_ids[r][gen.completion_mask[r].bool()].tolist() for r in range(len(texts))
        ]
        rewards = [low_half_share(x, len(tok)) for x in ids]
        return rewards, {"low_half": rewards}

    prompts = job["prompts"]
    n = job["prompts_per_step"]
    ends = [clock()]  # the clocks at the start and at every step's end
    for step in range(1, job["warmup"] + job["steps"] + 1):
        batch = [prompts[((step - 1) * n + i) % len(prompts)] for i in range(n)]
        learner = grpo.Learner(policy, tok, optimizer, ref, sampling=sampling)
        _, gen, _ = grpo.grpo_step(learner, grpo.Task(None, reward_fn), batch, batch, cfg, step)
        ends.append(clock())
        if (
            gen.prompt_ids.shape != (B, job["prompt_tokens"])
            or not bool(gen.prompt_mask.all())
            or int(gen.completion_mask.sum()) != B * C
        ):
            raise SystemExit(
                f"ours: step {step} did not have {B} rows of exactly {job['prompt_tokens']} + {C} tokens"
            )
    return {
        "step_ends": ends,
        "gen_seconds": gen_seconds,
        "peak_rss_mib": peak_rss_mib(),
        "params": sum(p.numel() for p in policy.parameters()),
        "bf16": bf16,
    }


def run_trl(job: dict) -> dict:
    """TRL's side: GRPOTrainer set to do the same work per step, every step timed."""
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(job["folder"])
    B = job["prompts_per_step"] * job["group_size"]  # rows a step
    C = job["completion_tokens"]
    checks = []  # per step: were there B completions of exactly C tokens?
    gen_seconds = []
    ends = []  # (wall, CPU) clock at the start and at every step's end

    def reward_fn(prompts, completions, completion_ids, **kw):
        checks.append(all(len(x) == C for x in completion_ids) and len(completion_ids) == B)
        return [low_half_share(x, len(tok)) for x in completion_ids]

    class StepClock(TrainerCallback):  # the step ends, as ours records them
        def on_train_begin(self, args, state, control, **kw):
            ends.append(clock())

        on_step_end = on_train_begin

    steps = job["warmup"] + job["steps"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            seed=0,
            max_steps=steps,
            per_device_train_batch_size=B,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_generations=job["group_size"],
            max_completion_length=C,
            generation_kwargs={"min_new_tokens": C},
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=job["beta"],
            num_iterations=1,
            loss_type="grpo",
            epsilon=0.2,
            epsilon_high=0.28,
            scale_rewards="group",
            learning_rate=job["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch_fused",
            bf16=False,
            fp16=False,
            gradient_checkpointing=False,
            use_vllm=False,
            model_init_kwargs={"dtype": "float32"},
            shuffle_dataset=False,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            log_completions=False,
            disable_tqdm=True,
            dataloader_num_workers=0,
            dataloader_pin_memory=False,
        )
        prompts = [
            job["prompts"][i % len(job["prompts"])] for i in range(steps * job["prompts_per_step"])
        ]
        trainer = GRPOTrainer(
            model=job["folder"],
            reward_funcs=reward_fn,
            args=args,
            train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
            processing_class=tok,
            callbacks=[StepClock()],
        )
        # TRL samples through model.generate: time it.
        trainer.model.generate = timed(trainer.model.generate, gen_seconds)
        trainer.train()
    if not (checks and all(checks)):
        raise SystemExit(f"trl: some step did not have {B} completions of exactly {C} tokens")
    return {
        "step_ends": ends,
        "gen_seconds": gen_seconds,
        "peak_rss_mib": peak_rss_mib(),
        "params": sum(p.numel() for p in trainer.model.parameters()),
    }


def model_folder(name: str) -> Path:
    """A plain safetensors folder both sides can load (TRL needs a folder or a hub id)."""
    project_modules()
    from plumbing import loading

    if name == loading.EMBEDDED:
        return loading.embedded_model_folder()
    if name == loading.TINY:
        folder = loading.embedded_model_folder().parent / "bench-tiny"
        if not (folder / "config.json").exists():
            for part in loading.load_model(loading.TINY):  # the model and its tokenizer
                part.save_pretrained(folder)
        return folder
    return Path(name)


def run_worker(python: str, side: str, job: dict, env: dict) -> dict:
    """One run of one side in its own process (this file with --worker); its result line."""
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), "--worker", side],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise SystemExit(f"the {side} worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT ") :])


def summarise(runs: list[dict], job: dict) -> dict:
    """One side: the measured steps (warm-up dropped) pooled over its runs, and per-run medians."""
    w = job["warmup"]
    # Per run, the measured steps as (start, end) of the (wall, CPU) clocks.
    steps = [list(zip(r["step_ends"][:-1], r["step_ends"][1:]))[w:] for r in runs]
    walls = []  # wall seconds of every measured step, pooled over the runs
    cpus = []
    gens = []
    for run, r in zip(steps, runs):
        walls += [end[0] - start[0] for start, end in run]
        cpus += [end[1] - start[1] for start, end in run]
        gens += r["gen_seconds"][w:]
    per_run = [statistics.median([end[0] - start[0] for start, end in run]) for run in steps]
    step = statistics.median(walls)
    tokens = (
        job["prompts_per_step"]
        * job["group_size"]
        * (job["prompt_tokens"] + job["completion_tokens"])
    )
    return {
        "s_per_step": step,
        "s_min": min(walls),
        "s_max": max(walls),
        "run_medians": per_run,
        "cpu_s_per_step": statistics.median(cpus),
        "gen_fraction": sum(gens) / sum(walls),
        "tokens_per_s": tokens / step,
        "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
        "n_steps": len(walls),
        "params": runs[0]["params"],
    }


def main() -> None:
    """Every model: both sides, alternating, then their summaries; the results as JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--models",
        nargs="+",
        default=["smollm2-135m"],
        help="smollm2-135m (embedded) | tiny | a folder",
    )
    p.add_argument("--prompt-tokens", type=int, default=16, help="P: tokens per prompt (exact)")
    p.add_argument(
        "--completion-tokens", type=int, default=32, help="C: tokens per completion (exact)"
    )
    p.add_argument("--group-size", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step")
    p.add_argument(
        "--beta", type=float, default=0.02, help="KL weight, both sides (> 0: both run a reference)"
    )
    p.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate, both sides")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="ours: mascot's --dtype for the reference and the sampling copy (TRL stays fp32)",
    )
    p.add_argument("--warmup", type=int, default=1, help="steps per run not measured")
    p.add_argument("--steps", type=int, default=2, help="measured steps per run")
    p.add_argument("--rounds", type=int, default=4, help="runs per side, alternating A B B A ...")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads a worker (1: steadiest when busy; 0: default)",
    )
    p.add_argument(
        "--trl-python",
        default=str(ROOT / ".venv-bench/bin/python"),
        help="a python with TRL (make bench)",
    )
    p.add_argument(
        "--out", default=str(ROOT / "runs" / "bench" / "grpo_step.json"), help="results JSON"
    )
    p.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:  # one side: the parent's job as JSON on stdin
        job = json.load(sys.stdin)
        if job["threads"]:
            import torch

            torch.set_num_threads(job["threads"])
        print("RESULT " + json.dumps(run_trl(job) if args.worker == "trl" else run_ours(job)))
        return
    if not Path(args.trl_python).exists():
        sys.exit(
            f"--trl-python {args.trl_python}: not found; run `make bench` (it creates .venv-bench with TRL)"
        )
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
    )
    print(
        f"P = {args.prompt_tokens}, C = {args.completion_tokens}, G = {args.group_size}, "
        f"{args.prompts_per_step} prompts/step, beta = {args.beta}, {args.threads or 'default'} thread(s) a side, "
        f"{args.warmup} warm-up + {args.steps} measured steps per run, {args.rounds} runs per side (A B B A ...)"
    )
    results = {"args": vars(args), "models": {}}
    for name in args.models:
        runs, job = alternate_runs(name, args, env)
        ours = summarise(runs["ours"], job)
        trl = summarise(runs["trl"], job)
        results["models"][name] = {"ours": ours, "trl": trl, "runs": runs}
        print_comparison(name, ours, trl, runs["ours"][0]["bf16"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")


def alternate_runs(name: str, args, env: dict) -> tuple[dict, dict]:
    """({"ours": [result per run], "trl": [...]}, the job) of one model, the sides alternating A B B A."""
    from transformers import AutoTokenizer

    folder = model_folder(name)
    prompts = build_prompts(
        AutoTokenizer.from_pretrained(folder),
        args.prompts_per_step * (args.warmup + args.steps),
        args.prompt_tokens,
    )
    job = {**vars(args), "folder": str(folder), "prompts": prompts}
    runs = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for side in ("ours", "trl") if r % 2 == 0 else ("trl", "ours"):
            t0 = time.time()
            python = args.trl_python if side == "trl" else sys.executable
            res = run_worker(python, side, job, env)
            runs[side].append(res)
            ends = res["step_ends"]
            print(
                f"  [{name}] run {r + 1} {side:4s}: step wall/CPU s "
                + " ".join(
                    f"{b[0] - a[0]:.1f}/{b[1] - a[1]:.1f}" for a, b in zip(ends[:-1], ends[1:])
                )
                + f", peak RSS {res['peak_rss_mib']:.0f} MiB ({time.time() - t0:.0f} s with load)",
                flush=True,
            )
    return runs, job


def print_comparison(name: str, ours: dict, trl: dict, ours_bf16: bool) -> None:
    """The two sides' summaries side by side, then ours against TRL."""
    print(
        f"\n{name} ({ours['params'] / 1e6:.1f}M parameters; ours: reference and sampling in "
        f"{'bf16' if ours_bf16 else 'fp32'})"
    )
    print(
        f"  {'':5s} {'s/step':>8s} {'min..max':>13s} {'CPU s/step':>10s} {'tokens/s':>9s} "
        f"{'generate':>8s} {'peak RSS':>9s}"
    )
    for label, s in (("ours", ours), ("TRL", trl)):
        print(
            f"  {label:5s} {s['s_per_step']:8.2f} {s['s_min']:6.2f}..{s['s_max']:<6.2f} "
            f"{s['cpu_s_per_step']:10.2f} {s['tokens_per_s']:9.1f} {s['gen_fraction']:8.0%} "
            f"{s['peak_rss_mib']:5.0f} MiB"
        )
    print(
        f"  ours vs TRL: step speed {trl['s_per_step'] / ours['s_per_step']:.2f}x wall, "
        f"{trl['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f}x CPU time, peak memory "
        f"{ours['peak_rss_mib'] / trl['peak_rss_mib']:.2f}x; {ours['n_steps']} + {trl['n_steps']} measured "
        f"steps; run medians ours {' '.join(f'{x:.2f}' for x in ours['run_medians'])}, "
        f"TRL {' '.join(f'{x:.2f}' for x in trl['run_medians'])}\n",
        flush=True,
    )


if __name__ == "__main__":
    main()
