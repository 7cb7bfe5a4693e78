"""Tests for extras/chat.py: the real program, driven through its standard input.

Every test starts the chat as a subprocess with the tiny random model (`--model tiny`) and a
missing run folder (so no trained checkpoint is picked up), types into it, and reads what it
prints: through a pipe for the scripted sessions, and through a pseudo-terminal (pty) for Ctrl-C
and Ctrl-D, which only mean something on a terminal. The replies of a random model are nonsense;
what is checked is the plumbing: who speaks, the commands, the crisis guard, clean exits.
"""

import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from extras import chat

ROOT = Path(__file__).resolve().parents[1]
# The program under test: the real entry point.
ENTRY = [sys.executable, str(ROOT / "mascot.py"), "chat"]
# OMP_NUM_THREADS=1: the tiny model's matrices are too small to gain from threads, and on a busy
# 2-core machine thread hand-offs made each session take about twice as long.
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    "MASCOT_CACHE": os.environ.get("MASCOT_CACHE", str(ROOT / ".cache")),
    "TOKENIZERS_PARALLELISM": "false",
}
SUPPORT = ["Anchor", "Catalyst", "Beacon", "Guide"]
AGENT_LINE = re.compile(r"^(Anchor|Catalyst|Beacon|Guide|Scribe|Clarifier|Planner|Sentinel): ")
CRISIS = "I have decided to kill myself tonight."


def command(tmp_path, *extra):
    return ENTRY + [
        "--model",
        "tiny",
        "--max-new-tokens",
        "4",
        "--run",
        str(tmp_path / "no-run"),
        *extra,
    ]


def run_piped(tmp_path, text, *extra):
    proc = subprocess.run(
        command(tmp_path, *extra),
        input=text,
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=240,
    )
    return proc.returncode, proc.stdout.splitlines(), proc.stderr


def test_scripted_session_commands_and_crisis_guard(tmp_path):
    saved, after = tmp_path / "out" / "chat.json", tmp_path / "out" / "after.json"
    script = (
        "\n".join(
            [
                "I got the job I wanted!",
                "/who",
                f"/save {saved}",
                CRISIS,
                "/nonsense",
                "Thanks, I will call my sister.",
                f"/save {after}",
                "/quit",
                "this line is never read",
            ]
        )
        + "\n"
    )
    rc, lines, err = run_piped(tmp_path, script, "--show-directives", "--agents-per-turn", "2")
    assert rc == 0, err
    # The banner lists every agent with its role, and the commands.
    assert any("Anchor" in l and "emotional validator" in l for l in lines)
    assert any("/save FILE" in l for l in lines)
    # First message: two agents answer, each announced by its directive (the prompted tiny
    # director writes nonsense, so the least-spoken fallback picks Anchor, then Catalyst).
    agent_idx = [i for i, l in enumerate(lines) if AGENT_LINE.match(l)]
    first_two = [lines[i].split(":")[0] for i in agent_idx[:2]]
    assert first_two == ["Anchor", "Catalyst"]
    assert all(lines[i - 1].startswith("[Agent: ") for i in agent_idx)
    # /who lists all four with roles and turn counts.
    assert any(l.startswith("Beacon (growth advocate):") and "spoke 0x" in l for l in lines)
    # /save wrote the transcript as Conversation.to_json.
    record = json.loads(saved.read_text(encoding="utf-8"))
    assert [t["speaker"] for t in record["turns"]] == ["User", "Anchor", "Catalyst"]
    assert record["turns"][0]["text"] == "I got the job I wanted!"
    assert record["situation"] == "a live chat" and record["persona_set"] == "support"
    # The crisis message: the fixed Safety reply and NO agent line before the next command.
    safety = next(i for i, l in enumerate(lines) if l.startswith("Safety: "))
    hint = next(i for i, l in enumerate(lines) if l.startswith("unknown command /nonsense"))
    assert safety < hint and not any(AGENT_LINE.match(l) for l in lines[safety:hint])
    assert "988" in "\n".join(lines[safety:hint])
    # The chat goes on after it: the next message gets two agent replies again.
    assert sum(1 for l in lines[hint:] if AGENT_LINE.match(l)) == 2
    assert lines[-1] == "Goodbye." and "never read" not in "\n".join(lines)
    # The saved log records the flag: which message, the category and the probe's score.
    events = json.loads(after.read_text(encoding="utf-8"))["events"]
    crisis = [e for e in events if e["type"] == "crisis"]
    assert len(crisis) == 1 and crisis[0]["text"] == CRISIS and crisis[0]["category"]
    assert "score" in crisis[0]


