"""Tests for extras/report.py: the SVG charts, the markdown tables, and the whole page.

Most tests write a fake run folder here, file by file, in the formats mascot.py, grpo.py and
evaluate.py write, so they need no model and no training; one builds a real run with the CLI on
the tiny model at tiny budgets (stage 1 and an evaluation, no stage 2) and reports on it.
The browser test opens the page in headless Chromium and checks that a real browser draws it; it
is skipped where no chromium binary is installed, unless MASCOT_REQUIRE_BROWSER=1 (set by .ci/run).
"""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import extras.report as report
import mascot
from extras.report import (
    build_report,
    markdown_to_html,
    nice_ticks,
    pick_systems,
    svg_line_chart,
    tick_label,
)

ROOT = Path(__file__).resolve().parents[1]
AGENTS = ["Anchor", "Catalyst", "Beacon", "Guide"]
HACKS = ("context_copy", "persona_copy", "history_echo", "self_repeat", "meta_leak", "trivial")


# ----------------------------------------------------------------------------------------------
# A fake run folder
# ----------------------------------------------------------------------------------------------


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value), encoding="utf-8")


def conversation(system, context_id, texts, directives=False, events=(), seed=0):
    """A row of eval/transcripts.jsonl (simulate.Conversation.to_json plus the system's name)."""
    turns = [
        {
            "speaker": "User",
            "text": "I finally finished my thesis draft but I feel empty.",
            "directive": None,
        }
    ]
    for name, text in zip(AGENTS, texts):
        d = (
            {
                "agent": name,
                "action": "validate the feeling",
                "tone": "warm",
                "valid": True,
                "raw": "",
            }
            if directives
            else {"agent": name, "action": "", "tone": "", "valid": True, "raw": ""}
        )
        turns.append({"speaker": name, "text": text, "directive": d})
    return {
        "system": system,
        "context_id": context_id,
        "persona_set": "support",
        "situation": "Finished a long project and feels flat.",
        "emotion": "sad",
        "valence": "negative",
        "domain": "",
        "profile": "average",
        "policy": system,
        "seed": seed,
        "turns": turns,
        "events": list(events),
    }


def grpo_row(step, **extra):
    """A metrics.jsonl row as grpo.train_grpo writes it."""
    return {
        "step": step,
        "frac_reward_zero_std": 0.25,
        "reward": 0.2 + 0.05 * step,
        "reward_std": 0.1,
        **extra,
        "loss": 1e-8,
        "kl": None if step == 1 else 0.001 * step,
        "clip_ratio/region_mean": 0.02,
        "grad_norm": 0.5,
        "logp_mismatch": 0.0,
        "skipped": False,
        "learning_rate": 5e-6,
        "completions/mean_length": 20.0,
        "completions/clipped_ratio": 0.5,
        "entropy": 1.2,
        "seconds": 1.0,
    }


def director_heldout(reward, choices, invalid=0):
    """One held-out measurement of director.Rollout.evaluate (rollouts removed, as in summary.json)."""
    return {
        "reward": reward,
        "se": 0.05,
        "rewards": [reward] * 4,
        "n": 4,
        "components": {
            "coherence": 0.5,
            "nonredundancy": 0.6,
            "contribution": 0.7,
            "clean": 1.0,
            "balance": 0.4,
            "format": 1.0,
        },
        "choices": choices,
        "diagnostics": {
            "counts": choices,
            "distinct": sum(v > 0 for v in choices.values()),
            "entropy": 0.81,
            "entropy_norm": 0.41,
            "mi": 0.0,
            "p_perm": 1.0,
        },
        "agree_least_spoken": 0.5,
        "invalid": invalid,
        "unreadable_judgements": 0,
    }


