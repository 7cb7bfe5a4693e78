"""extras/director_headroom.py: how much could ANY director gain over the least-spoken rule under stage 2's reward?

A diagnostic beside stage 2. Stage 2 trains the director to pick, at each decision point, the agent whose block of
turns gets the highest group reward (director.block_reward). When a trained director does not beat the least-spoken
rule, first ask whether the reward leaves anything to learn: this rolls every held-out decision point's block out once
per agent (that agent first, with its first ESConv strategy's action and tone; the rule directs the rest) and once with
the rule alone, on --seeds sampling seeds ("replicates": same points, every turn re-sampled). Beside each policy's mean
reward per replicate:
  - the in-sample oracle: per point the best agent of a replicate, scored on the SAME one (optimistic: noise helps);
  - the cross-validated oracle: per point the agent best on the other replicates, scored against the rule on the one
    left out: what learning each point's best first agent could gain (<= 0: nothing to learn); per fold, and all folds
    pooled (se across points), with and without balance, also minus the best SINGLE agent picked alike (what reading
    the conversation adds to always naming one agent);
  - how often two replicates agree on a point's best agent (chance ~1/#agents), and the correlation across replicates of
    each (point, agent) reward minus its point's mean (0: whom to pick is noise), for the reward and each component.
Simplified: only the first agent of a block varies, with one directive per agent (its first strategy's).
Every flag defaults to the stage-2 run's own (RUN/stage2/config.json); the held-out points come from
RUN/stage2/decision_points.jsonl (built alike when missing). Cost: (#agents + 1) x --seeds evaluations.
    python mascot.py director-headroom --run runs/default --seeds 4      (writes RUN/stage2/headroom.json)
"""

import dataclasses
import itertools
from pathlib import Path

import director as dr
import scenarios
from extras.judges import within_state_correlation
from metrics import paired_change
from plumbing import common, files, loading
from plumbing.cli import flag_type
from reward import shown
from simulate import Cast, Conversation, Directive, LeastSpoken, Turn

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
    n = len(rewards[0]["rule"])
    pairs = list(itertools.combinations(range(len(rewards)), 2))  # every two replicates
    best = [[max(names, key=lambda g: r[g][i]) for i in range(n)] for r in rewards]
    out = {
        "n": n,
        "per_policy": [{k: sum(v) / n for k, v in r.items()} for r in rewards],
        "oracle_in_sample": [sum(r[b[i]][i] for i in range(n)) / n for r, b in zip(rewards, best)],
        "oracle_cross": [],
    }
    rule = []  # every fold's rows, clustered by point below
    picks = []
    fixed = []
    for j, r in enumerate(rewards):  # leave replicate j out: pick on the others, score on j
        others = [q for m, q in enumerate(rewards) if m != j]
        picked = [r[max(names, key=lambda g: sum(q[g][i] for q in others))][i] for i in range(n)]
        change, se = paired_change(r["rule"], picked)
        out["oracle_cross"].append({"mean": sum(picked) / n, "vs_rule": change, "se": se})
        one = max(names, key=lambda g: sum(sum(q[g]) for q in others))  # one agent for every point
        rule += r["rule"]
        picks += picked
        fixed += r[one]
    clusters = list(range(n)) * len(rewards)  # a point's folds: one cluster
    d_rule, se_rule = paired_change(rule, picks, clusters=clusters)
    d_one, se_one = paired_change(fixed, picks, clusters=clusters)
    out["oracle_pooled"] = {"vs_rule": d_rule, "se": se_rule, "vs_one": d_one, "se_one": se_one}
    agree = 0  # (pair of replicates, point) with the same best agent
    for a, b in pairs:
        agree += sum(best[a][i] == best[b][i] for i in range(n))
    out["best_agree"] = agree / (n * len(pairs))
    # Each point's agents are one "state": their rewards minus the point's mean, correlated across replicates.
    flat = [point_major(r, names, n) for r in rewards]
    correlations = [within_state_correlation(flat[a], flat[b], len(names)) or 0.0 for a, b in pairs]
    out["deviation_corr"] = sum(correlations) / len(pairs)
    return out


