"""Tests of plumbing/datasets.py: every official format it reads, its splits, and how a run uses them
(mascot.load_inputs): a folder with train / valid / test trains on train and evaluates on test.

Small fixtures in tests/fixtures/data/ imitate each official format with our own invented lines;
a second group of tests reads the real datasets (conftest.DATASETS) and is skipped where absent.

Run: .venv/bin/python -m pytest -q tests/test_datasets.py
"""

import json
from collections import Counter
from pathlib import Path

import pytest

import mascot
import scenarios
from conftest import dataset
from plumbing import datasets
from plumbing.common import UserError

FIX = Path(__file__).resolve().parent / "fixtures" / "data"


def contexts(spec, persona_set: str = "support") -> list:
    """Every context of one persona set that `spec` holds, its splits concatenated in order."""
    return [c for part in datasets.load_splits(str(spec), persona_set).values() for c in part]


def inputs(*argv):
    args = mascot.build_parser().parse_args(["evaluate", "--model", "tiny", *argv])
    return mascot.load_inputs(args)


def write_json(path: Path, value) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------------------
# Each format (fixtures)
# ----------------------------------------------------------------------------------------------


def test_ed_csv_groups_conversations_unescapes_and_skips_malformed(capsys):
    found = contexts(FIX / "ed" / "valid.csv")
    assert [c.id for c in found] == ["hit:1_conv:1", "hit:1_conv:2", "hit:2_conv:3"]
    first = found[0]
    assert (
        first.situation == "My niece finished her first half marathon, and I cheered at the line."
    )
    assert first.first_message == "My niece just ran her first half marathon, I am beaming!"
    assert [t["speaker"] for t in first.turns] == ["user", "supporter", "user"]
    assert (first.emotion, first.valence, first.persona_set) == ("proud", "positive", "support")
    # rows of conv 2 are out of order in the file and its third row is malformed (extra commas)
    lonely = found[1]
    assert lonely.first_message == "The flat is so quiet with everyone away, it feels strange."
    assert [t["speaker"] for t in lonely.turns] == ["user", "supporter"]
    assert lonely.valence == "negative" and found[2].valence == "ambiguous"
    # The CSV reader counts its malformed lines; it no longer names each one.
    err = capsys.readouterr().err
    assert "skipped 1 malformed row(s) in" in err and "valid.csv" in err


def test_esconv_official_array(capsys):
    found = contexts(FIX / "esconv" / "ESConv.json")
    assert len(found) == 2
    thesis = found[0]
    assert (
        thesis.first_message == "I am panicking about my thesis."
    )  # leading supporter greeting dropped
    assert thesis.turns[1] == {
        "speaker": "supporter",
        "text": "It sounds like the deadline is weighing on you.",
        "strategy": "Reflection of feelings",
    }
    assert (thesis.emotion, thesis.valence, thesis.source) == ("anxiety", "negative", "esconv")
    assert "skipped 1 malformed row(s) in" in capsys.readouterr().err


def test_esconv_jsonl_split(capsys):
    found = contexts(FIX / "esconv_split" / "train.jsonl")
    assert [c.first_message for c in found] == [
        "I think I am about to lose my job.",
        "I am furious with my dad.",
    ]
    assert [t["speaker"] for t in found[1].turns] == ["user", "supporter"]  # empty turn dropped
    err = capsys.readouterr().err
    assert "skipped 2 malformed row(s) in" in err and "row 3: the dialog has no seeker" in err


def test_qmsum_domain_folders_and_dedup():
    found = contexts(FIX / "qmsum_official", "meeting")
    assert {c.id: c.domain for c in found} == {"a": "Academic", "b": "Product"}
    venue = found[0]
    # the first words are spoken by Professor A (Grad C's turn is only a {vocalsound})
    assert venue.first_message == "Okay, let's start with the venue... we have two options."
    assert [t["speaker"] for t in venue.turns] == ["user", "participant", "user", "participant"]
    assert (
        venue.situation
        == "A meeting covering: Choosing a venue for the spring workshop; Catering budget."
    )
    assert contexts(FIX / "qmsum_official" / "ALL" / "train", "meeting")[0].domain == ""
    assert [c.domain for c in contexts(FIX / "qmsum_official" / "Academic", "meeting")] == [
        "Academic"
    ]


