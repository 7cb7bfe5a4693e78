"""Tests for the judges: the cache, the offline judge and the LLM judges (judge.py), the pair files and
the report (extras/judges.py), the OpenAI judge and its client (plumbing/served.py).

The OpenAI judge is tested against a small HTTP server that each test starts on 127.0.0.1 (port 0)
in a thread, with a scripted list of answers, so retries, timeouts and key handling are exercised
over real sockets without any network. Backoff waits are recorded instead of slept.
"""

import argparse
import json
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_openai import FakeServer, completion

import judge
import mascot
import reward
import scenarios
from extras import judges
from judge import JudgeState, Verdict
from plumbing import answers, served
from plumbing.common import UserError
from plumbing.files import AnswerCache
from simulate import USER, Turn

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-DO-NOT-LEAK-8f3a2c"

STATE = JudgeState(
    persona_name="Anchor",
    persona_desc="An emotional validator; never gives advice.",
    context="I failed my driving test again today.",
    history=[{"speaker": "user", "text": "Big day tomorrow."}],
)


# ----------------------------------------------------------------------------------------------
# The cache
# ----------------------------------------------------------------------------------------------


def test_cache_round_trip(tmp_path):
    path = tmp_path / "cache.jsonl"
    cache = AnswerCache(path)
    key = AnswerCache.make_key("offline:x", "score", {"reply": "hi", "state": {"a": 1}})
    # Canonical JSON: the order of dict keys does not change the key.
    assert key == AnswerCache.make_key("offline:x", "score", {"state": {"a": 1}, "reply": "hi"})
    assert key != AnswerCache.make_key("offline:y", "score", {"reply": "hi", "state": {"a": 1}})
    assert cache.get(key) is None
    cache.put(key, 0.25)
    cache.put("other", {"preferred": 1, "p_first": 0.2, "detail": {}})
    again = AnswerCache(path)
    assert again.get(key) == 0.25
    assert again.get("other")["preferred"] == 1
    assert len(again) == 2


def test_cache_ignores_a_cut_off_last_line_and_skips_garbled_middle_lines(tmp_path, capsys):
    path = tmp_path / "cache.jsonl"
    good = [json.dumps({"key": f"k{i}", "value": i + 1}) for i in range(3)]
    path.write_text(
        good[0] + "\n" + "{not json\n" + good[1] + "\n" + good[2] + "\n" + '{"key": "k9", "val',
        encoding="utf-8",
    )
    cache = AnswerCache(path)
    assert [cache.get(f"k{i}") for i in range(3)] == [1, 2, 3]
    assert cache.get("k9") is None
    assert cache.skipped == 1  # the middle line; the last one is not damage
    err = capsys.readouterr().err
    assert "line 2" in err and "line 5" in err and "cut off" in err
    # Appending after a crash: the half-written line is dropped, so the new record stays readable.
    cache.put("k9", 10)
    assert AnswerCache(path).get("k9") == 10


class CountingJudge(judge.Judge):
    """A fake backend: the score is the reply's length mod 7, and every call is counted."""

    name = "fake"

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        return [len(r) % 7 / 7 for r in replies]

    def _compare_uncached(self, states, firsts, seconds):
        self.backend_calls += len(firsts)
        return [Verdict(0 if len(a) > len(b) else 1, 0.5, {}) for a, b in zip(firsts, seconds)]


def test_a_cached_judgement_is_never_asked_again(tmp_path):
    path = tmp_path / "cache.jsonl"
    first = CountingJudge(cache_path=path)
    scores = first.score_many([STATE] * 3, ["one", "three", "one"])
    verdict = first.compare(STATE, "long reply", "short")
    assert scores[0] == scores[2]
    assert first.backend_calls == 3  # two distinct scores + one compare
    again = CountingJudge(cache_path=path)  # a new process reading the same file
    assert again.score_many([STATE] * 3, ["one", "three", "one"]) == scores
    assert again.compare(STATE, "long reply", "short") == verdict
    assert again.backend_calls == 0
    assert len(again.cache) == 3  # two scores and one verdict, each stored once
    again.score(STATE, "new reply")  # only the new item reaches the backend
    assert again.backend_calls == 1


# ----------------------------------------------------------------------------------------------
# OpenAIJudge against a local server
# ----------------------------------------------------------------------------------------------


def answer_good_one(body):
    """Answer with the label of the reply that contains 'GOOD', as a sensible judge would."""
    prompt = body["messages"][-1]["content"]
    a = re.search(r"Reply A: (.*)", prompt).group(1)
    return completion("Reply A is better." if "GOOD" in a else "**B**")


def make_openai(url, tmp_path=None, **kw):
    kw.setdefault("backoff", 0.001)
    j = served.OpenAIJudge(
        url, "test-model", cache_path=tmp_path / "c.jsonl" if tmp_path else None, **kw
    )
    j.waits = []
    j.client.sleep = j.waits.append  # record the backoff instead of sleeping
    return j


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("MASCOT_JUDGE_API_KEY", KEY)


def test_openai_asks_both_orders_and_parses_the_answers(api_key, tmp_path):
    with FakeServer([answer_good_one]) as server:
        j = make_openai(server.url, tmp_path)
        v = j.compare(STATE, "a GOOD reply", "a bad reply")
        assert (v.preferred, v.p_first) == (0, 1.0)
        assert j.compare(STATE, "a bad reply", "the GOOD one").preferred == 1
        assert len(server.requests) == 4  # two orders per comparison
        first, second = (r["json"]["messages"][-1]["content"] for r in server.requests[:2])
        assert "Reply A: a GOOD reply" in first and "Reply A: a bad reply" in second
        req = server.requests[0]
        assert req["path"] == "/v1/chat/completions"
        assert req["json"]["temperature"] == 0 and req["json"]["model"] == "test-model"
        assert req["headers"]["Authorization"] == f"Bearer {KEY}"
        # A re-created judge on the same cache file sends nothing.
        again = make_openai(server.url, tmp_path)
        assert again.compare(STATE, "a GOOD reply", "a bad reply").preferred == 0
        assert len(server.requests) == 4 and again.backend_calls == 0


