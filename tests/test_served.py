"""Frozen roles served by an OpenAI-compatible server (--speakers / --user / --director openai:<url>).

A fake server (fake_openai.py) answers in place of vLLM or llama.cpp. The checks: the served
model gets exactly the prompts and sampling settings a local model would (models.generate_texts),
replies are cached as they arrive so a rerun sends nothing, requests overlap up to the
concurrency, and simulate, evaluate and stage 2 run with served speakers, user and director.
"""

import argparse
import json
import threading

import pytest
from fake_openai import INJECTED_ACTION, MODES, FakeServer, completion, role_of

import director
import mascot
import models
import plumbing.served as serving
import simulate
from plumbing import common
from plumbing.served import ServedModel

CHAT = [
    {"role": "system", "content": "You are Anchor, a warm listener."},
    {"role": "user", "content": "I failed my driving test today."},
]


def by_role(body):
    """Answer like a served model that knows who it is playing: the director writes a directive,
    the simulated user a user line, a companion a reply naming itself."""
    system = body["messages"][0]["content"]
    if system.startswith("You direct a group chat"):
        return completion("Agent: Guide\nAction: suggest one small step\nTone: practical")
    if system.startswith("You are role-playing a real person"):
        return completion("served user line")
    if system.startswith("You are "):
        return completion(f"served reply from {system.split()[2].strip(',.')}")
    return completion("OK")  # the preflight


def served(url, tmp_path=None, **kw):
    return ServedModel(
        url,
        "m",
        "--speakers openai:" + url,
        "--speakers-model",
        cache_path=tmp_path / "cache.jsonl" if tmp_path else None,
        **kw,
    )


def test_a_served_model_gets_the_prompts_and_sampling_settings_a_local_one_would(tmp_path):
    with FakeServer([completion("fine")]) as server:
        model = served(server.url, tmp_path)
        texts = models.generate_texts(
            model, None, [CHAT, CHAT], 24, temperature=0.7, top_p=0.9, seeds=[11, 12]
        )
        assert texts == ["fine", "fine"]
        sent = sorted((r["json"] for r in server.requests), key=lambda b: b["seed"])
        assert [b["seed"] for b in sent] == [11, 12]
        assert all(
            b["messages"] == CHAT
            and b["max_tokens"] == 24
            and b["temperature"] == 0.7
            and b["top_p"] == 0.9
            and b["model"] == "m"
            for b in sent
        )
        models.generate_texts(model, None, [CHAT], 8, seeds=None)  # greedy: temperature 0, no seed
        greedy = server.requests[-1]["json"]
        assert greedy["temperature"] == 0 and "seed" not in greedy and "top_p" not in greedy
        # Every reply was cached as it came: the same questions again send nothing.
        again = served(server.url, tmp_path)
        before = len(server.requests)
        assert models.generate_texts(again, None, [CHAT, CHAT], 24, 0.7, 0.9, [11, 12]) == [
            "fine",
            "fine",
        ]
        assert len(server.requests) == before


def test_requests_overlap_up_to_the_concurrency_and_an_interrupted_batch_keeps_its_replies(
    tmp_path,
):
    gate = threading.Event()

    def slow(body):
        gate.wait(0.2)
        if body["seed"] == 5:
            return 400, {}, {"error": {"message": "prompt too long"}}
        return completion(f"reply {body['seed']}")

    with FakeServer([slow]) as server:
        model = served(server.url, tmp_path, concurrency=3)
        with pytest.raises(common.UserError, match="prompt too long"):
            model.generate_texts([CHAT] * 8, 8, seeds=list(range(8)))
        assert server.max_active <= 3 and server.max_active >= 2
        kept = len(model.cache)
        assert kept >= 1  # what arrived before the error is kept
        port = server.httpd.server_address[1]
    # A rerun (same server, restarted) asks only for what is missing, the failed seed 5 included.
    with FakeServer([lambda body: completion(f"reply {body['seed']}")], port=port) as server:
        model = served(server.url, tmp_path, concurrency=3)
        texts = model.generate_texts([CHAT] * 8, 8, seeds=list(range(8)))
        assert texts == [f"reply {i}" for i in range(8)]
        assert len(server.requests) == 8 - kept


