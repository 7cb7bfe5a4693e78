"""Tests for data.py: persona validation, every dataset loader, the split, profiles, JSON lines.

Small fixtures in tests/fixtures/data/ imitate each official format with our own invented lines;
a second group of tests reads the real datasets (conftest.DATASETS) and the files the repo ships,
and is skipped where those are absent.
"""

import argparse
import copy
import json
from collections import Counter
from pathlib import Path

import pytest

import corpora
import data
from conftest import dataset
from data import Context, UserError

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "data"


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# Personas
# ----------------------------------------------------------------------------------------------

def test_personas_fixture_loads():
    support = data.load_personas(FIX / "personas.json", "support")
    assert support.names() == ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert support.strategies[0] == "validate feelings" and support.tones == ["warm", "calm", "upbeat"]
    assert support.personas[0].examples == ["That sounds like a lot to carry.",
                                            "It makes sense you feel shaken."]
    assert data.available_sets(FIX / "personas.json") == ["support", "meeting"]
    assert data.load_personas(FIX / "personas.json", "meeting").names() == ["Scribe", "Planner"]


@pytest.mark.parametrize("query, expected", [
    ("Anchor", "Anchor"), ("  CATALYST ", "Catalyst"), ("Agent: Beacon.", "Beacon"),
    ("emotional validator", "Anchor"), ("validator", "Anchor"), ("action guide", "Guide"),
    ("Guide (practical advisor)", "Guide"), ("critical", "Catalyst"),
    ("Anchor and Beacon", None), ("nobody", None), ("", None)])
def test_find_persona_by_name_or_role(query, expected):
    support = data.load_personas(FIX / "personas.json", "support")
    found = support.find(query)
    assert (found.name if found else None) == expected


def persona_error(tmp_path, mutate, set_name="support") -> str:
    """Apply `mutate` to a copy of the fixture, load it, return the UserError message."""
    raw = copy.deepcopy(json.loads((FIX / "personas.json").read_text()))
    raw = mutate(raw) or raw
    path = write_json(tmp_path / "personas.json", raw)
    with pytest.raises(UserError) as e:
        data.load_personas(path, set_name)
    return str(e.value)


def drop(d, key):
    del d[key]


@pytest.mark.parametrize("mutate, fragments", [
    (lambda r: [r], ["top level is a list"]),
    (lambda r: r["support"]["personas"].clear(), ["set 'support' has no personas"]),
    (lambda r: drop(r["support"]["personas"][1], "style"), ["persona #2 (Catalyst)", "'style' is missing"]),
    (lambda r: r["support"]["personas"][0].update(role="  "), ["persona #1 (Anchor)", "'role' is empty"]),
    (lambda r: r["support"]["personas"][2].update(examples="Be brave."),
     ["persona #3 (Beacon)", "'examples' is text, not a list"]),
    (lambda r: r["support"]["personas"][3].update(examples=["ok", 7]),
     ["persona #4 (Guide)", "'examples' item 2"]),
    (lambda r: r["support"]["personas"][0].update(name=5), ["persona #1", "'name' is a number, not text"]),
    (lambda r: r["support"]["personas"][3].update(name="anchor"), ["#1 and #4", "'anchor'"]),
    (lambda r: r["support"]["personas"].append("Echo"), ["persona #5 is text"]),
    (lambda r: r["support"].update(strategies=[]), ["set 'support'", "'strategies' is an empty list"]),
    (lambda r: drop(r["support"], "tones"), ["set 'support'", "'tones' is missing"]),
    (lambda r: r["support"].update(description=""), ["set 'support'", "'description' is empty"]),
])
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
        data.load_personas(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"support": {\n  "personas": [,]\n}}', encoding="utf-8")
    with pytest.raises(UserError, match=r"not valid JSON at line 2"):
        data.load_personas(bad)
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"support": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        data.load_personas(latin)


# ----------------------------------------------------------------------------------------------
# Contexts from each format (fixtures)
# ----------------------------------------------------------------------------------------------

