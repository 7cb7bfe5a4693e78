"""extras/judges.py: how good a grader is, and whether optimising it would pick reward hacks.

A tool beside the method. The graders themselves are in the reading path: judge.py (the offline judge and
`--judge hf:<model>`, with the prompts and parsers every LLM judge shares), reward.py (`rm:<folder>`: stage 1's
reward model) and plumbing/served.py (`openai:<base url>`); mascot.make_judge picks one. This file measures them:
  judge-eval    the share of labelled pairs (data/judge_pairs_*.jsonl) where a judge prefers the better reply.
                LLM judges prefer the reply they read first (Zheng et al. 2023): half the pairs are asked swapped,
                so a judge that always picks one position scores 0.5; --persona-id also checks the independent
                evaluator (extras/evaluators.py) on the wrong-role and off-role pairs.
  judge-stress  a grader is worth optimising only if it keeps preferring good replies when a policy searches
                for what it over-rewards. Simplified: best-of-N stands in for RL (Gao et al. 2022), and each
                grader's picks are compared with chance on the hack diagnostics and on evaluators it never saw.
    python mascot.py judge-eval --pairs data/judge_pairs_support.jsonl    # accuracy on labelled pairs
    python mascot.py judge-eval --pairs ... --persona-id    # is the independent evaluator valid on them?
    python mascot.py judge-stress --run runs/default    # best-of-N: do a grader's picks hack? (then GRPO will)
"""

import argparse
import random
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import models
import reward
import scenarios
from extras.evaluators import EQUAL_TOKENS, PersonaIdentifier
from judge import Judge
from metrics import DIAGNOSTICS, HACKS, binomial_two_sided_p, mean_or_none, rates, standard_error
from plumbing import files, loading, runs
from plumbing.cli import flag_type
from plumbing.common import UserError, derive_seed
from simulate import JudgeState

# --- judge-eval: how often does a judge prefer the better reply of a labelled pair? ---------------
# The fields every pair has; "failure" (the kind of flaw of the worse reply) and "situation" are optional.
PAIR_FIELDS = ("persona", "persona_desc", "context", "history", "better", "worse")


def load_pairs(path: str | Path) -> list[dict]:
    """A judge-pair JSON-lines file (data/README.md), every field checked."""
    records = files.read_jsonl(path, numbered=True)
    for number, pair in records:
        where = f"{path}: line {number}"
        for key in PAIR_FIELDS:
            kind = list if key == "history" else str
            if not isinstance(pair.get(key), kind):
                raise UserError(f"{where}: field '{key}' " + field_problem(pair, key))
        if not all(is_turn(t) for t in pair["history"]):
            raise UserError(
                f'{where}: every \'history\' turn must be {{"speaker": "...", "text": "..."}}'
            )
    return [pair for _, pair in records]


def field_problem(pair: dict, key: str) -> str:
    """What is wrong with a pair's field `key`, for the error message."""
    if key not in pair:
        return "is missing; every judge pair needs " + ", ".join(PAIR_FIELDS)
    if key == "history":
        return "must be a list"
    return "must be text"


def is_turn(turn) -> bool:
    """A history turn: {"speaker": text, "text": text}."""
    return (
        isinstance(turn, dict)
        and isinstance(turn.get("speaker"), str)
        and isinstance(turn.get("text"), str)
    )


def evaluate_pairs(judge: Judge, pairs: list[dict]) -> dict:
    """The share of pairs where the judge prefers `better`. Even pairs are asked (better, worse), odd ones swapped, so a
    judge that always picks one position scores 0.5. No verdict counts as wrong; `unreadable`: unparsable answers."""
    firsts = [p["better"] if i % 2 == 0 else p["worse"] for i, p in enumerate(pairs)]
    seconds = [p["worse"] if i % 2 == 0 else p["better"] for i, p in enumerate(pairs)]
    # What the judge sees besides the two replies.
    states = [
        JudgeState(
            p["persona"],
            p["persona_desc"],
            p["context"],
            list(p["history"]),
            p.get("situation", ""),
        )
        for p in pairs
    ]
    verdicts = judge.compare_many(states, firsts, seconds)
    # The better reply sits in position 0 for an even i, in position 1 for an odd one.
    right = [v.preferred == i % 2 for i, v in enumerate(verdicts)]
    out = {
        "accuracy": sum(right) / len(pairs) if pairs else 0.0,
        "n": len(pairs),
        "no_verdict": sum(v.preferred is None for v in verdicts),
        "unreadable": sum(bool(v.detail.get("unparseable")) for v in verdicts),
        "per_persona": {},
        "per_failure": {},
    }
    for pair, ok in zip(pairs, right):
        for field in pair.keys() & {"persona", "failure"}:
            counts = out[f"per_{field}"]  # value -> (right, asked)
            c, n = counts.get(pair[field], (0, 0))
            counts[pair[field]] = (c + ok, n + 1)
    return out


