"""bench/chat_latency.py: how long does `mascot.py chat` make you wait for the first reply?

Runs the chat (extras/chat.py) in this process with a scripted person: one message, then /quit.
Standard input and output are swapped for two objects that timestamp the message (the moment
Enter is pressed) and every write after it; the reply streams word by word as on a terminal:

    load      from the start to the prompt (speakers, director, the crisis guard's encoder)
    directed  from Enter to the first speaker's name on screen: the crisis check and the
              director's directive (greedy, up to its directive length)
    first     from Enter to the first word of the first reply (the speaker's prefill and first
              tokens on top; a word is shown once the next one has begun)
    replies   from Enter until every agent's reply is complete (--agents-per-turn 2)

    python bench/chat_latency.py                     # the embedded model, director policy
    python bench/chat_latency.py --policy round-robin --repeats 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import mascot  # noqa: E402
from extras import chat  # noqa: E402

MESSAGE = "I failed my driving test today and I feel stupid."


class Person(io.StringIO):
    """stdin: hands over one message, then /quit, remembering when (the moment Enter is pressed)."""
    sent_at = None

    def readline(self, *args):
        line = super().readline(*args)
        if line.strip() == MESSAGE:
            self.sent_at = time.perf_counter()
        return line


class Screen(io.StringIO):
    """stdout: a terminal-like sink that timestamps every write after the message."""

    def __init__(self, person):
        super().__init__()
        self.person, self.writes = person, []

    def write(self, text):
        if self.person.sent_at is not None and text:
            self.writes.append((time.perf_counter(), text))
        return super().write(text)


def one_run(argv: list[str]) -> dict:
    person = Person(MESSAGE + "\n/quit\n")
    screen, saved = Screen(person), (sys.stdin, sys.stdout)
    t0 = time.perf_counter()
    sys.stdin, sys.stdout = person, screen
    try:
        chat.main(argv, mascot)
    finally:
        sys.stdin, sys.stdout = saved
    writes = [(t - person.sent_at, text) for t, text in screen.writes]
    # The first write after the message is the streaming speaker's "Name: "; the next is its first word.
    return {"load": person.sent_at - t0, "directed": writes[0][0], "first": writes[1][0],
            "replies": next(t for t, text in writes if "Goodbye." in text), "text": screen.getvalue()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--policy", default="director", choices=["director", "round-robin"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args()
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    # A run folder without trained models: the base model plays every part.
    argv = ["chat", "--model", args.model, "--run", str(ROOT / "runs" / "bench-chat-none"), "--policy", args.policy]
    runs = [one_run(argv) for _ in range(args.repeats)]
    print("\n".join(runs[-1]["text"].strip().splitlines()[-4:]))
    for key in ("load", "directed", "first", "replies"):
        values = [r[key] for r in runs]
        print(f"{key:8s} median {statistics.median(values):6.2f} s   (runs: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
