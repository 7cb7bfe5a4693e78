"""judge_eval.py: how good is a grader? Two measurements, one per command.

A judge (judge.py) or a reward model (reward.py) is only worth optimising against if it prefers
good replies to bad ones, and keeps doing so when a policy searches for what it over-rewards.

    python mascot.py judge-eval --pairs data/judge_pairs_support.jsonl ...
        accuracy on labelled pairs (data/judge_pairs_*.jsonl, schema in data/README.md): how often
        the judge prefers the better reply, overall, per persona and per failure kind
        (load_pairs, evaluate_pairs, format_eval_report);
    python mascot.py judge-stress --run runs/default
        best-of-N on held-out states: sample N replies, let each grader pick its favourite, and
        count how often the pick copies, leaks or says nothing compared with a random pick
        (best_of_n, grade_picks, format_best_of_n). Optimisation without RL, so a grader that
        fails here will be hacked by GRPO too (Gao et al. 2022). Gao et al. also score each pick
        with a "gold" grader the proxy never saw; ours is the independent evaluator of
        evaluate.py, persona identification by the frozen base model (grade_independent): a
        grader whose picks it does not rate above chance will not teach GRPO more in-role replies.
        For a judge with named features (the offline judge) it also shows which features carry
        that signal (feature_alignment).
"""

from __future__ import annotations

import random
from pathlib import Path

import hacks
import models
import persona_id
import sampler
from data import PersonaSet, UserError, derive_seed, read_jsonl
from judge import Judge
from metrics import mean_or_none, standard_error
from reward import State
from simulate import JudgeState


# ----------------------------------------------------------------------------------------------
# Labelled pairs: how often does a judge prefer the better reply?
# ----------------------------------------------------------------------------------------------

PAIR_FIELDS = ("persona", "persona_desc", "context", "history", "better", "worse")   # + optional "failure", "situation"


def load_pairs(path: str | Path) -> list[dict]:
    """Read a judge-pair JSON-lines file (schema in data/README.md), checking every field."""
    pairs = []
    for number, pair in read_jsonl(path, numbered=True):
        where = f"{path}: line {number}"
        for key in PAIR_FIELDS:
            if key not in pair:
                raise UserError(f"{where}: field '{key}' is missing; every judge pair needs "
                                + ", ".join(PAIR_FIELDS))
            want_list = key == "history"
            if want_list != isinstance(pair[key], list) or (not want_list and not isinstance(pair[key], str)):
                raise UserError(f"{where}: field '{key}' must be {'a list' if want_list else 'text'}")
        for turn in pair["history"]:
            if not (isinstance(turn, dict) and isinstance(turn.get("speaker"), str)
                    and isinstance(turn.get("text"), str)):
                raise UserError(f"{where}: every 'history' turn must be "
                                '{"speaker": "...", "text": "..."}')
        pairs.append(pair)
    return pairs


def evaluate_pairs(judge: Judge, pairs: list[dict]) -> dict:
    """Accuracy of a judge on labelled pairs: the fraction where it prefers `better`.

    Even-numbered pairs are asked as (better, worse), odd ones as (worse, better), so a judge that
    always picks the same position scores exactly 0.5 on an even number of pairs: position bias
    cannot inflate the number. No verdict counts as wrong; `unreadable` counts the pairs without
    a verdict because an answer could not be read (a prompt or model problem, not a judgement).
    """
    states = [JudgeState.from_pair(p) for p in pairs]
    firsts = [p["better"] if i % 2 == 0 else p["worse"] for i, p in enumerate(pairs)]
    seconds = [p["worse"] if i % 2 == 0 else p["better"] for i, p in enumerate(pairs)]
    verdicts = judge.compare_many(states, firsts, seconds)
    correct, no_verdict, unreadable, groups = 0, 0, 0, {"persona": {}, "failure": {}}
    for i, (pair, verdict) in enumerate(zip(pairs, verdicts)):
        right = verdict.preferred == i % 2          # better is at position 0 for even i, 1 for odd
        no_verdict += verdict.preferred is None
        unreadable += bool(verdict.detail.get("unparseable"))
        correct += right
        for field_name, counts in groups.items():
            if field_name in pair:
                c, n = counts.get(pair[field_name], (0, 0))
                counts[pair[field_name]] = (c + right, n + 1)
    return {"accuracy": correct / len(pairs) if pairs else 0.0, "n": len(pairs),
            "no_verdict": no_verdict, "unreadable": unreadable, "per_persona": groups["persona"], "per_failure": groups["failure"]}


