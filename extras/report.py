"""extras/report.py: one self-contained HTML page that shows what a MASCOT run did.

A tool beside the method, the last step, after `train --stage 1`, `train --stage 2` and `evaluate`. It only READS the
run folder and writes RUN/report.html: each stage's GRPO curves (stageN/metrics.jsonl) and held-out numbers
(stageN/summary.json), the evaluation's tables (eval/results.md) and round-robin beside MASCOT on one context
(eval/transcripts.jsonl, else stage2/heldout_*.jsonl). The page loads nothing (no scripts, fonts or style sheets:
inline SVG charts), so it can be mailed or opened offline. A missing or damaged file turns its part into a note, never
a traceback; all model text is HTML-escaped. Simplified: no interactivity or smoothing (a laptop run is short), a
fixed colour-blind-safe palette.
    python mascot.py report --run runs/default       # or: python extras/report.py --run runs/default
"""

import argparse
import html
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

# Run as a script (python extras/report.py), Python puts extras/ first on sys.path, not the
# repository root that holds the project's modules: add it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbing.common import UserError
from plumbing.files import read_json, read_jsonl, write_text_atomic
from plumbing.runs import run_lock

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
W, H = 560, 260  # every chart's size in pixels


def esc(text) -> str:
    """Any value as HTML text: model text never becomes markup."""
    return html.escape(str(text), quote=True)


# The largest magnitude a chart places. Beyond it an axis's span (hi - lo) and its ticks overflow a
# float; a metric that large (a 400-digit int, 1e308 in a damaged metrics.jsonl) is no measurement.
LIMIT = 1e300


def finite(v) -> bool:
    """A real number that is not NaN or infinite, nor beyond ±LIMIT (a bool is not a number here).
    Compared, not converted: float() of a 400-digit int overflows."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and -LIMIT <= v <= LIMIT


# --- 1. Axis ticks with round numbers -------------------------------------------------------------
def nice_number(x: float, round_it: bool) -> float:
    """The 'nice' number (1, 2 or 5 times a power of ten) nearest x; not round_it: the least >= x (Heckbert 1990)."""
    e = math.floor(math.log10(x))
    f = x / 10**e  # in [1, 10)
    if round_it:
        limits = ((1.5, 1), (3, 2), (7, 5))  # f below the limit -> that nice number
        nice = next((n for limit, n in limits if f < limit), 10)
    else:
        limits = ((1, 1), (2, 2), (5, 5))  # f at most the limit -> that nice number
        nice = next((n for limit, n in limits if f <= limit), 10)
    return 10**e * nice


TINY = 1e-300  # the least span nice_ticks divides into ticks


def nice_ticks(lo: float, hi: float, max_ticks: int = 6, min_step: float = 0.0) -> list[float]:
    """Round ticks covering [lo, hi], first and last the axis limits: (0.13, 0.92) -> 0.0, 0.2 .. 1.0. A constant is
    widened to sit mid-plot, but 0 gets [0, 1] (a share that never moved); min_step=1: whole ticks (GRPO steps)."""
    lo, hi = min(lo, hi), max(lo, hi)  # the same pair, in order
    # A span below TINY is a constant: its tick step would underflow to 0 (5e-324 beside 0).
    if hi - lo < TINY and abs(lo) < TINY:
        lo, hi = 0.0, 1.0  # a share that never moved
    elif hi - lo < TINY:
        pad = 1.0 if lo == int(lo) else abs(lo) * 0.1
        lo, hi = lo - pad, hi + pad
    step = max(nice_number(nice_number(hi - lo, False) / (max_ticks - 1), True), min_step)
    first = math.floor(lo / step + 1e-9)  # 1e-9: float slack
    last = math.ceil(hi / step - 1e-9)
    # k * step, not a running sum (no accumulated error), rounded: 0.6000000000000001 -> 0.6; + 0.0: no -0.0.
    return [
        round(k * step, max(0, -math.floor(math.log10(step))) + 1) + 0.0
        for k in range(first, last + 1)
    ]


def tick_label(value: float, step: float) -> str:
    """Just enough decimals for the tick step: step 0.05 -> '0.15', step 5 -> '15'; tiny steps: '2e-08'."""
    if 0 < step < 1e-3:
        return "0" if value == 0 else f"{value:.3g}"
    decimals = 2
    if step > 0:
        decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    text = f"{value:.{decimals}f}"
    return "0" if re.fullmatch(r"-0\.?0*", text) else text  # no "-0.0"


# --- 2. SVG charts --------------------------------------------------------------------------------
def _svg(title: str, body: list[str]) -> str:
    """A W x H chart: a white background, the title, then the body's elements."""
    return "\n".join(
        [
            f'<svg width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{esc(title)}" '
            f'style="max-width:100%;height:auto;{FONT}"><title>{esc(title)}</title>',
            f'<rect width="{W}" height="{H}" fill="#fff"/><text x="{W / 2}" y="18" text-anchor="middle" '
            f'font-size="14" font-weight="600" fill="#222">{esc(title)}</text>',
            *body,
            "</svg>",
        ]
    )


