"""data.py: everything mascot reads from or writes to disk, except the models.

    load_personas(path, set_name) -> PersonaSet      the agents of one scenario (personas.json)
    load_contexts(path, set_name) -> list[Context]   situations and openings (data/contexts.jsonl)
    split_contexts(contexts, ...) -> (train, held_out), stratified by valence / meeting domain
    load_profiles(path)           -> {id: Profile}   Big Five simulated users (data/profiles.json)
    make_inputs(...)              -> Inputs          all of the above for one run, checked
The public datasets the paper uses (Empathetic Dialogues, ESConv, QMSum) are read in their official
formats by extras/datasets.py, which mascot.py calls when --data names one. Every file a run writes
goes through `read_jsonl`, `append_jsonl` (crash-safe), `write_json(l)` / `atomic_folder` (atomic),
`AnswerCache` (paid answers are never asked twice); `derive_seed` is the one formula for seeds.
Bad input raises `UserError`: one line naming the file, row or field and the fix.
"""

import argparse
import errno
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

HERE = Path(__file__).resolve().parent


class UserError(Exception):
    """Bad user input (a file, a row, a flag). The message is one line: what is wrong and the fix."""


def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)       # stderr: never mixed with results


# --- Files: text, JSON, JSON lines, atomic saves ----------------------------------------------
def resolve(path: str | Path) -> Path:
    """A relative path from the working directory, else beside this file (the shipped personas.json)."""
    path = Path(path).expanduser()
    return HERE / path if not path.is_absolute() and not path.exists() and (HERE / path).exists() else path


def read_text(path: str | Path) -> str:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; check the path")
    try:
        return path.read_bytes().decode("utf-8-sig")       # -sig: accept an editor's byte-order mark
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8") from None


def read_json(path: str | Path) -> object:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})") from None


def asset(name: str) -> object:
    """A JSON file shipped in data/ (rubrics, phrase lists, few-shot examples)."""
    return read_json(HERE / "data" / name)


def prompt(name: str) -> str:
    """A prompt template, data/prompts/<name>.txt (our own text; {fields} filled with str.format)."""
    return read_text(HERE / "data" / "prompts" / f"{name}.txt").rstrip("\n")


