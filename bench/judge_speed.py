"""bench/judge_speed.py: the measurements behind the offline judge's design, and its speed.

The offline judge (judge.OfflineJudge) is a weighted sum of sentence-embedding and word features
(docs/JUDGE.md). This script prints how fast it is, what each feature is worth on its own per
failure kind, what the judge loses without each one, what other weightings and constants give,
the statistics behind OFFLINE_CENTER / OFFLINE_SCALE, and the final accuracy. Its data:

    data/judge_pairs_support.jsonl + _meeting.jsonl   70 ordinary pairs (version 1's design set)
    data/judge_pairs_blind.jsonl                      24 ordinary pairs written before version 1
    data/judge_pairs_hacks.jsonl                      84 reward-hack pairs (the development set)
    --synthetic: hacks.make_hacks on the ordinary pairs' states (against their `better` reply)
                 and on every bundled context x persona (against the persona's own example lines)

It never reads data/judge_pairs_hacks_blind.jsonl: that set is scored once, with
`python mascot.py judge-eval --pairs data/judge_pairs_hacks_blind.jsonl`, on the final judge.

With --lm it also measures the LM-based alternatives we rejected: SmolLM2-135M as a pairwise A/B
judge (HFJudge), PMI, and the fluency of the reply (mean token log-prob under the base model).
They take minutes on a 2-core CPU.

Run from the repo root:
    python bench/judge_speed.py                 # ~1 minute on an idle 2-core CPU
    python bench/judge_speed.py --synthetic     # + generated hacks and the fitted weights
    python bench/judge_speed.py --lm
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

import corpora  # noqa: E402  (needs the repo root on sys.path first)
import data  # noqa: E402
import hacks  # noqa: E402
import judge  # noqa: E402
import judge_eval  # noqa: E402
import judge_features  # noqa: E402
from simulate import JudgeState  # noqa: E402

PAIR_FILES = {"ordinary": ["judge_pairs_support.jsonl", "judge_pairs_meeting.jsonl"],
              "blind": ["judge_pairs_blind.jsonl"],
              "hacks": ["judge_pairs_hacks.jsonl"]}
QUALITY = ("persona", "relevance", "repetition", "generic", "off_role")
PENALTIES = tuple(k for k in judge_features.OFFLINE_WEIGHTS if k not in QUALITY)


class MemoEncoder:
    """The sentence encoder with a dictionary in front: a text seen before is not embedded again."""

    def __init__(self, encoder):
        self.encoder, self.vectors = encoder, {}

    def embed(self, texts: list[str]) -> torch.Tensor:
        new = [t for t in dict.fromkeys(texts) if t not in self.vectors]
        if new:
            self.vectors.update(zip(new, self.encoder.embed(new)))
        return torch.stack([self.vectors[t] for t in texts]) if texts else self.encoder.embed([])


# ----------------------------------------------------------------------------------------------
# Rows: (state, good reply, bad reply, kind), featurised once; everything below reuses them
# ----------------------------------------------------------------------------------------------

def pair_rows(path_names: list[str]) -> list[dict]:
    pairs = [p for name in path_names for p in judge_eval.load_pairs(ROOT / "data" / name)]
    return [{"state": JudgeState.from_pair(p), "good": p["better"], "bad": p["worse"],
             "kind": p.get("failure", "-")} for p in pairs]


def synthetic_rows_from_pairs(seed: int = 0) -> list[dict]:
    """Generated hacks of every kind on the 70 ordinary states, against the pair's `better` reply.
    Off-role hacks borrow the lines of the bundled personas of the same set."""
    rng, rows = random.Random(seed), []
    for set_name, file_name in (("support", "judge_pairs_support.jsonl"), ("meeting", "judge_pairs_meeting.jsonl")):
        personas = data.load_personas("personas.json", set_name)
        for p in judge_eval.load_pairs(ROOT / "data" / file_name):
            others = [e for q in personas.personas if q.name != p["persona"] for e in q.examples]
            src = hacks.HackSource(p["persona"], "", p["persona_desc"], p.get("situation", ""), p["context"],
                                   [t["text"] for t in p["history"] if t["speaker"].casefold() != "user"], others)
            for kind, hack in hacks.make_hacks(src, rng.randrange(10**9)).items():
                rows.append({"state": JudgeState.from_pair(p), "good": p["better"], "bad": hack, "kind": kind})
    return rows


def synthetic_rows_from_contexts(seed: int = 0) -> list[dict]:
    """Generated hacks on every bundled context x persona (with another persona's line as an
    earlier turn), against each of the persona's own example lines: what the tests check."""
    rng, rows = random.Random(seed), []
    for ctx in corpora.load_contexts("bundled"):
        personas = data.load_personas("personas.json", ctx.persona_set)
        for p in personas.personas:
            others = [q for q in personas.personas if q.name != p.name]
            earlier = rng.choice(others)
            history = [{"speaker": earlier.name, "text": rng.choice(earlier.examples)}]
            state = judge.JudgeState(p.name, f"{p.role}: {p.description}", ctx.first_message, history, ctx.situation)
            src = hacks.HackSource(p.name, p.role, p.description, ctx.situation, ctx.first_message,
                                   [history[0]["text"]], [e for q in others for e in q.examples])
            for kind, hack in hacks.make_hacks(src, rng.randrange(10**9)).items():
                rows.append({"state": state, "good": rng.choice(p.examples), "bad": hack, "kind": kind,
                             "context_id": ctx.id})
    return rows


