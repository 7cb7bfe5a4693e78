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
