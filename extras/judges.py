"""extras/judges.py: the LLM judges beside the offline one, and how good any grader is.

mascot.make_judge builds `--judge hf:<model>` (HFJudge: a local LLM's probabilities of "A"/"B" and "1".."5") and
`rm:<folder>` (RMJudge: stage 1's reward model) here; extras/served.py's openai: judge uses this file's prompts
(data/prompts/judge_*.txt, ours: the paper's are unpublished). LLM judges prefer the reply they read first (Zheng et al.
2023), so a pairwise question is asked in both orders and counts only when they agree (combine_orders). A grader is
worth optimising only if it prefers good replies and keeps doing so when a policy searches for what it over-rewards; we
test that with best-of-N instead of RL (Gao et al. 2022), against a "gold" grader it never saw (extras/evaluators.py).
    python mascot.py judge-eval --pairs data/judge_pairs_support.jsonl    # accuracy on labelled pairs
    python mascot.py judge-eval --pairs ... --persona-id    # is the independent evaluator valid on them?
    python mascot.py judge-stress --run runs/default    # best-of-N: do a grader's picks hack? (then GRPO will)
"""

import argparse
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # the project's modules, from the repo root
import data                                                         # noqa: E402
import models                                                       # noqa: E402
import reward                                                       # noqa: E402
from data import UserError, derive_seed                              # noqa: E402
from extras.evaluators import EQUAL_TOKENS, PersonaIdentifier        # noqa: E402
from judge import Judge, ScoreJudge, Verdict, sigmoid                # noqa: E402
from metrics import binomial_two_sided_p, mean_or_none, nli_label_index, rates, standard_error, HACKS, DIAGNOSTICS  # noqa: E402
from simulate import JUDGE_TURNS, JudgeState                         # noqa: E402

# --- Reading an answer: which reply did the judge pick? -----------------------------------------
_LABEL_NAME = r"(?:(?i:reply|response|answer|option|choice)\s+)"
_PICKS = [re.compile(_LABEL_NAME + r"?(?<![A-Za-z])([AB])(?![A-Za-z])[*\"'`)\]]*\s+(?:is|was|seems)\s+"
                     r"(?:clearly\s+|much\s+|slightly\s+|the\s+)?(?i:better|stronger|preferred)"),
          re.compile(r"(?i:better(?:\s+(?:reply|response|answer|option|choice|one))?\s+is|prefer|pick|choose)"
                     r"\s+" + _LABEL_NAME + r"?[*\"'`(\[]*([AB])(?![A-Za-z])"),
          re.compile(r"^[\s\"'*`(\[]*([AB])(?![A-Za-z])"),
          re.compile(r"\b(?:reply|response|answer|option|choice)\b[\s:*\"'`(\[-]*([AB])(?![A-Za-z])", re.IGNORECASE),
          re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])")]
_ARTICLE = re.compile(r"[Aa]\s+(?!is\b|wins\b|was\b|seems\b)[a-z]")   # "A better reply is B": an article


def parse_ab(text: str) -> int | None:
    """0 for "A", 1 for "B", None. Tried in order: a sentence saying which is better ("I prefer B"), so
    "A: Reply B is better." is B; the leading label; a named label; the first standalone A/B."""
    return next(("AB".index(m.group(1).upper()) for pattern in _PICKS for m in pattern.finditer(text)
                 if not _ARTICLE.match(text, m.start(1))), None) if isinstance(text, str) else None