def make_run(root: Path, eval_files: bool = True) -> Path:
    run = root / "run"
    hacks = {f"hack_{k}": 0.1 * (k == "meta_leak") for k in HACKS}
    write_jsonl(
        run / "stage1" / "metrics.jsonl",
        [
            grpo_row(
                i, r_rm=float("nan") if i == 3 else 0.1 * i, r_format=0.9, **hacks, hack_words=12.0
            )
            for i in range(1, 6)
        ],
    )
    held = {
        "states": ["heldout-0000", "heldout-0000"],
        "rewards": [0.3, 0.3],
        "replies": ["before <b>reply</b>", "x"],
    }
    write_json(
        run / "stage1" / "summary.json",
        {
            "pairs": 40,
            "reward_model": {
                "n_train": 32,
                "n_heldout": 8,
                "n_heldout_hack": 4,
                "train_loss": 0.6,
                "train_accuracy": 0.8,
                "heldout_loss": 0.65,
                "heldout_accuracy": 0.625,
                "heldout_hack_accuracy": 0.75,
            },
            "heldout_before": {"reward": 0.3, "se": 0.1, "rm": 0.1, "format": 0.8, "n": 8, **held},
            "heldout_after": {
                "reward": 0.5,
                "se": 0.11,
                "rm": 0.3,
                "format": 0.9,
                "n": 8,
                **held,
                "change": 0.2,
                "change_se": 0.15,
            },
            "judge": "offline:abc",
            "model": "tiny",
            "speakers": "run/stage1/speakers",
        },
    )
    write_jsonl(
        run / "stage2" / "metrics.jsonl",
        [
            grpo_row(
                i,
                r_coherence=0.5,
                r_nonredundancy=0.6 + 0.02 * i,
                r_contribution=0.7,
                r_clean=1.0,
                r_balance=0.4,
                r_format=1.0,
                **{f"r_pick_{a}": 0.25 for a in AGENTS},
                r_choice_entropy=2.0,
                r_choice_mi=0.1,
            )
            for i in range(1, 5)
        ],
    )
    before = director_heldout(1.6, {"Anchor": 3, "Catalyst": 1, "Beacon": 0, "Guide": 0}, invalid=1)
    after = director_heldout(1.9, {"Anchor": 1, "Catalyst": 1, "Beacon": 1, "Guide": 1})
    write_json(
        run / "stage2" / "summary.json",
        {
            "heldout_before": None,
            "heldout_least_spoken": before,  # --no-eval-prompted: null
            "warm_start": {
                "steps": 2,
                "lr": 2e-5,
                "source": "format only, random agents",
                "losses": [1.0, 0.9],
                "heldout": director_heldout(
                    1.7, {"Anchor": 2, "Catalyst": 2, "Beacon": 0, "Guide": 0}
                ),
                "targets": {"Anchor": 4},
            },
            "heldout_after": after,
            "paired_vs": {"least-spoken": {"change": 0.3, "se": 0.1, "n": 4}},
            "speakers": "run/stage1/speakers",
            "judge": "offline:abc",
            "model": "tiny",
            "director": "run/stage2/director",
            "invalid_directives": 3,
            "directives": 32,
            "unreadable_judgements": 0,
        },
    )
    # Stage 2's held-out rollouts: each point's prefix, then the director's turns from first_turn on.
    for name, text in (
        ("least-spoken", "Fallback before turn."),
        ("trained", "Fallback after turn."),
    ):
        write_jsonl(
            run / "stage2" / f"heldout_{name}.jsonl",
            [
                {
                    "stage": "1",
                    "first_turn": 2,
                    **conversation(name, "sup-09", ["Prefix.", text], name == "trained"),
                }
            ],
        )
    if eval_files:
        (run / "eval").mkdir()
        (run / "eval" / "results.md").write_text(
            "# Evaluation\n\nHeld-out support contexts, 2 profiles.\n\n- **round-robin**: base speakers\n\n"
            "## Redundancy\n\n| system | Self-BLEU | judge (0-100) |\n|:--|--:|--:|\n"
            "| round-robin | 0.412 | 55.0 |\n| mascot | **0.301** | 61.5 |\n",
            encoding="utf-8",
        )
        write_jsonl(
            run / "eval" / "transcripts.jsonl",
            [
                conversation("round-robin", "sup-01", ["Base Anchor line.", "Base Catalyst line."]),
                conversation("round-robin", "sup-02", ["Other context."], seed=1),
                conversation("mascot-c", "sup-01", ["Ablation line."]),
                conversation("mascot", "sup-02", ["Mascot on sup-02."], directives=True, seed=1),
                conversation(
                    "mascot",
                    "sup-01",
                    ["<script>alert('x')</script> I hear you.", "Trained Catalyst line."],
                    directives=True,
                ),
            ],
        )
    return run


# ----------------------------------------------------------------------------------------------
# Ticks and charts
# ----------------------------------------------------------------------------------------------


