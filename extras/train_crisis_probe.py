"""extras/train_crisis_probe.py: fit the crisis guard's probe (data/safety_probe.safetensors), with its cross-validation.

A tool beside the method, run once to make a file we ship. extras/safety.py reads every user message with explicit
patterns and a probe (a small network on sentence-encoder features); this script fits the probe and picks its
threshold:
  1. Labelled messages: data/safety_train.jsonl (risky messages, near-misses and ordinary chat we wrote), and as the
     negative class the user messages of ESConv and Empathetic Dialogues on the TRAINING side of their split
     (`conversation_rows`; bench/crisis_guard.py measures the other side), their few real risk messages hand-labelled.
  2. Features of every message's probe windows (safety.probe_features), cached in --cache.
  3. 5-fold cross-validation of a one-hidden-layer network (`fit_mlp`), each ESConv dialogue in one fold; threshold:
     the lowest at which the guard (probe or explicit pattern) flags at most --max-esconv of ESConv's seeker messages.
  4. The final network, fitted on everything: weights (fp16), threshold and the CV report.
Why a network: in cross-validation it caught more risky messages than a logistic regression at the same ESConv flag
rate. It scores real risk told in ESConv's long, story-like style low, so explicit patterns also flag on their own.
ESConv and Empathetic Dialogues are CC BY-NC and not part of the project: pass your own copies.
    python extras/train_crisis_probe.py --esconv path/to/esconv/train.jsonl --ed path/to/ed/valid.csv
    (~15 min on 2 CPU cores, most of it embedding; later runs reuse the cache)
"""

import argparse
import hashlib
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import chain
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]  # the repository root
# Run as a script (python extras/train_crisis_probe.py), Python puts extras/ first on sys.path, not
# the repository root that holds the project's modules: add it.
sys.path.insert(0, str(ROOT))

import scenarios
from extras import safety
from plumbing import datasets, files, loading
from plumbing.common import UserError

TRAIN_FILE = ROOT / "data" / "safety_train.jsonl"
ESCONV_LABELS = ROOT / "data" / "safety_esconv_labels.jsonl"  # hand labels of real risk messages
ED_LABELS = ROOT / "data" / "safety_ed_labels.jsonl"
# Loss weight per kind of row. Equal: the many conversation messages (what the guard meets) outweigh the near-misses.
WEIGHTS = {
    "risky": 1.0,
    "near_miss": 1.0,
    "ordinary": 1.0,
    "conversation": 1.0,
    "conversation_risky": 5.0,
}


# --- the labelled messages ---------------------------------------------------------------------
def load_training_rows(path: Path = TRAIN_FILE) -> list[dict]:
    """Rows {"text", "risky", "source", "kind"} of the labelled training file (JSON lines)."""
    if not Path(path).exists():
        raise UserError(
            f"{path}: training file not found; it ships with the repository (data/safety_train.jsonl)"
        )
    rows = files.read_jsonl(path, numbered=True)
    for number, row in rows:
        if not (
            isinstance(row.get("risky"), bool)
            and all(isinstance(row.get(k), str) for k in ("text", "source", "kind"))
        ):
            raise UserError(
                f"{path} line {number}: needs string fields 'text', 'source' and 'kind' and a true/false 'risky'"
            )
    return [row for _, row in rows]


def is_ordinary(row: dict) -> bool:
    """An everyday message with no risk vocabulary at all ("ok thanks")."""
    return row["kind"].startswith("ordinary")


