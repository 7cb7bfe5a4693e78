"""scenarios.py: what a conversation is set in: the personas, the contexts, the simulated users.

    load_personas(path, set_name) -> PersonaSet      the agents of one scenario (personas.json)
    load_contexts(path, set_name) -> list[Context]   situations and openings (data/contexts.jsonl)
    split_contexts(contexts, ...) -> (train, held_out), stratified by valence / meeting domain
    load_profiles(path)           -> {id: Profile}   Big Five simulated users (data/profiles.json)
    make_inputs(...)              -> Inputs          all of the above for one run, checked

The paper (arXiv 2601.14230) runs a team of companions with distinct personas on Empathetic
Dialogues and QMSum situations and simulates users with Big Five profiles; this file turns our
bundled files (or those datasets, read by plumbing/datasets.py) into those objects.

Where it sits: before everything else. mascot.py reads the personas, the contexts and the
profiles here once per command and splits the contexts into train and held-out sets; simulate.py
plays conversations from a Context with a PersonaSet and a Profile; both training stages use the
train contexts only, and the evaluation the held-out ones.

What it simplifies: the personas and profiles are small JSON files we wrote from the paper's
descriptions, not the paper's own prompts; the held-out split is a seeded stratified draw unless a
dataset brings official splits. Bad input raises `UserError`: one line naming the file, row or
field and the fix, since these are the files a user edits by hand.

    python mascot.py train --stage 1 --personas personas.json --data bundled   # what reads them
"""

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from plumbing.common import UserError, warn
from plumbing.files import json_type, jsonl_lines, read_json, resolve

HERE = Path(__file__).resolve().parent


# --- Personas (personas.json) -----------------------------------------------------------------
# ESConv's eight support strategies (Liu et al. 2021), as its annotators labelled every supporter
# turn; a support persona's card names the ones that are its job.
SUPPORT_STRATEGIES = [
    "Question",
    "Restatement or Paraphrasing",
    "Reflection of feelings",
    "Self-disclosure",
    "Affirmation and Reassurance",
    "Providing Suggestions",
    "Information",
    "Others",
]


@dataclass
class Persona:
    """One companion agent: the card its speaker prompt opens with (simulate.persona_card)."""

    name: str  # "Anchor"
    role: str  # "emotional validator"
    description: str  # what it does and never does
    style: str  # how it sounds
    examples: list[str]  # a few lines in its voice
    # Its job in ESConv's labels (SUPPORT_STRATEGIES); empty for the meeting set.
    esconv_strategies: list[str] = field(default_factory=list)


# How names and roles are compared: their lower-case words and numbers. Cards written in ASCII
# compare ASCII words, as they always have; cards in another script, letters of every script.
ASCII_WORDS, ALL_WORDS = r"[a-z0-9]+", r"[^\W_]+"
# The speaker labels simulate.py gives the person and the crisis guard (simulate.USER, SAFETY): an
# agent named so would read as the person speaking, or as a crisis stop.
RESERVED = ("User", "Safety")


def _words(text: str, pattern: str = ALL_WORDS) -> tuple[str, ...]:
    """The lower-case words and numbers of a text."""
    return tuple(re.findall(pattern, text.casefold()))


def _pattern(personas: list) -> str:
    """The word pattern of a roster: ASCII_WORDS when every name and role is ASCII."""
    return ASCII_WORDS if all((p.name + p.role).isascii() for p in personas) else ALL_WORDS


def _contains(haystack: tuple, needle: tuple) -> bool:
    """Is `needle` a run of consecutive words of `haystack`?"""
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