def no_data_svg(title: str, reason: str = "no data") -> str:
    """A chart with nothing to draw: a dashed box saying why."""
    return _svg(
        title,
        [
            f'<rect x="20" y="32" width="{W - 40}" height="{H - 52}" fill="#fafafa" stroke="#bbb" '
            f'stroke-dasharray="6 4"/><text x="{W / 2}" y="{H / 2 + 10}" text-anchor="middle" '
            f'font-size="13" fill="#777">{esc(reason)}</text>'
        ],
    )


def finite_runs(points: list[tuple]) -> list[list[tuple]]:
    """The runs of consecutive points whose every coordinate is finite, as floats: a point with a
    None, NaN or infinity leaves a gap between two runs."""
    runs = []
    for ok, run in groupby(points, lambda p: all(map(finite, p))):
        if ok:
            runs.append([tuple(map(float, p)) for p in run])
    return runs


@dataclass
class Plot:
    """The plot area of a chart in pixels and its axes' ticks: values -> pixels."""

    left: float
    top: float
    width: float
    height: float
    xt: list[float]  # the x ticks, first and last the axis limits
    yt: list[float]

    def x(self, value: float) -> float:  # value -> pixel column
        return self.left + (value - self.xt[0]) / (self.xt[-1] - self.xt[0]) * self.width

    def y(self, value: float) -> float:  # value -> pixel row (SVG rows grow downwards)
        return (
            self.top + self.height - (value - self.yt[0]) / (self.yt[-1] - self.yt[0]) * self.height
        )


def svg_line_chart(
    series: dict[str, list[tuple]],
    title: str,
    xlabel: str,
    ylabel: str,
    bands: dict[str, list[tuple]] | None = None,
) -> str:
    """A line chart: series name -> [(x, y), ...], an x or y of None/NaN/inf leaving a gap, a lone point drawn as a
    dot; bands: name -> [(x, low, high), ...], shaded behind that series. No finite point: a "no data" box."""
    segs = {}  # name -> its finite runs; an empty series gets no legend entry
    for name, pts in series.items():
        if runs := finite_runs(pts):
            segs[name] = runs
    band_segs = {name: finite_runs(b) for name, b in (bands or {}).items() if name in segs}
    xs = []
    for runs in segs.values():
        for run in runs:
            xs += [p[0] for p in run]
    if not xs:
        return no_data_svg(title)
    ys = []  # every y, and every band's low and high
    for runs in [*segs.values(), *band_segs.values()]:
        for run in runs:
            for p in run:
                ys += p[1:]
    parts, y = legend_svg(list(segs))
    whole = all(x == int(x) for x in xs)  # GRPO steps: whole ticks
    xt = nice_ticks(min(xs), max(xs), min_step=1.0 if whole else 0.0)
    yt = nice_ticks(min(ys), max(ys), max_ticks=5)
    plot = Plot(62, y + 16, W - 62 - 16, H - y - 16 - 46, xt, yt)  # under the legend
    parts += axes_svg(plot, xlabel, ylabel)
    for i, name in enumerate(segs):
        parts += series_svg(plot, segs[name], band_segs.get(name, []), PALETTE[i % 8])
    return _svg(title, parts)


def legend_svg(names: list[str]) -> tuple[list[str], int]:
    """The legend in rows under the title, a coloured line and the name per series; and the y of its last row."""
    parts = []
    x = 56
    y = 38
    for i, name in enumerate(names):
        item_w = 26 + 6.6 * len(name) + 16  # swatch + text (11px font) + gap
        if x > 56 and x + item_w > W - 10:  # no room left on this row: start the next
            x = 56
            y += 16
        parts.append(
            f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 20:.1f}" y2="{y - 4}" stroke="{PALETTE[i % 8]}" '
            f'stroke-width="2.5"/><text x="{x + 26:.1f}" y="{y}" font-size="11" fill="#333">{esc(name)}</text>'
        )
        x += item_w
    return parts, y


