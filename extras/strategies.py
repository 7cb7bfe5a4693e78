"""extras/strategies.py: two persona-function classifiers learnt from human labels, and how good they are.

ESConv (Liu et al. 2021) labels each of its supporter turns with the strategy it uses (data.SUPPORT_STRATEGIES:
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

    python mascot.py strategies --esconv path/to/esconv/train.jsonl     (~3 min on 2 CPU cores)
"""

import json
import random
import sys
from collections import Counter
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # the project's modules, from the repo root
import grpo  # noqa: E402
import models  # noqa: E402
from data import HERE, SUPPORT_STRATEGIES, PersonaSet, UserError, flag_type, load_personas, split_contexts  # noqa: E402
from director import director_messages  # noqa: E402
from extras.evaluators import EQUAL_TOKENS  # noqa: E402
from judge import StrategyClassifier, strategy_features  # noqa: E402
from metrics import standard_error, words  # noqa: E402
from simulate import SAFETY, USER, Conversation, Directive, Turn, least_spoken_agent  # noqa: E402


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
    own = torch.tensor([[float(s in mine) for mine in strategies] for s in SUPPORT_STRATEGIES])   # (8, P)
    return probs @ own.to(probs.dtype)                                                   # (N, P)


# --- The evaluator: which persona's job does a turn do, by an n-gram model of the labels -------------
def text_ngrams(text: str) -> set[str]:
    """The word 1- and 2-grams of a text (lower-cased words, metrics.words)."""
    w = words(text)
    return set(w) | {f"{a} {b}" for a, b in zip(w, w[1:])}


def ngrams(texts: list[str], min_count: int = 3, size: int = 5000) -> list[str]:
    """A vocabulary: the `size` n-grams found in the most texts, each in at least `min_count` of them."""
    counts = Counter(g for t in texts for g in text_ngrams(t))
    return sorted(g for g, n in counts.most_common(size) if n >= min_count)


class FunctionEvaluator:
    """p(strategy | reply) = softmax(W x + b), x the reply's word 1-2-grams (binary, (V,)): ESConv's
    strategy labels learnt by a model of another family than the judge's (no embedding, no
    conversation), from other dialogues (`python mascot.py strategies`). A turn's predicted persona is the
    one whose strategies (personas.json "esconv_strategies") get the most mass; "persona function"
    = 1 if that is its speaker, also from the first EQUAL_TOKENS tokens only (length cannot help)."""
    FILE = HERE / "data" / "persona_function_evaluator.safetensors"

    def __init__(self, tok, personas: PersonaSet, path: str | Path = FILE, vocab: list[str] | None = None):
        self.tok, self.personas = tok, personas
        if vocab is None:                                            # the shipped model, else one being fitted
            if not Path(path).is_file():
                raise UserError(f"{path}: no persona-function evaluator; fit one with `python mascot.py strategies`")
            with safe_open(str(path), "pt") as f:
                vocab, self.weight, self.bias = json.loads(f.metadata()["vocab"]), f.get_tensor("weight"), f.get_tensor("bias")
        self.vocab, self.index = vocab, {g: i for i, g in enumerate(vocab)}

    def features(self, texts: list[str]) -> torch.Tensor:
        x = torch.zeros(len(texts), len(self.vocab))                                 # (N, V)
        for i, t in enumerate(texts):
            x[i, [self.index[g] for g in text_ngrams(t) if g in self.index]] = 1.0
        return x

    def probs(self, texts: list[str]) -> torch.Tensor:
        return torch.softmax(self.features(texts) @ self.weight.T + self.bias, dim=-1)     # (N, 8)

    def predicted(self, texts: list[str]) -> list[str]:                              # the persona doing the most
        mass = function_mass(self.probs(texts), [p.esconv_strategies for p in self.personas.personas])   # (N, P)
        return [self.personas.names()[k] for k in mass.argmax(-1).tolist()]

    def score(self, items: list[tuple[str, str]]) -> list[dict]:
        """{"function", "function_equal"} per (speaker, reply): 1.0 / 0.0; None for a speaker whose card
        lists no strategy (the meeting set has no human labels)."""
        labelled = {p.name for p in self.personas.personas if p.esconv_strategies}
        replies = [r for _, r in items]
        heads = [self.tok.decode(self.tok(r, add_special_tokens=False)["input_ids"][:EQUAL_TOKENS]) for r in replies]
        full, head = (self.predicted(replies), self.predicted(heads)) if items else ([], [])
        return [{"function": float(f == s), "function_equal": float(h == s)} if s in labelled else
                {"function": None, "function_equal": None} for (s, _), f, h in zip(items, full, head)]