def test_ed_csv_groups_conversations_unescapes_and_skips_malformed(capsys):
    contexts = corpora.load_contexts(str(FIX / "ed" / "valid.csv"))
    assert [c.id for c in contexts] == ["hit:1_conv:1", "hit:1_conv:2", "hit:2_conv:3"]
    first = contexts[0]
    assert first.situation == "My niece finished her first half marathon, and I cheered at the line."
    assert first.first_message == "My niece just ran her first half marathon, I am beaming!"
    assert [t["speaker"] for t in first.turns] == ["user", "supporter", "user"]
    assert (first.emotion, first.valence, first.persona_set) == ("proud", "positive", "support")
    # rows of conv 2 are out of order in the file and its third row is malformed (extra commas)
    lonely = contexts[1]
    assert lonely.first_message == "The flat is so quiet with everyone away, it feels strange."
    assert [t["speaker"] for t in lonely.turns] == ["user", "supporter"]
    assert lonely.valence == "negative" and contexts[2].valence == "ambiguous"
    err = capsys.readouterr().err
    assert "skipped 1 malformed row in" in err and "valid.csv: skipping row 7: 12 fields" in err


def test_esconv_official_array(capsys):
    contexts = corpora.load_contexts(str(FIX / "esconv" / "ESConv.json"))
    assert len(contexts) == 2
    thesis = contexts[0]
    assert thesis.first_message == "I am panicking about my thesis."   # leading supporter greeting dropped
    assert thesis.turns[1] == {"speaker": "supporter",
                               "text": "It sounds like the deadline is weighing on you.",
                               "strategy": "Reflection of feelings"}
    assert (thesis.emotion, thesis.valence, thesis.source) == ("anxiety", "negative", "esconv")
    assert "skipped 1 malformed row in" in capsys.readouterr().err


def test_esconv_jsonl_split(capsys):
    contexts = corpora.load_contexts(str(FIX / "esconv_split" / "train.jsonl"))
    assert [c.first_message for c in contexts] == ["I think I am about to lose my job.",
                                                   "I am furious with my dad."]
    assert [t["speaker"] for t in contexts[1].turns] == ["user", "supporter"]   # empty turn dropped
    err = capsys.readouterr().err
    assert "skipped 2 malformed rows in" in err and "row 3: the dialog has no seeker" in err


def test_qmsum_domain_folders_and_dedup():
    contexts = corpora.load_contexts(str(FIX / "qmsum_official"))
    assert {c.id: c.domain for c in contexts} == {"a": "Academic", "b": "Product"}
    venue = contexts[0]
    # the first words are spoken by Professor A (Grad C's turn is only a {vocalsound})
    assert venue.first_message == "Okay, let's start with the venue... we have two options."
    assert [t["speaker"] for t in venue.turns] == ["user", "participant", "user", "participant"]
    assert venue.situation == "A meeting covering: Choosing a venue for the spring workshop; Catering budget."
    assert corpora.load_contexts(str(FIX / "qmsum_official" / "ALL" / "train"))[0].domain == ""
    assert [c.domain for c in corpora.load_contexts(str(FIX / "qmsum_official" / "Academic"))] == ["Academic"]


def test_qmsum_domain_mapping_file_and_broken_meeting(capsys):
    contexts = corpora.load_contexts(str(FIX / "qmsum_mapped" / "train"), persona_set="meeting")
    assert {c.id: c.domain for c in contexts} == {"c": "Committee", "d": "Product"}
    assert "skipped 1 malformed file in" in capsys.readouterr().err
    one = corpora.load_contexts(str(FIX / "qmsum_mapped" / "train" / "d.json"))
    assert one[0].domain == "Product" and one[0].first_message == "The screen could be two inches."


def test_qmsum_keeps_at_most_40_turns(tmp_path):
    lines = [{"speaker": f"S{i % 3}", "content": f"Point number {i} ."} for i in range(55)]
    write_json(tmp_path / "m.json", {"topic_list": [{"topic": "Long one"}], "meeting_transcripts": lines})
    (context,) = corpora.load_contexts(str(tmp_path / "m.json"))
    assert len(context.turns) == corpora.MAX_MEETING_TURNS == 40
    assert context.turns[-1]["text"] == "Point number 39."