def axes_svg(plot: Plot, xlabel: str, ylabel: str) -> list[str]:
    """Horizontal grid lines at the y ticks, the x ticks, the axes and their labels."""
    left, top, pw, ph = plot.left, plot.top, plot.width, plot.height
    xt, yt = plot.xt, plot.yt
    parts = [
        f'<line x1="{left}" y1="{plot.y(v):.1f}" x2="{left + pw}" y2="{plot.y(v):.1f}" stroke="#e6e6e6"/><text x="'
        f'{left - 6}" y="{plot.y(v) + 4:.1f}" text-anchor="end" font-size="11" fill="#444">'
        f"{tick_label(v, yt[1] - yt[0])}</text>"
        for v in yt
    ]
    parts += [
        f'<line x1="{plot.x(x):.1f}" y1="{top + ph}" x2="{plot.x(x):.1f}" y2="{top + ph + 5}" stroke="#666"/><text x="'
        f'{plot.x(x):.1f}" y="{top + ph + 18}" text-anchor="middle" font-size="11" fill="#444">'
        f"{tick_label(x, xt[1] - xt[0])}</text>"
        for x in xt
    ]
    parts.append(
        f'<polyline points="{left},{top} {left},{top + ph} {left + pw},{top + ph}" fill="none" stroke="#666"/>'
        f'<text x="{left + pw / 2:.1f}" y="{H - 8}" text-anchor="middle" font-size="12" fill="#333">'
        f'{esc(xlabel)}</text><text x="14" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="12" '
        f'fill="#333" transform="rotate(-90 14 {top + ph / 2:.1f})">{esc(ylabel)}</text>'
    )
    return parts


def series_svg(
    plot: Plot, runs: list[list[tuple]], bands: list[list[tuple]], color: str
) -> list[str]:
    """One series: its band (shaded, under the line), then a line per run; dots on lone points
    and on every point of a short series."""
    parts = []
    for seg in bands:  # the band's upper edge left to right, then its lower edge back
        edge = [(x, hi) for x, _, hi in seg] + [(x, lo) for x, lo, _ in reversed(seg)]
        points = " ".join(f"{plot.x(x):.1f},{plot.y(v):.1f}" for x, v in edge)
        parts.append(
            f'<polygon points="{points}" fill="{color}" fill-opacity="0.15" stroke="none"/>'
        )
    short = sum(map(len, runs)) <= 25
    for seg in runs:
        if len(seg) > 1:
            points = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in seg)
            parts.append(
                f'<polyline class="series" points="{points}'
                f'" fill="none" stroke="{color}" stroke-width="2" stroke-linejoin="round"/>'
            )
        if len(seg) == 1 or short:  # dots: lone points, short runs
            parts += [
                f'<circle class="dot" cx="{plot.x(x):.1f}" cy="{plot.y(y):.1f}" r="2.8" fill="{color}"/>'
                for x, y in seg
            ]
    return parts


# --- 3. A tiny markdown converter: tables, headings, lists, paragraphs (enough for results.md) ------
def _inline(text: str) -> str:
    """Escape, then **bold** and `code` (the only inline markup results.md uses)."""
    return re.sub(
        r"\*\*([^*]+)\*\*",
        r"<strong>\1</strong>",
        re.sub(r"`([^`]+)`", r"<code>\1</code>", esc(text)),
    )


# A '|--|:-:|' line: what makes the line above it a table's header.
SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def markdown_to_html(text: str) -> str:
    """The markdown evaluate.py writes, as HTML; other text stays escaped. A table is a line with '|' over a '|--|'
    line (':' aligns); '#' becomes <h3> (the page owns h1, h2); else a list item ('- ') or a paragraph per line."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        if "|" in line and i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            table, i = table_html(lines, i)
            out.append(table)
            continue
        if heading:
            n = min(len(heading.group(1)) + 2, 6)
            out.append(f"<h{n}>{_inline(heading.group(2))}</h{n}>")
        elif re.match(r"[-*]\s", line):
            out.append(f"<li>{_inline(line[2:].strip())}</li>")
        elif line:
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    # Consecutive list items become one list.
    return re.sub(
        r"((?:<li>.*</li>\n?)+)", lambda m: f"<ul>{m.group(1).strip()}</ul>\n", "\n".join(out)
    ).strip()


def table_html(lines: list[str], i: int) -> tuple[str, int]:
    """The table whose header is lines[i] (its separator lines[i + 1]) as HTML, and the index of
    the first line after it."""
    aligns = [alignment(c) for c in table_cells(lines[i + 1])]
    rows = [table_cells(lines[i].strip())]
    i += 2
    while i < len(lines) and "|" in lines[i] and lines[i].strip():
        rows.append(table_cells(lines[i]))
        i += 1
    body = "\n".join(table_row_html("td", r, aligns) for r in rows[1:])
    head = table_row_html("th", rows[0], aligns)
    return f"<table>\n<thead>{head}</thead>\n<tbody>\n{body}\n</tbody></table>", i


def table_cells(line: str) -> list[str]:
    """A table line's cells, stripped; the outer '|' are optional, and '\\|' is a '|' inside a cell."""
    inner = re.sub(r"^\||(?<!\\)\|$", "", line.strip())
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", inner)]