def json_type(value: object) -> str:
    """A parsed value named the way a JSON file spells it, for error messages."""
    return {bool: "true/false", dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def jsonl_lines(path: str | Path) -> list[tuple[int, object, str]]:
    """(line number, value or None, JSON error or "") of every non-blank line. Split on "\\n" only:
    str.splitlines() also splits on U+2028, which json.dumps(ensure_ascii=False) writes raw."""
    rows = []
    for number, line in enumerate(read_text(path).split("\n"), start=1):
        if line.strip():
            try:
                rows.append((number, json.loads(line), ""))
            except json.JSONDecodeError as e:
                rows.append((number, None, e.msg))
    return rows


def read_jsonl(path: str | Path, on_damage=None, numbered: bool = False) -> list:
    """All records of a JSON-lines file, one object per line. An unreadable LAST line is ignored with
    a warning (what a crash in the middle of append_jsonl leaves); one elsewhere is real damage: a
    UserError naming the line, unless on_damage(line, problem) says the caller can do without it
    (the answer cache asks again). numbered=True returns (line, record) pairs."""
    rows, records = jsonl_lines(path), []
    for i, (number, value, error) in enumerate(rows):
        if error and i == len(rows) - 1:
            warn(f"{path}: ignoring line {number}, cut off mid-write ({error})")
            break
        if error or not isinstance(value, dict):
            problem = error or f"it holds {json_type(value)}, not an object"
            if on_damage is None:
                raise UserError(f"{path}: line {number} is not a JSON object ({problem}); fix or delete that line")
            on_damage(number, problem)
            continue
        records.append((number, value) if numbered else value)
    return records


def append_jsonl(path: str | Path, record: dict) -> None:
    """Append one record as one line, then flush and fsync, so it survives a crash right after. A half-written
    last line left by an earlier crash is cut off first, or the new line would be glued to it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        size = f.seek(0, os.SEEK_END)
        if size:
            f.seek(size - 1)
            if f.read(1) != b"\n":
                f.seek(0)
                keep = f.read().rfind(b"\n") + 1
                f.truncate(keep)
                warn(f"{path}: dropped a half-written last line ({size - keep} bytes)")
        f.write((json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8"))
        f.flush()
        os.fsync(f.fileno())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write under a temporary name, then rename: a crash leaves the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_jsonl(path: str | Path, rows: list[dict]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_json(path: str | Path, value: object) -> None:
    write_text_atomic(path, json.dumps(value, indent=2, ensure_ascii=False) + "\n")


@contextmanager
def atomic_folder(target: str | Path):
    """Build a folder under "<target>.tmp", renamed to `target` only when the block ends without an
    error (`with atomic_folder(run / "speakers") as tmp: model.save_pretrained(tmp)`): models and
    checkpoints are never left half-written."""
    target = Path(target)
    tmp = target.with_name(target.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)                       # left over from a crashed save
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except Exception as err:                     # a half-written folder only takes space; safetensors and torch
        shutil.rmtree(tmp, ignore_errors=True)   # wrap a full disk's OSError in their own errors: unwrap it
        raise OSError(errno.ENOSPC, "No space left on device", str(target)) if "No space left" in str(err) else err
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


@contextmanager
def run_lock(folder: str | Path):
    """An exclusive lock on a run folder while the block runs: a second mascot command there stops at once
    instead of interleaving checkpoints and paid judgements. The OS drops it when the process ends (kill -9 too)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{folder} is in use by another mascot command; wait for it, or use another --run") from None
        yield


def fingerprint(*paths: str | Path) -> str:
    """sha256 (12 hex digits) of the files' bytes, a folder's files in name order: what made a run."""
    digest = hashlib.sha256()
    for path in map(resolve, paths):
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:12]


QUIET = False          # mascot's --quiet: no progress bars and no phase lines


def progress(items, desc: str):
    """A phase's progress: a tqdm bar on a terminal, a line when it ends in a log, nothing under --quiet or no desc."""
    if QUIET or not desc:
        return items
    return tqdm(items, desc, leave=False) if sys.stderr.isatty() else _phase_line(items, desc)


def _phase_line(items, desc: str):
    start, n = time.time(), 0
    try:
        for n, item in enumerate(items, 1):
            yield item
    finally:                          # also when the caller stops early (every conversation ended)
        print(f"{desc}: {n} done, {time.time() - start:.0f} s", file=sys.stderr, flush=True)


def save_model(model, tok, folder: Path, card: str = "") -> Path:
    """save_pretrained (config, weights, tokenizer) and, given one, the model card as README.md."""
    with atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if card:
            (tmp / "README.md").write_text(card, encoding="utf-8")
    return folder


class AnswerCache:
    """Answers already paid for (judgements, a served model's replies), so no re-run asks twice: an
    append-only JSON-lines file of {"key": sha256, "value"}, one flushed line per answer (a crash
    loses at most that line). A garbled line is skipped with a warning, counted, and asked again."""

    def __init__(self, path: str | Path):
        self.path, self.skipped = Path(path), 0                  # skipped: garbled lines, asked again
        self._values: dict[str, object] = {}
        if self.path.exists():
            for r in read_jsonl(self.path, on_damage=self._damaged):
                if "key" in r and "value" in r:
                    self._values[r["key"]] = r["value"]

    def _damaged(self, number: int, problem: str) -> None:
        self.skipped += 1
        warn(f"{self.path}: skipping garbled line {number} ({problem}); its answer will be asked again")

    @staticmethod
    def make_key(name: str, method: str, inputs: object) -> str:
        """sha256 of (who answers, method, canonical JSON of the inputs): equal inputs, equal key."""
        canonical = json.dumps([name, method, inputs], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str):
        return self._values.get(key)                     # stored values are never None

    def put(self, key: str, value) -> None:
        if value is None:
            raise ValueError("AnswerCache stores no None values: None means 'not cached'")
        self._values[key] = value
        append_jsonl(self.path, {"key": key, "value": value})

    def __len__(self) -> int:
        return len(self._values)