@dataclass
class PersonaSet:
    """The agents of one scenario and the vocabulary the director may use with them (its
    Action and Tone come from these lists, as in the paper's director prompt)."""

    name: str  # "support" | "meeting"
    description: str
    personas: list[Persona]
    strategies: list[str]  # the director's Action vocabulary
    tones: list[str]  # the director's Tone vocabulary

    def names(self) -> list[str]:
        """The agents' names in roster order (the order round-robin follows)."""
        return [p.name for p in self.personas]

    def find(self, name_or_role: str) -> Persona | None:
        """The persona a free-text mention refers to ("Anchor", "the action guide", "Validator"),
        or None if none or several fit. Tried in order: exact name, exact role, a name inside the
        phrase, the phrase inside a name or role; case and punctuation ignored."""
        w = _pattern(self.personas)
        query = _words(name_or_role, w)
        tests = [
            lambda p: _words(p.name, w) == query,
            lambda p: _words(p.role, w) == query,
            lambda p: _contains(query, _words(p.name, w)),
            lambda p: _contains(_words(p.name, w), query) or _contains(_words(p.role, w), query),
        ]
        for test in tests:
            hits = [p for p in self.personas if test(p)]
            if hits:
                return hits[0] if len(hits) == 1 else None  # ambiguous: no weaker rule may guess
        return None


def _need(obj: dict, key: str, where: str, many: bool = False, limit: int = 2000):
    """A non-empty string field (or a non-empty list of at most 20), at most `limit` characters
    each: a runaway field would crowd out the rest of every prompt it goes into."""
    value = obj.get(key)
    if not many:
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        items = [None]  # not a list: fails the check below
    if (
        not items
        or len(items) > 20
        or not all(isinstance(v, str) and v.strip() and len(v) <= limit for v in items)
    ):
        what = "a list of at most 20 non-empty strings" if many else "a non-empty string"
        got = json_type(value) if key in obj else "nothing"
        raise UserError(
            f"{where}: field '{key}' must be {what} of at most {limit} characters (got {got})"
        )
    if many:
        return [v.strip() for v in items]
    return value.strip()


def persona_sets(path: str | Path = "personas.json") -> dict:
    """The raw persona sets of a personas file, {set name: set}, in file order."""
    if not resolve(path).is_file():
        raise UserError(
            f"{path}: personas file not found; pass --personas a personas JSON file "
            "(the repo ships personas.json)"
        )
    sets = read_json(resolve(path))
    if not isinstance(sets, dict):
        raise UserError(
            f"{path}: the top level is {json_type(sets)}; it must map set names to persona sets"
        )
    return sets


def load_personas(path: str | Path = "personas.json", set_name: str = "support") -> PersonaSet:
    """Read and validate one persona set; every problem is a UserError naming set, persona and
    field."""
    sets = persona_sets(path)
    if set_name not in sets:
        raise UserError(
            f"{resolve(path)}: no persona set '{set_name}'; available: {', '.join(sets) or 'none'}"
        )
    raw = sets[set_name]
    where = f"{resolve(path)}: set '{set_name}'"
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("personas"), list)
        or not raw["personas"]
    ):
        raise UserError(
            f"{where} must be an object with description, a non-empty personas list, "
            "strategies, tones"
        )
    personas = [
        persona_row(item, f"{where} persona #{i}") for i, item in enumerate(raw["personas"], 1)
    ]
    seen = {}  # a name's words -> its persona number: PersonaSet.find must tell every name apart
    for i, p in enumerate(personas, start=1):
        j = seen.setdefault(_words(p.name, _pattern(personas)), i)
        if j != i:
            raise UserError(
                f"{where}: personas #{j} and #{i} are named {personas[j - 1].name!r} and "
                f"{p.name!r}, one name but for case, spacing or punctuation; rename one"
            )
    return PersonaSet(
        set_name,
        _need(raw, "description", where),
        personas,
        _need(raw, "strategies", where, True),
        _need(raw, "tones", where, True),
    )


