"""bench/crisis_guard.py: how often the crisis guard interrupts ordinary talk, and what it catches.

The one place the guard's headline numbers come from (docs/SAFETY.md quotes its output):
    1. ESConv: the flag rate on the seeker messages of the HELD-OUT dialogues, the ones
       `data.split_contexts(contexts, 0.25, seed=0)` keeps out of training (the split the
       evaluation makes of a file without official splits). The few real risk messages in them,
       labelled by hand by (dialogue line, text hash) in data/safety_esconv_labels.jsonl, are
       counted apart: "risky" ones the guard should catch, "context" ones (risky only given the
       earlier turns) neither way. Every other flag is a false alarm and is listed.
    2. Empathetic Dialogues (with --ed): the flag rate on the held-out conversations' messages.
    3. Each blind list (tests/fixtures/safety_blind_v*.jsonl, written by people who never saw the
       guard): recall on the risky messages, overall and per kind, and the flag rate on the
       near-misses; every miss and every false alarm is listed.
    4. Timing: the first check (model load) and a batch.
ESConv and Empathetic Dialogues are not part of the project (CC BY-NC): give your own copies.

Run from the repo root (~5 min on 2 CPU cores):
    python bench/crisis_guard.py --esconv path/to/esconv/train.jsonl --ed path/to/ed/valid.csv
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import data                       # noqa: E402
from extras import datasets, safety  # noqa: E402

LABELS = ROOT / "data" / "safety_esconv_labels.jsonl"


def held_out_contexts(path: str) -> list:
    """The held-out quarter of a dataset file's contexts, its splits (if any) pooled in file order."""
    contexts = [c for part in datasets.load_splits(path, "support").values() for c in part]
    return data.split_contexts(contexts, 0.25, seed=0)[1]


