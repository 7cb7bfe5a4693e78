"""director_headroom.py: how much could ANY director gain over the least-spoken rule under stage 2's reward?

Stage 2 trains the director to pick, at each decision point, the agent whose block of turns gets the highest group
reward (director.block_reward). When a trained director does not beat the least-spoken rule, first ask whether the
reward leaves anything to learn: this rolls every held-out decision point's block out once per agent (that agent first,
with its first ESConv strategy's action and tone; the rule directs the rest) and once with the rule alone, on --seeds
sampling seeds ("replicates": same points, every turn re-sampled). Beside each policy's mean reward per replicate:
  - the in-sample oracle: per point the best agent of a replicate, scored on the SAME one (optimistic: noise helps);
  - the cross-validated oracle: per point the agent best on the other replicates, scored against the rule on the one
    left out: what learning each point's best first agent could gain (<= 0: nothing to learn); per fold, and all folds
    pooled (se across points), with and without balance, also minus the best SINGLE agent picked alike (what reading
    the conversation adds to always naming one agent);
  - how often two replicates agree on a point's best agent (chance ~1/#agents), and the correlation across replicates of
    each (point, agent) reward minus its point's mean (0: whom to pick is noise), for the reward and each component.
Every flag defaults to the stage-2 run's own (RUN/stage2/config.json); the held-out points come from
RUN/stage2/decision_points.jsonl (built alike when missing). Cost: (#agents + 1) x --seeds evaluations.
    python mascot.py director-headroom --run runs/esc20 --seeds 4      (writes RUN/stage2/headroom.json)
"""

import dataclasses
import itertools
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the project's modules, from the repo root
import director as dr  # noqa: E402
import models  # noqa: E402
import scenarios
from extras.judges import within_state_correlation  # noqa: E402
from metrics import paired_change  # noqa: E402
from plumbing import common, files
from plumbing.cli import flag_type
from reward import shown  # noqa: E402
from simulate import Cast, Conversation, Directive, LeastSpoken, Turn  # noqa: E402

REPLICATE_SALT = 100_003  # replicate r adds r x this to every point's seed


def conversation_from_json(row: dict, context: scenarios.Context) -> Conversation:
    """A decision point back from its line of RUN/stage2/decision_points.jsonl (Conversation.to_json)."""
    if row["context_id"] != context.id:
        raise ValueError(
            f"transcript row of context {row['context_id']} given context {context.id}"
        )
    turns = [
        Turn(t["speaker"], t["text"], Directive(**t["directive"]) if t["directive"] else None)
        for t in row["turns"]
    ]
    return Conversation(
        context,
        row["persona_set"],
        row["profile"],
        row["policy"],
        row["seed"],
        turns,
        list(row["events"]),
        any(e.get("type") == "crisis" for e in row["events"]),
    )


def headroom(rewards: list[dict[str, list[float]]], names: list[str]) -> dict:
    """The module docstring's oracles and agreement, from per-replicate rewards {policy: [reward per point]}."""
    n, pairs = len(rewards[0]["rule"]), list(itertools.combinations(range(len(rewards)), 2))
    best = [[max(names, key=lambda g: r[g][i]) for i in range(n)] for r in rewards]
    out = {
        "n": n,
        "per_policy": [{k: sum(v) / n for k, v in r.items()} for r in rewards],
        "oracle_in_sample": [sum(r[b[i]][i] for i in range(n)) / n for r, b in zip(rewards, best)],
        "oracle_cross": [],
    }
    rule, picks, fixed = [], [], []  # every fold's rows, clustered by point below
    for j, r in enumerate(rewards):  # leave replicate j out: pick on the others, score on j
        others = [q for m, q in enumerate(rewards) if m != j]
        picked = [r[max(names, key=lambda g: sum(q[g][i] for q in others))][i] for i in range(n)]
        change, se = paired_change(r["rule"], picked)
        out["oracle_cross"].append({"mean": sum(picked) / n, "vs_rule": change, "se": se})
        one = max(names, key=lambda g: sum(sum(q[g]) for q in others))  # one agent for every point
        rule, picks, fixed = rule + r["rule"], picks + picked, fixed + r[one]
    (d_r, se_r), (d_1, se_1) = (
        paired_change(x, picks, clusters=list(range(n)) * len(rewards)) for x in (rule, fixed)
    )
    out["oracle_pooled"] = {
        "vs_rule": d_r,
        "se": se_r,
        "vs_one": d_1,
        "se_one": se_1,
    }  # a point's folds: one cluster
    out["best_agree"] = sum(best[a][i] == best[b][i] for a, b in pairs for i in range(n)) / (
        n * len(pairs)
    )
    # Each point's agents are one "state": their rewards minus the point's mean, correlated across replicates.
    flat = [[r[g][i] for i in range(n) for g in names] for r in rewards]
    out["deviation_corr"] = sum(
        within_state_correlation(flat[a], flat[b], len(names)) or 0.0 for a, b in pairs
    ) / len(pairs)
    return out


def parse_args(argv: list[str], cli):
    """train --stage 2's flags (the run's own command line works as it is), defaulting to its config, and --seeds."""
    p = cli.Parser(
        prog="mascot.py director-headroom",
        description=__doc__.split("\n")[0],
        formatter_class=cli.Formatter,
    )
    cli.common_flags(p)
    cli.add_options(p, dr.DirectorConfig)
    cli.add_options(p, dr.RewardWeights, prefix="w-")
    p.add_argument(
        "--seeds",
        type=flag_type("--seeds", int, "at-least-2"),
        default=4,
        help="replicates: independent sampling seeds of every rollout",
    )
    config = Path(p.parse_known_args(argv)[0].run) / "stage2" / "config.json"
    saved = files.read_json(config) if config.is_file() else {}
    p.set_defaults(**{k: v for k, v in saved.items() if k in vars(p.parse_args([]))})
    return p.parse_args(argv), config