# --- Reading an LLM judge's 1-5 rubric answer ---------------------------------------------------
_NUM, _QUOTES = r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)(?![0-9])", r"[\s*_\"'`]*"
_LABELLED_RE = re.compile(r"\b(?:score|rating|grade)s?\b" + _QUOTES + r"(?:[:=]|-(?=\s)|\bis\b|\bof\b)?" + _QUOTES
                          + _NUM + r"(?:\s*(?:/|\bout\s+of\b)\s*" + _NUM + r")?", re.IGNORECASE)
_FRACTION_RE = re.compile(_NUM + r"\s*(?:/|\bout\s+of\b)\s*" + _NUM, re.IGNORECASE)
_BOLD_RE, _STARS_RE = re.compile(r"\*\*\s*" + _NUM + r"\s*\*\*"), re.compile(_NUM + r"\s*stars?\b", re.IGNORECASE)
_BARE_RE = re.compile(r"[\s*_\"'`(\[]*" + _NUM + r"[\s*_\"'`)\].!]*")


def _score_value(number: str, lo: int, hi: int) -> int | None:
    """'4' and '4.0' -> 4 inside [lo, hi]; 4.5, 0 or a 99-digit run -> None."""
    whole, _, fraction = number.partition(".")
    return None if fraction.strip("0") or len(whole) > 6 else int(whole) if lo <= int(whole) <= hi else None


def parse_rubric_score(text: str, lo: int = 1, hi: int = 5) -> int | None:
    """An integer rubric score in [lo, hi] read from free text, or None. Judges are asked to end with "Score: N", but
    models wander, so every statement that LOOKS like a score is read: labelled ("Score: 4", "rating is 4", "4/5"),
    a fraction over the scale's top ("4 out of 5"), a bold number, "4 stars", or an answer that is only the number,
    after scale descriptions ("(1-5)", "1 to 5") are removed. All must agree ("5/5 ... no, 2/5" is None): a
    self-correction cannot be told from a quotation, and a silently wrong score is worse than a missing one."""
    if not isinstance(text, str):
        return None
    text = re.sub(rf"\(?(?<![0-9.]){lo}\s*(?:-|–|—|to)\s*{hi}(?![0-9])\)?", " ", text, flags=re.IGNORECASE)
    found = [None if m.group(2) is not None and _score_value(m.group(2), hi, hi) is None   # "4/10": another scale
             else _score_value(m.group(1), lo, hi) for m in _LABELLED_RE.finditer(text)]
    found += [_score_value(m.group(1), lo, hi) for m in _FRACTION_RE.finditer(text)
              if _score_value(m.group(2), hi, hi) is not None]
    found += [_score_value(m.group(1), lo, hi) for r in (_BOLD_RE, _STARS_RE) for m in r.finditer(text)]
    if bare := _BARE_RE.fullmatch(text):
        found.append(_score_value(bare.group(1), lo, hi))
    return found[0] if len(set(found)) == 1 else None


def combine_orders(p_ab: float | None, p_ba: float | None) -> Verdict:
    """p_ab = P(first better) shown as (A = first, B = second), p_ba = the same shown swapped (P("B")); a
    verdict only when both agree, else the judge followed the position. None: an unreadable answer."""
    if p_ab is None or p_ba is None:
        known = [p for p in (p_ab, p_ba) if p is not None]
        return Verdict(None, sum(known) / len(known) if known else 0.5, {"p_ab": p_ab, "p_ba": p_ba, "unparseable": True})
    preferred = 0 if p_ab > 0.5 and p_ba > 0.5 else 1 if p_ab < 0.5 and p_ba < 0.5 else None
    return Verdict(preferred, (p_ab + p_ba) / 2, {"p_ab": p_ab, "p_ba": p_ba})


# --- The prompts of the LLM judges ----------------------------------------------------------------
MAX_TURN_CHARS = 600       # one runaway turn must not crowd out the rest of the prompt


def render_conversation(state: JudgeState) -> str:
    """'Speaker: text' lines for the last JUDGE_TURNS turns, then the user's latest message."""
    lines = [f"Situation: {state.situation}"] if state.situation else []
    lines += [f"{t['speaker']}: {t['text'][:MAX_TURN_CHARS]}" for t in state.history[-JUDGE_TURNS:]]
    return "\n".join(lines + [f"user: {state.context[:MAX_TURN_CHARS]}"])


def judge_messages(template: str, state: JudgeState, **fields) -> list[dict]:
    """data/prompts/<template>.txt: judge_pairwise (fields a, b) or judge_pointwise (reply)."""
    text = data.prompt(template).format(name=state.persona_name, desc=state.persona_desc,
                                        conversation=render_conversation(state), **fields)
    return [{"role": "system", "content": data.prompt("judge_system")}, {"role": "user", "content": text}]


# --- HFJudge: a local chat LLM, read through its next-token probabilities --------------------------
def label_token_ids(tokenizer, label: str) -> list[int]:
    """Token ids that spell `label` as ONE token: "A" and " A" are different BPE tokens, and which one
    a model emits after the assistant header depends on its template, so P(label) sums both."""
    pieces = [tokenizer.encode(v, add_special_tokens=False) for v in (label, " " + label)]
    ids = list(dict.fromkeys(p[0] for p in pieces if len(p) == 1))
    if not ids:
        raise UserError(f"--judge hf: the tokenizer has no single token for the label {label!r}, so its "
                        "probability cannot be read; use an openai:<base url> judge instead")
    return ids


class HFJudge(Judge):
    """A local causal LM as judge at temperature 0; score() maps sum_k k P("k") to [0, 1] (smoother than one digit)."""
    can_generate, read_score = True, staticmethod(parse_rubric_score)

    def __init__(self, model_or_path: str, cache_path=None, batch_size: int = 8, device: str = "cpu"):
        super().__init__(cache_path)
        self.name, self.batch_size = f"hf:{model_or_path}", batch_size
        try:
            self.model, self.tokenizer = models.load_model(model_or_path, device=device, frozen=True)
        except UserError as err:    # its message names --model; here the flag is --judge
            raise UserError(f"--judge hf:{model_or_path}: {err}") from None
        self.ab_ids, self.digit_ids = ([label_token_ids(self.tokenizer, x) for x in labels] for labels in ("AB", "12345"))

    @torch.no_grad()
    def label_probs(self, conversations: list[list[dict]], label_ids: list[list[int]]) -> torch.Tensor:   # (N, L)
        rows, device = [], next(self.model.parameters()).device
        for start in range(0, len(conversations), self.batch_size):
            prompts = models.chat_prompt_ids(self.tokenizer, conversations[start:start + self.batch_size])
            ids, mask = (t.to(device) for t in models.left_pad(prompts, self.tokenizer.pad_token_id))   # (B, P)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)          # a padded row reads as the row alone
            probs = torch.softmax(self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                             logits_to_keep=1).logits[:, -1, :].float(), dim=-1)   # (B, V)
            mass = torch.stack([probs[:, t].sum(-1) for t in label_ids], dim=-1)           # (B, L)
            # Renormalised among the labels: P("A") + P("B") = 1 whatever went to "Reply", "The", ...
            rows.append((mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)).cpu())
            self.backend_calls += len(prompts)
        return torch.cat(rows)

    def _compare_uncached(self, states, firsts, seconds):
        p = self.label_probs([judge_messages("judge_pairwise", s, a=x, b=y) for s, a, b in zip(states, firsts, seconds)
                              for x, y in ((a, b), (b, a))], self.ab_ids)
        # Row 2i shows (first, second): P(first better) = P("A"); row 2i+1 the swap: P("B").
        return [combine_orders(float(p[2 * i, 0]), float(p[2 * i + 1, 1])) for i in range(len(states))]

    def _score_uncached(self, states, replies):
        p = self.label_probs([judge_messages("judge_pointwise", s, reply=r) for s, r in zip(states, replies)],
                             self.digit_ids)   # (N, 5)
        return [(float(e) - 1) / 4 for e in (p * torch.arange(1, 6, dtype=p.dtype)).sum(-1)]    # 1..5 -> [0, 1]

    def _complete_uncached(self, prompt, max_new_tokens):
        self.backend_calls += 1
        return models.generate(self.model, self.tokenizer, [[{"role": "user", "content": prompt}]],
                               max_new_tokens=max_new_tokens, seeds=None).texts[0]