def text_hash(text: str, digits: int = 12) -> str:
    """The SHA-256 prefix that names a message: 12 hex digits in the hand labels, 16 in the snapshot."""
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def conversation_rows(path: str, labels_path: Path, name: str, side: int = 0) -> list[dict]:
    """The user messages (the first message where a file has only those) of one side, 0 training or 1 held out,
    of `scenarios.split_contexts(contexts, 0.25, seed=0)`, the split the evaluation makes of a file without official
    splits (any splits of the file are pooled in file order). Rows {"text", "risky", "source": name, "kind", "group": the dialogue
    id, "label"}: the hand label by (dialogue, text hash), "risky", "context" (risky only given earlier turns) or ""."""
    labels = {}  # (dialogue id, text hash) -> hand label
    for label in files.read_jsonl(labels_path):
        dialogue = f"esconv-{label['line']}" if "line" in label else label["conv_id"]
        labels[dialogue, label["sha256"]] = label
    splits = datasets.load_splits(path, "support")
    contexts = list(chain.from_iterable(splits.values()))  # any splits pooled, in file order
    rows = []
    for context in scenarios.split_contexts(contexts, 0.25, seed=0)[side]:
        messages = [t["text"] for t in context.turns if t["speaker"] == "user"]
        for text in messages or [context.first_message]:
            label = labels.get((context.id, text_hash(text)), {})
            rows.append(
                {
                    "text": text,
                    "risky": label.get("label") == "risky",
                    "source": name,
                    "kind": label.get("kind", name),
                    "group": context.id,
                    "label": label.get("label", ""),
                }
            )
    return rows


def row_type(row: dict) -> str:
    """Which WEIGHTS entry (and which report line) a row belongs to."""
    if "group" in row:
        return "conversation_risky" if row["risky"] else "conversation"
    if row["risky"]:
        return "risky"
    return "ordinary" if is_ordinary(row) else "near_miss"


# --- features, the network, the folds --------------------------------------------------------
def window_features(encoder, rows: list[dict], cache: Path) -> tuple[torch.Tensor, list[list[int]]]:
    """(W, 5376) features of distinct probe windows and each row's indices, cached in `cache` ({"texts", "X"})."""
    windows = [safety.probe_windows(safety.blank(safety.normalise(r["text"]))) for r in rows]
    stored = torch.load(cache) if cache.exists() else {"texts": [], "X": torch.zeros(0, 5376)}
    index = {t: i for i, t in enumerate(stored["texts"])}
    distinct = dict.fromkeys(chain.from_iterable(windows))
    new = [w for w in distinct if w not in index]
    if new:
        print(f"embedding {len(new)} new windows ({len(index)} cached)", flush=True)
        stored = {
            "texts": stored["texts"] + new,
            "X": torch.cat([stored["X"], safety.probe_features(encoder, new)]),
        }
        torch.save(stored, cache)
        index = {t: i for i, t in enumerate(stored["texts"])}
    return stored["X"], [[index[w] for w in ws] for ws in windows]


@dataclass(frozen=True)
class ProbeFit:
    """How fit_mlp trains the probe: the network's width, the AdamW settings, dropout, the seed."""

    hidden: int = 256  # hidden units
    epochs: int = 10  # passes over the data
    lr: float = 1e-3
    weight_decay: float = 1e-2
    dropout: float = 0.2
    seed: int = 0  # weight init, dropout and batch order


def fit_mlp(
    X: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, fit: ProbeFit = ProbeFit()
) -> dict:
    """A one-hidden-layer network on standardised features, z = (x - mu) / sd, logit = w2 . gelu(W1 z + b1) + b2, fitted
    by weighted BCE with AdamW. mu and sd are kept apart rather than folded into W1: W1 / sd overflows fp16 (the shipped
    precision) for features that barely vary. X: (N, F) features; y: (N,) 1.0 = risky, 0.0 = not; weight: (N,) loss
    weight per row. Returns {"mu": (F,), "sd": (F,), "w1": (H, F), "b1": (H,), "w2": (H,), "b2": ()}, float32."""
    generator = torch.Generator().manual_seed(fit.seed)
    torch.manual_seed(fit.seed)  # weight init, dropout
    mu = X.mean(0)  # (F,)
    sd = X.std(0).clamp(min=1e-6)  # (F,)
    Z = (X - mu) / sd  # (N, F)
    weight = weight / weight.mean()  # (N,) mean 1: the learning rate means the same for any weights
    first = torch.nn.Linear(X.shape[1], fit.hidden)
    last = torch.nn.Linear(fit.hidden, 1)
    net = torch.nn.Sequential(first, torch.nn.GELU(), torch.nn.Dropout(fit.dropout), last)
    optimiser = torch.optim.AdamW(net.parameters(), lr=fit.lr, weight_decay=fit.weight_decay)
    for _ in range(fit.epochs):
        order = torch.randperm(len(Z), generator=generator)
        for start in range(0, len(Z), 256):
            batch = order[start : start + 256]
            logits = net(Z[batch]).squeeze(1)  # (B,)
            bce = torch.nn.functional.binary_cross_entropy_with_logits(
                logits, y[batch], reduction="none"
            )  # (B,)
            loss = bce @ weight[batch] / len(batch)  # the weighted mean over the batch
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    return {
        "mu": mu,
        "sd": sd,
        "w1": first.weight.detach(),
        "b1": first.bias.detach(),
        "w2": last.weight.detach()[0],
        "b2": last.bias.detach()[0],
    }