def test_openai_position_bias_gives_no_verdict(tmp_path):
    with FakeServer([completion("A")]) as server:  # always the first position
        v = make_openai(server.url).compare(STATE, "x", "y")
        assert v.preferred is None and v.p_first == 0.5


def test_openai_scores_and_unreadable_answers(tmp_path):
    with FakeServer(
        [completion("Score: 4"), completion("I would rather not say."), completion("2")]
    ) as server:
        j = make_openai(server.url, tmp_path)
        assert j.score(STATE, "r1") == 0.75  # (4 - 1) / 4
        assert j.score(STATE, "r2") == 0.5 and j.unreadable == 1  # no verdict: neutral, no raise
        assert j.score(STATE, "r3") == 0.25
        # An unreadable answer is not cached: asking again reaches the server again.
        assert make_openai(server.url, tmp_path).score(STATE, "r2") == 0.25
        assert len(server.requests) == 4


def test_openai_unreadable_label_is_no_verdict(tmp_path):
    with FakeServer([completion("Both are fine."), completion("B")]) as server:
        j = make_openai(server.url)
        v = j.compare(STATE, "x", "y")
        assert v.preferred is None and j.unreadable == 1


def test_openai_retries_429_with_retry_after_then_500_then_succeeds(tmp_path):
    with FakeServer(
        [(429, {"Retry-After": "7"}, "slow down"), (500, {}, "oops"), completion("Hello.")]
    ) as server:
        j = make_openai(server.url, backoff=0.5)
        assert j.complete_many(["Say hello."])[0] == "Hello."
        assert len(server.requests) == 3
        assert j.waits[0] == 7.0  # Retry-After honoured
        assert 0.5 * 2 * 0.5 <= j.waits[1] <= 0.5 * 2 * 1.5  # 2nd retry: base * 2^1 * jitter


def test_openai_gives_up_after_max_retries_without_leaking_the_key(api_key, tmp_path):
    with FakeServer([(503, {}, f"unavailable, your key was {KEY}")]) as server:
        j = make_openai(server.url, tmp_path, max_retries=3)
        with pytest.raises(UserError) as err:
            j.compare(STATE, "x", "y")
        message = str(err.value)
        assert len(server.requests) == 4 and len(j.waits) == 3
        assert "\n" not in message and server.url in message and "4 attempts" in message
        assert KEY not in message and KEY not in repr(j) and KEY not in str(vars(j))


def test_openai_client_errors_are_not_retried(api_key, tmp_path):
    with FakeServer([(401, {}, f"bad key {KEY}")]) as server:
        j = make_openai(server.url, tmp_path)
        with pytest.raises(UserError) as err:
            j.score(STATE, "x")
        assert len(server.requests) == 1
        assert "401" in str(err.value) and KEY not in str(err.value) and "\n" not in str(err.value)


def test_openai_timeout_is_retried(tmp_path):
    def slow(body):
        threading.Event().wait(1.0)
        return completion("too late")

    with FakeServer([slow, completion("B")]) as server:
        j = make_openai(server.url, timeout=0.2, max_retries=2)
        assert j.complete_many(["hi"])[0] == "B"
        assert len(server.requests) == 2 and len(j.waits) == 1
    with FakeServer([slow]) as server:
        j = make_openai(server.url, timeout=0.2, max_retries=0)
        with pytest.raises(UserError, match="1 attempts"):
            j.complete_many(["hi"])[0]


def test_the_key_never_reaches_the_cache_file(api_key, tmp_path):
    with FakeServer([answer_good_one]) as server:
        j = make_openai(server.url, tmp_path)
        j.compare(STATE, "a GOOD reply", "meh")
        assert server.requests[0]["headers"]["Authorization"].endswith(KEY)
    text = (tmp_path / "c.jsonl").read_text()
    assert text.strip() and KEY not in text


# ----------------------------------------------------------------------------------------------
# Faults of a real server: every one reproduced here against the fake server
# ----------------------------------------------------------------------------------------------


def score_by_reply(body):
    """Score k for a reply 'r<k>' (k in 1..5, cycling), so the order of the results is checkable."""
    reply = re.search(r"Reply: (r(\d+))", body["messages"][-1]["content"])
    return completion(f"Score: {int(reply.group(2)) % 5 + 1}")


def replies_asked(server):
    return {
        re.search(r"Reply: (r\d+)", r["json"]["messages"][-1]["content"]).group(1)
        for r in server.requests
    }


def test_a_killed_server_loses_nothing_and_a_rerun_asks_only_what_is_missing(tmp_path):
    """The server dies after 6 answers, mid-batch; every answer it gave is already in the cache
    file, and the rerun against a restarted server sends none of them again."""
    answered = []

    def dies_after_six(body):
        if len(answered) >= 6:
            return None, {}, ""  # killed: the connection drops without an answer
        answered.append(re.search(r"Reply: (r\d+)", body["messages"][-1]["content"]).group(1))
        return score_by_reply(body)

    replies = [f"r{k}" for k in range(12)]
    with FakeServer([dies_after_six]) as server:
        j = make_openai(server.url, tmp_path, max_retries=0, concurrency=3)
        with pytest.raises(UserError, match="no answer"):
            j.score_many([STATE] * len(replies), replies)
        port = server.httpd.server_address[1]
    assert len(answered) == 6
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 6  # each flushed as it came
    with FakeServer([score_by_reply], port=port) as server:  # restarted, same address
        j = make_openai(server.url, tmp_path, concurrency=3)
        scores = j.score_many([STATE] * len(replies), replies)
        asked_again = replies_asked(server)
    assert asked_again == set(replies) - set(answered) and len(server.requests) == 6  # zero repeats
    assert scores == [(k % 5) / 4 for k in range(12)]  # (k % 5 + 1 - 1) / 4, in order


def test_requests_overlap_up_to_the_concurrency_and_results_stay_in_order():
    def slow_score(body):
        threading.Event().wait(0.15)
        return score_by_reply(body)

    replies = [f"r{k}" for k in range(8)]
    for concurrency, most in ((1, 1), (4, 4)):
        with FakeServer([slow_score]) as server:
            scores = make_openai(server.url, concurrency=concurrency).score_many(
                [STATE] * 8, replies
            )
        assert server.max_active == most, concurrency
        assert scores == [(k % 5) / 4 for k in range(8)]


