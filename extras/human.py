"""human.py: the paper's two human studies: what people are shown, what is recorded, and the tests.

Where it sits in MASCOT (arXiv 2601.14230): evaluation, after `evaluate` has written transcripts.
The paper asks people twice:
  1. pairwise preference: a situation and two conversations (MASCOT and a baseline, names hidden,
     sides random); "which provides better socio-collaborative support?"; two raters per pair,
     at most 10 pairs per rater; two-sided sign test over the rater-level choices;
  2. the same choice plus three 5-point Likert items per conversation: helpfulness, emotional
     appropriateness, perceived safety; Mann-Whitney U per item and per rating stream (the first
     and the second rating of every conversation are reported separately).
This file builds the items from RUN/eval/transcripts.jsonl, defines the record one judgement
leaves in a JSON-lines file, and computes the statistics; `extras/annotate.py` is the page people
use (a local web server), and `python mascot.py evaluate --human FILE` prints the analysis.
Agreement between raters, which the paper does not report, is added: Fleiss' kappa over items
with the same number of ratings, and Cohen's kappa between the first and the second rating.

One record per judgement (one line):
    {"annotator": "a1", "item": "3", "context_id": "esconv-12", "systems": ["mascot", "few-shot-cot"],
     "left": "few-shot-cot", "choice": "mascot",
     "likert": {"mascot": {"helpfulness": 4, "emotional": 5, "safety": 5}, "few-shot-cot": {...}},
     "time": "2026-11-30T14:00:00"}
"systems" is [A, B]: A is the system under test; "likert" is absent in a choice-only study.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import data
from data import UserError
from metrics import cohen_kappa, fleiss_kappa, mann_whitney_u, win_rate
from results import json_safe

LIKERT = {"helpfulness": "This conversation would be helpful to someone in the situation described.",
          "emotional": "The agents respond in an emotionally appropriate way for the situation.",
          "safety": "The conversation avoids advice or language that could reasonably cause harm."}
QUESTION = ("Which conversation provides better support for this person? Consider whether each companion "
            "stays in its own role, responds to the person's specifics, adds something new rather than "
            "repeating the others, and is helpful and safe. Do not decide on length or position alone.")


def load_items(transcripts: str, a: str, b: str) -> list[dict]:
    """One item per conversation index that both systems have in RUN/eval/transcripts.jsonl:
    {"item", "context_id", "situation", "systems": [a, b], "turns": {system: [{speaker, text}]}}."""
    by_system = defaultdict(dict)
    for row in data.read_jsonl(transcripts):
        by_system[row.get("system")][row.get("index")] = row
    for name in (a, b):
        if name not in by_system:
            raise UserError(f"{transcripts}: no conversations of system '{name}'; it holds "
                            f"{', '.join(sorted(map(str, by_system))) or 'none'}")
    items = []
    for index in sorted(set(by_system[a]) & set(by_system[b])):
        ra, rb = by_system[a][index], by_system[b][index]
        items.append({"item": str(index), "context_id": ra["context_id"], "situation": ra["situation"],
                      "systems": [a, b], "turns": {a: ra["turns"], b: rb["turns"]}})
    return items


def check_record(rec: object, where: str) -> dict:
    """One judgement, validated; a UserError names the line and the field."""
    if not isinstance(rec, dict):
        raise UserError(f"{where}: not a judgement object")
    systems = rec.get("systems")
    if not (isinstance(rec.get("annotator"), str) and rec["annotator"] and isinstance(rec.get("item"), str)
            and isinstance(systems, list) and len(systems) == 2 and systems[0] != systems[1]):
        raise UserError(f"{where}: needs 'annotator', 'item' and 'systems': [A, B] (extras/annotate.py writes them)")
    if rec.get("choice") not in systems:
        raise UserError(f"{where}: 'choice' must be one of {systems}, got {rec.get('choice')!r}")
    for system, ratings in (rec.get("likert") or {}).items():
        if system not in systems or not isinstance(ratings, dict) or any(
                k not in LIKERT or not isinstance(v, int) or not 1 <= v <= 5 for k, v in ratings.items()):
            raise UserError(f"{where}: 'likert' must map each system to {', '.join(LIKERT)} ratings 1-5")
    return rec


def load_records(path) -> list[dict]:
    return [check_record(rec, f"{path}: line {n}") for n, rec in data.read_jsonl(path, numbered=True)]


def analyse(records: list[dict]) -> dict:
    """Every statistic of the human studies, per compared pair of systems (A = the system under test).

    choice: rater-level wins of A, sign test (exact two-sided binomial, ties impossible: forced
    choice); per conversation, how many items every rater gave to A (or to B).
    likert: per item and rating stream (stream k = the k-th judgement of each conversation, in
    file order), the means of A and B and a two-sided Mann-Whitney U test.
    agreement: Fleiss' kappa of the choices over the items with the most common number (>= 2) of
    ratings; Cohen's kappa between the first and the second rating of each item.
    """
    out = {}
    for pair in dict.fromkeys(tuple(r["systems"]) for r in records):
        a, b = pair
        recs = [r for r in records if tuple(r["systems"]) == pair]
        by_item = defaultdict(list)
        for r in recs:
            by_item[r["item"]].append(r)
        choice = win_rate(["A" if r["choice"] == a else "B" for r in recs])
        unanimous = Counter(js[0]["choice"] for js in by_item.values()
                            if len(js) >= 2 and len({j["choice"] for j in js}) == 1)
        likert = {}
        n_streams = max(len(js) for js in by_item.values())
        for key in LIKERT:
            for stream in range(n_streams):
                xs = [js[stream]["likert"][a][key] for js in by_item.values()
                      if len(js) > stream and key in (js[stream].get("likert") or {}).get(a, {})]
                ys = [js[stream]["likert"][b][key] for js in by_item.values()
                      if len(js) > stream and key in (js[stream].get("likert") or {}).get(b, {})]
                if xs and ys:
                    likert[f"{key}/{stream + 1}"] = {"n_a": len(xs), "n_b": len(ys), **mann_whitney_u(xs, ys)}
        counts = Counter(len(js) for js in by_item.values() if len(js) >= 2)
        m = max(counts, key=lambda k: (counts[k], k)) if counts else 0
        table = [[sum(j["choice"] == s for j in js) for s in pair] for js in by_item.values() if len(js) == m]
        firsts = [(js[0]["choice"], js[1]["choice"]) for js in by_item.values() if len(js) >= 2]
        out[f"{a} vs {b}"] = {
            "a": a, "b": b, "judgements": len(recs), "items": len(by_item),
            "annotators": len({r["annotator"] for r in recs}), "choice": choice,
            "unanimous_a": unanimous[a], "unanimous_b": unanimous[b], "likert": likert,
            "fleiss_kappa": fleiss_kappa(table) if table else float("nan"), "fleiss_items": len(table),
            "fleiss_raters": m, "cohen_kappa": cohen_kappa([x for x, _ in firsts], [y for _, y in firsts]),
            "cohen_items": len(firsts)}
    return out


def report(result: dict, path: str) -> str:
    """The analysis as markdown (printed by `evaluate --human` and saved beside the file)."""
    out = [f"# Human evaluation: {path}", ""]
    for name, r in result.items():
        c = r["choice"]
        out += [f"## {name}", "",
                f"{r['judgements']} judgements of {r['items']} conversation pairs by {r['annotators']} annotators. "
                f"**{r['a']} preferred in {c['wins']} of {c['wins'] + c['losses']}** "
                f"({c['win_rate']:.1%}); two-sided sign test (exact binomial against 50%) p = {c['p_value']:.4g}. "
                f"Every rater preferred {r['a']} in {r['unanimous_a']} conversations and {r['b']} in "
                f"{r['unanimous_b']} (of those rated at least twice).", "",
                f"Agreement on the choice: Fleiss' kappa {r['fleiss_kappa']:.3f} over {r['fleiss_items']} items with "
                f"{r['fleiss_raters']} ratings each; Cohen's kappa {r['cohen_kappa']:.3f} between the first and the "
                f"second rating of {r['cohen_items']} items (1 = full agreement, 0 = chance; nan = undefined).", ""]
        if r["likert"]:
            out += ["| Likert item / rating stream | n (A, B) | mean " + r["a"] + " | mean " + r["b"]
                    + " | difference | Mann-Whitney U | p (two-sided) | method |", "|---|---|---|---|---|---|---|---|"]
            for key, s in r["likert"].items():
                out.append(f"| {key} | {s['n_a']}, {s['n_b']} | {s['mean_x']:.2f} | {s['mean_y']:.2f} | "
                           f"{s['mean_x'] - s['mean_y']:+.2f} | {s['u']:.1f} | {s['p_value']:.4g} | {s['method']} |")
            out.append("")
    return "\n".join(out) + "\n"


def run(args) -> dict:
    """`python mascot.py evaluate --human FILE`: the statistics of the judgements extras/annotate.py
    saved, printed and written to RUN/eval/human.{md,json}. No model runs."""
    result = analyse(load_records(args.human))
    if not result:
        raise UserError(f"--human {args.human}: the file holds no judgements yet")
    text = report(result, args.human)
    data.write_text_atomic(Path(args.run) / "eval" / "human.md", text)
    data.write_json(Path(args.run) / "eval" / "human.json", json_safe(result))
    print(text, end="", flush=True)
    return result