def format_eval_report(result: dict) -> str:
    """'accuracy: 0.857' on the first line, then one line per persona and per failure kind."""
    lines = [f"accuracy: {result['accuracy']:.3f}", *rate_lines(result["per_persona"])]
    if result.get("per_failure"):
        lines += ["per failure kind:", *rate_lines(result["per_failure"])]
    return "\n".join(lines)


def rate_lines(counts: dict) -> list[str]:
    """'  name: right/asked = rate' per entry of {name: (right, asked)}, by name."""
    return [f"  {k}: {c}/{n} = {c / n:.3f}" for k, (c, n) in sorted(counts.items())]


# --- judge-eval --persona-id: on the wrong-role / off-role pairs the worse reply is another persona's ---
def validate(identifier_for, pairs: list[dict]) -> dict:
    """Per failure kind: how often log_ratio(better) > log_ratio(worse) (exact two-sided sign test), and how often
    the better (in-role) reply is identified; identifier_for(persona name): the identifier of its set."""
    by_kind: dict[str, Counter] = {}
    for pair in pairs:
        history = [
            ("User" if t["speaker"].lower() == "user" else t["speaker"], t["text"])
            for t in pair["history"]
        ]
        history.append(("User", pair["context"]))
        situation = pair.get("situation", "")
        items = [(pair["persona"], situation, history, pair[k]) for k in ("better", "worse")]
        better, worse = identifier_for(pair["persona"]).score(items)
        b, w = better["log_ratio"], worse["log_ratio"]
        by_kind.setdefault(pair.get("failure", "-"), Counter()).update(
            n=1, prefers_better=int(b > w), ties=int(b == w), id_correct=int(better["correct"])
        )
    for row in by_kind.values():
        row["p_value"] = binomial_two_sided_p(row["prefers_better"], row["n"] - row["ties"])
    return by_kind


# --- judge-stress: does picking the best of N by a grader pick hacks? -----------------------------
# The independent evaluators' numbers: PersonaIdentifier.score's, then FunctionEvaluator.score's (extras/strategies.py).
INDEPENDENT = {
    "correct": "in-role reply identified",
    "log_ratio": "persona log-ratio (nats/token)",
    "correct_equal": f"identified, first {EQUAL_TOKENS} tokens",
    "function": "persona function",
    "function_equal": f"persona function, first {EQUAL_TOKENS} tokens",
}


@dataclass
class Sampling:
    """How best_of_n draws its candidates: n replies per state, each at most max_new_tokens at
    `temperature`, every row's seed derived from `seed`."""

    n: int
    max_new_tokens: int
    temperature: float
    seed: int


def best_of_n(
    policy,
    tok,
    states: list,
    personas,
    scorers: dict,
    sampling: Sampling,
    identifier=None,
    function=None,
) -> dict:
    """Best-of-N: n replies per state; each scorer (name -> fn(states, replies) -> scores) picks its top one. Per
    diagnostic (metrics.diagnose): the pick's rate and its paired difference from chance (the state's candidate mean).
    identifier, function: each pick's persona-ID and -function numbers too; "persona-id" also joins the graders."""
    n = sampling.n
    rows = []  # state-major: state i's candidates are rows i*n .. i*n+n-1
    for s in states:
        rows += [s] * n
    replies = sample_candidates(policy, tok, rows, personas, sampling)
    diags = [s.diagnose(personas, r) for s, r in zip(rows, replies)]
    result = {"n": n, "states": len(states), "chance": rates(diags), "scorers": {}}
    rng = random.Random(derive_seed(sampling.seed, "random-pick"))
    picks = {"random": [rng.randrange(n) for _ in states]}  # what picking blindly gives
    gold = None  # the independent evaluators' numbers per candidate, if any evaluator runs
    if identifier is not None or function is not None:
        gold = independent_scores(rows, replies, identifier, function)
        result["independent_chance"] = {
            k: mean_or_none([g[k] for g in gold]) for k in INDEPENDENT if k in gold[0]
        }
    if identifier is not None:
        scorers = {**scorers, "persona-id": persona_id_scorer(gold)}
    for name, scorer in scorers.items():
        picks[name] = top_picks(scorer(rows, replies), n, len(states))
    for name, chosen in picks.items():
        independent = list(result.get("independent_chance", {}))
        row = grade_picks(chosen, n, diags, gold, independent)
        row["picks"] = [  # every pick, to read beside the random one
            {"state": states[i].id, "persona": states[i].persona, "reply": replies[i * n + j]}
            for i, j in enumerate(chosen)
        ]
        result["scorers"][name] = row
    return result


