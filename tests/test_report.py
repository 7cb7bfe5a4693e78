"""Tests for report.py: the SVG charts, the markdown tables, and the whole page on a fake run.

The fake run folder is written here, file by file, in the formats mascot.py and evaluate.py write,
so these tests need no model and no training.
The last test opens the page in headless Chromium and checks that a real browser draws it; it is
skipped where no chromium binary is installed.
"""

import json
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import report
from report import (build_report, markdown_to_html, nice_ticks, pick_systems, svg_bar_chart,
                    svg_line_chart, tick_label)

AGENTS = ["Anchor", "Catalyst", "Beacon", "Guide"]


# ----------------------------------------------------------------------------------------------
# A fake run folder
# ----------------------------------------------------------------------------------------------

def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def conversation(system, context_id, texts, directives=False, events=()):
    turns = [{"speaker": "User", "text": "I finally finished my thesis draft but I feel empty.",
              "directive": None}]
    for name, text in zip(AGENTS, texts):
        d = ({"agent": name, "action": "validate the feeling", "tone": "warm", "valid": True, "raw": ""}
             if directives else {"agent": name, "action": "", "tone": "", "valid": True, "raw": ""})
        turns.append({"speaker": name, "text": text, "directive": d})
    return {"system": system, "context_id": context_id, "persona_set": "support",
            "situation": "Finished a long project and feels flat.", "emotion": "sad", "valence": "negative",
            "domain": "", "profile": "average", "policy": system, "seed": 0, "turns": turns,
            "events": list(events)}


def make_run(root: Path, eval_files: bool = True) -> Path:
    run = root / "run"
    s1 = [{"step": i, "reward_mean": 0.2 + 0.05 * i, "reward_std": 0.1, "frac_zero_std": 0.25,
           "r_rm": float("nan") if i == 3 else 0.1 * i, "r_format": 0.9, "loss": 1e-8,
           "kl": None if i == 1 else 0.001 * i, "clip_frac": 0.02, "grad_norm": 0.5, "skipped": False,
           "length": 20.0, "lr": 5e-6, "seconds": 1.0} for i in range(1, 6)]
    write_jsonl(run / "stage1" / "metrics.jsonl", s1)
    (run / "stage1" / "summary.json").write_text(json.dumps({
        "pairs": 40, "model": "tiny", "judge": "offline:abc",
        "reward_model": {"train_accuracy": 0.8, "heldout_accuracy": 0.625, "n_train": 32, "n_heldout": 8},
        "heldout_before": {"reward": 0.3, "rm": 0.1, "format": 0.8, "n": 8,
                           "example": {"state": "heldout-0000", "persona": "Anchor", "reply": "before <b>reply</b>"}},
        "heldout_after": {"reward": 0.5, "se": 0.11, "rm": 0.3, "format": 0.9, "n": 8,
                          "change": 0.2, "change_se": 0.15, "example": {"state": "heldout-0000", "persona": "Anchor", "reply": "after reply"}}}))
    s2 = [{"step": i, "reward_mean": 1.5 + 0.1 * i, "reward_std": 0.2, "frac_zero_std": 0.0,
           "r_coherence": 0.5, "r_nonredundancy": 0.6 + 0.02 * i, "r_contribution": 0.7,
           "r_balance": 0.4, "r_format": 1.0, **{f"r_pick_{a}": 0.25 for a in AGENTS},
           "loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.1, "skipped": False,
           "length": 12.0, "lr": 5e-6, "seconds": 2.0} for i in range(1, 5)]
    write_jsonl(run / "stage2" / "metrics.jsonl", s2)
    example_before = conversation("before", "sup-09", ["Fallback before turn."])
    example_after = conversation("after", "sup-09", ["Fallback after turn."], directives=True)
    (run / "stage2" / "summary.json").write_text(json.dumps({
        "heldout_before": {"reward": 1.6, "components": {"coherence": 0.5}, "n": 4, "invalid": 1,
                           "choices": {"Anchor": 3, "Catalyst": 1, "Beacon": 0, "Guide": 0},
                           "example": example_before},
        "heldout_after": {"reward": 1.9, "components": {"coherence": 0.6}, "n": 4, "invalid": 0,
                          "choices": {"Anchor": 1, "Catalyst": 1, "Beacon": 1, "Guide": 1},
                          "example": example_after},
        "invalid_directives": 3, "directives": 32}))
    if eval_files:
        (run / "eval").mkdir()
        (run / "eval" / "results.md").write_text(
            "# Evaluation\n\nHeld-out support contexts, 2 profiles.\n\n## Redundancy\n\n"
            "| system | Self-BLEU | judge (0-100) |\n|:--|--:|--:|\n"
            "| round-robin | 0.412 | 55.0 |\n| MASCOT | **0.301** | 61.5 |\n", encoding="utf-8")
        write_jsonl(run / "eval" / "transcripts.jsonl", [
            conversation("round-robin", "sup-01", ["Base Anchor line.", "Base Catalyst line."]),
            conversation("round-robin", "sup-02", ["Other context."]),
            conversation("MASCOT-C", "sup-01", ["Ablation line."]),
            conversation("MASCOT", "sup-02", ["Mascot on sup-02."], directives=True),
            conversation("MASCOT", "sup-01", ["<script>alert('x')</script> I hear you.", "Trained Catalyst line."],
                         directives=True)])
    return run


