"""Tests for scenarios.py: persona validation, our contexts format, the split, profiles, JSON
lines, seeds and flags, and the files the repo ships. The readers of the public datasets
(plumbing/datasets.py) are tested in tests/test_datasets.py.

Run: .venv/bin/python -m pytest -q tests/test_data.py
"""

import argparse
import copy
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from tqdm import tqdm

import scenarios
from plumbing import cli, common, files
from plumbing.common import UserError
from scenarios import Context

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "data"


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# Personas
# ----------------------------------------------------------------------------------------------


def test_personas_fixture_loads():
    support = scenarios.load_personas(FIX / "personas.json", "support")
    assert support.names() == ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert support.strategies[0] == "validate feelings" and support.tones == [
        "warm",
        "calm",
        "upbeat",
    ]
    assert support.personas[0].examples == [
        "That sounds like a lot to carry.",
        "It makes sense you feel shaken.",
    ]
    assert list(scenarios.persona_sets(FIX / "personas.json")) == ["support", "meeting"]
    assert scenarios.load_personas(FIX / "personas.json", "meeting").names() == [
        "Scribe",
        "Planner",
    ]


@pytest.mark.parametrize(
    "query, expected",
    [
        ("Anchor", "Anchor"),
        ("  CATALYST ", "Catalyst"),
        ("Agent: Beacon.", "Beacon"),
        ("emotional validator", "Anchor"),
        ("validator", "Anchor"),
        ("action guide", "Guide"),
        ("Guide (practical advisor)", "Guide"),
        ("critical", "Catalyst"),
        ("Anchor and Beacon", None),
        ("nobody", None),
        ("", None),
    ],
)
def test_find_persona_by_name_or_role(query, expected):
    support = scenarios.load_personas(FIX / "personas.json", "support")
    found = support.find(query)
    assert (found.name if found else None) == expected


def test_find_works_for_every_name_the_validator_accepts(tmp_path):
    """Names in other scripts passed validation but PersonaSet.find matched [a-z0-9] words only,
    so stage 1 died on None.name; now find reads letters of every script."""
    raw = json.loads((FIX / "personas.json").read_text())
    names = ["Беакон", "触媒", "Ånchor", "Guide"]
    for p, name in zip(raw["support"]["personas"], names):
        p["name"] = name
    path = tmp_path / "personas.json"
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    support = scenarios.load_personas(path, "support")
    for name in names:
        assert support.find(name).name == name
        assert support.find(f"Agent: {name.upper()}.").name == name
    assert support.find("critical thinker").name == "触媒"  # roles as before
    assert support.find("беакон и 触媒") is None  # two names: ambiguous


@pytest.mark.parametrize(
    "names, fragments",
    [
        (["User"], ["persona #1:", "name 'User' is reserved"]),
        (["Anchor", "safety"], ["persona #2:", "name 'safety' is reserved"]),
        (["Anchor", "Beacon", "USER."], ["persona #3:", "name 'USER.' is reserved"]),
        (["A-1", "A 1"], ["personas #1 and #2", "'A-1' and 'A 1'", "spacing or punctuation"]),
        (["Anchor", "Anchor."], ["personas #1 and #2", "'Anchor' and 'Anchor.'"]),
        (["Беакон", "беакон"], ["personas #1 and #2", "but for case"]),
        (["_"], ["persona #1:", "name '_'", "a letter or digit"]),
    ],
)
def test_names_that_would_break_the_pipeline_are_refused(tmp_path, names, fragments):
    """A persona named User or Safety speaks turns that read as the person's or a crisis stop;
    names that differ only in punctuation or spacing cannot be told apart by find."""

    def rename(raw):
        for p, name in zip(raw["support"]["personas"], names):
            p["name"] = name

    message = persona_error(tmp_path, rename)
    for fragment in fragments:
        assert fragment in message
    assert "\n" not in message


def persona_error(tmp_path, mutate, set_name="support") -> str:
    """Apply `mutate` to a copy of the fixture, load it, return the UserError message."""
    raw = copy.deepcopy(json.loads((FIX / "personas.json").read_text()))
    raw = mutate(raw) or raw
    path = write_json(tmp_path / "personas.json", raw)
    with pytest.raises(UserError) as e:
        scenarios.load_personas(path, set_name)
    return str(e.value)


