"""Tests of the evaluation's baselines beside the method: the multi-call prompting baselines
(extras/baselines.py), the SFT baseline (extras/sft.py), and the director-headroom check
(extras/director_headroom.py), all on hand-made data or the tiny random model.

Run: .venv/bin/python -m pytest -q tests/test_baselines.py
"""

import json
from pathlib import Path

import pytest
import torch

import mascot
import scenarios
import warmstart
from extras import baselines, director_headroom, sft
from plumbing import common, files, runs
from simulate import (
    USER,
    Cast,
    Conversation,
    Directive,
    RoundRobin,
    Turn,
    TurnPlan,
    run_conversations,
)

FIXTURE = str(mascot.ROOT / "tests" / "fixtures" / "data" / "esconv_sft" / "train.jsonl")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy CPU the threads wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def personas():
    return scenarios.load_personas(mascot.ROOT / "personas.json", "support")


def conversation(agent_texts, seed=0):
    context = scenarios.Context(
        "t-1",
        "support",
        "I failed my driving test.",
        "I failed again today.",
        emotion="sad",
        valence="negative",
    )
    conv = Conversation(context, "support", "average", "test", seed)
    conv.turns.append(Turn(USER, "I failed again today."))
    for name, text in zip(["Anchor", "Catalyst", "Beacon"], agent_texts):
        conv.turns.append(Turn(name, text))
    return conv


# ------------------------------------------------------------------ self-consistency and MultiAgentESC


def test_consensus_pick_and_parse_number():
    # BLEU-2 against the other two: 0.632, 0.816, 0.091 -> the second agrees most.
    assert (
        baselines.consensus_pick(
            ["take a short walk tonight", "take a walk tonight", "call your sister tonight"]
        )
        == 1
    )
    assert baselines.consensus_pick(["only one"]) == 0
    assert baselines.parse_number("I'd pick 3.", 4) == 2
    assert baselines.parse_number("7, no 2", 4) == 1 and baselines.parse_number("none", 4) is None


def test_multiagentesc_follows_the_vote_and_keeps_the_refined_reply(monkeypatch):
    # Scripted model calls: the analysis, 4 proposals (strategies 1, 2, 2, one unreadable), two
    # candidates (one per distinct strategy), 4 votes (2, 2, 1, "?"), then the refined reply.
    ps = personas()
    script = {
        "analysis": ["They feel like a failure."],
        "proposal": ["1", "2", "2", "none"],
        "candidate": ["First candidate.", "Second candidate."],
        "vote": ["2", "2", "1", "?"],
        "refine": ["Refined second candidate."],
    }
    calls = []

    def fake_generate(cast, prompts, max_new_tokens, seeds):
        text = prompts[0][-1]["content"]
        kind = (
            "analysis"
            if "analysis agent" in text
            else "proposal"
            if "Which strategy" in text
            else "vote"
            if "Candidate messages" in text
            else "refine"
            if "Improve the draft" in text
            else "candidate"
        )
        calls.append((kind, len(prompts)))
        assert len(prompts) == len(script[kind])
        return script[kind]

    monkeypatch.setattr(baselines, "_generate", fake_generate)
    conv = conversation([])
    cast = Cast(ps, None, None, None, None, 8)
    pipeline = baselines.MultiAgentESC()
    pipeline([conv], [Directive("Anchor")], cast)
    assert [k for k, _ in calls] == ["analysis", "proposal", "candidate", "vote", "refine"]
    turn = conv.turns[-1]
    assert (turn.speaker, turn.text) == ("Anchor", "Refined second candidate.")
    assert turn.directive.action == ps.strategies[1]  # the winning candidate's strategy
    record = json.loads(turn.directive.raw)
    assert record["strategies"] == ps.strategies[:2] and record["votes"] == [1, 2]
    assert pipeline.unparseable == {"proposal": 1, "vote": 1} and pipeline.asked == {
        "proposal": 4,
        "vote": 4,
    }