def test_end_of_input_exits_cleanly_with_the_meeting_set(tmp_path):
    rc, lines, err = run_piped(
        tmp_path,
        "Let's start the budget review.\n",
        "--set",
        "meeting",
        "--policy",
        "round-robin",
        "--agents-per-turn",
        "1",
    )
    assert rc == 0, err
    assert [l.split(":")[0] for l in lines if AGENT_LINE.match(l)] == ["Scribe"]
    assert lines[-1] == "Goodbye." and "Traceback" not in err


# ----------------------------------------------------------------------------------------------
# On a terminal: Ctrl-C and Ctrl-D
# ----------------------------------------------------------------------------------------------


@pytest.fixture
def spawn_on_pty():
    """Start a program with a new pseudo-terminal as its controlling terminal: (pid, master fd).

    The terminal's line discipline turns a written \\x03 into SIGINT for the program and \\x04 at
    the start of a line into end-of-file, exactly as when a person presses Ctrl-C / Ctrl-D.
    A program still running when the test ends (a failed test) is killed.
    """
    started = []

    def spawn(argv):
        pid, fd = os.forkpty()
        if pid == 0:  # the child: become the chat program
            os.chdir(ROOT)
            # A person's shell starts the foreground program with SIGINT at its default. A test
            # run started in the background by a non-interactive shell inherits SIGINT ignored,
            # and Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.execve(argv[0], argv, ENV)
        started.append((pid, fd))
        return pid, fd

    yield spawn
    for pid, fd in started:
        os.close(fd)
        try:
            if os.waitpid(pid, os.WNOHANG) == (0, 0):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
        except ChildProcessError:  # already reaped by finish()
            pass


def read_until(fd, pattern, timeout=180.0) -> str:
    """Read the terminal's output until `pattern` appears (or the program closes it)."""
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the program exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
        if re.search(pattern, out.decode("utf-8", "replace")):
            break
    return out.decode("utf-8", "replace")


