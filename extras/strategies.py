"""extras/strategies.py: fit the two persona-function classifiers on human labels, and measure them.

A tool beside the method: the classifiers it writes are read by the offline judge (judge.StrategyClassifier) and
by the evaluation (FunctionEvaluator, below). ESConv (Liu et al. 2021) labels each of its supporter turns with the
strategy it uses (scenarios.SUPPORT_STRATEGIES:
Question, Restatement or Paraphrasing, Reflection of feelings, Self-disclosure, Affirmation and Reassurance,
Providing Suggestions, Information, Others). Each support persona of personas.json lists the strategies that are
its job ("esconv_strategies": a question is Catalyst's, a suggestion Guide's), so a classifier of strategies is a
classifier of persona FUNCTION. This command fits two, of different families, on disjoint dialogues:
  the judge's      judge.StrategyClassifier: MiniLM embeddings of the reply and the message it answers,
                   multinomial logistic regression (stage 1's default offline judge for the support set);
  the evaluator's  FunctionEvaluator (below): word 1-2-grams of the reply alone, logistic
                   regression; it reads no embedding and training never sees it (the evaluation's
                   "persona function" columns).
Dialogues are split, never turns (a dialogue's turns share a seeker and a supporter): the held-out part is
mascot's own (--held-out 0.25 at --seed 0 by default, as `train --data ESCONV` splits it, so no evaluated
context is in either classifier's data); the rest is halved between the two. Both are measured on the
held-out dialogues: 8-way strategy accuracy, 4-way persona accuracy (turns whose strategy is one persona's
job), precision and recall per class, and calibration (expected calibration error over 10 bins).
Simplified: both are linear (logistic regression on fixed features); no encoder is fine-tuned.

    python mascot.py strategies --esconv path/to/esconv/train.jsonl     (~3 min on 2 CPU cores)
"""

import json
from collections import Counter
from itertools import chain
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from extras.evaluators import EQUAL_TOKENS
from judge import StrategyClassifier, strategy_features
from metrics import words
from plumbing import loading
from plumbing.cli import flag_type
from plumbing.common import UserError
from plumbing.files import HERE
from scenarios import (
    SUPPORT_STRATEGIES,
    PersonaSet,
    classifier_halves,
    load_personas,
    require_mapping,
    split_contexts,
)


def labelled_turns(contexts) -> list[tuple[str, str, str, int]]:
    """(dialogue id, the seeker message it answers, supporter reply, strategy index) of every labelled
    supporter turn after the opening."""
    rows = []
    for ctx in contexts:
        message = None
        for t in ctx.turns:
            if t["speaker"] == "user":
                message = t["text"]
            elif message is not None and t.get("strategy") in SUPPORT_STRATEGIES:
                rows.append((ctx.id, message, t["text"], SUPPORT_STRATEGIES.index(t["strategy"])))
    return rows


def function_mass(probs: torch.Tensor, strategies: list[list[str]]) -> torch.Tensor:
    """(N, 8) strategy probabilities -> (N, P): the mass on each persona's own strategies. "Others"
    (small talk, thanks) is no persona's job, so a reply can do none of them."""
    own = torch.tensor(
        [[float(s in mine) for mine in strategies] for s in SUPPORT_STRATEGIES]
    )  # (8, P)
    return probs @ own.to(probs.dtype)  # (N, P)


# --- The evaluator: which persona's job does a turn do, by an n-gram model of the labels -------------
def text_ngrams(text: str) -> set[str]:
    """The word 1- and 2-grams of a text (lower-cased words, metrics.words)."""
    w = words(text)
    return set(w) | {f"{a} {b}" for a, b in zip(w, w[1:])}


def ngrams(texts: list[str], min_count: int = 3, size: int = 5000) -> list[str]:
    """A vocabulary: the `size` n-grams found in the most texts, each in at least `min_count` of them."""
    counts = Counter()  # n-gram -> how many texts have it
    for t in texts:
        counts.update(text_ngrams(t))
    return sorted(g for g, n in counts.most_common(size) if n >= min_count)