def persona_row(item, here: str) -> Persona:
    """One persona of a personas file, checked; `here` names it in every error."""
    if not isinstance(item, dict):
        raise UserError(f"{here} is {json_type(item)}; each persona must be an object")
    card = [_need(item, k, here) for k in ("name", "role", "description", "style")]
    examples = _need(item, "examples", here, many=True)
    strategies = []  # optional: only the support set maps its personas onto ESConv's labels
    if "esconv_strategies" in item:
        strategies = _need(item, "esconv_strategies", here, many=True)
    p = Persona(*card, examples, strategies)
    unknown = set(p.esconv_strategies) - set(SUPPORT_STRATEGIES)
    if unknown:
        raise UserError(
            f"{here}: esconv_strategies {sorted(unknown)} "
            f"are not ESConv's; use {', '.join(SUPPORT_STRATEGIES)}"
        )
    # One line of plain characters: a newline in a name could spoof a line of the director's output.
    if not re.fullmatch(r"[\w][\w .'-]{0,39}", p.name) or not _words(p.name):
        raise UserError(
            f"{here}: name {p.name!r} must be one line of at most 40 letters, digits, spaces, . ' -"
            " with a letter or digit"
        )
    if _words(p.name) in map(_words, RESERVED):  # simulate.py's labels of the person, the guard
        raise UserError(
            f"{here}: name {p.name!r} is reserved for the person's or the guard's turns"
        )
    return p


# --- Contexts: the situations conversations start from, from our file or the paper's datasets ---
@dataclass
class Context:
    """Where a conversation starts: a situation and the user's first message to the group."""

    id: str
    persona_set: str  # "support" | "meeting"
    situation: str  # what happened / what the meeting is about
    first_message: str  # the user's opening message to the group
    emotion: str = ""  # ED / ESConv emotion label
    valence: str = ""  # "positive" | "negative" | "ambiguous" (support contexts)
    domain: str = ""  # "Academic" | "Committee" | "Product" (meeting contexts)
    source: str = ""  # "bundled" | "empathetic_dialogues" | "esconv" | "qmsum"
    # The recorded conversation from first_message on: [{"speaker": "user" | "supporter" |
    # "participant", "text", "strategy"?: ESConv's label}]; empty when the source has only openings.
    turns: list[dict] = field(default_factory=list)


def context_row(row: dict) -> Context:
    """One line of a contexts file in our format (data/contexts.jsonl; plumbing/datasets.py reads
    the public datasets into it too): id, set, situation, first_message, and optionally emotion,
    valence, domain, source and turns."""
    if row.get("set") not in ("support", "meeting"):
        raise UserError('\'set\' must be "support" or "meeting"')
    if (row.get("valence") or "") not in ("", "positive", "negative", "ambiguous"):
        raise UserError("'valence' must be positive, negative or ambiguous")
    turns = row.get("turns") or []
    if not isinstance(turns, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("text"), str)
        and t.get("speaker") in ("user", "supporter", "participant")
        for t in turns
    ):
        raise UserError("'turns' must be a list of {speaker: user|supporter|participant, text}")
    # 20,000 characters: a meeting transcript's situation is long, but not without bound.
    required = [_need(row, k, "this row", limit=20_000) for k in ("id", "set", "situation")]
    first_message = _need(row, "first_message", "this row", limit=20_000)
    return Context(
        *required,
        first_message,
        str(row.get("emotion") or ""),
        row.get("valence") or "",
        str(row.get("domain") or ""),
        str(row.get("source") or "bundled"),
        turns,
    )


def is_contexts_file(spec: str) -> bool:
    """Is --data "bundled" or a JSON-lines file in our format (its first object has
    first_message)? Anything else is a public dataset for plumbing/datasets.py to read."""
    path = Path(spec).expanduser()
    first = {}
    if path.suffix == ".jsonl" and path.is_file():
        first = next((v for _, v, _ in jsonl_lines(path) if isinstance(v, dict)), {})
    return spec == "bundled" or {"first_message", "set"} <= set(first)


def contexts_path(spec: str) -> Path:
    """The file --data names: "bundled" is the repo's own data/contexts.jsonl."""
    if spec == "bundled":
        return HERE / "data" / "contexts.jsonl"
    return Path(spec).expanduser()


def load_contexts(spec: str = "bundled", persona_set: str = "support") -> list[Context]:
    """The contexts of one persona set from a file in our format; a malformed row is skipped with
    a warning naming its line, a file without any usable row is an error."""
    path = contexts_path(spec)
    contexts = []
    skipped = 0
    for number, row, error in jsonl_lines(path):
        try:
            if error or not isinstance(row, dict):
                raise UserError(f"not a JSON object ({error or json_type(row)})")
            contexts.append(context_row(row))
        except UserError as e:
            skipped += 1
            warn(f"{path}: skipping line {number}: {e}")
    mine = [c for c in contexts if c.persona_set == persona_set]
    if not mine:
        raise UserError(
            f"{path}: no usable '{persona_set}' contexts ({skipped} malformed rows); "
            "check --data and --set"
        )
    return mine