def group_folds(groups: list, k: int, seed: int = 0) -> list[int]:
    """A seeded fold per row: a group's rows (an ESConv dialogue) share one; rows of group None go one by one."""
    keys = sorted({g for g in groups if g is not None}, key=str)
    random.Random(seed).shuffle(keys)
    fold_of = {g: i % k for i, g in enumerate(keys)}
    loose = random.Random(seed + 1)  # the folds of rows without a group
    return [fold_of[g] if g is not None else loose.randrange(k) for g in groups]


def threshold_for_rate(logits: torch.Tensor, forced: torch.Tensor, max_rate: float) -> float:
    """The lowest threshold t at which (logit > t) or forced flags at most max_rate of the rows. `forced` marks rows an
    explicit pattern flags whatever the probe says; they use part of the budget first. Example: logits [3, 2, 1, 0],
    forced [F, F, F, T], max_rate 0.5 -> 2 rows allowed, 1 already forced, so 1 more: t = 2 (only the 3 is above it)."""
    allowed = int(max_rate * len(logits)) - int(forced.sum())  # rows the probe may still flag
    free = logits[~forced].sort(descending=True).values  # the other rows' logits, highest first
    if allowed < 0:
        raise UserError(
            f"explicit patterns alone flag {forced.float().mean():.2%} of the conversation messages, "
            f"more than --max-esconv {max_rate:.2%}"
        )
    return free[min(allowed, len(free) - 1)].item()


# --- cross-validation, report, save ---------------------------------------------------------------
def cross_validate(rows, X, windows, args) -> torch.Tensor:
    """(N,) out-of-fold logits: each message's highest window logit under a network fitted without its fold. With
    --hold-out-lists each written list stays in one fold too: closer to a list written by someone else."""
    groups = [fold_group(r, args.hold_out_lists) for r in rows]
    folds = group_folds(groups, args.folds, args.seed)
    logits = torch.empty(len(rows))  # (N,)
    for fold in range(args.folds):
        train = [i for i in range(len(rows)) if folds[i] != fold]
        probe = fit_mlp(*training_set(rows, windows, X, train), probe_fit(args))
        held = [i for i in range(len(rows)) if folds[i] == fold]
        scores = safety.mlp_logits(probe, X)  # (W,)
        logits[held] = torch.stack([scores[windows[i]].max() for i in held])
        print(f"fold {fold + 1}/{args.folds} done", flush=True)
    return logits


def fold_group(row: dict, hold_out_lists: bool) -> str | None:
    """What stays in one fold: a conversation's messages; with --hold-out-lists a written list's
    too; None: the row goes alone."""
    if row.get("group"):
        return row["group"]
    if hold_out_lists:
        return f"{row['source']}/{row['kind']}"
    return None


def probe_fit(args) -> ProbeFit:
    """The flags' ProbeFit: --hidden, --epochs, --seed; the rest at their defaults."""
    return ProbeFit(hidden=args.hidden, epochs=args.epochs, seed=args.seed)