def text_hash(text: str) -> str:
    """The 12-hex-digit SHA-256 prefix that the hand labels use to name a message."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def esconv_held_out(path: str) -> list[dict]:
    """Seeker messages of the held-out ESConv dialogues: {"text", "line", "label", "kind"}.

    "line" is the dialogue's line (or array position) in the file, as in the context id
    "esconv-<line>"; "label" is "risky", "context" or "" from the hand labels.
    """
    labels = {(r["line"], r["sha256"]): r for r in map(json.loads, LABELS.read_text().splitlines())}
    held_out = held_out_contexts(path)
    messages = []
    for context in held_out:
        line = int(context.id.rsplit("-", 1)[1])
        for turn in context.turns:
            if turn["speaker"] == "user":
                label = labels.get((line, text_hash(turn["text"])), {})
                messages.append({"text": turn["text"], "line": line,
                                 "label": label.get("label", ""), "kind": label.get("kind", "")})
    return messages


def ed_held_out(path: str) -> list[str]:
    """Every message of the held-out Empathetic Dialogues conversations (their first messages
    where the file has only those, as the shared copies do)."""
    held_out = held_out_contexts(path)
    texts = []
    for context in held_out:
        turns = [t["text"] for t in context.turns if t["speaker"] == "user"]
        texts += turns or [context.first_message]
    return texts


def show(flag: safety.CrisisFlag, text: str) -> str:
    """One listed message: score, category, the text cut to 150 characters."""
    score = "  n/a" if flag.score is None else f"{flag.score:+5.1f}"
    return f"    {score} {flag.category or '-':22s} {text[:150]!r}"


def bench_esconv(guard: safety.CrisisGuard, path: str) -> None:
    messages = esconv_held_out(path)
    flags = guard.check_many([m["text"] for m in messages])
    flagged = [f.flagged for f in flags]
    dialogues = {m["line"] for m in messages}
    print(f"ESConv held-out: {len(messages)} seeker messages in {len(dialogues)} dialogues")
    print(f"  flagged {sum(flagged)} ({sum(flagged) / len(messages):.2%})")
    for label in ("risky", "context"):
        idx = [i for i, m in enumerate(messages) if m["label"] == label]
        print(f"  hand-labelled {label}: {sum(flagged[i] for i in idx)} of {len(idx)} flagged")
        for i in idx:
            print(("  caught" if flagged[i] else "  missed") + show(flags[i], messages[i]["text"]))
    false = [i for i, m in enumerate(messages) if flagged[i] and not m["label"]]
    ordinary = sum(not m["label"] for m in messages)
    print(f"  false alarms: {len(false)} of {ordinary} unlabelled messages "
          f"({len(false) / ordinary:.2%}); stopped dialogues: "
          f"{len({messages[i]['line'] for i in false})} of {len(dialogues)}")
    for i in false:
        print(show(flags[i], messages[i]["text"]))


def bench_ed(guard: safety.CrisisGuard, path: str) -> None:
    texts = ed_held_out(path)
    flags = guard.check_many(texts)
    print(f"Empathetic Dialogues held-out: {sum(f.flagged for f in flags)} of {len(texts)} "
          f"messages flagged ({sum(f.flagged for f in flags) / len(texts):.2%})")
    for flag, text in zip(flags, texts):
        if flag.flagged:
            print(show(flag, text))


def bench_blind(guard: safety.CrisisGuard, path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    flags = guard.check_many([r["text"] for r in rows])
    risky = [i for i, r in enumerate(rows) if r["risky"]]
    near = [i for i, r in enumerate(rows) if not r["risky"]]
    caught = sum(flags[i].flagged for i in risky)
    alarms = sum(flags[i].flagged for i in near)
    print(f"{path.name}: recall {caught}/{len(risky)} = {caught / len(risky):.3f}; near-miss "
          f"flag rate {alarms}/{len(near)} = {alarms / len(near):.3f}")
    by_kind = defaultdict(list)
    for i in risky:
        by_kind[rows[i].get("kind", "")].append(flags[i].flagged)
    # The guard's two weak spots, pooled over every kind named for them (a list may split
    # "indirect" into indirect_burden, indirect_goodbye, ...).
    for group in ("third_party", "indirect"):
        members = [kind for kind in by_kind if kind.startswith(group)]
        if len(members) > 1:
            by_kind[f"{group}_* (all)"] = [f for kind in members for f in by_kind[kind]]
    for kind, got in sorted(by_kind.items()):
        print(f"    risky kind {kind or '(none)':28s} {sum(got)}/{len(got)} "
              f"= {sum(got) / len(got):.2f}")
    for i in risky:
        if not flags[i].flagged:
            print("  missed" + show(flags[i], rows[i]["text"]))
    for i in near:
        if flags[i].flagged:
            print("  false alarm" + show(flags[i], rows[i]["text"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--esconv", help="ESConv train.jsonl (or the official ESConv.json)")
    parser.add_argument("--ed", help="Empathetic Dialogues valid.csv (or valid_contexts.jsonl)")
    parser.add_argument("--blind", nargs="*", type=Path,
                        default=sorted((ROOT / "tests" / "fixtures").glob("safety_blind_v*.jsonl")),
                        help="blind lists (JSON lines with text, risky, kind)")
    args = parser.parse_args()
    guard = safety.CrisisGuard()
    started = time.time()
    guard.check("hello")
    print(f"guard: {guard.describe()}; first check {time.time() - started:.1f} s (model load)")
    started = time.time()
    guard.check_many([f"Day {i} of the course went fine, my sister called me after class"
                      for i in range(64)])
    print(f"a batch of 64 short messages: {time.time() - started:.2f} s\n")
    if args.esconv:
        bench_esconv(guard, args.esconv)
        print()
    if args.ed:
        bench_ed(guard, args.ed)
        print()
    for path in args.blind:
        bench_blind(guard, path)
        print()


if __name__ == "__main__":
    try:
        main()
    except data.UserError as err:               # a wrong path: one line, not a traceback
        sys.exit(f"error: {err}")
