"""plumbing/files.py: reading and writing the run folder safely (skip on first reading).

Every file a run writes goes through here: `read_jsonl`, `append_jsonl` (crash-safe: one fsynced line
per record), `write_json(l)` and `atomic_folder` (a temporary name, then a rename: a crash leaves the
old file or the new one, never half of one), `AnswerCache` (paid answers are never asked twice).
`asset` and `prompt` read the files we ship in data/.
"""

import errno
import hashlib
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from plumbing.common import UserError, warn

HERE = Path(__file__).resolve().parents[1]  # the repository root (data/ lives there)


# --- Files: text, JSON, JSON lines, atomic saves ----------------------------------------------
def resolve(path: str | Path) -> Path:
    """A relative path from the working directory, else beside this file (the shipped personas.json)."""
    path = Path(path).expanduser()
    if not path.is_absolute() and not path.exists() and (HERE / path).exists():
        return HERE / path
    return path


def read_text(path: str | Path) -> str:
    """A UTF-8 text file; a missing file or other bytes are a UserError that says the fix."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; check the path")
    try:
        return path.read_bytes().decode("utf-8-sig")  # -sig: accept an editor's byte-order mark
    except UnicodeDecodeError as e:
        raise UserError(
            f"{path}: not UTF-8 text (bad byte at offset {e.start}); re-save it as UTF-8"
        ) from None


def read_json(path: str | Path) -> object:
    """A JSON file; bad JSON is a UserError naming the line and column."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg})"
        ) from None


def asset(name: str) -> object:
    """A JSON file shipped in data/ (rubrics, phrase lists, few-shot examples)."""
    return read_json(HERE / "data" / name)


def prompt(name: str) -> str:
    """A prompt template, data/prompts/<name>.txt (our own text; {fields} filled with str.format)."""
    return read_text(HERE / "data" / "prompts" / f"{name}.txt").rstrip("\n")


def json_type(value: object) -> str:
    """A parsed value named the way a JSON file spells it, for error messages."""
    return {
        bool: "true/false",
        dict: "an object",
        list: "a list",
        str: "text",
        int: "a number",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


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
    rows = jsonl_lines(path)
    records = []
    for i, (number, value, error) in enumerate(rows):
        if error and i == len(rows) - 1:
            warn(f"{path}: ignoring line {number}, cut off mid-write ({error})")
            break
        if error or not isinstance(value, dict):
            problem = error or f"it holds {json_type(value)}, not an object"
            if on_damage is None:
                raise UserError(
                    f"{path}: line {number} is not a JSON object ({problem}); fix or delete that line"
                )
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
        shutil.rmtree(tmp)  # left over from a crashed save
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)  # a half-written folder only takes space
        # safetensors and torch wrap a full disk's OSError in their own errors: unwrap it.
        if "No space left" in str(err):
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        raise
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)


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
        self.path = Path(path)
        self.skipped = 0  # garbled lines, asked again
        self._values: dict[str, object] = {}
        if self.path.exists():
            for r in read_jsonl(self.path, on_damage=self._damaged):
                if "key" in r and "value" in r:
                    self._values[r["key"]] = r["value"]

    def _damaged(self, number: int, problem: str) -> None:
        self.skipped += 1
        warn(
            f"{self.path}: skipping garbled line {number} ({problem}); its answer will be asked again"
        )

    @staticmethod
    def make_key(name: str, method: str, inputs: object) -> str:
        """sha256 of (who answers, method, canonical JSON of the inputs): equal inputs, equal key."""
        canonical = json.dumps(
            [name, method, inputs], sort_keys=True, ensure_ascii=False, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def get(self, key: str):
        return self._values.get(key)  # stored values are never None

    def put(self, key: str, value) -> None:
        if value is None:
            raise ValueError("AnswerCache stores no None values: None means 'not cached'")
        self._values[key] = value
        append_jsonl(self.path, {"key": key, "value": value})

    def __len__(self) -> int:
        return len(self._values)


def cached_answers(
    cache: AnswerCache | None, keys: list[str], compute_misses, keep=lambda value: value is not None
) -> list:
    """The answer for every key: from `cache`, else computed, each distinct key once. compute_misses(todo,
    store) calls store(i, answer) as each arrives; a keep(answer) one is cached at once, so a failure
    part-way loses only what was in flight."""
    values = [cache.get(k) if cache else None for k in keys]
    first_of = {}  # key -> index of its first missing input
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


def fingerprint(*paths: str | Path) -> str:
    """sha256 (12 hex digits) of the files' bytes, a folder's files in name order: what made a run."""
    digest = hashlib.sha256()
    for path in map(resolve, paths):
        for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if f.is_file():
                digest.update(f.name.encode() + f.read_bytes())
    return digest.hexdigest()[:12]


def folder_stamp(folder: str) -> list:
    """(name, size, mtime) of every file of a model folder: what changes when it is trained again, so a
    saved system result is never reused for other weights (a model name is its own identity)."""
    path = Path(folder)
    if not path.is_dir():
        return [folder]  # a hub id or a served model: its name
    return sorted(
        [str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns]
        for f in path.rglob("*")
        if f.is_file()
    )