def test_qmsum_domain_mapping_file():
    found = contexts(FIX / "qmsum_mapped" / "train", "meeting")
    assert {c.id: c.domain for c in found} == {"c": "Committee", "d": "Product"}
    one = contexts(FIX / "qmsum_mapped" / "train" / "d.json", "meeting")
    assert one[0].domain == "Product" and one[0].first_message == "The screen could be two inches."


def test_a_broken_meeting_file_is_not_skipped_silently(capsys):
    contexts(FIX / "qmsum_mapped" / "train", "meeting")
    err = capsys.readouterr().err
    assert "broken.json" in err and "skip" in err


def test_qmsum_keeps_at_most_40_turns(tmp_path):
    lines = [{"speaker": f"S{i % 3}", "content": f"Point number {i} ."} for i in range(55)]
    write_json(
        tmp_path / "m.json", {"topic_list": [{"topic": "Long one"}], "meeting_transcripts": lines}
    )
    (context,) = contexts(tmp_path / "m.json", "meeting")
    assert len(context.turns) == datasets.MAX_MEETING_TURNS == 40
    assert context.turns[-1]["text"] == "Point number 39."


def test_shared_style_ed_and_openings_jsonl():
    valid = contexts(FIX / "ed_shared" / "valid_contexts.jsonl")
    assert [c.valence for c in valid] == ["positive", "ambiguous", "negative"]
    assert valid[0].first_message == "Someone posted my wallet back to me, cash and all!"
    assert valid[0].turns == []
    train = contexts(FIX / "ed_shared" / "train_situations.jsonl")
    assert [c.id for c in train] == ["train_situations-1", "train_situations-2"]
    assert (
        train[1].first_message == train[1].situation == "the bus drove past me again this morning."
    )
    openings = contexts(FIX / "qmsum_openings.jsonl", "meeting")
    assert [(c.id, c.domain) for c in openings] == [("X001", "Product"), ("X002", "Committee")]
    assert openings[0].first_message == "Okay, so today's about the shape."
    assert openings[0].turns[1] == {"speaker": "participant", "text": "I've got some sketches."}


def test_a_file_mixing_formats_names_the_first_row_of_the_other_format(tmp_path, capsys):
    """Two files joined: our rows then ESConv dialogues (read as ours by row 1 before: 40 "skipping"
    warnings and a misleading held-out error), or the other way round (read by the majority, our
    rows skipped). Either way one line names the file and the first row of the other format."""
    ours = (FIX / "contexts.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    esconv = (FIX / "esconv_split" / "train.jsonl").read_text(encoding="utf-8").splitlines()[:1]
    ed = (FIX / "ed_shared" / "valid_contexts.jsonl").read_text(encoding="utf-8").splitlines()[0]
    openings = (FIX / "qmsum_openings.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    cases = [
        (ours + esconv * 40, "row 3 is an ESConv dialogue but row 1 is a contexts row in our"),
        (esconv * 40 + ours, "row 41 is a contexts row in our format but row 1 is an ESConv"),
        ([ed, *openings], "row 2 is a QMSum openings row but row 1 is an Empathetic Dialogues"),
    ]
    for n, (rows, message) in enumerate(cases):
        path = tmp_path / f"mixed{n}.jsonl"
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        with pytest.raises(UserError, match=f"mixed{n}.jsonl: {message}") as e:
            inputs("--data", str(path))
        assert "\n" not in str(e.value)
    assert "skipping" not in capsys.readouterr().err
    # A broken row of ours (no first_message, but an ED-like emotion and situation) is skipped
    # as ours, not taken for another format.
    broken = json.loads(ours[1])
    del broken["first_message"]
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join([ours[0], json.dumps(broken)]) + "\n", encoding="utf-8")
    assert [c.id for c in datasets.read_data(str(path), "support")["all"]] == ["sup-01"]
    assert "skipping line 2" in capsys.readouterr().err