def alignment(separator_cell: str) -> str:
    """':-:' centres a column, '-:' aligns it right, anything else left."""
    if separator_cell[:1] == separator_cell[-1:] == ":":
        return "center"
    if separator_cell.endswith(":"):
        return "right"
    return "left"


def table_row_html(tag: str, cells: list[str], aligns: list[str]) -> str:
    """One table row; a cell beyond the separator's columns is aligned left."""
    padded = aligns + ["left"] * len(cells)
    return (
        "<tr>"
        + "".join(
            f'<{tag} style="text-align:{padded[k]}">{_inline(c)}</{tag}>'
            for k, c in enumerate(cells)
        )
        + "</tr>"
    )


# --- 4. Reading the run folder --------------------------------------------------------------------
def load(path: Path, lines: bool = False):
    """(a run file's JSON object, or its JSON-lines records, and "") or (empty, what is wrong with it)."""
    empty = [] if lines else {}
    if not path.is_file():
        return empty, f"{path.parent.name}/{path.name} not found"
    try:
        value = read_jsonl(path) if lines else read_json(path)
    except UserError as err:
        return empty, str(err)
    except ValueError:  # json.loads refuses an int of over 4300 digits, and with it the file
        try:
            value = read_long_ints(path, lines)
        except ValueError as err:  # damaged besides
            return empty, f"{path.parent.name}/{path.name} is not valid JSON ({err})"
    if not lines and not isinstance(value, dict):
        return {}, f"{path.name} is not a JSON object"
    return value, ""


def read_long_ints(path: Path, lines: bool):
    """A run file that holds an integer too long to convert (over 4300 digits), read again with every
    such integer as NaN: a gap in a chart, not a lost file. A line that is not an object is skipped."""
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # as files.read_text
    if not lines:
        return json.loads(text, parse_int=int_or_nan)
    records = []
    for line in text.split("\n"):
        try:
            records.append(json.loads(line, parse_int=int_or_nan))
        except ValueError:
            continue  # blank, or damaged
    return [r for r in records if isinstance(r, dict)]


def int_or_nan(digits: str) -> int | float:
    """A JSON integer, or NaN for one of more digits than Python converts."""
    try:
        return int(digits)
    except ValueError:
        return math.nan


def part(obj: dict, key: str) -> dict:
    """obj[key] when it is an object, else {} (a part that did not run is null in its summary)."""
    return obj[key] if isinstance(obj.get(key), dict) else {}


def column(rows: list[dict], key: str) -> list[tuple]:
    """(step, value) of one metrics key; a missing or None value becomes a gap."""
    return [(r.get("step", i + 1), r.get(key)) for i, r in enumerate(rows)]


def keys_of(rows: list[dict], prefix: str, skip: tuple = ()) -> list[str]:
    """The metrics keys that start with `prefix` and not with any of `skip`, in first-seen order."""
    keys = {}  # an ordered set
    for r in rows:
        keys.update(dict.fromkeys(r))
    return [k for k in keys if k.startswith(prefix) and not k.startswith(skip)]


def fmt(v) -> str:
    """A table cell: a count as it is, a number to 3 decimals, None as n/a, anything else escaped."""
    if type(v) is int and finite(v):
        return str(v)
    if type(v) is int:
        return "not a number"  # hundreds of digits: no count
    if finite(v):
        return f"{v:.3f}"
    if v is None:
        return "n/a"
    return esc(v)


# --- 5. Sections ----------------------------------------------------------------------------------
def note(text: str, kind: str = "note") -> str:
    """A note (what is missing, and how to make it) or, kind="watch", what to look for in a part."""
    lead = "<strong>What to watch:</strong> " if kind == "watch" else ""
    return f'<p class="{kind}">{lead}{esc(text)}</p>'


def source(*files: str, what: str = "Numbers") -> str:
    """Where a part's numbers (or conversations) come from: the run files, named."""
    return (
        f'<p class="src">{what} from '
        + ", ".join(f"<code>{esc(f)}</code>" for f in files)
        + ".</p>"
    )


def table(blocks: list[tuple[str, dict]], keys: list[tuple[str, str]]) -> str:
    """A row per (label, held-out measurement), a column per (key, title); empty blocks are left out."""
    body = "".join(
        f"<tr><td>{esc(name)}</td>"
        + "".join(f"<td>{fmt(b.get(k))}</td>" for k, _ in keys)
        + "</tr>"
        for name, b in blocks
        if b
    )
    if not body:
        return ""
    titles = "".join(f"<th>{esc(t)}</th>" for _, t in keys)
    return f"<table><tr><th>held-out</th>{titles}</tr>{body}</table>"


