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
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the project's modules, from the repo root
import models  # noqa: E402
import reward  # noqa: E402
import scenarios
from extras.evaluators import EQUAL_TOKENS, PersonaIdentifier  # noqa: E402
from judge import Judge  # noqa: E402
from metrics import DIAGNOSTICS, HACKS, binomial_two_sided_p, mean_or_none, rates, standard_error  # noqa: E402
from plumbing import files, loading, runs
from plumbing.cli import flag_type
from plumbing.common import UserError, derive_seed
from simulate import JudgeState  # noqa: E402

# --- judge-eval: how often does a judge prefer the better reply of a labelled pair? ---------------
PAIR_FIELDS = (
    "persona",
    "persona_desc",
    "context",
    "history",
    "better",
    "worse",
)  # + "failure", "situation"


def load_pairs(path: str | Path) -> list[dict]:
    """A judge-pair JSON-lines file (data/README.md), every field checked."""
    records = files.read_jsonl(path, numbered=True)
    for number, pair in records:
        where = f"{path}: line {number}"
        for key in PAIR_FIELDS:
            if not isinstance(pair.get(key), list if key == "history" else str):
                raise UserError(
                    f"{where}: field '{key}' "
                    + (
                        f"must be {'a list' if key == 'history' else 'text'}"
                        if key in pair
                        else "is missing; every judge pair needs " + ", ".join(PAIR_FIELDS)
                    )
                )
        if not all(
            isinstance(t, dict)
            and isinstance(t.get("speaker"), str)
            and isinstance(t.get("text"), str)
            for t in pair["history"]
        ):
            raise UserError(
                f'{where}: every \'history\' turn must be {{"speaker": "...", "text": "..."}}'
            )
    return [pair for _, pair in records]


def evaluate_pairs(judge: Judge, pairs: list[dict]) -> dict:
    """The share of pairs where the judge prefers `better`. Even pairs are asked (better, worse), odd ones swapped, so a
    judge that always picks one position scores 0.5. No verdict counts as wrong; `unreadable`: unparsable answers."""
    firsts = [p["better"] if i % 2 == 0 else p["worse"] for i, p in enumerate(pairs)]
    seconds = [p["worse"] if i % 2 == 0 else p["better"] for i, p in enumerate(pairs)]
    states = [
        JudgeState(
            p["persona"],
            p["persona_desc"],
            p["context"],
            list(p["history"]),
            p.get("situation", ""),
        )
        for p in pairs
    ]  # what the judge sees besides the two replies
    verdicts = judge.compare_many(states, firsts, seconds)
    right = [
        v.preferred == i % 2 for i, v in enumerate(verdicts)
    ]  # better: position 0 for even i, 1 for odd
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
            c, n = out[f"per_{field}"].get(pair[field], (0, 0))
            out[f"per_{field}"][pair[field]] = (c + ok, n + 1)
    return out


def format_eval_report(result: dict) -> str:
    """'accuracy: 0.857' on the first line, then one line per persona and per failure kind."""
    rows = lambda counts: [f"  {k}: {c}/{n} = {c / n:.3f}" for k, (c, n) in sorted(counts.items())]  # noqa: E731
    return "\n".join(
        [f"accuracy: {result['accuracy']:.3f}", *rows(result["per_persona"])]
        + (["per failure kind:", *rows(result["per_failure"])] if result.get("per_failure") else [])
    )


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
        better, worse = identifier_for(pair["persona"]).score(
            [
                (pair["persona"], pair.get("situation", ""), history, pair[k])
                for k in ("better", "worse")
            ]
        )
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


