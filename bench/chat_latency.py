"""How long does the chat make you wait? Prints seconds to the first token of the first reply.

Runs `mascot.py chat`'s loop (chat.run_chat) in this process with a scripted person: one message,
then /quit. The reply streams token by token (as on a terminal), and every write is timestamped:

    load      from the start to the prompt (models, the crisis guard's encoder)
    first     from pressing Enter to the first token of the first reply on screen: the crisis
              check, the director's directive (greedy, up to 40 tokens), the speaker's prefill
              and its first token
    replies   from pressing Enter until both agents' replies are complete (--agents-per-turn 2)

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

import chat  # noqa: E402
import mascot  # noqa: E402

MESSAGE = "I failed my driving test today and I feel stupid."


class Person(io.StringIO):
    """stdin: hands over one message, remembering when (the moment Enter is pressed)."""

    def __init__(self):
        super().__init__(MESSAGE + "\n/quit\n")
        self.sent_at = None

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
    args = mascot.build_parser().parse_args(argv)
    person = Person()
    screen = Screen(person)
    t0 = time.perf_counter()
    chat.run_chat(args, stdin=person, stdout=screen)
    lines = screen.getvalue()
    load = person.sent_at - t0
    # The first write after the message is the streaming speaker's label with its first token
    # (or, without a director line, the same); "Goodbye." marks the end of the replies.
    first = screen.writes[0][0] - person.sent_at
    done = next(t for t, text in screen.writes if "Goodbye." in text) - person.sent_at
    return {"load": load, "first": first, "replies": done, "text": lines}


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
    argv = ["chat", "--model", args.model, "--run", str(ROOT / "runs" / "bench-chat-none"), "--policy", args.policy]
    runs = [one_run(argv) for _ in range(args.repeats)]
    print("\n".join(runs[-1]["text"].strip().splitlines()[-4:]))
    for key in ("load", "first", "replies"):
        values = [r[key] for r in runs]
        print(f"{key:8s} median {statistics.median(values):6.2f} s   (runs: {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