def charts(rows: list[dict], *more: str) -> str:
    """The charts of what grpo.grpo_step logs per step (the metric keys below), then `more`."""
    svgs = [reward_chart(rows)]
    svgs.append(
        svg_line_chart(
            {k[2:].replace("_", " "): column(rows, k) for k in keys_of(rows, "r_", ("r_pick_",))},
            "Reward components (mean over the batch)",
            "GRPO step",
            "component",
        )
    )
    hacks = [k for k in keys_of(rows, "hack_") if k != "hack_words"]
    if hacks:
        svgs.append(
            svg_line_chart(
                {k[5:].replace("_", " "): column(rows, k) for k in hacks},
                "Reward-hack diagnostics of the sampled replies",
                "GRPO step",
                "share of replies",
            )
        )
    kl = [p for p in column(rows, "kl") if p[1] is not None]
    if kl:
        svgs.append(
            svg_line_chart(
                {"KL(policy || reference)": kl},
                "KL to the frozen reference",
                "GRPO step",
                "KL (k3)",
            )
        )
    else:
        svgs.append(
            no_data_svg("KL to the frozen reference", "no KL logged (--beta 0: no reference)")
        )
    svgs.append(
        svg_line_chart(
            {
                "clip fraction": column(rows, "clip_ratio/region_mean"),
                "zero-std groups": column(rows, "frac_reward_zero_std"),
                "cut at max tokens": column(rows, "completions/clipped_ratio"),
            },
            "Clipping, dead groups, truncation",
            "GRPO step",
            "share",
        )
    )
    svgs.append(
        svg_line_chart(
            {
                "tokens": column(rows, "completions/mean_length"),
                "words": column(rows, "hack_words"),
            },
            "Mean length of the sampled completions",
            "GRPO step",
            "length",
        )
    )
    svgs += more
    return (
        '<div class="charts">' + "".join(f'<div class="chart">{s}</div>' for s in svgs) + "</div>"
    )


def reward_chart(rows: list[dict]) -> str:
    """The mean reward per step, a band of one standard deviation around it."""
    band = []  # (step, mean - std, mean + std); a gap where either is missing
    for (step, mean), r in zip(column(rows, "reward"), rows):
        if finite(mean) and finite(r.get("reward_std")):
            band.append((step, mean - r["reward_std"], mean + r["reward_std"]))
        else:
            band.append((step, None, None))
    return svg_line_chart(
        {"reward mean": column(rows, "reward")},
        "Reward per step (mean, band = ± 1 std)",
        "GRPO step",
        "reward",
        bands={"reward mean": band},
    )


def stage_section(run: Path, stage: int) -> str:
    """A stage's GRPO curves and held-out numbers (drawn by its STAGES entry); a note for each missing part."""
    title, summary_html, more_charts, what_to_watch = STAGES[stage]
    rows, missing = load(run / f"stage{stage}" / "metrics.jsonl", lines=True)
    summary, summary_missing = load(run / f"stage{stage}" / "summary.json")
    out = [
        f"<h2>Stage {stage}: {title}</h2>",
        source(f"stage{stage}/metrics.jsonl", f"stage{stage}/summary.json"),
    ]
    if not rows and not summary:
        out.append(
            note(
                f"No stage-{stage} results ({missing}; {summary_missing}). Run: python "
                f"mascot.py train --stage {stage}"
            )
        )
        return "\n".join(out)
    if rows:
        out += [charts(rows, *more_charts(rows)), note(what_to_watch, "watch")]
    else:
        out.append(note(f"No training curves: {missing}."))
    if summary:
        out += summary_html(summary)
    else:
        out.append(note(f"No summary: {summary_missing}."))
    return "\n".join(out)


def stage1_summary(summary: dict) -> list[str]:
    """Stage 1's held-out numbers: the reward model's accuracy, the reward before and after GRPO."""
    rm = part(summary, "reward_model")
    after = part(summary, "heldout_after")
    out = [
        f"<p>Reward model preference accuracy: train {fmt(rm.get('train_accuracy'))}; held-out <strong>"
        f"{fmt(rm.get('heldout_accuracy'))}</strong> on {fmt(rm.get('n_heldout'))} judged pairs, "
        f"{fmt(rm.get('heldout_hack_accuracy'))} on {fmt(rm.get('n_heldout_hack'))} synthetic-hack pairs ("
        f"{fmt(summary.get('pairs'))} in all; judge <code>{fmt(summary.get('judge'))}</code>, model <code>"
        f"{fmt(summary.get('model'))}</code>).</p>",
        note(
            "held-out accuracy above 0.5 means the reward model learned something the judge prefers (noisy "
            "with a few dozen pairs); below 0.5 on the synthetic hacks, GRPO is paid for hacking.",
            "watch",
        ),
        table(
            [("before GRPO", part(summary, "heldout_before")), ("after GRPO", after)],
            [
                ("reward", "reward"),
                ("se", "± se"),
                ("rm", "reward model"),
                ("format", "format"),
                ("n", "replies"),
            ],
        ),
    ]
    if finite(after.get("change")) and finite(after.get("change_se")):
        out.append(
            f"<p>Held-out change after - before, paired by state and seed: <strong>{after['change']:+.3f} ± "
            f"{after['change_se']:.3f}</strong> (standard error); within about two of them it is noise.</p>"
        )
    return out