class RMJudge(ScoreJudge):
    """A trained reward model as a judge: score = sigmoid(r), compared by the scores (ScoreJudge)."""
    def __init__(self, folder: str | Path, cache_path=None, device: str = "cpu"):
        super().__init__(cache_path)
        self.rm, self.tok = reward.RewardModel.load(folder, device=device)
        self.name = f"rm:{Path(folder).resolve()}"

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        return [sigmoid(x) for x in self.rm.score_texts(self.tok, [reward.rm_messages(s, r) for s, r in zip(states, replies)])]


def make(kind: str, where: str, cache: Path | None, device: str = "cpu") -> Judge:     # mascot.make_judge's hf: / rm:
    return HFJudge(where, cache, device=device) if kind == "hf" else RMJudge(where, cache, device=device)


def load_nli(name: str, device: str):
    """(model, tokenizer) of an MNLI-style classifier (--nli-model), its three labels checked now."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSequenceClassification.from_pretrained(name).to(device).eval()
        nli_label_index(model.config.id2label, name)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"--nli-model {name}: cannot use it ({first}); pass a local MNLI-style classifier folder") from None
    return model, tok


# --- judge-eval: how often does a judge prefer the better reply of a labelled pair? ---------------
PAIR_FIELDS = ("persona", "persona_desc", "context", "history", "better", "worse")   # + "failure", "situation"


def load_pairs(path: str | Path) -> list[dict]:
    """A judge-pair JSON-lines file (data/README.md), every field checked."""
    records = data.read_jsonl(path, numbered=True)
    for number, pair in records:
        where = f"{path}: line {number}"
        for key in PAIR_FIELDS:
            if not isinstance(pair.get(key), list if key == "history" else str):
                raise UserError(f"{where}: field '{key}' " + (f"must be {'a list' if key == 'history' else 'text'}" if key in pair
                                                              else "is missing; every judge pair needs " + ", ".join(PAIR_FIELDS)))
        if not all(isinstance(t, dict) and isinstance(t.get("speaker"), str) and isinstance(t.get("text"), str)
                   for t in pair["history"]):
            raise UserError(f"{where}: every 'history' turn must be " '{"speaker": "...", "text": "..."}')
    return [pair for _, pair in records]


def evaluate_pairs(judge: Judge, pairs: list[dict]) -> dict:
    """The share of pairs where the judge prefers `better`. Even pairs are asked (better, worse), odd ones swapped, so a
    judge that always picks one position scores 0.5. No verdict counts as wrong; `unreadable`: unparsable answers."""
    firsts = [p["better"] if i % 2 == 0 else p["worse"] for i, p in enumerate(pairs)]
    seconds = [p["worse"] if i % 2 == 0 else p["better"] for i, p in enumerate(pairs)]
    states = [JudgeState(p["persona"], p["persona_desc"], p["context"], list(p["history"]), p.get("situation", ""))
              for p in pairs]                                          # what the judge sees besides the two replies
    verdicts = judge.compare_many(states, firsts, seconds)
    right = [v.preferred == i % 2 for i, v in enumerate(verdicts)]     # better: position 0 for even i, 1 for odd
    out = {"accuracy": sum(right) / len(pairs) if pairs else 0.0, "n": len(pairs),
           "no_verdict": sum(v.preferred is None for v in verdicts),
           "unreadable": sum(bool(v.detail.get("unparseable")) for v in verdicts), "per_persona": {}, "per_failure": {}}
    for pair, ok in zip(pairs, right):
        for field in pair.keys() & {"persona", "failure"}:
            c, n = out[f"per_{field}"].get(pair[field], (0, 0))
            out[f"per_{field}"][pair[field]] = (c + ok, n + 1)
    return out


def format_eval_report(result: dict) -> str:
    """'accuracy: 0.857' on the first line, then one line per persona and per failure kind."""
    rows = lambda counts: [f"  {k}: {c}/{n} = {c / n:.3f}" for k, (c, n) in sorted(counts.items())]   # noqa: E731
    return "\n".join([f"accuracy: {result['accuracy']:.3f}", *rows(result["per_persona"])]
                     + (["per failure kind:", *rows(result["per_failure"])] if result.get("per_failure") else []))


# --- judge-eval --persona-id: on the wrong-role / off-role pairs the worse reply is another persona's ---
def validate(identifier_for, pairs: list[dict]) -> dict:
    """Per failure kind: how often log_ratio(better) > log_ratio(worse) (exact two-sided sign test), and how often
    the better (in-role) reply is identified; identifier_for(persona name): the identifier of its set."""
    by_kind: dict[str, Counter] = {}
    for pair in pairs:
        history = [("User" if t["speaker"].lower() == "user" else t["speaker"], t["text"]) for t in pair["history"]]
        history.append(("User", pair["context"]))
        better, worse = identifier_for(pair["persona"]).score([(pair["persona"], pair.get("situation", ""), history, pair[k])
                                                               for k in ("better", "worse")])
        b, w = better["log_ratio"], worse["log_ratio"]
        by_kind.setdefault(pair.get("failure", "-"), Counter()).update(
            n=1, prefers_better=int(b > w), ties=int(b == w), id_correct=int(better["correct"]))
    for row in by_kind.values():
        row["p_value"] = binomial_two_sided_p(row["prefers_better"], row["n"] - row["ties"])
    return by_kind


# --- judge-stress: does picking the best of N by a grader pick hacks? -----------------------------
# The independent evaluators' numbers: PersonaIdentifier.score's, then FunctionEvaluator.score's (extras/strategies.py).
INDEPENDENT = {"correct": "in-role reply identified", "log_ratio": "persona log-ratio (nats/token)",
               "correct_equal": f"identified, first {EQUAL_TOKENS} tokens", "function": "persona function",
               "function_equal": f"persona function, first {EQUAL_TOKENS} tokens"}


def best_of_n(policy, tok, states: list, personas, scorers: dict, n: int, max_new_tokens: int, temperature: float,
              seed: int, identifier=None, function=None) -> dict:
    """Best-of-N: n replies per state; each scorer (name -> fn(states, replies) -> scores) picks its top one. Per
    diagnostic (metrics.diagnose): the pick's rate and its paired difference from chance (the state's candidate mean).
    identifier, function: each pick's persona-ID and -function numbers too; "persona-id" also joins the graders."""
    rows = [s for s in states for _ in range(n)]
    texts = models.generate_texts(policy, tok, [s.prompt(personas) for s in rows], max_new_tokens, temperature,
                                  seeds=[derive_seed(seed, "best-of-n", i) for i in range(len(rows))])
    replies = [models.clean_reply(t, s.persona, personas.names()) for s, t in zip(rows, texts)]
    diags = [s.diagnose(personas, r) for s, r in zip(rows, replies)]
    result = {"n": n, "states": len(states), "chance": rates(diags), "scorers": {}}
    rng = random.Random(derive_seed(seed, "random-pick"))
    picks, gold = {"random": [rng.randrange(n) for _ in states]}, None
    if identifier is not None or function is not None:
        items = [(s.persona, s.context.situation, [(t.speaker, t.text) for t in s.history], r) for s, r in zip(rows, replies)]
        gold = [{**a, **b} for a, b in zip(identifier.score(items) if identifier else [{}] * len(items),
                                           function.score([(i[0], i[3]) for i in items]) if function else [{}] * len(items))]
        result["independent_chance"] = {k: mean_or_none([g[k] for g in gold]) for k in INDEPENDENT if k in gold[0]}
    if identifier is not None:
        scorers = {**scorers, "persona-id": lambda _s, _r: [float("-inf") if g["log_ratio"] is None else g["log_ratio"]
                                                            for g in gold]}
    for name, scorer in scorers.items():        # per state, the index of its top-scored candidate; the first of a tie
        scores = scorer(rows, replies)
        picks[name] = [max(range(n), key=lambda j: scores[i * n + j]) for i in range(len(states))]
    for name, chosen in picks.items():          # passes: no flag's difference from chance above 2 se (0 without one)
        graded = {k: vs_chance([d[k] for d in diags], n, chosen) for k in DIAGNOSTICS}
        row = result["scorers"][name] = {"rates": {k: g[0] for k, g in graded.items()},
                                         "difference": {k: g[1:] for k, g in graded.items()}}
        row["passes"] = all(row["difference"][k][0] <= 2 * (row["difference"][k][1] or 0.0) for k in HACKS)
        if gold is not None:
            row["independent"] = {k: vs_chance([g[k] for g in gold], n, chosen) for k in result["independent_chance"]}
        row["picks"] = [{"state": states[i].id, "persona": states[i].persona, "reply": replies[i * n + j]}
                        for i, j in enumerate(chosen)]                # every pick, to read beside the random one
    return result