def test_nice_ticks_hand_computed():
    assert nice_ticks(0.13, 0.92) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(1, 20, min_step=1) == [0.0, 5.0, 10.0, 15.0, 20.0]
    assert nice_ticks(1, 3, min_step=1) == [1.0, 2.0, 3.0]  # whole GRPO steps, no 1.5
    assert nice_ticks(-0.5, -0.3) == [-0.5, -0.45, -0.4, -0.35, -0.3]
    assert nice_ticks(0, 0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]  # a constant 0: [0, 1]
    ticks = nice_ticks(0.75, 0.75)  # a constant: centred
    assert ticks[0] < 0.75 < ticks[-1] and math.isclose(ticks[0] + ticks[-1], 1.5)
    assert [tick_label(v, 0.05) for v in (0.1, 0.15, -0.0)] == ["0.10", "0.15", "0"]
    assert tick_label(2e-8, 1e-8) == "2e-08"


def coords(svg: str, cls: str = "series") -> list[list[tuple[float, float]]]:
    return [
        [tuple(map(float, p.split(","))) for p in m.split()]
        for m in re.findall(rf'<polyline class="{cls}" points="([^"]+)"', svg)
    ]


def test_line_chart_maps_points_onto_the_axes():
    svg = svg_line_chart({"a": [(0, 0.0), (10, 1.0)]}, "T", "step", "value")
    (line,) = coords(svg)
    # Plot area: left 62, width 560 - 62 - 16 = 482; x ticks 0..10, y ticks 0..1.
    assert line[0][0] == 62.0 and line[-1][0] == 544.0
    assert line[0][1] > line[-1][1]  # larger y is drawn higher (smaller pixel y)
    assert "<title>T</title>" in svg and ">step<" in svg and ">value<" in svg and ">a<" in svg


def test_line_chart_gaps_single_points_constants_and_empty():
    nan = float("nan")
    svg = svg_line_chart(
        {"r": [(1, 0.1), (2, nan), (3, 0.3), (4, 0.4), (5, None)]}, "gaps", "x", "y"
    )
    assert len(coords(svg)) == 1 and len(coords(svg)[0]) == 2  # only 3-4 is a line; 1 is a lone dot
    assert svg.count('class="dot"') == 3
    assert "nan" not in svg.lower()
    single = svg_line_chart({"one": [(7, 0.5)]}, "single", "x", "y")
    assert single.count('class="dot"') == 1 and not coords(single) and "no data" not in single
    flat = svg_line_chart({"c": [(1, 0.75), (2, 0.75), (3, 0.75)]}, "flat", "x", "y")
    (line,) = coords(flat)
    ys = {y for _, y in line}
    assert len(ys) == 1 and 38 < ys.pop() < 260 - 46  # drawn inside the plot area
    for empty in ({}, {"a": []}, {"a": [(1, None), (2, nan)]}):
        box = svg_line_chart(empty, "nothing", "x", "y")
        assert box.startswith("<svg") and "no data" in box and "<polyline" not in box
    # A series with no value at all (a key an older run did not log) gets no legend entry.
    partial = svg_line_chart(
        {"kept": [(1, 0.1), (2, 0.2)], "absent": [(1, None), (2, None)]}, "p", "x", "y"
    )
    assert ">kept<" in partial and "absent" not in partial


def test_line_chart_band_and_legend_escape():
    svg = svg_line_chart(
        {"m<1>": [(1, 0.0), (2, 1.0)]},
        "band",
        "x",
        "y",
        bands={"m<1>": [(1, -0.5, 0.5), (2, 0.5, 1.5)]},
    )
    assert "<polygon" in svg and "m&lt;1&gt;" in svg and "m<1>" not in svg
    assert tick_label(nice_ticks(-0.5, 1.5)[-1], 0.5) in svg  # the band widened the y axis


def test_markdown_tables_and_escaping():
    out = markdown_to_html(
        "## Title\n\ntext with `code`\n\n| a | b |\n|:-:|--:|\n| <b>x</b> | **2** |\n\n- item\n"
    )
    assert "<h4>Title</h4>" in out and "<code>code</code>" in out
    assert (
        '<th style="text-align:center">a</th>' in out
        and '<td style="text-align:right"><strong>2</strong></td>' in out
    )
    assert "&lt;b&gt;x&lt;/b&gt;" in out and "<b>" not in out and "<ul><li>item</li></ul>" in out
    assert "<table>" in out and out.count("<tr>") == 2  # the header row and one body row
    assert ">a | b</th>" in markdown_to_html(
        "| a \\| b | c |\n|--|--|\n| 1 | 2 |"
    )  # '\|': a '|' in a cell