def test_a_number_too_long_to_read_is_one_line_naming_the_file_and_row(tmp_path):
    ours = (FIX / "contexts.jsonl").read_text(encoding="utf-8").splitlines()[:2]
    digits = "1" + "0" * 4999  # 5000 digits: past the limit of Python's int()
    in_text = json.loads(ours[0]) | {"situation": "9" * 5000}  # in a string: fine
    esconv = (FIX / "esconv_split" / "train.jsonl").read_text().splitlines()[0]
    for name, rows in {
        "ours.jsonl": [json.dumps(in_text), ours[1][:-1] + f', "emotion": {digits}}}'],
        "esconv.jsonl": [esconv, esconv[:-1] + f', "survey": {digits}}}'],
    }.items():
        path = tmp_path / name
        path.write_text("\n".join(rows) + "\n", encoding="utf-8")
        with pytest.raises(UserError, match=f"{name}: row 2 holds a number of more than 4300"):
            inputs("--data", str(path))
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.jsonl").write_text(esconv + "\n", encoding="utf-8")
    (folder / "test.jsonl").write_text(f'{{"dialog": [], "n": {"7" * 5000}}}\n')
    with pytest.raises(UserError, match="test.jsonl: row 1 holds a number"):
        datasets.read_data(str(folder), "support")


def test_context_source_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(UserError, match="empty.jsonl: unrecognised rows"):
        contexts(empty)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(UserError, match="not an Empathetic Dialogues CSV"):
        contexts(tmp_path / "empty.csv")
    header_only = tmp_path / "test.csv"
    header_only.write_text(
        "conv_id,utterance_idx,context,prompt,speaker_idx,utterance,selfeval,tags\n"
    )
    with pytest.raises(UserError, match="no usable Empathetic Dialogues rows"):
        contexts(header_only)
    binary = tmp_path / "latin.jsonl"
    binary.write_bytes('{"id": "x", "situation": "d\u00e9j\u00e0 vu"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="latin.jsonl: not UTF-8"):
        contexts(binary)
    odd = tmp_path / "odd.jsonl"
    odd.write_text('{"question": "why?"}\n')
    with pytest.raises(UserError, match="odd.jsonl: unrecognised rows"):
        contexts(odd)
    with pytest.raises(UserError, match="no such file or folder"):
        contexts(tmp_path / "missing.csv")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="unrecognised data file"):
        contexts(tmp_path / "notes.txt")
    with pytest.raises(UserError, match="no 'meeting' contexts"):
        contexts(FIX / "ed" / "valid.csv", "meeting")
    # A folder of several data files none of whose names is a split: which one is meant?
    (tmp_path / "two").mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (tmp_path / "two" / name).write_text(
            (FIX / "ed_shared" / "valid_contexts.jsonl").read_text()
        )
    with pytest.raises(UserError, match="pass one file"):
        contexts(tmp_path / "two")


def test_emotion_valence_mapping_counts():
    assert len(datasets.POSITIVE) == 14 and len(datasets.NEGATIVE) == 17
    assert datasets.emotion_valence("Surprised") == "ambiguous"
    assert datasets.emotion_valence("bored", fallback="neutral-ambiguous") == "ambiguous"
    assert datasets.emotion_valence("bored") == ""


# ----------------------------------------------------------------------------------------------
# Official splits, and how a run uses them
# ----------------------------------------------------------------------------------------------


def test_ed_official_csv_splits():
    splits = datasets.load_splits(str(FIX / "ed_splits"), "support")
    assert {k: [c.id for c in v] for k, v in splits.items()} == {
        "train": ["hit:1_conv:2", "hit:2_conv:4"],
        "valid": ["hit:3_conv:6"],
        "test": ["hit:4_conv:8", "hit:5_conv:10"],
    }
    assert splits["train"][0].turns[1]["text"] == "That is amazing, how do you feel?"
    # A run on that folder trains on train and evaluates on test; --held-out plays no part.
    run = inputs("--data", str(FIX / "ed_splits"), "--held-out", "0.5")
    assert [c.id for c in run.train] == ["hit:1_conv:2", "hit:2_conv:4"]
    assert [c.id for c in run.held_out] == ["hit:4_conv:8", "hit:5_conv:10"]
    assert run.split == "official splits: training uses 'train' (2), evaluation 'test' (2)"