# ----------------------------------------------------------------------------------------------
# Ticks and charts
# ----------------------------------------------------------------------------------------------

def test_nice_ticks_hand_computed():
    assert nice_ticks(0.13, 0.92) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(1, 20, min_step=1) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert nice_ticks(1, 3, min_step=1) == [1.0, 2.0, 3.0]          # whole GRPO steps, no 1.5
    assert nice_ticks(-0.5, -0.3) == [-0.5, -0.45, -0.4, -0.35, -0.3]
    assert nice_ticks(0, 0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]         # a constant 0: [0, 1]
    ticks = nice_ticks(0.75, 0.75)                                    # a constant: centred
    assert ticks[0] < 0.75 < ticks[-1] and math.isclose(ticks[0] + ticks[-1], 1.5)
    assert [tick_label(v, 0.05) for v in (0.1, 0.15, -0.0)] == ["0.10", "0.15", "0"]
    assert tick_label(2e-8, 1e-8) == "2e-08"


def coords(svg: str, cls: str = "series") -> list[list[tuple[float, float]]]:
    return [[tuple(map(float, p.split(","))) for p in m.split()]
            for m in re.findall(rf'<polyline class="{cls}" points="([^"]+)"', svg)]


def test_line_chart_maps_points_onto_the_axes():
    svg = svg_line_chart({"a": [(0, 0.0), (10, 1.0)]}, "T", "step", "value")
    (line,) = coords(svg)
    # Plot area: left 62, width 560 - 62 - 16 = 482; x ticks 0..10, y ticks 0..1.
    assert line[0][0] == 62.0 and line[-1][0] == 544.0
    assert line[0][1] > line[-1][1]                  # larger y is drawn higher (smaller pixel y)
    assert "<title>T</title>" in svg and ">step<" in svg and ">value<" in svg and ">a<" in svg


def test_line_chart_gaps_single_points_constants_and_empty():
    nan = float("nan")
    svg = svg_line_chart({"r": [(1, 0.1), (2, nan), (3, 0.3), (4, 0.4), (5, None)]}, "gaps", "x", "y")
    assert len(coords(svg)) == 1 and len(coords(svg)[0]) == 2      # only 3-4 is a line; 1 is a lone dot
    assert svg.count('class="dot"') == 3
    assert "nan" not in svg.lower()
    single = svg_line_chart({"one": [(7, 0.5)]}, "single", "x", "y")
    assert single.count('class="dot"') == 1 and not coords(single) and "no data" not in single
    flat = svg_line_chart({"c": [(1, 0.75), (2, 0.75), (3, 0.75)]}, "flat", "x", "y")
    (line,) = coords(flat)
    ys = {y for _, y in line}
    assert len(ys) == 1 and 38 < ys.pop() < 260 - 46             # drawn inside the plot area
    for empty in ({}, {"a": []}, {"a": [(1, None), (2, nan)]}):
        box = svg_line_chart(empty, "nothing", "x", "y")
        assert box.startswith("<svg") and "no data" in box and "<polyline" not in box


def test_line_chart_band_and_legend_escape():
    svg = svg_line_chart({"m<1>": [(1, 0.0), (2, 1.0)]}, "band", "x", "y",
                         bands={"m<1>": [(1, -0.5, 0.5), (2, 0.5, 1.5)]})
    assert "<polygon" in svg and "m&lt;1&gt;" in svg and "m<1>" not in svg
    assert tick_label(nice_ticks(-0.5, 1.5)[-1], 0.5) in svg       # the band widened the y axis


