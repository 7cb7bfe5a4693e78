"""Persona function from ESConv's human strategy labels: the cards' mapping, the judge's classifier and
the evaluator (their math by hand, that they learn, the shipped files on real held-out dialogues), the
`strategies` command end to end, the group reward's grounded terms (director.py) and both warm starts
(warmstart.py)."""

import argparse
import copy
import json
import math
import random
from collections import Counter

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import director as dr
import judge
import mascot
import metrics
import scenarios
import simulate
import warmstart
from conftest import ROOT, dataset
from extras import strategies as st
from plumbing import loading, runs
from plumbing.common import UserError
from scenarios import SUPPORT_STRATEGIES, load_personas
from simulate import USER, Conversation, Directive, JudgeState, Turn


@pytest.fixture(scope="module")
def support():
    return load_personas(ROOT / "personas.json", "support")


def esconv(path: str):
    return [c for part in mascot.read_data(path, "support").values() for c in part]


def held_out_turns(n: int):
    """n labelled supporter turns of the dialogues `strategies` holds out by default (seed 0, 25%)."""
    _, held = scenarios.split_contexts(esconv(str(dataset("esconv/train.jsonl"))), 0.25, 0)
    rows = st.labelled_turns(held)
    return rows[:: len(rows) // n][:n]


def test_the_cards_give_every_strategy_but_others_to_one_persona(support):
    owners = Counter(s for p in support.personas for s in p.esconv_strategies)
    assert set(owners) == set(SUPPORT_STRATEGIES) - {"Others"} and set(owners.values()) == {1}
    assert all(dr.directive_for(s, support).agent in support.names() for s in owners)
    assert dr.directive_for("Others", support) is None
    assert set(dr.STRATEGY_DIRECTIVES) == set(owners)
    meeting = load_personas(ROOT / "personas.json", "meeting")
    assert not any(p.esconv_strategies for p in meeting.personas)  # no human labels for meetings


def test_a_card_naming_a_strategy_esconv_does_not_have_is_refused(tmp_path):
    cards = json.loads((ROOT / "personas.json").read_text())
    cards["support"]["personas"][0]["esconv_strategies"] = ["Hugging"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(cards))
    with pytest.raises(UserError, match=r"esconv_strategies \['Hugging'\] are not ESConv's"):
        load_personas(path, "support")


def test_function_mass_adds_each_personas_own_strategies_by_hand():
    p = torch.tensor([[0.1, 0.2, 0.1, 0.0, 0.3, 0.0, 0.1, 0.2]])  # (1, 8); 0.2 on "Others"
    got = st.function_mass(
        p,
        [
            ["Restatement or Paraphrasing", "Reflection of feelings"],
            ["Question"],
            ["Providing Suggestions", "Information"],
        ],
    )
    assert got[0].tolist() == pytest.approx([0.3, 0.1, 0.1])  # "Others" is nobody's


class FixedEncoder:
    """A 2-d 'embedding': text -> (1, 0) if it holds a '?', else (0, 1)."""

    def embed(self, texts):
        return torch.tensor([[1.0, 0.0] if "?" in t else [0.0, 1.0] for t in texts])


def test_the_classifier_is_a_softmax_of_reply_message_and_their_product_by_hand(tmp_path):
    w = torch.zeros(8, 6)
    w[0, 0] = 3.0  # a '?' in the reply -> Question
    w[7, 5] = 1.0  # the reply's 2nd coordinate times the message's -> Others
    path = tmp_path / "c.safetensors"
    save_file({"weight": w, "bias": torch.zeros(8)}, str(path))
    clf = judge.StrategyClassifier(FixedEncoder(), path)
    p = clf.probs(["What happened?", "ok"], ["I failed.", "thanks"])  # x: [r, m, r*m]
    assert p[0].tolist() == pytest.approx(
        torch.softmax(torch.tensor([3.0] + [0.0] * 7), 0).tolist()
    )
    assert p[1, 7].item() == pytest.approx(
        torch.softmax(torch.tensor([0.0] * 7 + [1.0]), 0)[7].item()
    )
    with pytest.raises(UserError, match="mascot.py strategies"):
        judge.StrategyClassifier(FixedEncoder(), tmp_path / "missing.safetensors")


class ByWordClassifier:
    """A stand-in StrategyClassifier: all mass on Question for a reply with '?', else on Others."""

    digest = "fixed"

    def probs(self, replies, messages):
        return torch.tensor(
            [[1.0 if k == (0 if "?" in r else 7) else 0.0 for k in range(8)] for r in replies]
        )


def test_the_offline_judge_scores_support_speakers_by_function_and_keeps_the_hack_guards(support):
    sets = [support, load_personas(ROOT / "personas.json", "meeting")]
    j = judge.OfflineJudge(sets, classifier=ByWordClassifier())
    assert j.name != judge.OfflineJudge(sets).name  # the classifier is in the name
    catalyst = support.find("Catalyst")
    state = JudgeState(
        "Catalyst", f"{catalyst.role}: {catalyst.description}", "I failed my driving test today."
    )
    asks, tells = (
        "What part of the test went differently from your practice drives?",
        "That sounds like a rough day, and it is fine to feel low about it for a while.",
    )
    f = j.features_many([state, state], [asks, tells])
    assert f[0]["function"] == 1.0 and f[1]["function"] == 0.0
    assert j.score(state, asks) > j.score(state, tells)  # Catalyst's job is asking
    # A question that copies the user's words is a hack: the guard outweighs the function.
    assert j.score(state, "I failed my driving test today?") < j.score(state, tells)
    # A meeting persona has no strategies: judged by the features alone, as without a classifier.
    meeting = sets[1].personas[0]
    m_state = JudgeState(
        meeting.name, f"{meeting.role}: {meeting.description}", "Let's review the budget."
    )
    assert "function" not in j.features_many([m_state], ["Shall we start with the travel line?"])[0]
    # (equal up to float noise: the encoder batches other texts with it, so its padding differs)
    assert j.score(m_state, "Shall we start?") == pytest.approx(
        judge.OfflineJudge(sets).score(m_state, "Shall we start?"), abs=1e-6
    )


def test_ngram_evaluator_reads_words_and_bigrams():
    assert st.text_ngrams("Why not try it?") == {
        "why",
        "not",
        "try",
        "it",
        "why not",
        "not try",
        "try it",
    }
    assert st.ngrams(["a b", "a c", "a b", "d"], min_count=2) == ["a", "a b", "b"]


def test_the_evaluator_names_the_persona_whose_job_a_turn_does(support, tiny):
    _, tok = tiny
    vocab = ["what", "try"]
    ev = st.FunctionEvaluator(tok, support, vocab=vocab)
    ev.weight, ev.bias = torch.zeros(8, 2), torch.zeros(8)
    ev.weight[SUPPORT_STRATEGIES.index("Question"), 0] = 6.0  # "what" -> Question (Catalyst's)
    ev.weight[SUPPORT_STRATEGIES.index("Providing Suggestions"), 1] = 5.0  # "try" -> Guide's
    long_try = (
        "Maybe try " + "one small thing and then another small thing " * 6 + "what do you think"
    )
    got = ev.score(
        [
            ("Catalyst", "What happened?"),
            ("Guide", "What happened?"),
            ("Guide", long_try),
            ("Nobody", "What happened?"),
        ]
    )
    assert [g["function"] for g in got[:3]] == [1.0, 0.0, 0.0]  # "what" outweighs "try" in full
    assert got[2]["function_equal"] == 1.0  # its first 32 tokens: only "try"
    assert got[3] == {"function": None, "function_equal": None}  # a speaker outside the set


def test_logistic_regression_learns_classes_that_a_linear_rule_separates():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(8, 12, generator=g) * 2
    y = torch.arange(8).repeat(40)  # (320,)
    x = centres[y] + torch.randn(320, 12, generator=g)  # (320, 12)
    w, b = st.fit_softmax(x[:240], y[:240], l2=1e-4)
    assert ((x[240:] @ w.T + b).argmax(-1) == y[240:]).float().mean().item() > 0.6  # chance 1/8


def test_calibration_and_per_class_rates_by_hand():
    # Bin (0.5, 0.6]: confidences 0.6, 0.6, one right -> |0.5 - 0.6| = 0.1, weight 2/3; bin (0.9, 1]: right.
    ece, table = st.calibration(
        torch.tensor([[0.6, 0.4], [0.6, 0.4], [0.0, 1.0]]), torch.tensor([0, 1, 1])
    )
    assert ece == pytest.approx(0.1 * 2 / 3, abs=1e-6) and [b["n"] for b in table] == [2, 1]
    rows = st.per_class(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 1, 1]), ["a", "b", "c"])
    assert rows[0] == {"class": "a", "n": 1, "precision": 0.5, "recall": 1.0}
    assert rows[1] == {"class": "b", "n": 3, "precision": 1.0, "recall": pytest.approx(2 / 3)}
    assert rows[2]["precision"] is None and rows[2]["recall"] is None