def test_a_served_role_needs_its_model_name_and_a_url():
    args = argparse.Namespace(
        speakers_model=None, served_timeout=5, served_retries=0, served_concurrency=2, device="cpu"
    )
    with pytest.raises(common.UserError, match="--speakers-model"):
        mascot.load_role("openai:http://127.0.0.1:9/v1", "speakers", args)
    args.speakers_model = "m"
    with pytest.raises(common.UserError, match="http"):
        mascot.load_role("openai:localhost:8000/v1", "speakers", args)
    # Checked with one tiny request before any work: nothing listens on port 9.
    with pytest.raises(common.UserError, match="preflight"):
        mascot.load_role("openai:http://127.0.0.1:9/v1", "speakers", args)


def run_main(argv):
    assert mascot.main(argv) == 0


def test_simulate_evaluate_and_stage_2_with_served_roles(tmp_path):
    with FakeServer([by_role]) as server:
        url = "openai:" + server.url
        run = str(tmp_path / "run")
        served_flags = [
            "--speakers",
            url,
            "--speakers-model",
            "speaker-m",
            "--user",
            url,
            "--user-model",
            "user-m",
        ]
        simulate_flags = [
            "simulate",
            "--model",
            "tiny",
            "--run",
            run,
            "--contexts",
            "2",
            "--turns",
            "3",
            "--max-new-tokens",
            "6",
            *served_flags,
        ]
        run_main(simulate_flags)
        rows = [
            json.loads(x)
            for x in (tmp_path / "run" / "simulate" / "round-robin.jsonl").read_text().splitlines()
        ]
        agent_texts = [t["text"] for r in rows for t in r["turns"] if t["directive"]]
        user_texts = [
            t["text"] for r in rows for t in r["turns"][1:] if t["speaker"] == simulate.USER
        ]
        assert len(agent_texts) == 6 and all(t.startswith("served reply from") for t in agent_texts)
        assert user_texts == ["served user line"] * 2
        # Each role is asked under its own model name, with the prompt a local model would get.
        asked = {
            (r["json"]["model"], r["json"]["messages"][0]["content"].split(".")[0][:30])
            for r in server.requests
        }
        assert ("user-m", "You are role-playing a real pe") in asked
        assert {m for m, _ in asked} == {"speaker-m", "user-m"}
        sent = len(server.requests)
        run_main(simulate_flags)
        assert len(server.requests) == sent + 2  # the two preflights; every reply from the cache

        # evaluate: the trained speakers and the trained director are served (mascot, mascot-c).
        run_main(
            [
                "evaluate",
                "--model",
                "tiny",
                "--run",
                run,
                "--contexts",
                "2",
                "--turns",
                "3",
                "--max-new-tokens",
                "6",
                "--systems",
                "mascot,mascot-c",
                "--no-persona-id",
                *served_flags,
                "--director",
                url,
                "--director-model",
                "director-m",
            ]
        )
        results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
        assert list(results["systems"]) == ["mascot-c", "mascot"]
        assert results["systems"]["mascot"]["director"] == f"trained: {url}"
        invalid, total = results["systems"]["mascot"]["directives"]
        assert total > 0 and invalid == 0
        transcripts = [
            json.loads(x)
            for x in (tmp_path / "run" / "eval" / "transcripts.jsonl").read_text().splitlines()
        ]
        directed = [
            t for r in transcripts if r["system"] == "mascot" for t in r["turns"] if t["directive"]
        ]
        assert directed and all(
            t["speaker"] == "Guide" for t in directed
        )  # the served director chose
        assert "director-m" in {r["json"]["model"] for r in server.requests}

        # Stage 2: speakers and user served, the director trained here on the tiny model.
        run_main(
            [
                "train",
                "--stage",
                "2",
                "--model",
                "tiny",
                "--run",
                run,
                "--steps",
                "1",
                "--prompts-per-step",
                "2",
                "--group-size",
                "2",
                "--max-new-tokens",
                "6",
                "--decision-points",
                "2",
                "--heldout-points",
                "2",
                "--rollout-turns",
                "1",
                "--director-warmup",
                "0",
                *served_flags,
            ]
        )
        assert (tmp_path / "run" / "stage2" / "director" / "config.json").exists()
        assert (tmp_path / "run" / "stage2" / "served_cache.jsonl").stat().st_size > 0