def sample_candidates(policy, tok, rows: list, personas, sampling: Sampling) -> list[str]:
    """One sampled reply per row (a state), cleaned as the speakers' replies are."""
    seeds = [derive_seed(sampling.seed, "best-of-n", i) for i in range(len(rows))]
    texts = models.generate_texts(
        policy,
        tok,
        [s.prompt(personas) for s in rows],
        sampling.max_new_tokens,
        sampling.temperature,
        seeds=seeds,
    )
    return [models.clean_reply(t, s.persona, personas.names()) for s, t in zip(rows, texts)]


def independent_scores(rows: list, replies: list[str], identifier, function) -> list[dict]:
    """Per candidate, the independent evaluators' numbers (INDEPENDENT's keys): persona identification
    by the frozen base model, then persona function by the n-gram classifier; either may be None."""
    items = [
        (s.persona, s.context.situation, [(t.speaker, t.text) for t in s.history], r)
        for s, r in zip(rows, replies)
    ]
    identified = identifier.score(items) if identifier else [{}] * len(items)
    if function:
        functions = function.score([(speaker, reply) for speaker, _, _, reply in items])
    else:
        functions = [{}] * len(items)
    return [{**a, **b} for a, b in zip(identified, functions)]


def persona_id_scorer(gold: list[dict]):
    """The independent persona identifier as one more grader: each candidate's log-ratio."""

    def score(_rows, _replies) -> list[float]:
        return [float("-inf") if g["log_ratio"] is None else g["log_ratio"] for g in gold]

    return score


def top_picks(scores: list[float], n: int, n_states: int) -> list[int]:
    """Per state, the index of its top-scored candidate (state-major scores); a tie: the first."""
    return [max(range(n), key=lambda j: scores[i * n + j]) for i in range(n_states)]


def grade_picks(chosen: list[int], n: int, diags: list[dict], gold, independent: list[str]) -> dict:
    """One grader's picks against chance: per diagnostic the pick's rate and (difference, se); it
    passes when no hack's difference from chance is above 2 se (0 without one)."""
    graded = {k: vs_chance([d[k] for d in diags], n, chosen) for k in DIAGNOSTICS}
    row = {
        "rates": {k: g[0] for k, g in graded.items()},
        "difference": {k: g[1:] for k, g in graded.items()},
    }
    row["passes"] = all(
        row["difference"][k][0] <= 2 * (row["difference"][k][1] or 0.0) for k in HACKS
    )
    if gold is not None:
        row["independent"] = {k: vs_chance([g[k] for g in gold], n, chosen) for k in independent}
    return row


def within_state_correlation(xs: list[float], ys: list[float | None], n: int) -> float | None:
    """Pearson r of xs and ys after subtracting each state's mean from both (state-major, y None left out): how
    well x ranks the candidates OF ONE STATE, all a best-of-n pick or a GRPO group can use. None: no variation."""
    dx = []  # each kept candidate's x minus its state's mean x
    dy = []
    for start in range(0, len(xs), n):
        kept = [i for i in range(start, start + n) if ys[i] is not None]
        if len(kept) < 2:
            continue  # a lone candidate has nothing to be ranked against
        mx = sum(xs[i] for i in kept) / len(kept)
        my = sum(ys[i] for i in kept) / len(kept)
        dx += [xs[i] - mx for i in kept]
        dy += [ys[i] - my for i in kept]
    sxx = sum(a * a for a in dx)
    syy = sum(b * b for b in dy)
    if sxx == 0 or syy == 0:
        return None
    return sum(a * b for a, b in zip(dx, dy)) / (sxx * syy) ** 0.5


def vs_chance(values: list[float | None], n: int, picks: list[int]) -> tuple:
    """(pick mean, mean over states of pick minus state mean, its se); state-major S x n values, None left out."""
    picked = [(i, values[i * n + j]) for i, j in enumerate(picks) if values[i * n + j] is not None]
    diffs = [v - mean_or_none(values[i * n : (i + 1) * n]) for i, v in picked]
    return mean_or_none([v for _, v in picked]), mean_or_none(diffs), standard_error(diffs)