def test_the_command_fits_both_on_disjoint_dialogues_and_reports(tmp_path, capsys):
    path = dataset("esconv/train.jsonl")
    small = tmp_path / "esconv.jsonl"
    small.write_text("".join(path.read_text().splitlines(keepends=True)[:60]))
    outs = [tmp_path / "j.safetensors", tmp_path / "e.safetensors"]
    assert (
        mascot.main(
            [
                "strategies",
                "--esconv",
                str(small),
                "--judge-out",
                str(outs[0]),
                "--evaluator-out",
                str(outs[1]),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert (
        "60 dialogues: 22 for the judge's classifier, 23 for the evaluator's, 15 held out" in text
    )
    assert text.count("expected calibration error") == 2
    for out in outs:
        with safe_open(str(out), "pt") as f:
            assert json.loads(f.metadata()["strategies"]) == SUPPORT_STRATEGIES
            assert json.loads(f.metadata()["report"])["n"] > 0


def test_a_file_without_strategy_labels_is_refused(tmp_path, capsys):
    bare = tmp_path / "plain.jsonl"
    bare.write_text(
        json.dumps(
            {
                "situation": "s",
                "emotion_type": "sad",
                "dialog": [{"speaker": "usr", "text": "hi"}, {"speaker": "sys", "text": "hello"}],
            }
        )
        + "\n"
    )
    assert mascot.main(["strategies", "--esconv", str(bare), "--held-out", "0"]) == 2
    assert "labelled supporter turns; each part needs some" in capsys.readouterr().err


def test_the_shipped_classifiers_find_the_persona_of_held_out_esconv_turns(support, tiny):
    """Both shipped files on 300 turns of dialogues neither saw: far above the majority persona
    (0.29 on all held-out turns), near what their training run printed (0.585 and 0.611)."""
    rows = held_out_turns(300)
    y = torch.tensor([r[3] for r in rows])
    clf = judge.StrategyClassifier(loading.SentenceEncoder())
    for probs in (
        clf.probs([r[2] for r in rows], [r[1] for r in rows]),
        st.FunctionEvaluator(tiny[1], support).probs([r[2] for r in rows]),
    ):
        report = st.measure(probs, y, support)
        assert report["persona_accuracy"] > 0.5 and report["strategy_accuracy"] > 0.4
    with safe_open(str(st.FunctionEvaluator.FILE), "pt") as f:
        assert json.loads(f.metadata()["report"])["persona_accuracy"] > 0.55


# --- The director's ESConv warm start ------------------------------------------------------------
OFFICIAL = [
    {
        "experience_type": "Current Experience",
        "emotion_type": "anxiety",
        "problem_type": "job crisis",
        "situation": "I may lose my job.",
        "survey_score": {},
        "dialog": [
            {"speaker": "supporter", "annotation": {"strategy": "Others"}, "content": "Hello!"},
            {"speaker": "seeker", "annotation": {}, "content": "I think I will be fired."},
            {
                "speaker": "supporter",
                "annotation": {"strategy": "Question"},
                "content": "Why do you think so?",
            },
            {"speaker": "seeker", "annotation": {}, "content": "My boss ignores me."},
            {"speaker": "supporter", "annotation": {"strategy": "Others"}, "content": "Oh no."},
            {
                "speaker": "supporter",
                "annotation": {"strategy": "Self-disclosure"},
                "content": "I felt the same when my manager went quiet.",
            },
            {"speaker": "seeker", "annotation": {}, "content": "It is scary."},
            {
                "speaker": "supporter",
                "annotation": {"strategy": "Affirmation and Reassurance"},
                "content": "You noticed early, which gives you time.",
            },
            {
                "speaker": "supporter",
                "annotation": {"strategy": "Providing Suggestions"},
                "content": "Maybe ask for a short check-in this week.",
            },
            {"speaker": "seeker", "annotation": {}, "content": "Thanks."},
        ],
    }
]


def test_esconv_warm_start_targets_from_the_official_format(tmp_path, support):
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps(OFFICIAL), encoding="utf-8")
    contexts = esconv(str(path))
    examples = warmstart.esconv_examples(contexts, support, 4, seed=0)
    # Four mapped supporter turns after the seeker's first message ("Others" is never a target),
    # all drawn once, in a seeded order (natural targets: as the supporter did, repeats kept).
    targets = sorted(t for _, t in examples)
    assert targets == sorted(
        [
            "Agent: Catalyst\nAction: ask a probing question\nTone: curious",
            "Agent: Anchor\nAction: share a similar feeling so they feel less alone\nTone: gentle",
            "Agent: Beacon\nAction: name a strength\nTone: encouraging",
            "Agent: Guide\nAction: suggest one small step\nTone: practical",
        ]
    )
    # The prompt for the Guide turn: the dialogue before it, supporters named by their strategy's
    # persona, the unmapped "Oh no." by the least-spoken persona (Anchor: nobody but Catalyst spoke).
    prompt = next(m for m, t in examples if t.startswith("Agent: Guide"))[1]["content"]
    assert prompt.split("Conversation so far:\n")[1].split("\n\n")[0].splitlines() == [
        "User: I think I will be fired.",
        "Catalyst: Why do you think so?",
        "User: My boss ignores me.",
        "Anchor: Oh no.",
        "Anchor: I felt the same when my manager went quiet.",
        "User: It is scary.",
        "Beacon: You noticed early, which gives you time.",
    ]
    assert (
        "Turns so far: Anchor 2x, Catalyst 1x, Beacon 1x, Guide 0x. Last to speak: Beacon, asked to name a strength."
        in prompt
    )
    # Before the Self-disclosure, the last turn ("Oh no.", Others) was nobody's job: no action to name.
    disclosure = next(m for m, t in examples if "share a similar feeling" in t)[1]["content"]
    assert "Last to speak: Anchor.\n" in disclosure
    # Balanced, a turn whose companion spoke last is left out: the Self-disclosure (Anchor) comes
    # right after "Oh no.", which the fallback gave Anchor, so three distinct targets remain.
    balanced = {
        t.splitlines()[0]
        for _, t in warmstart.esconv_examples(contexts, support, 3, seed=0, balanced=True)
    }
    assert balanced == {"Agent: Catalyst", "Agent: Beacon", "Agent: Guide"}
    # The opening prompt has nobody to name as the last speaker.
    opening = next(m for m, t in examples if t.startswith("Agent: Catalyst"))[1]["content"]
    assert "Turns so far: Anchor 0x, Catalyst 0x, Beacon 0x, Guide 0x.\nWho speaks next" in opening
    # The greeting before the seeker's first turn is dropped, as corpora does for every source.
    assert "Hello!" not in prompt
    # Every target parses, and the mapping needs personas that list strategies.
    assert all(dr.parse_directive(t, support, "?").valid for _, t in examples)
    with pytest.raises(UserError, match="--set support"):
        warmstart.esconv_examples(contexts, load_personas(ROOT / "personas.json", "meeting"), 4)


def test_esconv_warm_start_says_when_every_turn_is_a_repeat(tmp_path, support):
    # "Oh." (Others) goes to the least-spoken Anchor, so the Reflection after it, Anchor's too,
    # is a repeat and the only labelled turn: balanced, the error names the flag that leaves it out.
    dialog = [
        {"speaker": "seeker", "annotation": {}, "content": "My dog died."},
        {"speaker": "supporter", "annotation": {"strategy": "Others"}, "content": "Oh."},
        {
            "speaker": "supporter",
            "annotation": {"strategy": "Reflection of feelings"},
            "content": "You must miss him.",
        },
    ]
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps([dict(OFFICIAL[0], dialog=dialog)]), encoding="utf-8")
    contexts = esconv(str(path))
    with pytest.raises(UserError, match="--warmup-balanced"):
        warmstart.esconv_examples(contexts, support, 2, balanced=True)
    assert [t.splitlines()[0] for _, t in warmstart.esconv_examples(contexts, support, 1)] == [
        "Agent: Anchor"
    ]


class Favour(torch.nn.Module):
    """A causal LM: `net`'s logits plus a large bonus at one token, so greedy it always says that token."""

    def __init__(self, net, token: int):
        super().__init__()
        self.net, self.token = net, token

    def forward(self, input_ids, **kw):
        out = self.net(input_ids, **kw)
        out.logits[..., self.token] += 1e4
        return out


def test_next_agent_agreement_is_the_share_of_turns_whose_target_the_director_names(tiny, support):
    """A director that always names agent a agrees on exactly the turns whose target is a: each agent's
    share of the targets, and the commonest share is `majority`."""
    model, tok = tiny
    contexts = esconv(str(ROOT / "tests/fixtures/data/esconv/ESConv.json"))
    targets = Counter(t[2].agent for t in warmstart.esconv_turns(contexts, support))
    n = sum(targets.values())
    assert len(targets) >= 2
    for name in support.names():
        token = tok(" " + name, add_special_tokens=False)["input_ids"][0]
        r = warmstart.next_agent_agreement(Favour(model, token), tok, support, contexts)
        assert r["n"] == n and r["agreement"] == pytest.approx(targets[name] / n)
        assert r["majority"] == pytest.approx(max(targets.values()) / n)


def test_the_esconv_warm_start_records_held_out_agreement_before_and_after(tiny, support, tmp_path):
    contexts = esconv(str(ROOT / "tests/fixtures/data/esconv/ESConv.json"))
    targets = warmstart.warm_start_examples(contexts, support, 8, 0.34, 0, balanced=False)
    model = copy.deepcopy(tiny[0])
    warm = warmstart.warm_start(
        dr.DirectorConfig(director_warmup=2),
        tmp_path,
        model,
        tiny[1],
        support,
        targets,
        lambda *a: {"n": 0},
        resume=False,
    )
    saved = json.loads((tmp_path / "warm_start.json").read_text())
    assert (
        saved["agreement"] == warm["agreement"]
        and saved["agreement"]["n"] == saved["agreement_before"]["n"] > 0
    )
    assert 0 <= saved["agreement"]["agreement"] <= 1 and "ESConv" in saved["source"]


class OneHot:
    """A stand-in strategy classifier: each reply's reading is the one-hot of a strategy chosen by hand."""

    def __init__(self, by_reply: dict[str, str]):
        self.by_reply = by_reply

    def probs(self, replies, messages):
        return torch.stack(
            [torch.eye(8)[SUPPORT_STRATEGIES.index(self.by_reply[r])] for r in replies]
        )


def test_grounding_counts_esconv_transitions_and_scores_blocks_by_hand(tmp_path, support):
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps(OFFICIAL), encoding="utf-8")
    g = dr.Grounding(esconv(str(path)), support, None, held_out=0.0, seed=0)
    # The dialogue's labels after the dropped greeting: Question, Others, Self-disclosure, Affirmation,
    # Suggestions. Each cell counts +1 on 8 strategies, add-one: the seen transition 2/9, the rest 1/9.
    q, others, sug = (
        SUPPORT_STRATEGIES.index(s) for s in ("Question", "Others", "Providing Suggestions")
    )
    assert g.transition[0, 8, q] == pytest.approx(2 / 9) and g.transition[
        0, 8, others
    ] == pytest.approx(1 / 9)
    assert g.transition[1, q, others] == pytest.approx(2 / 9) and g.transition[
        1, q, sug
    ] == pytest.approx(1 / 9)
    assert g.transition.sum(-1).allclose(torch.ones(4, 9))
    g.classifier = OneHot({"Why so?": "Question", "Try a walk.": "Providing Suggestions"})
    ctx = scenarios.Context(
        id="t", persona_set="support", situation="job", first_message="I may be fired"
    )
    conv = Conversation(ctx, "support", "average", "test", 0)
    conv.turns = [
        Turn(USER, "I may be fired"),
        Turn("Catalyst", "Why so?", Directive("Catalyst", "ask a probing question")),
        Turn(USER, "My boss."),
        Turn("Anchor", "Try a walk.", Directive("Anchor")),
    ]
    # Block = both agent turns. The question opens as real supporters most often do: 1. The suggestion after
    # a question at stage 1: 1/9 against the likeliest 2/9 (Others): 0.5. Compliant, chance-corrected by the
    # labels' add-one shares (each seen strategy 2/13, the rest 1/13): the question was asked for, (1 - 2/13) /
    # (1 - 2/13) = 1; Anchor's card (Restatement 1/13, Reflection 1/13, Self-disclosure 2/13) lists no
    # suggestion: (0 - 4/13) / (1 - 4/13) = -4/9, below chance.
    assert g.prior[q] == pytest.approx(2 / 13) and g.prior.sum() == pytest.approx(1)
    assert g(conv, 1) == pytest.approx({"plausible": 0.75, "compliant": (1 - 4 / 9) / 2})
    # Block = the second turn only: the turn before is read for its strategy, not scored.
    assert g(conv, 2) == pytest.approx({"plausible": 0.5, "compliant": -4 / 9})
    assert g(conv, 4) == {"plausible": 0.0, "compliant": 0.0}
    with pytest.raises(UserError, match="--set support"):
        dr.Grounding([], load_personas(ROOT / "personas.json", "meeting"), None, 0.0, 0)