def point_major(rewards: dict[str, list[float]], names: list[str], n: int) -> list[float]:
    """One replicate's rewards point by point, each point's agents in `names` order."""
    flat = []
    for i in range(n):
        flat += [rewards[g][i] for g in names]
    return flat


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
    out = config.parent
    inputs = cli.load_inputs(args, earlier=[config])
    cli.check_device(args)
    cast, rollout = build_rollout(args, cli, inputs, out)
    scenarios.require_mapping(inputs.personas, f"--set {args.set}")
    directives = {  # each agent's FIRST strategy, as a directive
        p.name: dr.directive_for(p.esconv_strategies[0], inputs.personas)
        for p in inputs.personas.personas
        if p.esconv_strategies
    }
    names = list(directives)
    points = held_out_points(args, inputs, cast, out / "decision_points.jsonl")
    rewards, parts = replicate_rewards(args, rollout, points, directives, inputs.personas)
    result = headroom(rewards, names)
    # Balance favours the rule by construction: the pooled oracle once more without it.
    w = rollout.weights.balance
    without = [
        {k: [t - w * c["balance"] for t, c in zip(r[k], p[k])] for k in r}
        for r, p in zip(rewards, parts)
    ]
    result["without_balance"] = headroom(without, names)["oracle_pooled"]
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
    print_summary(result, by_component, names, args.seeds)
    print(f"written: {out / 'headroom.json'}")
    return 0


def build_rollout(args, cli, inputs, out: Path) -> tuple:
    """(cast, dr.Rollout): the run's frozen speakers and user, and stage 2's reward with the run's weights."""
    speakers = cli.speakers_of(args)
    cache = out / "served_cache.jsonl"
    speaker = cli.load_role(speakers, "speakers", args, cache)
    if (args.user or args.model) == speakers:
        user = speaker  # one model plays both parts
    else:
        user = cli.load_role(args.user or args.model, "user", args, cache)
    cast = Cast(inputs.personas, *speaker, *user, args.max_new_tokens)
    encoder = loading.SentenceEncoder(args.device)
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
        splits = cli.read_data(args.director_warmup_data, args.set)
        esconv = list(itertools.chain.from_iterable(splits.values()))  # every split's dialogues
        rollout.grounding = dr.Grounding(esconv, inputs.personas, encoder, args.held_out, args.seed)
    return cast, rollout


def held_out_points(args, inputs, cast, path: Path) -> list[Conversation]:
    """Stage 2's held-out decision points, read back from `path`, else built as train --stage 2 builds them."""
    by_id = {c.id: c for c in inputs.held_out}
    rows = None
    if path.exists():
        rows = [r for r in files.read_jsonl(path) if r["split"] == "heldout"]
    if rows and any(r["context_id"] not in by_id for r in rows):
        raise common.UserError(
            f"{path}: a held-out point's context is not among the held-out contexts of --data "
            f"{args.data} (pass the run's own --data, --held-out and --seed)"
        )
    if rows:
        return [conversation_from_json(r, by_id[r["context_id"]]) for r in rows]
    return dr.build_decision_points(
        inputs.held_out,
        args.heldout_points,
        cast,
        inputs.profiles,
        args.user_every,
        args.seed + 1,
    )


def replicate_rewards(args, rollout, points, directives: dict, personas) -> tuple[list, list]:
    """Per replicate, {policy: [reward per point]} and {policy: [components per point]}; the
    policies: the rule alone ("rule") and each agent first, the rule after it."""
    rule = LeastSpoken(personas)
    rewards = []
    parts = []
    for rep in range(args.seeds):
        # The same points, every turn re-sampled (Rollout.run copies them).
        pts = [dataclasses.replace(p, seed=p.seed + rep * REPLICATE_SALT) for p in points]
        scored = {"rule": rollout.run(pts, rule)[0]}
        for g in directives:
            scored[g] = rollout.run(pts, rule, first=[directives[g]] * len(pts))[0]
        print(f"replicate {rep + 1}/{args.seeds} done", flush=True)
        rewards.append({k: [s for s, _ in v] for k, v in scored.items()})
        parts.append({k: [c for _, c in v] for k, v in scored.items()})
    return rewards, parts


def print_summary(result: dict, by_component: dict, names: list[str], seeds: int) -> None:
    """Each policy's mean reward per replicate, the oracles, the agreement and the correlations."""
    print(
        f"\n{result['n']} held-out points, {seeds} replicates (seeds +r x {REPLICATE_SALT}); the run's weights"
    )
    for g in [*names, "rule"]:
        label = "least-spoken rule" if g == "rule" else f"always {g} first"
        print(f"  {label:28s} " + "  ".join(f"{r[g]:.3f}" for r in result["per_policy"]))
    print(
        f"  {'oracle, in sample':28s} "
        + "  ".join(f"{x:.3f}" for x in result["oracle_in_sample"])
        + "   (optimistic)"
    )
    plural = "s" if seeds > 2 else ""
    for j, c in enumerate(result["oracle_cross"]):
        print(
            f"  oracle picked on replicate{plural} "
            f"{','.join(str(m + 1) for m in range(seeds) if m != j)}, scored on {j + 1}: "
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