def fit_softmax(x: torch.Tensor, y: torch.Tensor, l2: float, steps: int = 300):
    """Multinomial logistic regression: mean cross-entropy + l2 |W|^2 by full-batch L-BFGS (convex: no
    seed matters). x (N, F), y (N,) -> W (8, F), b (8,)."""
    w = torch.zeros(len(SUPPORT_STRATEGIES), x.shape[1], requires_grad=True)
    b = torch.zeros(len(SUPPORT_STRATEGIES), requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w ** 2).sum()
        loss.backward()
        return loss
    opt.step(closure)
    return w.detach(), b.detach()


def calibration(probs: torch.Tensor, y: torch.Tensor, bins: int = 10) -> tuple[float, list[dict]]:
    """Expected calibration error: |accuracy - mean top probability| per equal-width bin of the top
    probability, weighted by the bin's share of turns (0: what it says is what it gets); and the bins."""
    conf, pred = probs.max(-1)
    table, ece = [], 0.0
    for k in range(bins):
        inside = (conf > k / bins) & (conf <= (k + 1) / bins)
        if inside.any():
            acc, mean = (pred[inside] == y[inside]).float().mean().item(), conf[inside].mean().item()
            ece += inside.float().mean().item() * abs(acc - mean)
            table.append({"bin": f"({k / bins:.1f}, {(k + 1) / bins:.1f}]", "n": int(inside.sum()), "confidence": mean,
                          "accuracy": acc})
    return ece, table


def per_class(pred: torch.Tensor, y: torch.Tensor, names: list[str]) -> list[dict]:
    """Precision and recall of each class; None where undefined (never predicted, no example)."""
    rate = lambda hits, n: hits / n if n else None                      # noqa: E731
    return [{"class": name, "n": int((y == k).sum()), "precision": rate(int(((pred == k) & (y == k)).sum()),
             int((pred == k).sum())), "recall": rate(int(((pred == k) & (y == k)).sum()), int((y == k).sum()))}
            for k, name in enumerate(names)]


def measure(probs: torch.Tensor, y: torch.Tensor, personas) -> dict:
    """Held-out figures of (N, 8) strategy probabilities against the labels y (N,), with the majority
    class beside each accuracy."""
    strategies = [p.esconv_strategies for p in personas.personas]
    owner = torch.tensor([next((j for j, mine in enumerate(strategies) if s in mine), -1) for s in SUPPORT_STRATEGIES])
    y_persona, mapped = owner[y], owner[y] >= 0                          # "Others" is no persona's job
    pred_persona = function_mass(probs[mapped], strategies).argmax(-1)
    ece, table = calibration(probs, y)
    return {"n": len(y), "strategy_accuracy": (probs.argmax(-1) == y).float().mean().item(),
            "strategy_majority": torch.bincount(y).max().item() / len(y), "n_persona": int(mapped.sum()),
            "persona_accuracy": (pred_persona == y_persona[mapped]).float().mean().item(),
            "persona_majority": torch.bincount(y_persona[mapped]).max().item() / int(mapped.sum()),
            "strategies": per_class(probs.argmax(-1), y, SUPPORT_STRATEGIES),
            "personas": per_class(pred_persona, y_persona[mapped], personas.names()), "ece": ece, "calibration": table}