def main(argv: list[str], cli) -> int:
    """`mascot.py director-headroom ...` (argv[0] is the command; cli is mascot.py)."""
    args, config = parse_args(argv[1:], cli)
    out, inputs = config.parent, cli.load_inputs(args, earlier=[config])
    cli.check_device(args)
    speakers, cache = cli.speakers_of(args), out / "served_cache.jsonl"
    speaker = cli.load_role(speakers, "speakers", args, cache)
    user = (
        speaker
        if (args.user or args.model) == speakers
        else cli.load_role(args.user or args.model, "user", args, cache)
    )
    cast = Cast(inputs.personas, *speaker, *user, args.max_new_tokens)
    encoder = models.SentenceEncoder(args.device)
    rollout = dr.Rollout(
        cast,
        inputs.profiles,
        inputs.personas,
        encoder,
        cli.make_judge(args, out / "judge_cache.jsonl", args.personas, encoder),
        cli.options(dr.RewardWeights, args, prefix="w-"),
        args.rollout_turns,
        args.user_every,
    )
    if args.director_warmup_data:  # the grounded terms, as train --stage 2 adds them
        esconv = [
            c for part in cli.read_data(args.director_warmup_data, args.set).values() for c in part
        ]
        rollout.grounding = dr.Grounding(esconv, inputs.personas, encoder, args.held_out, args.seed)
    by_id, path = {c.id: c for c in inputs.held_out}, out / "decision_points.jsonl"
    scenarios.require_mapping(inputs.personas, f"--set {args.set}")
    directives = {
        p.name: dr.directive_for(p.esconv_strategies[0], inputs.personas)
        for p in inputs.personas.personas
        if p.esconv_strategies
    }  # each agent's FIRST strategy
    names = list(directives)
    rows = [r for r in files.read_jsonl(path) if r["split"] == "heldout"] if path.exists() else None
    if rows and any(r["context_id"] not in by_id for r in rows):
        raise common.UserError(
            f"{path}: a held-out point's context is not among the held-out contexts of --data "
            f"{args.data} (pass the run's own --data, --held-out and --seed)"
        )
    points = (
        [conversation_from_json(r, by_id[r["context_id"]]) for r in rows]
        if rows
        else dr.build_decision_points(
            inputs.held_out,
            args.heldout_points,
            cast,
            inputs.profiles,
            args.user_every,
            args.seed + 1,
        )
    )
    rule, rewards, parts = (
        LeastSpoken(inputs.personas),
        [],
        [],
    )  # per replicate: {policy: [reward]}, {policy: [components]}
    for rep in range(args.seeds):
        pts = [
            dataclasses.replace(p, seed=p.seed + rep * REPLICATE_SALT) for p in points
        ]  # Rollout.run copies them
        scored = {
            "rule": rollout.run(pts, rule)[0],
            **{g: rollout.run(pts, rule, first=[directives[g]] * len(pts))[0] for g in names},
        }
        print(f"replicate {rep + 1}/{args.seeds} done", flush=True)
        rewards.append({k: [s for s, _ in v] for k, v in scored.items()})
        parts.append({k: [c for _, c in v] for k, v in scored.items()})
    result, w = (
        headroom(rewards, names),
        rollout.weights.balance,
    )  # balance favours the rule by construction
    result["without_balance"] = headroom(
        [
            {k: [t - w * c["balance"] for t, c in zip(r[k], p[k])] for k in r}
            for r, p in zip(rewards, parts)
        ],
        names,
    )["oracle_pooled"]
    by_component = {
        comp: headroom([{k: [c[comp] for c in v] for k, v in p.items()} for p in parts], names)[
            "deviation_corr"
        ]
        for comp in parts[0]["rule"][0]
    }
    files.write_json(
        out / "headroom.json",
        {
            "rewards": rewards,
            "components": parts,
            **result,
            "deviation_corr_by_component": by_component,
        },
    )
    print(
        f"\n{result['n']} held-out points, {args.seeds} replicates (seeds +r x {REPLICATE_SALT}); the run's weights"
    )
    for g in [*names, "rule"]:
        print(
            f"  {'least-spoken rule' if g == 'rule' else f'always {g} first':28s} "
            + "  ".join(f"{r[g]:.3f}" for r in result["per_policy"])
        )
    print(
        f"  {'oracle, in sample':28s} "
        + "  ".join(f"{x:.3f}" for x in result["oracle_in_sample"])
        + "   (optimistic)"
    )
    for j, c in enumerate(result["oracle_cross"]):
        print(
            f"  oracle picked on replicate{'s' if args.seeds > 2 else ''} "
            f"{','.join(str(m + 1) for m in range(args.seeds) if m != j)}, scored on {j + 1}: "
            f"{c['mean']:.3f}; minus the rule {c['vs_rule']:+.3f} ± {shown(c['se'])} (paired se)"
        )
    for label, c in (
        ("", result["oracle_pooled"]),
        (", without balance", result["without_balance"]),
    ):
        print(
            f"  all folds pooled{label}: minus the rule {c['vs_rule']:+.3f} ± {shown(c['se'])}; minus the best single "
            f"agent {c['vs_one']:+.3f} ± {shown(c['se_one'])} (se across points)"
        )
    print(
        f"  best agent the same on two replicates: {result['best_agree']:.2f} of points (chance ~{1 / len(names):.2f})"
    )
    print(
        f"  correlation of (point, agent) reward deviations across replicates: {result['deviation_corr']:+.2f}; per "
        "component (unweighted): " + ", ".join(f"{k} {v:+.2f}" for k, v in by_component.items())
    )
    print(f"written: {out / 'headroom.json'}")
    return 0
