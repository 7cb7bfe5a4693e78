"""compare-speakers (extras/compare.py): the pairing arithmetic by hand, and the command end to end on
the tiny model (a plumbing test: the tiny model is random, so only identities are claimed)."""

import json

import pytest
import torch

import mascot
from conftest import ROOT
from extras import compare
from plumbing import files, loading

ESCONV = ROOT / "tests" / "fixtures" / "data" / "esconv" / "ESConv.json"


def row(context: int, draw: int, persona: str, function: float) -> dict:
    return {"context": context, "draw": draw, "persona": persona, "function": function}


def test_per_context_averages_personas_and_draws_and_bleu_is_per_point():
    rows = [
        row(0, 0, "A", 1.0),
        row(0, 0, "B", 0.0),
        row(1, 0, "A", 0.0),
        row(1, 0, "B", 0.0),
        row(0, 1, "A", 1.0),
        row(0, 1, "B", 1.0),
        row(1, 1, "A", 1.0),
        row(1, 1, "B", 0.0),
    ]
    assert compare.per_context(rows, [""] * 8, "function") == [0.75, 0.25]
    # Self-BLEU between the two personas of each (context, draw): identical replies score 1, then
    # the mean over draws; context 1's replies share no word.
    same = "we can talk about it together"
    texts = [same, same, "one two three four", "five six seven eight", same, same, "a b", "c d"]
    bleu = compare.per_context(rows, texts, "self_bleu")
    assert bleu[0] == pytest.approx(1.0) and bleu[1] == pytest.approx(0.0)


def test_by_persona_pairs_each_personas_own_rows_for_any_field():
    a = [
        {**row(c, 0, p, 0.0), "judge": j}
        for c, p, j in [(0, "A", 0.1), (0, "B", 0.5), (1, "A", 0.3)]
    ]
    b = [
        {**row(c, 0, p, 1.0), "judge": j}
        for c, p, j in [(0, "A", 0.4), (0, "B", 0.5), (1, "A", 0.6)]
    ]
    texts = [""] * 3
    judged = compare.by_persona(a, b, texts, texts, ["A", "B"], seed=0, key="judge")
    assert judged["A"]["change"] == pytest.approx(0.3) and judged["A"]["n"] == 2
    assert judged["B"]["change"] == pytest.approx(0.0) and judged["B"]["n"] == 1
    function = compare.by_persona(a, b, texts, texts, ["A", "B"], seed=0)
    assert function["A"]["change"] == pytest.approx(1.0)


def test_paired_change_is_over_the_contexts_both_sides_have():
    r = compare.paired([0.2, 0.4, None, 0.5], [0.3, 0.7, 0.9, 0.4], seed=0)
    assert r["n"] == 3 and r["a"] == pytest.approx(1.1 / 3) and r["b"] == pytest.approx(1.4 / 3)
    diffs = [0.1, 0.3, -0.1]
    assert r["change"] == pytest.approx(0.1)
    mean = sum(diffs) / 3
    se = (sum((d - mean) ** 2 for d in diffs) / 2 / 3) ** 0.5
    assert r["se"] == pytest.approx(se)
    assert r["ci"][0] <= r["change"] <= r["ci"][1]


def run(capsys, *args) -> tuple[int, str, str]:
    capsys.readouterr()
    code = mascot.main(["compare-speakers", "--model", "tiny", "--data", str(ESCONV), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_same_speakers_on_both_sides_change_nothing(tmp_path, capsys):
    out = tmp_path / "c.json"
    code, printed, _ = run(
        capsys,
        "--a",
        "tiny",
        "--b",
        "tiny",
        "--seeds",
        "2",
        "--max-new-tokens",
        "6",
        "--out",
        str(out),
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert result["contexts"] >= 1 and result["seeds"] == 2
    for key, _ in compare.ROWS:
        assert result["table"][key]["change"] in (0.0, None), key
    for key, _ in compare.PERSONA_ROWS:  # function, the judge's score and length, per persona
        assert set(result["per_persona"][key]) == {"Anchor", "Catalyst", "Beacon", "Guide"}
        assert all(r["change"] in (0.0, None) for r in result["per_persona"][key].values()), key
    assert all(s["a"] == s["b"] for s in result["samples"])
    assert len(result["samples"]) == result["contexts"] * 4 * 2  # contexts x personas x draws
    assert "persona function (independent)" in printed and "real supporters" in printed
    assert "the judge's score, per persona:" in printed


def test_other_weights_sample_other_replies_with_the_same_seeds(tmp_path, capsys):
    model, tok = loading.load_model("tiny")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    other = files.save_model(model, tok, tmp_path / "other", "a perturbed copy of the tiny model")
    out = tmp_path / "c.json"
    code, _, _ = run(
        capsys, "--a", "tiny", "--b", str(other), "--max-new-tokens", "6", "--out", str(out)
    )
    assert code == 0
    samples = json.loads(out.read_text())["samples"]
    assert any(s["a"] != s["b"] for s in samples)


def test_a_missing_speaker_folder_is_one_line(tmp_path, capsys):
    code, _, err = run(capsys, "--a", "tiny", "--b", str(tmp_path / "nothing"))
    assert code != 0
    # The fixture's data warnings come first; the error is the last line, and the only one.
    last = err.strip().splitlines()[-1]
    assert "--b" in last and "not a local model folder" in last and "Traceback" not in err