def format_best_of_n(result: dict) -> str:
    """Tables: each grader's pick vs chance per diagnostic, then by the independent evaluators."""
    lines = [
        f"best-of-{result['n']} on {result['states']} held-out states; rates of the pick vs chance (mean over all "
        "candidates); difference ± paired se",
        table_row("grader", DIAGNOSTICS, 22) + " | verdict",
        table_row("chance", [f"{result['chance'][k]:.3f}" for k in DIAGNOSTICS], 22) + " |",
    ]
    for name, row in result["scorers"].items():
        cells = [pick_cell(row["rates"][k], *row["difference"][k]) for k in DIAGNOSTICS]
        verdict = " | pass" if row["passes"] else " | FAIL: picks hacks more often than chance"
        lines.append(table_row(name, cells, 22) + verdict)
    if "independent_chance" in result:
        keys = list(result["independent_chance"])
        lines += [
            "",
            "the independent evaluators (persona identification by the frozen base model, extras/evaluators.py; "
            "persona function, extras/strategies.py; no grader above saw them): the pick vs chance, difference ± "
            "paired se",
            table_row("grader", [INDEPENDENT[k] for k in keys], 32),
            table_row("chance", [pick_cell(result["independent_chance"][k]) for k in keys], 32),
        ]
        for name, row in result["scorers"].items():
            cells = [pick_cell(*row["independent"][k]) for k in keys]
            lines.append(table_row(name, cells, 32))
    return "\n".join(lines)


def table_row(name: str, cells: list, width: int) -> str:
    """One line of format_best_of_n's tables: the name, then the cells right-aligned."""
    return f"{name:<16} | " + " | ".join(f"{c:>{width}}" for c in cells)


def pick_cell(mean, diff=None, se=None) -> str:
    """A pick's mean and, given one, its paired difference from chance ± se: "0.250 (+0.125±0.060)"."""
    text = "n/a" if mean is None else f"{mean:.3f}"
    if diff is not None:
        text += f" ({diff:+.3f}±{reward.shown(se)})"
    return text


# --- The commands ----------------------------------------------------------------------------------
def main(argv: list[str], cli) -> int:
    """`mascot.py judge-eval ...` and `mascot.py judge-stress ...` (argv[0] is the command)."""
    stress = argv[0] == "judge-stress"
    p = cli.Parser(prog=f"mascot.py {argv[0]}", formatter_class=cli.Formatter)
    cli.common_flags(p, trained=stress)
    if stress:
        add_stress_flags(p)
    else:
        add_eval_flags(p)
    checked = "each pick" if stress else "the in-role pairs"
    p.add_argument(
        "--persona-id",
        action=argparse.BooleanOptionalAction,
        default=stress,
        help=f"the independent evaluator (extras/evaluators.py, the frozen --model) on {checked}",
    )
    args = p.parse_args(argv[1:])
    cli.check_device(args)
    if stress:
        # judge-stress writes RUN/stress/: not while train or evaluate writes the run.
        with runs.run_lock(args.run):
            return judge_stress(args, cli)
    return judge_eval(args, cli)


def add_stress_flags(p) -> None:
    p.add_argument(
        "--rm",
        default=None,
        help="reward model folder to test too (default: RUN/stage1/reward_model if any)",
    )
    p.add_argument(
        "--n",
        type=flag_type("--n", int, "at-least-2"),
        default=16,
        help="candidates per state",
    )
    p.add_argument(
        "--states",
        type=flag_type("--states", int, "positive"),
        default=16,
        help="held-out states",
    )
    p.add_argument(
        "--temperature",
        type=flag_type("--temperature", float, "positive"),
        default=1.0,
        help="candidates' sampling temperature",
    )


def add_eval_flags(p) -> None:
    p.add_argument(
        "--pairs",
        required=True,
        nargs="+",
        help="JSON-lines file(s) of labelled pairs (data/README.md)",
    )
    p.add_argument("--cache", default=None, help="judge cache file (JSON lines); none by default")


def judge_eval(args, cli) -> int:
    """`judge-eval`: the judge's accuracy on the labelled pairs, then (--persona-id) the evaluator's."""
    judge = cli.make_judge(args, args.cache, args.personas)
    pairs = []
    for path in args.pairs:
        pairs += load_pairs(path)
    t0 = time.time()
    result = evaluate_pairs(judge, pairs)
    print(format_eval_report(result))
    print(
        f"({result['n']} pairs, {result['no_verdict']} without a verdict, {result['unreadable']} of them "
        f"unreadable; judge {judge.name}, {time.time() - t0:.1f} s)"
    )
    if args.persona_id:
        print_persona_id(args, cli, pairs)
    return 0