def finish(pid, fd) -> int:
    """Wait for the program to exit and return its exit status (a hang fails the test)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        read_until(fd, r"$^", timeout=0.5)  # keep draining so the program never blocks on output
    pytest.fail("the chat did not exit")  # the fixture kills it


def test_terminal_line_then_ctrl_c(tmp_path, spawn_on_pty):
    pid, fd = spawn_on_pty(command(tmp_path, "--policy", "round-robin", "--agents-per-turn", "1"))
    assert "you> " in read_until(fd, r"you> ")
    os.write(fd, b"My exam went better than I feared.\r")
    reply = read_until(fd, r"Anchor: [^\n]*\n.*you> ")
    # While the director decides, a status line; it is cleared before the reply streams in.
    assert "(choosing who speaks next ...)\r\x1b[K" in reply
    screen = reply.replace("(choosing who speaks next ...)\r\x1b[K", "").replace("\r", "")
    assert re.search(r"^Anchor: ", screen, re.MULTILINE)
    # Ctrl-C at the prompt, as a person presses it: not within microseconds of the prompt
    # appearing. (A SIGINT that lands between input() writing "you> " and readline starting to
    # wait is lost inside CPython's readline, and the chat keeps waiting for a line.)
    # On a loaded machine the process may still be on its way into readline after 0.5 s; then,
    # as a person would, press it again (at most three times).
    time.sleep(0.5)
    out = ""
    for _ in range(3):
        os.write(fd, b"\x03")
        out += read_until(fd, r"Goodbye\.", timeout=10.0)
        if "Goodbye." in out:
            break
    assert "Goodbye." in out and "Traceback" not in out
    assert finish(pid, fd) == 0


def test_terminal_ctrl_d(tmp_path, spawn_on_pty):
    pid, fd = spawn_on_pty(command(tmp_path, "--policy", "least-spoken"))
    assert "you> " in read_until(fd, r"you> ")
    os.write(fd, b"\x04")  # Ctrl-D on an empty line: end of input
    out = read_until(fd, r"Goodbye\.")
    assert "Goodbye." in out and "Traceback" not in out
    assert finish(pid, fd) == 0


class PieceTokenizer:
    """Each token id is one piece of text: enough to watch the stream."""

    PIECES = ["Anchor", ":", " That", " sounds", " hard", ".", "\n", "User", ":", " thanks"]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.PIECES[i] for i in ids)


def test_a_streamed_reply_shows_only_what_the_clean_up_keeps():
    written = []
    printer = chat.StreamPrinter(PieceTokenizer(), "Anchor", ["Anchor", "Beacon"], written.append)
    for i in range(10):  # "Anchor: That sounds hard.\nUser: thanks"
        printer(torch.tensor([i]))
    printer.finish("That sounds hard.")  # what simulate.agents_speak stores (models.clean_reply)
    # Its own label is dropped, the other speaker's line never appears, and the words arrive
    # one by one (the last one held back until the next is sampled).
    assert written == ["Anchor: ", "That", " sounds", " hard.", "\n"]
    assert "".join(written) == "Anchor: That sounds hard.\n"


def test_a_stream_that_the_clean_up_changed_is_shown_again():
    written = []
    printer = chat.StreamPrinter(PieceTokenizer(), "Anchor", ["Anchor"], written.append)
    for i in (2, 3, 4):  # " That sounds hard"
        printer(torch.tensor([i]))
    printer.finish("Something else.")
    assert "".join(written) == "Anchor: That sounds\nAnchor (cleaned up): Something else.\n"


# ----------------------------------------------------------------------------------------------
# Model text on the terminal: no escape sequences (fake_openai's `ansi` and `inject` modes)
# ----------------------------------------------------------------------------------------------
# What a terminal acts on: ESC, BEL, backspace, carriage return, DEL and the C1 controls (0x9b
# is an 8-bit CSI, 0x9d an OSC).
CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class EscapeTokenizer:
    """A model whose tokens carry a window title (OSC 0), a screen clear cut over two tokens and
    an 8-bit CSI."""

    PIECES = ["Anchor", ":", " Hi", " \x1b]0;pw", "ned\x07", " there", "\x1b[2", "J", " friend"]
    PIECES += ["\x9b31m", " now", "."]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.PIECES[i] for i in ids)


def test_a_streamed_reply_shows_no_control_sequence_even_one_cut_between_tokens():
    written = []
    printer = chat.StreamPrinter(EscapeTokenizer(), "Anchor", ["Anchor"], written.append)
    for i in range(len(EscapeTokenizer.PIECES)):
        printer(torch.tensor([i]))
    printer.finish("Hi \x1b]0;pwned\x07 there\x1b[2J friend\x9b31m now.")  # what is stored
    shown = "".join(written)
    assert not CONTROLS.search(shown) and shown == "Anchor: Hi  there friend now.\n"


def test_terminal_text_keeps_newlines_tabs_and_text():
    assert chat.terminal_text("a\tb\nc é 🙂") == "a\tb\nc é 🙂"
    assert chat.terminal_text("x\x1b]52;c;ZXZpbA==\x1b\\y\x1bcz\r\x7f") == "xyz"
    assert chat.terminal_text("cut off \x1b]0;tit") == "cut off "  # swallowed, as a terminal would


def test_a_served_speakers_escape_sequences_never_reach_the_terminal(tmp_path):
    """The tester's session: `printf 'hello\\n' | mascot.py chat --speakers openai:URL` with a
    server whose replies set the window title, clear the screen and write the clipboard (OSC 52):
    printed raw. Now stripped on the terminal; the /save file keeps the reply as the model wrote
    it (the record), every control escaped so that `cat` of it drives nothing. The served
    director's injected directive shows bounded, without its tone."""
    from fake_openai import ANSI_REPLY, MODES, FakeServer

    saved = tmp_path / "chat.json"
    with FakeServer([MODES["ansi"]]) as speakers, FakeServer([MODES["inject"]]) as director:
        rc, lines, err = run_piped(
            tmp_path,
            f"hello\n/save {saved}\n",
            *("--speakers", "openai:" + speakers.url, "--speakers-model", "s"),
            *("--director", "openai:" + director.url, "--director-model", "d"),
            *("--show-directives", "--agents-per-turn", "1"),
        )
    assert rc == 0, err
    out = "\n".join(lines)
    assert not CONTROLS.search(out) and "pwned" not in out and "cm0g" not in out
    assert "Guide: Hello friend, I hear you red done" in lines
    (directive,) = [x for x in lines if x.startswith("[Agent: Guide")]
    assert directive.endswith("/ Tone: -]") and "evil" not in directive
    raw = saved.read_bytes()
    assert not CONTROLS.search(raw.decode("utf-8")) and b"\xc2\x9b" not in raw
    reply = json.loads(raw)["turns"][1]["text"]
    assert "\x1b]0;pwned\x07" in reply and "\x9b31m" in reply and ANSI_REPLY.startswith("Hello")


