"""data.py: everything mascot reads from disk except the models.

Every stage of MASCOT starts from the same three inputs, and they all come through here:

    load_personas(path, set_name)  -> PersonaSet      the agents of one scenario (personas.json)
    load_contexts(spec, ...)       -> list[Context]   situations + opening messages to talk about
    split_contexts(contexts, ...)  -> (train, held_out), stratified by valence / meeting domain
    load_profiles(path, ids)       -> list[Profile]   Big Five simulated users (data/profiles.json)
    read_jsonl / append_jsonl                         the JSON-lines files every stage writes

`load_contexts` reads our bundled data/contexts.jsonl or one of the public datasets the paper uses,
in its official release format: Empathetic Dialogues (train/valid/test.csv), ESConv (ESConv.json or
the JSON-lines split), QMSum (a folder of meeting JSON files), plus the trimmed copies kept in
../shared/datasets. All of them become the same `Context`, so nothing downstream knows the source.
Simplification vs the paper: we use only the situation, the emotion / domain, the opening message
and (where the dataset has them) the recorded later turns; retrieval or summaries are not used.

Bad input never produces a traceback: it raises `UserError` with one line naming the file, row or
field and the fix, and mascot.py prints it as `error: ...`. Malformed rows inside a dataset are
skipped with a warning on stderr and a count, because public dumps always have a few.

Run it on its own to check that a dataset is read the way you expect:

    python data.py                                          # the bundled contexts
    python data.py ../shared/datasets/esconv/train.jsonl    # any supported file or folder
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent


class UserError(Exception):
    """Bad user input (a file, a row, a flag). The message is one line: what is wrong and the fix."""


def warn(message: str) -> None:
    """Warnings go to stderr so they never mix with results printed on stdout."""
    print(f"warning: {message}", file=sys.stderr)


def positive_int(flag: str, minimum: int = 1):
    """An argparse `type=` that accepts whole numbers >= minimum and names `flag` otherwise.

    argparse turns the ArgumentTypeError into one line `error: argument --x: ...` and exit 2.
    """
    import argparse

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be >= {minimum}, got {value}")
        return value
    return parse


def fraction(flag: str):
    """An argparse `type=` for a share in [0, 1)."""
    import argparse

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a number, got {text!r}") from None
        if not 0.0 <= value < 1.0:
            raise argparse.ArgumentTypeError(f"{flag} must be in [0, 1), got {value}")
        return value
    return parse


# ----------------------------------------------------------------------------------------------
# Reading files: text, JSON, JSON lines
# ----------------------------------------------------------------------------------------------

def _resolve(path: str | Path) -> Path:
    """A relative path is looked up in the working directory first, then beside this file,
    so `python /somewhere/mascot/mascot.py` still finds the shipped personas.json."""
    path = Path(path).expanduser()
    if path.is_absolute() or path.exists() or not (HERE / path).exists():
        return path
    return HERE / path


def _read_text(path: Path) -> str:
    """The whole file as text. utf-8-sig also accepts the byte-order mark some editors write."""
    if not path.is_file():
        raise UserError(f"{path}: no such file; check the path")
    try:
        return path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (bad byte at offset {e.start}); "
                        "re-save the file as UTF-8") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); check its permissions") from None


def _read_json(path: Path) -> object:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}); "
                        "fix the syntax there") from None


def _json_type(value: object) -> str:
    """Name a parsed value the way the JSON file spells it, for error messages."""
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "text", int: "a number", float: "a number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _jsonl_lines(path: Path) -> list[tuple[int, object, str]]:
    """Parse every non-blank line: (line number, value or None, JSON error message or "").

    We split on "\\n" only: str.splitlines() would also split on U+2028, which json.dumps writes
    unescaped inside strings when ensure_ascii=False.
    """
    rows = []
    for number, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        try:
            rows.append((number, json.loads(line), ""))
        except json.JSONDecodeError as e:
            rows.append((number, None, e.msg))
    return rows


def read_jsonl(path: str | Path) -> list[dict]:
    """All records of a JSON-lines file, one object per line.

    An unreadable LAST line is ignored with a warning: it is what a crash in the middle of
    append_jsonl leaves behind, and a resumable run (the judge cache) must survive it. An
    unreadable line anywhere else is real damage and raises UserError.
    """
    path = Path(path)
    rows = _jsonl_lines(path)
    records = []
    for i, (number, value, error) in enumerate(rows):
        if error and i == len(rows) - 1:
            warn(f"{path}: ignoring line {number}, cut off mid-write ({error})")
            break
        if error or not isinstance(value, dict):
            problem = error or f"it holds {_json_type(value)}, not an object"
            raise UserError(f"{path}: line {number} is not a JSON object ({problem}); "
                            "fix or delete that line")
        records.append(value)
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


# ----------------------------------------------------------------------------------------------
# Personas (personas.json, schema in notes/CONVENTIONS.md)
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
               else f"{_json_type(value)}, not text")
    raise UserError(f"{where}: field '{key}' is {problem}; give it a non-empty string")


def _need_text_list(obj: dict, key: str, where: str) -> list[str]:
    value = obj.get(key)
    if key not in obj or not isinstance(value, list) or not value:
        problem = ("missing" if key not in obj else "an empty list" if isinstance(value, list)
                   else f"{_json_type(value)}, not a list")
        raise UserError(f"{where}: field '{key}' is {problem}; give it a list of strings")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise UserError(f"{where}: '{key}' item {i + 1} is {_json_type(item)} or empty; "
                            "every item must be a non-empty string")
    return [item.strip() for item in value]


def _read_persona_file(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: personas file not found; pass the path of a personas JSON file "
                        "(the repo ships personas.json)")
    sets = _read_json(path)
    if not isinstance(sets, dict):
        raise UserError(f"{path}: the top level is {_json_type(sets)}; it must be an object "
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
        raise UserError(f"{where} is {_json_type(raw)}; it must be an object with "
                        "description, personas, strategies and tones")
    people = raw.get("personas")
    if not isinstance(people, list) or not people:
        raise UserError(f"{where} has no personas; put a non-empty list under \"personas\"")
    personas, seen = [], {}
    for i, item in enumerate(people, start=1):
        name = item.get("name") if isinstance(item, dict) else None
        here = f"{where} persona #{i}" + (f" ({name})" if isinstance(name, str) and name else "")
        if not isinstance(item, dict):
            raise UserError(f"{here} is {_json_type(item)}; each persona must be an object")
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
    # the opening (bundled contexts, the shared ED copies). Later-turn states are built from it.
    turns: list[dict] = field(default_factory=list)


# The default polarity mapping of the 32 ED emotions (../shared/datasets/README.md; the same as
# HypEmo's label tree). The paper splits ED by valence into positive / negative / neutral subsets.
POSITIVE_EMOTIONS = frozenset("sentimental anticipating caring faithful grateful impressed trusting "
                              "prepared confident content excited hopeful proud joyful".split())
AMBIGUOUS_EMOTIONS = frozenset({"surprised"})
NEGATIVE_EMOTIONS = frozenset("afraid angry annoyed anxious apprehensive ashamed devastated "
                              "disappointed disgusted embarrassed furious guilty jealous lonely "
                              "nostalgic sad terrified".split())
VALENCES = ("positive", "negative", "ambiguous")
DOMAINS = ("Academic", "Committee", "Product")   # QMSum's three meeting domains
MAX_MEETING_TURNS = 40       # a meeting transcript has hundreds of turns; later states need few
MAX_SKIP_WARNINGS = 5        # name the first few malformed rows, then only count them


def emotion_valence(emotion: str, fallback: str = "") -> str:
    """Valence of an ED emotion label; `fallback` (a file's own polarity field) for other labels."""
    emotion = emotion.strip().lower()
    if emotion in POSITIVE_EMOTIONS:
        return "positive"
    if emotion in NEGATIVE_EMOTIONS:
        return "negative"
    if emotion in AMBIGUOUS_EMOTIONS:
        return "ambiguous"
    fallback = fallback.strip().lower()
    if fallback in ("neutral", "neutral-ambiguous"):   # spellings used by the published mappings
        return "ambiguous"
    return fallback if fallback in VALENCES else ""


def _domain(name: object) -> str:
    """Canonical QMSum domain ("academic" -> "Academic"), or "" for anything else."""
    return next((d for d in DOMAINS if isinstance(name, str) and name.strip().lower() == d.lower()), "")


class _BadRow(Exception):
    """A dataset row we skip; the message says what is wrong with it."""


class _Skips:
    """Counts the malformed rows of one file: names the first few, then reports the total."""

    def __init__(self, path: Path, unit: str = "row"):
        self.path, self.unit, self.count = path, unit, 0

    def skip(self, where: object, reason: str) -> None:
        self.count += 1
        if self.count <= MAX_SKIP_WARNINGS:
            warn(f"{self.path}: skipping {self.unit} {where}: {reason}")

    def report(self) -> None:
        if self.count:
            warn(f"skipped {self.count} malformed {self.unit}{'s' * (self.count > 1)} in {self.path}")


def _field(row: object, key: str) -> str:
    """A required non-empty text field of a dataset row, else _BadRow."""
    value = row.get(key) if isinstance(row, dict) else None
    if not isinstance(value, str) or not value.strip():
        raise _BadRow(f"field '{key}' is missing or empty")
    return value.strip()


def _ed_text(text: str) -> str:
    """ED's CSV writes commas inside text as `_comma_` (its own field separator is the comma)."""
    return text.replace("_comma_", ",").strip()


# --- Empathetic Dialogues, official CSV ---------------------------------------------------------

ED_COLUMNS = ["conv_id", "utterance_idx", "context", "prompt", "speaker_idx", "utterance",
              "selfeval", "tags"]


def _load_ed_csv(path: Path) -> list[Context]:
    """One Context per conv_id. Columns: `context` is the emotion, `prompt` the situation."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    header = [h.strip() for h in next(reader, [])]
    if header[:6] != ED_COLUMNS[:6]:
        raise UserError(f"{path}: not an Empathetic Dialogues CSV; expected the header "
                        f"{','.join(ED_COLUMNS)}")
    conversations: dict[str, dict] = {}    # conv_id -> meta + utterances, in file order
    skips = _Skips(path)
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        # Some releases have a few lines with stray commas: the columns after them are shifted,
        # so no field of that row can be trusted. We drop the row (one utterance), not the file.
        if not 6 <= len(row) <= len(ED_COLUMNS):
            skips.skip(reader.line_num, f"{len(row)} fields, expected {len(ED_COLUMNS)}")
            continue
        conv_id, index, emotion, prompt, speaker, utterance = (cell.strip() for cell in row[:6])
        if not (conv_id and index.isdigit() and emotion and speaker and utterance):
            skips.skip(reader.line_num, "empty conv_id/context/speaker_idx/utterance or bad utterance_idx")
            continue
        conv = conversations.setdefault(conv_id, {"emotion": emotion, "prompt": prompt, "utts": []})
        conv["utts"].append((int(index), speaker, _ed_text(utterance)))
    skips.report()
    contexts = []
    for conv_id, conv in conversations.items():
        utts = sorted(conv["utts"])
        first_speaker = utts[0][1]   # the speaker who describes the situation: our user
        turns = [{"speaker": "user" if who == first_speaker else "supporter", "text": text}
                 for _, who, text in utts]
        contexts.append(Context(id=conv_id, persona_set="support",
                                situation=_ed_text(conv["prompt"]) or turns[0]["text"],
                                first_message=turns[0]["text"], emotion=conv["emotion"],
                                valence=emotion_valence(conv["emotion"]),
                                source="empathetic_dialogues", turns=turns))
    if not contexts:
        raise UserError(f"{path}: no usable rows; expected Empathetic Dialogues rows of "
                        f"{','.join(ED_COLUMNS)}")
    return contexts


# --- Empathetic Dialogues, the shared JSON-lines copies -----------------------------------------

def _ed_jsonl_row(row: dict, number: int, path: Path) -> Context:
    """valid_contexts.jsonl: {conv_id, emotion, polarity, situation, first_utterance, num_turns};
    train_situations.jsonl: the same keys with conv_id and first_utterance null."""
    emotion, situation = _field(row, "emotion"), _ed_text(_field(row, "situation"))
    opening = row.get("first_utterance")
    # train_situations.jsonl has no utterances (ED's train utterances were not obtainable), so
    # the situation, which the speaker wrote in the first person, doubles as the opening message.
    first = _ed_text(opening) if isinstance(opening, str) and opening.strip() else situation
    conv_id = row.get("conv_id")
    return Context(id=conv_id if isinstance(conv_id, str) and conv_id else f"{path.stem}-{number}",
                   persona_set="support", situation=situation, first_message=first,
                   emotion=emotion, valence=emotion_valence(emotion, str(row.get("polarity") or "")),
                   source="empathetic_dialogues")


# --- ESConv: the official ESConv.json array and the JSON-lines split ----------------------------

_ESCONV_SPEAKERS = {"usr": "user", "seeker": "user", "sys": "supporter", "supporter": "supporter"}


def _esconv_row(row: dict, number: int, path: Path) -> Context:
    """ESConv.json turns: {speaker: seeker|supporter, content, annotation: {strategy}};
    the JSON-lines split: {speaker: usr|sys, text, strategy}."""
    situation, emotion = _field(row, "situation"), _field(row, "emotion_type")
    dialog = row.get("dialog")
    if not isinstance(dialog, list) or not dialog:
        raise _BadRow("'dialog' is missing or empty")
    turns = []
    for turn in dialog:
        turn = turn if isinstance(turn, dict) else {}
        speaker = _ESCONV_SPEAKERS.get(str(turn.get("speaker", "")).lower())
        text = turn.get("text", turn.get("content"))
        if speaker is None or not isinstance(text, str):
            raise _BadRow("a dialog turn lacks a usr/sys speaker or its text")
        if not text.strip():
            continue   # a few turns are empty strings; they carry nothing
        entry = {"speaker": speaker, "text": text.strip()}
        annotation = turn.get("annotation") if isinstance(turn.get("annotation"), dict) else {}
        strategy = turn.get("strategy") or annotation.get("strategy")
        if speaker == "supporter" and strategy:
            entry["strategy"] = strategy   # ESConv's support-strategy label, kept for reference
        turns.append(entry)
    # Over half the dialogs open with a supporter greeting; we start at the seeker's first turn so
    # that turns[0] is always first_message, as for every other source.
    start = next((i for i, t in enumerate(turns) if t["speaker"] == "user"), None)
    if start is None:
        raise _BadRow("the dialog has no seeker (usr) turn")
    return Context(id=f"esconv-{number}", persona_set="support", situation=situation,
                   first_message=turns[start]["text"], emotion=emotion,
                   valence="negative",   # ESConv is distress support: every seeker is struggling
                   source="esconv", turns=turns[start:])


# --- QMSum: per-meeting JSON files and the shared openings copy ---------------------------------

def _clean_transcript(text: str) -> str:
    """QMSum keeps the transcribers' markup: `{disfmarker}` where a speaker breaks off, other
    `{vocalsound}`-style tags, and tokenised spacing ("I 'll get it ."). Models should read
    ordinary text, so a break-off becomes "...", other tags go, and the spacing is re-joined.
    A turn with no word left (just "{vocalsound}") becomes ""."""
    text = re.sub(r"\{\w+\}", " ", text.replace("{disfmarker}", " ... "))
    text = " ".join(text.split())
    text = re.sub(r" ([.,?!;:]+)", r"\1", text)                 # "it ." -> "it."
    text = re.sub(r" '(s|re|m|ll|ve|d)\b", r"'\1", text)        # "I 'll" -> "I'll"
    return text if re.search(r"\w", text) else ""


def _meeting(meeting_id: str, topics: object, transcript: object, domain: str) -> Context:
    """Official meetings list topics as {topic, relevant_text_span}; the openings copy as text."""
    topics = topics if isinstance(topics, list) else []
    names = [t.get("topic") if isinstance(t, dict) else t for t in topics]
    names = [n.strip() for n in names if isinstance(n, str) and n.strip()]
    if not names:
        raise _BadRow("no topics in 'topic_list'")
    if not isinstance(transcript, list):
        raise _BadRow("the transcript is not a list of {speaker, content}")
    turns, chair = [], None
    for turn in transcript:
        content = turn.get("content") if isinstance(turn, dict) else None
        text = _clean_transcript(content) if isinstance(content, str) else ""
        if not text:
            continue   # pure markup ("{vocalsound}") or a broken entry: nothing was said
        chair = chair or turn.get("speaker")   # whoever speaks first plays the user (the chair)
        turns.append({"speaker": "user" if turn.get("speaker") == chair else "participant",
                      "text": text})
        if len(turns) == MAX_MEETING_TURNS:
            break
    if not turns:
        raise _BadRow("the transcript has no spoken turns")
    return Context(id=meeting_id, persona_set="meeting",
                   situation=f"A meeting covering: {'; '.join(names)}.",
                   first_message=turns[0]["text"], domain=domain, source="qmsum", turns=turns)


def _openings_row(row: dict, number: int, path: Path) -> Context:
    """train_openings.jsonl: {id, domain, topic_list: [str], first_turns: [{speaker, content}]}."""
    return _meeting(_field(row, "id"), row.get("topic_list"), row.get("first_turns"),
                    _domain(row.get("domain")))


def _domain_mapping(folder: Path) -> dict[str, str]:
    """Meeting id -> domain from any `*domains.json` in the folder or its parent (the shared copy
    keeps train_domains.json beside train/). The nearer file wins."""
    mapping: dict[str, str] = {}
    for place in (folder.parent, folder):
        for file in sorted(place.glob("*domains.json")):
            try:
                value = _read_json(file)
            except UserError as e:
                warn(f"ignoring the domain mapping: {e}")
                continue
            if isinstance(value, dict):
                mapping.update({k: _domain(v) for k, v in value.items() if _domain(v)})
    return mapping


def _folder_domain(file: Path) -> str:
    """The official release also groups meetings as data/{Academic,Committee,Product}/{split}/."""
    return next((_domain(part) for part in reversed(file.parent.parts) if _domain(part)), "")


def _load_meetings(folder: Path, meetings: list[tuple[Path, dict]], skips: _Skips) -> list[Context]:
    mapping = _domain_mapping(folder)
    by_id: dict[str, Context] = {}
    for file, meeting in meetings:
        try:
            context = _meeting(file.stem, meeting.get("topic_list"), meeting.get("meeting_transcripts"),
                               _folder_domain(file) or mapping.get(file.stem, ""))
        except _BadRow as e:
            skips.skip(file.name, str(e))
            continue
        # The official data/ALL/ and the per-domain folders hold the same meetings: keep one copy,
        # taking the domain from whichever copy knows it.
        kept = by_id.setdefault(context.id, context)
        kept.domain = kept.domain or context.domain
    skips.report()
    if not by_id:
        raise UserError(f"{folder}: no usable QMSum meetings; expected JSON files with "
                        "topic_list and meeting_transcripts")
    return list(by_id.values())


# --- Our bundled format (data/contexts.jsonl) ---------------------------------------------------

def _bundled_row(row: dict, number: int, path: Path) -> Context:
    persona_set = row.get("set") if isinstance(row, dict) else None
    if persona_set not in ("support", "meeting"):
        raise _BadRow("'set' must be \"support\" or \"meeting\"")
    valence = row.get("valence") or ""
    if valence not in ("",) + VALENCES:
        raise _BadRow(f"'valence' must be one of {', '.join(VALENCES)}")
    domain = row.get("domain") or ""
    if domain and not _domain(domain):
        raise _BadRow(f"'domain' must be one of {', '.join(DOMAINS)}")
    return Context(id=_field(row, "id"), persona_set=persona_set, situation=_field(row, "situation"),
                   first_message=_field(row, "first_message"), emotion=str(row.get("emotion") or ""),
                   valence=valence, domain=_domain(domain), source="bundled")


# --- Detecting the format and loading -----------------------------------------------------------

EXPECTED = ("'bundled', an Empathetic Dialogues CSV (train/valid/test.csv), ESConv.json or an "
            "ESConv .jsonl, a QMSum meeting folder, or a .jsonl in our bundled format")


def _jsonl_kind(keys: set[str]):
    """Pick the row parser from the keys of the first row."""
    if "dialog" in keys:
        return _esconv_row
    if "first_turns" in keys or "topic_list" in keys:
        return _openings_row
    if {"set", "first_message"} <= keys:
        return _bundled_row
    if {"emotion", "situation"} <= keys:
        return _ed_jsonl_row
    return None


def _load_rows(path: Path, rows: list[tuple[int, object, str]], parse) -> list[Context]:
    """Parse numbered rows with `parse`, skipping (and counting) the malformed ones."""
    contexts, skips = [], _Skips(path)
    for number, row, error in rows:
        try:
            if error or not isinstance(row, dict):
                raise _BadRow(f"not a JSON object ({error or _json_type(row)})")
            contexts.append(parse(row, number, path))
        except _BadRow as e:
            skips.skip(number, str(e))
    skips.report()
    if not contexts:
        raise UserError(f"{path}: no usable rows ({skips.count} malformed); expected {EXPECTED}")
    return contexts


def _load_file(path: Path) -> list[Context]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _load_ed_csv(path)
    if suffix == ".jsonl":
        rows = _jsonl_lines(path)
        first = next((row for _, row, _ in rows if isinstance(row, dict)), None)
        parse = _jsonl_kind(set(first)) if first is not None else None
        if parse is None:
            found = f"the first row has keys {sorted(first)}" if first is not None else "it has no JSON rows"
            raise UserError(f"{path}: unrecognised JSON-lines data ({found}); expected {EXPECTED}")
        return _load_rows(path, rows, parse)
    if suffix == ".json":
        value = _read_json(path)
        if isinstance(value, list):          # the official ESConv.json: one array of dialogs
            return _load_rows(path, [(i, row, "") for i, row in enumerate(value, 1)], _esconv_row)
        if isinstance(value, dict) and "meeting_transcripts" in value:   # one QMSum meeting
            return _load_meetings(path.parent, [(path, value)], _Skips(path, "file"))
    raise UserError(f"{path}: unrecognised data file; expected {EXPECTED}")


def _load_folder(folder: Path) -> list[Context]:
    """A folder is a QMSum release if it holds meeting files (at any depth: data/ALL/train/...).
    Otherwise it must hold exactly one data file, which is loaded as a file."""
    meetings, skips = [], _Skips(folder, "file")
    for file in sorted(folder.rglob("*.json")):
        if file.name.endswith("domains.json"):
            continue
        try:
            value = _read_json(file)
        except UserError as e:
            skips.skip(file.relative_to(folder), str(e))
            continue
        if isinstance(value, dict) and "meeting_transcripts" in value:
            meetings.append((file, value))
    if meetings:
        return _load_meetings(folder, meetings, skips)
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".csv", ".json", ".jsonl"))
    if len(files) == 1:
        return _load_file(files[0])
    listed = ", ".join(p.name for p in files) or "no data files"
    raise UserError(f"{folder}: folder holds {listed}; pass one file, or a folder of QMSum meetings")


def load_contexts(spec: str = "bundled", persona_set: str | None = None, limit: int | None = None,
                  repo_root: str | Path | None = None) -> list[Context]:
    """Contexts from `spec`: "bundled" (data/contexts.jsonl under repo_root, default this file's
    folder) or a dataset file/folder whose format is detected. `persona_set` keeps only "support"
    or "meeting" contexts; `limit` keeps the first N (file order, so a limit is reproducible)."""
    if persona_set not in (None, "support", "meeting"):
        raise UserError(f"persona set '{persona_set}': contexts exist only for 'support' and 'meeting'")
    if limit is not None and limit < 1:
        raise UserError(f"context limit {limit}: give a positive number of contexts")
    if spec == "bundled":
        path = Path(repo_root or HERE) / "data" / "contexts.jsonl"
    else:
        path = Path(spec).expanduser()
    if not path.exists():
        if spec == "bundled":
            raise UserError(f"{path}: the bundled contexts file is missing; restore "
                            "data/contexts.jsonl from the repo or pass a dataset path")
        raise UserError(f"{path}: no such file or folder; expected {EXPECTED}")
    contexts = _load_folder(path) if path.is_dir() else _load_file(path)
    if persona_set:
        found = sorted({c.persona_set for c in contexts})
        contexts = [c for c in contexts if c.persona_set == persona_set]
        if not contexts:
            raise UserError(f"{path}: holds only {'/'.join(found)} contexts, none for persona set "
                            f"'{persona_set}'; pick the matching persona set or another data source")
    return contexts[:limit] if limit else contexts


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
    raw = _read_json(path)
    if not isinstance(raw, dict):
        raise UserError(f"{path}: the top level is {_json_type(raw)}; it must be an object with "
                        "\"traits\" and \"profiles\"")
    traits = raw.get("traits")
    if not isinstance(traits, dict) or sorted(traits) != sorted(BIG_FIVE):
        raise UserError(f"{path}: \"traits\" must be an object with exactly the five traits "
                        f"{', '.join(BIG_FIVE)}")
    texts: dict[str, dict[str, str]] = {}
    for trait in BIG_FIVE:
        if not isinstance(traits[trait], dict):
            raise UserError(f"{path}: trait '{trait}' is {_json_type(traits[trait])}; it must be an "
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
            raise UserError(f"{where} is {_json_type(entry)}; each profile must be an object")
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
# python data.py [SPEC]: summarise a context source
# ----------------------------------------------------------------------------------------------

def main(argv: list[str]) -> int:
    spec = argv[0] if argv else "bundled"
    try:
        contexts = load_contexts(spec)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    slices = Counter(f"{c.persona_set}/{c.valence or c.domain or '-'}" for c in contexts)
    print(f"{len(contexts)} contexts from {spec} ({contexts[0].source})")
    print("  " + ", ".join(f"{k}: {n}" for k, n in sorted(slices.items())))
    first = contexts[0]
    print(f"first: id={first.id} emotion={first.emotion or '-'} domain={first.domain or '-'} "
          f"turns={len(first.turns)}\n  situation: {first.situation}\n  opening:   {first.first_message}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