def training_set(rows, windows, X, indices):
    """(X, y, weight) for fitting: every window of a non-risky message is a negative (the guard flags a message if ANY
    window is above the threshold); a risky message contributes its first window only (written ones are short)."""
    feats = []  # window indices into X
    labels = []
    weights = []
    for i in indices:
        use = windows[i][:1] if rows[i]["risky"] else windows[i]
        feats += use
        labels += [float(rows[i]["risky"])] * len(use)
        weights += [WEIGHTS[row_type(rows[i])] / len(use)] * len(use)
    return X[feats], torch.tensor(labels), torch.tensor(weights)


def report(rows, logits, forced, threshold) -> dict:
    """Flag rates at the threshold, per row type, per kind of risky message, per source."""
    flagged = (logits > threshold) | forced

    def rate(select) -> list:  # [flagged, rows] of the rows selected
        chosen = [i for i, r in enumerate(rows) if select(r)]
        return [sum(bool(flagged[i]) for i in chosen), len(chosen)]

    by_source = {}
    for source in sorted({r["source"] for r in rows}):
        for name in ("risky", "other"):
            by_source[f"{source} {name}"] = rate(
                lambda r: r["source"] == source and r["risky"] == (name == "risky")
            )
    return {
        "threshold": threshold,
        "by_type": {kind: rate(lambda r: row_type(r) == kind) for kind in WEIGHTS},
        "risky_by_kind": {
            kind: rate(lambda r: r["risky"] and r["kind"] == kind)
            for kind in sorted({r["kind"] for r in rows if r["risky"]})
        },
        "by_source": by_source,
    }


def print_report(out: dict) -> None:
    """The flag rates of `report`, one line per row type, kind and source."""
    print(f"threshold {out['threshold']:+.3f}; cross-validated flag rates (flagged/rows):")
    for section in ("by_type", "probe_only", "risky_by_kind", "by_source"):
        print(f"  {section}:")
        for name, (k, n) in out[section].items():
            print(f"    {name:30s} {k:5d}/{n:<6d} = {k / max(n, 1):.3f}")


def snapshot_lists() -> dict:
    """The fixture lists whose every decision tests/fixtures/safety_decisions.json records."""
    blind = sorted((ROOT / "tests" / "fixtures").glob("safety_blind_v*.jsonl"))
    return {"train": TRAIN_FILE, **{"blind_" + path.stem.rsplit("_", 1)[1]: path for path in blind}}


def write_snapshot(path: Path = ROOT / "tests" / "fixtures" / "safety_decisions.json") -> None:
    """Record [sha256(text)[:16], flagged, category] per row of every snapshot list, for the guard and its fallback."""
    guards = {"probe": safety.CrisisGuard(), "patterns_only": safety.CrisisGuard(encoder=None)}
    texts = {
        name: [r["text"] for r in files.read_jsonl(list_path)]
        for name, list_path in snapshot_lists().items()
    }
    snapshot = {
        "about": "Decisions of the shipped crisis guard (probe) and of its patterns-only fallback: per fixture "
        "list, per row in file order, [sha256(text)[:16], flagged, category]. Rewritten by `python "
        "extras/train_crisis_probe.py --snapshot` after a deliberate change.",
    }
    for mode, guard in guards.items():
        snapshot[mode] = {}
        for name, ts in texts.items():
            flags = guard.check_many(ts)
            snapshot[mode][name] = [
                [text_hash(t, 16), f.flagged, f.category] for t, f in zip(ts, flags)
            ]
    # json.dumps(indent=1) puts each of a row's three values on a line of its own: fold them back onto one.
    text = re.sub(
        r'\[\n +(".*"),\n +(true|false),\n +(".*")\n +\]',
        r"[\1, \2, \3]",
        json.dumps(snapshot, indent=1),
    )
    path.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {path}")


def save_probe(probe: dict, threshold: float, metadata: dict, path: Path) -> None:
    """W1 as fp16 (2.8 MB), the rest fp32; threshold and report as metadata."""
    from safetensors.torch import save_file

    tensors = {
        k: (v.half() if k == "w1" else v.float()).reshape(v.shape or (1,)).contiguous()
        for k, v in probe.items()
    }
    tensors["threshold"] = torch.tensor([threshold], dtype=torch.float32)
    save_file(tensors, str(path), metadata={k: json.dumps(v) for k, v in metadata.items()})