def drop(d, key):
    del d[key]


@pytest.mark.parametrize(
    "mutate, fragments",
    [
        (lambda r: [r], ["top level is a list"]),
        (
            lambda r: r["support"]["personas"].clear(),
            ["set 'support' must be an object", "a non-empty personas list"],
        ),
        (
            lambda r: drop(r["support"]["personas"][1], "style"),
            [
                "set 'support' persona #2:",
                "field 'style' must be a non-empty string",
                "(got nothing)",
            ],
        ),
        (
            lambda r: r["support"]["personas"][0].update(role="  "),
            ["set 'support' persona #1:", "field 'role' must be a non-empty string", "(got text)"],
        ),
        (
            lambda r: r["support"]["personas"][2].update(examples="Be brave."),
            [
                "set 'support' persona #3:",
                "field 'examples' must be a list of at most 20 non-empty strings",
                "(got text)",
            ],
        ),
        (
            lambda r: r["support"]["personas"][3].update(examples=["ok", 7]),
            [
                "set 'support' persona #4:",
                "field 'examples' must be a list of at most 20 non-empty strings",
            ],
        ),
        (
            lambda r: r["support"]["personas"][0].update(name=5),
            ["persona #1:", "field 'name'", "(got a number)"],
        ),
        (
            lambda r: r["support"]["personas"][0].update(name="Anchor\nDirector"),
            ["persona #1:", "must be one line"],
        ),
        (lambda r: r["support"]["personas"][3].update(name="anchor"), ["#1 and #4", "'anchor'"]),
        (lambda r: r["support"]["personas"].append("Echo"), ["persona #5 is text"]),
        (
            lambda r: r["support"].update(strategies=[]),
            ["set 'support':", "field 'strategies' must be a list"],
        ),
        (
            lambda r: drop(r["support"], "tones"),
            ["set 'support':", "field 'tones'", "(got nothing)"],
        ),
        (
            lambda r: r["support"].update(description=""),
            ["set 'support':", "field 'description' must be a non-empty"],
        ),
        # A runaway card would fill every prompt (a 2 MB description once ran for minutes with no output).
        (
            lambda r: r["support"]["personas"][1].update(description="I listen. " * 210_000),
            ["persona #2:", "field 'description'", "at most 2000 characters"],
        ),
        (
            lambda r: r["support"]["personas"][0].update(examples=["Tell me more."] * 21),
            ["persona #1:", "field 'examples'", "at most 20 non-empty strings"],
        ),
    ],
)
def test_persona_validation_errors_name_the_problem(tmp_path, mutate, fragments):
    message = persona_error(tmp_path, mutate)
    assert str(tmp_path / "personas.json") in message
    for fragment in fragments:
        assert fragment in message
    assert "\n" not in message


def test_persona_file_level_errors(tmp_path):
    message = persona_error(tmp_path, lambda r: None, "party")
    assert "no persona set 'party'" in message and "available: support, meeting" in message
    with pytest.raises(UserError, match="personas file not found"):
        scenarios.load_personas(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"support": {\n  "personas": [,]\n}}', encoding="utf-8")
    with pytest.raises(UserError, match=r"not valid JSON at line 2"):
        scenarios.load_personas(bad)
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"support": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        scenarios.load_personas(latin)


# ----------------------------------------------------------------------------------------------
# Contexts in our format
# ----------------------------------------------------------------------------------------------


def test_our_format_filter_and_malformed_rows(tmp_path, capsys):
    path = str(FIX / "contexts.jsonl")
    support = scenarios.load_contexts(path, "support")
    meeting = scenarios.load_contexts(path, "meeting")
    assert [c.id for c in support + meeting] == ["sup-01", "sup-02", "mtg-01"]
    assert "skipping line 3" in capsys.readouterr().err  # the row of set 'party'
    assert [c.id for c in meeting] == ["mtg-01"]
    assert scenarios.is_contexts_file(path) and not scenarios.is_contexts_file(
        str(FIX / "ed_shared" / "valid_contexts.jsonl")
    )
    with pytest.raises(UserError, match="no such file"):
        scenarios.load_contexts(str(tmp_path / "nowhere.jsonl"), "support")
    with pytest.raises(UserError, match="no usable 'meeting' contexts"):
        scenarios.load_contexts(str(FIX / "ed_shared" / "valid_contexts.jsonl"), "meeting")