def stage2_summary(summary: dict) -> list[str]:
    """Stage 2's held-out group reward of each director, and how its choices spread."""
    # The least-spoken rule is the heuristic a trained director must beat (the warm start, if run, sits between).
    blocks = [
        ("prompted", part(summary, "heldout_before")),
        ("least-spoken rule", part(summary, "heldout_least_spoken")),
        ("after warm start", part(part(summary, "warm_start"), "heldout")),
        ("trained", part(summary, "heldout_after")),
    ]
    blocks = [(label, flat_block(b)) for label, b in blocks if b]
    components = {}  # every reward component any block has, in first-seen order
    for _, b in blocks:
        components.update(dict.fromkeys(part(b, "components")))
    out = [
        table(
            blocks,
            [("reward", "group reward"), ("se", "± se")]
            + [(k, k) for k in components]
            + [
                ("picks", "first-turn choices"),
                ("d_entropy", "entropy (bits)"),
                ("d_mi", "I(choice; stage)"),
                ("d_p_perm", "permutation p"),
                ("agree_least_spoken", "= least-spoken"),
                ("invalid", "unparsable"),
                ("n", "points"),
            ],
        )
    ]
    if vs := part(summary, "paired_vs"):
        out.append(
            "<p>Paired change of the held-out group reward (same points and seeds): "
            + "; ".join(
                f"trained - {esc(name)}: <strong>{fmt(part(vs, name).get('change'))} ± {fmt(part(vs, name).get('se'))}"
                "</strong> (se)"
                for name in vs
            )
            + ".</p>"
        )
    if finite(summary.get("directives")):
        out.append(
            f"<p>During training {esc(summary.get('invalid_directives', 0))} of {esc(summary['directives'])} "
            "sampled directives could not be parsed (the least-spoken agent spoke, with a format penalty). "
            f"Warm-start targets: {esc(part(summary, 'warm_start').get('source', 'none (no warm start)'))}.</p>"
        )
    return out


def flat_block(b: dict) -> dict:
    """A held-out measurement of stage 2 with its components, diagnostics (as d_<name>) and first-turn
    choices ("Anchor 3, Guide 1") at the top level, one table column each."""
    return {
        **b,
        **part(b, "components"),
        **{f"d_{k}": v for k, v in part(b, "diagnostics").items()},
        "picks": ", ".join(f"{a} {n}" for a, n in part(b, "choices").items()),
    }


def no_more_charts(rows: list[dict]) -> list[str]:
    return []


def pick_chart(rows: list[dict]) -> list[str]:
    """Stage 2's own chart: how often the director picks each agent."""
    return [
        svg_line_chart(
            {k[len("r_pick_") :]: column(rows, k) for k in keys_of(rows, "r_pick_")},
            "How often the director picks each agent",
            "GRPO step",
            "share",
        )
    ]


# stage -> (title, its summary's HTML, its charts beside the common ones, what to watch)
STAGES = {
    1: (
        "persona-aligned speakers (reward model + GRPO)",
        stage1_summary,
        no_more_charts,
        "the reward should drift up while KL stays small and the hack diagnostics stay flat (a reward that "
        "rises with copying or leaking is being hacked). A GRPO loss near zero is normal (advantages average "
        "to zero in each group): watch the reward. Zero-std groups give GRPO no signal.",
    ),
    2: (
        "the director (group reward + GRPO)",
        stage2_summary,
        pick_chart,
        "the group reward should rise. A director that collapses onto one agent shows up as one pick line "
        "going to 1, the choice entropy falling to 0 and the balance component falling; a director that reads "
        "the conversation keeps choice mi, I(choice; stage) in bits, above 0.",
    ),
}


def eval_section(run: Path) -> str:
    """The evaluation's results.md as HTML, and what to watch in it."""
    out = ["<h2>Evaluation</h2>", source("eval/results.md")]
    path = run / "eval" / "results.md"
    if not path.is_file():
        out.append(note("eval/results.md not found. Run: python mascot.py evaluate"))
        return "\n".join(out)
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # as files.read_text
    text = re.sub(r"\A\s*# [^\n]*\n", "", text)  # its title: the page has its own
    out.append(markdown_to_html(text))
    out.append(
        note(
            "the paired change against round-robin: the independent evaluator's columns (persona identification by "
            "the frozen base model) should rise, Self-BLEU and the hack rates should not; a column measured by something "
            "training used can rise because the speakers learned to please it. Overlapping intervals: no clear result.",
            "watch",
        )
    )
    return "\n".join(out)