def test_a_400_shows_the_servers_message_and_a_hint(api_key):
    error = {
        "error": {
            "message": f"the request exceeds the available context size (256 tokens); key {KEY}",
            "type": "exceed_context_size_error",
        }
    }
    with FakeServer([(400, {}, error)]) as server:
        with pytest.raises(UserError) as err:
            make_openai(server.url).score(STATE, "x")
    message = str(err.value)
    assert len(server.requests) == 1  # not retried
    assert "exceeds the available context size (256 tokens)" in message and "HTTP 400" in message
    assert "rejected" in message and "\n" not in message and KEY not in message


@pytest.mark.parametrize(
    "status, hint",
    [(401, "API key"), (403, "API key"), (404, "model name"), (422, "check the URL")],
)
def test_each_client_error_has_its_hint(status, hint):
    with FakeServer([(status, {}, "<html>nope</html>")]) as server:
        with pytest.raises(UserError, match=hint) as err:
            make_openai(server.url).score(STATE, "x")
    assert "<html>nope</html>" in str(err.value)


def test_retry_after_is_capped_at_the_maximum_backoff():
    with FakeServer(
        [(429, {"Retry-After": "86400"}, "come back tomorrow"), completion("Hi.")]
    ) as server:
        j = make_openai(server.url, max_backoff=30.0)
        assert j.complete_many(["Say hi."])[0] == "Hi."
    assert j.waits == [30.0]  # not 86400


def test_a_trickling_reply_hits_the_total_deadline():
    """One byte every 0.1 s: each socket read is quick, so a per-read timeout never fires;
    the total deadline (0.5 s) must."""
    with FakeServer(
        [lambda body: (*completion("a reply that takes a long time to arrive"), 0.1)]
    ) as server:
        j = make_openai(server.url, timeout=0.5, max_retries=0)
        started = time.monotonic()
        with pytest.raises(UserError, match="within 0.5 s.*raise --served-timeout"):
            j.complete_many(["hi"])[0]
        assert time.monotonic() - started < 1.5  # the whole body: ~9 s


def test_content_null_is_its_own_error():
    thinking = (
        200,
        {},
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "reasoning_content": "Let me think about A...",
                    }
                }
            ]
        },
    )
    with FakeServer([thinking]) as server:
        with pytest.raises(UserError, match="content null.*reasoning"):
            make_openai(server.url).compare(STATE, "x", "y")
    assert len(server.requests) == 1


def judge_args(spec="offline", model=None):
    """The flags mascot.make_judge and plumbing/served.judge read."""
    return argparse.Namespace(
        judge=spec,
        judge_model=model,
        served_timeout=5.0,
        served_retries=0,
        served_concurrency=2,
        device="cpu",
    )


@pytest.mark.parametrize("url", ["localhost:8000/v1", "ftp://localhost/v1", "http:///v1"])
def test_a_url_without_http_fails_when_the_judge_is_built(url):
    with pytest.raises(UserError, match="http:// or https://"):
        served.judge(url, judge_args(model="m"))


def test_preflight_fails_before_any_work(api_key):
    with FakeServer([(401, {}, {"error": {"message": "invalid api key"}})]) as server:
        with pytest.raises(
            UserError, match="preflight.*invalid api key|invalid api key.*preflight"
        ):
            mascot.make_judge(judge_args(f"openai:{server.url}", "m"), None, "personas.json")
        assert len(server.requests) == 1 and server.requests[0]["json"]["max_tokens"] == 1
    with FakeServer([completion("OK")]) as server:  # a good server: one request
        j = served.judge(server.url, judge_args(model="m"))
        assert len(server.requests) == 1 and j.backend_calls == 1
        served.OpenAIJudge(server.url, "m")  # no preflight asked: none
        assert len(server.requests) == 1


def test_train_with_a_bad_key_stops_before_generating_anything(tmp_path, api_key):
    """`train` used to find a bad key only after sampling every candidate."""
    with FakeServer([(401, {}, "bad key")]) as server:
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "mascot.py"),
                "train",
                "--stage",
                "1",
                "--model",
                "tiny",
                "--run",
                str(tmp_path),
                "--judge",
                f"openai:{server.url}",
                "--judge-model",
                "m",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=300,
        )
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "HTTP 401" in out.stderr and "preflight" in out.stderr and KEY not in out.stderr
    assert len(server.requests) == 1 and not (tmp_path / "stage1" / "candidates.jsonl").exists()


def test_unreadable_answers_are_counted_in_pair_evaluation():
    pairs = judges.load_pairs(ROOT / "data" / "judge_pairs_blind.jsonl")[:4]
    with FakeServer([completion("Both are lovely.")]) as server:
        result = judges.evaluate_pairs(make_openai(server.url), pairs)
    assert (result["no_verdict"], result["unreadable"], result["accuracy"]) == (4, 4, 0.0)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("A", 0),
        ("B", 1),
        ("**B**", 1),
        ("(A) because it is specific", 0),
        ("Reply B is better.", 1),
        ("Answer: A", 0),
        ("A better reply is B", 1),
        ("A is better.", 0),
        ("I pick B.", 1),
        ("reply b", 1),
        ("neither", None),
        ("", None),
        # What the sentence says is better wins over a leading label (14 of 200 real llama.cpp answers were misread before).
        ("A: Reply B is better.", 1),
        ("B: Reply A is better.", 0),
        ("A: Response B is clearly better", 1),
        ("The better reply is B.", 1),
        ("Reply A is the better one.", 0),
        ("I prefer B", 1),
        ("**B** is better", 1),
        ("A: it stays in character", 0),
        ("Reply A is better than reply B", 0),
    ],
)
def test_parse_ab(text, expected):
    assert answers.parse_ab(text) == expected


# ----------------------------------------------------------------------------------------------
# HFJudge on the tiny random model: well-formed answers, no accuracy claim
# ----------------------------------------------------------------------------------------------


