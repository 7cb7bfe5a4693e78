"""Tests of the evaluation run in evaluate.py (the systems part; the metric formulas are in
tests/test_metrics.py), of the prompt styles it adds to simulate.py and of the independent
evaluator (evaluators.PersonaIdentifier). The multi-call baselines and the SFT baseline are in
tests/test_baselines.py.

The end-to-end test builds a run folder with tiny random models saved where stage 1, stage 2 and
the sft command save theirs (RUN/stage1/speakers, RUN/stage2/director, RUN/sft/model), so every
system runs without training. Fake LLM judges (can_generate=True, canned answers) check the
rubric parsing and the pairwise preference against counts worked out by hand.

Run: .venv/bin/python -m pytest -q tests/test_evaluate.py
"""

import doctest
import json
import math
import types
from collections import Counter

import pytest
import torch

import evaluate
import mascot
import models
import scenarios
import simulate
from extras import evaluators
from plumbing import common, files, loading, results
from simulate import USER, Conversation, Directive, Turn, reply_text, role_setting, speaker_messages


def parse(argv):
    """The flags exactly as `mascot.py evaluate` parses them."""
    return mascot.build_parser().parse_args(["evaluate", *argv])


def run(argv):
    return mascot.evaluate_cmd(parse(argv))


TINY = [
    "--model",
    "tiny",
    "--contexts",
    "2",
    "--turns",
    "2",
    "--max-new-tokens",
    "4",
    "--sc-samples",
    "2",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy CPU the threads wait for each
    other, so the end-to-end runs below are much faster with one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run folder with 'trained' speakers, director and SFT model (tiny random models, untrained)."""
    run = tmp_path_factory.mktemp("run")
    model, tok = loading.load_model("tiny")
    for folder in (run / "stage1" / "speakers", run / "stage2" / "director", run / "sft" / "model"):
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
    return run


@pytest.fixture(scope="module")
def full_results(trained_run):
    return run(TINY + ["--run", str(trained_run)])


# ------------------------------------------------------------------ end to end


def test_every_system_runs_on_the_same_conversations(full_results, trained_run):
    saved = json.loads((trained_run / "eval" / "results.json").read_text())
    assert list(saved["systems"]) == list(evaluate.SYSTEM_NAMES)
    assert saved["skipped"] == {}
    for name, entry in saved["systems"].items():
        assert entry["n"] == 2
        assert [c["context_id"] for c in entry["conversations"]] == saved["protocol"]["contexts"]
    # Transcripts: one line per conversation of every system, each naming its system, and the
    # same context, profile and seed for conversation i in every system.
    lines = [
        json.loads(x) for x in (trained_run / "eval" / "transcripts.jsonl").read_text().splitlines()
    ]
    assert Counter(x["system"] for x in lines) == {name: 2 for name in evaluate.SYSTEM_NAMES}
    for i in range(2):
        same = {(x["context_id"], x["profile"], x["seed"]) for x in lines if x["index"] == i}
        assert len(same) == 1


def test_confidence_intervals_contain_the_means(full_results):
    checked = 0
    for entry in full_results["systems"].values():
        for key, summary in entry["metrics"].items():
            if full_results["status"].get(key) in ("ok", "approximated") and summary["n"]:
                assert summary["lo"] - 1e-9 <= summary["mean"] <= summary["hi"] + 1e-9, key
                checked += 1
    # 2 approximated, 2 persona-ID (the equal-length one has n 0: the tiny model's turns are
    # shorter than 32 tokens), 2 persona function, 5 redundancy, 9 hack (word salad the newest) and
    # crisis columns; 13 systems
    assert checked == len(full_results["systems"]) * 20 and len(full_results["systems"]) == 13


def test_summaries_match_a_hand_computed_interval():
    # One system's four conversations with self_bleu 0, 0, 0, 1: mean 0.25; a resample's mean is
    # k/4 with k ~ Binomial(4, 1/4) (P(k<=2) = 0.949, P(k<=3) = 0.996), so the 95% percentile
    # interval is [0, 0.75] (metrics.bootstrap_ci). A conversation without a value is left out.
    records = [{"metrics": {"self_bleu": v}} for v in (0.0, 0.0, 0.0, 1.0, None)]
    summary = evaluate.aggregate(records, ["self_bleu"], seed=0)["self_bleu"]
    assert summary == {"mean": 0.25, "lo": 0.0, "hi": 0.75, "n": 4}


def test_offline_judge_marks_what_it_cannot_measure(full_results, trained_run):
    status = full_results["status"]
    assert status["persona_consistency"] == "approximated"
    assert status["response_relevance"] == "approximated"
    assert status["empathetic_support"] == "n/a (offline judge)"
    assert status["collective_overall"] == "n/a (offline judge)"
    assert status["nli_entailment"].startswith("skipped")
    md = (trained_run / "eval" / "results.md").read_text()
    assert "persona consistency*" in md and "n/a (offline judge)" in md
    assert "* approximated" in md and "NLI relation rates skipped" in md
    assert "NLI entailment" not in md.split("## Notes")[0]  # skipped columns are left out
    # Each row of the first table names the judge and the models.
    row = next(line for line in md.splitlines() if line.startswith("| mascot |"))
    assert full_results["judge"] in row and "trained:" in row
    # The default pairwise comparison ran on every conversation pair, decided by the
    # independent evaluator, and says so.
    pw = full_results["pairwise"]
    assert (pw["a"], pw["b"], pw["decided_by"]) == ("mascot", "round-robin", "persona-id")
    assert pw["wins"] + pw["losses"] + pw["ties"] == 2
    assert "exact two-sided binomial p" in pw["line"] and "independent evaluator" in pw["line"]


def test_every_table_has_hack_columns_an_independent_evaluator_and_says_who_measured(
    full_results, trained_run
):
    md = (trained_run / "eval" / "results.md").read_text()
    for title in (
        "context copy",
        "persona-card copy",
        "history echo",
        "repeats itself",
        "meta/prompt leak",
        "empty or trivial",
        "reply length (words)",
        "crisis stops",
        "persona ID accuracy",
        "persona log-ratio",
        "persona ID accuracy, first 32 tokens",
    ):
        assert title in md
    for entry in full_results["systems"].values():
        for key in (
            "context_copy",
            "persona_copy",
            "history_echo",
            "self_repeat",
            "meta_leak",
            "trivial",
            "words",
            "crisis_stop",
            "persona_id_accuracy",
            "persona_log_ratio",
        ):
            m = entry["metrics"][key]
            assert (
                full_results["status"][key] == "ok"
                and m["n"] == 2
                and m["lo"] <= m["mean"] <= m["hi"]
            )
        assert (
            full_results["status"]["persona_id_equal"] == "ok"
        )  # n 0 when no turn reaches 32 tokens
        assert entry["metrics"]["crisis_stop"]["mean"] == 0.0 and entry["crisis_flags"] == []
    # Who measured what: the offline judge is the training judge (no stage config in this run:
    # the default is assumed); the independent evaluator is not.
    rows = {row["evaluator"].split(" ")[0]: row for row in full_results["evaluators"]}
    assert rows["judge"]["used_in_training"].startswith("YES: stage 1's --judge")
    assert rows["frozen"]["used_in_training"].startswith("no:")
    assert "## Who measured each column, and did training use it" in md
    # The paired changes against round-robin: every other system, every key column.
    changes = full_results["changes"]
    assert set(changes) == set(evaluate.SYSTEM_NAMES) - {"round-robin"}
    assert "## Paired change against round-robin" in md


def test_training_judges_are_read_from_the_stage_configs():
    cfg = evaluate.EvalConfig()
    rows = evaluate.training_use("hf:some/judge", {1: "hf:some/judge", 2: "offline"}, cfg)
    assert rows[0]["used_in_training"] == (
        "YES: stage 1's --judge (it labelled the reward model's preference pairs)"
    )
    other = evaluate.training_use("openai:http://x", {1: "hf:some/judge", 2: "offline"}, cfg)
    assert other[0]["used_in_training"] == "no (stage 1 used hf:some/judge, stage 2 offline)"
    rm = evaluate.training_use("rm:runs/x/stage1/reward_model", {1: "offline", 2: "offline"}, cfg)
    assert rm[0]["used_in_training"].startswith("YES: a reward model")
    offline = evaluate.training_use(
        "offline", {1: "offline", 2: "offline (assumed: no config.json)"}, cfg
    )
    assert (
        offline[0]["used_in_training"].startswith("YES: stage 1's --judge")
        and "stage 2's" in offline[0]["used_in_training"]
    )


def test_llm_judge_path_end_to_end(trained_run, tmp_path):
    # A tiny random model as "LLM judge": its answers are gibberish, so most are unparseable;
    # what is checked is the plumbing: every rubric criterion asked, counted, nothing approximated.
    judge = "hf:" + str(trained_run / "stage1" / "speakers")
    results = run(
        [
            "--model",
            "tiny",
            "--contexts",
            "1",
            "--turns",
            "2",
            "--max-new-tokens",
            "2",
            "--run",
            str(tmp_path),
            "--systems",
            "zero-shot,round-robin",
            "--no-persona-id",
            "--judge",
            judge,
            "--pairwise",
            "zero-shot,round-robin",
        ]
    )
    assert all(
        results["status"][m.key] == "ok" for m in evaluate.all_metrics() if "rubric" in m.group
    )
    # 1 conversation x (5 agent criteria x 2 agent turns + 4 collective criteria), per system;
    # no judge is asked for an overall score.
    md = (tmp_path / "eval" / "results.md").read_text()
    assert "of 28, left out of the means" in md
    # Without the independent evaluator the pairwise preference falls back to the judge, and says so.
    assert (
        results["pairwise"]["decided_by"] == "judge"
        and "decided by the judge" in results["pairwise"]["line"]
    )
    assert (
        results["pairwise"]["wins"] + results["pairwise"]["losses"] + results["pairwise"]["ties"]
        == 1
    )
    assert results["status"]["persona_id_accuracy"] == "skipped (--no-persona-id)"
    assert (tmp_path / "eval" / "judge_cache.jsonl").exists()


def test_missing_checkpoints_are_skipped_with_the_command_that_makes_them(tmp_path):
    model, tok = loading.load_model("tiny")
    model.save_pretrained(tmp_path / "stage1" / "speakers")
    tok.save_pretrained(tmp_path / "stage1" / "speakers")
    results = run(
        [
            "--model",
            "tiny",
            "--contexts",
            "1",
            "--turns",
            "1",
            "--max-new-tokens",
            "2",
            "--run",
            str(tmp_path),
            "--systems",
            "mascot-c,mascot,sft",
        ]
    )
    assert list(results["systems"]) == ["mascot-c"]
    assert results["skipped"]["mascot"] == (
        f"no model at {tmp_path / 'stage2' / 'director'}; make it with: "
        f"python mascot.py train --stage 2 --run {tmp_path} --model tiny"
    )
    assert results["skipped"]["sft"].endswith(
        f"python mascot.py sft --run {tmp_path} --model tiny "
        "--data <ESConv.json or an ESConv .jsonl>"
    )
    md = (tmp_path / "eval" / "results.md").read_text()
    assert "skipped **mascot**" in md
    assert "not run" in results["pairwise"]["line"]


def test_flag_errors_are_one_line_user_errors(tmp_path):
    with pytest.raises(common.UserError, match="--systems"):
        evaluate.choose_systems(
            "mascot,nonsense", {"trained": "x", "sft": "y", "trained-director": "z"}
        )
    with pytest.raises(common.UserError, match="--profiles"):
        evaluate.profile_ids("average,calm", {"average": None})
    with pytest.raises(common.UserError, match="--pairwise"):
        run(["--model", "tiny", "--run", str(tmp_path), "--pairwise", "mascot,mascot"])
    assert not (tmp_path / "eval" / "config.json").exists()  # refused before any work


# ------------------------------------------------------------------ planning conversations


def test_contexts_are_crossed_with_every_profile():
    # The paper: 50 contexts x 10 profiles = 500 conversations. Here 2 x 2, context by context.
    plan = evaluate.plan_conversations(["c0", "c1", "c2"], 2, ["p", "q"])
    assert plan == [("c0", "p"), ("c0", "q"), ("c1", "p"), ("c1", "q")]
    assert evaluate.plan_conversations(["c0", "c1"], 5, ["avg"]) == [("c0", "avg"), ("c1", "avg")]
    # 'all' = the ten one-trait profiles of the shipped file; the all-average one is left out.
    profiles = scenarios.load_profiles(mascot.ROOT / "data" / "profiles.json")
    ids = evaluate.profile_ids("all", profiles)
    assert len(ids) == 10 and "average" not in ids
    assert sorted({profiles[i].trait() for i in ids}) == sorted(scenarios.BIG_FIVE)
    assert profiles["average"].trait() == "average"


def test_profiles_all_reports_per_trait(trained_run, tmp_path):
    results = run(
        [
            "--model",
            "tiny",
            "--contexts",
            "1",
            "--turns",
            "1",
            "--max-new-tokens",
            "2",
            "--run",
            str(tmp_path),
            "--systems",
            "round-robin",
            "--profiles",
            "all",
            "--no-persona-id",
        ]
    )
    entry = results["systems"]["round-robin"]
    assert entry["n"] == 10 and results["slice_fields"][-2:] == ["profile", "trait"]
    assert set(entry["slices"]["trait"]) == set(scenarios.BIG_FIVE)
    assert all(sl["n"] == 2 for sl in entry["slices"]["trait"].values())  # high and low
    assert "## Per trait" in (tmp_path / "eval" / "results.md").read_text()


# ------------------------------------------------------------------ prompt styles


def personas():
    return scenarios.load_personas(mascot.ROOT / "personas.json", "support")


def context():
    return scenarios.Context(
        "t-1",
        "support",
        "I failed my driving test.",
        "I failed again today.",
        emotion="sad",
        valence="negative",
    )


def test_every_style_gets_the_same_card_and_conversation():
    ps = personas()
    anchor = ps.find("Anchor")
    turns = [Turn(USER, "I failed again today.")]
    examples = files.asset("fewshot.json")["support"]
    prompts = {
        style: speaker_messages(
            anchor,
            ps,
            context(),
            turns,
            style=style,
            examples=examples if "few-shot" in style else (),
        )
        for style in ("persona", "zero-shot", "zero-shot-cot", "few-shot", "few-shot-cot")
    }
    card = prompts["persona"][0]["content"].split("\n")[0]
    assert anchor.description in card and anchor.examples[0] in card
    for style, messages in prompts.items():
        assert messages[0]["content"].startswith(card)  # identical role settings
        assert messages[1] == prompts["persona"][1]  # the same conversation
    assert (
        "'Reply:'" in prompts["zero-shot-cot"][0]["content"]
        and "Thinking" in prompts["zero-shot-cot"][0]["content"]
    )
    assert examples[0]["reply"] in prompts["few-shot"][0]["content"]
    assert examples[0]["thinking"] not in prompts["few-shot"][0]["content"]
    assert examples[0]["thinking"] in prompts["few-shot-cot"][0]["content"]
    with pytest.raises(ValueError):
        speaker_messages(anchor, ps, context(), turns, style="few-shot-cot")
    # The name-only role setting: the same prompts with only "You are Anchor, the emotional validator."
    short = speaker_messages(
        role_setting(ps, "name").find("Anchor"),
        role_setting(ps, "name"),
        context(),
        turns,
        style="zero-shot",
    )
    assert short[0]["content"].startswith("You are Anchor, the emotional validator.\n")
    assert anchor.description not in short[0]["content"]


def test_speaker_prompt_gives_the_model_no_label_to_echo():
    # The conversation arrives as chat turns seen from the speaker (its own turns are the
    # assistant's), the situation as background in the system message: no "Situation:" or
    # "Conversation so far:" line for the model to copy into its reply.
    ps = personas()
    anchor = ps.find("Anchor")
    turns = [
        Turn(USER, "I failed again today."),
        Turn("Beacon", "You will pass next time."),
        Turn("Anchor", "That stings."),
        Turn(USER, "It does."),
    ]
    msgs = speaker_messages(anchor, ps, context(), turns, Directive("Anchor", "reflect", "warm"))
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].endswith(
        "\nBackground: " + context().situation + "\nIn your next message, reflect, in a warm tone."
    )
    assert (
        msgs[1]["content"]
        == "I failed again today.\n(Beacon, another companion): You will pass next time."
    )
    assert msgs[3]["content"] == "It does."
    # The director's free text becomes one plain sentence (article, case and end punctuation).
    assert (
        simulate.directive_sentence(Directive("Beacon", "Name a strength.", "encouraging"))
        == "In your next message, name a strength, in an encouraging tone."
    )
    assert (
        simulate.directive_sentence(Directive("Guide", "", ""))
        == "In your next message, respond, in a natural tone."
    )
    assert (
        simulate.directive_sentence(Directive("Guide", "ASK one thing", "warm."))
        == "In your next message, ASK one thing, in a warm tone."
    )
    assert doctest.testmod(simulate).failed == 0
    # Without a directive the system message ends with the background.
    assert speaker_messages(anchor, ps, context(), turns)[0]["content"].endswith(
        context().situation
    )
    assert not any(
        "Situation:" in m["content"] or "Conversation so far" in m["content"] for m in msgs
    )
    # When the speaker itself spoke last, a user message hands it the turn (roles must alternate).
    assert speaker_messages(anchor, ps, context(), turns[:3])[-1] == {
        "role": "user",
        "content": "(It is Anchor's turn.)",
    }


def test_fewshot_cot_keeps_only_the_reply():
    raw = "Thinking: they feel stuck.\n**Reply:** Try once more next week.\nThinking: next"
    assert reply_text(raw, "few-shot-cot").strip() == "Try once more next week."
    assert reply_text(raw, "zero-shot-cot").strip() == "Try once more next week."
    assert reply_text("Reply: Sure thing.", "few-shot") == "Sure thing."
    assert reply_text("No label at all.", "few-shot-cot") == "No label at all."
    assert reply_text(raw, "persona") == raw


# ------------------------------------------------------------------ fake LLM judges


class FakeJudge:
    """An 'LLM' judge with canned answers chosen by what the prompt contains."""

    can_generate = True
    name = "fake:llm"

    def __init__(self, answer):
        self.answer = answer
        self.prompts = []

    def complete(self, prompt, max_new_tokens=64):
        self.prompts.append(prompt)
        return self.answer(prompt)

    def complete_many(self, prompts, max_new_tokens=64):
        return [self.complete(p, max_new_tokens) for p in prompts]

    def rate_many(self, prompts, max_new_tokens=32):  # as judge.Judge.rate_many, with our parser
        from plumbing.answers import parse_rubric_score

        return [parse_rubric_score(a) for a in self.complete_many(prompts, max_new_tokens)]


def conversation(agent_texts, seed=0):
    conv = Conversation(context(), "support", "average", "test", seed)
    conv.turns.append(Turn(USER, "I failed again today."))
    for name, text in zip(["Anchor", "Catalyst", "Beacon"], agent_texts):
        conv.turns.append(Turn(name, text))
    return conv


def test_rubric_scores_count_and_exclude_unparseable_answers():
    def answer(prompt):
        if "Conversation:\n" in prompt:  # a collective prompt
            return "Score: 9" if "Criterion: engagement quality" in prompt else "**5**"
        reply = prompt.split("'s message: ")[1]
        if not reply.startswith("alpha"):
            return "I cannot say."
        return "Score: 5" if "Criterion: persona consistency" in prompt else "Score: 4/5"

    judge = FakeJudge(answer)
    values, unparseable = evaluate.rubric_scores(
        conversation(["alpha words", "beta words"]), personas(), judge
    )
    agent_criteria = [m["key"] for m in evaluate.rubric_criteria()["agent"]]
    # 5 agent criteria x 2 turns + 4 collective criteria were asked; no overall question.
    assert len(judge.prompts) == 5 * 2 + 4
    # Agent criteria: "alpha" -> 4 -> 75 (persona consistency 5 -> 100); "beta" unreadable -> left out.
    for key in agent_criteria:
        assert (
            values[key] == (100.0 if key == "persona_consistency" else 75.0)
            and unparseable[key] == 1
        )
    # Overall is the mean of the criteria, as in the paper: (4 x 75 + 100) / 5 = 80.
    assert values["agent_overall"] == 80.0
    # Collective: "**5**" -> 100; "Score: 9" is out of range -> unreadable -> None, and an
    # overall over an incomplete set of criteria would mean something else: None.
    assert values["persona_fidelity"] == 100.0
    assert values["engagement_quality"] is None and unparseable["engagement_quality"] == 1
    assert values["collective_overall"] is None
    assert sum(unparseable.values()) == 6
    collective = {m["key"]: 50.0 for m in evaluate.rubric_criteria()["collective"]}
    assert evaluate.with_overall(collective)["collective_overall"] == 50.0


def test_pairwise_compares_per_conversation_scores_with_a_sign_test():
    def entry(values, key="persona_log_ratio"):
        return {"conversations": [{"metrics": {key: v}} for v in values]}

    cfg = evaluate.EvalConfig(pairwise="mascot,round-robin")
    # 11 pairs: A better in 9, B in 1, one tie: 9 wins, 1 loss -> p = P(X <= 1 or X >= 9), X ~ Bin(10, 1/2) = 22 / 1024.
    pw = evaluate.pairwise(
        cfg, {"mascot": entry([0.7] * 9 + [0.1, 0.5]), "round-robin": entry([0.6] * 9 + [0.4, 0.5])}
    )
    assert pw["outcomes"] == ["A"] * 9 + ["B", "tie"] and pw["decided_by"] == "persona-id"
    assert pw["win_rate"] == 0.9 and pw["p_value"] == pytest.approx(22 / 1024)
    # By the judge: its mean score per conversation; a missing score is a tie.
    judged = evaluate.pairwise(
        evaluate.EvalConfig(pairwise_by="judge"),
        {
            "mascot": entry([0.7, 0.2, None], "judge_score"),
            "round-robin": entry([0.6, 0.4, 0.5], "judge_score"),
        },
    )
    assert judged["outcomes"] == ["A", "B", "tie"] and judged["decided_by"] == "judge"
    # Without the independent evaluator (--no-persona-id) the judge decides, and the line says so.
    assert evaluate.pairwise(
        cfg,
        {"mascot": entry([1.0], "judge_score"), "round-robin": entry([0.0], "judge_score")},
        identifier=False,
    )["outcomes"] == ["A"]


# ------------------------------------------------------------------ reward-hack diagnostics per conversation


def test_hack_scores_of_a_hand_made_conversation():
    ps = personas()
    catalyst = ps.find("Catalyst")
    conv = Conversation(context(), "support", "average", "test", 0)
    conv.turns += [
        Turn(USER, "I failed again today and I feel like a total fraud."),
        # copies 6+ words of the user's message -> context copy
        Turn("Anchor", "You failed again today and I feel like a total fraud, you say."),
        # copies Catalyst's own card (its first example line) -> persona-card copy
        Turn("Catalyst", catalyst.examples[0]),
        # echoes Anchor's turn (another companion) -> history echo; and a speaker label
        Turn("Beacon", "Anchor: you failed again today and I feel like a total fraud"),
        Turn("Guide", "Okay."),
    ]  # trivial (1 word)
    h = evaluate.hack_rates(conv, ps)
    # 4 agent turns: context copy in turns 1 and 3; card copy in 2; echo in 3; leak in 3; trivial in 4.
    assert h["context_copy"] == 0.5 and h["persona_copy"] == 0.25 and h["history_echo"] == 0.25
    assert h["meta_leak"] == 0.25 and h["trivial"] == 0.25
    # Words: 13 ("you failed ... you say"), 13 (Catalyst's example), 12 (the label counts), 1.
    assert catalyst.examples[0] == "What would you say to a friend who told you this exact story?"
    assert h["words"] == (13 + 13 + 12 + 1) / 4
    empty = Conversation(context(), "support", "average", "test", 0)
    assert all(v is None for v in evaluate.hack_rates(empty, ps).values())


# ------------------------------------------------------------------ the independent evaluator


class FixedLogprobs(evaluators.PersonaIdentifier):
    """lp[k] given by hand, so the accuracy and the log-ratio can be checked by hand; the sums over
    the first EQUAL_TOKENS tokens equal the whole turn's unless `first` is given."""

    def __init__(self, table, tokens, first=None):
        super().__init__(None, None, personas())
        self.table, self.tokens, self.first = table, tokens, first or table

    def logprobs(self, items):
        return self.table, self.first

    def reply_ids(self, reply):
        return [0] * self.tokens


def test_persona_log_ratio_by_hand():
    # Anchor's turn, 2 tokens; lp = -10 (Anchor), -12, -14, -16 (the others).
    # log mean exp(others) = log((e^-12 + e^-14 + e^-16) / 3); ratio = (-10 - that) / 2 tokens.
    ident = FixedLogprobs([[-10.0, -12.0, -14.0, -16.0], [-13.0, -12.0, -14.0, -16.0]], tokens=2)
    items = [evaluators.Item("Anchor", "s", [], "r"), evaluators.Item("Anchor", "s", [], "r")]
    first, second = ident.score(items)
    mean_others = math.log((math.exp(-12) + math.exp(-14) + math.exp(-16)) / 3)
    assert first["correct"] == 1.0 and first["log_ratio"] == pytest.approx((-10 - mean_others) / 2)
    assert second["correct"] == 0.0 and second["log_ratio"] == pytest.approx(
        (-13 - mean_others) / 2
    )
    assert first["correct_equal"] is None  # 2 tokens: too short for the equal-length accuracy
    unknown = ident.score([evaluators.Item("Nobody", "s", [], "r")])[0]
    assert unknown["correct"] is None and unknown["correct_equal"] is None


def test_equal_length_accuracy_reads_the_first_tokens_only():
    # A long Anchor turn: its first EQUAL_TOKENS tokens are more Guide-like (-20 vs -21), the whole
    # turn more Anchor-like (-50 vs -60), as when a longer reply wins on evidence alone.
    whole, first = [[-50.0, -60.0, -70.0, -80.0]], [[-21.0, -30.0, -25.0, -20.0]]
    ident = FixedLogprobs(whole, tokens=evaluators.EQUAL_TOKENS, first=first)
    score = ident.score([evaluators.Item("Anchor", "s", [], "r")])[0]
    assert score["correct"] == 1.0 and score["correct_equal"] == 0.0


def test_persona_names_are_masked_before_scoring():
    # Whole words spelt as the name: "Anchors" is a word of its own, "guide" an ordinary verb.
    assert (
        evaluators.mask_names(
            "Anchor here. Beacon says hi; Anchors aweigh; I can guide you",
            ["Anchor", "Beacon", "Guide"],
        )
        == "Alex here. Alex says hi; Anchors aweigh; I can guide you"
    )
    assert evaluators.mask_names("Ask J.D. (J.D. knows)", ["J.D."]) == "Ask Alex (Alex knows)"
    assert not any(evaluators.NEUTRAL_NAME in evaluators.card_text(p) for p in personas().personas)
    # A reply that signs with its speaker's name scores exactly as the same reply signed "Alex".
    model, tok = loading.load_model("tiny")
    ident = evaluators.PersonaIdentifier(model, tok, personas())
    signed, neutral = (
        evaluators.Item(
            "Anchor", "I failed.", [("User", "I failed my test.")], f"{name} here: that hurts."
        )
        for name in ("Anchor", "Alex")
    )
    lp, _ = ident.logprobs([signed, neutral])
    assert lp[0] == pytest.approx(lp[1], abs=1e-5)


def test_persona_id_logprobs_match_a_plain_forward_pass():
    # The batched, padded scoring must equal sum log softmax of one unpadded forward pass.
    model, tok = loading.load_model("tiny")
    ps = personas()
    ident = evaluators.PersonaIdentifier(model, tok, ps)
    # The last two share the first one's prompt (as judge-stress's candidates do), so their rows
    # take completion_logprobs' shared-prompt path.
    items = [
        evaluators.Item(
            "Anchor", "I failed.", [("User", "I failed my test.")], "That sounds heavy."
        ),
        evaluators.Item(
            "Guide",
            "A long situation " * 5,
            [("User", "Help."), ("Anchor", "I hear you.")],
            "Try x.",
        ),
        evaluators.Item(
            "Anchor", "I failed.", [("User", "I failed my test.")], "Tell me more about it?"
        ),
        evaluators.Item(
            "Beacon", "I failed.", [("User", "I failed my test.")], "You will pass next time."
        ),
        evaluators.Item(
            "Guide", "I failed.", [("User", "I failed my test.")], "Make a plan, step by step. " * 8
        ),
    ]
    assert len(ident.reply_ids(items[-1].reply)) > evaluators.EQUAL_TOKENS
    lp, lp_first = ident.logprobs(items)
    for i, item in enumerate(items):
        for k, card in enumerate(ps.personas):
            prompt = models.chat_prompt_ids(
                tok, [evaluators.id_messages(card, item.situation, item.history)]
            )[0]
            reply = ident.reply_ids(item.reply)
            ids = torch.tensor([prompt + reply])
            with torch.no_grad():
                logits = model(ids).logits.log_softmax(-1)[0]  # (T, V)
            token_lps = [logits[len(prompt) - 1 + j, t].item() for j, t in enumerate(reply)]
            assert lp[i][k] == pytest.approx(sum(token_lps), abs=1e-3)
            assert lp_first[i][k] == pytest.approx(
                sum(token_lps[: evaluators.EQUAL_TOKENS]), abs=1e-3
            )


def test_evaluate_help_offers_every_baseline_of_the_paper(capsys):
    with pytest.raises(SystemExit) as stop:  # argparse prints the help and exits 0
        mascot.main(["evaluate", "--help"])
    assert stop.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in (
        "zero-shot",
        "zero-shot-cot",
        "few-shot",
        "few-shot-cot",
        "self-consistency",
        "sft",
        "multiagentesc",
        "round-robin",
        "mascot-p",
        "mascot-c",
        "mascot",
        "--role-setting",
        "--human",
        "--pairwise-by",
    ):
        assert name in text


def test_an_interrupted_evaluation_redoes_only_the_unfinished_systems(tmp_path, monkeypatch):
    base = [
        "--model",
        "tiny",
        "--contexts",
        "2",
        "--turns",
        "1",
        "--max-new-tokens",
        "2",
        "--systems",
        "zero-shot,round-robin",
        "--pairwise",
        "zero-shot,round-robin",
        "--pairwise-by",
        "judge",
    ]
    whole = run(base + ["--run", str(tmp_path / "whole")])
    real_run_system, ran = evaluate.run_system, []

    def interrupted(system, *rest):
        if system.name == "round-robin":
            raise KeyboardInterrupt  # Ctrl-C during the second system
        return real_run_system(system, *rest)

    def counted(system, *rest):
        ran.append(system.name)
        return real_run_system(system, *rest)

    out = tmp_path / "cut"
    monkeypatch.setattr(evaluate, "run_system", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(base + ["--run", str(out)])
    assert [p.name for p in (out / "eval" / "partial").iterdir()] == ["zero-shot.json"]
    monkeypatch.setattr(evaluate, "run_system", counted)
    resumed = run(base + ["--run", str(out)])
    assert ran == ["round-robin"]  # zero-shot was kept, not simulated again
    for name in ("zero-shot", "round-robin"):
        # Equal up to float summation order (the sentence encoder pads a batch of other texts).
        got, want = (results.json_safe(r["systems"][name]["metrics"]) for r in (resumed, whole))
        assert got.keys() == want.keys()
        for key in want:
            assert got[key].get("n") == want[key].get("n")
            if want[key].get("mean") is None:  # a metric without a number
                assert got[key].get("mean") is None
            else:
                assert got[key]["mean"] == pytest.approx(want[key]["mean"], rel=1e-5)
    assert (
        resumed["pairwise"]["outcomes"] == whole["pairwise"]["outcomes"]
    )  # kept conversations judged again
    assert not (out / "eval" / "partial").exists()  # results.json holds everything now
    # A saved system is only reused for the same flags: another --turns redoes everything.
    monkeypatch.setattr(evaluate, "run_system", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(base + ["--run", str(out)])
    ran.clear()
    monkeypatch.setattr(evaluate, "run_system", counted)
    run(base[:5] + ["2"] + base[6:] + ["--run", str(out)])
    assert ran == ["zero-shot", "round-robin"]


def test_a_saved_system_survives_flags_that_do_not_decide_its_numbers(tmp_path, monkeypatch):
    """A finished system was redone when the command line changed at all (--quiet, --systems),
    and a saved one left out of the results was deleted. Now each is kept while what ITS numbers
    depend on is unchanged, and partial/ keeps it until the results hold it or it is invalid."""
    out = tmp_path / "run"
    partial = out / "eval" / "partial"
    real_run_system, ran = evaluate.run_system, []

    def interrupted(system, *rest):
        if system.name == "round-robin":
            raise KeyboardInterrupt
        ran.append(system.name)
        return real_run_system(system, *rest)

    def evaluation(systems, *more, stop=False):
        ran.clear()
        argv = TINY[:4] + ["--turns", "1", "--max-new-tokens", "2", "--systems", systems]
        argv += ["--pairwise-by", "judge", "--no-persona-id", "--run", str(out), *more]
        monkeypatch.setattr(evaluate, "run_system", interrupted if stop else counted)
        return run(argv)

    def counted(system, *rest):
        ran.append(system.name)
        return real_run_system(system, *rest)

    with pytest.raises(KeyboardInterrupt):
        evaluation("zero-shot,few-shot,round-robin", stop=True)
    assert sorted(p.name for p in partial.iterdir()) == ["few-shot.json", "zero-shot.json"]
    # Other --systems, --pairwise, --quiet, --served-timeout: zero-shot is kept, few-shot too.
    flags = ["--quiet", "--pairwise", "round-robin,zero-shot", "--served-timeout", "9"]
    evaluation("zero-shot,round-robin", *flags)
    assert ran == ["round-robin"]
    assert [p.name for p in partial.iterdir()] == ["few-shot.json"]  # not in the results
    kept = evaluation("few-shot")
    assert ran == [] and not partial.exists()  # now the results hold it
    assert kept["systems"]["few-shot"]["n"] == 2
    # Another --max-new-tokens decides every system's numbers: nothing is reused, and a system
    # that could no longer be reused is deleted at the end.
    with pytest.raises(KeyboardInterrupt):
        evaluation("zero-shot,few-shot,round-robin", stop=True)
    evaluation("zero-shot", "--max-new-tokens", "3")
    assert ran == ["zero-shot"] and not partial.exists()


def test_each_system_depends_on_its_own_models_only():
    protocol = {
        "config": {"turns": 2},
        "own": {"trained": ["stamp A"], "sft": ["stamp B"], "self-consistency": [5, "majority"]},
    }
    by_name = {s.name: s for s in evaluate.SYSTEMS}
    retrained = protocol | {"own": protocol["own"] | {"trained": ["stamp C"]}}
    for name, changes in {"zero-shot": False, "sft": False, "mascot-c": True}.items():
        system = by_name[name]
        parts = (system.speakers, system.order, system.pipeline)
        before, after = (results.system_protocol(parts, p) for p in (protocol, retrained))
        assert (before != after) == changes

    def own(name):
        system = by_name[name]
        parts = (system.speakers, system.order, system.pipeline)
        return results.system_protocol(parts, protocol)["own"]

    assert own("self-consistency") == {"self-consistency": [5, "majority"]}
    assert own("sft") == {"sft": ["stamp B"]}


class CrisisAlways:
    """A guard that flags every message (the real one is tested in tests/test_safety.py)."""

    message = "Please call a crisis line."

    def check(self, text):
        return types.SimpleNamespace(flagged=True, category="test", score=None)


def test_a_conversation_comes_back_from_its_transcript_row():
    ctx = scenarios.Context("c-1", "support", "Lost my job.", "I lost my job today.")
    conv = simulate.start_conversation(ctx, "support", "average", "round-robin", 3)
    conv.turns.append(
        simulate.Turn("Anchor", "That is hard.", simulate.Directive("Anchor", "validate", "warm"))
    )
    simulate.add_user_turn(conv, "I want to end my life tonight.", CrisisAlways())
    from extras.director_headroom import conversation_from_json

    back = conversation_from_json(json.loads(json.dumps(conv.to_json())), ctx)
    assert back == conv and back.ended
    with pytest.raises(ValueError, match="c-2"):
        conversation_from_json(conv.to_json(), scenarios.Context("c-2", "support", "x", "y"))


def test_every_crisis_stop_is_listed_once_with_its_category_and_score():
    flag = {
        "context_id": "esconv-7",
        "profile": "average",
        "turn": 0,
        "text": "I want to end my life | tonight",
        "category": "explicit_suicidal",
        "score": 1.234,
    }
    later = {
        "context_id": "esconv-9",
        "profile": "average",
        "turn": 2,
        "text": "To be continued.",
        "category": "probe",
        "score": 0.05,
    }
    systems = {
        "round-robin": {"crisis_flags": [flag]},
        "mascot": {"crisis_flags": [flag, later]},
        "zero-shot": {"crisis_flags": []},
    }
    from extras.safety import CrisisGuard

    lines = "\n".join(CrisisGuard.stops_section(systems)).splitlines()
    rows = [line for line in lines if line.startswith("| esconv-")]
    assert rows == [
        "| esconv-7 | 0 | I want to end my life \\| tonight | explicit_suicidal | +1.23 | round-robin, mascot |",
        "| esconv-9 | 2 | To be continued. | probe | +0.05 | mascot |",
    ]
    assert CrisisGuard.stops_section({"a": {"crisis_flags": []}}) == []
