"""bench/grpo_step.py: one GRPO step of ours (grpo.grpo_step) against TRL's GRPOTrainer.

Both sides do the same work per step, each in its own process:
  - the same model folder, tokenizer and chat template, fp32, no gradient checkpointing;
  - the same prompts, each exactly P tokens after the chat template (checked), prompts_per_step
    of them, G completions each, all sampled in one batch at temperature 1, top-p 1, top-k off;
  - completions of exactly C tokens: min_new_tokens = max_new_tokens = C on both sides (ours:
    sampler.generate(min_new_tokens=C), which forbids the stop tokens as HF's
    MinNewTokensLogitsProcessor does), checked after every step;
  - the same reward (share of completion token ids in the lower half of the vocabulary: cheap,
    deterministic, different within a group), the same beta (so both run a frozen fp32
    reference; ours has its Linears packed, as every frozen model of `mascot.py` has), loss
    "grpo", eps 0.2 / 0.28, num_iterations 1, one forward/backward of all B rows (ours runs each
    group's shared prompt once in it, grpo.completion_hidden), AdamW (non-fused, weight decay 0),
    the same constant learning rate, gradient clipping at 1.0.
TRL's defaults that would change the work are overridden: bf16 off, gradient checkpointing off,
fused AdamW off, no vLLM, no logging/saving/evaluation, no shuffling, a constant LR schedule.

Measured per side: seconds per step (wall time between the ends of consecutive steps, so nothing
is left out; warm-up steps dropped), the CPU seconds the process used in the same interval (the
steadier number on a shared machine: it does not grow while the process waits for a core; hence
one thread per side by default, so that no thread burns CPU spinning while it waits for
another), tokens per second (B x (P + C) tokens per step, the tokens that go through the
training forward/backward), the share of the step spent inside `generate`, and the peak
resident memory of the process (ru_maxrss: model load included, the same for both sides).
The sides run alternately A B B A A B B A (--rounds 4) so that a change in load hits both.
Ours samples with sampler.generate's defaults (sampler "ours": one prefill per distinct prompt).
`--copies packed bf16` adds sides "ours-packed" / "ours-bf16" that sample from a
sampler.SamplingCopy of the policy (GRPOConfig.sampling_copy; refreshed every step, inside the
timed step) while the loss stays fp32: fp32 with oneDNN-packed weights, or bf16 (bf16 is not the
same arithmetic as TRL's fp32 sampling). Each is reported on its own line.

MFU (model-FLOPs utilisation) against the machine's measured matmul peak (bench/matmul_peak.py):
  training pass  = 6 N B (P + C)  FLOPs (forward 2 + backward 4 per parameter per token; N counts
                   every parameter once, tied embedding included), + 2 N B (P + C) for the
                   reference forward when beta > 0, over the step time minus generation time
                   (which also holds the reward and the optimiser step, so the MFU is a floor);
  generation     = 2 N B C FLOPs over the time inside `generate` (prompt pre-fill not counted).
N B (P + C) ignores attention's own FLOPs (small at these lengths) and the LM head positions that
a side skips (ours scores only the C completion positions; TRL on CPU scores all P + C - 1).

Run from the repo root (TRL lives in its own virtual env; the project never imports it):
    make bench                                        # creates .venv-bench on first use
    python bench/grpo_step.py --trl-python .venv-bench/bin/python
    python bench/grpo_step.py --models tiny --rounds 2               # quicker
    python bench/grpo_step.py --threads 0                            # torch's default threads
    python bench/grpo_step.py --models smollm2-135m --copies packed   # + ours sampling from a copy
The file is also the worker: `--worker ours|ours-bf16|trl` runs one side and prints a JSON line. The
top of the file imports only the standard library, so it runs in either virtual env.
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parents[1]
# Prompts are grown from these words until the chat template gives exactly P tokens (checked).
WORDS = ("today I feel tired and proud of my small garden but work was hard again so "
         "please help me plan the week with calm words").split()


# ----------------------------------------------------------------------------------------------
# What both sides share: the prompts and the reward
# ----------------------------------------------------------------------------------------------

def build_prompts(tokenizer, n: int, n_tokens: int) -> list[list[dict]]:
    """n different chat prompts that are each exactly `n_tokens` tokens after the chat template.

    A system line plus a user message grown word by word (words that overshoot are skipped).
    Raises SystemExit if the template alone is longer than `n_tokens`.
    """
    def length(conv):
        return len(tokenizer.apply_chat_template(conv, add_generation_prompt=True, tokenize=True,
                                                 return_dict=True)["input_ids"])

    prompts = []
    for i in range(n):
        words, j = [], 0
        conv = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": ""}]
        if length(conv) > n_tokens:
            conv = [{"role": "system", "content": ""}, {"role": "user", "content": ""}]
        if length(conv) > n_tokens:
            sys.exit(f"--prompt-tokens {n_tokens}: the chat template alone takes {length(conv)} tokens; "
                     "pass a larger value")
        while length(conv) < n_tokens and j < 4 * len(WORDS):
            trial = words + [WORDS[(i * 7 + j) % len(WORDS)]]
            j += 1
            candidate = [conv[0], {"role": "user", "content": " ".join(trial)}]
            if length(candidate) <= n_tokens:
                words, conv = trial, candidate
        if length(conv) != n_tokens:
            sys.exit(f"--prompt-tokens {n_tokens}: could not build a prompt of exactly that length")
        prompts.append(conv)
    return prompts


def low_half_share(ids: list[int], vocab_size: int) -> float:
    """The reward: share of completion tokens whose id is in the lower half of the vocabulary."""
    return sum(1 for t in ids if t < vocab_size // 2) / max(len(ids), 1)


def clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process, all threads). On a shared machine the CPU
    time is the steadier measure of work: it does not grow while the process waits for a core."""
    return time.perf_counter(), time.process_time()


