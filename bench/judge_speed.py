"""bench/judge_speed.py: the measurements behind the offline judge's design, and its speed.

The offline judge (judge.OfflineJudge) is a weighted sum of four sentence-embedding features. This
script prints what each feature is worth on its own, per failure kind, what a few simple
weightings give, the statistics behind OFFLINE_CENTER / OFFLINE_SCALE, the final accuracy, and
how many pairs per second the judge handles. Everything comes from two sources:

    data/judge_pairs_support.jsonl + data/judge_pairs_meeting.jsonl   labelled pairs (design)
    data/judge_pairs_blind.jsonl   24 pairs written BEFORE any feature was measured; never tuned on

With --lm it also measures the two LM-based alternatives we rejected: SmolLM2-135M as a pairwise
A/B judge (HFJudge), and the PMI feature log p(reply | persona + conversation) - log p(reply).
They take minutes on a 2-core CPU.

Run from the repo root:
    python bench/judge_speed.py
    python bench/judge_speed.py --lm
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
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import judge  # noqa: E402  (needs the repo root on sys.path first)

LABELLED = [ROOT / "data" / "judge_pairs_support.jsonl", ROOT / "data" / "judge_pairs_meeting.jsonl"]
BLIND = ROOT / "data" / "judge_pairs_blind.jsonl"
FAILURES = ("generic", "wrong-role", "repetition", "ignores-specifics", "sycophancy")


def pair_accuracy(better: list[float], worse: list[float]) -> float:
    """Fraction of pairs where the better reply has the higher value; a tie counts half."""
    wins = [1.0 if b > w else 0.5 if b == w else 0.0 for b, w in zip(better, worse)]
    return sum(wins) / len(wins) if wins else float("nan")


def by_failure(pairs: list[dict], better: list[float], worse: list[float]) -> str:
    cells = []
    for kind in FAILURES:
        idx = [i for i, p in enumerate(pairs) if p["failure"] == kind]
        if idx:
            acc = pair_accuracy([better[i] for i in idx], [worse[i] for i in idx])
            cells.append(f"{kind[:10]:>10s} {acc:.2f}")
    return "  ".join(cells)


def features_of(j: judge.OfflineJudge, pairs: list[dict]) -> tuple[list[dict], list[dict]]:
    states = [judge.state_from_pair(p) for p in pairs]
    feats = j.features_many(states * 2, [p["better"] for p in pairs] + [p["worse"] for p in pairs])
    return feats[:len(pairs)], feats[len(pairs):]


def weighted(feats: list[dict], weights: dict[str, float]) -> list[float]:
    return [judge.weighted_sum(f, weights) for f in feats]


# ----------------------------------------------------------------------------------------------
# The rejected LM alternatives (only with --lm)
# ----------------------------------------------------------------------------------------------

def reply_logprobs(model, tok, conversations: list[list[dict]], replies: list[str], batch_size=8):
    """Sum of log p(reply tokens) after each chat prompt: one number per row."""
    import torch
    import models
    out = []
    for start in range(0, len(replies), batch_size):
        prompts = models.chat_prompt_ids(tok, conversations[start:start + batch_size])
        answers = [tok(r, add_special_tokens=False)["input_ids"] for r in replies[start:start + batch_size]]
        ids, mask = models.left_pad([p + a for p, a in zip(prompts, answers)], tok.pad_token_id)  # (B, T)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)                                             # (B, T)
        R = max(len(a) for a in answers)      # left padding: every reply ends in the last column
        with torch.no_grad():
            # Only the last R + 1 positions' logits are needed (they predict the reply tokens).
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           logits_to_keep=R + 1).logits[:, :-1].float()                           # (B, R, V)
        token_logp = logits.log_softmax(-1).gather(-1, ids[:, -R:, None])[..., 0]                  # (B, R)
        for row, a in enumerate(answers):
            out.append(float(token_logp[row, R - len(a):].sum()))
    return out


def measure_lm(pairs: list[dict]) -> None:
    import models
    print("\n--lm: SmolLM2-135M as a pairwise A/B judge (both orders, verdict only when they agree)")
    hf = judge.HFJudge(models.EMBEDDED)
    t0 = time.perf_counter()
    # HFJudge asks both orders itself, so (better, worse) for every pair is already position-fair.
    verdicts = hf.compare_many([judge.state_from_pair(p) for p in pairs],
                               [p["better"] for p in pairs], [p["worse"] for p in pairs])
    accuracy = sum(v.preferred == 0 for v in verdicts) / len(verdicts)
    no_verdict = sum(v.preferred is None for v in verdicts)
    # p_ab = P("A") with better shown first; p_ba = P("B") with better shown second.
    says_a = sum((v.detail["p_ab"] > 0.5) + (v.detail["p_ba"] < 0.5) for v in verdicts) / (2 * len(verdicts))
    print(f"  accuracy {accuracy:.3f}, no verdict {no_verdict}/{len(verdicts)}, answers 'A' (the "
          f"first position) in {says_a:.0%} of prompts, {len(pairs) / (time.perf_counter() - t0):.2f} pairs/s")

    print("--lm: PMI = log p(reply | persona + conversation) - log p(reply | 'Say something.')")
    model, tok = hf.model, hf.tokenizer
    t0 = time.perf_counter()
    replies = [p["better"] for p in pairs] + [p["worse"] for p in pairs]
    states = [judge.state_from_pair(p) for p in pairs] * 2
    cond = [[{"role": "system", "content": f"You are {s.persona_name}. {s.persona_desc}"},
             {"role": "user", "content": judge.render_conversation(s)}] for s in states]
    plain = [[{"role": "user", "content": "Say something."}] for _ in states]
    pmi = [c - u for c, u in zip(reply_logprobs(model, tok, cond, replies),
                                 reply_logprobs(model, tok, plain, replies))]
    n = len(pairs)
    seconds = time.perf_counter() - t0
    print(f"  accuracy {pair_accuracy(pmi[:n], pmi[n:]):.3f}  {by_failure(pairs, pmi[:n], pmi[n:])}"
          f"  ({n / seconds:.2f} pairs/s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm", action="store_true", help="also measure the rejected LM-based judges (minutes)")
    args = parser.parse_args(argv)
    labelled = [p for path in LABELLED if path.exists() for p in judge.load_pairs(path)]
    blind = judge.load_pairs(BLIND)
    if not labelled:
        print("no labelled pairs found (data/judge_pairs_support.jsonl, data/judge_pairs_meeting.jsonl)")
        return 1
    print(f"labelled pairs: {len(labelled)}, blind pairs: {len(blind)}")

    t0 = time.perf_counter()
    j = judge.OfflineJudge()
    print(f"loading the sentence encoder: {time.perf_counter() - t0:.1f} s")

    # --- speed: a cold judge (no cache) over all labelled pairs, both replies of each ---------
    # Wall time depends on what else the machine is running; CPU time (all threads together)
    # does not, so both are printed. On an otherwise idle machine wall ~ CPU / cores.
    t0, c0 = time.perf_counter(), time.process_time()
    result = judge.evaluate_pairs(j, labelled)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"speed: {len(labelled)} pairs in {seconds:.1f} s wall = {len(labelled) / seconds:.1f} pairs/s; "
          f"{cpu:.1f} CPU-seconds = {len(labelled) / cpu:.1f} pairs per CPU-second "
          f"({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")

    lab_b, lab_w = features_of(j, labelled)
    bl_b, bl_w = features_of(j, blind)

    # --- each feature alone --------------------------------------------------------------------
    print("\nfeature alone: labelled | blind   (per failure kind on the labelled pairs)")
    for name in judge.OFFLINE_WEIGHTS:
        lb, lw = [f[name] for f in lab_b], [f[name] for f in lab_w]
        bb, bw = [f[name] for f in bl_b], [f[name] for f in bl_w]
        print(f"  {name:11s} {pair_accuracy(lb, lw):.3f} | {pair_accuracy(bb, bw):.3f}   "
              f"{by_failure(labelled, lb, lw)}")

    # --- a few simple weightings ---------------------------------------------------------------
    spread = {k: statistics.pstdev([b[k] - w[k] for b, w in zip(lab_b, lab_w)]) for k in judge.OFFLINE_WEIGHTS}
    inverse_std = {k: spread["context"] / spread[k] for k in spread}   # context's weight = 1
    candidates = {"equal": {k: 1.0 for k in judge.OFFLINE_WEIGHTS},
                  "inverse std of difference": inverse_std,
                  "OFFLINE_WEIGHTS (chosen)": judge.OFFLINE_WEIGHTS}
    print("\nweightings: labelled | blind")
    for label, weights in candidates.items():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in weights.items())
        print(f"  {label:26s} {pair_accuracy(weighted(lab_b, weights), weighted(lab_w, weights)):.3f} | "
              f"{pair_accuracy(weighted(bl_b, weights), weighted(bl_w, weights)):.3f}   ({shown})")

    # --- where OFFLINE_CENTER and OFFLINE_SCALE come from ---------------------------------------
    z = weighted(lab_b + lab_w, judge.OFFLINE_WEIGHTS)
    print(f"\nweighted sum z over the {len(z)} labelled replies: mean {statistics.mean(z):.3f}, "
          f"std {statistics.pstdev(z):.3f}  (OFFLINE_CENTER = {judge.OFFLINE_CENTER}, "
          f"1 / OFFLINE_SCALE = {1 / judge.OFFLINE_SCALE:.3f})")

    # --- the judge as the pipeline uses it (evaluate_pairs alternates positions) ---------------
    print("\nOfflineJudge on the labelled pairs:")
    print(judge.format_eval_report(result))
    print("OfflineJudge on the blind pairs:")
    print(judge.format_eval_report(judge.evaluate_pairs(j, blind)))

    if args.lm:
        measure_lm(labelled)
    return 0


if __name__ == "__main__":
    sys.exit(main())
