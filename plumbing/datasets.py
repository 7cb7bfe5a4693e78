"""plumbing/datasets.py: the public datasets the paper uses, in their official formats (skip on first reading).

It holds the readers of each release format and `read_data`, what --data goes through. MASCOT (arXiv 2601.14230)
trains and evaluates on Empathetic Dialogues (split by valence), QMSum meetings (Academic, Committee, Product) and
ESConv (held-out transfer). `load_splits(spec, set)` reads any of them into the bundled file's scenarios.Context, so
nothing downstream knows the source; `read_data` calls it for any --data not in our format:
    ED train/valid/test.csv          one Context per conv_id, with its turns
    ED JSON lines                    {conv_id, emotion, polarity, situation, first_utterance}
    ESConv.json / its JSON lines     one Context per dialogue, from the seeker's first turn
    a QMSum folder or meeting file   one Context per meeting, its first speaker as the user
    QMSum openings JSON lines        {id, domain, topic_list, first_turns}
A folder whose files or sub-folders are named by split (train.csv, valid.csv, train_*.jsonl, QMSum's data/ALL/test/)
gives {"train": ..., "test": ...}: training reads train, evaluation test (else valid); anything else gives {"all": ...}
for mascot.py to split at random. ED and ESConv (CC BY-NC 4.0) and QMSum (MIT) are not part of the project.
    python -m plumbing.datasets path/to/esconv/train.jsonl       # how a dataset reads
"""

import csv
import io
import json
import re
import sys
from collections import Counter
from pathlib import Path

from plumbing.common import UserError, warn
from plumbing.files import json_type, jsonl_lines, read_json, read_text
from scenarios import Context, context_row, contexts_path, is_contexts_file, load_contexts

POSITIVE = set(
    "sentimental anticipating caring faithful grateful impressed trusting prepared confident content "
    "excited hopeful proud joyful".split()
)  # ED's emotions by valence (HypEmo's label tree)
NEGATIVE = set(
    "afraid angry annoyed anxious apprehensive ashamed devastated disappointed disgusted embarrassed "
    "furious guilty jealous lonely nostalgic sad terrified".split()
)
DOMAINS = ("Academic", "Committee", "Product")
MAX_MEETING_TURNS = 40  # a meeting has hundreds of turns; the states need few
SPLITS = {
    "train": "train",
    "valid": "valid",
    "val": "valid",
    "dev": "valid",
    "validation": "valid",
    "test": "test",
}
EXPECTED = (
    "an Empathetic Dialogues CSV (train/valid/test.csv) or JSON-lines export, ESConv.json or an ESConv "
    ".jsonl, a QMSum meeting folder or openings .jsonl, or a contexts .jsonl in our format"
)


# ESConv's speakers, in its JSON (seeker, supporter) and JSON-lines (usr, sys) spellings.
ESCONV_SPEAKERS = {"usr": "user", "seeker": "user", "sys": "supporter", "supporter": "supporter"}


class BadRow(Exception):
    """A dataset row we skip; the message says what is wrong with it."""


def emotion_valence(emotion: str, fallback: str = "") -> str:
    """positive | negative | ambiguous for one of ED's emotions ("surprised" can be either); for
    any other, the row's own polarity (`fallback`, neutral read as ambiguous); "" if neither says."""
    e = emotion.strip().lower()
    f = fallback.strip().lower()
    if e in POSITIVE:
        return "positive"
    if e in NEGATIVE:
        return "negative"
    if e == "surprised":
        return "ambiguous"
    if f in ("neutral", "neutral-ambiguous"):
        return "ambiguous"
    if f in ("positive", "negative", "ambiguous"):
        return f
    return ""


def domain_of(name: object) -> str:
    """One of QMSum's DOMAINS spelt as we spell it, or "" (any case; not text: "")."""
    return next(
        (d for d in DOMAINS if isinstance(name, str) and name.strip().lower() == d.lower()), ""
    )


def field(row: dict, key: str) -> str:
    """A row's non-empty text field, stripped; a BadRow if it has none."""
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise BadRow(f"field '{key}' is missing or empty")
    return value.strip()