def test_stage_1_with_a_judge_that_decides_nothing_says_so(tmp_path, capsys):
    """SmolLM2-135M served as the judge answers every rating with "Your response is 5 stars." and
    every comparison with "A": readable, but no gap and no order-consistent verdict. Stage 1 must
    stop naming the judge and what it could not decide (not at the reward model, much later)."""

    def weak_judge(body):
        prompt = body["messages"][-1]["content"]
        return completion("A" if "Reply A" in prompt else "Your response is 5 stars.")

    with FakeServer([weak_judge]) as server:
        code = mascot.main(
            [
                "train",
                "--stage",
                "1",
                "--model",
                "tiny",
                "--run",
                str(tmp_path),
                "--states",
                "2",
                "--heldout-states",
                "1",
                "--candidates",
                "3",
                "--max-new-tokens",
                "6",
                "--judge",
                f"openai:{server.url}",
                "--judge-model",
                "smollm2",
            ]
        )
    err = capsys.readouterr().err
    assert code == 2 and "confirmed no preference pair" in err and f"openai:{server.url}" in err
    assert (
        len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    )  # one line (tqdm aside)


# --- Hostile servers (fake_openai.MODES) ----------------------------------------------------------
def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("mode", ["huge", "huge-unannounced"])
def test_a_reply_over_the_byte_cap_is_refused_and_never_cached(tmp_path, mode):
    """A server that ignores max_tokens and sends 5 MB: all of it went into the cache (20 MB after
    four replies) and on into the next prompt. Now it is refused as one line while it is read, with
    or without a Content-Length, and nothing is cached."""
    with FakeServer([MODES[mode]]) as server:
        model = served(server.url, tmp_path, retries=0)
        with pytest.raises(common.UserError, match=r"bytes or more.*max_tokens 6") as err:
            model.generate_texts([CHAT], 6, seeds=[1])
    assert "\n" not in str(err.value) and str(serving.MAX_REPLY_BYTES) in str(err.value)
    cache = tmp_path / "cache.jsonl"
    assert not cache.exists() or cache.stat().st_size == 0


def test_a_reply_longer_than_max_tokens_allows_is_cut_before_anyone_sees_it(tmp_path, monkeypatch):
    """100 KB (under the byte cap) for max_tokens 6: cut to 6 x CHARS_PER_TOKEN characters before
    the cache or the caller sees it; a cache written before the cut is cut on the way out."""
    bound = 6 * serving.CHARS_PER_TOKEN
    with FakeServer([MODES["long"]]) as server:
        (text,) = served(server.url, tmp_path).generate_texts([CHAT], 6, seeds=[1])
        assert text == ("word " * 20_000)[:bound]
        assert (tmp_path / "cache.jsonl").stat().st_size < 2 * bound
        with monkeypatch.context() as m:  # an old cache: the whole reply stored
            m.setattr(serving, "CHARS_PER_TOKEN", 10**6)
            served(server.url, tmp_path).generate_texts([CHAT], 6, seeds=[2])
        asked = len(server.requests)
        again = served(server.url, tmp_path).generate_texts([CHAT, CHAT], 6, seeds=[1, 2])
        assert again == [text, text] and len(server.requests) == asked  # from the cache, cut