def test_grounding_prefers_what_real_supporters_did_on_held_out_dialogues(support):
    """On held-out ESConv dialogues read as group conversations (each supporter turn spoken by its strategy's
    persona, asked for by that strategy's directive): the real order of the first turns is more plausible than
    the same turns shuffled, and the real speakers more compliant than random other ones without directives."""
    contexts = esconv(str(dataset("esconv/train.jsonl")))
    g = dr.Grounding(contexts, support, loading.SentenceEncoder(), 0.25, 0)
    rng, real, shuffled, wrong = random.Random(0), [], [], []
    for c in scenarios.split_contexts(contexts, 0.25, 0)[1][:80]:
        conv = warmstart.esconv_prefix(c, min(len(c.turns), 12), support)
        agent = [i for i, t in enumerate(conv.turns) if t.speaker != USER]
        if len(agent) < 4:
            continue
        real.append(g(conv, 1))
        other = copy.deepcopy(conv)
        for i, text in zip(agent, rng.sample([conv.turns[i].text for i in agent], len(agent))):
            other.turns[i].text = text
        shuffled.append(g(other, 1)["plausible"])
        for i in agent:
            other.turns[i] = Turn(
                rng.choice([n for n in support.names() if n != conv.turns[i].speaker]),
                conv.turns[i].text,
            )
        wrong.append(g(other, 1)["compliant"])
    for name, corrupted in (("plausible", shuffled), ("compliant", wrong)):
        change, se = metrics.paired_change(corrupted, [r[name] for r in real])
        print(f"{name}: real - corrupted {change:+.3f} ± {se:.3f} ({len(real)} dialogues)")
        assert change > 3 * se