def print_persona_id(args, cli, pairs: list[dict]) -> None:
    """On the wrong-role and off-role pairs (the worse reply is another persona's), does the
    independent evaluator under the frozen base model prefer the in-role reply? A markdown table."""
    base = cli.load_role(args.model, "speakers", args)  # the frozen base model
    sets = scenarios.persona_sets(args.personas)
    owner = {}  # persona name -> the identifier of its set
    for set_name in sets:
        persona_set = scenarios.load_personas(args.personas, set_name)
        for persona in persona_set.personas:
            owner[persona.name] = PersonaIdentifier(*base, persona_set)
    chosen = [
        p for p in pairs if p.get("failure") in ("wrong-role", "off-role") and p["persona"] in owner
    ]
    print(
        f"\npersona identification under the frozen {args.model}: {len(chosen)} wrong-role / off-role pairs\n"
        "| failure | pairs | prefers the in-role reply | exact two-sided p | in-role reply identified |\n|---|---|---|---|---|"
    )
    for kind, r in sorted(validate(owner.__getitem__, chosen).items()):
        print(
            f"| {kind} | {r['n']} | {r['prefers_better']}/{r['n']} = {r['prefers_better'] / r['n']:.2f} | "
            f"{r['p_value']:.3g} | {r['id_correct']}/{r['n']} |"
        )


def judge_stress(args, cli) -> int:
    """`judge-stress`: best-of-N against the judge and the reward model, on held-out states."""
    run = Path(args.run)
    inputs = cli.load_inputs(args, earlier=[run / "stage1" / "config.json"])
    spec = cli.speakers_of(args)
    personas = inputs.personas
    policy, tok = cli.load_role(spec, "speakers", args, run / "stress" / "served_cache.jsonl")
    states = reward.build_states(
        inputs.held_out, personas, args.states, args.seed + 1, {}, "heldout"
    )
    judge_cache = None if args.judge == "offline" else run / "stress" / "judge_cache.jsonl"
    judge = cli.make_judge(args, judge_cache, args.personas)
    scorers = {"judge": judge_scorer(judge, personas)}
    rm_folder = args.rm or loading.trained_or(run / "stage1" / "reward_model", "") or None
    if rm_folder:
        scorers["rm"] = reward_model_scorer(rm_folder, args, cli, personas)
    identifier, function = independent_evaluators(args, cli, spec, (policy, tok), personas)
    sampling = Sampling(args.n, args.max_new_tokens, args.temperature, args.seed)
    result = best_of_n(policy, tok, states, personas, scorers, sampling, identifier, function)
    result.update({"judge": judge.name, "rm": rm_folder, "policy": spec})
    print(format_best_of_n(result))
    files.write_json(run / "stress" / "results.json", result)
    print(
        f"judge {judge.name}; reward model {rm_folder or 'none'}; wrote {run / 'stress' / 'results.json'}"
    )
    return 0


def judge_scorer(judge: Judge, personas):
    """The judge as a best-of-N grader: its pointwise score of each candidate."""

    def score(rows, replies) -> list[float]:
        return judge.score_many([s.judge_state(personas) for s in rows], replies)

    return score


def reward_model_scorer(folder: str, args, cli, personas):
    """Stage 1's reward model as a best-of-N grader: its reward of each candidate."""
    rm, rm_tok = reward.RewardModel.load(folder, device=args.device, dtype=cli.frozen_dtype(args))

    def score(rows, replies) -> list[float]:
        return rm.score_texts(rm_tok, [s.rm_messages(personas, r) for s, r in zip(rows, replies)])

    return score


def independent_evaluators(args, cli, spec: str, policy: tuple, personas) -> tuple:
    """(persona identifier or None, persona-function evaluator or None). The identifier runs on the
    frozen base model, even when the policy is a trained one; the function evaluator needs cards
    that list ESConv strategies."""
    if spec == args.model or not args.persona_id:
        base = policy  # (model, tokenizer)
    else:
        base = cli.load_role(args.model, "speakers", args)
    identifier = PersonaIdentifier(*base, personas) if args.persona_id else None
    function = None
    if any(p.esconv_strategies for p in personas.personas):
        function = cli.extra("strategies").FunctionEvaluator(policy[1] or base[1], personas)
    return identifier, function