def within_state_correlation(xs: list[float], ys: list[float | None], n: int) -> float | None:
    """Pearson r of xs and ys after subtracting each state's mean from both (state-major, y None left out): how
    well x ranks the candidates OF ONE STATE, all a best-of-n pick or a GRPO group can use. None: no variation."""
    dx, dy = [], []
    for kept in ([i for i in range(start, start + n) if ys[i] is not None] for start in range(0, len(xs), n)):
        if len(kept) >= 2:
            mx, my = (sum(v[i] for i in kept) / len(kept) for v in (xs, ys))
            dx += [xs[i] - mx for i in kept]
            dy += [ys[i] - my for i in kept]
    sxx, syy = sum(a * a for a in dx), sum(b * b for b in dy)
    return None if sxx == 0 or syy == 0 else sum(a * b for a, b in zip(dx, dy)) / (sxx * syy) ** 0.5


def vs_chance(values: list[float | None], n: int, picks: list[int]) -> tuple:
    """(pick mean, mean over states of pick minus state mean, its se); state-major S x n values, None left out."""
    picked = [(i, values[i * n + j]) for i, j in enumerate(picks) if values[i * n + j] is not None]
    diffs = [v - mean_or_none(values[i * n:(i + 1) * n]) for i, v in picked]
    return mean_or_none([v for _, v in picked]), mean_or_none(diffs), standard_error(diffs)


