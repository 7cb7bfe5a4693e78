"""Tests of the evaluation run in evaluate.py (the systems part; the metric formulas are in
tests/test_metrics.py) and of the prompt styles it adds to simulate.py.

The end-to-end test builds a run folder with tiny random models saved where stage 1 and stage 2
save theirs (RUN/stage1/speakers, RUN/stage2/director), so every system runs without training.
Fake LLM judges (can_generate=True, canned answers) check the rubric parsing and the pairwise
preference against counts worked out by hand.

Run: .venv/bin/python -m pytest -q tests/test_evaluate.py
"""

import json
from collections import Counter

import pytest
import torch

import data
import evaluate
import mascot
import models
from simulate import USER, Conversation, Turn, reply_text, speaker_messages


def parse(argv):
    """The flags exactly as `mascot.py evaluate` parses them."""
    return mascot.build_parser().parse_args(["evaluate", *argv])


def run(argv):
    return mascot.evaluate_cmd(parse(argv))


TINY = ["--model", "tiny", "--contexts", "2", "--turns", "2", "--max-new-tokens", "4"]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy CPU the threads wait for each
    other (measured: the end-to-end run below took 64 s of CPU with 2 threads, 12 s with 1)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run folder with 'trained' speakers and director (tiny random models, untrained)."""
    run = tmp_path_factory.mktemp("run")
    model, tok = models.load_model("tiny")
    for folder in (run / "stage1" / "speakers", run / "stage2" / "director"):
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
    lines = [json.loads(x) for x in (trained_run / "eval" / "transcripts.jsonl").read_text().splitlines()]
    assert Counter(x["system"] for x in lines) == {name: 2 for name in evaluate.SYSTEM_NAMES}
    for i in range(2):
        same = {(x["context_id"], x["profile"], x["seed"]) for x in lines if x["index"] == i}
        assert len(same) == 1


def test_confidence_intervals_contain_the_means(full_results):
    checked = 0
    for entry in full_results["systems"].values():
        for key, summary in entry["metrics"].items():
            if summary["status"] in ("ok", "approximated") and summary["n"]:
                assert summary["lo"] - 1e-9 <= summary["mean"] <= summary["hi"] + 1e-9, key
                checked += 1
    assert checked >= 7 * 6   # persona consistency, relevance and the redundancy metrics


def test_summaries_match_a_hand_computed_interval():
    # One system's four conversations with self_bleu 0, 0, 0, 1: mean 0.25; a resample's mean is
    # k/4 with k ~ Binomial(4, 1/4) (P(k<=2) = 0.949, P(k<=3) = 0.996), so the 95% percentile
    # interval is [0, 0.75] (metrics.bootstrap_ci). A conversation without a value is left out.
    records = [{"metrics": {"self_bleu": v}} for v in (0.0, 0.0, 0.0, 1.0, None)]
    status = {m.key: "ok" for m in evaluate.ALL_METRICS}
    summary = evaluate.aggregate(records, status, seed=0)["self_bleu"]
    assert summary == {"mean": 0.25, "lo": 0.0, "hi": 0.75, "n": 4, "status": "ok"}


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
    assert "NLI entailment" not in md.split("## Notes")[0]     # skipped columns are left out
    # Each row names the judge and the models.
    row = next(line for line in md.splitlines() if line.startswith("| mascot |"))
    assert full_results["judge"] in row and "trained:" in row
    # The default pairwise comparison ran on every conversation pair.
    pw = full_results["pairwise"]
    assert (pw["a"], pw["b"]) == ("mascot", "round-robin")
    assert pw["wins"] + pw["losses"] + pw["ties"] == 2
    assert "exact two-sided binomial p" in pw["line"]


def test_llm_judge_path_end_to_end(trained_run, tmp_path):
    # A tiny random model as "LLM judge": its answers are gibberish, so most are unparseable;
    # what is checked is the plumbing: every rubric metric asked, counted, nothing approximated.
    judge = "hf:" + str(trained_run / "stage1" / "speakers")
    results = run(["--model", "tiny", "--contexts", "1", "--turns", "2", "--max-new-tokens", "2",
                                  "--run", str(tmp_path), "--systems", "zero-shot,round-robin",
                                  "--judge", judge, "--pairwise", "zero-shot,round-robin"])
    assert all(results["status"][m.key] == "ok" for m in evaluate.RUBRIC_METRICS)
    assert results["approximations"] == {}
    # 1 conversation x (6 agent metrics x 2 agent turns + 5 collective metrics), per system.
    assert any("of 34, left out of the means" in note for note in results["notes"])
    assert results["pairwise"]["wins"] + results["pairwise"]["losses"] + results["pairwise"]["ties"] == 1
    assert (tmp_path / "eval" / "judge_cache.jsonl").exists()


def test_missing_director_is_skipped_with_a_note(tmp_path):
    model, tok = models.load_model("tiny")
    model.save_pretrained(tmp_path / "stage1" / "speakers")
    tok.save_pretrained(tmp_path / "stage1" / "speakers")
    results = run(["--model", "tiny", "--contexts", "1", "--turns", "1", "--max-new-tokens", "2",
                   "--run", str(tmp_path), "--systems", "mascot-c,mascot"])
    assert list(results["systems"]) == ["mascot-c"]
    assert "no trained director" in results["skipped"]["mascot"]
    md = (tmp_path / "eval" / "results.md").read_text()
    assert "skipped **mascot**" in md
    assert "not run" in results["pairwise"]["line"]


def test_flag_errors_are_one_line_user_errors(tmp_path):
    with pytest.raises(data.UserError, match="--systems"):
        evaluate.choose_systems("mascot,nonsense", True, True, "s", "d")
    with pytest.raises(data.UserError, match="--profiles"):
        evaluate.resolve_profiles("average,calm", {"average": None})


# ------------------------------------------------------------------ planning conversations

def test_profiles_are_assigned_round_robin_with_equal_counts():
    # 3 contexts, 2 profiles -> rounded up to 4 conversations, contexts cycling.
    plan = evaluate.plan_conversations(["c0", "c1", "c2", "c3"], 3, ["p", "q"])
    assert plan == [("c0", "p"), ("c1", "q"), ("c2", "p"), ("c0", "q")]
    assert evaluate.plan_conversations(["c0", "c1"], 5, ["avg"]) == [("c0", "avg"), ("c1", "avg")]
    assert evaluate.resolve_profiles("all", {"a": 1, "b": 2}) == ["a", "b"]


# ------------------------------------------------------------------ prompt styles

def personas():
    return data.load_personas(mascot.ROOT / "personas.json", "support")


def context():
    return data.Context("t-1", "support", "I failed my driving test.", "I failed again today.",
                        emotion="sad", valence="negative")


def test_prompt_styles_differ():
    ps = personas()
    anchor = ps.find("Anchor")
    turns = [Turn(USER, "I failed again today.")]
    examples = evaluate.load_fewshot("support")
    persona = speaker_messages(anchor, ps, context(), turns)
    plain = speaker_messages(anchor, ps, context(), turns, style="plain")
    cot = speaker_messages(anchor, ps, context(), turns, style="fewshot-cot", examples=examples)
    assert plain[0]["content"] == f"You are Anchor, {anchor.role}. Reply briefly."
    assert anchor.description in persona[0]["content"]
    assert anchor.description not in cot[0]["content"]
    assert examples[0]["thinking"] in cot[0]["content"] and "'Reply:'" in cot[0]["content"]
    assert persona[1] == plain[1] == cot[1]          # the same conversation in every style
    with pytest.raises(ValueError):
        speaker_messages(anchor, ps, context(), turns, style="fewshot-cot")


def test_fewshot_cot_keeps_only_the_reply():
    raw = "Thinking: they feel stuck.\n**Reply:** Try once more next week.\nThinking: next"
    assert reply_text(raw, "fewshot-cot").strip() == "Try once more next week."
    assert reply_text("No label at all.", "fewshot-cot") == "No label at all."
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


def conversation(agent_texts, seed=0):
    conv = Conversation(context(), "support", "average", "test", seed)
    conv.turns.append(Turn(USER, "I failed again today."))
    for name, text in zip(["Anchor", "Catalyst", "Beacon"], agent_texts):
        conv.turns.append(Turn(name, text))
    return conv


def test_rubric_scores_count_and_exclude_unparseable_answers():
    def answer(prompt):
        if "Conversation:\n" in prompt:                  # a collective prompt
            return "Score: 9" if "Criterion: engagement quality" in prompt else "**5**"
        reply = prompt.split("'s message: ")[1]
        return "Score: 4/5" if reply.startswith("alpha") else "I cannot say."

    judge = FakeJudge(answer)
    values, unparseable = evaluate.rubric_scores(conversation(["alpha words", "beta words"]), personas(), judge)
    # 6 agent metrics x 2 turns + 5 collective metrics were asked.
    assert len(judge.prompts) == 6 * 2 + 5
    # Agent metrics: "alpha" -> 4 -> 75; "beta" unreadable -> left out; mean 75.
    for m in evaluate.AGENT_METRICS:
        assert values[m.key] == 75.0 and unparseable[m.key] == 1
    # Collective: "**5**" -> 100; "Score: 9" is out of range -> unreadable -> None.
    assert values["collective_overall"] == 100.0
    assert values["engagement_quality"] is None and unparseable["engagement_quality"] == 1
    assert sum(unparseable.values()) == 7


def test_pairwise_with_an_llm_judge_both_orders():
    # 11 conversation pairs: A's conversation is GOOD in 9, B's in 1, neither in 1. The judge
    # picks the conversation that says GOOD in either order, and answers "A" (the first shown)
    # when neither does: a pure position bias, which the two orders turn into a tie.
    def answer(prompt):
        a_block = prompt.split("Conversation A:")[1].split("Conversation B:")[0]
        b_block = prompt.split("Conversation B:")[1]
        return "B" if "GOOD" in b_block and "GOOD" not in a_block else "Answer: A"

    a = [conversation(["GOOD reply"], i) for i in range(9)] + [conversation(["plain"], 9), conversation(["plain"], 10)]
    b = [conversation(["plain"], i) for i in range(9)] + [conversation(["GOOD reply"], 9), conversation(["plain"], 10)]
    judge = FakeJudge(answer)
    outcomes, unreadable = evaluate.pairwise_outcomes(a, b, judge, personas())
    assert outcomes == ["A"] * 9 + ["B", "tie"] and unreadable == 0
    assert len(judge.prompts) == 22                     # both orders for every pair
    stats = evaluate.win_rate(outcomes)
    # 9 wins, 1 loss: p = P(X <= 1 or X >= 9), X ~ Bin(10, 1/2) = 22 / 1024.
    assert stats["win_rate"] == 0.9 and stats["p_value"] == pytest.approx(22 / 1024)


def test_pairwise_without_an_llm_compares_mean_scores():
    class Offline:
        can_generate = False
    outcomes, _ = evaluate.pairwise_outcomes([None] * 3, [None] * 3, Offline(), personas(),
                                             [0.7, 0.2, 0.5], [0.6, 0.4, 0.5])
    assert outcomes == ["A", "B", "tie"]
