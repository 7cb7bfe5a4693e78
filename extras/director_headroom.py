"""How much could ANY director gain over the least-spoken rule under stage 2's group reward?

What it does
    Stage 2 trains the director to pick, at each decision point, the agent (and action, tone)
    whose block of turns gets the highest group reward (director.block_reward). Before blaming the
    training when the trained director does not beat the least-spoken rule, ask whether the
    reward leaves anything to learn. For every held-out decision point of a stage-2 run this
    script rolls the block out once per agent (that agent first, with the action and tone its
    warm start pairs it with, sft.ESCONV_STRATEGIES; the least-spoken rule directs the other
    turns), and once with the least-spoken rule alone, on two independent sampling seeds
    ("replicates": the same points, every turn re-sampled). Then:

      - each fixed agent and the rule: mean group reward per replicate;
      - the in-sample oracle: per point the best agent of a replicate, scored on the SAME
        replicate. Optimistic: the max of four noisy numbers is high even when the agents are
        equally good;
      - the cross-validated oracle: the agent that was best on replicate A, scored on replicate B
        (and B -> A), paired against the rule on the replicate it is scored on. This is what a
        director that had learnt each point's best agent perfectly from the reward could gain;
      - how often a point's best agent is the same on both replicates (chance: about 1/4), and the
        correlation across replicates of each (point, agent) reward minus its point's mean
        (0 = whom to pick is noise, 1 = it is fully reproducible).

    If the cross-validated oracle is not above the rule, a director that learnt each point's best
    first agent from this reward would not beat the rule either (the check covers the first agent
    with its usual action and tone, the rule directing the rest).

Run (after a stage-2 run, with that run's flags; ~2 x 5 x the time of one held-out evaluation):
    python extras/director_headroom.py --run runs/esc20 --data path/to/esconv/train.jsonl \\
        --heldout-points 24 --max-new-tokens 32
The held-out points are read from RUN/stage2/decision_points.jsonl (built again when missing).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))               # run from anywhere

import data                                                                 # noqa: E402
import director as dr                                                       # noqa: E402
import mascot                                                               # noqa: E402
import models                                                               # noqa: E402
from judge_eval import within_state_correlation                             # noqa: E402
from metrics import paired_change                                           # noqa: E402
from sft import ESCONV_STRATEGIES                                           # noqa: E402
from simulate import Cast, Conversation, Directive, LeastSpoken             # noqa: E402

REPLICATE_SALT = 100_003     # added to every point's seed for the second replicate


def agent_directives(names: list[str]) -> dict[str, Directive]:
    """Each agent's directive as the ESConv warm start writes it: the first strategy mapped to it."""
    out = {}
    for agent, action, tone in ESCONV_STRATEGIES.values():
        if agent in names and agent not in out:
            out[agent] = Directive(agent, action, tone)
    return out


def held_out_points(args, inputs, cast) -> list[Conversation]:
    """The run's held-out decision points (as saved by train --stage 2), else built the same way."""
    path = Path(args.run) / "stage2" / "decision_points.jsonl"
    by_id = {c.id: c for c in inputs.held_out}
    if path.exists():
        rows = [row for row in data.read_jsonl(path) if row["split"] == "heldout"]
        unknown = sorted({row["context_id"] for row in rows} - set(by_id))
        if unknown:
            raise data.UserError(f"{path}: held-out context {unknown[0]} is not among the held-out contexts "
                                 f"of --data {args.data} (pass the run's own --data, --held-out and --seed)")
        return [Conversation.from_json(row, by_id[row["context_id"]]) for row in rows]
    return dr.build_decision_points(inputs.held_out, args.heldout_points, cast, inputs.profiles,
                                    sorted(inputs.profiles), args.user_every, args.seed + 1)


def with_seed_offset(points: list[Conversation], offset: int) -> list[Conversation]:
    """Copies of the points whose sampling seeds differ (an independent replicate)."""
    out = []
    for p in points:
        q = Conversation.from_json(p.to_json(), p.context)
        q.seed = p.seed + offset
        out.append(q)
    return out