def featurise(j: judge.OfflineJudge, rows: list[dict]) -> None:
    """Adds rows[i]["fg"], rows[i]["fb"]: the feature dicts of the good and the bad reply."""
    states = [r["state"] for r in rows]
    feats = j.features_many(states * 2, [r["good"] for r in rows] + [r["bad"] for r in rows])
    for r, fg, fb in zip(rows, feats[:len(rows)], feats[len(rows):]):
        r["fg"], r["fb"] = fg, fb


def z(features: dict, weights: dict) -> float:
    return sum(w * features[k] for k, w in weights.items())


def accuracy(rows: list[dict], score) -> tuple[float, dict[str, float]]:
    """Share of rows where score(good) > score(bad), a tie counting half; overall and per kind."""
    def win(r):
        g, b = score(r["fg"]), score(r["fb"])
        return 1.0 if g > b else 0.5 if g == b else 0.0
    kinds: dict[str, list[float]] = {}
    for r in rows:
        kinds.setdefault(r["kind"], []).append(win(r))
    total = [w for ws in kinds.values() for w in ws]
    return sum(total) / len(total), {k: sum(v) / len(v) for k, v in sorted(kinds.items())}


def line(label: str, sets: dict[str, list[dict]], score, kinds_of: str | None = None) -> str:
    """One table row: accuracy on every set, then per kind on the set named kinds_of."""
    cells = [f"{accuracy(rows, score)[0]:.3f}" for rows in sets.values()]
    text = f"  {label:26s} " + " | ".join(cells)
    if kinds_of:
        per = accuracy(sets[kinds_of], score)[1]
        text += "   " + " ".join(f"{k[:8]} {v:.2f}" for k, v in per.items())
    return text


# ----------------------------------------------------------------------------------------------
# Fitting the penalty weights: pairwise logistic regression with the quality weights held fixed
# ----------------------------------------------------------------------------------------------

def fit_penalty_weights(rows: list[dict], l2: float = 1e-2) -> dict[str, float]:
    """Bradley-Terry on feature differences: maximise log sigmoid(z(good) - z(bad)) over the
    penalty weights, the quality part of z fixed at OFFLINE_WEIGHTS, plus an L2 term (generated
    hacks are separable, so without it the weights would grow without bound)."""
    quality = {k: judge_features.OFFLINE_WEIGHTS[k] for k in QUALITY}
    offset = torch.tensor([z(r["fg"], quality) - z(r["fb"], quality) for r in rows], dtype=torch.float64)   # (N,)
    x = torch.tensor([[r["fg"][k] - r["fb"][k] for k in PENALTIES] for r in rows], dtype=torch.float64)     # (N, P)
    w = torch.zeros(len(PENALTIES), dtype=torch.float64, requires_grad=True)                                # (P,)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(offset + x @ w)).mean() + l2 * (w ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return {**quality, **{k: round(float(v), 2) for k, v in zip(PENALTIES, w.detach())}}


# ----------------------------------------------------------------------------------------------
# The rejected LM-based alternatives (only with --lm)
# ----------------------------------------------------------------------------------------------