def best_of_n(
    policy,
    tok,
    states: list,
    personas,
    scorers: dict,
    n: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    identifier=None,
    function=None,
) -> dict:
    """Best-of-N: n replies per state; each scorer (name -> fn(states, replies) -> scores) picks its top one. Per
    diagnostic (metrics.diagnose): the pick's rate and its paired difference from chance (the state's candidate mean).
    identifier, function: each pick's persona-ID and -function numbers too; "persona-id" also joins the graders."""
    rows = [s for s in states for _ in range(n)]
    texts = models.generate_texts(
        policy,
        tok,
        [s.prompt(personas) for s in rows],
        max_new_tokens,
        temperature,
        seeds=[derive_seed(seed, "best-of-n", i) for i in range(len(rows))],
    )
    replies = [models.clean_reply(t, s.persona, personas.names()) for s, t in zip(rows, texts)]
    diags = [s.diagnose(personas, r) for s, r in zip(rows, replies)]
    result = {"n": n, "states": len(states), "chance": rates(diags), "scorers": {}}
    rng = random.Random(derive_seed(seed, "random-pick"))
    picks, gold = {"random": [rng.randrange(n) for _ in states]}, None
    if identifier is not None or function is not None:
        items = [
            (s.persona, s.context.situation, [(t.speaker, t.text) for t in s.history], r)
            for s, r in zip(rows, replies)
        ]
        gold = [
            {**a, **b}
            for a, b in zip(
                identifier.score(items) if identifier else [{}] * len(items),
                function.score([(i[0], i[3]) for i in items]) if function else [{}] * len(items),
            )
        ]
        result["independent_chance"] = {
            k: mean_or_none([g[k] for g in gold]) for k in INDEPENDENT if k in gold[0]
        }
    if identifier is not None:
        scorers = {
            **scorers,
            "persona-id": lambda _s, _r: [
                float("-inf") if g["log_ratio"] is None else g["log_ratio"] for g in gold
            ],
        }
    for (
        name,
        scorer,
    ) in scorers.items():  # per state, the index of its top-scored candidate; the first of a tie
        scores = scorer(rows, replies)
        picks[name] = [max(range(n), key=lambda j: scores[i * n + j]) for i in range(len(states))]
    for (
        name,
        chosen,
    ) in picks.items():  # passes: no flag's difference from chance above 2 se (0 without one)
        graded = {k: vs_chance([d[k] for d in diags], n, chosen) for k in DIAGNOSTICS}
        row = result["scorers"][name] = {
            "rates": {k: g[0] for k, g in graded.items()},
            "difference": {k: g[1:] for k, g in graded.items()},
        }
        row["passes"] = all(
            row["difference"][k][0] <= 2 * (row["difference"][k][1] or 0.0) for k in HACKS
        )
        if gold is not None:
            row["independent"] = {
                k: vs_chance([g[k] for g in gold], n, chosen) for k in result["independent_chance"]
            }
        row["picks"] = [
            {"state": states[i].id, "persona": states[i].persona, "reply": replies[i * n + j]}
            for i, j in enumerate(chosen)
        ]  # every pick, to read beside the random one
    return result


def within_state_correlation(xs: list[float], ys: list[float | None], n: int) -> float | None:
    """Pearson r of xs and ys after subtracting each state's mean from both (state-major, y None left out): how
    well x ranks the candidates OF ONE STATE, all a best-of-n pick or a GRPO group can use. None: no variation."""
    dx, dy = [], []
    for kept in (
        [i for i in range(start, start + n) if ys[i] is not None] for start in range(0, len(xs), n)
    ):
        if len(kept) >= 2:
            mx, my = (sum(v[i] for i in kept) / len(kept) for v in (xs, ys))
            dx += [xs[i] - mx for i in kept]
            dy += [ys[i] - my for i in kept]
    sxx, syy = sum(a * a for a in dx), sum(b * b for b in dy)
    return None if sxx == 0 or syy == 0 else sum(a * b for a, b in zip(dx, dy)) / (sxx * syy) ** 0.5


def vs_chance(values: list[float | None], n: int, picks: list[int]) -> tuple:
    """(pick mean, mean over states of pick minus state mean, its se); state-major S x n values, None left out."""
    picked = [(i, values[i * n + j]) for i, j in enumerate(picks) if values[i * n + j] is not None]
    diffs = [v - mean_or_none(values[i * n : (i + 1) * n]) for i, v in picked]
    return mean_or_none([v for _, v in picked]), mean_or_none(diffs), standard_error(diffs)


def format_best_of_n(result: dict) -> str:
    """Tables: each grader's pick vs chance per diagnostic, then by the independent evaluators."""
    line = lambda name, cells, width: f"{name:<16} | " + " | ".join(f"{c:>{width}}" for c in cells)  # noqa: E731
    _cell = lambda mean, diff=None, se=None: (  # noqa: E731  "0.250 (+0.125±0.060)"
        ("n/a" if mean is None else f"{mean:.3f}")
        + ("" if diff is None else f" ({diff:+.3f}±{reward.shown(se)})")
    )
    lines = [
        f"best-of-{result['n']} on {result['states']} held-out states; rates of the pick vs chance (mean over all "
        "candidates); difference ± paired se",
        line("grader", DIAGNOSTICS, 22) + " | verdict",
        line("chance", [f"{result['chance'][k]:.3f}" for k in DIAGNOSTICS], 22) + " |",
    ]
    lines += [
        line(name, [_cell(row["rates"][k], *row["difference"][k]) for k in DIAGNOSTICS], 22)
        + (" | pass" if row["passes"] else " | FAIL: picks hacks more often than chance")
        for name, row in result["scorers"].items()
    ]
    if "independent_chance" in result:
        keys = list(result["independent_chance"])
        lines += [
            "",
            "the independent evaluators (persona identification by the frozen base model, extras/evaluators.py; "
            "persona function, extras/strategies.py; no grader above saw them): the pick vs chance, difference ± "
            "paired se",
            line("grader", [INDEPENDENT[k] for k in keys], 32),
            line("chance", [_cell(result["independent_chance"][k]) for k in keys], 32),
        ]
        lines += [
            line(name, [_cell(*row["independent"][k]) for k in keys], 32)
            for name, row in result["scorers"].items()
        ]
    return "\n".join(lines)