def test_esconv_fixture_gives_balanced_targets(support):
    examples = warmstart.esconv_examples(
        esconv(str(ROOT / "tests/fixtures/data/esconv/ESConv.json")),
        support,
        2,
        seed=0,
        balanced=True,
    )
    assert sorted(t.splitlines()[0] for _, t in examples) == ["Agent: Anchor", "Agent: Beacon"]


def test_esconv_targets_depend_on_the_stage_of_the_conversation(support):
    """On the real ESConv training split, the warm start's targets use all four personas and
    depend on the conversation's stage (the collapse diagnostics' feature): a random-agent warm
    start would have neither property by design."""
    train, held = scenarios.split_contexts(esconv(str(dataset("esconv/train.jsonl"))), 0.25, seed=0)
    examples = warmstart.esconv_examples(train, support, 400, seed=0, balanced=True)
    agents = [dr.parse_directive(t, support, "?").agent for _, t in examples]
    stages = [m[1]["content"].split("Turns so far: ")[1] for m, _ in examples]
    stages = [
        str(min(sum(int(x.split()[-1][:-1]) for x in s.split(".")[0].split(", ")), 3))
        for s in stages
    ]
    diag = dr.choice_diagnostics(agents, stages, support.names())
    assert diag["distinct"] == 4 and diag["entropy_norm"] > 0.9
    assert diag["p_perm"] < 0.01
    # Balanced: 100 targets per agent, although ESConv's mapped turns are not. The natural draw, the
    # default, keeps their unequal marginal (Anchor 32% of the turns, Beacon 17%), within ~2.5 se.
    assert Counter(agents) == {name: 100 for name in support.names()}
    natural = warmstart.esconv_examples(train, support, 400, seed=0)
    counts = Counter(dr.parse_directive(t, support, "?").agent for _, t in natural)
    pool = Counter(t[2].agent for t in warmstart.esconv_turns(train, support))
    assert all(abs(counts[a] / 400 - pool[a] / pool.total()) < 0.06 for a in support.names())
    assert pool["Anchor"] > 1.5 * pool["Beacon"]

    # Balanced, no target names the companion who spoke last (the prompt says who that was); natural, a fifth do.
    def repeats(examples):
        return sum(
            any(
                f"Last to speak: {dr.parse_directive(t, support, '?').agent}{c}" in m[1]["content"]
                for c in ",."
            )
            for m, t in examples
        )

    assert repeats(examples) == 0
    assert repeats(natural) > 60
    held_situations = {c.situation for c in held} - {c.situation for c in train}
    assert not any(
        m[1]["content"].split("\n")[0][len("Situation: ") :] in held_situations for m, _ in examples
    )


