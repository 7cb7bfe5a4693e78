"""report.py: one self-contained HTML page that shows what a MASCOT run did.

Where it sits in the pipeline: last, after `train --stage 1`, `train --stage 2` and `evaluate`.
It only READS the run folder and writes RUN/report.html:

    RUN/stage1/metrics.jsonl, summary.json   speaker GRPO curves, reward-model accuracy
    RUN/stage2/metrics.jsonl, summary.json   director GRPO curves, agent choices before/after
    RUN/eval/results.md                      the evaluation tables (markdown -> HTML tables)
    RUN/eval/transcripts.jsonl               one base and one MASCOT conversation, side by side

The page has no external scripts, fonts, images or style sheets: the charts are inline SVG drawn
by the two small functions below (`svg_line_chart`, `svg_bar_chart`), so the file can be mailed,
opened offline, or projected in a lecture. A missing file only turns its section into a short
note; it never stops the report. Every piece of text that came from a model is HTML-escaped.

Simplifications: no interactivity, no smoothing of the curves (runs on a laptop are short), and
the charts use a fixed colour-blind-safe palette (Okabe & Ito 2008) rather than a plotting
library, because the project keeps to torch/transformers/numpy and the standard library.

Run:
    python mascot.py report --run runs/default   # writes runs/default/report.html
"""

from __future__ import annotations

import html
import math
import re
import time
from pathlib import Path

from data import UserError, read_json, read_jsonl, write_text_atomic

# Okabe-Ito colours: distinguishable with the common colour-vision deficiencies.
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#999999"]
FONT = "font-family:system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"


def esc(text) -> str:
    """HTML-escape anything (model output can contain '<script>'; it must show as text)."""
    return html.escape(str(text), quote=True)


# ----------------------------------------------------------------------------------------------
# 1. Axis ticks with round numbers
# ----------------------------------------------------------------------------------------------

def nice_number(x: float, round_it: bool) -> float:
    """The 'nice' number (1, 2 or 5 times a power of ten) closest to x (Heckbert, Graphics Gems
    1990, "Nice numbers for graph labels"). round_it=False gives the nice number >= x."""
    exponent = math.floor(math.log10(x))
    fraction = x / 10 ** exponent                      # in [1, 10)
    if round_it:
        nice = 1 if fraction < 1.5 else 2 if fraction < 3 else 5 if fraction < 7 else 10
    else:
        nice = 1 if fraction <= 1 else 2 if fraction <= 2 else 5 if fraction <= 5 else 10
    return nice * 10 ** exponent


def nice_ticks(lo: float, hi: float, max_ticks: int = 6, min_step: float = 0.0) -> list[float]:
    """Round tick values covering [lo, hi]; the first and last tick are the axis limits.

    Example: nice_ticks(0.13, 0.92) -> [0.0, 0.2, 0.4, 0.6, 0.8, 1.0].
    A constant range (lo == hi) is widened so a flat line sits in the middle of the plot, except
    a constant 0, which gets [0, 1] (a fraction that never moved should not grow a negative axis).
    min_step=1 keeps ticks on whole numbers (GRPO steps).
    """
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo == 0:
        hi = 1.0
    elif hi == lo:
        pad = 1.0 if lo == int(lo) else abs(lo) * 0.1
        lo, hi = lo - pad, hi + pad
    step = max(nice_number(nice_number(hi - lo, False) / (max_ticks - 1), True), min_step)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)   # 1e-9: float slack
    # Multiply integers by the step (instead of adding it up), then round away the float noise
    # (0.6000000000000001 -> 0.6); "+ 0.0" turns -0.0 into 0.0.
    digits = max(0, -math.floor(math.log10(step))) + 1
    return [round(k * step, digits) + 0.0 for k in range(first, last + 1)]


def tick_label(value: float, step: float) -> str:
    """Just enough decimals for the tick step: step 0.05 -> '0.15', step 5 -> '15'.
    Very small steps (an early KL of 1e-9) switch to short scientific notation: '2e-08'."""
    if 0 < step < 1e-3:
        return "0" if value == 0 else f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-9)) if step > 0 else 2
    text = f"{value:.{decimals}f}"
    return "0" if re.fullmatch(r"-0\.?0*", text) else text


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ----------------------------------------------------------------------------------------------
# 2. SVG charts
# ----------------------------------------------------------------------------------------------

def _svg_open(width: int, height: int, title: str) -> list[str]:
    return [f'<svg width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}" '
            f'style="max-width:100%;height:auto;{FONT}">',
            f"<title>{esc(title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text x="{width / 2:.1f}" y="18" text-anchor="middle" font-size="14" '
            f'font-weight="600" fill="#222">{esc(title)}</text>']


