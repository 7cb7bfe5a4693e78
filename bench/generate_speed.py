"""bench/generate_speed.py: our sampler (models.generate) against HF's `model.generate`, on the CPU.

Sampling dominates GRPO steps and simulated turns, so this times the sampler alone on SmolLM2-135M at two shapes, each
row `--repeats` times (median), interleaved so load changes hit every row alike, after an untimed warm-up:
  grpo      2 distinct prompts x G 4 = 8 rows, ~310-token speaker prompts, 48 new tokens;
  distinct  8 distinct prompts, 48 new tokens (a simulated turn: nothing to share).
Rows: HF generate (fp32, do_sample, temperature 1, top-k off); ours on the fp32 policy; ours on the bf16 sampling copy
(its refresh timed too: GRPO pays it every step); each makes exactly 48 tokens, so all do the same work. Then each
sampler's log-prob mismatch against the fp32 trainer (GRPO's `mismatch`); last, the DEFAULT sampler's speedup over HF.
A benchmark beside the method (bench/README.md lists them all).
    python bench/generate_speed.py [--repeats 3] [--threads 2] [--shapes grpo]
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root
# Run as a script, Python puts bench/ first on sys.path, not the repository root that holds the
# project's modules: add it. Offline before transformers is imported: the model is local.
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

import grpo
import models
import scenarios
import simulate
from plumbing import devices, loading


def hf_generate(model, tok, rows, n: int) -> None:
    """HF's sampler on the chats `rows`: exactly n new tokens each."""
    ids, mask = models.left_pad(models.chat_prompt_ids(tok, rows), tok.pad_token_id)
    torch.manual_seed(0)
    model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=n,
        min_new_tokens=n,
        pad_token_id=tok.pad_token_id,
        eos_token_id=models.stop_token_ids(tok),
    )


def ours(model, tok, rows, n: int) -> None:
    """Our sampler on the chats `rows`: exactly n new tokens each."""
    fixed = models.DecodeOptions(min_new_tokens=n)  # exactly n tokens a row, as HF's min_new_tokens
    gen = models.generate(model, tok, rows, n, 1.0, 1.0, seeds=0, options=fixed)
    assert int(gen.completion_mask.sum()) == len(rows) * n


def mismatch(sampler, trainer, tok, rows, n: int) -> torch.Tensor:
    """|logp_sampler - logp_trainer(fp32)| per real token, natural stops."""
    gen = models.generate(sampler, tok, rows, n, 1.0, 1.0, seeds=1234)
    logps = grpo.completion_logprobs(
        trainer,
        torch.cat([gen.prompt_ids, gen.completion_ids], 1),
        torch.cat([gen.prompt_mask, gen.completion_mask], 1),
        gen.prompt_ids.shape[1],
    )
    m = gen.completion_mask.bool()
    return (logps[m] - gen.sampler_logprobs[m]).abs()


def samplers(model, copy, tok, n: int) -> dict:
    """The rows timed: name -> a function that samples n tokens for each of the chats it is given."""

    def hf_fp32(chats):
        hf_generate(model, tok, chats, n)

    def ours_fp32(chats):
        ours(model, tok, chats, n)

    def ours_bf16_copy(chats):
        copy.refresh()  # timed too: GRPO pays it every step
        ours(copy.model, tok, chats, n)

    return {"hf generate fp32": hf_fp32, "ours fp32": ours_fp32, "ours bf16 copy": ours_bf16_copy}


def each_repeated(items: list, k: int) -> list:
    """Every item k times in a row, as a GRPO batch holds each prompt's group."""
    out = []
    for item in items:
        out += [item] * k
    return out


def main() -> None:
    """Time every row at every shape, then the mismatch, then the default sampler's speedup."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument(
        "--shapes", nargs="+", default=["grpo", "distinct"], choices=["grpo", "distinct"]
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads or torch.get_num_threads())
    model, tok = loading.load_model(loading.EMBEDDED)
    copy = models.SamplingCopy(model)
    torch.set_grad_enabled(False)  # nothing here trains
    # 8 distinct speaker prompts of ~310 tokens.
    personas = scenarios.load_personas(ROOT / "personas.json", "support")
    batch = [
        simulate.speaker_messages(
            personas.personas[i % 4], personas, c, [simulate.Turn(simulate.USER, c.first_message)]
        )
        for i, c in enumerate(scenarios.load_contexts("bundled", "support")[:8])
    ]
    shapes = {}  # shape -> its chats
    for s in args.shapes:
        shapes[s] = batch if s == "distinct" else each_repeated(batch[:2], 4)
    n = args.new_tokens
    rows = samplers(model, copy, tok, n)
    native = devices.native_bf16("cpu")
    print(
        f"SmolLM2-135M, {torch.get_num_threads()} threads, native bf16: {native}, {n} new tokens, median of "
        f"{args.repeats}; load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    times = time_rows(rows, shapes, batch[:2], args.repeats)
    med = {key: statistics.median(runs) for key, runs in times.items()}
    for s, b in shapes.items():
        print(f"\n{s}: {len({str(x) for x in b})} distinct prompts, {len(b)} rows")
        for r in rows:
            t = med[s, r]
            print(
                f"  {r:18s} {t:6.2f} s  {len(b) * n / t:6.1f} tokens/s  {med[s, 'hf generate fp32'] / t:5.2f}x hf   "
                f"(runs {' '.join(f'{x:.2f}' for x in times[s, r])})"
            )
    for name, sampler in (("ours fp32", model), ("ours bf16 copy", copy.model)):
        gap = mismatch(sampler, model, tok, each_repeated(batch[:4], 4), n)
        print(
            f"mismatch {name:15s} mean {gap.mean():.5f} per token, p99 {gap.quantile(0.99):.4f} ({gap.numel()} tokens)"
        )
    print(f"load average after {os.getloadavg()[0]:.2f}")
    if "grpo" in shapes:
        default = "ours bf16 copy" if native else "ours fp32"
        print(
            f"speedup of the default sampler ({default}) over hf at the grpo shape: "
            f"{med['grpo', 'hf generate fp32'] / med['grpo', default]:.2f}x"
        )


def time_rows(rows: dict, shapes: dict, warm_up: list, repeats: int) -> dict:
    """(shape, row) -> the seconds of each repeat; rows interleaved, so a change of load hits all
    alike, after one untimed call of each (warm_up: its chats)."""
    for fn in rows.values():
        fn(warm_up)
    times = {}
    for s in shapes:
        for r in rows:
            times[s, r] = []
    for _ in range(repeats):
        for s, b in shapes.items():
            for r, fn in rows.items():
                t0 = time.perf_counter()
                fn(b)
                times[s, r].append(time.perf_counter() - t0)
    return times


if __name__ == "__main__":
    main()