# --- The commands ----------------------------------------------------------------------------------
def main(argv: list[str], cli) -> int:
    """`mascot.py judge-eval ...` and `mascot.py judge-stress ...` (argv[0] is the command)."""
    stress, p = (
        argv[0] == "judge-stress",
        cli.Parser(prog=f"mascot.py {argv[0]}", formatter_class=cli.Formatter),
    )
    cli.common_flags(p, trained=stress)
    if stress:
        p.add_argument(
            "--rm",
            default=None,
            help="reward model folder to test too (default: RUN/stage1/reward_model if any)",
        )
        for flag, kind, check, default, about in (
            ("--n", int, "at-least-2", 16, "candidates per state"),
            ("--states", int, "positive", 16, "held-out states"),
            ("--temperature", float, "positive", 1.0, "candidates' sampling temperature"),
        ):
            p.add_argument(flag, type=flag_type(flag, kind, check), default=default, help=about)
    else:
        p.add_argument(
            "--pairs",
            required=True,
            nargs="+",
            help="JSON-lines file(s) of labelled pairs (data/README.md)",
        )
        p.add_argument(
            "--cache", default=None, help="judge cache file (JSON lines); none by default"
        )
    p.add_argument(
        "--persona-id",
        action=argparse.BooleanOptionalAction,
        default=stress,
        help="the independent evaluator "
        "(extras/evaluators.py, the frozen --model) on "
        + ("each pick" if stress else "the in-role pairs"),
    )
    args = p.parse_args(argv[1:])
    cli.check_device(args)
    if stress:
        with runs.run_lock(
            args.run
        ):  # it writes RUN/stress/: not while train or evaluate writes the run
            return judge_stress(args, cli)
    judge = cli.make_judge(args, args.cache, args.personas)
    pairs, t0 = [p for path in args.pairs for p in load_pairs(path)], time.time()
    result = evaluate_pairs(judge, pairs)
    print(format_eval_report(result))
    print(
        f"({result['n']} pairs, {result['no_verdict']} without a verdict, {result['unreadable']} of them "
        f"unreadable; judge {judge.name}, {time.time() - t0:.1f} s)"
    )
    if args.persona_id:
        base, sets = (
            cli.load_role(args.model, "speakers", args),
            scenarios.persona_sets(args.personas),
        )  # the frozen base model
        owner = {
            p.name: PersonaIdentifier(*base, ps)
            for ps in [scenarios.load_personas(args.personas, s) for s in sets]
            for p in ps.personas
        }  # persona name -> its set's identifier
        chosen = [
            p
            for p in pairs
            if p.get("failure") in ("wrong-role", "off-role") and p["persona"] in owner
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
    return 0


def judge_stress(
    args, cli
) -> int:  # best-of-N against the judge and the reward model, held-out states
    run = Path(args.run)
    inputs, spec = (
        cli.load_inputs(args, earlier=[run / "stage1" / "config.json"]),
        cli.speakers_of(args),
    )
    personas = inputs.personas
    policy, tok = cli.load_role(spec, "speakers", args, run / "stress" / "served_cache.jsonl")
    states = reward.build_states(
        inputs.held_out, personas, args.states, args.seed + 1, {}, "heldout"
    )
    judge = cli.make_judge(
        args,
        None if args.judge == "offline" else run / "stress" / "judge_cache.jsonl",
        args.personas,
    )
    scorers = {
        "judge": lambda rows, replies: judge.score_many(
            [s.judge_state(personas) for s in rows], replies
        )
    }
    rm_folder = args.rm or loading.trained_or(run / "stage1" / "reward_model", "") or None
    if rm_folder:
        rm, rm_tok = reward.RewardModel.load(
            rm_folder, device=args.device, dtype=cli.frozen_dtype(args)
        )
        scorers["rm"] = lambda rows, replies: rm.score_texts(
            rm_tok, [s.rm_messages(personas, r) for s, r in zip(rows, replies)]
        )
    # The independent evaluator runs on the frozen base model, even when the policy is a trained one.
    base = (
        (policy, tok)
        if spec == args.model or not args.persona_id
        else cli.load_role(args.model, "speakers", args)
    )
    identifier = PersonaIdentifier(*base, personas) if args.persona_id else None
    function = (
        cli.extra("strategies").FunctionEvaluator(tok or base[1], personas)
        if any(p.esconv_strategies for p in personas.personas)
        else None
    )
    result = best_of_n(
        policy,
        tok,
        states,
        personas,
        scorers,
        args.n,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        identifier,
        function,
    )
    result.update({"judge": judge.name, "rm": rm_folder, "policy": spec})
    print(format_best_of_n(result))
    files.write_json(run / "stress" / "results.json", result)
    print(
        f"judge {judge.name}; reward model {rm_folder or 'none'}; wrote {run / 'stress' / 'results.json'}"
    )
    return 0