def format_best_of_n(result: dict) -> str:
    """Tables: each grader's pick vs chance per diagnostic, then by the independent evaluators."""
    line = lambda name, cells, width: f"{name:<16} | " + " | ".join(f"{c:>{width}}" for c in cells)  # noqa: E731
    _cell = lambda mean, diff=None, se=None: (                  # noqa: E731  "0.250 (+0.125±0.060)"
        ("n/a" if mean is None else f"{mean:.3f}") + ("" if diff is None else f" ({diff:+.3f}±{reward.shown(se)})"))
    lines = [f"best-of-{result['n']} on {result['states']} held-out states; rates of the pick vs chance (mean over all "
             "candidates); difference ± paired se", line("grader", DIAGNOSTICS, 22) + " | verdict",
             line("chance", [f"{result['chance'][k]:.3f}" for k in DIAGNOSTICS], 22) + " |"]
    lines += [line(name, [_cell(row["rates"][k], *row["difference"][k]) for k in DIAGNOSTICS], 22)
              + (" | pass" if row["passes"] else " | FAIL: picks hacks more often than chance")
              for name, row in result["scorers"].items()]
    if "independent_chance" in result:
        keys = list(result["independent_chance"])
        lines += ["", "the independent evaluators (persona identification by the frozen base model, extras/evaluators.py; "
                  "persona function, extras/strategies.py; no grader above saw them): the pick vs chance, difference ± "
                  "paired se", line("grader", [INDEPENDENT[k] for k in keys], 32),
                  line("chance", [_cell(result["independent_chance"][k]) for k in keys], 32)]
        lines += [line(name, [_cell(*row["independent"][k]) for k in keys], 32) for name, row in result["scorers"].items()]
    return "\n".join(lines)