def timed(fn, seconds: list):
    """Wrap a generate function so each call's wall time is appended to `seconds`."""
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        seconds.append(time.perf_counter() - t0)
        return out
    return wrapper


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ----------------------------------------------------------------------------------------------
# Worker: ours
# ----------------------------------------------------------------------------------------------

def run_ours(job: dict, sampling_copy: str = "none") -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    import grpo
    import models
    import sampler

    policy, tok = models.load_model(job["folder"])
    # The reference is frozen, as in `mascot.py train` (packed Linears on a CPU).
    ref = models.load_model(job["folder"], frozen=True)[0] if job["beta"] > 0 else None
    B = job["prompts_per_step"] * job["group_size"]
    cfg = grpo.GRPOConfig(
        prompts_per_step=job["prompts_per_step"], group_size=job["group_size"], lr=job["lr"],
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=job["beta"], eps_low=0.2,
        eps_high=0.28, loss_type="grpo", scale_rewards=True, num_iterations=1, micro_batch=B,
        max_new_tokens=job["completion_tokens"], temperature=1.0, top_p=1.0, seed=0,
        sampling_copy=sampling_copy)
    # The copy train_grpo would make for this setting (refreshed inside every grpo_step).
    sampling = None if sampling_copy == "none" else sampler.SamplingCopy(
        policy, {"packed": torch.float32, "bf16": torch.bfloat16}[sampling_copy])
    # The optimiser train_grpo builds: plain torch AdamW (on CPU: the for-loop, non-fused kernel).
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    gen_seconds = []
    # grpo_step calls sampler.generate: time it, and fix the length as TRL's min_new_tokens does.
    plain_generate = sampler.generate

    def exact_length_generate(*a, **kw):
        return plain_generate(*a, min_new_tokens=job["completion_tokens"], **kw)
    sampler.generate = timed(exact_length_generate, gen_seconds)

    def reward_fn(meta, texts, gen):
        ids = [gen.completion_ids[r][gen.completion_mask[r].bool()].tolist() for r in range(len(texts))]
        rewards = [low_half_share(x, len(tok)) for x in ids]
        return rewards, {"low_half": rewards}

    prompts, n = job["prompts"], job["prompts_per_step"]
    ends = [clock()]
    for step in range(1, job["warmup"] + job["steps"] + 1):
        batch = [prompts[((step - 1) * n + i) % len(prompts)] for i in range(n)]
        _, gen, _ = grpo.grpo_step(policy, tok, optimizer, batch, None, reward_fn, cfg, step, ref, sampling)
        ends.append(clock())
        if gen.prompt_ids.shape != (B, job["prompt_tokens"]) or not bool(gen.prompt_mask.all()) \
                or int(gen.completion_mask.sum()) != B * job["completion_tokens"]:
            raise SystemExit(f"ours: step {step} did not have {B} rows of exactly "
                             f"{job['prompt_tokens']} + {job['completion_tokens']} tokens")
    return {"step_ends": ends, "gen_seconds": gen_seconds, "peak_rss_mib": peak_rss_mib(),
            "params": sum(p.numel() for p in policy.parameters())}