# ----------------------------------------------------------------------------------------------
# Split
# ----------------------------------------------------------------------------------------------


def make_contexts(spec: dict[str, int]) -> list[Context]:
    out = []
    for valence, n in spec.items():
        out += [
            Context(
                id=f"{valence}-{i}",
                persona_set="support",
                situation="s",
                first_message="m",
                valence=valence,
            )
            for i in range(n)
        ]
    out.append(
        Context(id="mtg", persona_set="meeting", situation="s", first_message="m", domain="Product")
    )
    return out


def test_split_is_deterministic_stratified_and_order_preserving():
    contexts = make_contexts({"positive": 8, "negative": 12, "ambiguous": 2})
    train, held = scenarios.split_contexts(contexts, 0.25, seed=0)
    # round(8/4) = 2, round(12/4) = 3, round(2/4) = 0 -> raised to 1; the lone meeting stays in train
    assert Counter(c.valence for c in held) == {"positive": 2, "negative": 3, "ambiguous": 1}
    assert len(train) + len(held) == len(contexts) and "mtg" in {c.id for c in train}
    order = [c.id for c in contexts]
    assert [c.id for c in held] == sorted((c.id for c in held), key=order.index)
    assert [c.id for c in train] == sorted((c.id for c in train), key=order.index)
    again = scenarios.split_contexts(contexts, 0.25, seed=0)
    assert [c.id for c in again[1]] == [c.id for c in held]
    others = [
        [c.id for c in scenarios.split_contexts(contexts, 0.25, seed=s)[1]] for s in range(1, 6)
    ]
    assert any(o != [c.id for c in held] for o in others)
    assert scenarios.split_contexts(contexts, 0.0)[1] == []
    with pytest.raises(UserError, match=r"--held-out 1.0: give a number in \[0, 1\)"):
        scenarios.split_contexts(contexts, 1.0)


# ----------------------------------------------------------------------------------------------
# Profiles
# ----------------------------------------------------------------------------------------------


def test_profiles_load_and_select():
    import evaluate  # the --profiles selection lives with the evaluation

    profiles = scenarios.load_profiles(FIX / "profiles.json")
    assert list(profiles) == ["average", "openness-high", "neuroticism-low"]
    assert profiles["openness-high"].levels["openness"] == "high"
    assert profiles["neuroticism-low"].description == (
        "You try new things now and then. You keep most promises on time. "
        "You chat when asked. You agree when it makes sense. Little rattles you."
    )
    assert [p.trait() for p in profiles.values()] == ["average", "openness", "neuroticism"]
    # 'all' is the profiles that set one trait high or low (the paper's ten), so not "average".
    assert evaluate.profile_ids("all", profiles) == ["openness-high", "neuroticism-low"]
    assert evaluate.profile_ids("neuroticism-low, average", profiles) == [
        "neuroticism-low",
        "average",
    ]
    with pytest.raises(
        UserError, match="--profiles calm: use 'all' or ids from the profiles file: average, open"
    ):
        evaluate.profile_ids("calm", profiles)


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (
            lambda r: drop(r["traits"], "neuroticism"),
            '"traits" must map each of openness, conscientiousness',
        ),
        (
            lambda r: drop(r["traits"]["openness"], "low"),
            "trait 'openness': field 'low' must be a non-empty string",
        ),
        (
            lambda r: r["profiles"][1]["levels"].update(openness="medium"),
            'profile #2 needs a unique id and "levels"',
        ),
        (lambda r: r["profiles"][2].update(id="average"), "profile #3 needs a unique id"),
        (lambda r: r.update(profiles=[]), "non-empty list"),
    ],
)
def test_profile_validation_errors(tmp_path, mutate, fragment):
    raw = json.loads((FIX / "profiles.json").read_text())
    mutate(raw)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        scenarios.load_profiles(write_json(tmp_path / "p.json", raw))


