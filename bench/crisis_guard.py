"""bench/crisis_guard.py: how often the crisis guard interrupts ordinary talk, and what it catches.

The one place the guard's headline numbers come from (docs/SAFETY.md quotes its output):
  1. ESConv: the flag rate on the seeker messages of the HELD-OUT dialogues (the probe never trained on them); their few
     real risk messages (hand labels, data/safety_esconv_labels.jsonl) count apart: "risky" ones the guard should catch,
     "context" ones (risky only given earlier turns) neither way; every other flag is a false alarm and is listed.
  2. Empathetic Dialogues (with --ed): the flag rate on the held-out conversations' messages.
  3. Each blind list (tests/fixtures/safety_blind_v*.jsonl, written by people who never saw the guard): recall on the
     risky messages, overall and per kind, and the flag rate on the near-misses; every miss and false alarm is listed.
  4. Timing: the first check (model load) and a batch.
ESConv and Empathetic Dialogues are not part of the project (CC BY-NC): give your own copies.
A benchmark beside the method (bench/README.md lists them all). Run from the repo root (~5 min on 2 CPU cores):
    python bench/crisis_guard.py --esconv path/to/esconv/train.jsonl --ed path/to/ed/valid.csv
"""

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository root
# Run as a script, Python puts bench/ first on sys.path, not the repository root that holds the
# project's modules: add it.
sys.path.insert(0, str(ROOT))

from extras import safety
from extras.train_crisis_probe import ED_LABELS, ESCONV_LABELS, conversation_rows
from plumbing import common, files


def show(flag: safety.CrisisFlag, text: str) -> str:
    """One listed message: score, category, the text cut to 150 characters."""
    score = "  n/a" if flag.score is None else f"{flag.score:+5.1f}"
    return f"    {score} {flag.category or '-':22s} {text[:150]!r}"


def bench_esconv(guard: safety.CrisisGuard, path: str) -> None:
    """1. ESConv's held-out seeker messages: the flag rate, the hand-labelled ones, every false alarm."""
    messages = conversation_rows(path, ESCONV_LABELS, "esconv", side=1)  # the held-out dialogues
    flags = guard.check_many([m["text"] for m in messages])
    flagged = [f.flagged for f in flags]
    dialogues = {m["group"] for m in messages}
    print(f"ESConv held-out: {len(messages)} seeker messages in {len(dialogues)} dialogues")
    print(f"  flagged {sum(flagged)} ({sum(flagged) / len(messages):.2%})")
    for label in ("risky", "context"):
        idx = [i for i, m in enumerate(messages) if m["label"] == label]
        print(f"  hand-labelled {label}: {sum(flagged[i] for i in idx)} of {len(idx)} flagged")
        for i in idx:
            print(("  caught" if flagged[i] else "  missed") + show(flags[i], messages[i]["text"]))
    false = [i for i, m in enumerate(messages) if flagged[i] and not m["label"]]
    ordinary = sum(not m["label"] for m in messages)
    print(
        f"  false alarms: {len(false)} of {ordinary} unlabelled messages ({len(false) / ordinary:.2%}); "
        f"stopped dialogues: {len({messages[i]['group'] for i in false})} of {len(dialogues)}"
    )
    for i in false:
        print(show(flags[i], messages[i]["text"]))


def bench_ed(guard: safety.CrisisGuard, path: str) -> None:
    """2. Empathetic Dialogues' held-out messages: the flag rate, every flagged message."""
    texts = [r["text"] for r in conversation_rows(path, ED_LABELS, "empathetic_dialogues", side=1)]
    flags = guard.check_many(texts)
    print(
        f"Empathetic Dialogues held-out: {sum(f.flagged for f in flags)} of {len(texts)} "
        f"messages flagged ({sum(f.flagged for f in flags) / len(texts):.2%})"
    )
    for flag, text in ((f, t) for f, t in zip(flags, texts) if f.flagged):
        print(show(flag, text))


def bench_blind(guard: safety.CrisisGuard, path: Path) -> None:
    """3. One blind list: recall on its risky messages (overall and per kind), the near-misses' flag rate."""
    rows = files.read_jsonl(path)
    flags = guard.check_many([r["text"] for r in rows])
    risky = [i for i, r in enumerate(rows) if r["risky"]]
    near = [i for i, r in enumerate(rows) if not r["risky"]]
    caught = sum(flags[i].flagged for i in risky)
    alarms = sum(flags[i].flagged for i in near)
    print(
        f"{path.name}: recall {caught}/{len(risky)} = {caught / len(risky):.3f}; near-miss "
        f"flag rate {alarms}/{len(near)} = {alarms / len(near):.3f}"
    )
    by_kind = defaultdict(list)
    for i in risky:
        by_kind[rows[i].get("kind", "")].append(flags[i].flagged)
    # The guard's two weak spots, pooled over every kind named for them (indirect_burden, indirect_goodbye, ...).
    for group in ("third_party", "indirect"):
        members = [kind for kind in by_kind if kind.startswith(group)]
        if len(members) > 1:
            pooled = []
            for kind in members:
                pooled += by_kind[kind]
            by_kind[f"{group}_* (all)"] = pooled
    for kind, got in sorted(by_kind.items()):
        print(
            f"    risky kind {kind or '(none)':28s} {sum(got)}/{len(got)} = {sum(got) / len(got):.2f}"
        )
    for i in risky + near:  # every miss, then every false alarm
        if flags[i].flagged != rows[i]["risky"]:
            print(
                ("  false alarm" if flags[i].flagged else "  missed")
                + show(flags[i], rows[i]["text"])
            )


def main() -> None:
    """4. Timing first, then every benchmark whose data is given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--esconv", help="ESConv train.jsonl (or the official ESConv.json)")
    parser.add_argument("--ed", help="Empathetic Dialogues valid.csv (or valid_contexts.jsonl)")
    parser.add_argument(
        "--blind",
        nargs="*",
        type=Path,
        help="blind lists (JSON lines with text, risky, kind)",
        default=sorted((ROOT / "tests" / "fixtures").glob("safety_blind_v*.jsonl")),
    )
    args = parser.parse_args()
    guard = safety.CrisisGuard()
    started = time.time()
    guard.check("hello")
    print(f"guard: {guard.describe()}; first check {time.time() - started:.1f} s (model load)")
    started = time.time()
    guard.check_many(
        [f"Day {i} of the course went fine, my sister called me after class" for i in range(64)]
    )
    print(f"a batch of 64 short messages: {time.time() - started:.2f} s\n")
    benches = [(bench_esconv, args.esconv), (bench_ed, args.ed)]
    benches += [(bench_blind, p) for p in args.blind]
    for bench, source in benches:
        if source:  # --esconv and --ed are optional
            bench(guard, source)
            print()


if __name__ == "__main__":
    try:
        main()
    except common.UserError as err:  # a wrong path: one line, not a traceback
        sys.exit(f"error: {err}")
