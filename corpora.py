"""corpora.py: reading the public datasets the paper uses (and our bundled contexts) as `Context`s.

MASCOT (arXiv 2601.14230) trains and evaluates on Empathetic Dialogues (split by valence), QMSum
meetings (Academic / Committee / Product) and ESConv (held-out transfer). `load_contexts(spec)`
reads any of them in its official release format, detected from the file, and returns the same
`data.Context` for all, so nothing downstream knows the source:

    "bundled"                      our own data/contexts.jsonl (60 support + 12 meeting contexts)
    ED train/valid/test.csv        Empathetic Dialogues, one Context per conv_id, with its turns
    ED JSON lines                  {conv_id, emotion, polarity, situation, first_utterance}
    ESConv.json / ESConv JSON lines  one Context per dialogue, starting at the seeker's first turn
    a QMSum folder or meeting file   one Context per meeting, the first speaker as the user

Official splits (`load_splits`): when --data is a FOLDER that holds a dataset's official splits,
training uses train and evaluation uses test (valid when there is no test), instead of our random
held-out split. A split is recognised by name: files `train.csv / valid.csv / test.csv` (the ED
release), `train_*.jsonl`, `valid_*.jsonl`... (any data file whose name starts with train, valid,
val, dev or test), or QMSum's folders `.../train/`, `.../val/`, `.../test/` at any depth
(`data/ALL/test/*.json`, `data/Product/val/*.json`). A folder with only one split (the shared
ESConv copy holds only train.jsonl) falls back to the random split within it.

This file is reference material, not a chapter: read it when a dataset does not load the way you
expect. The datasets are not part of the project (licences: ED and ESConv CC BY-NC 4.0, QMSum MIT);
pass their path with --data.

    python corpora.py                               # the bundled contexts
    python corpora.py path/to/esconv/train.jsonl    # any supported file or folder
"""

from __future__ import annotations

import csv
import io
import re
import sys
from collections import Counter
from pathlib import Path

from data import HERE, Context, UserError, json_type, jsonl_lines, read_json, read_text, warn

# The default polarity mapping of the 32 ED emotions (the same as HypEmo's label tree). The paper
# splits ED by valence into positive / negative / neutral subsets.
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
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
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


# --- Empathetic Dialogues, JSON-lines exports ---------------------------------------------------

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


# --- QMSum: per-meeting JSON files and a JSON-lines openings export ------------------------------

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
    """Meeting id -> domain from any `*domains.json` in the folder or its parent (an export may
    keep train_domains.json beside train/). The nearer file wins."""
    mapping: dict[str, str] = {}
    for place in (folder.parent, folder):
        for file in sorted(place.glob("*domains.json")):
            try:
                value = read_json(file)
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
                raise _BadRow(f"not a JSON object ({error or json_type(row)})")
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
        rows = jsonl_lines(path)
        first = next((row for _, row, _ in rows if isinstance(row, dict)), None)
        parse = _jsonl_kind(set(first)) if first is not None else None
        if parse is None:
            found = f"the first row has keys {sorted(first)}" if first is not None else "it has no JSON rows"
            raise UserError(f"{path}: unrecognised JSON-lines data ({found}); expected {EXPECTED}")
        return _load_rows(path, rows, parse)
    if suffix == ".json":
        value = read_json(path)
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
            value = read_json(file)
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


SPLIT_NAMES = {"train": "train", "valid": "valid", "val": "valid", "dev": "valid", "validation": "valid",
               "test": "test"}
_SPLIT_FILE = re.compile(r"(train|valid|validation|val|dev|test)(?:[_.\-]|$)")


def load_splits(spec: str, persona_set: str | None = None) -> dict[str, list[Context]]:
    """{"train": [...], "valid": [...], "test": [...]}: the official splits a dataset folder holds,
    recognised by name (module docstring); {} when `spec` is not such a folder ('bundled', a file,
    a folder without split names). `persona_set` keeps only that set's contexts."""
    path = Path(spec).expanduser()
    if spec == "bundled" or not path.is_dir():
        return {}
    found: dict[str, list[Context]] = {}
    meetings: dict[str, list[tuple[Path, dict]]] = {}
    for file in sorted(path.rglob("*.json")):
        split = next((SPLIT_NAMES[p.lower()] for p in reversed(file.relative_to(path).parent.parts)
                      if p.lower() in SPLIT_NAMES), None)
        if split and not file.name.endswith("domains.json"):
            value = read_json(file)
            if isinstance(value, dict) and "meeting_transcripts" in value:
                meetings.setdefault(split, []).append((file, value))
    for split, files in meetings.items():
        found[split] = _load_meetings(path, files, _Skips(path / split, "file"))
    for file in sorted(p for p in path.iterdir() if p.suffix.lower() in (".csv", ".json", ".jsonl")):
        match = _SPLIT_FILE.match(file.name.lower())
        if match and not file.name.endswith("domains.json"):
            found.setdefault(SPLIT_NAMES[match.group(1)], []).extend(_load_file(file))
    for split, contexts in found.items():      # one copy per id (a meeting file and its opening)
        kept: dict[str, Context] = {}
        for c in contexts:
            if not persona_set or c.persona_set == persona_set:
                kept.setdefault(c.id, c)
        found[split] = list(kept.values())
    return {k: v for k, v in found.items() if v}


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


# ----------------------------------------------------------------------------------------------
# python corpora.py [SPEC]: summarise a context source
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
