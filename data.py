"""data.py: everything mascot reads from or writes to disk, except the models.

Every stage of MASCOT starts from the same three inputs, and they all come through here:

    load_personas(path, set_name)  -> PersonaSet      the agents of one scenario (personas.json)
    load_contexts(spec, ...)       -> list[Context]   situations + opening messages to talk about
    split_contexts(contexts, ...)  -> (train, held_out), stratified by valence / meeting domain
    load_profiles(path, ids)       -> list[Profile]   Big Five simulated users (data/profiles.json)
    load_inputs(args)              -> Inputs          all of the above for one run, checked

and every file a run writes goes through one small set of helpers: `read_jsonl` (the one JSON-lines
reader), `append_jsonl` (crash-safe appends), `write_json` / `write_jsonl` / `atomic_folder` (atomic
saves) and `derive_seed` (the one formula for derived seeds).

`load_contexts` reads our bundled data/contexts.jsonl or one of the public datasets the paper uses,
in its official release format: Empathetic Dialogues (train/valid/test.csv), ESConv (ESConv.json or
a JSON-lines export), QMSum (a folder of meeting JSON files). All of them become the same `Context`,
so nothing downstream knows the source. Simplification vs the paper: we use only the situation, the
emotion / domain, the opening message and (where the dataset has them) the recorded later turns.

Bad input never produces a traceback: it raises `UserError` with one line naming the file, row or
field and the fix, and mascot.py prints it as `error: ...`. Malformed rows inside a dataset are
skipped with a warning on stderr and a count, because public dumps always have a few.

Run it on its own to check that a dataset is read the way you expect:

    python data.py                                  # the bundled contexts
    python data.py path/to/esconv/train.jsonl       # any supported file or folder
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import random
import re
import shutil
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


class UserError(Exception):
    """Bad user input (a file, a row, a flag). The message is one line: what is wrong and the fix."""


def warn(message: str) -> None:
    """Warnings go to stderr so they never mix with results printed on stdout."""
    print(f"warning: {message}", file=sys.stderr)


# ----------------------------------------------------------------------------------------------
# Reading and writing files: text, JSON, JSON lines, atomic saves
# ----------------------------------------------------------------------------------------------

def return_freed_memory() -> None:
    """Have glibc give large freed blocks back to the operating system (Linux; elsewhere a no-op).

    PyTorch on a CPU allocates every tensor with malloc. glibc serves blocks below its mmap
    threshold from its heap and keeps them when they are freed, and it RAISES that threshold
    (up to 32 MiB) whenever a large mmapped block is freed, so after the first backward pass
    nearly every activation comes from the heap and stays there, fragmented. Measured on
    SmolLM2-135M, three forward/backward passes of growing size: 6.9 GB resident afterwards
    where 2.0 GB were live, peak 7.25 GB; with the threshold fixed at 1 MiB (mallopt), 2.1 GB
    afterwards and a peak of 5.88 GB (docs/PERFORMANCE.md). The price: every large tensor is a
    fresh mapping whose pages the kernel zeroes, and sampling 8 x 32 tokens of 306-token prompts
    took 9.0 s instead of 7.4 s. So it is a choice: `mascot.py` calls this at start-up when the
    environment sets MASCOT_LOW_MEMORY=1 (README, "When things go wrong").
    """
    import ctypes                                    # imported where it is needed
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:                                  # not glibc: leave the allocator alone
        return
    m_mmap_threshold = -3                            # mallopt's parameter number (malloc.h)
    libc.mallopt(m_mmap_threshold, 1 << 20)


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (10^9 bytes; Linux's ru_maxrss is in KiB)."""
    import resource                                  # POSIX only; imported where it is needed
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def _resolve(path: str | Path) -> Path:
    """A relative path is looked up in the working directory first, then beside this file,
    so `python /somewhere/mascot/mascot.py` still finds the shipped personas.json."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists() or not (HERE / path).exists():
        return path
    return HERE / path


def read_text(path: str | Path) -> str:
    """The whole file as text. utf-8-sig also accepts the byte-order mark some editors write."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; check the path")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (bad byte at offset {e.start}); "
                        "re-save the file as UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); check its permissions") from None


def read_json(path: str | Path) -> object:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); "
                        "fix the syntax there") from None


