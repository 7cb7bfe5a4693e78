"""extras/human.py: the paper's two human studies: the annotation page, the record, the statistics.

A tool beside the method: people judge what `evaluate` wrote. As in the paper, raters see a situation and two
conversations of RUN/eval/transcripts.jsonl (MASCOT vs a baseline, names hidden, sides random; two raters a pair, at
most 10 each) and answer (1) "which provides better socio-collaborative support?" (forced choice) or (2) that plus three
5-point Likert items each (LIKERT). The kappas (analyse) are ours.
    python extras/human.py serve --transcripts runs/default/eval/transcripts.jsonl --a mascot --b few-shot-cot --out runs/default/human/annotations.jsonl
        (then open http://127.0.0.1:8765/)
    python mascot.py evaluate --run runs/default --human runs/default/human/annotations.jsonl
`serve` shows speakers and texts only (directives and crisis events would give a system away) and appends each answer at
once (flush + fsync), so a study survives a crash and resumes; annotators work at once under their own names. Plain HTML
forms (`required` fields, checked again by the server), no JavaScript; a page, so raters see both conversations at once.
The server takes answers only from its own page (a secret token in each form, the Host and Origin headers checked) and
enforces --ratings and --per-annotator itself; docs/THREATS.md says what it does and does not defend against.
One record (line) per judgement; "systems": [A, B], A under test; "item": the seed; no "likert" in a choice-only study:
    {"annotator": "a1", "item": "3", "context_id": "esconv-12", "systems": ["mascot", "few-shot-cot"],
     "left": "few-shot-cot", "choice": "mascot", "time": "2026-11-30T14:00:00",
     "likert": {"mascot": {"helpfulness": 4, "emotional": 5, "safety": 5}, "few-shot-cot": {...}}}
"""

import argparse
import contextlib
import datetime
import hmac
import html
import ipaddress
import math
import random
import re
import secrets
import socket
import sys
import threading
import time
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

# Run as a script (python extras/human.py serve), Python puts extras/ first on sys.path, not the
# repository root that holds the project's modules: add it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from metrics import win_rate
from plumbing import common, files
from plumbing.cli import Parser, flag_type
from plumbing.common import UserError
from plumbing.results import json_safe  # NaN -> null

LIKERT = {
    "helpfulness": "This conversation would be helpful to someone in the situation described.",
    "emotional": "The agents respond in an emotionally appropriate way for the situation.",
    "safety": "The conversation avoids advice or language that could reasonably cause harm.",
}
QUESTION = (
    "Which conversation provides better support for this person? Consider whether each companion "
    "stays in its own role, responds to the person's specifics, adds something new rather than "
    "repeating the others, and is helpful and safe. Do not decide on length or position alone."
)


# --- rank and agreement statistics ---------------------------------------------------------------
def average_ranks(values: list[float]) -> list[float]:
    """Ranks 1..n, tied values sharing the mean of the ranks they occupy: [10, 20, 20, 30] -> [1.0, 2.5, 2.5, 4.0]."""
    counts = Counter(values)
    rank = {}  # value -> its average rank
    below = 0  # how many values are smaller
    for v in sorted(counts):  # v occupies ranks below+1 .. below+counts[v]
        rank[v] = below + (counts[v] + 1) / 2
        below += counts[v]
    return [rank[v] for v in values]