def cached_answers(cache: AnswerCache | None, keys: list[str], compute_misses,
                   keep=lambda value: value is not None) -> list:
    """The answer for every key: from `cache`, else computed, each distinct key once. compute_misses(todo,
    store) calls store(i, answer) as each arrives; a keep(answer) one is cached at once, so a failure
    part-way loses only what was in flight."""
    values = [cache.get(k) if cache else None for k in keys]
    first_of = {}                                         # key -> index of its first missing input
    for i, (k, v) in enumerate(zip(keys, values)):
        if v is None:
            first_of.setdefault(k, i)
    fresh = {}

    def store(i, value):
        fresh[i] = value
        if cache is not None and keep(value):
            cache.put(keys[i], value)

    if first_of:
        compute_misses(list(first_of.values()), store)
    return [fresh[first_of[k]] if v is None else v for k, v in zip(keys, values)]


# --- Settings and seeds: a hyperparameter declared once, with its default, help and valid range ---
# The settings live in dataclasses beside the code that uses them (grpo.GRPOConfig,
# reward.RLAIFConfig, director.DirectorConfig, evaluate.EvalConfig); mascot.py turns each `option`
# field into a flag (`--num-generations` for `num_generations`), so every default is written exactly once.

def option(default, help: str, check: str = "", alias: str = ""):
    """A dataclass field that is also a flag. check: "" (any value of the default's type),
    "positive", "non-negative", "at-least-2", "fraction" ([0, 1)), or a list of choices; alias: an old spelling."""
    return field(default=default, metadata={"help": help, "check": check, "alias": alias})


_CHECKS = {"positive": (lambda v: v > 0, "> 0"), "non-negative": (lambda v: v >= 0, ">= 0"),
           "at-least-2": (lambda v: v >= 2, ">= 2"), "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
           "": (lambda v: True, "")}


def flag_type(name: str, kind: type, check: str = ""):
    """An argparse `type=` that parses int or float, refuses NaN and infinity, and applies `check`:
    `error: argument --learning-rate/--lr: --learning-rate must be > 0, got -1.0` (exit status 2)."""
    ok, rule = _CHECKS[check]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be {'a whole number' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {text!r}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {value}")
        return value
    return parse


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


# --- Personas (personas.json) -----------------------------------------------------------------
# ESConv's eight support strategies (Liu et al. 2021), as its annotators labelled every supporter turn.
SUPPORT_STRATEGIES = ["Question", "Restatement or Paraphrasing", "Reflection of feelings", "Self-disclosure",
                      "Affirmation and Reassurance", "Providing Suggestions", "Information", "Others"]


@dataclass
class Persona:
    name: str            # "Anchor"
    role: str            # "emotional validator"
    description: str     # what it does and never does
    style: str           # how it sounds
    examples: list[str]  # a few lines in its voice
    esconv_strategies: list[str] = field(default_factory=list)   # its job in ESConv's labels (SUPPORT_STRATEGIES)


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z0-9]+", text.casefold()))


def _contains(haystack: tuple, needle: tuple) -> bool:
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
        """The persona a free-text mention refers to ("Anchor", "the action guide", "Validator"),
        or None if none or several fit. Tried in order: exact name, exact role, a name inside the
        phrase, the phrase inside a name or role; case and punctuation ignored."""
        query = _words(name_or_role)
        tests = [lambda p: _words(p.name) == query, lambda p: _words(p.role) == query,
                 lambda p: _contains(query, _words(p.name)),
                 lambda p: _contains(_words(p.name), query) or _contains(_words(p.role), query)]
        for test in tests:
            hits = [p for p in self.personas if test(p)]
            if hits:
                return hits[0] if len(hits) == 1 else None   # ambiguous: no weaker rule may guess
        return None