class FunctionEvaluator:
    """p(strategy | reply) = softmax(W x + b), x the reply's word 1-2-grams (binary, (V,)): ESConv's
    strategy labels learnt by a model of another family than the judge's (no embedding, no
    conversation), from other dialogues (`python mascot.py strategies`). A turn's predicted persona is the
    one whose strategies (personas.json "esconv_strategies") get the most mass; "persona function"
    = 1 if that is its speaker, also from the first EQUAL_TOKENS tokens only (length cannot help)."""

    FILE = HERE / "data" / "persona_function_evaluator.safetensors"

    def __init__(
        self, tok, personas: PersonaSet, path: str | Path = FILE, vocab: list[str] | None = None
    ):
        self.tok = tok
        self.personas = personas
        if vocab is None:  # the shipped model, else one being fitted (main sets weight and bias)
            if not Path(path).is_file():
                raise UserError(
                    f"{path}: no persona-function evaluator; fit one with `python mascot.py strategies`"
                )
            with safe_open(str(path), "pt") as f:
                vocab = json.loads(f.metadata()["vocab"])
                self.weight = f.get_tensor("weight")  # (8, V)
                self.bias = f.get_tensor("bias")  # (8,)
        self.vocab = vocab
        self.index = {g: i for i, g in enumerate(vocab)}  # n-gram -> feature column

    def features(self, texts: list[str]) -> torch.Tensor:
        """(N, V) binary features: which vocabulary n-grams each text has."""
        x = torch.zeros(len(texts), len(self.vocab))  # (N, V)
        for i, t in enumerate(texts):
            x[i, [self.index[g] for g in text_ngrams(t) if g in self.index]] = 1.0
        return x

    def probs(self, texts: list[str]) -> torch.Tensor:
        """(N, 8) p(strategy | text)."""
        return torch.softmax(self.features(texts) @ self.weight.T + self.bias, dim=-1)  # (N, 8)

    def predicted(self, texts: list[str]) -> list[str]:
        """Per text, the persona whose job it does the most of."""
        strategies = [p.esconv_strategies for p in self.personas.personas]
        mass = function_mass(self.probs(texts), strategies)  # (N, P)
        return [self.personas.names()[k] for k in mass.argmax(-1).tolist()]

    def score(self, items: list[tuple[str, str]]) -> list[dict]:
        """{"function", "function_equal"} per (speaker, reply): 1.0 / 0.0; None for a speaker whose card
        lists no strategy (the meeting set has no human labels)."""
        labelled = {p.name for p in self.personas.personas if p.esconv_strategies}
        replies = [r for _, r in items]
        heads = [
            self.tok.decode(self.tok(r, add_special_tokens=False)["input_ids"][:EQUAL_TOKENS])
            for r in replies
        ]
        if not items:
            return []
        full = self.predicted(replies)
        head = self.predicted(heads)
        scores = []
        for (speaker, _), f, h in zip(items, full, head):
            if speaker in labelled:
                scores.append(
                    {"function": float(f == speaker), "function_equal": float(h == speaker)}
                )
            else:
                scores.append({"function": None, "function_equal": None})
        return scores