def split_contexts(
    contexts: list[Context], held_out: float = 0.25, seed: int = 0
) -> tuple[list, list]:
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
        # A generator per slice: adding contexts to one slice never reshuffles another.
        rng = random.Random(f"{seed}/{name}")
        held.update(rng.sample(members, n))
    train = [c for i, c in enumerate(contexts) if i not in held]
    held_out_contexts = [c for i, c in enumerate(contexts) if i in held]
    return train, held_out_contexts


# --- Big Five simulated-user profiles (data/profiles.json) ------------------------------------
# The paper's simulated users differ in one Big Five trait (Goldberg 1990), set high or low, the
# others average; the profiles file gives a text per trait and level, and the profiles as levels.
BIG_FIVE = ("openness", "conscientiousness", "extraversion", "agreeableness", "neuroticism")
LEVELS = ("high", "low", "average")


@dataclass
class Profile:
    """One simulated user's personality, as its prompt states it (simulate.user_messages)."""

    id: str  # "average", "openness-high", ...
    levels: dict[str, str]  # trait -> "high" | "low" | "average"
    description: str  # the five trait texts joined: the simulated user's personality prompt

    def trait(self) -> str:
        """The trait this profile sets high or low; "average" when none, "mixed" when several."""
        moved = [t for t, level in self.levels.items() if level != "average"]
        if not moved:
            return "average"
        if len(moved) == 1:
            return moved[0]
        return "mixed"


def load_profiles(path: str | Path = "data/profiles.json") -> dict[str, Profile]:
    """{id: Profile}: the paper's ten one-trait-high-or-low users plus our all-average one."""
    path = resolve(path)
    raw = read_json(path)
    traits = None
    if isinstance(raw, dict):
        traits = raw.get("traits")
    if (
        not isinstance(traits, dict)
        or sorted(traits) != sorted(BIG_FIVE)
        or not all(isinstance(traits[t], dict) for t in BIG_FIVE)
    ):
        raise UserError(
            f'{path}: "traits" must map each of {", ".join(BIG_FIVE)} to its high/low/average texts'
        )
    texts = {}  # trait -> level -> the sentence that describes it
    for t in BIG_FIVE:
        texts[t] = {lv: _need(traits[t], lv, f"{path}: trait '{t}'") for lv in LEVELS}
    profiles: dict[str, Profile] = {}
    for i, entry in enumerate(raw.get("profiles") or [], start=1):
        levels = None
        if isinstance(entry, dict):
            levels = entry.get("levels")
        if (
            not isinstance(levels, dict)
            or sorted(levels) != sorted(BIG_FIVE)
            or any(levels[t] not in LEVELS for t in BIG_FIVE)
            or not isinstance(entry.get("id"), str)
            or entry["id"] in profiles
        ):
            raise UserError(
                f'{path}: profile #{i} needs a unique id and "levels" giving each trait '
                "high/low/average"
            )
        # The personality prompt: the five traits' sentences at this profile's levels, in order.
        description = " ".join(texts[t][levels[t]] for t in BIG_FIVE)
        profiles[entry["id"]] = Profile(entry["id"], {t: levels[t] for t in BIG_FIVE}, description)
    if not profiles:
        raise UserError(f'{path}: "profiles" must be a non-empty list of {{id, levels}} objects')
    return profiles


# --- One run's inputs, checked against the stages it builds on --------------------------------
class Inputs(NamedTuple):
    """Everything a command reads before it runs a model: checked once, used by every stage."""

    personas: PersonaSet
    train: list[Context]  # contexts training may use
    held_out: list[Context]  # contexts only the before/after checks and the evaluation see
    profiles: dict[str, Profile]  # Big Five profile id -> profile
    split: str  # how train and held_out were chosen, for the results


