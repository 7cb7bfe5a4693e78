"""bench/generate_speed.py: our sampler (sampler.generate) against HF's `model.generate`, on CPU.

Every GRPO step and every simulated turn spends most of its time sampling, so this measures the
sampler alone, on the embedded SmolLM2-135M, at two shapes:

  grpo      2 distinct prompts x G 4 = 8 rows, ~300-token prompts, 48 new tokens: a GRPO step's
            sampling (each prompt 4 times in a row, as grpo.grpo_step passes them);
  distinct  8 distinct ~300-token prompts, 48 new tokens: a simulated turn (nothing to share).

Rows, each timed `--repeats` times (median reported), interleaved so that a change of machine
load hits every row alike, after one warm-up call each:

  hf generate fp32     HF's own `model.generate` (do_sample, temperature 1, top-p 1, top-k off);
  ours fp32            sampler.generate with its defaults (sampler="ours": one prefill per
                       distinct prompt, preallocated KV cache), fp32 weights, per-row seeds;
  ours packed copy     the same on sampler.SamplingCopy(policy, torch.float32): fp32 weights
                       pre-packed for oneDNN (models.PackedLinear); each timed call includes the
                       copy's refresh, as grpo_step refreshes it before every sampling;
  ours bf16 copy       the same on a bf16 copy of the weights (SamplingCopy(policy, bfloat16)),
                       refresh included;
  previous loop fp32   sampler.generate(sampler="hf"): HF's DynamicCache, one prefill per row,
                       the implementation before this sampler (the fallback), for reference.

The prompts are real ones: a persona card, the group-chat instructions and a user's first
message (simulate.speaker_messages over the bundled personas and contexts). All rows produce
exactly 48 tokens (min_new_tokens = max_new_tokens on both sides), so every row does the same
work and tokens/s = rows x 48 / seconds. The headline keeps both sides in fp32; bf16 is its own row.
The last line is `speedup ours/hf: X.XXx`: HF generate fp32 over ours fp32 (our default
settings) at the grpo shape.

Run from the repo root (2-3 minutes on the 2-core CPU; takes torch's default thread count):
    python bench/generate_speed.py
    python bench/generate_speed.py --repeats 5 --threads 1
Machine load matters: the script prints the load average before and after; compare numbers taken
on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MASCOT_CACHE", str(ROOT / ".cache"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

import corpora  # noqa: E402
import data  # noqa: E402
import grpo  # noqa: E402
import models  # noqa: E402
import sampler  # noqa: E402
import simulate  # noqa: E402


def bench_prompts(n: int) -> list[list[dict]]:
    """n distinct chat prompts of ~300 tokens: speaker prompts for the first n bundled contexts."""
    personas = data.load_personas(ROOT / "personas.json", "support")
    contexts = corpora.load_contexts("bundled", persona_set="support", limit=n)
    return [simulate.speaker_messages(personas.personas[i % len(personas.personas)], personas, c,
                                      [simulate.Turn(simulate.USER, c.first_message)])
            for i, c in enumerate(contexts)]


def hf_generate(model, tok, rows: list[list[dict]], new_tokens: int) -> None:
    """HF's own sampler on the same left-padded prompts, exactly `new_tokens` tokens per row."""
    ids, mask = sampler.left_pad(sampler.chat_prompt_ids(tok, rows), tok.pad_token_id)
    torch.manual_seed(0)                                   # HF samples from the global generator
    model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                   top_k=0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   pad_token_id=tok.pad_token_id, eos_token_id=sampler.stop_token_ids(tok))


def ours(model, tok, rows, new_tokens, which="ours") -> None:
    gen = sampler.generate(model, tok, rows, new_tokens, 1.0, 1.0, seeds=0, sampler=which,
                           min_new_tokens=new_tokens)
    assert int(gen.completion_mask.sum()) == len(rows) * new_tokens