# ----------------------------------------------------------------------------------------------
# Worker: TRL
# ----------------------------------------------------------------------------------------------

def run_trl(job: dict) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = AutoTokenizer.from_pretrained(job["folder"])
    B, C = job["prompts_per_step"] * job["group_size"], job["completion_tokens"]
    checks = []

    def reward_fn(prompts, completions, completion_ids, **kw):
        checks.append(all(len(x) == C for x in completion_ids) and len(completion_ids) == B)
        return [low_half_share(x, len(tok)) for x in completion_ids]

    class StepClock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_train_begin(self, args, state, control, **kw):
            self.ends.append(clock())

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(clock())

    steps = job["warmup"] + job["steps"]
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, use_cpu=True, seed=0, max_steps=steps,
            per_device_train_batch_size=B, gradient_accumulation_steps=1, steps_per_generation=1,
            num_generations=job["group_size"], max_completion_length=C,
            generation_kwargs={"min_new_tokens": C}, temperature=1.0, top_p=1.0, top_k=0,
            beta=job["beta"], num_iterations=1, loss_type="grpo", epsilon=0.2, epsilon_high=0.28,
            scale_rewards="group", learning_rate=job["lr"], lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch",
            bf16=False, fp16=False, gradient_checkpointing=False, use_vllm=False,
            model_init_kwargs={"dtype": "float32"}, shuffle_dataset=False,
            report_to="none", logging_strategy="no", save_strategy="no", eval_strategy="no",
            log_completions=False, disable_tqdm=True, dataloader_num_workers=0,
            dataloader_pin_memory=False)
        prompts = [job["prompts"][i % len(job["prompts"])] for i in range(steps * job["prompts_per_step"])]
        step_clock = StepClock()
        trainer = GRPOTrainer(model=job["folder"], reward_funcs=reward_fn, args=args,
                              train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                              processing_class=tok, callbacks=[step_clock])
        gen_seconds = []
        model = trainer.model
        model.generate = timed(model.generate, gen_seconds)      # TRL calls model.generate
        trainer.train()
    if not (checks and all(checks)):
        raise SystemExit(f"trl: some step did not have {B} completions of exactly {C} tokens")
    params = sum(p.numel() for p in model.parameters())
    return {"step_ends": step_clock.ends, "gen_seconds": gen_seconds, "peak_rss_mib": peak_rss_mib(),
            "params": params, "torch_threads": torch.get_num_threads()}


def worker(side: str, job_path: str) -> None:
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    if job["threads"]:
        import torch
        torch.set_num_threads(job["threads"])
    result = run_trl(job) if side == "trl" else run_ours(job, side.partition("-")[2] or "none")
    print("RESULT " + json.dumps(result))


# ----------------------------------------------------------------------------------------------
# Parent: prepare the model folders, run the workers A B B A, summarise
# ----------------------------------------------------------------------------------------------

def model_folder(name: str) -> Path:
    """A plain safetensors folder both sides can load (TRL needs a folder or hub id)."""
    sys.path.insert(0, str(ROOT))
    import models
    if name == models.EMBEDDED:
        return models.embedded_model_folder()      # already plain: no GGUF quantisation entry
    if name == models.TINY:
        folder = models.cache_dir() / "bench-tiny"
        if not (folder / "config.json").exists():
            model, tok = models.load_model(models.TINY)
            model.save_pretrained(folder)
            tok.save_pretrained(folder)
        return folder
    return Path(name)