# The settings that decide which contexts are held out. A later command on the same run folder
# must use the same values, or contexts one stage trained on could be another stage's held-out set.
SPLIT_SETTINGS = ("set", "seed", "held_out")


def make_inputs(
    personas: PersonaSet,
    splits: dict[str, list[Context]],
    held_out: float,
    seed: int,
    profiles: dict[str, Profile],
    config: dict,
    earlier: list[Path] = (),
) -> Inputs:
    """The run's train / held-out contexts: `splits` {"train", "test"/"valid"} of official splits
    (used as the paper does), else {"all"} (split at random here). `earlier`: the config.json of
    the stages this builds on; made on the same data (same_data), they must agree on
    SPLIT_SETTINGS."""
    for path in earlier:
        check_same_split(path, config)
    if "train" in splits and len(splits) > 1:
        held_name = "test" if "test" in splits else "valid"
        train = splits["train"]
        held = splits[held_name]
        how = (
            f"official splits: training uses 'train' ({len(train)}), "
            f"evaluation '{held_name}' ({len(held)})"
        )
    else:
        contexts = []  # every part, in order: the split is ours to make
        for part in splits.values():
            contexts.extend(part)
        train, held = split_contexts(contexts, held_out, seed)
        how = f"random split, held-out fraction {held_out}"
        if not held or not train:
            raise UserError(
                f"--held-out {held_out}: {len(held)} held-out and {len(train)} training "
                f"contexts of {len(contexts)}; need at least one of each"
            )
    return Inputs(personas, train, held, profiles, how)


def check_same_split(path, config: dict) -> None:
    """A UserError unless the stage whose config.json is at `path` held out the same contexts:
    made on the same data, under any path (same_data), it must agree on every SPLIT_SETTINGS
    value."""
    old = {}
    if Path(path).is_file():
        old = read_json(path)
    if old.get("data") is None:
        return
    if not same_data(contexts_path(old["data"]), contexts_path(config["data"])):
        return  # other data: another split, nothing to compare
    for key in SPLIT_SETTINGS:
        if key in old and old[key] != config[key]:
            flag = "--" + key.replace("_", "-")
            raise UserError(
                f"{flag} {config[key]}: {path} was made with {flag} {old[key]}, so the contexts "
                f"it trained on would be held out here; use {flag} {old[key]} or a new --run "
                "folder"
            )


def same_data(old: Path, new: Path) -> bool:
    """Are these the same contexts: one path, or the same bytes under another (a copy)? A file
    that is gone cannot be compared, so it counts as the same (a split setting must then agree)."""
    if not old.exists() or old.resolve() == new.resolve():
        return True
    return new.exists() and _contents(old) == _contents(new)


def _contents(path: Path) -> list:
    """The data file's bytes, or every file of a data folder as (its path in it, its bytes)."""
    found = sorted(path.rglob("*")) if path.is_dir() else [path]
    return [(f.relative_to(path), f.read_bytes()) for f in found if f.is_file()]


def classifier_halves(train, seed: int) -> tuple[list, list]:
    """The training dialogues halved, by dialogue, between the judge's classifier and the
    evaluator's (extras/strategies.py), so that the two learn from disjoint dialogues. Anything
    else that learns from ESConv (the speakers' warm start, warmstart.py) keeps to the judge's
    half."""
    ids = sorted({c.id for c in train})
    judge_ids = set(random.Random(seed).sample(ids, len(ids) // 2))
    judge_half = [c for c in train if c.id in judge_ids]
    evaluator_half = [c for c in train if c.id not in judge_ids]
    return judge_half, evaluator_half


def require_mapping(personas, flag: str = "--director-warmup-data") -> None:
    """A UserError unless some persona maps onto ESConv's strategies: whatever learns from
    ESConv's labels (the warm starts, the strategy classifiers) needs that mapping."""
    if not any(p.esconv_strategies for p in personas.personas):
        raise UserError(
            f"{flag}: no persona of the '{personas.name}' set lists esconv_strategies; "
            "use --set support or cards that do"
        )