def logprob_gap(sampler_model, trainer, tok, rows, new_tokens, seeds) -> torch.Tensor:
    """|logp_sampler - logp_trainer| per real completion token: the sampler's own log-probs
    (Generation.sampler_logprobs) against grpo.completion_logprobs on the fp32 policy, i.e.
    exactly what grpo logs as `logp_mismatch`. Replies stop naturally here (no min_new_tokens)."""
    gen = sampler.generate(sampler_model, tok, rows, new_tokens, 1.0, 1.0, seeds=seeds)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    trainer_logps = grpo.completion_logprobs(trainer, ids, attn, gen.prompt_ids.shape[1])
    m = gen.completion_mask.bool()
    return (trainer_logps[m] - gen.sampler_logprobs[m]).abs()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row and shape (median)")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per row")
    p.add_argument("--group-size", type=int, default=4, help="G: rows per prompt at the grpo shape")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--shapes", nargs="+", default=["grpo", "distinct"], choices=["grpo", "distinct"],
                   help="which shapes to time (the last line needs grpo)")
    p.add_argument("--skip", nargs="*", default=[], help="rows not to time, e.g. 'ours bf16 copy'")
    p.add_argument("--mismatch-prompts", type=int, default=6,
                   help="distinct prompts (x G) for the log-prob mismatch; 0 skips it")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tok = models.load_model(models.EMBEDDED)
    packed = sampler.SamplingCopy(model, torch.float32)
    low = sampler.SamplingCopy(model, torch.bfloat16)

    def with_copy(sampling, batch):
        sampling.refresh()                # as grpo_step does before every sampling: timed too
        ours(sampling.model, tok, batch, args.new_tokens)

    prompts = bench_prompts(8)
    shapes = {"grpo": [c for c in prompts[:2] for _ in range(args.group_size)], "distinct": prompts}
    shapes = {s: batch for s, batch in shapes.items() if s in args.shapes}
    rows = {"hf generate fp32": lambda r: hf_generate(model, tok, r, args.new_tokens),
            "ours fp32": lambda r: ours(model, tok, r, args.new_tokens),
            "ours packed copy": lambda r: with_copy(packed, r),
            "ours bf16 copy": lambda r: with_copy(low, r),
            "previous loop fp32": lambda r: ours(model, tok, r, args.new_tokens, which="hf")}
    rows = {r: fn for r, fn in rows.items() if r == "hf generate fp32" or r == "ours fp32" or r not in args.skip}
    lengths = [len(x) for x in sampler.chat_prompt_ids(tok, prompts)]
    print(f"SmolLM2-135M, {torch.get_num_threads()} threads, prompts of {min(lengths)}-{max(lengths)} "
          f"tokens, {args.new_tokens} new tokens, median of {args.repeats}; "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

    seconds = {(s, r): [] for s in shapes for r in rows}
    cpu = {(s, r): [] for s in shapes for r in rows}     # CPU seconds: steadier on a shared machine
    with torch.no_grad():
        for fn in rows.values():                           # warm-up: one untimed call each
            fn(shapes[args.shapes[0]][:2])
        for _ in range(args.repeats):
            for s, batch in shapes.items():
                for r, fn in rows.items():
                    t0, c0 = time.perf_counter(), time.process_time()
                    fn(batch)
                    seconds[(s, r)].append(time.perf_counter() - t0)
                    cpu[(s, r)].append(time.process_time() - c0)
                    print(f"  {s:8s} {r:20s} {seconds[(s, r)][-1]:6.2f} s, {cpu[(s, r)][-1]:6.2f} CPU s, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)

    for s, batch in shapes.items():
        n_prompts = len({str(c) for c in batch})
        print(f"\n{s}: {n_prompts} distinct prompts, {len(batch)} rows")
        base = statistics.median(seconds[(s, "hf generate fp32")])
        base_cpu = statistics.median(cpu[(s, "hf generate fp32")])
        for r in rows:
            med, med_cpu = statistics.median(seconds[(s, r)]), statistics.median(cpu[(s, r)])
            runs = " ".join(f"{x:.2f}" for x in seconds[(s, r)])
            print(f"  {r:20s} {med:6.2f} s  {len(batch) * args.new_tokens / med:6.1f} tokens/s  "
                  f"{base / med:5.2f}x hf   CPU {med_cpu:6.2f} s ({base_cpu / med_cpu:4.2f}x)   (runs {runs})")
    # How far each sampler's log-probs are from the fp32 trainer's (24 rows: 6 prompts x G 4).
    many = [c for c in prompts[:args.mismatch_prompts] for _ in range(args.group_size)]
    print(f"\nlog-prob mismatch |logp_sampler - logp_trainer(fp32)| per token, {len(many)} rows, "
          f"temperature 1, natural stops:")
    with torch.no_grad():
        for name, sampler_model in [] if not many else (("ours fp32", model), ("ours packed copy", packed.model),
                                    ("ours bf16 copy", low.model)):
            gap = logprob_gap(sampler_model, model, tok, many, args.new_tokens, seeds=1234)
            print(f"  {name:16s} mean {gap.mean():.5f}  median {gap.median():.5f}  p99 "
                  f"{gap.quantile(0.99):.4f}  max {gap.max():.4f}  over {gap.numel()} tokens; "
                  f"exp(gap) > 1.2 for {(gap > 0.1823).float().mean():.2%} of tokens")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if "grpo" not in shapes:
        return
    grpo_hf = statistics.median(seconds[("grpo", "hf generate fp32")])
    grpo_ours = statistics.median(seconds[("grpo", "ours fp32")])
    print(f"speedup ours/hf: {grpo_hf / grpo_ours:.2f}x")


if __name__ == "__main__":
    main()