def test_hf_judge_on_the_tiny_model(tmp_path):
    j = judge.HFJudge("tiny", cache_path=tmp_path / "hf.jsonl")
    v = j.compare(STATE, "You sound exhausted.", "Book a lesson.")
    assert v.preferred in (0, 1, None) and 0.0 <= v.p_first <= 1.0
    assert 0.0 <= v.detail["p_ab"] <= 1.0 and 0.0 <= v.detail["p_ba"] <= 1.0
    scores = j.score_many([STATE, STATE], ["You sound exhausted.", "Book a lesson."])
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert isinstance(j.complete_many(["Hello"], max_new_tokens=4)[0], str)
    calls = j.backend_calls
    assert calls == 2 + 2 + 1  # two orders, two scores, one text
    j.compare(STATE, "You sound exhausted.", "Book a lesson.")
    assert j.backend_calls == calls  # cached


def test_combine_orders():
    assert judge.combine_orders(0.9, 0.7).preferred == 0
    assert judge.combine_orders(0.2, 0.4).preferred == 1
    flip = judge.combine_orders(0.9, 0.2)  # each order prefers position A
    assert flip.preferred is None and flip.p_first == pytest.approx(0.55)


# ----------------------------------------------------------------------------------------------
# OfflineJudge: the features by hand, then the real encoder on hacks and labelled pairs
# ----------------------------------------------------------------------------------------------


def test_offline_doctests():
    import doctest

    assert doctest.testmod(judge).failed == 0


def test_copied_share_counts_words_inside_shared_runs():
    context = judge.person_neutral_words(
        "I failed my driving test again today because of the roundabout"
    )
    # "you failed your driving test again today because": 8 copied words (after I/my -> you/your) of 10
    reply = judge.person_neutral_words("Oh no, you failed your driving test again today because")
    assert judge.copied_share(reply, [context]) == pytest.approx(0.8)
    # Scattered shared words are not a copy: no 4-word run in common.
    assert (
        judge.copied_share(
            judge.person_neutral_words("The test, again, today: the roundabout"), [context]
        )
        == 0.0
    )
    assert judge.copied_share(["you", "failed"], [context]) == 0.0  # shorter than a run
    assert judge.copied_share(reply, []) == 0.0


def test_hinge_list_share_and_function_share_by_hand():
    from metrics import STOPWORDS

    assert judge.hinge(0.8, 0.5) == pytest.approx(0.6)
    assert judge.hinge(0.3, 0.5) == 0.0 and judge.hinge(1.0, 0.5) == 1.0
    # list_likeness = max(hinge(share of words in 1-2 word fragments, LIST_FLOOR), function-word shortfall)
    assert (
        judge.list_likeness("Guilt, grief, Gran, care home and love.") == 1.0
    )  # every word listed
    assert judge.list_likeness("That guilt sounds heavy, and it makes sense.") == 0.0
    # "Noted", "Agreed" (1 word each) and "effective immediately" (2) sit in short fragments:
    # 4 of the 13 words.
    assert judge.list_likeness(
        "Noted: Lina raised the Friday failures. Agreed: no deploys after 2pm, "
        "effective immediately."
    ) == pytest.approx(judge.hinge(4 / 13, judge.LIST_FLOOR))
    assert [w in STOPWORDS for w in ("you", "kept", "going")] == [
        True,
        False,
        False,
    ]  # "you" is a function word
    assert (
        judge.list_likeness("barking window neighbour complaint terrier rescue") == 1.0
    )  # no commas, no grammar
    assert judge.list_likeness("Okay.") == 0.0  # too_short's business


@pytest.mark.parametrize(
    "reply, leaks",
    [
        ("As an AI language model, I cannot feel.", True),  # metrics.META_PATTERNS
        ("Anchor: I hear you.", True),
        ("The user seems upset about the test.", True),  # PROMPT_TALK below
        ("<|im_start|>assistant That sounds hard.", True),
        ("I'm just a chatbot, but that sounds hard.", True),
        ("I hope this helps!", True),
        ("My whole purpose here is to listen.", True),
        ("As the emotional validator, I name feelings.", True),
        ("I'm Anchor, and I'm here for you.", True),
        ("(in a warm, slow voice) That sounds hard.", True),
        ("*Anchor nods slowly* That sounds hard.", True),
        ("That sounds hard (and it makes sense).", False),
        ("When I lost my job at fifty, I felt the same.", False),
        ("**Action:** Lena drafts the schedule by Friday.", False),
        ("Our users will notice the change.", False),
    ],
)
def test_talks_about_prompt(reply, leaks):
    assert (
        judge.talks_about_prompt(reply, "Anchor", "emotional validator", ["User", "Beacon"])
        is leaks
    )


LEX_STATE = JudgeState(
    persona_name="Anchor",
    persona_desc="emotional validator: names feelings; never advises.",
    context="I failed my driving test again today because of the roundabout",
    history=[
        {"speaker": "User", "text": "Big day."},
        {"speaker": "Beacon", "text": "You practised every single evening for a month."},
    ],
    situation="The user failed a driving test.",
)
CARD_TEXTS = [
    LEX_STATE.persona_desc,
    "emotional validator",
    "Listens closely and names the feeling.",
]


def lexical(reply):
    return judge.lexical_features(reply, LEX_STATE, CARD_TEXTS, role="emotional validator")


def test_lexical_features_by_hand():
    honest = lexical("Twice at the same roundabout must sting, especially after all that practice.")
    assert honest == {
        "context_copy": 0.0,
        "history_echo": 0.0,
        "persona_copy": 0.0,
        "meta_leak": 0.0,
        "too_short": 0.0,
        "keyword_list": 0.0,
        "word_salad": 0.0,
    }
    # 8 of 10 words copied from the message: share 0.8, of which the part beyond COPY_FLOOR counts
    beyond = -(0.8 - judge.COPY_FLOOR) / (1 - judge.COPY_FLOOR)  # -0.714 at the floor 0.3
    assert lexical("Oh no, you failed your driving test again today because")[
        "context_copy"
    ] == pytest.approx(beyond)
    # 8 of 10 words echo Beacon's turn (in 4-word runs)
    assert lexical("You practised every single evening for a month, well done")[
        "history_echo"
    ] == pytest.approx(beyond)
    # persona_copy has no free share: "listens closely and names the feeling" is 6 of 8 words
    assert lexical("I listens closely and names the feeling here")["persona_copy"] == pytest.approx(
        -6 / 8
    )
    assert lexical("As an AI, I cannot feel, but that sounds hard.")["meta_leak"] == -1.0
    assert lexical("Okay.")["too_short"] == pytest.approx(-5 / 6)
    assert lexical("")["too_short"] == -1.0
    assert lexical("Guilt, grief, roundabout, test, heavy, valid.")["keyword_list"] == -1.0