def no_data_svg(title: str, width: int = 560, height: int = 260, reason: str = "no data") -> str:
    """The box a chart becomes when there is nothing to draw."""
    parts = _svg_open(width, height, title)
    parts.append(f'<rect x="20" y="32" width="{width - 40}" height="{height - 52}" fill="#fafafa" '
                 'stroke="#bbb" stroke-dasharray="6 4"/>')
    parts.append(f'<text x="{width / 2:.1f}" y="{height / 2 + 10:.1f}" text-anchor="middle" '
                 f'font-size="13" fill="#777">{esc(reason)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def _legend(names: list[str], width: int, left: int, y0: int, kind: str = "line") -> tuple[list[str], int]:
    """Legend items laid out in rows under the title; returns (svg parts, height used)."""
    parts, x, y = [], left, y0
    for i, name in enumerate(names):
        item_w = 26 + 6.6 * len(name) + 16                 # swatch + text (11px font) + gap
        if x > left and x + item_w > width - 10:
            x, y = left, y + 16
        color = PALETTE[i % len(PALETTE)]
        if kind == "line":
            parts.append(f'<line x1="{x:.1f}" y1="{y - 4}" x2="{x + 20:.1f}" y2="{y - 4}" stroke="{color}" '
                         'stroke-width="2.5"/>')
        else:
            parts.append(f'<rect x="{x + 4:.1f}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{x + 26:.1f}" y="{y}" font-size="11" fill="#333">{esc(name)}</text>')
        x += item_w
    return parts, (y - y0) + 16 if names else 0


def _segments(points) -> list[list[tuple[float, ...]]]:
    """Split a series at missing values: None / NaN / inf end a segment (a gap in the line)."""
    segs, cur = [], []
    for p in points:
        if all(finite(v) for v in p):
            cur.append(tuple(float(v) for v in p))
        elif cur:
            segs.append(cur)
            cur = []
    if cur:
        segs.append(cur)
    return segs


def svg_line_chart(series: dict[str, list[tuple[float, float]]], title: str, xlabel: str, ylabel: str,
                   width: int = 560, height: int = 260,
                   bands: dict[str, list[tuple[float, float, float]]] | None = None) -> str:
    """A line chart as an SVG string: axes, round-number ticks, legend, one polyline per series.

    Args:
        series: name -> [(x, y), ...]. A y (or x) of None/NaN/inf leaves a gap in the line; a
            segment of one point is drawn as a dot.
        bands: optional name -> [(x, low, high), ...], a shaded band behind that series
            (the reward's mean +- std across the batch).
    Returns the <svg> element. With no finite point at all it returns a "no data" box.
    """
    bands = bands or {}
    segs = {name: _segments(pts) for name, pts in series.items()}
    band_segs = {name: _segments(b) for name, b in bands.items() if name in series}
    xs = [p[0] for s in segs.values() for seg in s for p in seg]
    ys = [p[1] for s in segs.values() for seg in s for p in seg]
    ys += [v for s in band_segs.values() for seg in s for p in seg for v in p[1:]]
    if not xs:
        return no_data_svg(title, width, height)

    names = list(series)
    legend, legend_h = _legend(names, width, 56, 38)
    left, right, top, bottom = 62, 16, 38 + legend_h, 46
    pw, ph = width - left - right, height - top - bottom            # plot area in pixels
    whole = all(x == int(x) for x in xs)                            # steps: keep x ticks whole
    xt = nice_ticks(min(xs), max(xs), min_step=1.0 if whole else 0.0)
    yt = nice_ticks(min(ys), max(ys), max_ticks=5)
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def sx(x):
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = _svg_open(width, height, title) + legend
    for y in yt:                                                    # grid + y ticks
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + pw}" y2="{sy(y):.1f}" '
                     'stroke="#e6e6e6"/>')
        parts.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#444">{tick_label(y, yt[1] - yt[0])}</text>')
    for x in xt:                                                    # x ticks
        parts.append(f'<line x1="{sx(x):.1f}" y1="{top + ph}" x2="{sx(x):.1f}" y2="{top + ph + 5}" '
                     'stroke="#666"/>')
        parts.append(f'<text x="{sx(x):.1f}" y="{top + ph + 18}" text-anchor="middle" font-size="11" '
                     f'fill="#444">{tick_label(x, xt[1] - xt[0])}</text>')
    parts.append(f'<polyline points="{left},{top} {left},{top + ph} {left + pw},{top + ph}" '
                 'fill="none" stroke="#666"/>')
    parts.append(f'<text x="{left + pw / 2:.1f}" y="{height - 8}" text-anchor="middle" font-size="12" '
                 f'fill="#333">{esc(xlabel)}</text>')
    parts.append(f'<text x="14" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="12" fill="#333" '
                 f'transform="rotate(-90 14 {top + ph / 2:.1f})">{esc(ylabel)}</text>')
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        for seg in band_segs.get(name, []):                         # shaded band first, under the line
            upper = [f"{sx(x):.1f},{sy(hi):.1f}" for x, lo, hi in seg]
            lower = [f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, hi in reversed(seg)]
            parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{color}" '
                         'fill-opacity="0.15" stroke="none"/>')
        n_points = sum(len(seg) for seg in segs[name])
        for seg in segs[name]:
            if len(seg) > 1:
                pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in seg)
                parts.append(f'<polyline class="series" points="{pts}" fill="none" stroke="{color}" stroke-width="2" '
                             'stroke-linejoin="round"/>')
            if len(seg) == 1 or n_points <= 25:                     # dots: lone points, short runs
                parts += [f'<circle class="dot" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.8" fill="{color}"/>'
                          for x, y in seg]
    parts.append("</svg>")
    return "\n".join(parts)