def test_bar_chart():
    svg = svg_bar_chart({"before": {"Anchor": 3, "Catalyst": 1}, "after": {"Anchor": 1, "Catalyst": 2}},
                        "choices", "directives")
    assert svg.count('class="bar"') == 4 and ">Anchor<" in svg and ">after<" in svg
    acc = svg_bar_chart({"accuracy": {"held-out": 0.625}}, "acc", "accuracy", y_max=1.0,
                        reference=(0.5, "chance"))
    assert acc.count('class="bar"') == 1 and "chance" in acc and "stroke-dasharray" in acc
    assert "no data" in svg_bar_chart({}, "empty", "y") and "no data" in svg_bar_chart({"a": {}}, "e", "y")


def test_markdown_tables_and_escaping():
    out = markdown_to_html("## Title\n\ntext with `code`\n\n| a | b |\n|:-:|--:|\n| <b>x</b> | **2** |\n\n- item\n")
    assert "<h4>Title</h4>" in out and "<code>code</code>" in out
    assert '<th style="text-align:center">a</th>' in out and '<td style="text-align:right"><strong>2</strong></td>' in out
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "<b>" not in out and "<li>item</li>" in out


def test_pick_systems():
    assert pick_systems(["round-robin", "MASCOT-C", "MASCOT"]) == ("round-robin", "MASCOT")
    assert pick_systems(["zero-shot", "MASCOT-P"]) == ("zero-shot", "MASCOT-P")
    assert pick_systems(["random", "round-robin"]) == ("round-robin", "random")
    assert pick_systems(["only"]) == ("only", None)


# ----------------------------------------------------------------------------------------------
# The whole page
# ----------------------------------------------------------------------------------------------

def test_report_on_a_full_fake_run(tmp_path):
    run = make_run(tmp_path)
    path = build_report(run)
    assert path == run / "report.html"
    page = path.read_text(encoding="utf-8")
    assert page.count("<svg") >= 10 and page.count('<polyline class="series"') >= 10
    # Each section names its files and says what to watch.
    for name in ("stage1/metrics.jsonl", "stage1/summary.json", "stage2/metrics.jsonl",
                 "eval/results.md", "eval/transcripts.jsonl"):
        assert name in page
    assert "loss near zero is normal" in page and page.count("What to watch") >= 4
    assert "0.625" in page                                          # reward-model held-out accuracy
    assert "<strong>+0.200 ± 0.150</strong>" in page                # stage-1 paired held-out change
    assert ">r_pick_" not in page and ">Guide<" in page             # pick lines are labelled by agent
    # The results tables, rendered (the file's own "# Evaluation" title is not repeated).
    assert "<h4>Redundancy</h4>" in page and "<h3>Evaluation</h3>" not in page
    assert "<th style=\"text-align:right\">Self-BLEU</th>" in page and "<strong>0.301</strong>" in page
    # Conversations: round-robin vs MASCOT on the same context (sup-01, the first they share).
    convs = page[page.index("Sample conversations"):]
    assert "Base Anchor line." in convs and "Trained Catalyst line." in convs
    assert "Ablation line." not in convs and "Mascot on sup-02." not in convs
    assert "Action: validate the feeling / Tone: warm" in convs
    # Model text is escaped; nothing external is loaded.
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<script" not in page and "<b>reply</b>" not in page
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert "http://" not in page and "https://" not in page
    assert "<link" not in page and "@import" not in page and "url(" not in page


def test_report_with_missing_and_broken_files(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    page = build_report(empty).read_text(encoding="utf-8")
    assert page.count('class="note"') == 4 and "<svg" not in page
    assert "python mascot.py train --stage 1" in page
    # No eval folder: the conversations fall back to stage 2's held-out examples.
    run = make_run(tmp_path, eval_files=False)
    (run / "stage1" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    page = build_report(run).read_text(encoding="utf-8")
    assert "line 2 is not a JSON object" in page                    # a note, not a crash
    assert "Fallback before turn." in page and "Fallback after turn." in page
    assert "eval/results.md not found" in page
    with pytest.raises(report.UserError):
        build_report(tmp_path / "nope")


def find_chromium():
    return next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)


@pytest.mark.skipif(find_chromium() is None, reason="no chromium binary on PATH")
def test_report_renders_in_headless_chromium(tmp_path):
    page = build_report(make_run(tmp_path))
    png = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking", "--disable-component-update",
                        "--disable-sync", f"--user-data-dir={profile}", f"--screenshot={png}",
                        "--window-size=1200,2400", page.resolve().as_uri()],
                       capture_output=True, timeout=120, check=False)
    data = png.read_bytes() if png.exists() else b""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank 1200x2400 page compresses to a few kB; charts, tables and text take far more.
    assert len(data) > 50_000