def test_shared_style_ed_and_openings_jsonl():
    valid = corpora.load_contexts(str(FIX / "ed_shared" / "valid_contexts.jsonl"))
    assert [c.valence for c in valid] == ["positive", "ambiguous", "negative"]
    assert valid[0].first_message == "Someone posted my wallet back to me, cash and all!"
    assert valid[0].turns == []
    train = corpora.load_contexts(str(FIX / "ed_shared" / "train_situations.jsonl"))
    assert [c.id for c in train] == ["train_situations-1", "train_situations-2"]
    assert train[1].first_message == train[1].situation == "the bus drove past me again this morning."
    openings = corpora.load_contexts(str(FIX / "qmsum_openings.jsonl"))
    assert [(c.id, c.domain) for c in openings] == [("X001", "Product"), ("X002", "Committee")]
    assert openings[0].first_message == "Okay, so today's about the shape."
    assert openings[0].turns[1] == {"speaker": "participant", "text": "I've got some sketches."}


def test_bundled_format_filter_and_limit(tmp_path, capsys):
    path = str(FIX / "contexts.jsonl")
    all_rows = corpora.load_contexts(path)
    assert [c.id for c in all_rows] == ["sup-01", "sup-02", "mtg-01"]
    assert "skipped 1 malformed row" in capsys.readouterr().err
    assert [c.id for c in corpora.load_contexts(path, persona_set="meeting")] == ["mtg-01"]
    assert [c.id for c in corpora.load_contexts(path, persona_set="support", limit=1)] == ["sup-01"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "contexts.jsonl").write_text((FIX / "contexts.jsonl").read_text())
    assert len(corpora.load_contexts("bundled", repo_root=tmp_path)) == 3
    with pytest.raises(UserError, match="bundled contexts file is missing"):
        corpora.load_contexts("bundled", repo_root=tmp_path / "nowhere")


def test_context_source_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="empty.jsonl: unrecognised JSON-lines data"):
        corpora.load_contexts(str(empty))
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UserError, match="not an Empathetic Dialogues CSV"):
        corpora.load_contexts(str(tmp_path / "empty.csv"))
    header_only = tmp_path / "test.csv"
    header_only.write_text(",".join(corpora.ED_COLUMNS) + "\n")
    with pytest.raises(UserError, match="no usable rows"):
        corpora.load_contexts(str(header_only))
    binary = tmp_path / "latin.jsonl"
    binary.write_bytes('{"id": "x", "situation": "d\u00e9j\u00e0 vu"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="latin.jsonl: not UTF-8"):
        corpora.load_contexts(str(binary))
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "why?"}\n')
    with pytest.raises(UserError, match=r"keys \['question'\]"):
        corpora.load_contexts(str(odd))
    with pytest.raises(UserError, match="no such file or folder"):
        corpora.load_contexts(str(tmp_path / "missing.csv"))
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="unrecognised data file"):
        corpora.load_contexts(str(tmp_path / "notes.txt"))
    with pytest.raises(UserError, match="none for persona set 'meeting'"):
        corpora.load_contexts(str(FIX / "ed" / "valid.csv"), persona_set="meeting")
    with pytest.raises(UserError, match="pass one file"):
        corpora.load_contexts(str(FIX / "ed_shared"))
    with pytest.raises(UserError, match="positive number"):
        corpora.load_contexts(str(FIX / "contexts.jsonl"), limit=0)


def test_emotion_valence_mapping_counts():
    assert len(corpora.POSITIVE_EMOTIONS) == 14 and len(corpora.NEGATIVE_EMOTIONS) == 17
    assert corpora.emotion_valence("Surprised") == "ambiguous"
    assert corpora.emotion_valence("bored", fallback="neutral-ambiguous") == "ambiguous"
    assert corpora.emotion_valence("bored") == ""


# ----------------------------------------------------------------------------------------------
# Split
# ----------------------------------------------------------------------------------------------

def make_contexts(spec: dict[str, int]) -> list[Context]:
    out = []
    for valence, n in spec.items():
        out += [Context(id=f"{valence}-{i}", persona_set="support", situation="s", first_message="m",
                        valence=valence) for i in range(n)]
    out.append(Context(id="mtg", persona_set="meeting", situation="s", first_message="m", domain="Product"))
    return out