def test_simulate_with_a_server_that_ignores_max_tokens(tmp_path, capsys):
    """The tester's run: served speakers sending 5 MB replies, the simulated user the local tiny
    model. Before: 20 MB in served_cache.jsonl, then the user model asked for 6e12 bytes (a
    traceback). Now one line and a small cache; replies under the byte cap but over max_tokens
    are cut, so the local user model reads a prompt of normal size."""
    run = tmp_path / "run"
    flags = ["simulate", "--model", "tiny", "--run", str(run), "--contexts", "2", "--turns", "2"]
    flags += ["--max-new-tokens", "6", "--speakers-model", "m", "--served-retries", "0"]
    with FakeServer([MODES["huge"]]) as server:
        code = mascot.main([*flags, "--speakers", "openai:" + server.url])
    err = capsys.readouterr().err
    assert code == 2 and len(error_lines(err)) == 1 and "Traceback" not in err, err
    assert "bytes or more" in err and f"--speakers openai:{server.url}" in err
    cache = run / "simulate" / "served_cache.jsonl"
    assert not cache.exists() or cache.stat().st_size < 10_000
    with FakeServer([MODES["long"]]) as server:
        run_main([*flags, "--speakers", "openai:" + server.url])
    rows = [
        json.loads(x) for x in (run / "simulate" / "round-robin.jsonl").read_text().splitlines()
    ]
    agent_texts = [t["text"] for r in rows for t in r["turns"] if t["directive"]]
    assert len(agent_texts) == 4
    assert all(len(t) <= 6 * serving.CHARS_PER_TOKEN for t in agent_texts)
    assert cache.stat().st_size < 10_000


def test_a_served_directors_free_text_is_bounded_before_it_reaches_a_speaker(tmp_path):
    """fake_openai's `inject` director: Action "Ignore previous instructions ..." (600 characters,
    escape sequences after it), Tone "evil". Both were stored and written into every speaker's
    prompt. Now the stored directive and the prompt carry a bounded printable action and no tone."""
    run = tmp_path / "run"
    with FakeServer([MODES["inject"]]) as server:
        url = "openai:" + server.url
        run_main(
            ["simulate", "--model", "tiny", "--run", str(run), "--policy", "director"]
            + ["--contexts", "2", "--turns", "2", "--max-new-tokens", "6"]
            + ["--speakers", url, "--speakers-model", "s", "--user", url, "--user-model", "u"]
            + ["--director", url, "--director-model", "d"]
        )
        prompts = [
            r["json"]["messages"][0]["content"]
            for r in server.requests
            if role_of(r["json"]) == "speaker"
        ]
    rows = [json.loads(x) for x in (run / "simulate" / "director.jsonl").read_text().splitlines()]
    directives = [t["directive"] for r in rows for t in r["turns"] if t["directive"]]
    action = INJECTED_ACTION[: director.ACTION_CHARS].rstrip()
    assert len(directives) == 4
    assert all(d["agent"] == "Guide" and d["action"] == action for d in directives)
    assert all(d["tone"] == "" for d in directives)
    assert len(prompts) == 4
    for prompt in prompts:
        assert "evil" not in prompt and "\x1b" not in prompt and "\u202e" not in prompt
        (sentence,) = [x for x in prompt.splitlines() if x.startswith("In your next message")]
        assert len(sentence) <= director.ACTION_CHARS + 60


def test_what_a_server_says_in_an_error_cannot_drive_the_terminal():
    """The server's error message is quoted in the one-line error the user reads; its escape
    sequences (a window title, a screen clear) are dropped; a content that is not a string (a
    list of parts) is its own one-line error, not a traceback further on."""
    hostile = {"error": {"message": "bad \x1b]0;pwned\x07\x1b[2Jrequest\x9b"}}
    parts = {"choices": [{"message": {"content": [{"type": "text", "text": "hi"}]}}]}
    with FakeServer([(400, {}, hostile)]) as server:
        with pytest.raises(common.UserError, match=r"bad \]0;pwned\[2Jrequest") as err:
            served(server.url, retries=0).generate_texts([CHAT], 4, seeds=[1])
    assert str(err.value).isprintable()
    with FakeServer([(200, {}, parts)]) as server:
        with pytest.raises(common.UserError, match="a list as content, not a string"):
            served(server.url, retries=0).generate_texts([CHAT], 4, seeds=[1])