def test_self_consistency_keeps_the_consensus_or_the_judges_pick(monkeypatch):
    # k = 3 samples per live conversation (an ended one gets none); the consensus keeps the one the
    # others agree with most, the judge pick the one it scores highest; every sample is recorded.
    samples = [
        "Reply: take a short walk tonight",
        "Reply: take a walk tonight",
        "Reply: call your sister tonight",
    ]
    monkeypatch.setattr(
        baselines, "_generate", lambda cast, prompts, n, seeds: samples * (len(prompts) // 3)
    )
    cast = Cast(personas(), None, None, None, None, 8)
    live, ended = conversation([]), conversation([])
    ended.ended = True
    baselines.SelfConsistency(3)([live, ended], [Directive("Anchor"), Directive("Guide")], cast)
    assert (live.turns[-1].speaker, live.turns[-1].text) == (
        "Anchor",
        "take a walk tonight",
    ) and len(ended.turns) == 1
    assert json.loads(live.turns[-1].directive.raw) == [
        "take a short walk tonight",
        "take a walk tonight",
        "call your sister tonight",
    ]

    class ByLength:
        def score_many(self, states, replies):
            return [len(r) for r in replies]

    conv = conversation([])
    baselines.SelfConsistency(3, "judge", ByLength())([conv], [Directive("Beacon")], cast)
    assert (conv.turns[-1].speaker, conv.turns[-1].text) == ("Beacon", "take a short walk tonight")


def test_the_baselines_plug_into_the_conversation_loop(tiny):
    # simulate.run_conversations with Cast(speak=...) on the tiny model: every agent turn is the
    # pipeline's.
    model, tok = tiny
    ps, profiles = personas(), scenarios.load_profiles(mascot.ROOT / "data" / "profiles.json")
    speak = baselines.SelfConsistency(2)
    cast = Cast(ps, model, tok, model, tok, 4, style="zero-shot-cot", speak=speak)
    contexts = scenarios.load_contexts("bundled", "support")[:2]
    convs = run_conversations(
        contexts,
        RoundRobin(ps),
        cast,
        profiles,
        ["average"] * 2,
        TurnPlan(2, 1),
        0,
    )
    for conv in convs:
        agents = conv.agent_turns()
        assert [t.speaker for t in agents] == ps.names()[:2] and len(
            conv.turns
        ) == 4  # user, agent, user, agent
        assert all(len(json.loads(t.directive.raw)) == 2 for t in agents)


# ------------------------------------------------------------------ the SFT baseline

LOST_JOB = [
    {"speaker": "supporter", "text": "Hello!", "strategy": "Question"},
    {"speaker": "user", "text": "I lost my job today."},
    {"speaker": "supporter", "text": "What happened?", "strategy": "Question"},
    {"speaker": "user", "text": "They cut my team."},
    {"speaker": "supporter", "text": "I went through that too.", "strategy": "Self-disclosure"},
    {
        "speaker": "supporter",
        "text": "Maybe call three contacts.",
        "strategy": "Providing Suggestions",
    },
]


def test_mapped_supporter_turns_give_who_would_have_said_it_and_the_history():
    ctx = scenarios.Context(
        "e-1", "support", "Lost my job.", "I lost my job today.", turns=LOST_JOB
    )
    mapping = warmstart.strategy_owners(
        scenarios.load_personas(mascot.ROOT / "personas.json", "support")
    )
    items = list(warmstart.mapped_supporter_turns([ctx], mapping))
    # The opening "Hello!" answers nothing and Self-disclosure fits no persona: two items.
    assert [(name, reply) for _, name, _, reply in items] == [
        ("Catalyst", "What happened?"),
        ("Guide", "Maybe call three contacts."),
    ]
    assert [(t.speaker, t.text) for t in items[1][2]] == [
        ("Catalyst", "Hello!"),
        ("User", "I lost my job today."),
        ("Catalyst", "What happened?"),
        ("User", "They cut my team."),
        ("Companion", "I went through that too."),
    ]
    assert "Self-disclosure" not in mapping and len(mapping) == 6


def test_supporter_turns_become_persona_examples():
    ctx = scenarios.Context(
        "e-1",
        "support",
        "Lost my job.",
        "I lost my job today.",
        turns=[
            {"speaker": "user", "text": "I lost my job today."},
            {"speaker": "supporter", "text": "What happened?", "strategy": "Question"},
            {"speaker": "user", "text": "They cut my team."},
            {
                "speaker": "supporter",
                "text": "I went through that too.",
                "strategy": "Self-disclosure",
            },
            {
                "speaker": "supporter",
                "text": "Maybe list three contacts to call this week.",
                "strategy": "Providing Suggestions",
            },
        ],
    )
    examples = sft.supporter_examples([ctx], personas())
    # Question -> Catalyst, Providing Suggestions -> Guide; Self-disclosure fits no persona.
    assert [target for _, target in examples] == [
        "What happened?",
        "Maybe list three contacts to call this week.",
    ]
    first, second = examples
    assert first[0][0]["content"].startswith("You are Catalyst")
    assert second[0][0]["content"].startswith("You are Guide")
    # The history shows the earlier supporter turns under their persona (or Companion).
    history = "\n".join(m["content"] for m in second[0][1:])
    assert "(Catalyst, another companion): What happened?" in history
    assert "(Companion, another companion): I went through that too." in history


def test_mean_nll_is_the_mean_over_target_tokens(tiny):
    model, tok = tiny
    examples = sft.supporter_examples(
        [
            scenarios.Context(
                "e-1", "support", "Lost my job.", "I lost my job today.", turns=LOST_JOB
            )
        ],
        personas(),
    )
    rows = [warmstart.token_rows(tok, [e])[0] for e in examples]
    per_example = [warmstart.mean_nll(model, tok, [e]) for e in examples]
    n = [len(target) for _, target in rows]
    assert warmstart.mean_nll(model, tok, examples, batch_size=1) == pytest.approx(
        sum(x * k for x, k in zip(per_example, n)) / sum(n), rel=1e-4
    )
    assert warmstart.mean_nll(model, tok, []) is None


def test_sft_command_trains_saves_and_evaluate_runs_it(tmp_path):
    # The SFT chapter end to end on the tiny model: ESConv-style dialogues -> RUN/sft/model, the
    # held-out loss before and after, then the sft system in an evaluation on the same split.
    assert (
        mascot.main(
            [
                "sft",
                "--model",
                "tiny",
                "--run",
                str(tmp_path),
                "--data",
                FIXTURE,
                "--held-out",
                "0.34",
                "--steps",
                "3",
                "--batch-size",
                "2",
                "--lr",
                "1e-3",
                "--max-new-tokens",
                "4",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert (tmp_path / "sft" / "model" / "config.json").exists() and (
        tmp_path / "sft" / "config.json"
    ).exists()
    assert summary["train_examples"] > 0 and summary["heldout_examples"] > 0
    assert (
        len(summary["losses"]) == 3
        and summary["heldout_loss_after"] < summary["heldout_loss_before"]
    )
    results = mascot.evaluate_cmd(
        mascot.build_parser().parse_args(
            [
                "evaluate",
                "--model",
                "tiny",
                "--contexts",
                "1",
                "--turns",
                "1",
                "--max-new-tokens",
                "2",
                "--held-out",
                "0.34",
                "--run",
                str(tmp_path),
                "--systems",
                "sft",
                "--data",
                FIXTURE,
                "--no-persona-id",
            ]
        )
    )
    assert (
        list(results["systems"]) == ["sft"] and "sft/model" in results["systems"]["sft"]["speakers"]
    )
    # On data without strategy-labelled supporter turns the command says what it needs.
    with pytest.raises(common.UserError, match="ESConv"):
        sft.main(["sft", "--model", "tiny", "--run", str(tmp_path / "b")], mascot)


def test_sft_takes_the_run_lock_and_refuses_other_settings_on_a_made_folder(tmp_path):
    # Two sft commands with different --lr at once both exited 0: config.json said one lr, the
    # model was the other's. Now one holds the run lock, and on a folder an earlier sft made a
    # different setting is one line naming it, as train's stages refuse theirs.
    argv = ["sft", "--model", "tiny", "--run", str(tmp_path), "--data", FIXTURE]
    argv += ["--held-out", "0.34", "--steps", "1", "--batch-size", "2", "--max-new-tokens", "4"]
    with runs.run_lock(tmp_path):  # another command holds the folder
        with pytest.raises(common.UserError, match="in use by another mascot command"):
            sft.main(argv + ["--lr", "1e-3"], mascot)
    assert not (tmp_path / "sft").exists()
    assert sft.main(argv + ["--lr", "1e-3"], mascot) == 0
    model = tmp_path / "sft" / "model" / "model.safetensors"
    made = model.stat().st_mtime_ns
    with pytest.raises(common.UserError, match=r"^--lr 0.002: lr 0.001 is what made .*sft; ") as e:
        sft.main(argv + ["--lr", "2e-3"], mascot)
    assert "\n" not in str(e.value)
    assert files.read_json(tmp_path / "sft" / "config.json")["lr"] == 0.001
    assert model.stat().st_mtime_ns == made  # the model is still the one config.json describes
    other = tmp_path / "copy.jsonl"
    other.write_text(Path(FIXTURE).read_text(encoding="utf-8") + "\n", encoding="utf-8")
    with pytest.raises(common.UserError, match="--data, --personas or --profiles-file"):
        sft.main([*argv[:6], str(other), *argv[7:], "--lr", "1e-3"], mascot)
    # The same settings (how it reports is not one) train it again.
    assert sft.main(argv + ["--lr", "1e-3", "--quiet"], mascot) == 0


# ------------------------------------------------------------------ the director's headroom


def test_headroom_separates_a_reproducible_best_agent_from_noise():
    """extras/director_headroom.headroom on hand-made rewards (two points, agents A and B).

    Reproducible: A is best at point 0 and B at point 1 on both replicates, so the oracle picked
    on one replicate scores (3 + 3) / 2 = 3.0 on the other, +1.0 over the rule's 2.0 at both
    points (paired se 0), and the deviations correlate perfectly. Noise: the best agent swaps
    between replicates, so the cross-validated oracle scores the worse agent (1.0, -1.0 against
    the rule) while the in-sample oracle still looks good (3.0): the optimism the script warns of."""
    headroom = director_headroom.headroom
    same = {"A": [3.0, 1.0], "B": [1.0, 3.0], "rule": [2.0, 2.0]}
    r = headroom([same, same], ["A", "B"])
    assert r["oracle_in_sample"] == [3.0, 3.0]
    assert [c["vs_rule"] for c in r["oracle_cross"]] == [1.0, 1.0]
    assert [c["se"] for c in r["oracle_cross"]] == [0.0, 0.0]
    # The best single agent, picked alike, ties (A and B sum to 4; the first name wins): always A scores (3, 1), so
    # reading the conversation adds (0 + 2) / 2 = 1.0 over it, se = sd(0, 2) / sqrt(2) = 1.
    assert r["oracle_pooled"] == {
        "vs_rule": 1.0,
        "se": 0.0,
        "vs_one": 1.0,
        "se_one": pytest.approx(1.0),
    }
    assert r["best_agree"] == 1.0 and r["deviation_corr"] == pytest.approx(1.0)
    # One agent best at every point: the oracle beats the rule by 1.0, all of it the fixed agent's (nothing per point).
    always_a = {"A": [3.0, 3.0], "B": [1.0, 1.0], "rule": [2.0, 2.0]}
    assert headroom([always_a, always_a], ["A", "B"])["oracle_pooled"] == {
        "vs_rule": 1.0,
        "se": 0.0,
        "vs_one": 0.0,
        "se_one": 0.0,
    }
    swapped = {"A": [1.0, 3.0], "B": [3.0, 1.0], "rule": [2.0, 2.0]}
    r = headroom([same, swapped], ["A", "B"])
    assert r["oracle_in_sample"] == [3.0, 3.0]
    assert [c["mean"] for c in r["oracle_cross"]] == [1.0, 1.0]
    assert [c["vs_rule"] for c in r["oracle_cross"]] == [-1.0, -1.0]
    assert r["best_agree"] == 0.0 and r["deviation_corr"] == pytest.approx(-1.0)
    # Four replicates, three reproducible and one swapped: each left-out replicate is scored by the
    # agents best on the other three (their mean), so the swapped one loses and the others gain.
    r = headroom([same, same, same, swapped], ["A", "B"])
    assert [c["vs_rule"] for c in r["oracle_cross"]] == [1.0, 1.0, 1.0, -1.0]
    # Pooled: each point's four folds average to (1 + 1 + 1 - 1) / 4 = 0.5 over the rule, at both points alike (se 0).
    # Against always A (a tie on every fold): folds 1-3 gain (0, 2), the swapped fold (0, -2); per point 0 and 1.0.
    assert r["oracle_pooled"] == {
        "vs_rule": 0.5,
        "se": 0.0,
        "vs_one": 0.5,
        "se_one": pytest.approx(0.5),
    }
    assert r["best_agree"] == pytest.approx(3 / 6) and r["deviation_corr"] == pytest.approx(0.0)
    # Points that differ: the pooled se is across points. Point 0's best agent (A) reproduces, point 1's does not
    # (B, then A): each fold gains +1 at point 0 and -1 at point 1, so the mean is 0 and se = sd(1, -1) / sqrt(2) = 1.
    r = headroom([same, {"A": [3.0, 3.0], "B": [1.0, 1.0], "rule": [2.0, 2.0]}], ["A", "B"])
    assert r["oracle_pooled"]["vs_rule"] == 0.0 and r["oracle_pooled"]["se"] == pytest.approx(1.0)


def test_within_state_correlation_by_hand():
    # 2 states x 2 candidates. Within-state deviations: x (0.5, -0.5), (1, -1); y (0.2, -0.2),
    # (0.1, -0.1): sum xy 0.4, sum xx 2.5, sum yy 0.1 -> r = 0.4 / sqrt(0.25) = 0.8. The states'
    # own levels (x around 0.5 and 4) do not enter.
    from extras.judges import within_state_correlation as corr

    xs, ys = [1.0, 0.0, 5.0, 3.0], [0.5, 0.1, 0.4, 0.2]
    assert corr(xs, ys, 2) == pytest.approx(0.8) and corr([-x for x in xs], ys, 2) == pytest.approx(
        -0.8
    )
    # A candidate without a score leaves its state with one: that state drops out (r of 1 pair = 1).
    assert corr(xs, [0.5, None, 0.4, 0.2], 2) == pytest.approx(1.0)
    assert corr([1.0, 1.0, 2.0, 2.0], ys, 2) is None  # x never varies


def test_headroom_script_runs_on_the_tiny_model_and_writes_its_numbers(tmp_path, capsys):
    """extras/director_headroom.py end to end on the tiny model: two replicates of every agent
    and the rule on freshly built held-out points, a summary with one reward per point each."""
    run = tmp_path / "run"
    assert (
        director_headroom.main(
            [
                "director-headroom",
                "--run",
                str(run),
                "--model",
                "tiny",
                "--heldout-points",
                "2",
                "--max-new-tokens",
                "4",
                "--seeds",
                "2",
            ],
            mascot,
        )
        == 0
    )
    out = json.loads((run / "stage2" / "headroom.json").read_text())
    assert len(out["rewards"]) == 2
    for rep in out["rewards"]:
        assert set(rep) == {"rule", "Anchor", "Catalyst", "Beacon", "Guide"}
        assert all(len(v) == out["n"] == 2 for v in rep.values())
    assert set(out["deviation_corr_by_component"]) >= {"coherence", "balance"}
    printed = capsys.readouterr().out
    assert "oracle picked on replicate 1, scored on 2" in printed and "least-spoken rule" in printed
    assert (
        "all folds pooled: minus the rule" in printed
        and "all folds pooled, without balance" in printed
    )
    assert printed.count("minus the best single agent") == 2
    # Without balance: the same totals less 0.5 x balance (the default weight), through the same pooling.
    less = [
        {k: [t - 0.5 * c["balance"] for t, c in zip(r[k], p[k])] for k in r}
        for r, p in zip(out["rewards"], out["components"])
    ]
    assert out["without_balance"] == pytest.approx(
        director_headroom.headroom(less, ["Anchor", "Catalyst", "Beacon", "Guide"])["oracle_pooled"]
    )
    # The run's own settings are the defaults: a stage-2 config with other weights is read.
    files.write_json(
        run / "stage2" / "config.json",
        {"w_balance": 0.0, "heldout_points": 2, "max_new_tokens": 4, "model": "tiny", "stage": 2},
    )
    args, _ = director_headroom.parse_args(["--run", str(run)], mascot)
    assert (args.w_balance, args.heldout_points, args.model, args.seeds) == (0.0, 2, "tiny", 4)