def test_split_is_deterministic_stratified_and_order_preserving():
    contexts = make_contexts({"positive": 8, "negative": 12, "ambiguous": 2})
    train, held = data.split_contexts(contexts, 0.25, seed=0)
    # round(8/4) = 2, round(12/4) = 3, round(2/4) = 0 -> raised to 1; the lone meeting stays in train
    assert Counter(c.valence for c in held) == {"positive": 2, "negative": 3, "ambiguous": 1}
    assert len(train) + len(held) == len(contexts) and "mtg" in {c.id for c in train}
    order = [c.id for c in contexts]
    assert [c.id for c in held] == sorted((c.id for c in held), key=order.index)
    assert [c.id for c in train] == sorted((c.id for c in train), key=order.index)
    again = data.split_contexts(contexts, 0.25, seed=0)
    assert [c.id for c in again[1]] == [c.id for c in held]
    others = [[c.id for c in data.split_contexts(contexts, 0.25, seed=s)[1]] for s in range(1, 6)]
    assert any(o != [c.id for c in held] for o in others)
    assert data.split_contexts(contexts, 0.0)[1] == []
    with pytest.raises(UserError, match="held-out fraction"):
        data.split_contexts(contexts, 1.0)


# ----------------------------------------------------------------------------------------------
# Profiles
# ----------------------------------------------------------------------------------------------

def test_profiles_load_and_select():
    profiles = data.load_profiles(FIX / "profiles.json")
    assert [p.id for p in profiles] == ["average", "openness-high", "neuroticism-low"]
    assert profiles[1].levels["openness"] == "high"
    assert profiles[2].description == (
        "You try new things now and then. You keep most promises on time. "
        "You chat when asked. You agree when it makes sense. Little rattles you.")
    assert [p.id for p in data.load_profiles(FIX / "profiles.json", ["all"])] == [p.id for p in profiles]
    picked = data.load_profiles(FIX / "profiles.json", ["neuroticism-low", "average"])
    assert [p.id for p in picked] == ["neuroticism-low", "average"]
    with pytest.raises(UserError, match="unknown profile id 'calm'; valid ids: all, average, openness-high"):
        data.load_profiles(FIX / "profiles.json", ["calm"])


