"""extras/persona_id_cut.py: persona identification with every agent turn cut to the same length.

Not a chapter: a check. The independent evaluator (persona_id.py) names the persona card under
which the frozen base model finds a turn most likely, comparing SUMMED log-probabilities; a longer
turn gives it more evidence, so a system whose replies grew can gain accuracy at the same per-token
distinctiveness. This rescoring removes length: every agent turn of two systems' transcripts is cut
to its first --tokens tokens (turns shorter than that are left out), scored under every card as
evaluate.py scores it, and the two systems are compared conversation by conversation (same
contexts and seeds), with the same 95% bootstrap as evaluate's paired change.

    python extras/persona_id_cut.py --transcripts runs/s1cpu/eval/transcripts.jsonl --tokens 32
    python extras/persona_id_cut.py --transcripts FILE --a mascot-c --b round-robin --tokens 24 --model tiny

On the 2-core CPU, 48 conversations x 4 agent turns x 2 systems take about 12 minutes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import data  # noqa: E402
import evaluate  # noqa: E402
import models  # noqa: E402
import persona_id  # noqa: E402
from simulate import SAFETY, USER  # noqa: E402


def cut_items(conversations: list[dict], tokenizer, tokens: int) -> tuple[list, list[int]]:
    """(items, conversation index of each): every agent turn cut to its first `tokens` tokens."""
    items, owner = [], []
    for n, c in enumerate(conversations):
        for i, t in enumerate(c["turns"]):
            if t["speaker"] in (USER, SAFETY):
                continue
            ids = tokenizer(t["text"].strip(), add_special_tokens=False)["input_ids"]
            if len(ids) < tokens:
                continue
            history = [(u["speaker"], u["text"]) for u in c["turns"][:i]]
            items.append(persona_id.Item(t["speaker"], c["situation"], history, tokenizer.decode(ids[:tokens])))
            owner.append(n)
    return items, owner


def per_conversation(scores: list[dict], owner: list[int], n: int, key: str) -> list[float | None]:
    """The mean of `key` over each conversation's scored turns (None without one)."""
    sums = [[] for _ in range(n)]
    for s, o in zip(scores, owner):
        if s[key] is not None:
            sums[o].append(s[key])
    return [sum(v) / len(v) if v else None for v in sums]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--transcripts", required=True, help="RUN/eval/transcripts.jsonl of an evaluation")
    ap.add_argument("--a", default="mascot-c", help="system whose change is measured")
    ap.add_argument("--b", default="round-robin", help="reference system")
    ap.add_argument("--tokens", type=int, default=32, help="every agent turn is cut to this many tokens")
    ap.add_argument("--model", default=models.EMBEDDED, help="the frozen base model (as evaluate --model)")
    ap.add_argument("--personas", default="personas.json")
    ap.add_argument("--set", default="support")
    args = ap.parse_args(argv)
    try:
        rows = data.read_jsonl(args.transcripts)
        convs = {name: [r for r in rows if r.get("system") == name] for name in (args.a, args.b)}
        for name, found in convs.items():
            if not found:
                raise data.UserError(f"{args.transcripts}: no conversations of system '{name}'")
        if [c["context_id"] for c in convs[args.a]] != [c["context_id"] for c in convs[args.b]]:
            raise data.UserError(f"{args.transcripts}: systems '{args.a}' and '{args.b}' did not see the same contexts")
        if args.tokens < 1:
            raise data.UserError(f"--tokens must be at least 1, got {args.tokens}")
        personas = data.load_personas(args.personas, args.set)
        model, tok = models.load_model(args.model, frozen=True)
    except data.UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    identifier = persona_id.PersonaIdentifier(model, tok, personas, args.model)
    n = len(convs[args.b])
    means = {}
    for name in (args.a, args.b):
        items, owner = cut_items(convs[name], tok, args.tokens)
        scores = identifier.score(items)
        means[name] = {key: per_conversation(scores, owner, n, key) for key in ("correct", "log_ratio")}
        print(f"{name}: {len(items)} agent turns of >= {args.tokens} tokens scored")
    for key, title in (("correct", "persona ID accuracy"), ("log_ratio", "persona log-ratio")):
        a, b = means[args.a][key], means[args.b][key]
        diffs = [x - y for x, y in zip(a, b) if x is not None and y is not None]
        change = evaluate.summarise(diffs, 0)
        mean_a = sum(x for x in a if x is not None) / max(1, sum(x is not None for x in a))
        mean_b = sum(y for y in b if y is not None) / max(1, sum(y is not None for y in b))
        print(f"{title}, turns cut to {args.tokens} tokens: {args.b} {mean_b:.3f}, {args.a} {mean_a:.3f}, "
              f"paired change {change['mean']:+.3f} [{change['lo']:+.3f}, {change['hi']:+.3f}] "
              f"over {change['n']} conversation pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