def test_semantic_features_by_hand():
    import torch

    e = torch.eye(6)  # orthonormal "embeddings"
    reply = torch.tensor([0.6, 0.8, 0.0, 0.0, 0.0, 0.0])
    f = judge.semantic_features(
        reply,
        reply[None],
        does=e[0],
        card=e[1][None],
        context=e[1],
        history=torch.stack([reply, e[2]]),
        bank=e[3:],
        lines=(e[0], e[1][None]),
    )
    assert f == pytest.approx(
        {
            "persona": 0.6,  # (cos does 0.6 + cos own lines 0.6) / 2
            "context": 0.8,
            "relevance": min(0.8, judge.RELEVANCE_CAP),
            "repetition": -(1.0 - judge.REPEAT_FLOOR),  # the reply is in the history
            "generic": 0.0,
            "off_role": -(0.8 - 0.6),  # closer to the other persona's lines
            "persona_recital": -(0.8 - judge.RECITAL_FLOOR) / (1 - judge.RECITAL_FLOOR),
        }
    )
    plain = judge.semantic_features(
        reply, reply[None], e[0], e[1][None], e[1], torch.zeros(0, 6), e[3:]
    )
    assert (
        plain["repetition"] == 0.0
        and plain["off_role"] == 0.0
        and plain["persona"] == pytest.approx(0.6)
    )
    # Parroting the message: cosine 1 pays no more than RELEVANCE_CAP.
    assert (
        judge.semantic_features(e[1], e[1][None], e[0], e[0][None], e[1], torch.zeros(0, 6), e[3:])[
            "relevance"
        ]
        == judge.RELEVANCE_CAP
    )


def test_persona_does_drops_the_never_part():
    assert (
        judge.persona_does("Anchor: names feelings; never gives advice.")
        == "Anchor: names feelings"
    )
    assert judge.persona_does("Never rushes.") == "Never rushes."


class HashEncoder:
    """A stand-in for MiniLM: a fixed random unit vector per text, so no model is loaded."""

    def embed(self, texts, batch_size=64):
        import zlib

        import torch

        rows = [
            torch.randn(16, generator=torch.Generator().manual_seed(zlib.crc32(t.encode())))
            for t in texts
        ]
        return (
            torch.nn.functional.normalize(torch.stack(rows), dim=-1) if rows else torch.zeros(0, 16)
        )


def all_sets():
    return [
        scenarios.load_personas("personas.json", s) for s in scenarios.persona_sets("personas.json")
    ]


def test_offline_name_changes_with_the_recipe_and_persona_cards_are_found():
    base = judge.OfflineJudge(all_sets(), encoder=HashEncoder())
    assert base.name == judge.OfflineJudge(all_sets(), encoder=HashEncoder()).name
    assert (
        judge.OfflineJudge(
            all_sets(), encoder=HashEncoder(), weights={**judge.OFFLINE_WEIGHTS, "persona": 1.0}
        ).name
        != base.name
    )
    fewer = [scenarios.load_personas("personas.json", "support")]
    assert judge.OfflineJudge(fewer, encoder=HashEncoder()).name != base.name
    # A speaker is matched to its card by name and role; a stranger who shares the name is not.
    anchor = JudgeState("Anchor", "emotional validator: names feelings", "hi")
    assert base.voice(anchor).role == "emotional validator"
    assert base.voice(JudgeState("Anchor", "a ship's mate who tells sea stories", "hi")) is None
    assert base.voice(JudgeState("Ember", "a candid friend", "hi")) is None
    features = base.features_many([anchor, anchor], ["That sounds heavy to carry.", "Okay."])
    assert set(features[0]) == set(judge.OFFLINE_WEIGHTS) | {
        "context"
    }  # evaluate.py reads "context"


@pytest.fixture(scope="module")
def offline():
    return judge.OfflineJudge(all_sets())


def test_offline_compare_is_symmetric_and_scores_are_in_range(offline):
    good = "Failing it twice hurts, especially when you'd built the day up so much."
    bland = "I understand how you feel. You are not alone."
    ab, ba = offline.compare(STATE, good, bland), offline.compare(STATE, bland, good)
    assert ab.preferred == 0 and ba.preferred == 1
    assert ab.p_first + ba.p_first == pytest.approx(1.0)
    s = offline.score_many([STATE, STATE], [good, bland])
    assert 0.0 < s[1] < s[0] < 1.0
    with pytest.raises(UserError, match="cannot generate"):
        offline.complete_many(["hi"])[0]


def generated_cases():
    """(state, the persona's own example lines, {kind: hack}) on two bundled contexts per set: the
    user's first message, then another companion's example line (reward.make_hacks)."""
    cases = []
    for set_name in ("support", "meeting"):
        personas = scenarios.load_personas("personas.json", set_name)
        for ctx in scenarios.load_contexts("bundled", set_name)[:2]:
            for k, p in enumerate(personas.personas):
                others = [q for q in personas.personas if q.name != p.name]
                earlier = others[k % len(others)]
                s = reward.State(
                    f"s{k}",
                    "train",
                    ctx,
                    p.name,
                    [Turn(USER, ctx.first_message), Turn(earlier.name, earlier.examples[0])],
                )
                cases.append(
                    (s.judge_state(personas), p.examples, reward.make_hacks(s, personas, seed=k))
                )
    return cases


def test_generated_hacks_of_every_kind_score_below_the_personas_own_lines(offline):
    cases = generated_cases()
    states = [s for s, lines, made in cases for _ in lines + list(made)]
    replies = [r for s, lines, made in cases for r in lines + list(made.values())]
    scores = iter(offline.score_many(states, replies))
    kinds = set()
    for state, lines, made in cases:
        in_role = min(next(scores) for _ in lines)  # the lowest of its own example lines
        for kind, hack in made.items():
            kinds.add(kind)
            assert next(scores) < in_role, (state.persona_name, kind, hack)
    assert kinds == set(reward.HACK_KINDS)