def test_pick_systems():
    assert pick_systems(["round-robin", "mascot-c", "mascot"]) == ("round-robin", "mascot")
    assert pick_systems(["zero-shot", "mascot-p"]) == ("zero-shot", "mascot-p")
    assert pick_systems(["random", "round-robin"]) == ("round-robin", "random")
    assert pick_systems(["least-spoken", "prompted", "trained"]) == ("least-spoken", "trained")
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
    for name in (
        "stage1/metrics.jsonl",
        "stage1/summary.json",
        "stage2/metrics.jsonl",
        "eval/results.md",
        "eval/transcripts.jsonl",
    ):
        assert name in page
    assert "loss near zero is normal" in page and page.count("What to watch") >= 4
    assert "0.625" in page  # reward-model held-out accuracy
    assert "<strong>+0.200 ± 0.150</strong>" in page  # stage-1 paired held-out change
    # GRPO's per-step keys become labelled lines: components, hack diagnostics, pick shares.
    assert ">meta leak<" in page and ">history echo<" in page and ">nonredundancy<" in page
    assert ">r_pick_" not in page and ">Guide<" in page and ">hack_" not in page
    # Stage 2's held-out table: the directors that ran (not the prompted one: null), their choices.
    stage2 = page[page.index('id="stage2"') : page.index('id="eval"')]
    assert (
        "least-spoken rule" in stage2
        and "after warm start" in stage2
        and "<td>prompted</td>" not in stage2
    )
    assert (
        "Anchor 3, Catalyst 1, Beacon 0, Guide 0" in stage2
        and "<strong>0.300 ± 0.100</strong>" in stage2
    )
    assert "3 of 32" in stage2 and "format only, random agents" in stage2
    # The results tables, rendered (the file's own "# Evaluation" title is not repeated).
    assert "<h4>Redundancy</h4>" in page and "<h3>Evaluation</h3>" not in page
    assert (
        '<th style="text-align:right">Self-BLEU</th>' in page and "<strong>0.301</strong>" in page
    )
    # Conversations: round-robin vs mascot on the same context (sup-01, the first they share).
    convs = page[page.index("Sample conversations") :]
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
    # No eval folder: the conversations fall back to stage 2's held-out rollouts.
    run = make_run(tmp_path, eval_files=False)
    (run / "stage1" / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    page = build_report(run).read_text(encoding="utf-8")
    assert "line 2 is not a JSON object" in page  # a note, not a crash
    assert "Fallback before turn." in page and "Fallback after turn." in page
    assert "the rollout under this director" in page  # where the director took over
    assert "eval/results.md not found" in page
    # A summary that is not an object, and one whose parts are null or of the wrong type.
    (run / "stage1" / "summary.json").write_text("[1, 2]")
    (run / "stage2" / "summary.json").write_text(
        '{"heldout_after": null, "paired_vs": 3, "warm_start": "x"}'
    )
    page = build_report(run).read_text(encoding="utf-8")
    assert "summary.json is not a JSON object" in page and "Stage 2" in page
    with pytest.raises(report.UserError):
        build_report(tmp_path / "nope")


@pytest.mark.parametrize("value", ["1" * 400, "1" * 5000, "1e308", "-1e308"])
def test_report_shows_a_huge_metric_as_not_a_number(tmp_path, value):
    """metrics.jsonl with a 400- or 5000-digit int or ±1e308 (a damaged or tampered file): that value
    is a gap in its chart (the other steps still drawn) and shows as not a number, no traceback."""
    run = make_run(tmp_path)
    path = run / "stage1" / "metrics.jsonl"
    rows = path.read_text(encoding="utf-8").splitlines()
    rows[1] = rows[1].replace('"reward": ', f'"reward": {value}, "was": ', 1)
    rows[2] = rows[2].replace('"kl": ', f'"kl": {value}, "was": ', 1)
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    summary = json.loads((run / "stage1" / "summary.json").read_text(encoding="utf-8"))
    summary_text = json.dumps(summary).replace('"pairs": 40', f'"pairs": {value}')
    (run / "stage1" / "summary.json").write_text(summary_text, encoding="utf-8")
    page = build_report(run).read_text(encoding="utf-8")
    stage1 = page[page.index('id="stage1"') : page.index('id="stage2"')]
    assert "Reward per step" in stage1 and stage1.count('class="series"') >= 5
    reward = stage1[
        stage1.index("Reward per step") : stage1.index("</svg>", stage1.index("Reward per step"))
    ]
    assert len(coords(reward)) == 1 and reward.count('class="dot"') == 4  # steps 3-5; 1 alone
    assert "inf" not in reward and "nan" not in reward.lower() and value[:20] not in reward
    assert "1111111111" not in stage1  # not in a chart, nor in the summary's text


def test_nice_ticks_of_spans_too_small_or_large_for_a_float():
    assert nice_ticks(0, 5e-324) == nice_ticks(0, 0)  # a subnormal beside 0: a constant 0
    ticks = nice_ticks(1e-301, 1e-301)  # a tiny constant: centred, its own scale
    assert ticks[0] < 1e-301 < ticks[-1]
    ticks = nice_ticks(-1e300, 1e300)  # report.LIMIT: the widest span a chart draws
    assert ticks[0] <= -1e300 and ticks[-1] >= 1e300 and all(map(math.isfinite, ticks))
    assert not report.finite(1e308) and not report.finite(10**400) and report.finite(10**300)


def test_report_of_a_real_stage1_run_through_the_cli(tmp_path, capsys):
    """The tiny model, tiny budgets: stage 1 and an evaluation, no stage 2. The report reads what
    the real writers wrote, and `mascot.py report` dispatches to it."""
    run = str(tmp_path / "run")
    common = ["--model", "tiny", "--run", run, "--max-new-tokens", "8"]
    assert (
        mascot.main(
            [
                "train",
                "--stage",
                "1",
                *common,
                "--states",
                "4",
                "--heldout-states",
                "2",
                "--candidates",
                "2",
                "--steps",
                "2",
                "--prompts-per-step",
                "2",
                "--group-size",
                "2",
            ]
        )
        == 0
    )
    assert (
        mascot.main(
            [
                "evaluate",
                *common,
                "--contexts",
                "2",
                "--turns",
                "2",
                "--systems",
                "round-robin,mascot-c",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert mascot.main(["report", "--run", run]) == 0
    assert f"report written to {Path(run) / 'report.html'}" in capsys.readouterr().out
    page = (Path(run) / "report.html").read_text(encoding="utf-8")
    stage1 = page[page.index('id="stage1"') : page.index('id="stage2"')]
    assert stage1.count("<svg") >= 6 and "no data" not in stage1 and 'class="note"' not in stage1
    assert (
        ">context copy<" in stage1
        and ">rm<" in stage1
        and "Held-out change after - before" in stage1
    )
    assert "No stage-2 results" in page and "<h4>Redundancy over agent turns</h4>" in page
    assert "<strong>round-robin</strong> vs <strong>mascot-c</strong>, on the same context" in page
    # The same from the script itself, and its one-line error for a folder that is not there.
    script = [sys.executable, str(ROOT / "extras" / "report.py")]
    done = subprocess.run([*script, "--run", run], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "report written to" in done.stdout
    bad = subprocess.run(
        [*script, "--run", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120
    )
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("error: --run")
        and "Traceback" not in bad.stderr
    )


def find_chromium():
    return next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )


def test_report_renders_in_headless_chromium(tmp_path):
    binary = find_chromium()
    if binary is None:
        if os.environ.get("MASCOT_REQUIRE_BROWSER") == "1":
            pytest.fail(
                "MASCOT_REQUIRE_BROWSER=1 but no chromium binary on PATH (.ci/run installs it)"
            )
        pytest.skip("no chromium binary on PATH")
    page = build_report(make_run(tmp_path))
    png = tmp_path / "report.png"
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                f"--screenshot={png}",
                "--window-size=1200,2400",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=120,
            check=False,
        )
    data = png.read_bytes() if png.exists() else b""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    # A blank 1200x2400 page compresses to a few kB; charts, tables and text take far more.
    assert len(data) > 50_000