# --- 6. Conversations side by side ----------------------------------------------------------------
def pick_systems(systems: list[str]) -> tuple[str, str | None]:
    """(base, trained): round-robin, else the first not named mascot; mascot, else a mascot variant, else the last."""
    low = {s.lower(): s for s in systems}
    base = low.get("round-robin")
    if not base:
        base = next((s for s in systems if "mascot" not in s.lower()), systems[0])
    others = [s for s in systems if s != base]
    exact = [s for s in others if s.lower() == "mascot"]
    variants = [s for s in others if "mascot" in s.lower()]
    if exact:
        return base, exact[0]
    if variants:
        return base, variants[0]
    return base, others[-1] if others else None


TURN_KINDS = {"User": "user", "Safety": "safety"}  # speaker -> the turn's CSS class; else "agent"


def render_conversation(conv: dict, label: str) -> str:
    """A conversation, the directives over agent turns, and where a stage-2 rollout left its prefix."""
    meta = [f"context <code>{esc(conv.get('context_id', '?'))}</code>"]
    meta += [
        f"{key} {esc(conv[key])}" for key in ("profile", "policy", "situation") if conv.get(key)
    ]
    out = [f'<div class="conv"><h3>{esc(label)}</h3><div class="meta">{" · ".join(meta)}</div>']
    for i, turn in enumerate(conv["turns"]):
        if i == conv.get("first_turn"):
            out.append('<div class="meta">from here on: the rollout under this director</div>')
        speaker = str(turn.get("speaker", "?"))
        kind = TURN_KINDS.get(speaker, "agent")
        directive = directive_text(turn.get("directive") or {}) if kind == "agent" else ""
        shown = f'<div class="directive">{directive}</div>' if directive else ""
        out.append(
            f'<div class="turn {kind}">{shown}'
            f'<span class="who">{esc(speaker)}</span> {esc(turn.get("text", ""))}</div>'
        )
    return "\n".join(out + ["</div>"])


def directive_text(d: dict) -> str:
    """What the director said over an agent turn: its directive, that it could not be read, or ""."""
    if not d.get("valid", True):
        # The least-spoken agent spoke instead (director.py): here the "director" acted like the rule.
        return f"director's answer unparsable: least-spoken fallback ({esc(d.get('agent', ''))})"
    if d.get("action") or d.get("tone"):
        return (
            f"Agent: {esc(d.get('agent', ''))} / Action: {esc(d.get('action', ''))} / Tone: "
            f"{esc(d.get('tone', ''))}"
        )
    return ""


def conversations_section(run: Path) -> str:
    """One conversation of the base system beside the same one (context, user, seed) of MASCOT."""
    out = ["<h2>Sample conversations: base vs MASCOT</h2>"]
    records, where, missing = load_conversations(run)
    if not records:
        out.append(
            note(
                f"No conversations: {missing}, and no stage-2 held-out rollouts "
                "(stage2/heldout_*.jsonl). Run: python mascot.py evaluate"
            )
        )
        return "\n".join(out)
    systems = list(dict.fromkeys(str(r.get("system", "?")) for r in records))
    base, trained = pick_systems(systems)
    # evaluate.py gives every system, stage 2 every director, the same points: this key is "the same conversation".
    by = {s: {} for s in systems}  # system -> key -> its first conversation there
    for r in records:
        key = tuple(r.get(k) for k in ("context_id", "profile", "seed", "first_turn"))
        by[str(r.get("system", "?"))].setdefault(key, r)
    common = [k for k in by[base] if trained and k in by[trained]]
    # Prefer a conversation the crisis guard cut short on neither side.
    uncut = [
        k for k in common if not by[base][k].get("events") and not by[trained][k].get("events")
    ]
    key = (uncut or common or list(by[base]))[0]
    shown = [s for s in (base, trained) if s]
    same = ""
    if trained and common:
        same = ", on the same context, simulated user and seed"
    elif trained:
        same = ", on different contexts (none shared)"
    # A system without this key shows its first conversation.
    sides = [render_conversation(by[s].get(key) or next(iter(by[s].values())), s) for s in shown]
    out += [
        source(where, what="Conversations"),
        f"<p>{len(records)} conversations of {len(systems)} "
        f"systems ({esc(', '.join(systems))}); shown: "
        + " vs ".join(f"<strong>{esc(s)}</strong>" for s in shown)
        + same
        + ".</p>",
        '<div class="convs">' + "".join(sides) + "</div>",
        note(
            "whether the agents keep to their roles and build on each other instead of "
            "repeating, and whether the director's Action/Tone is followed.",
            "watch",
        ),
    ]
    return "\n".join(out)


