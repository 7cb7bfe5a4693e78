"""Tests of the official dataset splits (corpora.load_splits) and of how a run uses them
(mascot.load_inputs): a folder with train / valid / test trains on train and evaluates on test.
The fixtures in tests/fixtures/data/ are our own few-line stand-ins in the official formats.

Run: .venv/bin/python -m pytest -q tests/test_corpora.py
"""

from pathlib import Path

import corpora
import mascot
from conftest import dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "data"


def inputs(*argv):
    args = mascot.build_parser().parse_args(["evaluate", "--model", "tiny", *argv])
    return mascot.load_inputs(args)


def test_ed_official_csv_splits():
    splits = corpora.load_splits(str(FIXTURES / "ed_splits"))
    assert {k: [c.id for c in v] for k, v in splits.items()} == {
        "train": ["hit:1_conv:2", "hit:2_conv:4"], "valid": ["hit:3_conv:6"], "test": ["hit:4_conv:8", "hit:5_conv:10"]}
    assert splits["train"][0].turns[1]["text"] == "That is amazing, how do you feel?"
    # A run on that folder trains on train and evaluates on test; --held-out plays no part.
    run = inputs("--data", str(FIXTURES / "ed_splits"), "--held-out", "0.5")
    assert [c.id for c in run.train] == ["hit:1_conv:2", "hit:2_conv:4"]
    assert [c.id for c in run.held_out] == ["hit:4_conv:8", "hit:5_conv:10"]
    assert run.split == "official splits: training uses 'train' (2), evaluation 'test' (2)"


def test_qmsum_official_split_folders():
    splits = corpora.load_splits(str(FIXTURES / "qmsum_splits"), persona_set="meeting")
    assert {k: sorted(c.id for c in v) for k, v in splits.items()} == {"train": ["m1"], "valid": ["m2"],
                                                                       "test": ["m3", "m4"]}
    run = inputs("--data", str(FIXTURES / "qmsum_splits"), "--set", "meeting")
    assert sorted(c.id for c in run.held_out) == ["m3", "m4"] and [c.id for c in run.train] == ["m1"]


def test_no_split_folder_and_one_split_fall_back_to_the_random_split():
    assert corpora.load_splits("bundled") == {}
    assert corpora.load_splits(str(FIXTURES / "esconv_sft" / "train.jsonl")) == {}     # a file, not a folder
    assert list(corpora.load_splits(str(FIXTURES / "esconv_sft"))) == ["train"]
    run = inputs("--data", str(FIXTURES / "esconv_sft"))
    assert len(run.train) + len(run.held_out) == 6 and run.held_out
    assert run.split == "random split, held-out fraction 0.25 (the folder holds only the 'train' split)"
    assert inputs().split == "random split, held-out fraction 0.25"


def test_real_empathetic_dialogues_folder_trains_on_train_and_evaluates_on_valid():
    folder = dataset("empathetic_dialogues")      # the shared copy: train situations + all of valid, no test
    run = inputs("--data", str(folder))
    assert (len(run.train), len(run.held_out)) == (5000, 2770)
    assert run.split == "official splits: training uses 'train' (5000), evaluation 'valid' (2770)"