def print_report(title: str, r: dict) -> None:
    fmt = lambda v: "-" if v is None else f"{v:.3f}"                   # noqa: E731
    print(f"\n{title}: {r['n']} held-out supporter turns; strategy accuracy (8-way) {r['strategy_accuracy']:.3f} "
          f"(majority class {r['strategy_majority']:.3f}); persona accuracy (4-way, the {r['n_persona']} turns whose "
          f"strategy is a persona's job) {r['persona_accuracy']:.3f} (majority {r['persona_majority']:.3f})\n"
          f"  {'class':<28} {'n':>5} {'precision':>9} {'recall':>7}")
    print("\n".join(f"  {c['class']:<28} {c['n']:>5} {fmt(c['precision']):>9} {fmt(c['recall']):>7}"
                    for c in r["strategies"] + r["personas"]))
    print(f"  expected calibration error {r['ece']:.3f}; per bin of the top probability, mean / accuracy (n): " +
          ", ".join(f"{b['bin']} {b['confidence']:.2f} / {b['accuracy']:.2f} ({b['n']})" for b in r["calibration"]))


def main(argv: list[str], cli) -> int:
    p = cli.Parser(prog="mascot.py strategies", formatter_class=cli.Formatter,
                                description="fit the judge's and the evaluator's persona-function classifiers on ESConv")
    p.add_argument("--esconv", required=True, help="ESConv: the official ESConv.json or a JSON-lines file of dialogues")
    p.add_argument("--personas", default=str(HERE / "personas.json"), help="persona file (its support set maps strategies)")
    p.add_argument("--held-out", type=flag_type("--held-out", float, "fraction"), default=0.25,
                   help="share of dialogues held out, as `train --held-out` (never seen by either classifier)")
    p.add_argument("--seed", type=int, default=0, help="the split's seed, as `train --seed`")
    # Each L2 penalty had the lowest log-loss on a validation fifth of its classifier's training dialogues.
    p.add_argument("--l2", type=flag_type("--l2", float, "non-negative"), default=3e-4, help="the judge's L2 penalty")
    p.add_argument("--evaluator-l2", type=flag_type("--evaluator-l2", float, "non-negative"), default=1e-3,
                   help="the evaluator's L2 penalty")
    p.add_argument("--judge-out", default=str(StrategyClassifier.FILE), help="the judge's classifier (safetensors)")
    p.add_argument("--evaluator-out", default=str(FunctionEvaluator.FILE), help="the evaluator (safetensors)")
    args = p.parse_args(argv[1:])
    personas = load_personas(args.personas, "support")
    require_mapping(personas, "--personas")                          # the classifiers map strategies through the cards
    contexts = [c for part in cli.read_data(args.esconv, "support").values() for c in part]
    train, held = split_contexts(contexts, args.held_out, args.seed)
    halves = classifier_halves(train, args.seed)
    rows = {name: labelled_turns(part) for name, part in (("judge", halves[0]), ("evaluator", halves[1]), ("held-out", held))}
    if not all(rows.values()):
        raise UserError(f"--esconv {args.esconv}: {', '.join(f'{len(v)} {k}' for k, v in rows.items())} labelled "
                        "supporter turns; each part needs some (is this ESConv?)")
    print(f"{len(contexts)} dialogues: {len(halves[0])} for the judge's classifier, {len(halves[1])} for "
          f"the evaluator's, {len(held)} held out; " + ", ".join(f"{len(v)} {k} turns" for k, v in rows.items()))
    y = {k: torch.tensor([r[3] for r in v]) for k, v in rows.items()}

    encoder = models.SentenceEncoder()                               # the judge's: MiniLM, reply and message
    x = {k: strategy_features(encoder, [r[2] for r in rows[k]], [r[1] for r in rows[k]]) for k in ("judge", "held-out")}
    w, b = fit_softmax(x["judge"], y["judge"], args.l2)
    report = measure(torch.softmax(x["held-out"] @ w.T + b, -1), y["held-out"], personas)
    print_report("the judge's classifier (MiniLM + logistic regression)", report)
    save(args.judge_out, w, b, {"report": report, "dialogues": len(halves[0]), "data": Path(args.esconv).name})

    vocab = ngrams([r[2] for r in rows["evaluator"]])                # the evaluator's: word n-grams of the reply
    ev = FunctionEvaluator(None, personas, vocab=vocab)
    ev.weight, ev.bias = w, b = fit_softmax(ev.features([r[2] for r in rows["evaluator"]]), y["evaluator"], args.evaluator_l2)
    report = measure(ev.probs([r[2] for r in rows["held-out"]]), y["held-out"], personas)
    print_report("the evaluator's classifier (word 1-2-grams + logistic regression)", report)
    save(args.evaluator_out, w, b, {"report": report, "vocab": vocab, "dialogues": len(halves[1]),
                                    "data": Path(args.esconv).name})
    return 0