# ----------------------------------------------------------------------------------------------
# simulate: bad flags, appending as conversations finish, resuming
# ----------------------------------------------------------------------------------------------
def simulate_here(capsys, *argv) -> tuple[int, str, str]:
    """mascot.py simulate in this process: (exit status, stderr, stdout)."""
    import mascot

    code = mascot.main(["simulate", "--model", "tiny", *argv])
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


def test_simulate_refuses_an_empty_run_and_profile_ids_it_could_never_select(
    tmp_path, capsys, monkeypatch
):
    """`--run ""` wrote .lock and simulate/ into the working directory; a profile id `all` or
    `a,b` loaded fine but no --profile could pick it; an unknown --profile was blamed on
    `--profiles`, a flag simulate does not have."""
    monkeypatch.chdir(tmp_path)
    code, err, _ = simulate_here(capsys, "--run", "")
    assert code == 2 and "--run is empty" in err and len(error_lines(err)) == 1, err
    assert list(tmp_path.iterdir()) == []
    profiles = json.loads((ROOT / "data" / "profiles.json").read_text())
    for bad in ("all", "average,calm"):
        profiles["profiles"][0]["id"] = bad
        path = tmp_path / "profiles.json"
        path.write_text(json.dumps(profiles))
        code, err, _ = simulate_here(
            capsys, "--run", str(tmp_path / "run"), "--profiles-file", str(path)
        )
        assert code == 2 and str(path) in err and repr(bad) in err, err
        assert len(error_lines(err)) == 1
    code, err, _ = simulate_here(capsys, "--run", str(tmp_path / "run"), "--profile", "grumpy")
    assert code == 2 and "--profile grumpy" in err and "--profiles " not in err, err


def seeded(body):
    """A server whose every reply names the seed it was sampled with: a resumed conversation
    must get the seeds an uninterrupted one did."""
    from fake_openai import completion, plain, role_of

    if role_of(body) in ("speaker", "user"):
        return completion(f"{role_of(body)} reply, seed {body.get('seed')}")
    return plain(body)