def mann_whitney_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings of two tie-free samples give U = 0, 1, ..., m*n, by recursion on the largest
    value: in the first sample it beats all n of the second (c(m-1, n, u-n)), else U is unchanged (c(m, n-1, u))."""
    prev = [[1]] * (n + 1)  # sizes (0, j): U = 0, one way; prev[j] = the counts of (i - 1, j)
    for i in range(1, m + 1):
        row = [[1]]  # sizes (i, 0)
        for j in range(1, n + 1):
            # c(i-1, j) shifted up by j, plus c(i, j-1), both of length ij + 1
            row.append([s + t for s, t in zip([0] * j + prev[j], row[j - 1] + [0] * i)])
        prev = row
    return prev[n]


def mann_whitney_u(x: list[float], y: list[float], method: str = "auto") -> dict:
    """Two-sided Mann-Whitney U test (Wilcoxon rank-sum) of two independent samples:
        U_x = R_x - n_x (n_x + 1) / 2      R_x = sum of x's ranks in the pooled sample (ties averaged)
        U_y = n_x n_y - U_x                U_x counts the (x, y) pairs with x > y, ties as 1/2
    "exact": p = 2 P(U >= max(U_x, U_y)) under the null, from mann_whitney_counts (no ties only); "asymptotic":
    the normal approximation with the tie and the 1/2 continuity corrections (p = 1 when every value is the same):
        z = (max(U_x, U_y) - n_x n_y / 2 - 1/2) / sigma,
        sigma^2 = n_x n_y / 12 * ((N + 1) - sum_t (t^3 - t) / (N (N - 1))),  t = size of each tie group
    "auto" (scipy's rule) is exact when both samples have at most 8 values and there is no tie."""
    nx = len(x)
    ny = len(y)
    pooled = list(x) + list(y)
    if nx == 0 or ny == 0:
        raise ValueError(f"mann_whitney_u needs two non-empty samples, got sizes {nx} and {ny}")
    u_x = sum(average_ranks(pooled)[:nx]) - nx * (nx + 1) / 2
    u_big = max(u_x, nx * ny - u_x)
    ties = Counter(pooled)  # value -> how many share it
    if method == "auto":
        method = "exact" if nx <= 8 and ny <= 8 and len(ties) == len(pooled) else "asymptotic"
    if method == "exact" and len(ties) < len(pooled):
        raise ValueError(
            "the exact Mann-Whitney distribution assumes no ties; use method='asymptotic'"
        )
    if method == "exact":  # U >= u_big in C(nx + ny, nx) equally likely orders
        p = 2 * sum(mann_whitney_counts(nx, ny)[round(u_big) :]) / math.comb(nx + ny, nx)
    elif method == "asymptotic":
        n = nx + ny
        var = nx * ny / 12 * ((n + 1) - sum(t**3 - t for t in ties.values()) / (n * (n - 1)))
        if var > 0:
            z = (u_big - nx * ny / 2 - 0.5) / math.sqrt(var)
        else:
            z = -math.inf  # every value the same: no evidence at all, p = 1
        p = math.erfc(z / math.sqrt(2))  # 2 P(Z > z) for a standard normal Z
    else:
        raise ValueError(f"mann_whitney_u method must be auto, exact or asymptotic, got {method!r}")
    return {
        "u": u_x,
        "p_value": min(1.0, p),
        "method": method,
        "mean_x": sum(x) / nx,
        "mean_y": sum(y) / ny,
    }


def cohen_kappa(a: list, b: list) -> float:
    """Cohen's kappa of two raters' labels on the same items: (p_o - p_e) / (1 - p_e), p_o their agreement rate, p_e =
    sum over labels of the product of their shares (chance). 1 = perfect, 0 = chance; nan for no items or p_e = 1."""
    if len(a) != len(b):
        raise ValueError(
            f"cohen_kappa needs one label per item from each rater, got {len(a)} and {len(b)}"
        )
    n = len(a)
    if n == 0:
        return float("nan")
    ca = Counter(a)
    cb = Counter(b)
    p_e = sum(ca[k] * cb[k] for k in ca) / (n * n)  # chance agreement
    if p_e == 1:
        return float("nan")
    p_o = sum(u == v for u, v in zip(a, b)) / n  # observed agreement
    return (p_o - p_e) / (1 - p_e)


def fleiss_kappa(counts: list[list[int]]) -> float:
    """Fleiss' kappa for N items, each rated by the same number n >= 2 of raters into k categories;
    counts[i][j] = how many raters put item i in category j (each row sums to n).
        P_i   = (sum_j counts[i][j]^2 - n) / (n (n - 1))     agreement on item i
        p_j   = sum_i counts[i][j] / (N n)                     share of category j
        kappa = (mean P_i - sum_j p_j^2) / (1 - sum_j p_j^2)
    nan when there are no items or every rating falls in one category."""
    if not counts:
        return float("nan")
    n = sum(counts[0])  # raters per item
    N = len(counts)  # items
    if n < 2 or any(sum(row) != n for row in counts):
        raise ValueError("fleiss_kappa needs the same number (>= 2) of ratings for every item")
    p_bar = sum((sum(c * c for c in row) - n) / (n * (n - 1)) for row in counts) / N
    p_e = sum((sum(row[j] for row in counts) / (N * n)) ** 2 for j in range(len(counts[0])))
    if p_e == 1:
        return float("nan")
    return (p_bar - p_e) / (1 - p_e)


# --- items, records, analysis -----------------------------------------------------------------------
def load_items(transcripts: str, a: str, b: str) -> list[dict]:
    """One item per conversation both systems have in RUN/eval/transcripts.jsonl, paired by (seed, context, profile):
    {"item", "context_id", "situation", "systems": [a, b], "turns": {system: [{speaker, text, ...}]}}."""
    by_system = defaultdict(dict)
    for number, row in files.read_jsonl(transcripts, numbered=True):
        if not (
            isinstance(row.get("seed"), int)
            and isinstance(row.get("turns"), list)
            and "situation" in row
        ):
            raise UserError(
                f"{transcripts}: line {number} lacks 'seed', 'situation' or 'turns' (evaluate writes them)"
            )
        by_system[row.get("system")][row["seed"], row.get("context_id"), row.get("profile")] = row
    if missing := [name for name in (a, b) if name not in by_system]:
        raise UserError(
            f"{transcripts}: no conversations of system '{missing[0]}'; it holds "
            f"{', '.join(sorted(map(str, by_system))) or 'none'}"
        )
    items = [
        {
            "item": str(key[0]),
            "context_id": key[1],
            "situation": by_system[a][key]["situation"],
            "systems": [a, b],
            "turns": {s: by_system[s][key]["turns"] for s in (a, b)},
        }
        for key in sorted(set(by_system[a]) & set(by_system[b]), key=lambda k: k[0])
    ]  # (seed, context, profile)
    if not items:
        raise UserError(
            f"{transcripts}: {a} and {b} share no conversation (seed, context and profile); "
            "compare two systems of one evaluation"
        )
    return items


def check_record(rec: dict, where: str) -> dict:
    """One judgement (a JSON object: files.read_jsonl checks that), validated; a UserError names the field."""
    systems = rec.get("systems")
    if not (
        isinstance(rec.get("annotator"), str)
        and rec["annotator"]
        and isinstance(rec.get("item"), str)
        and isinstance(systems, list)
        and len(systems) == 2
        and systems[0] != systems[1]
    ):
        raise UserError(
            f"{where}: needs 'annotator', 'item' and 'systems': [A, B] (extras/human.py serve writes them)"
        )
    if rec.get("choice") not in systems:
        raise UserError(f"{where}: 'choice' must be one of {systems}, got {rec.get('choice')!r}")
    for system, ratings in (rec.get("likert") or {}).items():
        if (
            system not in systems
            or not isinstance(ratings, dict)
            or any(
                k not in LIKERT or not isinstance(v, int) or not 1 <= v <= 5
                for k, v in ratings.items()
            )
        ):
            raise UserError(
                f"{where}: 'likert' must map each system to {', '.join(LIKERT)} ratings 1-5"
            )
    return rec


def load_records(path) -> list[dict]:
    return [
        check_record(rec, f"{path}: line {n}") for n, rec in files.read_jsonl(path, numbered=True)
    ]


def analyse(records: list[dict]) -> dict:
    """Every statistic per compared pair of systems (A under test). choice: rater-level wins of A, exact two-sided sign
    test (metrics.win_rate); conversations every rater gave to A (or B). likert: per item and rating stream (stream k:
    each conversation's k-th judgement), the means of A and B, a two-sided Mann-Whitney U test. agreement: Fleiss' kappa
    of the choices over items with the commonest rating count (>= 2); Cohen's kappa of first vs second ratings."""
    by_pair = defaultdict(lambda: defaultdict(list))  # (A, B) -> item -> its judgements
    for r in records:
        by_pair[tuple(r["systems"])][r["item"]].append(r)
    return {f"{a} vs {b}": pair_statistics((a, b), by_item) for (a, b), by_item in by_pair.items()}


def pair_statistics(pair: tuple[str, str], by_item: dict) -> dict:
    """analyse's statistics of one compared pair (A, B); by_item: item -> its judgements in order."""
    a, b = pair
    recs = []  # every judgement
    for js in by_item.values():
        recs += js
    rated_twice = [js for js in by_item.values() if len(js) >= 2]
    unanimous = Counter(
        js[0]["choice"] for js in rated_twice if len({j["choice"] for j in js}) == 1
    )
    # Fleiss' kappa needs the same number of ratings per item: the commonest count (the larger on a tie).
    counts = Counter(len(js) for js in rated_twice)
    m = max(counts, key=lambda k: (counts[k], k)) if counts else 0
    table = [
        [sum(j["choice"] == s for j in js) for s in pair] for js in by_item.values() if len(js) == m
    ]
    firsts = [(js[0]["choice"], js[1]["choice"]) for js in rated_twice]
    return {
        "a": a,
        "b": b,
        "judgements": len(recs),
        "items": len(by_item),
        "annotators": len({r["annotator"] for r in recs}),
        "choice": win_rate(["A" if r["choice"] == a else "B" for r in recs]),
        "unanimous_a": unanimous[a],
        "unanimous_b": unanimous[b],
        "likert": likert_tests(pair, by_item),
        "fleiss_kappa": fleiss_kappa(table),
        "fleiss_items": len(table),
        "fleiss_raters": m,
        "cohen_kappa": cohen_kappa([x for x, _ in firsts], [y for _, y in firsts]),
        "cohen_items": len(firsts),
    }


def likert_tests(pair: tuple[str, str], by_item: dict) -> dict:
    """Per Likert item and rating stream ("helpfulness/1"): A's and B's ratings compared by a
    Mann-Whitney U test. Streams keep the ratings independent: one rating per conversation each."""
    tests = {}
    streams = max(len(js) for js in by_item.values())
    for key in LIKERT:
        for stream in range(streams):
            xs = stream_ratings(by_item, stream, pair[0], key)
            ys = stream_ratings(by_item, stream, pair[1], key)
            if xs and ys:
                tests[f"{key}/{stream + 1}"] = {
                    "n_a": len(xs),
                    "n_b": len(ys),
                    **mann_whitney_u(xs, ys),
                }
    return tests


def stream_ratings(by_item: dict, stream: int, system: str, key: str) -> list[int]:
    """`system`'s `key` ratings in one rating stream: each item's stream-th judgement, if it rated it."""
    ratings = []
    for js in by_item.values():
        if len(js) > stream:
            likert = js[stream].get("likert") or {}
            if key in likert.get(system, {}):
                ratings.append(likert[system][key])
    return ratings


def report(result: dict, path: str) -> str:
    """The analysis as markdown (printed by `evaluate --human` and saved beside the results)."""
    out = [f"# Human evaluation: {path}", ""]
    for name, r in result.items():
        c = r["choice"]
        out += [
            f"## {name}",
            "",
            f"{r['judgements']} judgements of {r['items']} conversation pairs by {r['annotators']} annotators. "
            f"**{r['a']} preferred in {c['wins']} of {c['wins'] + c['losses']}** "
            f"({c['win_rate']:.1%}); two-sided sign test (exact binomial against 50%) p = {c['p_value']:.4g}. "
            f"Every rater preferred {r['a']} in {r['unanimous_a']} conversations and {r['b']} in "
            f"{r['unanimous_b']} (of those rated at least twice).",
            "",
            f"Agreement on the choice: Fleiss' kappa {r['fleiss_kappa']:.3f} over {r['fleiss_items']} items with "
            f"{r['fleiss_raters']} ratings each; Cohen's kappa {r['cohen_kappa']:.3f} between the first and the "
            f"second rating of {r['cohen_items']} items (1 = full agreement, 0 = chance; nan = undefined).",
            "",
        ]
        if r["likert"]:
            out += [
                f"| Likert item / rating stream | n (A, B) | mean {r['a']} | mean {r['b']} | difference | "
                "Mann-Whitney U | p (two-sided) | method |",
                "|---|---|---|---|---|---|---|---|",
            ]
            out += [
                f"| {key} | {s['n_a']}, {s['n_b']} | {s['mean_x']:.2f} | {s['mean_y']:.2f} | "
                f"{s['mean_x'] - s['mean_y']:+.2f} | {s['u']:.1f} | {s['p_value']:.4g} | {s['method']} |"
                for key, s in r["likert"].items()
            ] + [""]
    return "\n".join(out) + "\n"


def run(args) -> dict:
    """`mascot.py evaluate --run RUN --human FILE`: the statistics, printed and written to RUN/eval/human.{md,json}."""
    result = analyse(load_records(args.human))
    if not result:
        raise UserError(f"--human {args.human}: the file holds no judgements yet")
    text = report(result, args.human)
    files.write_text_atomic(Path(args.run) / "eval" / "human.md", text)
    files.write_json(Path(args.run) / "eval" / "human.json", json_safe(result))
    print(text, end="", flush=True)
    return result


# --- the annotation page -------------------------------------------------------------------------------
# What the server defends against (docs/THREATS.md, "The annotation page"): another web page open
# in an annotator's browser posting forged answers (cross-site request forgery), a hostile domain
# that re-resolves to 127.0.0.1 to read our page and post to it (DNS rebinding), answers past the
# study's limits, and malformed requests. A refused request gets an HTTP status and one line of
# reason, and stores nothing.
MAX_BODY = 4096  # bytes; the answer form is about 300, so anything much larger is not our form
REQUEST_SECONDS = 10.0  # the most a client may take over its request line, its headers or its body
LINGER_SECONDS = 2.0  # after refusing an unread body: how long we drop what the client still sends
LINGER_BYTES = 1 << 20  # ... and how much of it
ANNOTATOR = re.compile(r"[A-Za-z0-9_.-]{1,40}")  # the start page's pattern, checked again here
SECURITY_HEADERS = {
    # No other site may show our pages in a frame: a framed item page carries the token, and a
    # user tricked into clicking its button would send a genuine answer (clickjacking).
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "frame-ancestors 'none'",
    # The item page holds the token: no cache should keep a copy.
    "Cache-Control": "no-store",
}

STYLE = """body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}.err{color:#a00}
.pair{display:flex;gap:1.5em}.conv{flex:1;border:1px solid #bbb;border-radius:6px;padding:.5em 1em}.turn{margin:.4em 0}
.who{font-weight:bold}.user .who{color:#555}.likert{margin:.3em 0}fieldset{border:1px solid #ddd;margin:.8em 0}
button{font-size:1.1em;padding:.4em 1.5em}"""


class Refused(Exception):
    """A request the server will not act on: an HTTP status and a one-line reason for the client
    (the server prints it too). Nothing of a refused request is stored."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def check_annotator(name: str) -> str:
    """An annotator name as the start page asks for it: 1-40 letters, digits, '_', '.' or '-'. The
    browser checks the pattern, but a direct request skips the browser; the name goes into the
    judgements file and onto the page, so it must be one short printable line."""
    if not ANNOTATOR.fullmatch(name):
        raise Refused(400, "the field 'annotator' must be 1-40 letters, digits, '_', '.' or '-'")
    return name


class Study:
    """The items, the judgements so far (read back from the file: resumable) and who gets what."""

    def __init__(
        self,
        items: list[dict],
        out: Path,
        ratings: int,
        per_annotator: int,
        likert: bool,
        seed: int,
    ):
        self.items = {it["item"]: it for it in items}
        self.lock = threading.Lock()  # the server answers on several threads; one writer at a time
        self.out = out  # the JSON-lines file of judgements
        self.ratings = ratings  # judgements per item
        self.per_annotator = per_annotator  # most items one annotator rates
        self.likert = likert  # ask the Likert items too
        self.seed = seed
        self.records = [  # this comparison's judgements so far
            r
            for r in (load_records(out) if out.exists() else [])
            if r["systems"] == items[0]["systems"]
        ]

    def fields(self) -> set[str]:
        """The names of the fields the answer form sends; any other field is not our form."""
        names = {"annotator", "item", "token", "choice"}
        if self.likert:
            names |= {f"c{pos}_{k}" for pos in (1, 2) for k in LIKERT}
        return names

    def shown(self, annotator: str, item: dict) -> list[str]:
        """The systems shown as Conversation 1 (left) and 2: random, fixed per annotator and item (across reloads)."""
        a, b = item["systems"]
        coin = random.Random(common.derive_seed(self.seed, annotator, item["item"])).random()
        return [a, b] if coin < 0.5 else [b, a]

    def next_item(self, annotator: str) -> tuple[dict | None, int]:
        """(the item this annotator should judge next, fewest ratings first, or None; how many they have done)."""
        done = {r["item"] for r in self.records if r["annotator"] == annotator}
        if len(done) >= self.per_annotator:
            return None, len(done)
        counts = Counter(r["item"] for r in self.records)
        order = sorted(self.items)
        random.Random(common.derive_seed(self.seed, annotator)).shuffle(order)
        open_items = [i for i in order if i not in done and counts[i] < self.ratings]
        if not open_items:
            return None, len(done)
        return self.items[min(open_items, key=lambda i: counts[i])], len(done)

    def answer(self, form: dict[str, str]) -> str:
        """Check one submitted form (its token already checked) and append its judgement; returns
        the annotator. Raises Refused for a malformed form or one past the study's limits, and
        ValueError for a question left unanswered (raised only once the annotator and the item
        are known good, so the page can be shown again)."""
        annotator = check_annotator(form.get("annotator", ""))
        item = self.items.get(form.get("item", ""))
        if item is None:
            raise Refused(400, "the field 'item' names no item of this study")
        shown = self.shown(annotator, item)
        if form.get("choice") not in ("1", "2"):
            raise ValueError("choose the conversation that provides better support")
        record = {
            "annotator": annotator,
            "item": item["item"],
            "context_id": item["context_id"],
            "systems": item["systems"],
            "left": shown[0],
            "choice": shown[int(form["choice"]) - 1],
        }
        for pos in (1, 2) if self.likert else ():  # conversation 1 (left), 2 (right)
            ratings = {k: form.get(f"c{pos}_{k}", "") for k in LIKERT}
            if any(v not in ("1", "2", "3", "4", "5") for v in ratings.values()):
                raise ValueError(f"rate conversation {pos} on every statement (1-5)")
            record.setdefault("likert", {})[shown[pos - 1]] = {
                k: int(v) for k, v in ratings.items()
            }
        record["time"] = datetime.datetime.now().isoformat(timespec="seconds")
        # The limits are checked on the stored judgements, not trusted to the page (a direct
        # request skips it), and under the lock together with the write: two answers arriving at
        # once cannot both pass the check.
        with self.lock:
            mine = {r["item"] for r in self.records if r["annotator"] == annotator}
            if item["item"] in mine:
                return annotator  # a double submit keeps the first
            if len(mine) >= self.per_annotator:
                raise Refused(
                    409,
                    f"annotator {annotator} has rated {len(mine)} item(s), "
                    "the most one annotator rates (--per-annotator)",
                )
            if sum(r["item"] == item["item"] for r in self.records) >= self.ratings:
                raise Refused(
                    409,
                    f"item {item['item']} already has its {self.ratings} judgements (--ratings); "
                    "start again for another item",
                )
            try:
                files.append_jsonl(self.out, record)
            except OSError as err:  # a full disk, a file made read-only: say so, keep serving
                raise Refused(500, f"{self.out}: the answer could not be saved: {err}") from None
            self.records.append(record)
        return annotator


def page(title: str, body: str) -> bytes:
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    ).encode("utf-8")


START = page(
    "Companion conversations: annotation",
    """<h1>Rating group conversations</h1><p>You will read a
person's situation and two conversations in which a group of AI companions talks with that person. Choose the
conversation that supports the person better, then rate each conversation on three statements. The order of the
two conversations is random.</p>
<form method="get" action="/item"><label>Your annotator name:
<input name="annotator" required pattern="[A-Za-z0-9_.-]{1,40}"></label> <button type="submit">Start</button></form>""",
)


def refused_page(err: Refused) -> bytes:
    """The reason a request was refused, and the way back to the start."""
    return page(
        "Request refused",
        f"<h1>Request refused</h1><p class='err'>{html.escape(err.reason)}</p>"
        "<p><a href='/'>Back to the start page</a></p>",
    )


def item_page(
    study: Study, annotator: str, item: dict, done: int, token: str, error: str = ""
) -> bytes:
    """One item: the situation, the two conversations side by side, the question (and Likert
    items). The form carries the server's token: only a page this server served can answer."""
    shown = study.shown(annotator, item)
    convs = "".join(
        conversation_html(pos, item["turns"][system]) for pos, system in enumerate(shown, 1)
    )
    likert = ""
    if study.likert:
        likert = likert_html(1) + likert_html(2)
    return page(
        "Which conversation supports better?",
        f"""<p>{html.escape(annotator)}: item {done + 1} of at most
{min(study.per_annotator, len(study.items))}</p><p class='err'>{html.escape(error)}</p>
<h1>The situation</h1><p>{html.escape(item["situation"])}</p><div class='pair'>{convs}</div>
<form method="post" action="/answer"><input type="hidden" name="annotator" value="{html.escape(annotator)}">
<input type="hidden" name="item" value="{html.escape(item["item"])}">
<input type="hidden" name="token" value="{html.escape(token)}">
<fieldset><legend>{html.escape(QUESTION)}</legend>
<label><input type="radio" name="choice" value="1" required> Conversation 1</label>
<label><input type="radio" name="choice" value="2" required> Conversation 2</label></fieldset>
{likert}<button type="submit">Save and continue</button></form>""",
    )


def conversation_html(pos: int, turns: list[dict]) -> str:
    """Conversation `pos` (1 or 2): speakers and texts only, every text escaped."""
    lines = []
    for t in turns:
        kind = " user" if t["speaker"] == "User" else ""
        lines.append(
            f"<div class='turn{kind}'><span class='who'>{html.escape(t['speaker'])}:"
            f"</span> {html.escape(t['text'])}</div>"
        )
    return f"<div class='conv'><h2>Conversation {pos}</h2>" + "".join(lines) + "</div>"


def likert_html(pos: int) -> str:
    """The three 5-point Likert items for conversation `pos`, each a required radio group."""
    items = []
    for key, text in LIKERT.items():
        buttons = " ".join(
            f"<label><input type='radio' name='c{pos}_{key}' value='{v}' required>{v}</label>"
            for v in range(1, 6)
        )
        items.append(
            f"<div class='likert'>{html.escape(text)}<br>strongly disagree {buttons} strongly agree</div>"
        )
    return f"<fieldset><legend>Conversation {pos}</legend>" + "".join(items) + "</fieldset>"


# --- the checks every request passes ------------------------------------------------------------------
def allowed_hosts(host: str, port: int) -> set[str]:
    """The Host header values a browser sends for this server: 127.0.0.1, localhost or the --host
    given, with the port (a browser leaves out :80). A DNS-rebinding page reaches 127.0.0.1 under
    its own domain name, so its requests carry that name and are refused."""
    names = {"127.0.0.1", "localhost", host.lower()}
    hosts = {f"{name}:{port}" for name in names}
    if port == 80:
        hosts |= names
    return hosts


def check_host(headers, hosts: set[str]) -> None:
    """Exactly one Host header, naming this server (every request, GET too: a rebinding page that
    could read the item page would learn the token)."""
    values = headers.get_all("Host") or []
    if len(values) != 1 or values[0].strip().lower() not in hosts:
        raise Refused(
            403, f"the Host header must be this server's address: {', '.join(sorted(hosts))}"
        )


def same_site(url: str, hosts: set[str]) -> bool:
    """Whether an Origin or Referer value names one of this server's pages."""
    try:
        parts = urlparse(url.strip())
    except ValueError:  # e.g. an unclosed [ in the address
        return False
    return parts.scheme == "http" and parts.netloc.lower() in hosts


def check_origin(headers, hosts: set[str]) -> None:
    """A browser names the page a POST comes from in Origin (and usually Referer); when it does, it
    must be one of ours. Clients that send neither (curl, scripts) still need the token."""
    for header in ("Origin", "Referer"):
        for value in headers.get_all(header) or []:
            if not same_site(value, hosts):
                raise Refused(
                    403, f"the {header} header names another site: answers come from this page only"
                )


def body_length(headers) -> int:
    """The body's size from its one Content-Length header, parsed strictly: digits only (int()
    would also take '+5', ' 5 ' or '5_0', and '-1'), at most MAX_BODY."""
    if headers.get("Transfer-Encoding") is not None:
        raise Refused(400, "the Transfer-Encoding header is not accepted: send a Content-Length")
    values = headers.get_all("Content-Length") or []
    if not values:
        raise Refused(411, "a POST needs a Content-Length header")
    text = values[0].strip()
    if len(values) > 1 or not re.fullmatch(r"[0-9]+", text):
        raise Refused(400, "the Content-Length header must be one whole number of bytes")
    if len(text) > 9 or int(text) > MAX_BODY:  # (a 9-digit limit keeps int() of huge text away)
        raise Refused(413, f"the Content-Length header is over the {MAX_BODY}-byte limit")
    return int(text)


def parse_form(body: bytes, fields: set[str]) -> dict[str, str]:
    """The answer form's fields from a url-encoded body: UTF-8 (percent escapes too), only the
    form's own fields, each at most once."""
    try:
        pairs = parse_qs(
            body.decode("utf-8"),
            keep_blank_values=True,  # an empty field is reported as empty, not as missing
            strict_parsing=True,
            errors="strict",
            max_num_fields=2 * len(fields),
        )
    except ValueError:  # (UnicodeDecodeError is a ValueError)
        raise Refused(400, "the body is not a url-encoded UTF-8 form") from None
    for name, values in pairs.items():
        if name not in fields:
            raise Refused(400, f"the form has an unknown field {ascii(name[:40])}")
        if len(values) > 1:
            raise Refused(400, f"the field '{name}' is given {len(values)} times")
    return {name: values[0] for name, values in pairs.items()}


def check_token(form: dict[str, str], token: str) -> None:
    """The form must carry this server's token: a page on another site cannot read it (the browser
    keeps our pages from other origins), so it cannot forge an answer. compare_digest takes as
    long wherever the first wrong character is, so timing a refusal tells nothing of the token."""
    if not hmac.compare_digest(form.get("token", "").encode("utf-8"), token.encode("ascii")):
        raise Refused(
            403,
            "the field 'token' is missing or out of date: reload the page "
            "(a restarted server has a new token)",
        )


class AnnotationHandler(BaseHTTPRequestHandler):
    """One request to the annotation server. serve() makes a subclass per server that sets its
    study, its token and its Host values."""

    study: Study
    token: str  # secret, new at each start; in every form, required on every POST
    hosts: set[str]  # allowed_hosts()
    # The socket's timeout (StreamRequestHandler applies it): a client that stays silent in its
    # request line or headers is dropped, rather than holding a thread for ever.
    timeout = REQUEST_SECONDS

    def send(self, status: int, body: bytes = b"", location: str = "") -> None:
        try:
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            for name, value in SECURITY_HEADERS.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client left before reading the answer: nothing to tell it
            self.close_connection = True

    def refuse(self, err: Refused) -> None:
        if err.status != 404:  # (a browser asks for /favicon.ico: not worth a line)
            print(f"refused {self.command}: {err.status} {err.reason}", file=sys.stderr)
        self.send(err.status, refused_page(err))

    def do_GET(self):
        try:
            check_host(self.headers, self.hosts)
            url = urlparse(self.path)
            if url.path not in ("/", "/item"):
                raise Refused(404, "no such page")
            name = parse_qs(url.query).get("annotator", [""])[0]
            if url.path == "/" or not name:
                return self.send(200, START)
            annotator = check_annotator(name)
            item, done = self.study.next_item(annotator)
            if item:
                return self.send(200, item_page(self.study, annotator, item, done, self.token))
            thanks = (
                f"<h1>Thank you, {html.escape(annotator)}</h1>"
                f"<p>You rated {done} item(s); nothing is left for you.</p>"
            )
            self.send(200, page("Thank you", thanks))
        except Refused as err:
            self.refuse(err)

    def do_POST(self):
        self.unread = True  # the body is still in the socket
        try:
            self.answer()
        except Refused as err:
            self.refuse(err)
            if self.unread:
                self.linger()

    def answer(self) -> None:
        """POST /answer: the checks in order (whose request, how big, which form), then the
        judgement; the first check that fails raises Refused."""
        check_host(self.headers, self.hosts)
        if urlparse(self.path).path != "/answer":
            raise Refused(404, "no such page")
        check_origin(self.headers, self.hosts)
        form = parse_form(self.read_body(body_length(self.headers)), self.study.fields())
        check_token(form, self.token)
        try:
            annotator = self.study.answer(form)
        except ValueError as err:  # a question left out: the same page again, saying which
            who = form["annotator"]
            done = sum(r["annotator"] == who for r in self.study.records)
            item = self.study.items[form["item"]]
            return self.send(400, item_page(self.study, who, item, done, self.token, str(err)))
        self.send(303, location="/item?" + urlencode({"annotator": annotator}))

    def read_body(self, length: int) -> bytes:
        """Exactly `length` bytes, within `self.timeout` for the whole body: a client that sends
        less than its Content-Length, or a byte at a time, cannot hold this thread."""
        deadline = time.monotonic() + self.timeout
        body = b""
        while len(body) < length:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                self.connection.settimeout(left)
                chunk = self.rfile.read1(length - len(body))  # what has come, up to the rest
            except TimeoutError:
                raise Refused(
                    408,
                    f"the body did not arrive within {self.timeout:g} s (Content-Length too large?)",
                ) from None
            if not chunk:
                raise Refused(400, "the body is shorter than its Content-Length header")
            body += chunk
        self.unread = False
        return body

    def linger(self) -> None:
        """After refusing a POST whose body was not read: close our side for writing, then read
        and drop what the client still sends, a little and briefly. Closing a socket with
        unread data resets the connection, and the client could lose our answer with it."""
        deadline = time.monotonic() + LINGER_SECONDS
        dropped = 0
        try:
            self.connection.shutdown(socket.SHUT_WR)
            while dropped < LINGER_BYTES and time.monotonic() < deadline:
                self.connection.settimeout(max(deadline - time.monotonic(), 0.01))
                chunk = self.connection.recv(65536)
                if not chunk:  # the client has sent everything and closed
                    break
                dropped += len(chunk)
        except OSError:  # a timeout or a client already gone: either way, done
            pass

    def log_message(self, *args):  # quiet: the JSONL file is the log
        pass


def serve(
    study: Study, port: int = 8765, host: str = "127.0.0.1", seconds: float = REQUEST_SECONDS
) -> ThreadingHTTPServer:
    """The annotation server on host:port (127.0.0.1 by default: never reachable from another
    machine); port 0 = any free port. `seconds`: the most a client may take to send a request."""

    class Handler(AnnotationHandler):
        """AnnotationHandler for this server alone: its own study, token and time limit."""

    Handler.study = study
    Handler.token = secrets.token_urlsafe(32)
    Handler.timeout = seconds
    server = ThreadingHTTPServer((host, port), Handler)
    Handler.hosts = allowed_hosts(host, server.server_address[1])  # port 0: the one it bound
    return server


# --- the command line ------------------------------------------------------------------------------
def port_flag(text: str) -> int:
    """--port: a TCP port, 1-65535, checked as the flags are read (past 65535 the socket library
    raises OverflowError, a traceback, and only when it binds)."""
    if not re.fullmatch(r"[0-9]{1,5}", text.strip()) or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(
            f"--port must be a whole number from 1 to 65535, got {text!r}"
        )
    return int(text)


def host_flag(text: str) -> str:
    """--host: the name or IPv4 address annotators' browsers use for this server. The Host check
    accepts only it (besides 127.0.0.1 and localhost), so a wildcard such as 0.0.0.0, a name no
    browser sends, is refused here rather than refusing every request later."""
    name = text.strip().lower()
    if not re.fullmatch(r"[a-z0-9.-]{1,253}", name):
        raise argparse.ArgumentTypeError(
            f"--host must be a host name or an IPv4 address, got {text!r}"
        )
    if name == "0.0.0.0":
        raise argparse.ArgumentTypeError(
            "--host 0.0.0.0 listens on every address, but browsers send the name they were "
            "given: give this machine's name or address"
        )
    return name


def loopback(host: str) -> bool:
    """Whether `host` is this machine only (127.x.x.x or localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost
        return False


def main(argv=None) -> int:
    """`python extras/human.py serve ...`: the annotation page until Ctrl-C."""
    # plumbing.cli.Parser: a bad flag is one line (a UserError), not argparse's usage and exit
    p = Parser(prog="extras/human.py", description=__doc__.split("\n")[0])
    commands = p.add_subparsers(dest="command", required=True)
    s = commands.add_parser(
        "serve",
        help="the annotation page on 127.0.0.1 (or --host)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    s.add_argument(
        "--transcripts", required=True, help="RUN/eval/transcripts.jsonl written by evaluate"
    )
    s.add_argument("--a", required=True, help="the system under test (e.g. mascot)")
    s.add_argument("--b", required=True, help="the system it is compared with (e.g. few-shot-cot)")
    s.add_argument(
        "--out", required=True, help="JSON-lines file of judgements (appended; resumable)"
    )
    s.add_argument(
        "--ratings",
        type=flag_type("--ratings", int, "positive"),
        default=2,
        help="judgements per item",
    )
    s.add_argument(
        "--per-annotator",
        type=flag_type("--per-annotator", int, "positive"),
        default=10,
        help="most items one annotator rates",
    )
    s.add_argument(
        "--likert",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ask the Likert items too",
    )
    s.add_argument(
        "--seed", type=int, default=0, help="seed of the sides and of each annotator's order"
    )
    s.add_argument("--port", type=port_flag, default=8765, help="TCP port, 1-65535")
    s.add_argument(
        "--host",
        type=host_flag,
        default="127.0.0.1",
        help="the address to listen on and that browsers use; anything but 127.0.0.1 or "
        "localhost opens the page to the network (docs/THREATS.md)",
    )
    try:
        args = p.parse_args(argv)
        items = load_items(args.transcripts, args.a, args.b)
        study = Study(
            items, Path(args.out), args.ratings, args.per_annotator, args.likert, args.seed
        )
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        server = serve(study, args.port, args.host)
    except OSError as err:  # the port is taken or not allowed, or the host is not this machine's
        print(f"error: --host {args.host} --port {args.port}: {err}", file=sys.stderr)
        return 2
    if not loopback(args.host):
        common.warn(
            f"--host {args.host}: anyone who can reach this address can open the page and answer "
            "under any name; there is no login and no TLS (docs/THREATS.md)"
        )
    print(
        f"{len(items)} items, {len(study.records)} judgements so far in {args.out}; "
        f"open http://{args.host}:{server.server_address[1]}/ (Ctrl-C stops)",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: every answer is already on disk
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