def headroom(rewards: list[dict[str, list[float]]], names: list[str]) -> dict:
    """From per-replicate rewards {policy: [reward per point]} (policies: each agent and "rule"),
    the in-sample and cross-validated oracles, best-agent agreement and the deviation correlation."""
    a, b = rewards
    n = len(a["rule"])
    best = [[max(names, key=lambda g: r[g][i]) for i in range(n)] for r in (a, b)]
    out = {"n": n, "per_policy": [{k: sum(v) / n for k, v in r.items()} for r in (a, b)]}
    out["oracle_in_sample"] = [sum(r[best[k][i]][i] for i in range(n)) / n for k, r in enumerate((a, b))]
    cross = []
    for src, dst in ((0, 1), (1, 0)):
        picked = [rewards[dst][best[src][i]][i] for i in range(n)]
        mean, se = paired_change(rewards[dst]["rule"], picked)
        cross.append({"mean": sum(picked) / n, "vs_rule": mean, "se": se})
    out["oracle_cross"] = cross
    out["best_agree"] = sum(x == y for x, y in zip(*best)) / n
    # Each point's agents are one "state" of within_state_correlation: their rewards minus the
    # point's mean, correlated across the replicates (0 when nothing varies within a point).
    flat = [[r[g][i] for i in range(n) for g in names] for r in (a, b)]
    out["deviation_corr"] = within_state_correlation(*flat, len(names)) or 0.0
    return out


def main(argv: list[str]) -> int:
    args = mascot.build_parser().parse_args(["train", "--stage", "2", *argv])
    inputs = mascot.load_inputs(args)
    out = Path(args.run) / "stage2"
    (sm, st), (um, ut) = mascot.load_speakers_and_user(args, args.speakers or args.model,
                                                       out / "served_cache.jsonl")
    cast = Cast(inputs.personas, sm, st, um, ut, args.max_new_tokens)
    judge = mascot.judge_from_flags(args, out / "judge_cache.jsonl")
    rollout = dr.Rollout(cast, inputs.profiles, inputs.personas, models.SentenceEncoder(device=args.device),
                         judge, mascot.options(dr.RewardWeights, args, prefix="w-"), args.rollout_turns,
                         args.user_every)
    names = inputs.personas.names()
    directives = agent_directives(names)
    points = held_out_points(args, inputs, cast)
    rule = LeastSpoken(inputs.personas)
    rewards, parts = [], []          # per replicate: {policy: [total per point]}, {policy: [components]}
    for rep, offset in enumerate((0, REPLICATE_SALT)):
        pts = with_seed_offset(points, offset)
        scored = {"rule": rollout.run(pts, rule)[0]}
        for g in names:
            if g in directives:
                scored[g] = rollout.run(pts, rule, first=[directives[g]] * len(pts))[0]
            print(f"replicate {rep + 1}: {g} done", flush=True)
        rewards.append({k: [s for s, _ in v] for k, v in scored.items()})
        parts.append({k: [c for _, c in v] for k, v in scored.items()})
    names = [g for g in names if g in directives]
    result = headroom(rewards, names)
    # The same reproducibility per component: which part of the reward knows whom to pick?
    by_component = {}
    for comp in parts[0]["rule"][0]:
        per_rep = [{k: [c[comp] for c in v] for k, v in p.items()} for p in parts]
        by_component[comp] = headroom(per_rep, names)["deviation_corr"]
    data.write_json(out / "headroom.json", {"rewards": rewards, "components": parts, **result,
                                            "deviation_corr_by_component": by_component})
    print(f"\n{result['n']} held-out points, two replicates (sampling seeds +0 and +{REPLICATE_SALT}); "
          f"group reward with the run's weights")
    for g in [*names, "rule"]:
        label = "least-spoken rule" if g == "rule" else f"always {g} first"
        print(f"  {label:28s} {result['per_policy'][0][g]:.3f}  {result['per_policy'][1][g]:.3f}")
    print(f"  {'oracle, in sample':28s} {result['oracle_in_sample'][0]:.3f}  {result['oracle_in_sample'][1]:.3f}"
          "   (optimistic: the max of noisy numbers)")
    for (src, dst), c in zip(((1, 2), (2, 1)), result["oracle_cross"]):
        print(f"  oracle picked on replicate {src}, scored on {dst}: {c['mean']:.3f}; minus the rule "
              f"{c['vs_rule']:+.3f} ± {c['se']:.3f} (paired se)")
    print(f"  best agent the same on both replicates: {result['best_agree']:.2f} of points (chance ~0.25)")
    print(f"  correlation of (point, agent) reward deviations across replicates: {result['deviation_corr']:+.2f}")
    print("  the same correlation per component (unweighted): " +
          ", ".join(f"{k} {v:+.2f}" for k, v in by_component.items()))
    print(f"written: {out / 'headroom.json'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except data.UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