def test_an_interrupted_simulate_keeps_what_finished_and_the_same_command_goes_on(
    tmp_path, capsys, monkeypatch
):
    """Interrupted after its first conversation, simulate said "run the same command (it picks
    up what is done)" but had written nothing. Now each finished conversation is appended as it
    finishes; the same command simulates only the rest (with their own seeds) and ends with the
    file an uninterrupted run writes; other settings are refused, by name."""
    from fake_openai import FakeServer

    from plumbing import files

    with FakeServer([seeded]) as server:
        url = "openai:" + server.url

        def simulate_into(run, *extra):
            return simulate_here(
                capsys,
                *("--run", str(run), "--contexts", "3", "--turns", "2", "--max-new-tokens", "6"),
                *("--speakers", url, "--speakers-model", "s", "--user", url, "--user-model", "u"),
                *extra,
            )

        assert simulate_into(tmp_path / "whole")[0] == 0
        whole = (tmp_path / "whole" / "simulate" / "round-robin.jsonl").read_text()
        asked_whole = len(server.requests)

        out = tmp_path / "run" / "simulate" / "round-robin.jsonl"
        append = files.append_jsonl

        def then_ctrl_c(path, record):
            append(path, record)
            if Path(path) == out:  # Ctrl-C right after the first conversation is written
                raise KeyboardInterrupt

        monkeypatch.setattr(files, "append_jsonl", then_ctrl_c)
        code, err, _ = simulate_into(tmp_path / "run", "--batch", "1")
        monkeypatch.undo()
        assert code == 130 and "picks up what is done" in err, err
        assert len(out.read_text().splitlines()) == 1
        code, err, printed = simulate_into(tmp_path / "run", "--batch", "1")
        assert code == 0 and "(1 of them from an earlier run)" in printed, err
        assert out.read_text() == whole
        # Both runs together asked what the whole run asked, plus one more preflight per role.
        assert len(server.requests) == 2 * asked_whole + 2

        # Again: nothing left to do. Other settings: refused, by name.
        asked = len(server.requests)
        code, err, printed = simulate_into(tmp_path / "run", "--batch", "1")
        assert code == 0 and "(3 of them from an earlier run)" in printed, err
        assert len(server.requests) == asked + 2  # the preflights only
        for flags, change in [
            (["--batch", "1", "--turns", "3"], "--turns was 2, now 3"),
            (["--batch", "3"], "--batch was 1, now 3"),
        ]:
            code, err, _ = simulate_into(tmp_path / "run", *flags)
            assert code == 2 and change in err and len(error_lines(err)) == 1, err
        out.with_name(out.name + ".settings.json").unlink()
        code, err, _ = simulate_into(tmp_path / "run", "--batch", "1")
        assert code == 2 and "no settings file" in err, err
        assert out.read_text() == whole


def test_a_resumed_simulate_on_local_models_writes_what_an_uninterrupted_one_does(
    tmp_path, capsys, monkeypatch
):
    """Local models sample a little differently in another batch (padding changes the
    arithmetic), so the batches are fixed ranges rerun whole: interrupted in the middle of its
    first batch, the resumed run redoes that batch and the file is byte for byte the same."""
    from plumbing import files

    flags = ["--contexts", "3", "--turns", "2", "--max-new-tokens", "6", "--batch", "2"]
    assert simulate_here(capsys, "--run", str(tmp_path / "whole"), *flags)[0] == 0
    whole = (tmp_path / "whole" / "simulate" / "round-robin.jsonl").read_text()
    out = tmp_path / "run" / "simulate" / "round-robin.jsonl"
    append = files.append_jsonl

    def then_ctrl_c(path, record):
        append(path, record)
        if Path(path) == out:  # after the first of the batch's two conversations
            raise KeyboardInterrupt

    monkeypatch.setattr(files, "append_jsonl", then_ctrl_c)
    assert simulate_here(capsys, "--run", str(tmp_path / "run"), *flags)[0] == 130
    monkeypatch.undo()
    assert len(out.read_text().splitlines()) == 1
    code, err, printed = simulate_here(capsys, "--run", str(tmp_path / "run"), *flags)
    assert code == 0 and "from an earlier run" not in printed, err  # its batch was redone
    assert out.read_text() == whole


def test_the_conversations_left_run_in_the_batches_an_uninterrupted_run_has():
    """Fixed batches [k*size, (k+1)*size), run whole: the same batches on every run, and each
    starts at its own seed (run_conversations gives conversation i the seed seed + i)."""
    assert chat.batches([0, 1, 2, 4, 5], 2, 6) == [range(0, 2), range(2, 4), range(4, 6)]
    assert chat.batches([4], 3, 5) == [range(3, 5)] and chat.batches([], 8, 3) == []