# --- The commands ----------------------------------------------------------------------------------
def main(argv: list[str], cli) -> int:
    """`mascot.py judge-eval ...` and `mascot.py judge-stress ...` (argv[0] is the command)."""
    stress, p = argv[0] == "judge-stress", cli.Parser(prog=f"mascot.py {argv[0]}", formatter_class=cli.Formatter)
    cli.common_flags(p, trained=stress)
    if stress:
        p.add_argument("--rm", default=None, help="reward model folder to test too (default: RUN/stage1/reward_model if any)")
        for flag, kind, check, default, about in (("--n", int, "at-least-2", 16, "candidates per state"),
                                                  ("--states", int, "positive", 16, "held-out states"),
                                                  ("--temperature", float, "positive", 1.0, "candidates' sampling temperature")):
            p.add_argument(flag, type=data.flag_type(flag, kind, check), default=default, help=about)
    else:
        p.add_argument("--pairs", required=True, nargs="+", help="JSON-lines file(s) of labelled pairs (data/README.md)")
        p.add_argument("--cache", default=None, help="judge cache file (JSON lines); none by default")
    p.add_argument("--persona-id", action=argparse.BooleanOptionalAction, default=stress, help="the independent evaluator "
                   "(extras/evaluators.py, the frozen --model) on " + ("each pick" if stress else "the in-role pairs"))
    args = p.parse_args(argv[1:])
    cli.check_device(args)
    if stress:
        with data.run_lock(args.run):         # it writes RUN/stress/: not while train or evaluate writes the run
            return judge_stress(args, cli)
    judge = cli.make_judge(args, args.cache, args.personas)
    pairs, t0 = [p for path in args.pairs for p in load_pairs(path)], time.time()
    result = evaluate_pairs(judge, pairs)
    print(format_eval_report(result))
    print(f"({result['n']} pairs, {result['no_verdict']} without a verdict, {result['unreadable']} of them "
          f"unreadable; judge {judge.name}, {time.time() - t0:.1f} s)")
    if args.persona_id:
        base, sets = cli.load_role(args.model, "speakers", args), data.persona_sets(args.personas)   # the frozen base model
        owner = {p.name: PersonaIdentifier(*base, ps) for ps in [data.load_personas(args.personas, s) for s in sets]
                 for p in ps.personas}                                        # persona name -> its set's identifier
        chosen = [p for p in pairs if p.get("failure") in ("wrong-role", "off-role") and p["persona"] in owner]
        print(f"\npersona identification under the frozen {args.model}: {len(chosen)} wrong-role / off-role pairs\n"
              "| failure | pairs | prefers the in-role reply | exact two-sided p | in-role reply identified |\n|---|---|---|---|---|")
        for kind, r in sorted(validate(owner.__getitem__, chosen).items()):
            print(f"| {kind} | {r['n']} | {r['prefers_better']}/{r['n']} = {r['prefers_better'] / r['n']:.2f} | "
                  f"{r['p_value']:.3g} | {r['id_correct']}/{r['n']} |")
    return 0