def svg_bar_chart(data: dict[str, dict[str, float]], title: str, ylabel: str, width: int = 560,
                  height: int = 260, y_max: float | None = None,
                  reference: tuple[float, str] | None = None) -> str:
    """Grouped bars as an SVG string.

    Args:
        data: series name -> {category: value}, e.g. {"before": {"Anchor": 3, ...}, "after": {...}};
            bars of one category stand side by side, one colour per series.
        y_max: fix the top of the axis (1.0 for accuracies); default: the round number above the data.
        reference: (value, label) drawn as a dashed horizontal line, e.g. (0.5, "chance").
    """
    categories: list[str] = []
    for values in data.values():
        categories += [c for c in values if c not in categories]
    vals = [v for values in data.values() for v in values.values() if finite(v)]
    if not vals:
        return no_data_svg(title, width, height)
    names = list(data)
    legend, legend_h = _legend(names, width, 56, 38, kind="bar")
    left, right, top, bottom = 62, 16, 38 + legend_h, 40
    pw, ph = width - left - right, height - top - bottom
    # 8% headroom above the tallest bar, so its value label stays inside the plot.
    hi = max([y_max] + vals) if y_max is not None else max(vals + [reference[0] if reference else 0.0]) * 1.08
    yt = nice_ticks(min(0.0, min(vals)), hi if hi > 0 else 1.0, max_ticks=5)
    y0, y1 = yt[0], yt[-1]

    def sy(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    parts = _svg_open(width, height, title) + legend
    for y in yt:
        parts.append(f'<line x1="{left}" y1="{sy(y):.1f}" x2="{left + pw}" y2="{sy(y):.1f}" stroke="#e6e6e6"/>')
        parts.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#444">{tick_label(y, yt[1] - yt[0])}</text>')
    group_w = pw / len(categories)
    bar_w = group_w * 0.75 / len(names)
    for c, cat in enumerate(categories):
        gx = left + c * group_w + group_w * 0.125
        for s, name in enumerate(names):
            v = data[name].get(cat)
            if not finite(v):
                continue
            x, y_top, y_base = gx + s * bar_w, sy(max(v, 0.0)), sy(min(v, 0.0))
            parts.append(f'<rect class="bar" x="{x:.1f}" y="{y_top:.1f}" width="{bar_w * 0.92:.1f}" '
                         f'height="{max(y_base - y_top, 0.5):.1f}" fill="{PALETTE[s % len(PALETTE)]}"/>')
            label = f"{v:.0f}" if float(v).is_integer() else f"{v:.3g}"
            parts.append(f'<text x="{x + bar_w * 0.46:.1f}" y="{y_top - 4:.1f}" text-anchor="middle" '
                         f'font-size="10" fill="#333">{label}</text>')
        parts.append(f'<text x="{left + (c + 0.5) * group_w:.1f}" y="{top + ph + 16}" text-anchor="middle" '
                     f'font-size="11" fill="#333">{esc(cat)}</text>')
    if reference is not None:
        ry = sy(reference[0])
        parts.append(f'<line x1="{left}" y1="{ry:.1f}" x2="{left + pw}" y2="{ry:.1f}" stroke="#555" '
                     'stroke-dasharray="5 4"/>')
        parts.append(f'<text x="{left + pw - 4}" y="{ry - 4:.1f}" text-anchor="end" font-size="10" '
                     f'fill="#555">{esc(reference[1])}</text>')
    parts.append(f'<polyline points="{left},{top} {left},{top + ph} {left + pw},{top + ph}" '
                 'fill="none" stroke="#666"/>')
    parts.append(f'<text x="14" y="{top + ph / 2:.1f}" text-anchor="middle" font-size="12" fill="#333" '
                 f'transform="rotate(-90 14 {top + ph / 2:.1f})">{esc(ylabel)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------------------------
# 3. A tiny markdown converter (tables, headings, lists, paragraphs; enough for results.md)
# ----------------------------------------------------------------------------------------------

def _inline(text: str) -> str:
    """Escape, then **bold** and `code` (the only inline markup results.md uses)."""
    out = esc(text)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", out)


def _cells(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]


_BULLET = re.compile(r"^\s*[-*]\s+")
_SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def markdown_to_html(text: str) -> str:
    """Convert the markdown that evaluate.py writes into HTML. Any other text stays escaped."""
    lines, out, i = text.splitlines(), [], 0
    paragraph: list[str] = []

    def flush():
        if paragraph:
            out.append(f"<p>{_inline(' '.join(paragraph))}</p>")
            paragraph.clear()

    while i < len(lines):
        line = lines[i]
        if "|" in line and i + 1 < len(lines) and _SEPARATOR.match(lines[i + 1]):
            flush()
            header = _cells(line)
            aligns = ["center" if c.strip().startswith(":") and c.strip().endswith(":")
                      else "right" if c.strip().endswith(":") else "left" for c in _cells(lines[i + 1])]
            rows, i = [], i + 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(_cells(lines[i]))
                i += 1

            def align(k):
                return aligns[k] if k < len(aligns) else "left"

            table = ["<table>", "<thead><tr>" + "".join(
                f'<th style="text-align:{align(k)}">{_inline(c)}</th>' for k, c in enumerate(header))
                + "</tr></thead>", "<tbody>"]
            for row in rows:
                table.append("<tr>" + "".join(f'<td style="text-align:{align(k)}">{_inline(c)}</td>'
                                              for k, c in enumerate(row)) + "</tr>")
            out.append("\n".join(table + ["</tbody></table>"]))
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        if heading:
            flush()
            level = min(len(heading.group(1)) + 2, 6)          # '#' -> h3: the page owns h1/h2
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif _BULLET.match(line):
            flush()
            items = []
            while i < len(lines) and _BULLET.match(lines[i]):
                items.append(f"<li>{_inline(_BULLET.sub('', lines[i]))}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
            continue
        elif not line.strip():
            flush()
        else:
            paragraph.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# 4. Reading the run folder (every reader returns (value, note); a note explains what is missing)
# ----------------------------------------------------------------------------------------------

def load_jsonl(path: Path) -> tuple[list[dict], str]:
    if not path.is_file():
        return [], f"{path.parent.name}/{path.name} not found"
    try:
        return read_jsonl(path), ""
    except UserError as err:
        return [], str(err)


def load_json(path: Path) -> tuple[dict, str]:
    if not path.is_file():
        return {}, f"{path.parent.name}/{path.name} not found"
    try:
        value = read_json(path)
    except UserError as err:
        return {}, str(err)
    return (value, "") if isinstance(value, dict) else ({}, f"{path.name} is not a JSON object")


def part(obj: dict, key: str) -> dict:
    """obj[key] when it is an object, else {}: a hand-edited summary must not crash the report."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def column(rows: list[dict], key: str) -> list[tuple[float, float | None]]:
    """(step, value) pairs of one metrics column; a missing or None value becomes a gap."""
    return [(r.get("step", i + 1), r.get(key)) for i, r in enumerate(rows)]


def fmt(v, digits: int = 3) -> str:
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    return f"{v:.{digits}f}" if finite(v) else ("n/a" if v is None else esc(v))


# ----------------------------------------------------------------------------------------------
# 5. Sections
# ----------------------------------------------------------------------------------------------

def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def source(*files: str, what: str = "Numbers") -> str:
    return f'<p class="src">{what} from ' + ", ".join(f"<code>{esc(f)}</code>" for f in files) + ".</p>"


def watch(text: str) -> str:
    return f'<p class="watch"><strong>What to watch:</strong> {esc(text)}</p>'


def charts(*svgs: str) -> str:
    return '<div class="charts">' + "".join(f'<div class="chart">{s}</div>' for s in svgs) + "</div>"


def reward_chart(rows: list[dict], title: str) -> str:
    """The batch's mean reward per step, with a band of one standard deviation around it."""
    band = []
    for (step, mean), r in zip(column(rows, "reward_mean"), rows):
        std = r.get("reward_std")
        ok = finite(mean) and finite(std)
        band.append((step, mean - std if ok else None, mean + std if ok else None))
    return svg_line_chart({"reward mean": column(rows, "reward_mean")}, title, "GRPO step", "reward",
                          bands={"reward mean": band})


HACK_FLAGS = {"diag_context_copy": "copies the context", "diag_persona_copy": "copies the persona",
              "diag_history_echo": "echoes an earlier turn", "diag_self_repeat": "repeats itself",
              "diag_meta_leak": "meta / prompt leak",
              "diag_trivial": "trivial (< 3 words)"}


def hack_chart(rows: list[dict]) -> str:
    """The share of the step's sampled replies flagged by each hack diagnostic (hacks.py)."""
    series = {label: column(rows, f"r_{key}") for key, label in HACK_FLAGS.items()}
    if not any(y is not None for points in series.values() for _, y in points):
        return no_data_svg("Reward-hack diagnostics", reason="no diagnostics logged (an older run)")
    return svg_line_chart(series, "Reward-hack diagnostics of the sampled replies", "GRPO step",
                          "share of replies")


def health_charts(rows: list[dict]) -> list[str]:
    """KL to the reference and the two fractions that say whether GRPO gets a signal."""
    kl = [(x, y) for x, y in column(rows, "kl") if y is not None]       # None: no reference (--beta 0)
    kl_chart = (svg_line_chart({"KL(policy || reference)": kl}, "KL to the frozen reference",
                               "GRPO step", "KL (k3)") if kl else
                no_data_svg("KL to the frozen reference", reason="no KL logged (--beta 0: no reference)"))
    fractions = svg_line_chart({"clip fraction": column(rows, "clip_frac"),
                                "groups with zero reward std": column(rows, "frac_zero_std")},
                               "Clipping and dead groups", "GRPO step", "fraction")
    return [kl_chart, fractions]


def before_after_table(blocks: list[tuple[str, dict]], keys: list[tuple[str, str]]) -> str:
    """One row per (label, held-out measurement), e.g. before and after training."""
    head = "<tr><th>held-out</th>" + "".join(f"<th>{esc(label)}</th>" for _, label in keys) + "</tr>"
    body = ""
    for name, block in blocks:
        if block:
            body += f"<tr><td>{name}</td>" + "".join(f"<td>{fmt(block.get(k))}</td>" for k, _ in keys) + "</tr>"
    return f"<table>{head}{body}</table>" if body else ""


def load_stage(run: Path, stage: int, title: str) -> tuple[list, str, dict, str, list[str]]:
    """A stage's metrics rows and summary, with the section's heading (and a note when both are missing)."""
    rows, missing = load_jsonl(run / f"stage{stage}" / "metrics.jsonl")
    summary, summary_missing = load_json(run / f"stage{stage}" / "summary.json")
    out = [f"<h2>{title}</h2>", source(f"stage{stage}/metrics.jsonl", f"stage{stage}/summary.json")]
    if not rows and not summary:
        out.append(note(f"No stage-{stage} results ({missing}). Run: python mascot.py train --stage {stage}"))
    return rows, missing, summary, summary_missing, out


def stage1_section(run: Path) -> str:
    rows, missing, summary, summary_missing, out = load_stage(
        run, 1, "Stage 1: persona-aligned speakers (reward model + GRPO)")
    if not rows and not summary:
        return "\n".join(out)
    if rows:
        out.append(charts(
            reward_chart(rows, "Speaker reward per step (mean, band = ± 1 std)"),
            svg_line_chart({"r_rm (reward model)": column(rows, "r_rm"),
                            "r_format": column(rows, "r_format")},
                           "Reward components", "GRPO step", "mean over the batch"),
            hack_chart(rows),
            *health_charts(rows)))
        out.append(watch("the reward mean should drift up while KL stays small and the hack "
                         "diagnostics stay flat: a reward that rises while copying or leaking rises "
                         "is a reward being hacked, not a better speaker. A GRPO loss near zero is "
                         "normal (advantages average to zero within each group); watch the reward, "
                         "not the loss. A high share of zero-std groups means many prompts give GRPO "
                         "no signal."))
    else:
        out.append(note(f"No training curves: {missing}."))
    if summary:
        rm = part(summary, "reward_model")
        labelled = part(rm, "labelled_hacks")
        acc = {k: v for k, v in (("train", rm.get("train_accuracy")),
                                 ("held-out judged", rm.get("heldout_accuracy")),
                                 ("held-out hacks", rm.get("heldout_hack_accuracy")),
                                 ("hand-written hacks", labelled.get("accuracy"))) if finite(v)}
        out.append(charts(svg_bar_chart({"accuracy": acc}, "Reward model: preference accuracy",
                                        "accuracy", y_max=1.0, reference=(0.5, "chance 0.5"))))
        out.append(f"<p>Reward model held-out accuracy: <strong>{fmt(rm.get('heldout_accuracy'))}</strong> "
                   f"on {esc(rm.get('n_heldout', '?'))} held-out pairs ({esc(summary.get('pairs', '?'))} "
                   f"pairs in all; judge <code>{esc(summary.get('judge', '?'))}</code>, model "
                   f"<code>{esc(summary.get('model', '?'))}</code>).</p>")
        out.append(watch("held-out accuracy above 0.5 means the reward model learned something the "
                         "judge prefers; with a few dozen pairs it is noisy. The hack accuracies say "
                         "whether it rejects synthetic hacks of held-out states and the 84 "
                         "hand-written hack pairs (data/judge_pairs_hacks.jsonl): below 0.5 there, "
                         "GRPO will be paid for hacking."))
        before, after = part(summary, "heldout_before"), part(summary, "heldout_after")
        out.append(before_after_table([("before training", before), ("after training", after)],
                                      [("reward", "reward"), ("se", "± se"), ("rm", "reward model"),
                                       ("format", "format"), ("diag_context_copy", "copies context"),
                                       ("diag_persona_copy", "copies persona"),
                                       ("diag_self_repeat", "repeats itself"), ("diag_meta_leak", "meta leak"),
                                       ("diag_trivial", "trivial"),
                                       ("diag_words", "words"), ("n", "replies")]))
        if finite(after.get("change")) and finite(after.get("change_se")):
            out.append(f"<p>Held-out change after - before, paired by state and seed: "
                       f"<strong>{after['change']:+.3f} ± {after['change_se']:.3f}</strong> (standard "
                       "error); a change within about two standard errors is noise.</p>")
        examples = [(label, b.get("example")) for label, b in (("before", before), ("after", after))
                    if isinstance(b.get("example"), dict)]
        if examples:
            out.append("<h3>One held-out reply, before and after</h3><div class=\"convs\">")
            for label, ex in examples:
                out.append(f'<div class="conv"><div class="meta">{label} training · state '
                           f'{esc(ex.get("state", "?"))}</div><div class="turn agent"><span class="who">'
                           f'{esc(ex.get("persona", "?"))}</span> {esc(ex.get("reply", ""))}</div></div>')
            out.append("</div>")
    else:
        out.append(note(f"No summary: {summary_missing}."))
    return "\n".join(out)


STAGE2_PARTS = ["coherence", "nonredundancy", "contribution", "clean", "balance", "format"]


def stage2_section(run: Path) -> str:
    rows, missing, summary, summary_missing, out = load_stage(
        run, 2, "Stage 2: the director (group reward + GRPO)")
    if not rows and not summary:
        return "\n".join(out)
    if rows:
        # Roster order, as the metrics rows list the agents.
        agents = list(dict.fromkeys(k[len("r_pick_"):] for r in rows for k in r if k.startswith("r_pick_")))
        collapse = {label: column(rows, key) for key, label in
                    (("r_choice_entropy", "entropy of the agent choice (bits)"),
                     ("r_choice_mi", "I(choice; stage) (bits)")) if any(key in r for r in rows)}
        out.append(charts(
            reward_chart(rows, "Group reward per step (mean, band = ± 1 std)"),
            svg_line_chart({p: column(rows, f"r_{p}") for p in STAGE2_PARTS if any(f"r_{p}" in r for r in rows)},
                           "Group-reward components (balance, format: our additions)", "GRPO step",
                           "component (0-1)"),
            svg_line_chart({a: column(rows, f"r_pick_{a}") for a in agents},
                           "How often the director picks each agent", "GRPO step", "share of directives"),
            *([svg_line_chart(collapse, "Collapse diagnostics of the sampled directives", "GRPO step", "bits")]
              if collapse else []),
            *health_charts(rows)))
        out.append(watch("the group reward should rise. A director that collapses onto one agent "
                         "shows up as one pick line going to 1, the entropy falling to 0 and the "
                         "balance component falling; a director that reads the conversation keeps "
                         "I(choice; stage) above 0."))
    else:
        out.append(note(f"No training curves: {missing}."))
    if summary:
        # The warm start (when it ran) sits between the prompted and the trained director; the
        # least-spoken rule is the heuristic the trained director must beat.
        stages = [("prompted", "prompted base model", part(summary, "heldout_before")),
                  ("least-spoken", "least-spoken rule", part(summary, "heldout_least_spoken")),
                  ("after warm start", "after the warm start", part(part(summary, "warm_start"), "heldout")),
                  ("after", "after training", part(summary, "heldout_after"))]
        stages = [stage for stage in stages if stage[2]]
        choices = {label: b["choices"] for label, _, b in stages if isinstance(b.get("choices"), dict)}
        out.append(charts(svg_bar_chart(choices, "Held-out agent choices (first turn of each block)",
                                        "directives")))
        flat = [(row, {"reward": b.get("reward"), "se": b.get("se"), **part(b, "components"),
                       **{f"d_{k}": v for k, v in part(b, "diagnostics").items()},
                       "invalid": b.get("invalid"), "n": b.get("n")})
                for _, row, b in stages]
        keys = ([("reward", "group reward"), ("se", "± se")]
                + [(k, k) for k in STAGE2_PARTS if any(k in f for _, f in flat)]
                + [(f"d_{k}", label) for k, label in (("distinct", "agents named"), ("entropy", "entropy (bits)"),
                                                      ("mi", "I(choice; stage)"), ("p_chi2", "chi-square p"),
                                                      ("p_perm", "permutation p"))
                   if any(f"d_{k}" in f for _, f in flat)]
                + [("invalid", "invalid directives"), ("n", "decision points")])
        out.append(before_after_table(flat, keys))
        vs = part(summary, "paired_vs")
        if vs:
            out.append("<p>Paired change of the held-out group reward (same points, same seeds): "
                       + "; ".join(f"trained - {esc(name)}: {fmt(part(vs, name).get('change'))} ± "
                                   f"{fmt(part(vs, name).get('se'))} (se)" for name in vs) + ".</p>")
        source_line = part(summary, "warm_start").get("source")
        if source_line:
            out.append(f"<p>Warm-start targets: {esc(source_line)}.</p>")
        if finite(summary.get("directives")):
            out.append(f"<p>During training {esc(summary.get('invalid_directives', 0))} of "
                       f"{esc(summary['directives'])} sampled directives could not be parsed "
                       "(the least-spoken agent spoke instead, with a format penalty).</p>")
    else:
        out.append(note(f"No summary: {summary_missing}."))
    return "\n".join(out)


def eval_section(run: Path) -> str:
    path = run / "eval" / "results.md"
    out = ["<h2>Evaluation</h2>", source("eval/results.md")]
    if not path.is_file():
        return "\n".join(out + [note("eval/results.md not found. Run: python mascot.py evaluate")])
    text = path.read_text(encoding="utf-8", errors="replace")
    # The file's own "# Evaluation" title would repeat this section's heading.
    text = re.sub(r"\A\s*# [^\n]*\n", "", text)
    out.append(markdown_to_html(text))
    out.append(watch("compare MASCOT with round-robin on the same contexts, in the paired-change table: "
                     "the persona columns of the independent evaluator (the frozen base model) should rise, "
                     "Self-BLEU and the hack rates (copying, echoing, leaks, empty replies) should not; a "
                     "column whose evaluator training used (see 'Who measured each column') can rise because "
                     "the speakers learned to please it. Overlapping intervals mean no clear difference."))
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# 6. Conversations side by side
# ----------------------------------------------------------------------------------------------

def pick_systems(systems: list[str]) -> tuple[str, str | None]:
    """(base, trained) system names among those in the transcripts, in order of preference:
    base = round-robin, else the first system not named MASCOT; trained = MASCOT, else the first
    MASCOT variant (-C / -P ablation), else the last other system."""
    low = {s.lower(): s for s in systems}
    base = low.get("round-robin") or next((s for s in systems if "mascot" not in s.lower()), systems[0])
    others = [s for s in systems if s != base]
    trained = low.get("mascot") if low.get("mascot") != base else None
    trained = trained or next((s for s in others if "mascot" in s.lower()), others[-1] if others else None)
    return base, trained


def render_conversation(conv: dict, label: str) -> str:
    """One conversation as HTML: speaker names, and the director's directive above agent turns."""
    meta = [f"context <code>{esc(conv.get('context_id', '?'))}</code>"]
    for key in ("profile", "policy"):
        if conv.get(key):
            meta.append(f"{key} {esc(conv[key])}")
    out = [f'<div class="conv"><h3>{esc(label)}</h3><div class="meta">{" · ".join(meta)}</div>']
    if conv.get("situation"):
        out.append(f'<div class="situation">Situation: {esc(conv["situation"])}</div>')
    for turn in conv.get("turns", []):
        speaker = str(turn.get("speaker", "?"))
        kind = "user" if speaker == "User" else "safety" if speaker == "Safety" else "agent"
        d = turn.get("directive") or {}
        directive = ""
        if kind == "agent" and not d.get("valid", True):
            # The director wrote something the parser could not read; director.py's fallback
            # (the least-spoken agent) spoke instead. Saying so explains a "director" that
            # behaves like round-robin.
            directive = ('<div class="directive">director\'s answer unparsable: least-spoken fallback '
                         f'({esc(d.get("agent", ""))})</div>')
        elif kind == "agent" and (d.get("action") or d.get("tone")):
            directive = (f'<div class="directive">Agent: {esc(d.get("agent", ""))} / Action: '
                         f'{esc(d.get("action", ""))} / Tone: {esc(d.get("tone", ""))}</div>')
        out.append(f'<div class="turn {kind}">{directive}<span class="who">{esc(speaker)}</span> '
                   f'{esc(turn.get("text", ""))}</div>')
    return "\n".join(out + ["</div>"])


def conversations_section(run: Path) -> str:
    out = ["<h2>Sample conversations: base vs MASCOT</h2>"]
    records, missing = load_jsonl(run / "eval" / "transcripts.jsonl")
    records = [r for r in records if isinstance(r.get("turns"), list)]
    if records:
        systems = list(dict.fromkeys(str(r.get("system", "?")) for r in records))
        base, trained = pick_systems(systems)
        # evaluate.py gives every system the same (context, simulated-user profile) pairs with the
        # same seeds, so that pair identifies "the same conversation" across systems.
        by = {s: {} for s in systems}
        for r in records:
            by[str(r.get("system", "?"))].setdefault((r.get("context_id"), r.get("profile")), r)
        common = [c for c in by[base] if trained and c in by[trained]]
        # Prefer a context where the crisis guard did not cut either conversation short.
        calm = [c for c in common if not by[base][c].get("events") and not by[trained][c].get("events")]
        key = (calm or common or list(by[base]))[0]
        columns = [render_conversation(by[base][key], base)]
        if trained:
            other = by[trained].get(key) or next(iter(by[trained].values()))
            columns.append(render_conversation(other, trained))
        shown = f"<strong>{esc(base)}</strong>"
        if trained:
            shown += f" vs <strong>{esc(trained)}</strong>, " + (
                "on the same context and simulated user" if common else "on different contexts (they share none)")
        out.append(source("eval/transcripts.jsonl", what="Conversations"))
        out.append(f"<p>{len(records)} transcripts of {len(systems)} systems ({esc(', '.join(systems))}); "
                   f"shown: {shown}.</p>")
        out.append('<div class="convs">' + "".join(columns) + "</div>")
    else:
        summary, summary_missing = load_json(run / "stage2" / "summary.json")
        examples = [(label, part(summary, key).get("example")) for key, label in
                    (("heldout_before", "before stage 2 (the initial director, prompted)"),
                     ("heldout_after", "after stage 2 (trained director)"))]
        examples = [(label, ex) for label, ex in examples if isinstance(ex, dict) and ex.get("turns")]
        if not examples:
            why = summary_missing or "stage2/summary.json has no example conversations"
            return "\n".join(out + [note(f"No conversations: {missing}, and {why}.")])
        out.append(source("stage2/summary.json", what="Held-out examples (eval/transcripts.jsonl not found)"))
        out.append('<div class="convs">' + "".join(render_conversation(ex, label) for label, ex in examples)
                   + "</div>")
    out.append(watch("whether the agents keep to their roles, build on each other instead of "
                     "repeating, and whether the director's Action/Tone is followed."))
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# 7. The page
# ----------------------------------------------------------------------------------------------

CSS = f"\nbody {{ {FONT}; margin: 0; background: #f4f5f7; color: #222; line-height: 1.45; }}" + """
main { max-width: 1180px; margin: 0 auto; padding: 20px 24px 40px; }
h1 { font-size: 24px; margin: 8px 0 4px; }
h2 { font-size: 19px; margin: 0 0 8px; }
h3 { font-size: 15px; margin: 12px 0 6px; }
section { background: #fff; border: 1px solid #dde0e4; border-radius: 8px; padding: 16px 20px; margin: 16px 0; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(420px, 1fr)); gap: 12px;
          margin-bottom: 8px; }
.chart { border: 1px solid #eceef1; border-radius: 6px; overflow: hidden; }
.chart svg { width: 100%; height: auto; display: block; }
.src { color: #666; font-size: 13px; margin: 0 0 10px; }
.watch { background: #f0f6ff; border-left: 3px solid #0072B2; padding: 6px 10px; font-size: 13px; }
.note { color: #8a5a00; background: #fff8e6; border-left: 3px solid #E69F00; padding: 6px 10px; font-size: 13px; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 12px; display: block; overflow-x: auto;
        max-width: 100%; }
th, td { border: 1px solid #dde0e4; padding: 3px 7px; }
th { background: #f4f5f7; }
code { background: #f1f2f4; padding: 0 3px; border-radius: 3px; font-size: 12px; }
.convs { display: flex; flex-wrap: wrap; gap: 14px; align-items: flex-start; }
.conv { flex: 1 1 0; min-width: 280px; border: 1px solid #dde0e4; border-radius: 6px; padding: 8px 12px; }
.conv h3 { margin-top: 2px; }
.meta, .situation { color: #666; font-size: 12px; margin-bottom: 6px; }
.turn { margin: 6px 0; padding: 6px 9px; border-radius: 6px; font-size: 14px; overflow-wrap: anywhere; }
.turn.user { background: #eef2f7; }
.turn.agent { background: #f6fbf8; border: 1px solid #e2efe7; }
.turn.safety { background: #fdecea; border: 1px solid #f3b8b1; }
.who { font-weight: 600; margin-right: 4px; }
.directive { color: #777; font-size: 11px; margin-bottom: 2px; }
footer { color: #888; font-size: 12px; }
nav { font-size: 14px; }
nav a { color: #0072B2; }
"""


def build_report(run_dir) -> Path:
    """Write RUN/report.html from whatever the run folder holds; return its path."""
    run = Path(run_dir)
    if not run.is_dir():
        raise UserError(f"--run {run}: no such run folder; pass the folder given to `mascot.py train --run`")
    body = [f"<h1>MASCOT run report</h1><p class=\"src\">Run folder <code>{esc(run.resolve())}</code>, "
            f"written {time.strftime('%Y-%m-%d %H:%M')} by <code>report.py</code>.</p>"]
    sections = [("stage1", "Stage 1", stage1_section), ("stage2", "Stage 2", stage2_section),
                ("eval", "Evaluation", eval_section), ("conversations", "Conversations", conversations_section)]
    body.append("<nav>" + " · ".join(f'<a href="#{key}">{label}</a>' for key, label, _ in sections) + "</nav>")
    for key, _, section in sections:
        body.append(f'<section id="{key}">{section(run)}</section>')
    body.append("<footer>Charts are inline SVG; this file needs nothing else to display.</footer>")
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>MASCOT report: {esc(run.name)}</title><style>{CSS}</style></head>\n"
            "<body><main>\n" + "\n".join(body) + "\n</main></body></html>\n")
    path = run / "report.html"
    write_text_atomic(path, page)
    return path
