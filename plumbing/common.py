"""plumbing/common.py: the few small things every module uses (skip on first reading).

UserError      bad input: one line naming the file, row, field or flag, and the fix
warn(msg)      a warning on stderr, never mixed with results
progress(...)  a tqdm bar on a terminal, one line per phase in a log, nothing under --quiet
option(...)    a settings-dataclass field that is also a command-line flag (plumbing/cli.py)
derive_seed    the one formula every sampling seed comes from
"""

import hashlib
import sys
import time
from dataclasses import field

from tqdm import tqdm


class UserError(Exception):
    """Bad user input (a file, a row, a flag). The message is one line: what is wrong and the fix."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)  # stderr: never mixed with results


QUIET = False  # mascot's --quiet: no progress bars and no phase lines


def progress(items, desc: str):
    """A phase's progress: a tqdm bar on a terminal, a line when it ends in a log, nothing under --quiet or no desc."""
    if QUIET or not desc:
        return items
    if sys.stderr.isatty():
        return tqdm(items, desc, leave=False)
    return _phase_line(items, desc)


def _phase_line(items, desc: str):
    """Yield the items, then one line saying how many and how long (a log file needs no bar)."""
    start = time.time()
    n = 0
    try:
        for n, item in enumerate(items, 1):
            yield item
    finally:  # also when the caller stops early (every conversation ended)
        print(f"{desc}: {n} done, {time.time() - start:.0f} s", file=sys.stderr, flush=True)


def option(default, help: str, check: str = "", alias: str = ""):
    """A dataclass field that is also a flag. check: "" (any value of the default's type),
    "positive", "non-negative", "at-least-2", "fraction" ([0, 1)), or a list of choices; alias: an old spelling."""
    return field(default=default, metadata={"help": help, "check": check, "alias": alias})


def derive_seed(*parts: int | str) -> int:
    """One seed in [0, 2^31 - 1) from several parts (the run's seed, a step, a row, a name): a polynomial
    hash, s = s * 1_000_003 + part (mod 2^31 - 1), the same on every machine (Python's hash() of a
    string is not; strings enter as 4 bytes of SHA-256). Every sampling seed comes from here, so a
    resumed run draws exactly the tokens an uninterrupted one did.

    >>> derive_seed(0, 1) == 1 and derive_seed(1, 2) == 1_000_005
    True
    """
    s = 0
    for part in parts:
        if isinstance(part, str):
            part = int.from_bytes(hashlib.sha256(part.encode()).digest()[:4], "little")
        s = (s * 1_000_003 + int(part)) % (2**31 - 1)
    return s