def fit_softmax(x: torch.Tensor, y: torch.Tensor, l2: float, steps: int = 300):
    """Multinomial logistic regression: mean cross-entropy + l2 |W|^2 by full-batch L-BFGS (convex: no
    seed matters). x (N, F), y (N,) -> W (8, F), b (8,)."""
    w = torch.zeros(len(SUPPORT_STRATEGIES), x.shape[1], requires_grad=True)
    b = torch.zeros(len(SUPPORT_STRATEGIES), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def calibration(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> tuple[float, list[dict]]:
    """Expected calibration error: |accuracy - mean top probability| per equal-width bin of the top
    probability, weighted by the bin's share of turns (0: what it says is what it gets); and the bins."""
    conf, pred = probs.max(-1)  # (N,) the top probability and its class
    table = []
    ece = 0.0
    for k in range(bins):
        inside = (conf > k / bins) & (conf <= (k + 1) / bins)
        if inside.any():
            acc = (pred[inside] == y[inside]).float().mean().item()
            mean = conf[inside].mean().item()
            ece += inside.float().mean().item() * abs(acc - mean)
            table.append(
                {
                    "bin": f"({k / bins:.1f}, {(k + 1) / bins:.1f}]",
                    "n": int(inside.sum()),
                    "confidence": mean,
                    "accuracy": acc,
                }
            )
    return ece, table


def per_class(pred: torch.Tensor, y: torch.Tensor, names: list[str]) -> list[dict]:
    """Precision and recall of each class; None where undefined (never predicted, no example)."""
    rows = []
    for k, name in enumerate(names):
        hits = int(((pred == k) & (y == k)).sum())
        rows.append(
            {
                "class": name,
                "n": int((y == k).sum()),
                "precision": share(hits, int((pred == k).sum())),
                "recall": share(hits, int((y == k).sum())),
            }
        )
    return rows


def share(hits: int, n: int) -> float | None:
    """hits / n; None when n is 0."""
    return hits / n if n else None


def measure(probs: torch.Tensor, y: torch.Tensor, personas) -> dict:
    """Held-out figures of (N, 8) strategy probabilities against the labels y (N,), with the majority
    class beside each accuracy."""
    strategies = [p.esconv_strategies for p in personas.personas]
    owner = torch.tensor(
        [
            next((j for j, mine in enumerate(strategies) if s in mine), -1)
            for s in SUPPORT_STRATEGIES
        ]
    )
    y_persona = owner[y]  # (N,) the persona whose job each turn's strategy is, -1 for none
    mapped = y_persona >= 0  # "Others" is no persona's job
    pred_persona = function_mass(probs[mapped], strategies).argmax(-1)
    ece, table = calibration(probs, y)
    return {
        "n": len(y),
        "strategy_accuracy": (probs.argmax(-1) == y).float().mean().item(),
        "strategy_majority": torch.bincount(y).max().item() / len(y),
        "n_persona": int(mapped.sum()),
        "persona_accuracy": (pred_persona == y_persona[mapped]).float().mean().item(),
        "persona_majority": torch.bincount(y_persona[mapped]).max().item() / int(mapped.sum()),
        "strategies": per_class(probs.argmax(-1), y, SUPPORT_STRATEGIES),
        "personas": per_class(pred_persona, y_persona[mapped], personas.names()),
        "ece": ece,
        "calibration": table,
    }


def print_report(title: str, r: dict) -> None:
    """measure's figures: accuracies, precision and recall per class, calibration per bin."""
    print(
        f"\n{title}: {r['n']} held-out supporter turns; strategy accuracy (8-way) {r['strategy_accuracy']:.3f} "
        f"(majority class {r['strategy_majority']:.3f}); persona accuracy (4-way, the {r['n_persona']} turns whose "
        f"strategy is a persona's job) {r['persona_accuracy']:.3f} (majority {r['persona_majority']:.3f})\n"
        f"  {'class':<28} {'n':>5} {'precision':>9} {'recall':>7}"
    )
    print(
        "\n".join(
            f"  {c['class']:<28} {c['n']:>5} {three_places(c['precision']):>9} {three_places(c['recall']):>7}"
            for c in r["strategies"] + r["personas"]
        )
    )
    print(
        f"  expected calibration error {r['ece']:.3f}; per bin of the top probability, mean / accuracy (n): "
        + ", ".join(
            f"{b['bin']} {b['confidence']:.2f} / {b['accuracy']:.2f} ({b['n']})"
            for b in r["calibration"]
        )
    )


def three_places(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def main(argv: list[str], cli) -> int:
    """`mascot.py strategies --esconv ...`: fit both classifiers, print their held-out figures, save them."""
    args = parse_args(argv[1:], cli)
    personas = load_personas(args.personas, "support")
    require_mapping(personas, "--personas")  # the classifiers map strategies through the cards
    splits = cli.read_data(args.esconv, "support")
    contexts = list(chain.from_iterable(splits.values()))  # every split's dialogues
    train, held = split_contexts(contexts, args.held_out, args.seed)
    halves = classifier_halves(train, args.seed)  # disjoint dialogues for the two classifiers
    rows = {
        name: labelled_turns(part)
        for name, part in (("judge", halves[0]), ("evaluator", halves[1]), ("held-out", held))
    }
    if not all(rows.values()):
        raise UserError(
            f"--esconv {args.esconv}: {', '.join(f'{len(v)} {k}' for k, v in rows.items())} labelled "
            "supporter turns; each part needs some (is this ESConv?)"
        )
    print(
        f"{len(contexts)} dialogues: {len(halves[0])} for the judge's classifier, {len(halves[1])} for "
        f"the evaluator's, {len(held)} held out; "
        + ", ".join(f"{len(v)} {k} turns" for k, v in rows.items())
    )
    data = Path(args.esconv).name
    fit_judge_classifier(args, rows, personas, {"dialogues": len(halves[0]), "data": data})
    fit_function_evaluator(args, rows, personas, {"dialogues": len(halves[1]), "data": data})
    return 0


def parse_args(argv: list[str], cli):
    """The flags: the data, its split (as train's), the two L2 penalties and where to save."""
    p = cli.Parser(
        prog="mascot.py strategies",
        formatter_class=cli.Formatter,
        description="fit the judge's and the evaluator's persona-function classifiers on ESConv",
    )
    p.add_argument(
        "--esconv",
        required=True,
        help="ESConv: the official ESConv.json or a JSON-lines file of dialogues",
    )
    p.add_argument(
        "--personas",
        default=str(HERE / "personas.json"),
        help="persona file (its support set maps strategies)",
    )
    p.add_argument(
        "--held-out",
        type=flag_type("--held-out", float, "fraction"),
        default=0.25,
        help="share of dialogues held out, as `train --held-out` (never seen by either classifier)",
    )
    p.add_argument("--seed", type=int, default=0, help="the split's seed, as `train --seed`")
    # Each L2 penalty had the lowest log-loss on a validation fifth of its classifier's training dialogues.
    p.add_argument(
        "--l2",
        type=flag_type("--l2", float, "non-negative"),
        default=3e-4,
        help="the judge's L2 penalty",
    )
    p.add_argument(
        "--evaluator-l2",
        type=flag_type("--evaluator-l2", float, "non-negative"),
        default=1e-3,
        help="the evaluator's L2 penalty",
    )
    p.add_argument(
        "--judge-out",
        default=str(StrategyClassifier.FILE),
        help="the judge's classifier (safetensors)",
    )
    p.add_argument(
        "--evaluator-out", default=str(FunctionEvaluator.FILE), help="the evaluator (safetensors)"
    )
    return p.parse_args(argv)


def fit_judge_classifier(args, rows: dict, personas, meta: dict) -> None:
    """The judge's: MiniLM features of the reply and the message it answers, logistic regression."""
    y = {k: torch.tensor([r[3] for r in v]) for k, v in rows.items()}  # strategy indices
    encoder = loading.SentenceEncoder()
    x = {
        k: strategy_features(encoder, [r[2] for r in rows[k]], [r[1] for r in rows[k]])
        for k in ("judge", "held-out")
    }
    w, b = fit_softmax(x["judge"], y["judge"], args.l2)
    report = measure(torch.softmax(x["held-out"] @ w.T + b, -1), y["held-out"], personas)
    print_report("the judge's classifier (MiniLM + logistic regression)", report)
    save(args.judge_out, w, b, {"report": report, **meta})


def fit_function_evaluator(args, rows: dict, personas, meta: dict) -> None:
    """The evaluator's: word 1-2-grams of the reply alone, logistic regression."""
    y = {k: torch.tensor([r[3] for r in v]) for k, v in rows.items()}  # strategy indices
    vocab = ngrams([r[2] for r in rows["evaluator"]])
    ev = FunctionEvaluator(None, personas, vocab=vocab)
    w, b = fit_softmax(
        ev.features([r[2] for r in rows["evaluator"]]), y["evaluator"], args.evaluator_l2
    )
    ev.weight = w
    ev.bias = b
    report = measure(ev.probs([r[2] for r in rows["held-out"]]), y["held-out"], personas)
    print_report("the evaluator's classifier (word 1-2-grams + logistic regression)", report)
    save(args.evaluator_out, w, b, {"report": report, "vocab": vocab, **meta})


def save(path: str, w: torch.Tensor, b: torch.Tensor, meta: dict) -> None:
    """The weights as safetensors, the strategy names and `meta` as JSON metadata."""
    save_file(
        {"weight": w.contiguous(), "bias": b.contiguous()},
        path,
        metadata={
            "strategies": json.dumps(SUPPORT_STRATEGIES),
            **{k: json.dumps(v) for k, v in meta.items()},
        },
    )
    print(f"saved {path}")