def ed_text(text: str) -> str:
    return text.replace("_comma_", ",").strip()  # ED's CSV spells commas inside text this way


def ed_row(row: dict) -> Context:
    """Without an utterance (train_situations.jsonl) the first-person situation doubles as the opening."""
    emotion = field(row, "emotion")
    situation = ed_text(field(row, "situation"))
    first = row.get("first_utterance")
    return Context(
        str(row.get("conv_id") or ""),
        "support",
        situation,
        ed_text(first) if isinstance(first, str) and first.strip() else situation,
        emotion,
        emotion_valence(emotion, str(row.get("polarity") or "")),
        source="empathetic_dialogues",
    )


def esconv_row(row: dict) -> Context:
    """ESConv.json turns {speaker: seeker|supporter, content, annotation: {strategy}} or JSON-lines {speaker: usr|sys,
    text, strategy}. Over half the dialogues open with a supporter greeting: turns[0] is the seeker's first turn."""
    situation = field(row, "situation")
    emotion = field(row, "emotion_type")
    dialog = row.get("dialog")
    if not isinstance(dialog, list) or not dialog:
        raise BadRow("'dialog' is missing or empty")
    turns = []
    for t in dialog:
        if not isinstance(t, dict):
            t = {}
        speaker = ESCONV_SPEAKERS.get(str(t.get("speaker", "")).lower())
        text = t.get("text", t.get("content"))
        if speaker is None or not isinstance(text, str):
            raise BadRow("a dialog turn lacks a usr/sys speaker or its text")
        annotation = t.get("annotation")
        if not isinstance(annotation, dict):
            annotation = {}
        strategy = t.get("strategy") or annotation.get("strategy")
        if text.strip():
            turn = {"speaker": speaker, "text": text.strip()}
            if strategy:
                turn["strategy"] = strategy
            turns.append(turn)
    start = next((i for i, t in enumerate(turns) if t["speaker"] == "user"), None)
    if start is None:
        raise BadRow("the dialog has no seeker turn")
    # ESConv is distress support: every seeker is struggling, so every context is negative.
    return Context(
        "",
        "support",
        situation,
        turns[start]["text"],
        emotion,
        "negative",
        source="esconv",
        turns=turns[start:],
    )


def clean_transcript(text: str) -> str:
    """QMSum's markup: {disfmarker} -> "...", other tags dropped, "I 'll get it ." re-joined; pure markup -> ""."""
    text = " ".join(re.sub(r"\{\w+\}", " ", text.replace("{disfmarker}", " ... ")).split())
    text = re.sub(r" '(s|re|m|ll|ve|d)\b", r"'\1", re.sub(r" ([.,?!;:]+)", r"\1", text))
    return text if re.search(r"\w", text) else ""


def meeting_row(meeting_id: str, topics: object, transcript: object, domain: str) -> Context:
    """A meeting's topics ({topic, ...} or text) and turns ({speaker, content}); the first speaker plays the user."""
    if not isinstance(topics, list):
        topics = []
    names = [t.get("topic") if isinstance(t, dict) else t for t in topics]
    names = [n.strip() for n in names if isinstance(n, str) and n.strip()]
    if not names or not isinstance(transcript, list):
        raise BadRow("no topics in 'topic_list', or the transcript is not a list")
    turns = []
    chair = None  # the first speaker: the one who plays the user
    for t in transcript:
        text = ""
        if isinstance(t, dict) and isinstance(t.get("content"), str):
            text = clean_transcript(t["content"])
        if text and len(turns) < MAX_MEETING_TURNS:
            chair = chair or t.get("speaker")
            turns.append(
                {"speaker": "user" if t.get("speaker") == chair else "participant", "text": text}
            )
    if not turns:
        raise BadRow("the transcript has no spoken turns")
    return Context(
        meeting_id,
        "meeting",
        f"A meeting covering: {'; '.join(names)}.",
        turns[0]["text"],
        domain=domain,
        source="qmsum",
        turns=turns,
    )