def main() -> None:
    """Fit the probe, or (--snapshot) rewrite the guard's recorded decisions."""
    parser = build_parser()
    args = parser.parse_args()
    if args.snapshot:
        return write_snapshot()
    print(f"config: {vars(args)}")
    if not args.esconv:
        parser.error("--esconv is required to fit the probe")
    torch.set_num_threads(args.threads)

    started = time.time()
    rows = load_training_rows(args.train) + conversation_rows(args.esconv, ESCONV_LABELS, "esconv")
    if args.ed:
        rows += conversation_rows(args.ed, ED_LABELS, "empathetic_dialogues")
    # A "context" row is risky only given earlier turns, which the guard never reads: left out.
    rows = [r for r in rows if r.get("label") != "context"]
    X, windows = window_features(loading.SentenceEncoder(), rows, args.cache)
    # The rows an explicit pattern flags whatever the probe says.
    forced = torch.tensor(
        [bool(safety.explicit_category(safety.blank(safety.normalise(r["text"])))) for r in rows]
    )
    logits = cross_validate(rows, X, windows, args)
    esconv = torch.tensor([r["source"] == "esconv" and not r["risky"] for r in rows])
    threshold = threshold_for_rate(logits[esconv], forced[esconv], args.max_esconv)
    out = report(rows, logits, forced, threshold)
    out["esconv_cv_flag_rate"] = ((logits > threshold) | forced)[esconv].float().mean().item()
    out["probe_only"] = report(rows, logits, torch.zeros_like(forced), threshold)["by_type"]
    print_report(out)
    print(f"ESConv training-side seeker messages flagged in CV: {out['esconv_cv_flag_rate']:.4f}")
    if args.hold_out_lists:
        return
    probe = fit_mlp(*training_set(rows, windows, X, range(len(rows))), probe_fit(args))
    metadata = {
        "report": out,
        "config": {k: str(v) for k, v in vars(args).items()},
        "train_sha256": rows_fingerprint(load_training_rows(args.train)),
    }
    save_probe(probe, threshold, metadata, args.out)
    print(f"wrote {args.out} in {time.time() - started:.0f} s")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--esconv", help="ESConv train.jsonl or ESConv.json (required to fit)")
    parser.add_argument("--ed", help="Empathetic Dialogues valid.csv (or valid_contexts.jsonl)")
    parser.add_argument("--train", type=Path, default=TRAIN_FILE, help="written labelled messages")
    parser.add_argument("--out", type=Path, default=safety.PROBE_FILE, help="weights file")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "crisis_probe_features.pt",
        help="feature cache (reused across runs)",
    )
    parser.add_argument(
        "--max-esconv",
        type=float,
        default=0.02,
        help="the threshold flags at most this share of "
        "ESConv training-side seeker messages in cross-validation (the 2%% target)",
    )
    for flag, default, about in (
        ("--hidden", 256, "hidden units of the network"),
        ("--epochs", 10, "passes over the data per fit"),
        ("--folds", 5, "cross-validation folds"),
        ("--seed", 0, "folds, initialisation, batches"),
        ("--threads", 1, "torch threads for the fits"),
    ):
        parser.add_argument(flag, type=int, default=default, help=about)
    parser.add_argument(
        "--hold-out-lists",
        action="store_true",
        help="cross-validate with each written list held "
        "out whole (an estimate for unseen authors); reports only, writes no weights",
    )
    parser.add_argument(
        "--snapshot",
        action="store_true",
        help="only rewrite tests/fixtures/safety_decisions.json with the shipped guard's decisions",
    )
    return parser


def rows_fingerprint(rows: list[dict]) -> str:
    """SHA-256 of the written labelled rows, stored with the weights: a test tells when they changed without a refit."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


if __name__ == "__main__":
    main()