def run_worker(python: str, side: str, job: dict, env: dict) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        proc = subprocess.run([python, str(Path(__file__).resolve()), "--worker", side, "--job", f.name],
                              capture_output=True, text=True, env=env, cwd=str(ROOT))
    finally:
        os.unlink(f.name)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
        raise SystemExit(f"the {side} worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1][len("RESULT "):])


def summarise(runs: list[dict], job: dict) -> dict:
    """Per side: measured step times (warm-up dropped) pooled over runs, and per-run medians."""
    w = job["warmup"]
    steps, cpus, gens, per_run, rss = [], [], [], [], []
    for r in runs:
        ends = r["step_ends"]                                  # [(wall, cpu)] at each step end
        durations = [b[0] - a[0] for a, b in zip(ends[:-1], ends[1:])][w:]
        cpus += [b[1] - a[1] for a, b in zip(ends[:-1], ends[1:])][w:]
        steps += durations
        gens += r["gen_seconds"][w:]
        per_run.append(statistics.median(durations))
        rss.append(r["peak_rss_mib"])
    B = job["prompts_per_step"] * job["group_size"]
    step = statistics.median(steps)
    return {"s_per_step": step, "s_min": min(steps), "s_max": max(steps), "run_medians": per_run,
            "cpu_s_per_step": statistics.median(cpus), "cpu_min": min(cpus), "cpu_max": max(cpus),
            "gen_s": statistics.median(gens), "gen_fraction": sum(gens) / sum(steps),
            "tokens_per_s": B * (job["prompt_tokens"] + job["completion_tokens"]) / step,
            "peak_rss_mib": max(rss), "rss_runs": rss, "n_steps": len(steps), "params": runs[0]["params"]}


def mfu(side: dict, job: dict, peak: float) -> tuple[float, float]:
    N, B = side["params"], job["prompts_per_step"] * job["group_size"]
    P, C = job["prompt_tokens"], job["completion_tokens"]
    train_flops = (6 + (2 if job["beta"] > 0 else 0)) * N * B * (P + C)
    train_s = max(side["s_per_step"] - side["gen_s"], 1e-9)
    return train_flops / train_s / peak, 2 * N * B * C / side["gen_s"] / peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["smollm2-135m", "tiny"],
                   help="smollm2-135m (embedded) | tiny | a model folder")
    p.add_argument("--prompt-tokens", type=int, default=16, help="P: tokens per prompt (exact)")
    p.add_argument("--completion-tokens", type=int, default=32, help="C: tokens per completion (exact)")
    p.add_argument("--group-size", type=int, default=4, help="G: completions per prompt")
    p.add_argument("--prompts-per-step", type=int, default=2, help="prompts per step")
    p.add_argument("--beta", type=float, default=0.02,
                   help="KL weight, both sides (stage 1's default; > 0 loads a reference on both)")
    p.add_argument("--lr", type=float, default=1e-6, help="AdamW learning rate, both sides")
    p.add_argument("--warmup", type=int, default=1, help="steps per run not measured")
    p.add_argument("--steps", type=int, default=2, help="measured steps per run")
    p.add_argument("--rounds", type=int, default=4, help="runs per side, alternating A B B A A B B A ...")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads in each worker (1: steadiest on a shared machine; 0: torch's default)")
    p.add_argument("--trl-python", default=str(ROOT / ".venv-bench" / "bin" / "python"),
                   help="python of the virtual env that has TRL (make bench creates it)")
    p.add_argument("--out", default=str(ROOT / "runs" / "bench" / "grpo_step.json"), help="results JSON")
    p.add_argument("--copies", nargs="*", default=[], choices=["packed", "bf16"],
                   help="extra sides of ours that sample from a sampler.SamplingCopy: 'packed' (fp32, "
                        "oneDNN-packed weights), 'bf16'")
    p.add_argument("--worker", choices=["ours", "ours-packed", "ours-bf16", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.job)
        return
    if not Path(args.trl_python).exists():
        sys.exit(f"--trl-python {args.trl_python}: not found; run `make bench` (it creates .venv-bench with TRL)")

    import torch
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT / "bench"))
    from matmul_peak import matmul_flops

    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    if args.threads:
        torch.set_num_threads(args.threads)
    peak = matmul_flops("cpu", torch.float32)["best"]
    print(f"fp32 matmul peak (bench/matmul_peak.py, {torch.get_num_threads()} threads, measured now): "
          f"{peak / 1e9:.1f} GFLOP/s")
    print(f"P = {args.prompt_tokens}, C = {args.completion_tokens}, G = {args.group_size}, "
          f"{args.prompts_per_step} prompts/step, beta = {args.beta}, fp32, {args.warmup} warm-up + "
          f"{args.steps} measured steps per run, {args.rounds} runs per side (A B B A ...)")
    results = {"peak_flops": peak, "args": vars(args), "models": {}}
    for name in args.models:
        folder = model_folder(name)
        tok = AutoTokenizer.from_pretrained(folder)
        n_prompts = args.prompts_per_step * (args.warmup + args.steps)
        job = {"folder": str(folder), "prompts": build_prompts(tok, n_prompts, args.prompt_tokens),
               "prompt_tokens": args.prompt_tokens, "completion_tokens": args.completion_tokens,
               "group_size": args.group_size, "prompts_per_step": args.prompts_per_step,
               "beta": args.beta, "lr": args.lr, "warmup": args.warmup, "steps": args.steps,
               "threads": args.threads}
        sides = ["ours", "trl"] + [f"ours-{c}" for c in args.copies]
        runs = {side: [] for side in sides}
        for r in range(args.rounds):
            for side in (sides if r % 2 == 0 else sides[::-1]):
                python = args.trl_python if side == "trl" else sys.executable
                t0 = time.time()
                res = run_worker(python, side, job, env)
                runs[side].append(res)
                ends = res["step_ends"]
                print(f"  [{name}] run {r + 1} {side:9s}: step wall/CPU s "
                      + " ".join(f"{b[0] - a[0]:.1f}/{b[1] - a[1]:.1f}" for a, b in zip(ends[:-1], ends[1:]))
                      + f", peak RSS {res['peak_rss_mib']:.0f} MiB ({time.time() - t0:.0f} s with load)",
                      flush=True)
        summary = {side: summarise(runs[side], job) for side in sides}
        ours, trl = summary["ours"], summary["trl"]
        results["models"][name] = {**summary, "runs": runs}
        print(f"\n{name} ({ours['params'] / 1e6:.1f}M parameters)")
        print(f"  {'':9s} {'s/step':>8s} {'min..max':>13s} {'CPU s/step':>10s} {'tokens/s':>9s} "
              f"{'generate':>8s} {'peak RSS':>9s} {'MFU train':>9s} {'MFU gen':>8s}")
        for label, s in [("ours", ours), ("TRL", trl)] + [(x, summary[x]) for x in sides[2:]]:
            m_train, m_gen = mfu(s, job, peak)
            print(f"  {label:9s} {s['s_per_step']:8.2f} {s['s_min']:6.2f}..{s['s_max']:<6.2f} "
                  f"{s['cpu_s_per_step']:10.2f} {s['tokens_per_s']:9.1f} {s['gen_fraction']:8.0%} "
                  f"{s['peak_rss_mib']:5.0f} MiB {m_train:8.1%} {m_gen:8.1%}")
        print(f"  ours vs TRL: step speed {trl['s_per_step'] / ours['s_per_step']:.2f}x wall, "
              f"{trl['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f}x CPU time "
              f"(target >= 1.5x), peak memory {ours['peak_rss_mib'] / trl['peak_rss_mib']:.2f}x "
              f"(target <= 0.9x); {ours['n_steps']} + {trl['n_steps']} measured steps; run medians "
              f"ours {' '.join(f'{x:.2f}' for x in ours['run_medians'])}, "
              f"TRL {' '.join(f'{x:.2f}' for x in trl['run_medians'])}", flush=True)
        for side in sides[2:]:
            s = summary[side]
            print(f"  {side} vs TRL: step speed {trl['s_per_step'] / s['s_per_step']:.2f}x wall, "
                  f"{trl['cpu_s_per_step'] / s['cpu_s_per_step']:.2f}x CPU time, peak memory "
                  f"{s['peak_rss_mib'] / trl['peak_rss_mib']:.2f}x; run medians "
                  f"{' '.join(f'{x:.2f}' for x in s['run_medians'])}", flush=True)
        print(flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