def our_row(row: dict) -> Context:
    """A row of our own contexts format (scenarios.context_row), its problems as a BadRow."""
    try:
        return context_row(row)
    except UserError as e:
        raise BadRow(str(e)) from None


def meeting_openings_row(r: dict) -> Context:
    """A JSON-lines row of a QMSum meeting's openings (id, topic_list, first_turns, domain)."""
    return meeting_row(
        field(r, "id"), r.get("topic_list"), r.get("first_turns"), domain_of(r.get("domain"))
    )


def row_kind(row: object):
    """Which parser reads a JSON-lines row, from its keys (None: none). A row with `set` or
    `first_message` is ours even when it lacks the other: a broken row of ours, not an ED row."""
    keys = set(row) if isinstance(row, dict) else set()
    return next(
        (
            parse
            for parse, needs in (
                (esconv_row, {"dialog"}),
                (meeting_openings_row, {"first_turns", "topic_list"}),
                (our_row, {"set"}),
                (our_row, {"first_message"}),
                (ed_row, {"emotion", "situation"}),
            )
            if needs <= keys
        ),
        None,
    )


# The formats row_kind tells apart, as an error names them.
FORMATS = {
    esconv_row: "an ESConv dialogue",
    meeting_openings_row: "a QMSum openings row",
    our_row: "a contexts row in our format",
    ed_row: "an Empathetic Dialogues row",
}


def file_format(path: Path, rows: list[tuple[int, object]]):
    """The one format (row_kind) of a JSON-lines file's rows, None if no row has one. A file that
    mixes formats (two files joined) is a UserError naming the first row of another format than
    the first row's: read as either, the other's rows would be lost row by row."""
    first = None  # (row number, format) of the first row with a format
    for number, row in rows:
        kind = row_kind(row)
        if kind is not None and first is None:
            first = (number, kind)
        elif kind is not None and kind is not first[1]:
            raise UserError(
                f"{path}: row {number} is {FORMATS[kind]} but row {first[0]} is "
                f"{FORMATS[first[1]]}; a data file holds one format: put each in its own file"
            )
    return first and first[1]


def parse_rows(path: Path, rows: list[tuple[int, object]], parse=None) -> list[Context]:
    """Parse numbered rows, skipping and counting bad ones, in `parse`'s format, else the one
    format of the rows (file_format)."""
    parse = parse or file_format(path, rows)
    if parse is None:
        raise UserError(f"{path}: unrecognised rows; expected {EXPECTED}")
    contexts = []
    skipped = 0
    for number, row in rows:
        try:
            if not isinstance(row, dict):
                raise BadRow(f"not a JSON object ({json_type(row)})")
            c = parse(row)
            if not c.id:  # rows without an id are named by their line
                c.id = f"esconv-{number}" if c.source == "esconv" else f"{path.stem}-{number}"
            contexts.append(c)
        except BadRow as e:
            skipped += 1
            if skipped <= 5:
                warn(f"{path}: skipping row {number}: {e}")
    if skipped:
        warn(f"skipped {skipped} malformed row(s) in {path}")
    if not contexts:
        raise UserError(f"{path}: no usable rows ({skipped} malformed); expected {EXPECTED}")
    return contexts