def _need(obj: dict, key: str, where: str, many: bool = False, limit: int = 2000):
    """A non-empty string field (or a non-empty list of at most 20), at most `limit` characters each:
    a runaway field would crowd out the rest of every prompt it goes into."""
    value = obj.get(key)
    items = (value if isinstance(value, list) else [None]) if many else [value]
    if not items or len(items) > 20 or not all(isinstance(v, str) and v.strip() and len(v) <= limit for v in items):
        what = "a list of at most 20 non-empty strings" if many else "a non-empty string"
        raise UserError(f"{where}: field '{key}' must be {what} of at most {limit} characters (got "
                        f"{'nothing' if key not in obj else json_type(value)})")
    return [v.strip() for v in items] if many else value.strip()


def persona_sets(path: str | Path = "personas.json") -> dict:
    """The raw persona sets of a personas file, {set name: set}, in file order."""
    if not resolve(path).is_file():
        raise UserError(f"{path}: personas file not found; pass --personas a personas JSON file (the repo ships personas.json)")
    sets = read_json(resolve(path))
    if not isinstance(sets, dict):
        raise UserError(f"{path}: the top level is {json_type(sets)}; it must map set names to persona sets")
    return sets


def load_personas(path: str | Path = "personas.json", set_name: str = "support") -> PersonaSet:
    """Read and validate one persona set; every problem is a UserError naming set, persona, field."""
    sets = persona_sets(path)
    if set_name not in sets:
        raise UserError(f"{resolve(path)}: no persona set '{set_name}'; available: {', '.join(sets) or 'none'}")
    raw, where = sets[set_name], f"{resolve(path)}: set '{set_name}'"
    if not isinstance(raw, dict) or not isinstance(raw.get("personas"), list) or not raw["personas"]:
        raise UserError(f"{where} must be an object with description, a non-empty personas list, strategies, tones")
    personas, seen = [], {}
    for i, item in enumerate(raw["personas"], start=1):
        here = f"{where} persona #{i}"
        if not isinstance(item, dict):
            raise UserError(f"{here} is {json_type(item)}; each persona must be an object")
        p = Persona(*(_need(item, k, here) for k in ("name", "role", "description", "style")),
                    _need(item, "examples", here, many=True),
                    _need(item, "esconv_strategies", here, many=True) if "esconv_strategies" in item else [])
        if set(p.esconv_strategies) - set(SUPPORT_STRATEGIES):
            raise UserError(f"{here}: esconv_strategies {sorted(set(p.esconv_strategies) - set(SUPPORT_STRATEGIES))} "
                            f"are not ESConv's; use {', '.join(SUPPORT_STRATEGIES)}")
        if not re.fullmatch(r"[\w][\w .'-]{0,39}", p.name):     # a newline could spoof a directive line
            raise UserError(f"{here}: name {p.name!r} must be one line of at most 40 letters, digits, spaces, . ' -")
        if p.name.casefold() in seen:
            raise UserError(f"{where}: personas #{seen[p.name.casefold()]} and #{i} are both named '{p.name}'")
        seen[p.name.casefold()] = i
        personas.append(p)
    return PersonaSet(set_name, _need(raw, "description", where), personas, _need(raw, "strategies", where, True),
                      _need(raw, "tones", where, True))


# --- Contexts: the situations conversations start from, from our file or the paper's datasets ---
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
    # The recorded conversation from first_message on: [{"speaker": "user" | "supporter" |
    # "participant", "text", "strategy"?: ESConv's label}]; empty when the source has only openings.
    turns: list[dict] = field(default_factory=list)