def classifier_halves(train, seed: int) -> tuple[list, list]:
    """The training dialogues halved, by dialogue, between the judge's classifier and the evaluator's: anything that
    learns from ESConv beside the judge (the speakers' warm start, extras/sft.py) keeps to the judge's half."""
    ids = sorted({c.id for c in train})
    judge_ids = set(random.Random(seed).sample(ids, len(ids) // 2))
    return [c for c in train if c.id in judge_ids], [c for c in train if c.id not in judge_ids]


# --- The director's warm start on what real supporters did next (train --director-warmup-data) --------
# personas.json says whose job each strategy is (in ESConv's words, Affirmation and Reassurance "affirm[s]
# the help-seeker's strengths", Beacon's job; Self-disclosure, "divulge similar experiences ... to express
# your empathy", is validation, Anchor's); here, the Action and Tone of a directive for each. "Others"
# (greetings, thanks) is nobody's job: such a turn stays in the history, never a target.
STRATEGY_DIRECTIVES = {
    "Question": ("ask a probing question", "curious"),
    "Restatement or Paraphrasing": ("reflect back what was said", "calm and steady"),
    "Reflection of feelings": ("validate the feeling", "warm"),
    "Self-disclosure": ("share a similar feeling so they feel less alone", "gentle"),
    "Affirmation and Reassurance": ("name a strength", "encouraging"),
    "Providing Suggestions": ("suggest one small step", "practical"),
    "Information": ("share useful information", "thoughtful"),
}
MAX_POSITION = 8    # the first 8 supporter turns cover ESConv's exploration -> comfort -> action arc


def directive_for(strategy: str, personas) -> Directive | None:
    """The directive a supporter turn of this strategy answers: its persona (the card that lists the
    strategy), the strategy's action and tone; None for a strategy no card lists."""
    agent = next((p.name for p in personas.personas if strategy in p.esconv_strategies), None)
    return Directive(agent, *STRATEGY_DIRECTIVES[strategy]) if agent and strategy in STRATEGY_DIRECTIVES else None


def esconv_prefix(context, end: int, personas) -> Conversation:
    """The first `end` recorded turns of an ESConv dialogue as one of our group conversations: each
    supporter turn is spoken by the persona its strategy maps to, an unmapped one by the least-spoken."""
    conv = Conversation(context, personas.name, "average", "esconv", 0)
    for turn in context.turns[:end]:
        if turn["speaker"] == "user":
            conv.turns.append(Turn(USER, turn["text"]))
        else:
            d = directive_for(turn.get("strategy", ""), personas) or Directive(least_spoken_agent(personas, conv))
            conv.turns.append(Turn(d.agent, turn["text"], d))
    return conv


def require_mapping(personas, flag: str = "--director-warmup-data") -> None:
    if not any(p.esconv_strategies for p in personas.personas):
        raise UserError(f"{flag}: no persona of the '{personas.name}' set lists esconv_strategies; use --set support or cards that do")


def esconv_turns(contexts, personas, balanced: bool = False) -> list[tuple]:
    """(dialogue, turn index, target directive) of every supporter turn with a mapped strategy among the first
    MAX_POSITION of each dialogue; balanced=True leaves out a turn whose target spoke last (a companion
    speaking twice running, which the balance term penalises)."""
    require_mapping(personas)
    turns = []
    for context in contexts:
        speakers = [t.speaker for t in esconv_prefix(context, len(context.turns), personas).turns]
        supporter = [j for j, t in enumerate(context.turns) if t["speaker"] == "supporter"][:MAX_POSITION]
        for k, j in enumerate(supporter):
            target = directive_for(context.turns[j].get("strategy", ""), personas)
            if target and not (balanced and k and target.agent == speakers[supporter[k - 1]]):
                turns.append((context, j, target))
    if not turns:
        raise UserError("--director-warmup-data: no usable supporter turn with an ESConv strategy label"
                        + ("; with --warmup-balanced every one repeats the companion before it" if balanced else
                           "; is this ESConv (ESConv.json or its JSON-lines split)?"))
    return turns


def esconv_examples(contexts, personas, n: int, seed: int = 0, balanced: bool = False) -> list[tuple[list[dict], str]]:
    """n (director prompt, target directive) pairs: what real supporters did next, mapped onto the companions.
    Natural (the default): drawn uniformly from esconv_turns, so each companion is a target as often as its
    strategies were used and the same one may speak twice running, as real supporters do (a quarter of the
    turns); the director learns ESConv's own odds at each point of a dialogue. balanced=True: the SAME number
    for every agent and no repeats, a flat prior that leaves the conversation as the only cue; it agrees less often
    with real supporters on held-out dialogues (docs/RESULTS.md, section 4)."""
    turns, rng = esconv_turns(contexts, personas, balanced), random.Random(seed)
    if balanced:
        pools = [[t for t in turns if t[2].agent == a] for a in personas.names()]
        pools, chosen = [p for p in pools if p], []
        for k, pool in enumerate(pools):
            share = n // len(pools) + (k < n % len(pools))
            chosen += rng.sample(pool, share) if share <= len(pool) else [rng.choice(pool) for _ in range(share)]
        rng.shuffle(chosen)
    else:
        chosen = rng.sample(turns, n) if n <= len(turns) else [rng.choice(turns) for _ in range(n)]
    return [(director_messages(personas, esconv_prefix(c, j, personas)), f"Agent: {d.agent}\nAction: {d.action}\n"
             f"Tone: {d.tone}") for c, j, d in chosen]


@torch.no_grad()
def next_agent_agreement(model, tok, personas, contexts, n: int = 300, seed: int = 0) -> dict:
    """How often a director names the companion that a real supporter's next turn maps to, on up to n annotated
    turns of `contexts` (dialogues it never trained on; natural targets): its pick is the name likeliest to follow
    "Agent:", read from one forward at each name's first token (names that share one are scored whole). Beside
    it: `majority`, what always naming the commonest target would get."""
    turns = esconv_turns(contexts, personas)
    turns, names = random.Random(seed).sample(turns, min(n, len(turns))), personas.names()
    name_ids = [tok(" " + a, add_special_tokens=False)["input_ids"] for a in names]
    firsts, dev = [ids[0] for ids in name_ids], next(model.parameters()).device
    distinct = len(set(firsts)) == len(names)
    model.eval()
    hits = []
    for c, j, target in turns:
        chat = tok.apply_chat_template(director_messages(personas, esconv_prefix(c, j, personas)), tokenize=False,
                                       add_generation_prompt=True)
        ids = tok(chat + "Agent:", add_special_tokens=False)["input_ids"]
        if distinct:
            scores = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[0, -1, firsts]       # (A,)
        else:
            logps, mask = grpo.target_logprobs(model, tok.pad_token_id, [(ids, t) for t in name_ids])    # (A, C)
            scores = (logps * mask).sum(1)                                                                  # (A,)
        hits.append(float(names[int(scores.argmax())] == target.agent))
    common = Counter(t[2].agent for t in turns).most_common(1)[0][1]
    return {"agreement": sum(hits) / len(hits), "se": standard_error(hits), "n": len(hits),
            "majority": common / len(hits)}


def warm_start_examples(contexts, personas, n: int, held_out: float, seed: int, balanced: bool):
    """mascot.py's ESConv warm start: n examples from the training split of the ESConv dialogues, where they came
    from, and the held-out next-agent agreement of a director (model, tok) on the held-out split."""
    train, held = split_contexts(contexts, held_out, seed)
    source = f"ESConv strategy warm start: {len(train)} training dialogues{', balanced' if balanced else ''}"
    return (esconv_examples(train, personas, n, seed, balanced), source,
            lambda model, tok: next_agent_agreement(model, tok, personas, held, seed=seed))


# --- The group reward's grounded terms (train --stage 2 --director-warmup-data ESCONV) ---------------------------
class Grounding:
    """director.block_reward's two terms from human labels, each a mean over the block's agent turns in [0, 1]:
      plausible  E_q[P(s | stage, previous)] / max_s P(s | stage, previous): q is the judge's strategy classifier's
                 reading of the turn (judge.StrategyClassifier), P how often ESConv's supporters used strategy s
                 at that stage (supporter turns so far: 0, 1, 2, 3+) after the previous one (the classifier's top
                 reading of the agent turn before; none at the start), counted on the training dialogues with
                 add-one smoothing. 1: the turn did what real supporters most often do at that point.
      compliant  q's mass on what the directive asked, chance-corrected: (q(A) - pi(A)) / (1 - pi(A)), A the strategy
                 whose warm-start action (STRATEGY_DIRECTIVES) its Action names, else the strategies of the speaker's
                 card (a rule's directive names no action), pi(A) the share of training turns labelled in A. 1: did
                 what was asked, 0: as often as any supporter turn would, so one strategy asked for is not held
                 to a lower mark than a card's three.
    Held-out dialogues (held_out, seed: the run's split) are left out of the counts."""

    def __init__(self, contexts, personas, encoder, held_out: float, seed: int):
        require_mapping(personas)
        self.classifier, self.personas, start = StrategyClassifier(encoder), personas, len(SUPPORT_STRATEGIES)
        counts = torch.ones(4, start + 1, start)                       # (stage, previous or start, strategy)
        seen = torch.ones(start)                                       # (strategy,): its labels, add-one
        for context in split_contexts(contexts, held_out, seed)[0]:
            labels = [SUPPORT_STRATEGIES.index(t["strategy"]) for t in context.turns
                      if t["speaker"] != "user" and t.get("strategy") in SUPPORT_STRATEGIES]
            for k, s in enumerate(labels):
                counts[min(k, 3), labels[k - 1] if k else start, s] += 1
                seen[s] += 1
        self.transition = counts / counts.sum(-1, keepdim=True)        # (4, 9, 8): P(s | stage, previous)
        self.prior = seen / seen.sum()                                 # (8,): pi(s)

    def __call__(self, conv: Conversation, start: int) -> dict[str, float]:
        agent = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
        first = next((k for k, i in enumerate(agent) if i >= start), len(agent))
        if first == len(agent):
            return {"plausible": 0.0, "compliant": 0.0}
        before = min(first, 1)                     # the agent turn before the block is read for its strategy only
        read = agent[first - before:]
        said = [next((t.text for t in reversed(conv.turns[:i]) if t.speaker == USER), conv.context.situation)
                for i in read]                                         # what each turn answers
        q = self.classifier.probs([conv.turns[i].text for i in read], said)                   # (M, 8)
        plausible, compliant = [], []
        for m in range(before, len(read)):
            k, turn = first - before + m, conv.turns[read[m]]          # k: agent turns before this one
            p = self.transition[min(k, 3), int(q[m - 1].argmax()) if m else len(SUPPORT_STRATEGIES)]   # (8,)
            plausible.append(float(q[m] @ p / p.max()))
            action = turn.directive.action.lower() if turn.directive else ""
            asked = [s for s, (a, _) in STRATEGY_DIRECTIVES.items() if a in action] \
                or self.personas.find(turn.speaker).esconv_strategies
            ix = [SUPPORT_STRATEGIES.index(s) for s in asked]
            compliant.append(float((q[m, ix].sum() - self.prior[ix].sum()) / (1 - self.prior[ix].sum())))
        return {"plausible": sum(plausible) / len(plausible), "compliant": sum(compliant) / len(compliant)}


def save(path: str, w: torch.Tensor, b: torch.Tensor, meta: dict) -> None:
    save_file({"weight": w.contiguous(), "bias": b.contiguous()}, path,
              metadata={"strategies": json.dumps(SUPPORT_STRATEGIES), **{k: json.dumps(v) for k, v in meta.items()}})
    print(f"saved {path}")