@functools.cache
def asset(name: str) -> object:
    """A JSON file shipped in data/ (rubrics, phrase lists), parsed once per process."""
    return read_json(HERE / "data" / name)


@functools.cache
def prompt(name: str) -> str:
    """A prompt template shipped as data/prompts/<name>.txt (our own text; {fields} filled in by
    the caller with str.format). Kept out of the code so it can be read and edited as text."""
    return read_text(HERE / "data" / "prompts" / f"{name}.txt").rstrip("\n")


def json_type(value: object) -> str:
    """Name a parsed value the way the JSON file spells it, for error messages."""
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def jsonl_lines(path: str | Path) -> list[tuple[int, object, str]]:
    """Parse every non-blank line: (line number, value or None, JSON error message or "").

    We split on "\n" only: str.splitlines() would also split on U+2028 and U+2029, which
    json.dumps(..., ensure_ascii=False) writes unescaped inside strings, and cut one record in two.
    """
    rows = []
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line), ""))
        except json.JSONDecodeError as e:
            rows.append((number, None, e.msg))
    return rows


def read_jsonl(path: str | Path, on_damage=None, numbered: bool = False) -> list:
    """All records of a JSON-lines file, one object per line: the one reader every file goes through.

    An unreadable LAST line is ignored with a warning: it is what a crash in the middle of
    append_jsonl leaves behind, and a resumable run must survive it. An unreadable line anywhere
    else is real damage: by default it stops with a UserError naming the line; a caller that can
    do without the record (the judge cache: the judgement is simply asked again) passes
    on_damage(line_number, problem), and the line is skipped. numbered=True returns
    (line number, record) pairs, so a caller's own checks can name the line too.
    """
    path = Path(path)
    rows = jsonl_lines(path)
    records = []
    for i, (number, value, error) in enumerate(rows):
        if error and i == len(rows) - 1:
            warn(f"{path}: ignoring line {number}, cut off mid-write ({error})")
            break
        if error or not isinstance(value, dict):
            problem = error or f"it holds {json_type(value)}, not an object"
            if on_damage is None:
                raise UserError(f"{path}: line {number} is not a JSON object ({problem}); "
                                "fix or delete that line")
            on_damage(number, problem)
            continue
        records.append((number, value) if numbered else value)
    return records


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as one line, then flush and fsync so it survives a crash right after.

    If a previous crash left a half-written last line (no trailing newline), we cut it off first;
    otherwise our new line would be glued to it and corrupt a line in the middle of the file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                f.seek(0)
                keep = f.read().rfind(b"\n") + 1
                f.truncate(keep)
                warn(f"{path}: dropped a half-written last line ({size - keep} bytes)")
        f.write(line)
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a file under a temporary name and rename it: a crash leaves the old file or the new
    one, never half of one (rename within a folder is atomic on POSIX)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    """Write all rows as JSON lines, atomically."""
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_json(path: str | Path, value: object) -> None:
    """Write one JSON document (configs, summaries, results), atomically."""
    write_text_atomic(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


@contextmanager
def atomic_folder(target: str | Path):
    """Build a folder under "<target>.tmp" and rename it to `target` only when the block ends
    without an error: models, reward models and checkpoints are never left half-written.

        with atomic_folder(run / "speakers") as tmp:
            model.save_pretrained(tmp)
    """
    target = Path(target)
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)                     # left over from a crashed save
    tmp.mkdir(parents=True)
    yield tmp
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


# ----------------------------------------------------------------------------------------------
# The answer cache: an append-only JSON-lines file of {"key": sha256, "value": ...}
# ----------------------------------------------------------------------------------------------