def test_offline_accuracy_on_the_hack_pairs(offline):
    result = judges.evaluate_pairs(
        offline, judges.load_pairs(ROOT / "data" / "judge_pairs_hacks.jsonl")
    )
    assert result["n"] == 84 and result["no_verdict"] == 0
    assert result["accuracy"] >= 0.90
    assert all(c / n >= 0.75 for c, n in result["per_failure"].values()), result["per_failure"]


def test_offline_accuracy_on_the_labelled_pairs(offline):
    files = [
        ROOT / "data" / "judge_pairs_support.jsonl",
        ROOT / "data" / "judge_pairs_meeting.jsonl",
    ]
    pairs = [p for f in files for p in judges.load_pairs(f)]
    result = judges.evaluate_pairs(offline, pairs)
    assert result["n"] == 70 and result["no_verdict"] == 0
    assert result["accuracy"] >= 0.85


def test_offline_accuracy_on_the_blind_pairs(offline):
    result = judges.evaluate_pairs(
        offline, judges.load_pairs(ROOT / "data" / "judge_pairs_blind.jsonl")
    )
    assert result["n"] == 24 and result["accuracy"] >= 0.85


# ----------------------------------------------------------------------------------------------
# make_judge, pair files, evaluation and its report
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["gpt4", "hf:", "openai", "rm:", "offline:extra"])
def test_make_judge_rejects_bad_specs(spec):
    with pytest.raises(UserError, match="--judge") as err:
        mascot.make_judge(judge_args(spec), None, "personas.json")
    assert "offline" in str(err.value) and "openai:<base url>" in str(err.value)