def context_row(row: dict) -> Context:
    """One line of a contexts file in our format (data/contexts.jsonl; extras/datasets.py writes the public datasets
    in it too): id, set, situation, first_message, optional emotion, valence, domain, source and turns."""
    if row.get("set") not in ("support", "meeting"):
        raise UserError("'set' must be \"support\" or \"meeting\"")
    if (row.get("valence") or "") not in ("", "positive", "negative", "ambiguous"):
        raise UserError("'valence' must be positive, negative or ambiguous")
    turns = row.get("turns") or []
    if not isinstance(turns, list) or not all(isinstance(t, dict) and isinstance(t.get("text"), str)
                                              and t.get("speaker") in ("user", "supporter", "participant") for t in turns):
        raise UserError("'turns' must be a list of {speaker: user|supporter|participant, text}")
    return Context(*(_need(row, k, "this row", limit=20_000) for k in ("id", "set", "situation", "first_message")),
                   str(row.get("emotion") or ""),
                   row.get("valence") or "", str(row.get("domain") or ""), str(row.get("source") or "bundled"), turns)


def is_contexts_file(spec: str) -> bool:
    """Is --data "bundled" or a JSON-lines file in our format (its first object has first_message)?"""
    path = Path(spec).expanduser()
    first = next((v for _, v, _ in jsonl_lines(path) if isinstance(v, dict)), {}) if path.suffix == ".jsonl" \
        and path.is_file() else {}
    return spec == "bundled" or {"first_message", "set"} <= set(first)


def contexts_path(spec: str) -> Path:
    return HERE / "data" / "contexts.jsonl" if spec == "bundled" else Path(spec).expanduser()    # --data's file


def load_contexts(spec: str = "bundled", persona_set: str = "support") -> list[Context]:
    """The contexts of one persona set from a file in our format; a malformed row is skipped with
    a warning naming its line, a file without any usable row is an error."""
    path = contexts_path(spec)
    contexts, skipped = [], 0
    for number, row, error in jsonl_lines(path):
        try:
            if error or not isinstance(row, dict):
                raise UserError(f"not a JSON object ({error or json_type(row)})")
            contexts.append(context_row(row))
        except UserError as e:
            skipped += 1
            warn(f"{path}: skipping line {number}: {e}")
    if not [c for c in contexts if c.persona_set == persona_set]:
        raise UserError(f"{path}: no usable '{persona_set}' contexts ({skipped} malformed rows); check --data and --set")
    return [c for c in contexts if c.persona_set == persona_set]


def split_contexts(contexts: list[Context], held_out: float = 0.25, seed: int = 0) -> tuple[list, list]:
    """Deterministic (train, held_out), stratified by slice (support valence, meeting domain): each
    slice of two or more contexts puts round(n * held_out), at least one and never all, into
    held-out, so the evaluation covers every slice the paper reports. Both keep the input order."""
    if not 0 <= held_out < 1:
        raise UserError(f"--held-out {held_out}: give a number in [0, 1)")
    slices: dict[str, list[int]] = {}
    for i, c in enumerate(contexts):
        slices.setdefault(f"{c.persona_set}/{c.valence or c.domain}", []).append(i)
    held: set[int] = set()
    for name, members in sorted(slices.items()):
        n = round(len(members) * held_out)
        if held_out > 0 and len(members) >= 2:
            n = min(max(n, 1), len(members) - 1)
        held.update(random.Random(f"{seed}/{name}").sample(members, n))   # per slice: one never reshuffles another
    return [c for i, c in enumerate(contexts) if i not in held], [c for i, c in enumerate(contexts) if i in held]


# --- Big Five simulated-user profiles (data/profiles.json) ------------------------------------
BIG_FIVE = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
LEVELS = ("high", "low", "average")


@dataclass
class Profile:
    id: str                 # "average", "openness-high", ...
    levels: dict[str, str]  # trait -> "high" | "low" | "average"
    description: str        # the five trait texts joined: the simulated user's personality prompt

    def trait(self) -> str:
        """The trait this profile sets high or low; "average" when none, "mixed" when several."""
        moved = [t for t, level in self.levels.items() if level != "average"]
        return moved[0] if len(moved) == 1 else "mixed" if moved else "average"