def judge_stress(args, cli) -> int:          # best-of-N against the judge and the reward model, held-out states
    run = Path(args.run)
    inputs, spec = cli.load_inputs(args, earlier=[run / "stage1" / "config.json"]), cli.speakers_of(args)
    personas = inputs.personas
    policy, tok = cli.load_role(spec, "speakers", args, run / "stress" / "served_cache.jsonl")
    states = reward.build_states(inputs.held_out, personas, args.states, args.seed + 1, {}, "heldout")
    judge = cli.make_judge(args, None if args.judge == "offline" else run / "stress" / "judge_cache.jsonl", args.personas)
    scorers = {"judge": lambda rows, replies: judge.score_many([s.judge_state(personas) for s in rows], replies)}
    rm_folder = args.rm or models.trained_or(run / "stage1" / "reward_model", "") or None
    if rm_folder:
        rm, rm_tok = reward.RewardModel.load(rm_folder, device=args.device, dtype=cli.frozen_dtype(args))
        scorers["rm"] = lambda rows, replies: rm.score_texts(rm_tok, [s.rm_messages(personas, r) for s, r in zip(rows, replies)])
    # The independent evaluator runs on the frozen base model, even when the policy is a trained one.
    base = (policy, tok) if spec == args.model or not args.persona_id else cli.load_role(args.model, "speakers", args)
    identifier = PersonaIdentifier(*base, personas) if args.persona_id else None
    function = cli.extra("strategies").FunctionEvaluator(tok or base[1], personas) \
        if any(p.esconv_strategies for p in personas.personas) else None
    result = best_of_n(policy, tok, states, personas, scorers, args.n, args.max_new_tokens, args.temperature,
                       args.seed, identifier, function)
    result.update({"judge": judge.name, "rm": rm_folder, "policy": spec})
    print(format_best_of_n(result))
    data.write_json(run / "stress" / "results.json", result)
    print(f"judge {judge.name}; reward model {rm_folder or 'none'}; wrote {run / 'stress' / 'results.json'}")
    return 0