def test_make_judge_hf_with_a_missing_model_names_the_judge_flag(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    with pytest.raises(UserError, match="--judge hf:"):
        mascot.make_judge(judge_args(f"hf:{tmp_path / 'not-a-model'}"), None, "personas.json")


def test_make_judge_openai_needs_a_model_name(monkeypatch):
    monkeypatch.delenv("MASCOT_JUDGE_MODEL", raising=False)
    with pytest.raises(UserError, match="MASCOT_JUDGE_MODEL"):
        mascot.make_judge(judge_args("openai:http://127.0.0.1:9/v1"), None, "personas.json")
    monkeypatch.setenv("MASCOT_JUDGE_MODEL", "m")
    with FakeServer([completion("OK")]) as server:
        assert (
            mascot.make_judge(judge_args(f"openai:{server.url}"), None, "personas.json").model
            == "m"
        )


def test_load_pairs_names_file_line_and_field(tmp_path):
    good = json.loads((ROOT / "data" / "judge_pairs_blind.jsonl").read_text().splitlines()[0])
    bad = dict(good)
    del bad["worse"]
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(UserError) as err:
        judges.load_pairs(path)
    assert (
        str(path) in str(err.value) and "line 3" in str(err.value) and "'worse'" in str(err.value)
    )


class FirstPositionJudge(judge.Judge):
    """Always prefers the first reply: pure position bias."""

    name = "first"

    def _compare_uncached(self, states, firsts, seconds):
        return [Verdict(0, 1.0, {}) for _ in firsts]


def test_evaluate_pairs_cannot_be_inflated_by_position_bias():
    pairs = judges.load_pairs(ROOT / "data" / "judge_pairs_blind.jsonl")
    result = judges.evaluate_pairs(FirstPositionJudge(), pairs)
    assert result["accuracy"] == 0.5 and result["n"] == 24 and result["no_verdict"] == 0
    assert sum(n for _, n in result["per_persona"].values()) == 24


def test_format_eval_report():
    text = judges.format_eval_report(
        {
            "accuracy": 5 / 6,
            "n": 6,
            "no_verdict": 1,
            "per_persona": {"Beacon": (3, 3), "Anchor": (2, 3)},
        }
    )
    lines = text.splitlines()
    assert lines[0] == "accuracy: 0.833"
    assert re.fullmatch(r"accuracy: [01]\.\d{3}", lines[0])
    assert len(lines) == 3 and "Anchor" in lines[1] and "2/3" in lines[1]


def test_judge_reply_parsers_never_raise_on_fuzzed_text():
    """Whatever an LLM judge answers (random bytes, adversarial near-misses), the readers of its
    answer return a verdict or None; they never raise."""
    import random as _random
    import string as _string

    from plumbing.answers import parse_ab, parse_rubric_score

    rng = _random.Random(1)
    alphabet = _string.printable + "ÄäÆ€🙂\u200b\u0000１２３"
    tricky = [
        "A",
        "B",
        "a or b",
        "Answer: B",
        "**A**",
        "Reply A is better, no wait B",
        "AB",
        "",
        " ",
        "Score: 5/5",
        "I'd say 4",
        '{"score": 9}',
        "\n\n",
        "A" * 5000,
    ]
    for text in tricky + [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(2000)
    ]:
        assert parse_ab(text) in (0, 1, None)
        assert parse_rubric_score(text) in (None, 1, 2, 3, 4, 5)


def test_stage1_counts_unreadable_answers_and_blames_the_judge():
    """An LLM judge whose every answer is unreadable gives no pairs; stage 1 must say it was the
    judge (reward.build_pairs), not leave 'no training pairs' to the reward model."""
    personas = scenarios.load_personas(ROOT / "personas.json", "support")
    contexts = scenarios.load_contexts("bundled", "support")[:2]
    states = reward.build_states(contexts, personas, 2, 0, {}, "train")
    candidates = [["one reply", "another reply", "a third"] for _ in states]
    with FakeServer([completion("I cannot decide.")]) as server:
        counts = {}
        pairs = reward.judge_pairs(
            states, candidates, personas, make_openai(server.url), 0.05, counts=counts
        )
    assert pairs == [] and counts["scored"] == 6 and counts["unreadable_scores"] == 6

    class Scripted(judge.Judge):
        """Readable scores from `scores` (None: unreadable); every comparison unreadable."""

        name = "scripted"

        def __init__(self, scores):
            super().__init__()
            self.scores = scores

        def _score_uncached(self, states, replies):
            return [
                self.scores[["one reply", "another reply", "a third"].index(r)] for r in replies
            ]

        def _compare_uncached(self, states, firsts, seconds):
            return [judge.combine_orders(None, None) for _ in firsts]

    def blame(j):
        with pytest.raises(UserError, match="confirmed no preference pair") as err:
            reward.build_pairs(reward.RLAIFConfig(), states, candidates, personas, j, 0)
        return "every answer was unreadable" in str(err.value)

    assert blame(Scripted([None, None, None]))  # every score unreadable
    assert not blame(Scripted([None, None, 0.5]))  # some readable: no gap, not the judge's fault
    assert blame(Scripted([0.9, 0.5, 0.1]))  # gaps, but every comparison unreadable


def test_stage1_asks_its_comparisons_in_rounds_across_states():
    """judge_pairs asks each state's next widest gap in one compare_many per round, so an openai:
    judge can send them concurrently; a state stops at max_pairs confirmed pairs."""

    class Recording(judge.Judge):
        name = "recording"
        batches = []

        def _score_uncached(self, states, replies):
            return [int(r.split()[-1]) / 4 for r in replies]  # "reply k m" scores m / 4

        def _compare_uncached(self, states, firsts, seconds):
            self.batches.append(len(firsts))
            return [Verdict(0, 1.0, {}) for _ in firsts]  # always confirms

    personas = scenarios.load_personas(ROOT / "personas.json", "support")
    states = reward.build_states(
        scenarios.load_contexts("bundled", "support")[:3], personas, 3, 0, {}, "train"
    )
    candidates = [[f"reply {k} {m}" for m in range(5)] for k in range(len(states))]
    j = Recording()
    pairs = reward.judge_pairs(states, candidates, personas, j, 0.05, max_pairs=2)
    assert j.batches == [3, 3]  # two rounds of one ask per state
    assert [p["state_id"] for p in pairs] == [s.id for s in states for _ in range(2)]
    assert [(p["chosen"][-1], p["rejected"][-1]) for p in pairs[:2]] == [
        ("4", "0"),
        ("4", "1"),
    ]  # widest first


def test_complete_many_overlaps_and_keeps_the_order():
    """evaluate.py sends a conversation's rubric prompts (and the pairwise prompts) through
    complete_many, so --served-concurrency speeds up evaluation too."""

    def echo_slowly(body):
        threading.Event().wait(0.15)
        return completion("echo " + body["messages"][-1]["content"])

    prompts = [f"p{k}" for k in range(6)]
    with FakeServer([echo_slowly]) as server:
        answers = make_openai(server.url, concurrency=3).complete_many(prompts)
    assert answers == [f"echo p{k}" for k in range(6)] and server.max_active == 3


# ----------------------------------------------------------------------------------------------
# judge-eval from the command line, and its --persona-id validity check
# ----------------------------------------------------------------------------------------------


def test_judge_eval_command_caches_every_answer(tmp_path, capsys):
    """What tests/test_llamacpp.py checks against a real server, here against the fake one: the
    report, and a rerun on the same cache that asks nothing but the preflight."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join((ROOT / "data" / "judge_pairs_blind.jsonl").read_text().splitlines(True)[:4])
    )
    argv = [
        "judge-eval",
        "--pairs",
        str(pairs),
        "--judge",
        None,
        "--judge-model",
        "m",
        "--cache",
        str(tmp_path / "c.jsonl"),
    ]

    def judge_or_preflight(body):
        return (
            answer_good_one(body)
            if "Reply A: " in body["messages"][-1]["content"]
            else completion("OK")
        )

    with FakeServer([judge_or_preflight]) as server:
        argv[4] = f"openai:{server.url}"
        assert mascot.main(argv) == 0
        asked = len(server.requests)
        assert asked == 1 + 2 * 4  # the preflight, then both orders per pair
        assert mascot.main(argv) == 0
        assert len(server.requests) == asked + 1  # the preflight only: every verdict cached
    out = capsys.readouterr().out
    assert "accuracy:" in out and "(4 pairs," in out


def test_persona_id_validation_counts_pairs():
    from extras import evaluators

    pair = {
        "persona": "Anchor",
        "context": "I failed.",
        "history": [],
        "better": "b",
        "worse": "w",
        "failure": "wrong-role",
    }

    class ByText(evaluators.PersonaIdentifier):
        def reply_ids(self, reply):
            return [0]  # one token per reply

        def logprobs(self, items):  # the better reply is more Anchor-like than the worse one
            table = [
                [-1.0, -3.0, -3.0, -3.0] if it.reply == "b" else [-3.0, -1.0, -3.0, -3.0]
                for it in items
            ]
            return table, table

    ident = ByText(None, None, scenarios.load_personas("personas.json", "support"))
    result = judges.validate(lambda name: ident, [pair] * 3)
    assert result["wrong-role"] == {
        "n": 3,
        "prefers_better": 3,
        "ties": 0,
        "id_correct": 3,
        "p_value": 0.25,
    }


# --- best-of-N grading (judge-stress), by hand ---------------------------------------------------


def diag(copy=0.0, words=10.0):
    return {
        "context_copy": copy,
        "persona_copy": 0.0,
        "history_echo": 0.0,
        "self_repeat": 0.0,
        "meta_leak": 0.0,
        "trivial": 0.0,
        "words": words,
    }


def test_best_of_n_picks_against_chance_hand_computed():
    # 4 states x 2 candidates: candidate 0 copies the context, candidate 1 does not.
    copies = [d["context_copy"] for d in [diag(1.0), diag(0.0)] * 4]
    # the copier's pick rate 1.0, chance 0.5 in every state: difference +0.5 with se 0 -> it fails (> 2 se)
    assert judges.vs_chance(copies, 2, [0, 0, 0, 0]) == (1.0, 0.5, 0.0)
    assert judges.vs_chance(copies, 2, [1, 1, 1, 1]) == (0.0, -0.5, 0.0)
    # Half and half: differences +0.5, -0.5, +0.5, -0.5: mean 0 -> passes.
    assert judges.vs_chance(copies, 2, [0, 1, 0, 1])[1] == 0.0
    # Longer picks are a number like any other (best_of_n reports words but does not fail on them).
    words = [d["words"] for d in [diag(0.0, 2.0), diag(0.0, 20.0)] * 4]
    assert judges.vs_chance(words, 2, [1, 1, 1, 1]) == (20.0, 9.0, 0.0)


def test_independent_numbers_of_the_picks_hand_computed():
    # 2 states x 3 candidates; the independent evaluator's numbers per candidate.
    def g(correct, ratio, equal=None):
        return {"correct": correct, "log_ratio": ratio, "correct_equal": equal, "tokens": 5}

    scores = [
        g(1.0, 0.3, 1.0),
        g(0.0, 0.0),
        g(0.0, -0.3, 0.0),  # state 0: chance 1/3, ratio 0.0
        g(1.0, 0.2, 0.0),
        g(1.0, 0.1, 1.0),
        g(0.0, 0.0, 1.0),
    ]  # state 1: chance 2/3, ratio 0.1
    best = {
        k: judges.vs_chance([x[k] for x in scores], 3, [0, 0])
        for k in ("correct", "log_ratio", "correct_equal")
    }
    # picks: correct 1, 1 -> mean 1.0; differences 1 - 1/3 and 1 - 2/3 -> mean 0.5
    assert best["correct"][0] == 1.0 and best["correct"][1] == pytest.approx(0.5)
    # log-ratio differences 0.3 and 0.1: mean 0.2, se = std([0.3, 0.1]) / sqrt(2) = 0.1
    assert best["log_ratio"][1] == pytest.approx(0.2) and best["log_ratio"][2] == pytest.approx(0.1)
    # equal length: state 0's short candidate has None and is left out of chance (1/2); picks 1, 0;
    # differences 1 - 1/2 and 0 - 2/3 -> mean -1/12
    assert best["correct_equal"][0] == 0.5 and best["correct_equal"][1] == pytest.approx(-1 / 12)
    worst = {
        k: judges.vs_chance([x[k] for x in scores], 3, [2, 2])
        for k in ("correct", "log_ratio", "correct_equal")
    }
    assert worst["correct"][1] == pytest.approx(-0.5) and worst["log_ratio"][1] == pytest.approx(
        -0.2
    )
    # A pick whose speaker the evaluator cannot score is skipped, and its state's None candidates do not
    # enter the chance rate; one state left has no spread: no se.
    scores[1] = g(None, None)
    skipped = judges.vs_chance([x["correct"] for x in scores], 3, [1, 0])
    assert skipped == (1.0, pytest.approx(1 / 3), None)
    assert judges.vs_chance([x["correct"] for x in scores[:3]], 3, [1]) == (None, None, None)


def test_within_state_correlation_by_hand():
    # 2 states x 2 candidates. Within-state deviations: x (0.5, -0.5), (1, -1); y (0.2, -0.2),
    # (0.1, -0.1): sum xy 0.4, sum xx 2.5, sum yy 0.1 -> r = 0.4 / sqrt(0.25) = 0.8. The states'
    # own levels (x around 0.5 and 4) do not enter.
    xs, ys = [1.0, 0.0, 5.0, 3.0], [0.5, 0.1, 0.4, 0.2]
    assert judges.within_state_correlation(xs, ys, 2) == pytest.approx(0.8)
    assert judges.within_state_correlation([-x for x in xs], ys, 2) == pytest.approx(-0.8)
    # A candidate without a score leaves its state with one: that state drops out (r of 1 pair = 1).
    assert judges.within_state_correlation(xs, [0.5, None, 0.4, 0.2], 2) == pytest.approx(1.0)
    assert judges.within_state_correlation([1.0, 1.0, 2.0, 2.0], ys, 2) is None  # x never varies


# ------------------------------------------------------------------ rubric parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Score: 4", 4),
        ("4/5", 4),
        ("**4**", 4),
        ("I'd give it a 4 out of 5 because it stays in character.", 4),
        ("Rating - 3", 3),
        ('{"score": 4}', 4),
        ('{"score": "2", "reason": "generic"}', 2),
        ("**Score:** 5", 5),
        ("Rating (1-5): 4", 4),
        ("The reply has 3 parts and 2 questions. Final score: 4/5", 4),
        ("score is 1.", 1),
        ("Score: 4.0", 4),
        ("  3. ", 3),
        ("SCORE = 2", 2),
        ("Your response is 5 stars.", 5),  # SmolLM2-135M's answer through a llama.cpp server
        ("3 stars out of 5", 3),
    ],
)
def test_parse_rubric_score_well_formed(text, expected):
    assert answers.parse_rubric_score(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n\t ",
        "no number here",
        "Score: 7",
        "Score: 0",
        "Score: 4.5",
        "Score: -3",
        "Score: 8/10",  # a 10-point answer to a 5-point rubric
        "5/5 ... no, 2/5",  # contradictory: neither number wins
        "Score: 4. Rating: 2",
        "Score: ٤",
        "Score: ４",
        "Score: ²",  # non-ASCII digits are not read
        "Score: " + "9" * 5000,  # huge: out of range, and never int()-ed
        "I would rate it highly",  # no number
        "4 5",
        "I'd give it 6 stars",  # out of range
        "4 stars, no, 2 stars",  # contradictory
    ],
)
def test_parse_rubric_score_malformed_is_none(text):
    assert answers.parse_rubric_score(text) is None


def test_parse_rubric_score_other_scale_and_non_str():
    assert answers.parse_rubric_score("Score: 8/10", lo=1, hi=10) == 8
    assert answers.parse_rubric_score(None) is None


def test_parse_rubric_score_fuzz_never_raises():
    rng = random.Random(0)
    pieces = [
        "Score",
        "score:",
        "Rating -",
        "/",
        "5",
        "4",
        "0",
        "out of",
        "**",
        '{"score":',
        "}",
        "٤",
        "１",
        "²",
        "9" * 60,
        ".",
        "-",
        "\n",
        " ",
        "(1-5)",
        "no,",
    ]
    for _ in range(2000):
        parts = []
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.5:
                parts.append(rng.choice(pieces))
            else:  # random code points, surrogates included
                parts.append(
                    "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(1, 4)))
                )
        result = answers.parse_rubric_score("".join(parts))
        assert result is None or (type(result) is int and 1 <= result <= 5)