def load_conversations(run: Path) -> tuple[list[dict], str, str]:
    """(conversations, the file they come from, what is wrong with eval/transcripts.jsonl): the
    evaluation's, else stage 2's held-out rollouts (the same points and seeds for each director)."""
    where = "eval/transcripts.jsonl"
    records, missing = load(run / "eval" / "transcripts.jsonl", lines=True)
    if not records:  # no evaluation
        where = "stage2/heldout_*.jsonl (no eval/transcripts.jsonl)"
        for name in ("least-spoken", "prompted", "warm-start", "trained"):
            rows, _ = load(run / "stage2" / f"heldout_{name}.jsonl", lines=True)
            records += [{**r, "system": name} for r in rows]
    usable = [
        r
        for r in records
        if isinstance(r.get("turns"), list) and all(isinstance(t, dict) for t in r["turns"])
    ]
    return usable, where, missing


# --- 7. The page ----------------------------------------------------------------------------------
CSS = (
    f"body {{ {FONT}; margin: 0; background: #f4f5f7; color: #222; line-height: 1.45; }}"
    + """
main { max-width: 1180px; margin: 0 auto; padding: 20px } .turn { margin: 6px 0; padding: 6px 9px; border-radius: 6px }
section { background: #fff; border: 1px solid #dde0e4; border-radius: 8px; padding: 16px 20px; margin: 16px 0 }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px }
.chart, .conv { border: 1px solid #dde0e4; border-radius: 6px } .chart svg { width: 100%; height: auto }
.src, .meta, .directive { color: #666; font-size: 13px; margin: 0 0 6px } .who { font-weight: 600 }
.watch, .note { background: #f0f6ff; border-left: 3px solid #0072B2; padding: 6px 10px; font-size: 13px }
.note { color: #8a5a00; background: #fff8e6; border-color: #E69F00 } code { background: #f1f2f4; font-size: 12px }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 12px; display: block; overflow-x: auto }
th, td { border: 1px solid #dde0e4; padding: 3px 7px } th { background: #f4f5f7 }
.convs { display: flex; flex-wrap: wrap; gap: 14px } .conv { flex: 1 1 0; min-width: 280px; padding: 8px 12px }
.turn.user { background: #eef2f7 } .turn.agent { background: #f6fbf8 } .turn.safety { background: #fdecea }
"""
)


def stage1_section(run: Path) -> str:
    return stage_section(run, 1)


def stage2_section(run: Path) -> str:
    return stage_section(run, 2)


# The page's parts, in order: (anchor, link text, the function that writes it from the run folder).
SECTIONS = [
    ("stage1", "Stage 1", stage1_section),
    ("stage2", "Stage 2", stage2_section),
    ("eval", "Evaluation", eval_section),
    ("conversations", "Conversations", conversations_section),
]


def check_run(run_dir) -> Path:
    """The run folder as a Path; a UserError if there is none."""
    if not Path(run_dir).is_dir():
        raise UserError(
            f"--run {run_dir}: no such run folder; pass the folder given to `mascot.py train --run`"
        )
    return Path(run_dir)


def build_report(run_dir) -> Path:
    """Write RUN/report.html from whatever the run folder holds; return its path."""
    run = check_run(run_dir)
    body = [
        f'<h1>MASCOT run report</h1><p class="src">Run folder <code>{esc(run.resolve())}</code>, written '
        f"{time.strftime('%Y-%m-%d %H:%M')} by <code>extras/report.py</code>.</p>",
        "<nav>"
        + " · ".join(f'<a href="#{key}">{label}</a>' for key, label, _ in SECTIONS)
        + "</nav>",
        *(f'<section id="{key}">{section(run)}</section>' for key, _, section in SECTIONS),
    ]
    path = run / "report.html"
    write_text_atomic(
        path,
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"><title>MASCOT report: '
        f"{esc(run.name)}</title><style>{CSS}</style></head>\n<body><main>\n"
        + "\n".join(body)
        + "\n</main></body></html>\n",
    )
    return path


def main(argv: list[str], cli=None) -> int:
    """`python mascot.py report --run RUN` (mascot.main passes its argv: argv[0] is "report")."""
    # From mascot.py, its Parser (a bad flag is one line); run as a script, argparse's own.
    parser_class = cli.Parser if cli else argparse.ArgumentParser
    parser = parser_class(
        prog="mascot.py report", description="Write RUN/report.html, one page of a run."
    )
    parser.add_argument(
        "--run", default="runs/default", help="the run folder (as given to train and evaluate)"
    )
    run = check_run(parser.parse_args(argv[1:]).run)
    with run_lock(run):  # not while train or evaluate writes there
        print(f"report written to {build_report(run)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(["report", *sys.argv[1:]]))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