def load_ed_csv(path: Path) -> list[Context]:
    """ED's official CSV: one Context per conv_id; `context` is the emotion, `prompt` the situation."""
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    if [h.strip() for h in next(reader, [])][:6] != [
        "conv_id",
        "utterance_idx",
        "context",
        "prompt",
        "speaker_idx",
        "utterance",
    ]:
        raise UserError(
            f"{path}: not an Empathetic Dialogues CSV (conv_id,utterance_idx,context,prompt,...)"
        )
    convs = {}
    skipped = 0
    for row in reader:
        # A few release lines have stray commas that shift every column: drop the line, not the file.
        if (
            6 <= len(row) <= 8
            and all(c.strip() for c in row[:3] + row[4:6])
            and row[1].strip().isdecimal()
        ):
            conv = convs.setdefault(
                row[0].strip(), {"emotion": row[2].strip(), "prompt": row[3], "utts": []}
            )
            conv["utts"].append((int(row[1]), row[4].strip(), ed_text(row[5])))
        elif any(c.strip() for c in row):
            skipped += 1
    if skipped:
        warn(f"skipped {skipped} malformed row(s) in {path}")
    contexts = []
    for conv_id, conv in convs.items():
        utts = sorted(conv["utts"])
        turns = [
            {"speaker": "user" if who == utts[0][1] else "supporter", "text": t}
            for _, who, t in utts
        ]
        contexts.append(
            Context(
                conv_id,
                "support",
                ed_text(conv["prompt"]) or turns[0]["text"],
                turns[0]["text"],
                conv["emotion"],
                emotion_valence(conv["emotion"]),
                source="empathetic_dialogues",
                turns=turns,
            )
        )
    if not contexts:
        raise UserError(f"{path}: no usable Empathetic Dialogues rows")
    return contexts


def load_meetings(files: list[Path]) -> list[Context]:
    """QMSum meeting files, one per id (ALL/ and domain folders repeat them); domain: folder name or `*domains.json`."""
    by_id = {}
    mappings = {}  # folder -> {meeting id: domain} of the *domains.json files beside it
    for file in files:
        if file.parent not in mappings:
            mappings[file.parent] = domains_beside(file.parent)
        meeting = read_json(file)
        # A folder on the way named after a domain (QMSum's Academic/...) says it, else the mapping.
        domain = next((domain_of(p) for p in reversed(file.parent.parts) if domain_of(p)), "")
        domain = domain or mappings[file.parent].get(file.stem, "")
        try:
            c = meeting_row(
                file.stem, meeting.get("topic_list"), meeting.get("meeting_transcripts"), domain
            )
        except BadRow as e:
            warn(f"{file}: skipping this meeting: {e}")
            continue
        kept = by_id.setdefault(c.id, c)
        kept.domain = kept.domain or c.domain
    return list(by_id.values())


def domains_beside(folder: Path) -> dict[str, str]:
    """{meeting id: domain} of the `*domains.json` files in a folder's parent, then in the folder."""
    mapping = {}
    found = sorted(folder.parent.glob("*domains.json")) + sorted(folder.glob("*domains.json"))
    for path in found:
        value = read_json(path)
        if isinstance(value, dict):
            mapping.update({k: domain_of(v) for k, v in value.items()})
    return mapping


def load_file(path: Path) -> list[Context]:
    """One data file, its format told by its suffix and content (module docstring)."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_ed_csv(path)
    if suffix == ".jsonl":
        return parse_rows(path, [(n, v) for n, v, _ in jsonl_lines(path)])
    if suffix == ".json":
        value = read_json(path)
        if isinstance(value, list):  # the official ESConv.json: one array of dialogs
            return parse_rows(path, list(enumerate(value, 1)), esconv_row)
        if isinstance(value, dict) and "meeting_transcripts" in value:
            return load_meetings([path])
    raise UserError(f"{path}: unrecognised data file; expected {EXPECTED}")


def split_of(path: Path, root: Path) -> str | None:
    """The official split of a file by its name (train_*.jsonl, valid.csv) or a folder under `root` (data/ALL/test/)."""
    if m := re.match(r"(train|validation|valid|val|dev|test)(?:[_.\-]|$)", path.name.lower()):
        return SPLITS[m.group(1)]
    return next(
        (
            SPLITS[p.lower()]
            for p in reversed(path.relative_to(root).parent.parts)
            if p.lower() in SPLITS
        ),
        None,
    )


def load_splits(spec: str, persona_set: str) -> dict[str, list[Context]]:
    """{split: contexts} of `spec`, the persona set's only (module docstring)."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise UserError(f"{path}: no such file or folder; expected 'bundled', {EXPECTED}")
    if path.is_file():
        found = {"all": load_file(path)}
    else:
        found = folder_splits(path)
    for split, contexts in found.items():
        kept = {}
        for c in contexts:
            if c.persona_set == persona_set:
                kept.setdefault(c.id, c)  # one copy per id
        if not kept:
            raise UserError(
                f"{path}: no '{persona_set}' contexts in its {split} data; pick the matching --set"
            )
        found[split] = list(kept.values())
    return found