def format_eval_report(result: dict) -> str:
    """'accuracy: 0.857' on the first line, then one line per persona and per failure kind."""
    lines = [f"accuracy: {result['accuracy']:.3f}"]
    lines += [f"  {name}: {c}/{n} = {c / n:.3f}" for name, (c, n) in sorted(result["per_persona"].items())]
    if result.get("per_failure"):
        lines.append("per failure kind:")
        lines += [f"  {kind}: {c}/{n} = {c / n:.3f}" for kind, (c, n) in sorted(result["per_failure"].items())]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Over-optimisation, without RL: does picking the best of N by a grader pick hacks?
# ----------------------------------------------------------------------------------------------

FLAGS = ("context_copy", "persona_copy", "history_echo", "self_repeat", "meta_leak", "trivial")


def best_of_n(policy, tokenizer, states: list[State], personas: PersonaSet, scorers: dict, n: int,
              max_new_tokens: int, temperature: float, seed: int, identifier=None, features=None) -> dict:
    """Best-of-N against each grader (Gao et al. 2022): the cheapest optimisation there is.

    For every state, sample n replies from the policy; each scorer (name -> fn(states, replies) ->
    scores) picks its top reply. If a grader prefers hacks, its pick copies, leaks or says nothing
    more often than a random candidate does. For each diagnostic (hacks.py) we report the pick's
    rate, the chance rate (the mean over all n candidates, which is what a random pick gets on
    average), and their difference with a paired standard error over states. A grader PASSES when
    no flag's difference exceeds two standard errors (zero when the standard error is zero). The
    length is reported but does not decide: preferring a full reply to a trivial one is not a hack.

    identifier (a persona_id.PersonaIdentifier, or None): also score every candidate with the
    independent evaluator and report each pick's persona-ID numbers against chance (Gao et al.'s
    gold score; grade_independent). It then joins the graders as "persona-id", best-of-n by its
    own log-ratio: the most a pick can gain on it, and which hacks it would pick itself.

    features (fn(states, replies) -> one {name: value} dict per reply, e.g. the offline judge's
    features_many, or None): with an identifier, also which of the grader's features agree with
    the independent evaluator (feature_alignment).
    """
    rows = [s for s in states for _ in range(n)]
    gen = sampler.generate(policy, tokenizer, [s.prompt(personas) for s in rows], max_new_tokens, temperature,
                          seeds=[derive_seed(seed, "best-of-n", i) for i in range(len(rows))])
    names = personas.names()
    replies = [models.clean_reply(t, s.persona, names) for s, t in zip(rows, gen.texts)]
    diags = [s.diagnose(personas, r) for s, r in zip(rows, replies)]
    result = {"n": n, "states": len(states), "chance": hacks.rates(diags), "scorers": {}}
    rng = random.Random(derive_seed(seed, "random-pick"))
    picks = {"random": [rng.randrange(n) for _ in states]}
    gold = None
    if identifier is not None:
        gold = identifier.score([persona_id.Item(s.persona, s.context.situation,
                                                 [(t.speaker, t.text) for t in s.history], r)
                                 for s, r in zip(rows, replies)])
        result["independent_chance"] = {k: mean_or_none([g[k] for g in gold]) for k in INDEPENDENT}
        scorers = {**scorers, "persona-id": lambda _rows, _replies: [
            g["log_ratio"] if g["log_ratio"] is not None else float("-inf") for g in gold]}
    for name, scorer in scorers.items():
        scores = scorer(rows, replies)
        picks[name] = best_picks(scores, n)
    for name, chosen in picks.items():
        result["scorers"][name] = grade_picks(diags, n, chosen)
        if gold is not None:
            result["scorers"][name]["independent"] = grade_independent(gold, n, chosen)
        result["scorers"][name]["examples"] = [replies[i * n + j] for i, j in list(enumerate(chosen))[:3]]
    if gold is not None and features is not None:
        result["feature_alignment"] = feature_alignment(features(rows, replies), gold, n)
    return result