@pytest.mark.parametrize("mutate, fragment", [
    (lambda r: drop(r["traits"], "neuroticism"), "exactly the five traits"),
    (lambda r: drop(r["traits"]["openness"], "low"), "trait 'openness': field 'low' is missing"),
    (lambda r: r["profiles"][1]["levels"].update(openness="medium"), "profile #2 (openness-high)"),
    (lambda r: r["profiles"][2].update(id="average"), "profile id 'average' appears twice"),
    (lambda r: r.update(profiles=[]), "non-empty list"),
])
def test_profile_validation_errors(tmp_path, mutate, fragment):
    raw = json.loads((FIX / "profiles.json").read_text())
    mutate(raw)
    with pytest.raises(UserError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        data.load_profiles(write_json(tmp_path / "p.json", raw))


# ----------------------------------------------------------------------------------------------
# JSON lines
# ----------------------------------------------------------------------------------------------

def test_append_and_read_jsonl_round_trip(tmp_path):
    path = tmp_path / "sub" / "log.jsonl"
    records = [{"a": 1}, {"text": "caf\u00e9 \u2028 line separator", "n": [1, 2]}]
    for record in records:
        data.append_jsonl(path, record)
    assert data.read_jsonl(path) == records
    assert path.read_bytes().count(b"\n") == 2


def test_every_writer_and_the_reader_keep_line_separators_inside_records(tmp_path):
    # json.dumps(ensure_ascii=False) writes U+2028 / U+2029 unescaped; str.splitlines() would cut
    # a record in two there. Every writer and the one reader must keep it one record.
    record = {"text": "one\u2028two\u2029three", "n": 1}
    data.write_jsonl(tmp_path / "w.jsonl", [record, record])
    data.append_jsonl(tmp_path / "a.jsonl", record)
    assert "\u2028" in (tmp_path / "w.jsonl").read_text(encoding="utf-8")        # really unescaped
    assert len((tmp_path / "w.jsonl").read_text(encoding="utf-8").splitlines()) > 2   # the trap
    assert data.read_jsonl(tmp_path / "w.jsonl") == [record, record]
    assert data.read_jsonl(tmp_path / "a.jsonl") == [record]
    assert data.read_jsonl(tmp_path / "w.jsonl", numbered=True) == [(1, record), (2, record)]


def test_atomic_folder_leaves_no_half_written_folder(tmp_path):
    target = tmp_path / "model"
    with data.atomic_folder(target) as tmp:
        (tmp / "weights").write_text("v1")
    assert (target / "weights").read_text() == "v1" and not tmp.exists()
    with pytest.raises(RuntimeError):
        with data.atomic_folder(target) as tmp:
            (tmp / "weights").write_text("v2")
            raise RuntimeError("crash mid-save")
    assert (target / "weights").read_text() == "v1"       # the old complete folder is untouched
    with data.atomic_folder(target) as tmp:               # a crashed .tmp is cleared and replaced
        (tmp / "weights").write_text("v3")
    assert (target / "weights").read_text() == "v3"


def test_derive_seed_is_a_fixed_polynomial():
    assert data.derive_seed(0, 1) == 1
    assert data.derive_seed(1, 2) == 1 * 1_000_003 + 2
    assert data.derive_seed(3, 4, 5) == ((3 * 1_000_003 + 4) * 1_000_003 + 5) % (2**31 - 1)
    assert data.derive_seed(7, "state-1") == data.derive_seed(7, "state-1") != data.derive_seed(7, "state-2")
    assert 0 <= data.derive_seed(2**40, 2**40) < 2**31 - 1


def test_check_split_stops_a_command_that_would_leak_training_contexts(tmp_path):
    config = tmp_path / "config.json"
    data.write_json(config, {"data": "bundled", "set": "support", "seed": 0, "held_out": 0.25})
    same = argparse.Namespace(data="bundled", set="support", seed=0, held_out=0.25)
    data.check_split(same, [config, tmp_path / "missing.json"])             # no error
    with pytest.raises(UserError, match="--seed 1: .*--seed 0"):
        data.check_split(argparse.Namespace(data="bundled", set="support", seed=1, held_out=0.25), [config])
    with pytest.raises(UserError, match="--held-out 0.5"):
        data.check_split(argparse.Namespace(data="bundled", set="support", seed=0, held_out=0.5), [config])
    # Another corpus (held-out transfer, e.g. ESConv) shares no contexts with the training data.
    data.check_split(argparse.Namespace(data="esconv.jsonl", set="support", seed=5, held_out=0.1), [config])


def test_flag_type_names_the_flag_and_rejects_out_of_range_values():
    parse = data.flag_type("--temperature", float, "positive")
    assert parse("0.7") == 0.7
    for bad in ("0", "-1", "nan", "abc"):
        with pytest.raises(argparse.ArgumentTypeError, match="--temperature"):
            parse(bad)
    assert data.flag_type("--steps", int, "positive")("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="whole number"):
        data.flag_type("--steps", int, "positive")("2.5")


def test_read_jsonl_ignores_truncated_last_line(tmp_path, capsys):
    path = tmp_path / "cache.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert data.read_jsonl(path) == [{"a": 1}, {"b": 2}]
    assert "ignoring line 3" in capsys.readouterr().err
    # the next append cuts the torn line off instead of gluing onto it
    data.append_jsonl(path, {"c": 3})
    assert data.read_jsonl(path) == [{"a": 1}, {"b": 2}, {"c": 3}]


def test_read_jsonl_rejects_damage_before_the_end(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"b": \n{"c": 3}\n')
    with pytest.raises(UserError, match="bad.jsonl: line 2 is not a JSON object"):
        data.read_jsonl(path)
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(UserError, match="line 2 .*a list, not an object"):
        data.read_jsonl(path)


# ----------------------------------------------------------------------------------------------
# The real datasets (conftest.dataset: skipped where absent)
# ----------------------------------------------------------------------------------------------

def test_real_esconv_train_jsonl():
    contexts = corpora.load_contexts(str(dataset("esconv/train.jsonl")))
    assert len(contexts) == 910
    assert all(c.valence == "negative" and c.turns[0] == {"speaker": "user", "text": c.first_message}
               for c in contexts)
    assert Counter(c.emotion for c in contexts).most_common(1) == [("anxiety", 251)]


def test_real_ed_valid_contexts_match_published_polarity():
    path = dataset("empathetic_dialogues/valid_contexts.jsonl")
    contexts = corpora.load_contexts(str(path))
    assert len(contexts) == 2770
    published = [json.loads(line)["polarity"] for line in path.read_text().splitlines()]
    assert [c.valence for c in contexts] == [corpora.emotion_valence("", p) for p in published]
    # our built-in mapping reproduces the published one for all 32 labels
    published_map = dataset("empathetic_dialogues/emotion_polarity.json")
    mapping = json.loads(published_map.read_text())["mapping"]
    assert len(mapping) == 32
    assert {e: corpora.emotion_valence(e) for e in mapping} == {
        e: corpora.emotion_valence("", v) for e, v in mapping.items()}
    train, held = data.split_contexts(contexts, 0.25, seed=0)
    assert Counter(c.valence for c in held) == {"negative": 366, "positive": 290, "ambiguous": 37}


def test_real_ed_train_situations():
    contexts = corpora.load_contexts(str(dataset("empathetic_dialogues/train_situations.jsonl")))
    assert len(contexts) == 5000 and all(c.first_message == c.situation for c in contexts)


def test_real_qmsum_train_folder_and_openings():
    folder = dataset("qmsum/train")
    contexts = corpora.load_contexts(str(folder))
    assert len(contexts) == 40 and {c.domain for c in contexts} == {"Academic"}   # via train_domains.json
    assert all(0 < len(c.turns) <= 40 and c.turns[0]["speaker"] == "user" for c in contexts)
    assert not any("{" in t["text"] for c in contexts for t in c.turns)
    assert len(corpora.load_contexts(str(folder.parent))) == 40
    openings = corpora.load_contexts(str(dataset("qmsum/train_openings.jsonl")))
    assert Counter(c.domain for c in openings) == {"Product": 97, "Academic": 41, "Committee": 24}


# ----------------------------------------------------------------------------------------------
# The files the repo ships
# ----------------------------------------------------------------------------------------------

def test_shipped_personas():
    path = ROOT / "personas.json"
    support, meeting = data.load_personas(path, "support"), data.load_personas(path, "meeting")
    assert support.names() == ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert meeting.names() == ["Scribe", "Clarifier", "Planner", "Sentinel"]
    assert support.find("action guide").name == "Guide" and support.find("anchor").name == "Anchor"


def test_shipped_contexts(capsys):
    contexts = corpora.load_contexts("bundled")
    assert capsys.readouterr().err == ""            # no malformed rows in what we ship
    assert {c.persona_set for c in contexts} == {"support", "meeting"}
    assert len({c.id for c in contexts}) == len(contexts)


def test_shipped_profiles():
    profiles = data.load_profiles(ROOT / "data" / "profiles.json")
    assert len(profiles) == 11 and "average" in [p.id for p in profiles]
    for p in profiles:
        off_average = [t for t, level in p.levels.items() if level != "average"]
        assert len(off_average) == (0 if p.id == "average" else 1)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads Linux's /proc")
def test_freed_tensors_go_back_to_the_os():
    # Without data.return_freed_memory glibc keeps the freed blocks (its threshold was raised by
    # an earlier large free); with it every 2 MiB block is its own mapping, returned when freed.
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    freed = {mode: float(subprocess.run([sys.executable, str(root / "tests" / "fixtures" / "heap_probe.py"),
                                         mode, str(root)], capture_output=True, text=True, check=True).stdout)
             for mode in ("off", "on")}
    assert freed["on"] > 90                                        # MB of the 105 freed
    assert freed["off"] < 20