# ----------------------------------------------------------------------------------------------
# JSON lines
# ----------------------------------------------------------------------------------------------


def test_append_and_read_jsonl_round_trip(tmp_path):
    path = tmp_path / "sub" / "log.jsonl"
    records = [{"a": 1}, {"text": "caf\u00e9 \u2028 line separator", "n": [1, 2]}]
    for record in records:
        files.append_jsonl(path, record)
    assert files.read_jsonl(path) == records
    assert path.read_bytes().count(b"\n") == 2


def test_every_writer_and_the_reader_keep_line_separators_inside_records(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028 / U+2029 unescaped; str.splitlines() would cut
    # a record in two there. Every writer and the one reader must keep it one record.
    record = {"text": "one\u2028two\u2029three", "n": 1}
    files.write_jsonl(tmp_path / "w.jsonl", [record, record])
    files.append_jsonl(tmp_path / "a.jsonl", record)
    assert "\u2028" in (tmp_path / "w.jsonl").read_text(encoding="utf-8")  # really unescaped
    assert len((tmp_path / "w.jsonl").read_text(encoding="utf-8").splitlines()) > 2  # the trap
    assert files.read_jsonl(tmp_path / "w.jsonl") == [record, record]
    assert files.read_jsonl(tmp_path / "a.jsonl") == [record]
    assert files.read_jsonl(tmp_path / "w.jsonl", numbered=True) == [(1, record), (2, record)]


def test_atomic_folder_leaves_no_half_written_folder(tmp_path):
    target = tmp_path / "model"
    with files.atomic_folder(target) as tmp:
        (tmp / "weights").write_text("v1")
    assert (target / "weights").read_text() == "v1" and not tmp.exists()
    with pytest.raises(RuntimeError):
        with files.atomic_folder(target) as tmp:
            (tmp / "weights").write_text("v2")
            raise RuntimeError("crash mid-save")
    assert (target / "weights").read_text() == "v1"  # the old complete folder is untouched
    with files.atomic_folder(target) as tmp:  # a crashed .tmp is cleared and replaced
        (tmp / "weights").write_text("v3")
    assert (target / "weights").read_text() == "v3"


def test_derive_seed_is_a_fixed_polynomial():
    assert common.derive_seed(0, 1) == 1
    assert common.derive_seed(1, 2) == 1 * 1_000_003 + 2
    assert common.derive_seed(3, 4, 5) == ((3 * 1_000_003 + 4) * 1_000_003 + 5) % (2**31 - 1)
    assert (
        common.derive_seed(7, "state-1")
        == common.derive_seed(7, "state-1")
        != common.derive_seed(7, "state-2")
    )
    assert 0 <= common.derive_seed(2**40, 2**40) < 2**31 - 1


def test_make_inputs_stops_a_command_that_would_leak_training_contexts(tmp_path):
    config = tmp_path / "config.json"
    files.write_json(config, {"data": "bundled", "set": "support", "seed": 0, "held_out": 0.25})
    personas = scenarios.load_personas(FIX / "personas.json", "support")
    profiles = scenarios.load_profiles(FIX / "profiles.json")
    splits = {"all": make_contexts({"positive": 4})}

    def make(**settings):
        settings = {"data": "bundled", "set": "support", "seed": 0, "held_out": 0.25, **settings}
        return scenarios.make_inputs(
            personas,
            splits,
            settings["held_out"],
            settings["seed"],
            profiles,
            settings,
            [config, tmp_path / "missing.json"],
        )

    make()  # no error
    with pytest.raises(UserError, match="--seed 1: .*--seed 0"):
        make(seed=1)
    with pytest.raises(UserError, match="--held-out 0.5"):
        make(held_out=0.5)
    # Another corpus (held-out transfer, e.g. ESConv) shares no contexts with the training data.
    make(data="esconv.jsonl", seed=5, held_out=0.1)
    other = tmp_path / "other.jsonl"
    other.write_text((FIX / "contexts.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    make(data=str(other), seed=5)
    # The same contexts under another path (a byte-identical copy) split as the stage did.
    copied = tmp_path / "copy" / "mine.jsonl"
    copied.parent.mkdir()
    copied.write_bytes((ROOT / "data" / "contexts.jsonl").read_bytes())
    make(data=str(copied))  # the same settings: no error
    with pytest.raises(UserError, match="--seed 1: .*config.json was made with --seed 0"):
        make(data=str(copied), seed=1)
    # A folder of official splits copied elsewhere is the same data too.
    files.write_json(config, {"data": str(FIX / "ed"), "set": "support", "seed": 0})
    (tmp_path / "ed").mkdir()
    for f in (FIX / "ed").iterdir():
        (tmp_path / "ed" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(UserError, match="--seed 2"):
        make(data=str(tmp_path / "ed"), seed=2)
    make(data=str(FIX / "ed_splits"), seed=2)  # other data


def test_flag_type_names_the_flag_and_rejects_out_of_range_values():
    parse = cli.flag_type("--temperature", float, "positive")
    assert parse("0.7") == 0.7
    for bad in ("0", "-1", "nan", "inf", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match="--temperature"):
            parse(bad)
    assert cli.flag_type("--steps", int, "positive")("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
        cli.flag_type("--steps", int, "positive")("2.5")


def test_read_jsonl_ignores_truncated_last_line(tmp_path, capsys):
    path = tmp_path / "cache.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert files.read_jsonl(path) == [{"a": 1}, {"b": 2}]
    assert "ignoring line 3" in capsys.readouterr().err
    # the next append cuts the torn line off instead of gluing onto it
    files.append_jsonl(path, {"c": 3})
    assert files.read_jsonl(path) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_read_jsonl_rejects_damage_before_the_end(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"b": \n{"c": 3}\n')
    with pytest.raises(UserError, match="bad.jsonl: line 2 is not a JSON object"):
        files.read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(UserError, match="line 2 .*a list, not an object"):
        files.read_jsonl(path)


# ----------------------------------------------------------------------------------------------
# The files the repo ships
# ----------------------------------------------------------------------------------------------


def test_shipped_personas():
    path = ROOT / "personas.json"
    support, meeting = (
        scenarios.load_personas(path, "support"),
        scenarios.load_personas(path, "meeting"),
    )
    assert support.names() == ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert meeting.names() == ["Scribe", "Clarifier", "Planner", "Sentinel"]
    assert support.find("action guide").name == "Guide" and support.find("anchor").name == "Anchor"


def test_shipped_contexts(capsys):
    contexts = scenarios.load_contexts("bundled", "support") + scenarios.load_contexts(
        "bundled", "meeting"
    )
    assert capsys.readouterr().err == ""  # no malformed rows in what we ship
    assert {c.persona_set for c in contexts} == {"support", "meeting"}
    assert len({c.id for c in contexts}) == len(contexts)


def test_shipped_profiles():
    profiles = scenarios.load_profiles(ROOT / "data" / "profiles.json")
    assert len(profiles) == 11 and "average" in profiles
    for p in profiles.values():
        off_average = [t for t, level in p.levels.items() if level != "average"]
        assert len(off_average) == (0 if p.id == "average" else 1)


# ---------------------------------------------------------------------------------------------
# Progress of a phase: a bar on a terminal, one line in a log, nothing under --quiet
# ---------------------------------------------------------------------------------------------


def test_progress_prints_one_line_per_phase_in_a_log(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert list(common.progress(range(3), "candidates")) == [0, 1, 2]
    for i in common.progress(range(5), "rollouts"):
        if i == 1:
            break  # a phase that ends early says so too
    err = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in err] == ["candidates: 3 done", "rollouts: 2 done"]


def test_progress_is_a_bar_on_a_terminal_and_silent_when_quiet(capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    items = range(3)
    bar = common.progress(items, "candidates")
    assert isinstance(bar, tqdm)
    bar.close()
    capsys.readouterr()
    assert common.progress(items, "") is items  # no name: no progress (GRPO's rollouts)
    monkeypatch.setattr(common, "QUIET", True)
    assert common.progress(items, "candidates") is items
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert list(common.progress(items, "candidates")) == [0, 1, 2] and capsys.readouterr().err == ""