def folder_splits(path: Path) -> dict[str, list[Context]]:
    """{split: contexts} of a folder: its official splits by file or folder name, else {"all": ...}
    of its QMSum meetings or of its one data file."""
    files = sorted(
        p
        for p in path.rglob("*")
        if p.suffix.lower() in (".csv", ".json", ".jsonl") and not p.name.endswith("domains.json")
    )
    meetings = [f for f in files if f.suffix == ".json" and "meeting_transcripts" in read_text(f)]
    others = [f for f in files if f not in meetings and f.parent == path]
    if meetings:  # a damaged meeting file must not vanish without a word
        for f in files:
            if f.suffix == ".json" and f not in meetings:
                warn(f"{f}: not a QMSum meeting file (no meeting_transcripts); skipping it")
    named = {f: split_of(f, path) for f in meetings + others if split_of(f, path)}
    if named:
        found = {}
        for split in dict.fromkeys(named.values()):
            mine = [f for f, s in named.items() if s == split]
            contexts = load_meetings([f for f in mine if f in meetings])
            for f in mine:
                if f not in meetings:
                    contexts += load_file(f)
            found[split] = contexts
        return found
    if meetings:
        return {"all": load_meetings(meetings)}
    if len(others) == 1:
        return {"all": load_file(others[0])}
    raise UserError(
        f"{path}: the folder holds {', '.join(f.name for f in others) or 'no data files'}; "
        "pass one file, a folder of QMSum meetings, or a folder of official splits"
    )


def read_data(spec: str, set_name: str) -> dict[str, list]:
    """{split: contexts} for --data: our format through scenarios.load_contexts, the public datasets
    here. A number too long for Python to read (its 4300-digit limit) is a UserError naming its row."""
    try:
        if spec == "bundled":
            return {"all": load_contexts(spec, set_name)}
        if spec.endswith(".jsonl") and is_contexts_file(spec):
            path = Path(spec).expanduser()
            file_format(path, [(n, v) for n, v, _ in jsonl_lines(path)])  # ours alone
            return {"all": load_contexts(spec, set_name)}
        return load_splits(spec, set_name)
    except ValueError as err:  # json.loads raises it for such a number; bad JSON is a UserError
        raise long_number(contexts_path(spec), err) from None


def long_number(path: Path, err: ValueError) -> Exception:
    """The UserError naming the first line of the data (a file, or a folder's files) that holds a
    number of more than 4300 digits; `err` itself if none does (then it is a bug, not the data)."""
    for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
        data = file.is_file() and file.suffix.lower() in (".csv", ".json", ".jsonl")
        lines = read_text(file).split("\n") if data else []
        for number, line in enumerate(lines, start=1):
            if re.search(r"\d{4301}", line) and not readable_line(line):
                return UserError(
                    f"{file}: row {number} holds a number of more than 4300 digits, "
                    "more than a context needs or Python reads; fix or delete that row"
                )
    return err


def readable_line(line: str) -> bool:
    """Does one line parse as JSON by itself (its long digits inside a string)?"""
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def describe(spec: str) -> None:
    """Print how a dataset reads: per persona set and split, the contexts and the first one."""
    for set_name in ("support", "meeting"):
        try:
            for split, cs in load_splits(spec, set_name).items():
                counts = Counter(c.valence or c.domain or "-" for c in cs)
                print(
                    f"{set_name}/{split}: {len(cs)} contexts ({cs[0].source}); "
                    + ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
                    + f"\n  first: {cs[0].id}: "
                    + cs[0].first_message[:100]
                )
        except UserError as e:
            print(f"{set_name}: {e}")


if __name__ == "__main__":
    describe(sys.argv[1] if len(sys.argv) > 1 else "data/contexts.jsonl")