def test_stage2_with_esconv_measures_agreement_and_grounds_the_group_reward(tmp_path, capsys):
    """train --stage 2 --director-warmup-data ESCONV on the tiny model: the warm start prints and saves its held-out
    next-agent agreement before and after, and every GRPO step logs the grounded terms."""
    fixture = str(ROOT / "tests/fixtures/data/esconv/ESConv.json")
    code = mascot.main(
        [
            "train",
            "--stage",
            "2",
            "--model",
            "tiny",
            "--run",
            str(tmp_path),
            "--data",
            "bundled",
            "--director-warmup-data",
            fixture,
            "--director-warmup",
            "2",
            "--decision-points",
            "2",
            "--heldout-points",
            "1",
            "--steps",
            "1",
            "--prompts-per-step",
            "1",
            "--group-size",
            "2",
            "--max-new-tokens",
            "4",
            "--rollout-turns",
            "1",
            "--no-eval-prompted",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "held-out next-agent agreement with ESConv's supporters" in out
    warm = json.loads((tmp_path / "stage2" / "warm_start.json").read_text())
    assert warm["source"].startswith("ESConv strategy warm start") and warm["agreement"]["n"] >= 1
    step = json.loads((tmp_path / "stage2" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"r_plausible", "r_compliant"} <= set(step) and -1 <= step["r_compliant"] <= 1


# --- The speakers' warm start, card against card (warmstart.py; train --stage 1 on ESConv) ----------------------
SFT_FIXTURE = str(ROOT / "tests/fixtures/data/esconv_sft/train.jsonl")


def test_the_halves_split_dialogues_not_turns_and_are_the_same_every_time():
    train, _ = scenarios.split_contexts(esconv(SFT_FIXTURE), 0.25, 0)
    judge_half, evaluator_half = scenarios.classifier_halves(train, 0)
    assert {c.id for c in judge_half}.isdisjoint({c.id for c in evaluator_half})
    assert sorted(c.id for c in judge_half + evaluator_half) == sorted(c.id for c in train)
    assert [c.id for c in scenarios.classifier_halves(train, 0)[0]] == [c.id for c in judge_half]


def test_card_examples_score_one_human_turn_under_every_card_at_one_point(support):
    examples = warmstart.card_examples(esconv(SFT_FIXTURE), support, seed=0)
    owners = warmstart.strategy_owners(support)
    turns = {
        t["text"]: owners[t["strategy"]]
        for c in esconv(SFT_FIXTURE)
        for t in c.turns
        if t["speaker"] != "user" and t.get("strategy") in owners
    }
    assert examples and all(len(prompts) == len(support.personas) for prompts, _, _ in examples)
    for prompts, text, own in examples:
        assert (
            support.names()[own] == turns[text] and len(text.split()) >= 4
        )  # its owner by the card's strategies
        assert [p[0]["content"].split(",")[0] for p in prompts] == [
            f"You are {n}" for n in support.names()
        ]
        assert all(len(p) - 1 <= 4 for p in prompts)  # at most 4 turns of history
    owners_in_order = [support.names()[k] for _, _, k in examples]
    present = [n for n in support.names() if n in owners_in_order]
    assert owners_in_order[: len(present)] == present  # personas take turns


@pytest.fixture()
def card_task(support):
    """Replies made of words only one card uses: any model that reads its card can tell which card wrote them."""
    ctx = scenarios.load_contexts("bundled", "support")[0]
    pools = {
        "Anchor": "heavy tired hurts sad lonely",
        "Catalyst": "why what how wonder mean",
        "Beacon": "proud brave strong effort courage",
        "Guide": "try plan step list call",
    }
    prompts = [
        simulate.speaker_messages(p, support, ctx, [Turn(USER, ctx.first_message)])
        for p in support.personas
    ]

    def examples(n, seed):
        rng = random.Random(seed)
        return [
            (prompts, " ".join(rng.choice(pools[support.names()[k]].split()) for _ in range(5)), k)
            for k in (i % 4 for i in range(n))
        ]

    return examples


def test_the_card_term_is_the_cross_entropy_of_the_card_posterior(card_task):
    """At lr 0 one step of one example logs -log p(own card | reply) (card_accuracy's posterior, uniform prior) and
    the reply's negative log-likelihood per token under its own card (mean_nll): two code paths, one number each."""
    model, tok = loading.load_model("tiny")
    example = card_task(1, seed=3)
    step = warmstart.card_contrastive_finetune(
        model,
        tok,
        example,
        warmstart.CardSettings(steps=1, batch_size=1, lr=0.0),
        log=lambda s: None,
    )[0]
    posterior = warmstart.card_accuracy(model, tok, example)["posterior"]
    assert step["card_ce"] == pytest.approx(-math.log(posterior), rel=1e-4)
    prompts, text, own = example[0]
    assert step["nll"] == pytest.approx(
        warmstart.mean_nll(model, tok, [(prompts[own], text)]), rel=1e-4
    )


def test_the_card_contrastive_warm_start_teaches_a_tiny_model_to_read_its_card(card_task):
    """A random tiny model finds a held-out reply likeliest under its own card at chance; after 40 steps it reads the
    card: replies it never saw (new combinations of each card's words) are likeliest under their own card."""
    torch.manual_seed(0)
    model, tok = loading.load_model("tiny")
    held = card_task(40, seed=99)
    before = warmstart.card_accuracy(model, tok, held)
    history = warmstart.card_contrastive_finetune(
        model,
        tok,
        card_task(160, seed=0),
        warmstart.CardSettings(steps=40, batch_size=4, lr=3e-3),
        log=lambda s: None,
    )
    after = warmstart.card_accuracy(model, tok, held)
    print(
        f"held-out card accuracy {before['accuracy']:.2f} -> {after['accuracy']:.2f}; card term "
        f"{history[0]['card_ce']:.2f} -> {history[-1]['card_ce']:.2f} (log 4 = 1.39)"
    )
    assert before["accuracy"] <= 0.5 and after["accuracy"] >= 0.9 and after["posterior"] > 0.7
    assert sum(h["card_ce"] for h in history[-5:]) / 5 < 0.5 * math.log(4)


def test_an_interrupted_card_warm_start_goes_on_from_its_checkpoint_to_the_same_weights(
    card_task, tmp_path
):
    """6 steps with a checkpoint every 2, interrupted during step 5 (after the checkpoint of step 4): a second call
    from a fresh model loads step 4's weights, AdamW moments and history, runs steps 5 and 6, and ends where an
    uninterrupted run ends (same weights, same per-step history). No checkpoint is written after the last step."""
    examples, lr = card_task(24, seed=0), 3e-3

    def fresh():
        torch.manual_seed(0)
        return loading.load_model("tiny")

    model, tok = fresh()
    settings = warmstart.CardSettings(steps=6, lr=lr)
    whole = warmstart.card_contrastive_finetune(model, tok, examples, settings, log=lambda s: None)

    def stop_at_five(line):
        if line.startswith("speakers' warm start 5/"):
            raise KeyboardInterrupt

    cut, _ = fresh()
    with pytest.raises(KeyboardInterrupt):
        warmstart.card_contrastive_finetune(
            cut, tok, examples, settings, log=stop_at_five, folder=tmp_path, every=2
        )
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["ckpt-000004", "ckpt-000002"]
    again, _ = fresh()
    steps = []
    resumed = warmstart.card_contrastive_finetune(
        again, tok, examples, settings, log=steps.append, folder=tmp_path, every=2
    )
    assert [s.split(":")[0] for s in steps] == [
        "speakers' warm start 5/6",
        "speakers' warm start 6/6",
    ]
    flat = [[h[k] for h in run for k in ("nll", "card_ce")] for run in (resumed, whole)]
    assert flat[0] == pytest.approx(flat[1], rel=1e-4)
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert [p.name for p in runs.checkpoints(tmp_path)] == ["ckpt-000004", "ckpt-000002"]


def test_stage1_on_esconv_warm_starts_the_speakers_first_and_once(tmp_path, capsys, support):
    """train --stage 1 --data ESCONV on the tiny model: the warm start runs before the candidates, prints the held-out
    card accuracy before and after, saves speakers_warm/, and the rest of stage 1 starts from it; asked again for a
    finished run folder it reuses the saved warm start."""
    code = mascot.main(
        [
            "train",
            "--stage",
            "1",
            "--model",
            "tiny",
            "--run",
            str(tmp_path),
            "--data",
            SFT_FIXTURE,
            "--speaker-warmup",
            "2",
            "--states",
            "3",
            "--heldout-states",
            "1",
            "--candidates",
            "3",
            "--margin",
            "0",
            "--steps",
            "1",
            "--prompts-per-step",
            "1",
            "--group-size",
            "2",
            "--max-new-tokens",
            "6",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "held-out turns likeliest under their own card" in out
    assert out.index("speakers' warm start 2/2") < out.index("stage 1 done")
    warm = json.loads((tmp_path / "stage1" / "speaker_warm_start.json").read_text())
    assert len(warm["history"]) == 2 and warm["before"]["n"] == warm["after"]["n"] >= 1
    assert (
        "speakers_warm" in (tmp_path / "stage1" / "speakers" / "README.md").read_text()
    )  # trained from it
    args = argparse.Namespace(model="tiny", seed=0, device="cpu", speaker_warmup=2)
    inputs = scenarios.make_inputs(
        support, mascot.read_data(SFT_FIXTURE, "support"), 0.25, 0, {}, {}
    )
    assert warmstart.speaker_warm_start(args, tmp_path / "stage1", inputs) == str(
        tmp_path / "stage1" / "speakers_warm"
    )
    assert "warm start" not in capsys.readouterr().out
    # Cards that list no ESConv strategy (an edited personas.json): the error names the flag and the cause.
    bare = copy.deepcopy(support)
    for p in bare.personas:
        p.esconv_strategies = []
    with pytest.raises(
        UserError,
        match="^--speaker-warmup: no persona of the 'support' set lists esconv_strategies",
    ):
        warmstart.speaker_warm_start(args, tmp_path / "other", inputs._replace(personas=bare))