def best_picks(scores: list[float], n: int) -> list[int]:
    """Per state (S states x n candidates, state-major), the index of its highest score; the
    first of a tie."""
    return [max(range(n), key=lambda j: scores[i * n + j]) for i in range(len(scores) // n)]


def within_state_correlation(xs: list[float], ys: list[float | None], n: int) -> float | None:
    """Pearson correlation of xs and ys after subtracting each state's mean from both (S states x
    n candidates, state-major; candidates with y None left out): how well x ranks the candidates
    OF ONE STATE by y, which is all a best-of-n pick or a GRPO group's advantage can use.
    Differences between states (one persona or context is easier) do not count. None when x or y
    never varies within a state."""
    dx, dy = [], []
    for start in range(0, len(xs), n):
        kept = [i for i in range(start, start + n) if ys[i] is not None]
        if len(kept) < 2:
            continue
        mx, my = sum(xs[i] for i in kept) / len(kept), sum(ys[i] for i in kept) / len(kept)
        dx += [xs[i] - mx for i in kept]
        dy += [ys[i] - my for i in kept]
    sxx, syy = sum(a * a for a in dx), sum(b * b for b in dy)
    if sxx == 0 or syy == 0:
        return None
    return sum(a * b for a, b in zip(dx, dy)) / (sxx * syy) ** 0.5


def feature_alignment(feats: list[dict], gold: list[dict], n: int) -> dict:
    """Which of a grader's features carry the independent evaluator's signal.

    feats: one {feature: value} dict per candidate ("higher is better"), gold: persona_id scores,
    both S states x n candidates, state-major. Per feature: its within-state correlation with the
    evaluator's per-token log-ratio, and the log-ratio gain of the best-of-n pick by that feature
    alone (grade_independent's (pick mean, difference from chance, se); where the feature ties,
    as a hack penalty does on clean replies, the pick is the first candidate, i.e. a random one).
    A feature with r near 0 cannot teach in-role replies however much it weighs; one with r < 0
    works against them."""
    ratio = [g["log_ratio"] for g in gold]
    out = {}
    for key in feats[0]:
        xs = [f[key] for f in feats]
        out[key] = {"r": within_state_correlation(xs, ratio, n),
                    "pick": grade_independent(gold, n, best_picks(xs, n))["log_ratio"]}
    return out


INDEPENDENT = ("correct", "log_ratio", "correct_equal")     # persona_id.PersonaIdentifier.score's numbers


def grade_independent(scores: list[dict], n: int, picks: list[int]) -> dict:
    """The independent evaluator's numbers for one grader's picks, against chance.

    scores: persona_id score dicts ({"correct": 0/1, "log_ratio": nats per token, "correct_equal":
    0/1 from the first tokens}, None values for a speaker outside the persona set or, for
    correct_equal, a reply too short) of S states x n candidates, state-major; picks: the picked
    candidate per state. As in grade_picks, the per-state difference pick - (mean over that
    state's candidates) is averaged over states, with its standard error; states whose pick has
    no score are skipped. key -> (pick mean, difference, se); (None, None, None) with no state.
    """
    out = {}
    for key in INDEPENDENT:
        picked, diffs = [], []
        for i, j in enumerate(picks):
            own = [g[key] for g in scores[i * n:(i + 1) * n] if g[key] is not None]
            if scores[i * n + j][key] is None or not own:
                continue
            picked.append(scores[i * n + j][key])
            diffs.append(scores[i * n + j][key] - sum(own) / len(own))
        out[key] = (mean_or_none(picked), mean_or_none(diffs), standard_error(diffs) if diffs else None)
    return out


def grade_picks(diags: list[dict], n: int, picks: list[int]) -> dict:
    """How hack-prone one grader's picks are, against chance, from the diagnostics of all candidates.

    diags: hacks.diagnose rows of S states x n candidates, state-major; picks: the index of the
    picked candidate per state. For each diagnostic, the difference pick - (mean over that
    state's candidates) is taken per state; its mean and standard error over states decide.
    """
    chance = [hacks.rates(diags[i * n:(i + 1) * n]) for i in range(len(picks))]        # per state
    picked = [diags[i * n + j] for i, j in enumerate(picks)]
    row = {"rates": hacks.rates(picked), "difference": {}}
    for key in FLAGS + ("words",):
        diffs = [p[key] - c[key] for p, c in zip(picked, chance)]
        row["difference"][key] = (sum(diffs) / len(diffs), standard_error(diffs))
    row["passes"] = all(row["difference"][k][0] <= 2 * row["difference"][k][1] for k in FLAGS)
    return row


def format_best_of_n(result: dict) -> str:
    """The stress test as a table: each grader's pick against chance, per diagnostic."""
    keys = FLAGS + ("words",)
    lines = [f"best-of-{result['n']} on {result['states']} held-out states; rates of the pick vs chance "
             "(mean over all candidates); difference ± paired se",
             "grader     | " + " | ".join(f"{k:>22}" for k in keys) + " | verdict",
             "chance     | " + " | ".join(f"{result['chance'][k]:>22.3f}" for k in keys) + " |"]
    for name, row in result["scorers"].items():
        cells = [f"{row['rates'][k]:.3f} ({row['difference'][k][0]:+.3f}±{row['difference'][k][1]:.3f})"
                 for k in keys]
        verdict = "pass" if row["passes"] else "FAIL: picks hacks more often than chance"
        lines.append(f"{name:<10} | " + " | ".join(f"{c:>22}" for c in cells) + f" | {verdict}")
    if "independent_chance" in result:
        chance = result["independent_chance"]
        lines += ["",
                  "the independent evaluator (persona identification by the frozen base model, persona_id.py; "
                  "no grader above saw it): the pick vs chance, difference ± paired se",
                  f"grader     | {'in-role reply identified':>28} | {'persona log-ratio (nats/token)':>32} | "
                  f"{f'identified, first {persona_id.EQUAL_TOKENS} tokens':>30}",
                  f"chance     | {_cell(chance['correct']):>28} | {_cell(chance['log_ratio']):>32} | "
                  f"{_cell(chance['correct_equal']):>30}"]
        for name, row in result["scorers"].items():
            ind = row["independent"]
            cells = [_cell(ind[k][0]) + (f" ({ind[k][1]:+.3f}±{ind[k][2]:.3f})" if ind[k][1] is not None else "")
                     for k in INDEPENDENT]
            lines.append(f"{name:<10} | {cells[0]:>28} | {cells[1]:>32} | {cells[2]:>30}")
    if "feature_alignment" in result:
        lines += ["", "the judge's features against the independent evaluator: within-state correlation r with the "
                      "persona log-ratio, and the log-ratio of the best-of-N pick by that feature alone vs chance",
                  f"{'feature':<16} | {'r':>6} | {'pick log-ratio (diff ± se)':>28}"]
        for key, row in sorted(result["feature_alignment"].items(),
                               key=lambda kv: -(kv[1]["r"] if kv[1]["r"] is not None else -2)):
            pick = row["pick"]
            cell = _cell(pick[0]) + (f" ({pick[1]:+.3f}±{pick[2]:.3f})" if pick[1] is not None else "")
            r = "n/a" if row["r"] is None else f"{row['r']:+.3f}"
            lines.append(f"{key:<16} | {r:>6} | {cell:>28}")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"