class AnswerCache:
    """Answers already paid for (judgements, replies of a served model), on disk, so a re-run (or
    a resumed crash) never asks twice.

    Every record is one line {"key", "value"} appended with flush + fsync (append_jsonl), so
    after a crash at most the line being written is lost. Reading is forgiving on purpose:
      - a garbled LAST line is what a crash mid-write leaves: ignored with a warning;
      - a garbled line in the middle is real damage (an editor, a disk error): skipped with a
        warning and counted in `skipped`; the answer it held is simply asked again.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.hits = 0
        self.misses = 0
        self.skipped = 0
        self._values: dict[str, object] = self._load()

    @staticmethod
    def make_key(name: str, method: str, inputs: object) -> str:
        """sha256 of (who answers, method, canonical JSON of the inputs): equal inputs, equal key."""
        canonical = json.dumps([name, method, inputs], sort_keys=True, ensure_ascii=False,
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def _load(self) -> dict[str, object]:
        if not self.path.exists():
            return {}

        def damaged(number: int, problem: str) -> None:
            self.skipped += 1
            warn(f"{self.path}: skipping garbled line {number} ({problem}); its answer will be "
                 "asked again")

        records = read_jsonl(self.path, on_damage=damaged)
        return {r["key"]: r["value"] for r in records if "key" in r and "value" in r}

    def get(self, key: str):
        """The stored value, or None (a miss). Stored values are never None."""
        value = self._values.get(key)
        if value is None:
            self.misses += 1
        else:
            self.hits += 1
        return value

    def put(self, key: str, value) -> None:
        if value is None:
            raise ValueError("AnswerCache stores no None values: None means 'not cached'")
        self._values[key] = value
        append_jsonl(self.path, {"key": key, "value": value})

    def __len__(self) -> int:
        return len(self._values)


def cached_answers(cache: AnswerCache | None, keys: list[str], compute_misses,
                   keep=lambda value: value is not None) -> list:
    """The answer for every key: from `cache` when it has it, else computed, each distinct key once.

    compute_misses(todo, store) computes the answers at the indices `todo` (in one batch, or one
    request each, concurrently) and calls store(i, answer) as each arrives; an answer with
    keep(answer) true is written to the cache at once (one flushed line: a crash keeps it), so a
    failure part-way loses only what was in flight. Without a cache file (cache None) every key is
    computed, still once per distinct key.
    """
    values = [cache.get(k) if cache else None for k in keys]
    first_of = {}                                   # key -> index of its first missing input
    for i, (k, v) in enumerate(zip(keys, values)):
        if v is None:
            first_of.setdefault(k, i)
    if not first_of:
        return values
    fresh = {}

    def store(i, value):                            # called as each answer arrives
        fresh[i] = value
        if cache is not None and keep(value):
            cache.put(keys[i], value)

    compute_misses(list(first_of.values()), store)
    return [fresh[first_of[k]] if v is None else v for k, v in zip(keys, values)]


# ----------------------------------------------------------------------------------------------
# Options: a hyperparameter declared once, with its default, its help text and its valid range
# ----------------------------------------------------------------------------------------------
# The algorithms' settings live in dataclasses next to the code that uses them (grpo.GRPOConfig,
# reward.RLAIFConfig, director.DirectorConfig), each field declared with `option(...)`. mascot.py
# turns every such field into a command-line flag (`--group-size` for `group_size`), so each
# default is written exactly once, where a reader of the algorithm sees it.

def option(default, help: str, check: str = ""):
    """A dataclass field that is also a command-line flag.

    check: "" (any value of the default's type), "positive" (> 0), "non-negative" (>= 0),
    "at-least-2" (whole numbers >= 2), or "fraction" (in [0, 1)); a list is a set of choices.
    """
    return field(default=default, metadata={"help": help, "check": check})


_CHECKS = {"positive": (lambda v: v > 0, "> 0"), "non-negative": (lambda v: v >= 0, ">= 0"),
           "at-least-2": (lambda v: v >= 2, ">= 2"), "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
           "": (lambda v: True, "")}


def flag_type(name: str, kind: type, check: str = ""):
    """An argparse `type=` that parses `kind` (int or float) and applies `check`, naming the flag
    in its one-line error: `error: argument --lr: --lr must be > 0, got -1.0` (exit status 2)."""
    ok, rule = _CHECKS[check]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{name} must be {what}, got {text!r}") from None
        if value != value or not ok(value):      # value != value: NaN, which no range admits
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {value}")
        return value
    return parse


# ----------------------------------------------------------------------------------------------
# Seeds: one formula for every derived seed
# ----------------------------------------------------------------------------------------------

def derive_seed(*parts: int | str) -> int:
    """One seed in [0, 2^31 - 1) from several parts: the run's seed, a step, a row, a name...

    A fixed polynomial hash, s = s * 1_000_003 + part (mod 2^31 - 1), so it is the same in every
    run and on every machine (Python's hash() of a string is not). Strings enter as the first
    four bytes of their SHA-256. Every sampling seed in the project comes from here, so a resumed
    run draws exactly the same tokens as an uninterrupted one.

    >>> derive_seed(0, 1) == 1 and derive_seed(1, 2) == 1_000_005
    True
    """
    s = 0
    for part in parts:
        if isinstance(part, str):
            part = int.from_bytes(hashlib.sha256(part.encode()).digest()[:4], "little")
        s = (s * 1_000_003 + int(part)) % (2**31 - 1)
    return s


# ----------------------------------------------------------------------------------------------
# Personas (personas.json)
# ----------------------------------------------------------------------------------------------

@dataclass
class Persona:
    name: str           # "Anchor"
    role: str           # "emotional validator"
    description: str    # what it does and never does
    style: str          # how it sounds
    examples: list[str]  # a few lines in its voice, used as few-shot examples in its prompt


def _words(text: str) -> tuple[str, ...]:
    """Lower-cased words, punctuation dropped: "Agent: Anchor." -> ("agent", "anchor")."""
    return tuple(re.findall(r"[a-z0-9]+", text.casefold()))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    """True when `needle` occurs as consecutive whole words inside `haystack`."""
    n = len(needle)
    return n > 0 and any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


@dataclass
class PersonaSet:
    name: str               # "support" | "meeting"
    description: str
    personas: list[Persona]
    strategies: list[str]   # the director's Action vocabulary
    tones: list[str]        # the director's Tone vocabulary

    def names(self) -> list[str]:
        return [p.name for p in self.personas]

    def find(self, name_or_role: str) -> Persona | None:
        """The persona a free-text mention refers to, or None if none or several fit.

        The director writes "Agent: Anchor", "the action guide", "Validator"..., so we try, in
        order: exact name, exact role, a name inside the phrase ("Anchor (emotional validator)"),
        the phrase inside a name or role ("guide", "validator"). Case and punctuation are ignored.
        """
        query = _words(name_or_role)
        tests = [lambda p: _words(p.name) == query,
                 lambda p: _words(p.role) == query,
                 lambda p: _contains(query, _words(p.name)),
                 lambda p: _contains(_words(p.name), query) or _contains(_words(p.role), query)]
        for test in tests:
            hits = [p for p in self.personas if test(p)]
            if len(hits) == 1:
                return hits[0]
            if len(hits) > 1:
                return None  # ambiguous: a weaker rule must not pick one of them at random
        return None


def _need_text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if isinstance(value, str) and value.strip():
        return value.strip()
    problem = ("missing" if key not in obj else "empty" if isinstance(value, str)
               else f"{json_type(value)}, not text")
    raise UserError(f"{where}: field '{key}' is {problem}; give it a non-empty string")


def _need_text_list(obj: dict, key: str, where: str) -> list[str]:
    value = obj.get(key)
    if key not in obj or not isinstance(value, list) or not value:
        problem = ("missing" if key not in obj else "an empty list" if isinstance(value, list)
                   else f"{json_type(value)}, not a list")
        raise UserError(f"{where}: field '{key}' is {problem}; give it a list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise UserError(f"{where}: '{key}' item {i + 1} is {json_type(item)} or empty; "
                            "every item must be a non-empty string")
    return [item.strip() for item in value]


def _read_persona_file(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: personas file not found; pass the path of a personas JSON file "
                        "(the repo ships personas.json)")
    sets = read_json(path)
    if not isinstance(sets, dict):
        raise UserError(f"{path}: the top level is {json_type(sets)}; it must be an object "
                        'mapping set names ("support", "meeting") to persona sets')
    return sets


def available_sets(path: str | Path = "personas.json") -> list[str]:
    """The persona-set names in a personas file, in file order."""
    return list(_read_persona_file(_resolve(path)))


def load_personas(path: str | Path = "personas.json", set_name: str = "support") -> PersonaSet:
    """Read and validate one persona set; every problem is a UserError naming set, persona, field."""
    path = _resolve(path)
    sets = _read_persona_file(path)
    if set_name not in sets:
        raise UserError(f"{path}: no persona set '{set_name}'; available: {', '.join(sets) or 'none'}")
    raw, where = sets[set_name], f"{path}: set '{set_name}'"
    if not isinstance(raw, dict):
        raise UserError(f"{where} is {json_type(raw)}; it must be an object with "
                        "description, personas, strategies and tones")
    people = raw.get("personas")
    if not isinstance(people, list) or not people:
        raise UserError(f"{where} has no personas; put a non-empty list under \"personas\"")
    personas, seen = [], {}
    for i, item in enumerate(people, start=1):
        name = item.get("name") if isinstance(item, dict) else None
        here = f"{where} persona #{i}" + (f" ({name})" if isinstance(name, str) and name else "")
        if not isinstance(item, dict):
            raise UserError(f"{here} is {json_type(item)}; each persona must be an object")
        persona = Persona(name=_need_text(item, "name", here), role=_need_text(item, "role", here),
                          description=_need_text(item, "description", here),
                          style=_need_text(item, "style", here),
                          examples=_need_text_list(item, "examples", here))
        key = persona.name.casefold()
        if key in seen:
            raise UserError(f"{where}: personas #{seen[key]} and #{i} are both named "
                            f"'{persona.name}'; names must differ (ignoring case)")
        seen[key] = i
        personas.append(persona)
    return PersonaSet(name=set_name, description=_need_text(raw, "description", where),
                      personas=personas, strategies=_need_text_list(raw, "strategies", where),
                      tones=_need_text_list(raw, "tones", where))


# ----------------------------------------------------------------------------------------------
# Contexts: the situations conversations start from
# ----------------------------------------------------------------------------------------------

@dataclass
class Context:
    id: str
    persona_set: str     # "support" | "meeting"
    situation: str       # what happened / what the meeting is about
    first_message: str   # the user's opening message to the group
    emotion: str = ""    # ED / ESConv emotion label
    valence: str = ""    # "positive" | "negative" | "ambiguous" (support contexts)
    domain: str = ""     # "Academic" | "Committee" | "Product" (meeting contexts)
    source: str = ""     # "bundled" | "empathetic_dialogues" | "esconv" | "qmsum"
    # The recorded conversation, starting with first_message: [{"speaker": "user"|"supporter"|
    # "participant", "text": ..., "strategy"?: ESConv's label}]. Empty when the source only has
    # the opening (bundled contexts, ED situation exports). Later-turn states are built from it.
    turns: list[dict] = field(default_factory=list)


def split_contexts(contexts: list[Context], held_out_fraction: float = 0.25,
                   seed: int = 0) -> tuple[list[Context], list[Context]]:
    """Deterministic train / held-out split, stratified by slice (support valence, meeting domain).

    Each slice with two or more contexts puts round(n * fraction) of them, but at least one and
    never all, into held-out, so the held-out evaluation still covers every slice the paper
    reports (ED positive / negative / neutral, QMSum domains). Both lists keep the input order.
    """
    if not 0 <= held_out_fraction < 1:
        raise UserError(f"held-out fraction {held_out_fraction}: give a number in [0, 1)")
    slices: dict[str, list[int]] = {}
    for i, context in enumerate(contexts):
        slices.setdefault(f"{context.persona_set}/{context.valence or context.domain}", []).append(i)
    held: set[int] = set()
    for name, members in sorted(slices.items()):
        n_held = round(len(members) * held_out_fraction)
        if held_out_fraction > 0 and len(members) >= 2:
            n_held = min(max(n_held, 1), len(members) - 1)
        # One generator per slice, seeded by (seed, slice name): adding contexts to one slice
        # never reshuffles another. String seeds are hashed with SHA-512, stable across runs.
        held.update(random.Random(f"{seed}/{name}").sample(members, n_held))
    return ([c for i, c in enumerate(contexts) if i not in held],
            [c for i, c in enumerate(contexts) if i in held])


# ----------------------------------------------------------------------------------------------
# Big Five simulated-user profiles (data/profiles.json)
# ----------------------------------------------------------------------------------------------

BIG_FIVE = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
LEVELS = ("high", "low", "average")


@dataclass
class Profile:
    id: str                 # "average", "openness-high", ...
    levels: dict[str, str]  # trait -> "high" | "low" | "average"
    description: str        # the five trait texts joined: the simulated user's personality prompt


def load_profiles(path: str | Path = "data/profiles.json", ids: list[str] | None = None) -> list[Profile]:
    """Profiles in file order. `ids` None or ["all"] means every profile in the file (the paper's
    10 one-trait-high-or-low users plus our all-average one); otherwise exactly those, in that order."""
    path = _resolve(path)
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the top level is {json_type(raw)}; it must be an object with "
                        "\"traits\" and \"profiles\"")
    traits = raw.get("traits")
    if not isinstance(traits, dict) or sorted(traits) != sorted(BIG_FIVE):
        raise UserError(f"{path}: \"traits\" must be an object with exactly the five traits "
                        f"{', '.join(BIG_FIVE)}")
    texts: dict[str, dict[str, str]] = {}
    for trait in BIG_FIVE:
        if not isinstance(traits[trait], dict):
            raise UserError(f"{path}: trait '{trait}' is {json_type(traits[trait])}; it must be an "
                            "object with high, low and average texts")
        texts[trait] = {level: _need_text(traits[trait], level, f"{path}: trait '{trait}'")
                        for level in LEVELS}
    entries = raw.get("profiles")
    if not isinstance(entries, list) or not entries:
        raise UserError(f"{path}: \"profiles\" must be a non-empty list of {{id, levels}} objects")
    profiles: dict[str, Profile] = {}
    for i, entry in enumerate(entries, start=1):
        where = f"{path}: profile #{i}"
        if not isinstance(entry, dict):
            raise UserError(f"{where} is {json_type(entry)}; each profile must be an object")
        pid = _need_text(entry, "id", where)
        levels = entry.get("levels")
        if (not isinstance(levels, dict) or sorted(levels) != sorted(BIG_FIVE)
                or any(levels[t] not in LEVELS for t in BIG_FIVE)):
            raise UserError(f"{where} ({pid}): \"levels\" must give each of {', '.join(BIG_FIVE)} "
                            f"one of {', '.join(LEVELS)}")
        if pid in profiles:
            raise UserError(f"{where}: profile id '{pid}' appears twice; ids must be unique")
        profiles[pid] = Profile(id=pid, levels={t: levels[t] for t in BIG_FIVE},
                                description=" ".join(texts[t][levels[t]] for t in BIG_FIVE))
    if ids is None or list(ids) == ["all"]:
        return list(profiles.values())
    unknown = [pid for pid in ids if pid not in profiles]
    if unknown:
        raise UserError(f"{path}: unknown profile id '{unknown[0]}'; valid ids: all, {', '.join(profiles)}")
    return [profiles[pid] for pid in ids]


# ----------------------------------------------------------------------------------------------
# One run's inputs, and the record of how they were chosen
# ----------------------------------------------------------------------------------------------

# The flags that decide which contexts are held out. A later command on the same run folder must
# use the same values, or contexts one stage trained on could land in another stage's held-out set.
SPLIT_FLAGS = ("set", "seed", "held_out")


def check_split(args, earlier: list[Path]) -> None:
    """Stop when `args` would split the contexts differently from the stages this command builds on.

    `earlier` lists their config.json files (stage 2 builds on stage 1; evaluation on both); a
    missing file is skipped, and so is one made on other --data (another corpus, such as ESConv
    for held-out transfer, has no contexts in common with it). Otherwise it must agree with `args`
    on SPLIT_FLAGS, so the held-out contexts stay held out across the whole run.
    """
    for config_path in earlier:
        if not Path(config_path).is_file():
            continue
        config = read_json(config_path)
        if config.get("data") != getattr(args, "data", None):
            continue
        for flag in SPLIT_FLAGS:
            if flag in config and getattr(args, flag, config[flag]) != config[flag]:
                dashed = "--" + flag.replace("_", "-")
                raise UserError(f"{dashed} {getattr(args, flag)}: {config_path} was made with {dashed} "
                                f"{config[flag]}, so the contexts it trained on would differ from this "
                                f"command's held-out ones; use {dashed} {config[flag]} or a new --run folder")


def save_config(args, folder: Path) -> None:
    """Write the resolved flags to folder/config.json and print them once (STYLE: log it once)."""
    config = dict(vars(args))
    write_json(Path(folder) / "config.json", config)
    print("config: " + " ".join(f"{k}={v}" for k, v in config.items()), flush=True)