def test_qmsum_official_split_folders():
    splits = datasets.load_splits(str(FIX / "qmsum_splits"), "meeting")
    assert {k: sorted(c.id for c in v) for k, v in splits.items()} == {
        "train": ["m1"],
        "valid": ["m2"],
        "test": ["m3", "m4"],
    }
    run = inputs("--data", str(FIX / "qmsum_splits"), "--set", "meeting")
    assert sorted(c.id for c in run.held_out) == ["m3", "m4"] and [c.id for c in run.train] == [
        "m1"
    ]


def test_no_split_folder_and_one_split_fall_back_to_the_random_split():
    # Data without official splits comes back as {"all": ...} (a file, or a folder of one split
    # is {"train": ...} alone); make_inputs then splits it at random.
    assert list(datasets.load_splits(str(FIX / "esconv_sft" / "train.jsonl"), "support")) == ["all"]
    assert list(datasets.load_splits(str(FIX / "esconv_sft"), "support")) == ["train"]
    run = inputs("--data", str(FIX / "esconv_sft"))
    assert len(run.train) + len(run.held_out) == 6 and run.held_out
    assert run.split == "random split, held-out fraction 0.25"
    assert inputs().split == "random split, held-out fraction 0.25"


# ----------------------------------------------------------------------------------------------
# The real datasets (conftest.dataset: skipped where absent)
# ----------------------------------------------------------------------------------------------


def test_real_esconv_train_jsonl():
    found = contexts(dataset("esconv/train.jsonl"))
    assert len(found) == 910
    assert all(
        c.valence == "negative" and c.turns[0] == {"speaker": "user", "text": c.first_message}
        for c in found
    )
    assert Counter(c.emotion for c in found).most_common(1) == [("anxiety", 251)]


def test_real_ed_valid_contexts_match_published_polarity():
    path = dataset("empathetic_dialogues/valid_contexts.jsonl")
    found = contexts(path)
    assert len(found) == 2770
    published = [json.loads(line)["polarity"] for line in path.read_text().splitlines()]
    assert [c.valence for c in found] == [datasets.emotion_valence("", p) for p in published]
    # our built-in mapping reproduces the published one for all 32 labels
    published_map = dataset("empathetic_dialogues/emotion_polarity.json")
    mapping = json.loads(published_map.read_text())["mapping"]
    assert len(mapping) == 32
    assert {e: datasets.emotion_valence(e) for e in mapping} == {
        e: datasets.emotion_valence("", v) for e, v in mapping.items()
    }
    train, held = scenarios.split_contexts(found, 0.25, seed=0)
    assert Counter(c.valence for c in held) == {"negative": 366, "positive": 290, "ambiguous": 37}


def test_real_ed_train_situations():
    found = contexts(dataset("empathetic_dialogues/train_situations.jsonl"))
    assert len(found) == 5000 and all(c.first_message == c.situation for c in found)


def test_real_qmsum_train_folder_and_openings():
    folder = dataset("qmsum/train")
    found = contexts(folder, "meeting")
    assert len(found) == 40 and {c.domain for c in found} == {"Academic"}  # via train_domains.json
    assert all(0 < len(c.turns) <= 40 and c.turns[0]["speaker"] == "user" for c in found)
    assert not any("{" in t["text"] for c in found for t in c.turns)
    # The parent folder's train split is the 40 full meetings plus the openings file of all 162
    # training meetings; one copy per id, the full meeting first.
    whole = contexts(folder.parent, "meeting")
    assert len(whole) == 162 and [c.id for c in whole[:40]] == [c.id for c in found]
    openings = contexts(dataset("qmsum/train_openings.jsonl"), "meeting")
    assert Counter(c.domain for c in openings) == {"Product": 97, "Academic": 41, "Committee": 24}


def test_real_empathetic_dialogues_folder_trains_on_train_and_evaluates_on_valid():
    folder = dataset(
        "empathetic_dialogues"
    )  # the shared copy: train situations + all of valid, no test
    run = inputs("--data", str(folder))
    assert (len(run.train), len(run.held_out)) == (5000, 2770)
    assert run.split == "official splits: training uses 'train' (5000), evaluation 'valid' (2770)"