def load_profiles(path: str | Path = "data/profiles.json") -> dict[str, Profile]:
    """{id: Profile}: the paper's ten one-trait-high-or-low users plus our all-average one."""
    path = resolve(path)
    raw = read_json(path)
    traits = raw.get("traits") if isinstance(raw, dict) else None
    if not isinstance(traits, dict) or sorted(traits) != sorted(BIG_FIVE) or not all(isinstance(traits[t], dict) for t in BIG_FIVE):
        raise UserError(f"{path}: \"traits\" must map each of {', '.join(BIG_FIVE)} to its high/low/average texts")
    texts = {t: {lv: _need(traits[t], lv, f"{path}: trait '{t}'") for lv in LEVELS} for t in BIG_FIVE}
    profiles: dict[str, Profile] = {}
    for i, entry in enumerate(raw.get("profiles") or [], start=1):
        levels = entry.get("levels") if isinstance(entry, dict) else None
        if not isinstance(levels, dict) or sorted(levels) != sorted(BIG_FIVE) or any(levels[t] not in LEVELS for t in BIG_FIVE) \
                or not isinstance(entry.get("id"), str) or entry["id"] in profiles:
            raise UserError(f"{path}: profile #{i} needs a unique id and \"levels\" giving each trait high/low/average")
        profiles[entry["id"]] = Profile(entry["id"], {t: levels[t] for t in BIG_FIVE},
                                        " ".join(texts[t][levels[t]] for t in BIG_FIVE))
    if not profiles:
        raise UserError(f"{path}: \"profiles\" must be a non-empty list of {{id, levels}} objects")
    return profiles


# --- One run's inputs, checked against the stages it builds on --------------------------------
class Inputs(NamedTuple):
    personas: PersonaSet
    train: list[Context]          # contexts training may use
    held_out: list[Context]       # contexts only the before/after checks and the evaluation see
    profiles: dict[str, Profile]  # Big Five profile id -> profile
    split: str                    # how train and held_out were chosen, for the results


# The settings that decide which contexts are held out. A later command on the same run folder
# must use the same values, or contexts one stage trained on could be another stage's held-out set.
SPLIT_SETTINGS = ("set", "seed", "held_out")


def make_inputs(personas: PersonaSet, splits: dict[str, list[Context]], held_out: float, seed: int,
                profiles: dict[str, Profile], config: dict, earlier: list[Path] = ()) -> Inputs:
    """The run's train / held-out contexts: `splits` {"train", "test"/"valid"} of official splits (used
    as the paper does), else {"all"} (split at random here). `earlier`: the config.json of the stages
    this builds on; made on the same data (resolved paths), they must agree on SPLIT_SETTINGS."""
    for path in earlier:
        old = read_json(path) if Path(path).is_file() else {}
        if old.get("data") is not None and contexts_path(old["data"]).resolve() == contexts_path(config["data"]).resolve():
            for key in SPLIT_SETTINGS:
                if key in old and old[key] != config[key]:
                    flag = "--" + key.replace("_", "-")
                    raise UserError(f"{flag} {config[key]}: {path} was made with {flag} {old[key]}, so the contexts "
                                    f"it trained on would be held out here; use {flag} {old[key]} or a new --run folder")
    if "train" in splits and len(splits) > 1:
        held_name = "test" if "test" in splits else "valid"
        train, held = splits["train"], splits[held_name]
        how = f"official splits: training uses 'train' ({len(train)}), evaluation '{held_name}' ({len(held)})"
    else:
        contexts = [c for part in splits.values() for c in part]
        train, held = split_contexts(contexts, held_out, seed)
        how = f"random split, held-out fraction {held_out}"
        if not held or not train:
            raise UserError(f"--held-out {held_out}: {len(held)} held-out and {len(train)} training contexts of "
                            f"{len(contexts)}; need at least one of each")
    return Inputs(personas, train, held, profiles, how)


def save_config(config: dict, folder: Path) -> None:
    """Write the resolved settings to folder/config.json and print them once."""
    write_json(Path(folder) / "config.json", config)
    print("config: " + " ".join(f"{k}={v}" for k, v in config.items()), flush=True)