def reply_logprobs(model, tok, conversations: list[list[dict]], replies: list[str], batch_size=8, mean=False):
    """Sum (or mean) of log p(reply tokens) after each chat prompt: one number per row."""
    import sampler
    out = []
    for start in range(0, len(replies), batch_size):
        prompts = sampler.chat_prompt_ids(tok, conversations[start:start + batch_size])
        answers = [tok(r, add_special_tokens=False)["input_ids"] or [tok.eos_token_id]
                   for r in replies[start:start + batch_size]]
        ids, mask = sampler.left_pad([p + a for p, a in zip(prompts, answers)], tok.pad_token_id)  # (B, T)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)                                             # (B, T)
        R = max(len(a) for a in answers)      # left padding: every reply ends in the last column
        with torch.no_grad():
            # Only the last R + 1 positions' logits are needed (they predict the reply tokens).
            logits = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                           logits_to_keep=R + 1).logits[:, :-1].float()                           # (B, R, V)
        token_logp = logits.log_softmax(-1).gather(-1, ids[:, -R:, None])[..., 0]                  # (B, R)
        for row, a in enumerate(answers):
            total = float(token_logp[row, R - len(a):].sum())
            out.append(total / len(a) if mean else total)
    return out


def measure_lm(pairs_by_set: dict[str, list[dict]]) -> None:
    import models
    labelled = pairs_by_set["ordinary"]
    print("\n--lm: SmolLM2-135M as a pairwise A/B judge (both orders, verdict only when they agree)")
    hf = judge.HFJudge(models.EMBEDDED)
    t0 = time.perf_counter()
    verdicts = hf.compare_many([r["state"] for r in labelled], [r["good"] for r in labelled],
                               [r["bad"] for r in labelled])
    correct = sum(v.preferred == 0 for v in verdicts) / len(verdicts)
    no_verdict = sum(v.preferred is None for v in verdicts)
    says_a = sum((v.detail["p_ab"] > 0.5) + (v.detail["p_ba"] < 0.5) for v in verdicts) / (2 * len(verdicts))
    print(f"  accuracy {correct:.3f}, no verdict {no_verdict}/{len(verdicts)}, answers 'A' in {says_a:.0%} "
          f"of prompts, {len(labelled) / (time.perf_counter() - t0):.2f} pairs/s")

    model, tok = hf.model, hf.tokenizer
    print("--lm: fluency = mean log p(reply token) after an empty user turn (keyword stuffing is not fluent)")
    for name, rows in pairs_by_set.items():
        t0, c0 = time.perf_counter(), time.process_time()
        empty = [[{"role": "user", "content": ""}] for _ in rows]
        good = reply_logprobs(model, tok, empty, [r["good"] for r in rows], mean=True)
        bad = reply_logprobs(model, tok, empty, [r["bad"] for r in rows], mean=True)
        for r, g, b in zip(rows, good, bad):
            r["fg"]["lm_fluency"], r["fb"]["lm_fluency"] = g, b
        overall, per = accuracy(rows, lambda f: f["lm_fluency"])
        print(f"  {name:9s} {overall:.3f}  " + " ".join(f"{k[:8]} {v:.2f}" for k, v in per.items())
              + f"   ({len(rows) / (time.process_time() - c0):.2f} pairs per CPU-second)")
    good = sorted(r["fg"]["lm_fluency"] for rows in pairs_by_set.values() for r in rows)
    stuffed = sorted(r["fb"]["lm_fluency"] for r in pairs_by_set["hacks"] if r["kind"] == "keyword-stuffing")
    print(f"  good replies {good[0]:.1f} to {good[-1]:.1f} (median {good[len(good) // 2]:.1f}); "
          f"keyword stuffing {stuffed[0]:.1f} to {stuffed[-1]:.1f}")

    print("--lm: PMI = log p(reply | persona + conversation) - log p(reply | 'Say something.')")
    rows = labelled
    cond = [[{"role": "system", "content": f"You are {r['state'].persona_name}. {r['state'].persona_desc}"},
             {"role": "user", "content": judge.render_conversation(r["state"])}] for r in rows]
    plain = [[{"role": "user", "content": "Say something."}] for _ in rows]
    for side in ("good", "bad"):
        replies = [r[side] for r in rows]
        pmi = [c - u for c, u in zip(reply_logprobs(model, tok, cond, replies), reply_logprobs(model, tok, plain, replies))]
        for r, v in zip(rows, pmi):
            r["fg" if side == "good" else "fb"]["pmi"] = v
    overall, per = accuracy(rows, lambda f: f["pmi"])
    print(f"  ordinary  {overall:.3f}  " + " ".join(f"{k[:8]} {v:.2f}" for k, v in per.items()))


# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", action="store_true", help="also generated hacks and the fitted weights (minutes)")
    parser.add_argument("--lm", action="store_true", help="also measure the rejected LM-based judges (minutes)")
    args = parser.parse_args(argv)
    sets = {name: pair_rows(files) for name, files in PAIR_FILES.items()}
    print("pairs: " + ", ".join(f"{name} {len(rows)}" for name, rows in sets.items()))

    t0 = time.perf_counter()
    j = judge.OfflineJudge()
    print(f"loading the sentence encoder and embedding the persona cards: {time.perf_counter() - t0:.1f} s")
    # Every text is embedded once: the speed run below starts empty (each call of features_many
    # embeds its distinct texts once anyway), and the tables after it reuse the vectors.
    j.encoder = MemoEncoder(j.encoder)

    # --- speed: a cold judge (no cache) over all pairs, both replies of each -------------------
    # Wall time depends on what else the machine is running; CPU time (all threads together)
    # does not, so both are printed. On an otherwise idle machine wall ~ CPU / cores.
    n = sum(len(rows) for rows in sets.values())
    t0, c0 = time.perf_counter(), time.process_time()
    results = {name: judge_eval.evaluate_pairs(j, [{"persona": r["state"].persona_name, **pair_of(r)} for r in rows])
               for name, rows in sets.items()}
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"speed: {n} pairs in {seconds:.1f} s wall = {n / seconds:.1f} pairs/s; {cpu:.1f} CPU-seconds = "
          f"{n / cpu:.1f} pairs per CPU-second ({os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f})")
    t0 = time.process_time()
    for rows in sets.values():
        for r in rows:
            for reply in (r["good"], r["bad"]):
                judge_features.lexical_features(reply, r["state"], [r["state"].persona_desc])
    print(f"  of which the word features: {time.process_time() - t0:.2f} CPU-seconds")

    for rows in sets.values():
        featurise(j, rows)
    if args.synthetic:
        t0 = time.perf_counter()
        sets["synth-pairs"] = synthetic_rows_from_pairs()
        contexts = synthetic_rows_from_contexts()
        featurise(j, sets["synth-pairs"])
        featurise(j, contexts)
        print(f"generated hacks: {len(sets['synth-pairs'])} on the ordinary states, {len(contexts)} on the "
              f"bundled contexts ({time.perf_counter() - t0:.0f} s)")
    header = "  " + " " * 26 + " " + " | ".join(f"{name[:5]:5s}" for name in sets)

    # --- each feature alone ---------------------------------------------------------------------
    print("\nfeature alone (accuracy: " + " | ".join(sets) + "; per kind on the hack pairs)")
    print(header)
    for name in ["context"] + list(judge_features.OFFLINE_WEIGHTS):
        print(line(name, sets, lambda f, k=name: f[k], "hacks"))

    # --- the judge without each feature ---------------------------------------------------------
    print("\nthe judge without one feature")
    print(header)
    print(line("(all features)", sets, lambda f: z(f, j.weights), "hacks"))
    for name in judge_features.OFFLINE_WEIGHTS:
        weights = {k: v for k, v in j.weights.items() if k != name}
        print(line(f"- {name}", sets, lambda f, w=weights: z(f, w), "hacks"))

    # --- other weightings -------------------------------------------------------------------------
    print("\nweightings")
    print(header)
    v1 = {"persona": 2.0, "relevance": 1.0, "repetition": 1.0, "generic": 2.0}
    print(line("version 1's four (capped)", sets, lambda f: z(f, v1), "hacks"))
    for w_pen in (1.0, 2.0, 3.0):
        weights = {**j.weights, **{k: w_pen for k in PENALTIES}}
        print(line(f"every penalty {w_pen:g}", sets, lambda f, w=weights: z(f, w), "hacks"))
    if args.synthetic:
        even = [r for r in contexts if int(r["context_id"].split("-")[-1]) % 2 == 0]
        odd = [r for r in contexts if int(r["context_id"].split("-")[-1]) % 2 == 1]
        fitted = fit_penalty_weights(even)
        print(f"  fitted on {len(even)} generated hacks of the even-numbered contexts (L2 0.01): "
              + ", ".join(f"{k} {fitted[k]:.2f}" for k in PENALTIES))
        print(line("fitted penalty weights", sets, lambda f: z(f, fitted), "hacks"))
        print(f"  held-out odd-numbered contexts ({len(odd)} hacks): fitted "
              f"{accuracy(odd, lambda f: z(f, fitted))[0]:.3f}, chosen {accuracy(odd, lambda f: z(f, j.weights))[0]:.3f}")
        lowest = {}
        for r in contexts:        # the test's condition: every hack below every own example line
            key = (r["state"].persona_name, r["state"].context)
            lowest[key] = min(lowest.get(key, 1e9), z(r["fg"], j.weights))
        above = [r for r in contexts if z(r["fb"], j.weights) >= lowest[(r["state"].persona_name, r["state"].context)]]
        print(f"  generated hacks on the bundled contexts scored at or above one of the persona's own lines "
              f"used as the good reply: {len(above)} of {len(contexts)}")

    # --- constants ------------------------------------------------------------------------------
    print("\nRELEVANCE_CAP (relevance = min(context, cap))")
    print(header)
    copies = [r for r in sets["hacks"] if r["kind"] == "copies-context"]
    no_copy = {k: v for k, v in j.weights.items() if k != "context_copy"}
    for cap in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        print(line(f"cap {cap}", sets, lambda f, c=cap: z({**f, "relevance": min(f["context"], c)}, j.weights), "hacks")
              + f"   | copy pairs without context_copy "
              f"{accuracy(copies, lambda f, c=cap: z({**f, 'relevance': min(f['context'], c)}, no_copy))[0]:.2f}")
    for floor in (0.3, 0.4, 0.5, 0.6, 0.7):
        saved, judge_features.COPY_FLOOR = judge_features.COPY_FLOOR, floor
        for rows in sets.values():
            for r in rows:
                for side, reply in (("fg", r["good"]), ("fb", r["bad"])):
                    r[side + "@copy"] = {**r[side], **{k: v for k, v in judge_features.lexical_features(
                        reply, r["state"], lexical_card(j, r["state"]), lexical_role(j, r["state"])).items()
                        if k in ("context_copy", "history_echo")}}
        judge_features.COPY_FLOOR = saved
        print(line(f"COPY_FLOOR {floor}", {k: [{**r, "fg": r["fg@copy"], "fb": r["fb@copy"]} for r in rows]
                                          for k, rows in sets.items()}, lambda f: z(f, j.weights), "hacks"))

    # --- where OFFLINE_CENTER and OFFLINE_SCALE come from ---------------------------------------
    zs = [z(r[side], j.weights) for r in sets["ordinary"] for side in ("fg", "fb")]
    print(f"\nweighted sum z over the {len(zs)} ordinary replies: mean {statistics.mean(zs):.3f}, "
          f"std {statistics.pstdev(zs):.3f}  (OFFLINE_CENTER = {judge_features.OFFLINE_CENTER}, "
          f"1 / OFFLINE_SCALE = {1 / judge_features.OFFLINE_SCALE:.3f})")
    good = [r["fg"] for name in PAIR_FILES for r in sets[name]]
    for name in PENALTIES:
        fired = sorted(f[name] for f in good if f[name] < 0)
        print(f"  {name:15s} is below 0 for {len(fired)} of the {len(good)} good replies of the labelled pairs"
              + (f" ({', '.join(f'{x:.2f}' for x in fired[:5])}{' ...' if len(fired) > 5 else ''})" if fired else ""))

    # --- the judge as the pipeline uses it (evaluate_pairs alternates positions) ---------------
    for name, result in results.items():
        print(f"\nOfflineJudge on the {name} pairs ({judge_eval.format_eval_report(result).splitlines()[0]}):")
        print("\n".join(judge_eval.format_eval_report(result).splitlines()[1:]))

    if args.lm:
        measure_lm({k: v for k, v in sets.items() if k in PAIR_FILES})
    return 0


def pair_of(row: dict) -> dict:
    """A row back in the judge-pair schema (evaluate_pairs reads the state from it)."""
    s = row["state"]
    return {"persona_desc": s.persona_desc, "context": s.context, "history": s.history,
            "situation": s.situation, "better": row["good"], "worse": row["bad"], "failure": row["kind"]}


def lexical_card(j: judge.OfflineJudge, state) -> list[str]:
    voice = judge.find_voice(state, j.voices)
    return [state.persona_desc] + (voice.card_texts if voice else [])


def lexical_role(j: judge.OfflineJudge, state) -> str:
    voice = judge.find_voice(state, j.voices)
    return voice.role if voice else ""


if __name__ == "__main__":
    sys.exit(main())
