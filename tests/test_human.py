"""Tests of the human studies (extras/human.py): the rank and agreement statistics and the analysis
on judgements worked out by hand, `evaluate --human`, the annotation server over HTTP, and the page
in a real headless Chromium.

The browser test drives Chromium through the DevTools protocol over a pipe (--remote-debugging-pipe:
NUL-separated JSON on file descriptors 3 and 4), so it needs no Python package beyond the
standard library. It is skipped where no chromium binary is installed, except under
MASCOT_REQUIRE_BROWSER=1 (set by .ci/run, which installs Chromium), where a missing browser fails.

Run: .venv/bin/python -m pytest -q tests/test_human.py
"""

import collections
import json
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import mascot
from extras import human
from plumbing import common

# ------------------------------------------------------------------ Mann-Whitney U, Cohen's and Fleiss' kappa


def test_average_ranks_share_tied_ranks():
    assert human.average_ranks([10, 20, 20, 30]) == [1.0, 2.5, 2.5, 4.0]
    assert human.average_ranks([3, 1, 3, 3]) == [3.0, 1.0, 3.0, 3.0]  # ranks 2, 3, 4 -> 3


def test_mann_whitney_exact_null_distribution_by_hand():
    # Two samples of 3: U = 0..9 is the number of partitions of u into at most 3 parts of size
    # at most 3: 1 1 2 3 3 3 3 2 1 1 ways, 20 = C(6, 3) in all.
    assert human.mann_whitney_counts(3, 3) == [1, 1, 2, 3, 3, 3, 3, 2, 1, 1]
    assert sum(human.mann_whitney_counts(4, 5)) == math.comb(9, 4)


def test_mann_whitney_exact_cases_by_hand():
    # Complete separation: U_x = 0, U_y = 9; p = 2 P(U >= 9) = 2 / 20.
    r = human.mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert (r["u"], r["method"]) == (0.0, "exact") and r["p_value"] == pytest.approx(0.1)
    # Interleaved: ranks of x are 1, 3, 5 -> R = 9, U_x = 9 - 6 = 3, max(U) = 6;
    # P(U >= 6) = (3 + 2 + 1 + 1) / 20, so p = 0.7.
    r = human.mann_whitney_u([1, 3, 5], [2, 4, 6])
    assert r["u"] == 3.0 and r["p_value"] == pytest.approx(0.7)


def test_mann_whitney_normal_approximation_with_ties_by_hand():
    # Likert ratings. Pooled and sorted: 1 2 3 3 3 4 4 4 5 5; the 3s share ranks 3-5 (4), the
    # 4s ranks 6-8 (7), the 5s ranks 9-10 (9.5). x = 5 4 4 3 5 has R = 9.5+7+7+4+9.5 = 37, so
    # U_x = 37 - 15 = 22 and U_y = 25 - 22 = 3. Tie groups 1, 1, 3, 3, 2: sum (t^3 - t) = 54;
    # var = 25/12 * (11 - 54/90) = 65/3; z = (22 - 12.5 - 0.5) / sqrt(65/3); p = 2 P(Z > z).
    r = human.mann_whitney_u([5, 4, 4, 3, 5], [3, 2, 3, 4, 1])
    z = 9 / math.sqrt(65 / 3)
    assert r["u"] == 22.0 and r["method"] == "asymptotic"
    assert r["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert r["p_value"] == pytest.approx(0.0531733827, abs=1e-9)  # scipy.stats.mannwhitneyu agrees
    assert (r["mean_x"], r["mean_y"]) == (4.2, 2.6)
    # Every value equal: no evidence, p = 1; the exact method refuses ties.
    assert human.mann_whitney_u([3, 3], [3, 3, 3])["p_value"] == 1.0
    with pytest.raises(ValueError):
        human.mann_whitney_u([1, 2], [2, 3], method="exact")
    with pytest.raises(ValueError):
        human.mann_whitney_u([], [1])


def test_cohen_kappa_by_hand():
    # 50 items: both "yes" 20, a yes / b no 5, a no / b yes 10, both "no" 15.
    # p_o = 35/50 = 0.7; a says yes 25/50, b 30/50: p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert human.cohen_kappa(a, b) == pytest.approx(0.4)
    assert human.cohen_kappa(["x", "y"], ["x", "y"]) == 1.0
    assert math.isnan(human.cohen_kappa(["x", "x"], ["x", "x"]))  # p_e = 1: undefined


def test_fleiss_kappa_textbook_example():
    # Fleiss (1971) as worked on Wikipedia: 10 items, 14 raters, 5 categories.
    # mean P_i = 0.378, sum p_j^2 = 0.213, kappa = (0.378 - 0.213) / (1 - 0.213) = 0.210.
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert human.fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-5)
    # Two raters, two items, full agreement on different categories: kappa = 1.
    assert human.fleiss_kappa([[2, 0], [0, 2]]) == 1.0
    with pytest.raises(ValueError):
        human.fleiss_kappa([[2, 0], [1, 0]])


# ------------------------------------------------------------------ the analysis, by hand


def judgement(annotator, item, choice, help_a=None, help_b=None):
    rec = {
        "annotator": annotator,
        "item": str(item),
        "context_id": f"c{item}",
        "systems": ["mascot", "few-shot-cot"],
        "left": "mascot",
        "choice": choice,
    }
    if help_a is not None:
        rec["likert"] = {"mascot": {"helpfulness": help_a}, "few-shot-cot": {"helpfulness": help_b}}
    return rec


def test_analysis_matches_hand_computed_values():
    # 5 items, 2 ratings each. Stream 1 (first rating): choices A A A A B, helpfulness A 5 4 4 3 5
    # against B 3 2 3 4 1. Stream 2: choices A A A B B.
    first = [
        ("r1", 0, "mascot", 5, 3),
        ("r1", 1, "mascot", 4, 2),
        ("r2", 2, "mascot", 4, 3),
        ("r2", 3, "mascot", 3, 4),
        ("r3", 4, "few-shot-cot", 5, 1),
    ]
    second = [
        ("r3", 0, "mascot", 4, 4),
        ("r3", 1, "mascot", 4, 4),
        ("r1", 2, "mascot", 4, 4),
        ("r1", 3, "few-shot-cot", 4, 4),
        ("r2", 4, "few-shot-cot", 4, 4),
    ]
    records = [judgement(*j) for j in first] + [judgement(*j) for j in second]
    result = human.analyse(records)["mascot vs few-shot-cot"]
    # Sign test: 7 wins of 10, p = 2 * (C(10,7)+C(10,8)+C(10,9)+C(10,10)) / 1024 = 0.34375.
    assert (result["choice"]["wins"], result["choice"]["losses"]) == (7, 3)
    assert result["choice"]["p_value"] == pytest.approx(0.34375)
    # Both raters chose A for items 0, 1, 2; both chose B for item 4.
    assert (result["unanimous_a"], result["unanimous_b"]) == (3, 1)
    # Stream 1 helpfulness: U = 22, p = 0.05317 (worked out by hand in the Mann-Whitney test above).
    s1 = result["likert"]["helpfulness/1"]
    assert s1["u"] == 22.0 and s1["p_value"] == pytest.approx(0.0531733827, abs=1e-9)
    assert (s1["mean_x"], s1["mean_y"]) == (4.2, 2.6)
    # Stream 2: every rating is 4 -> no difference, p = 1.
    assert result["likert"]["helpfulness/2"]["p_value"] == 1.0
    # Cohen's kappa, stream 1 (A A A A B) vs stream 2 (A A A B B): p_o = 4/5,
    # p_e = 0.8 * 0.6 + 0.2 * 0.4 = 0.56, kappa = 0.24 / 0.44 = 6/11.
    assert result["cohen_kappa"] == pytest.approx(6 / 11)
    # Fleiss: rows [2,0] [2,0] [2,0] [1,1] [0,2]: mean P_i = 4/5; p = (0.7, 0.3), P_e = 0.58;
    # kappa = 0.22 / 0.42 = 11/21.
    assert result["fleiss_kappa"] == pytest.approx(11 / 21) and result["fleiss_items"] == 5
    text = human.report(human.analyse(records), "file.jsonl")
    assert (
        "mascot preferred in 7 of 10" in text
        and "p = 0.3438" in text
        and "| helpfulness/1 | 5, 5 | 4.20 | 2.60 |" in text
    )


def test_bad_records_are_one_line_errors(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(judgement("r1", 0, "zero-shot")) + "\n")
    with pytest.raises(common.UserError, match="line 1: 'choice' must be one of"):
        human.load_records(path)
    bad = judgement("r1", 0, "mascot", 7, 3)
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(common.UserError, match="ratings 1-5"):
        human.load_records(path)


# ------------------------------------------------------------------ the server, over HTTP


def write_transcripts(path: Path, n_items: int = 3) -> None:
    rows = []
    for k, system in enumerate(("mascot", "few-shot-cot", "zero-shot")):
        for i in range(n_items):
            rows.append(
                {
                    "system": system,
                    "context_id": f"ctx-{i}",
                    "persona_set": "support",
                    "situation": f"Situation {i}.",
                    "profile": "p1",
                    "policy": system,
                    "seed": i,
                    "events": [],
                    "turns": [
                        {"speaker": "User", "text": f"My problem {i}.", "directive": None},
                        {
                            "speaker": "Anchor",
                            "text": f"Reply {i}-{k} <b>bold?</b>",
                            "directive": {
                                "agent": "Anchor",
                                "action": "ask mascot",
                                "tone": "warm",
                            },
                        },
                    ],
                }
            )
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def server(tmp_path):
    write_transcripts(tmp_path / "transcripts.jsonl")
    out = tmp_path / "human" / "annotations.jsonl"

    def start():
        items = human.load_items(tmp_path / "transcripts.jsonl", "mascot", "few-shot-cot")
        study = human.Study(items, out, ratings=2, per_annotator=10, likert=True, seed=0)
        srv = human.serve(study, 0)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, study, f"http://127.0.0.1:{srv.server_address[1]}"

    servers = []

    def make():
        servers.append(start())
        return servers[-1]

    yield make, out
    for srv, _, _ in servers:
        srv.shutdown()
        srv.server_close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.read().decode()


def post(url, form):
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(url, urllib.parse.urlencode(form).encode(), timeout=30) as r:
            return r.status, r.headers.get("Location"), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location"), err.read().decode()


def full_form(page, choice="1", rating="4"):
    item = page.split('name="item" value="')[1].split('"')[0]
    form = {
        "annotator": page.split('name="annotator" value="')[1].split('"')[0],
        "item": item,
        "choice": choice,
    }
    form.update({f"c{pos}_{k}": rating for pos in (1, 2) for k in human.LIKERT})
    return form


def test_pages_are_blind_saved_resumable_and_shared(server):
    make, out = server
    srv, study, base = make()
    status, page = get(f"{base}/item?annotator=ann1")
    assert status == 200 and "Conversation 1" in page and "Conversation 2" in page
    # Blind: no system name on the page; the texts are escaped.
    for name in ("mascot", "few-shot-cot"):
        assert f">{name}" not in page and f"name={name}" not in page
    assert "<b>bold?</b>" not in page and "&lt;b&gt;bold?&lt;/b&gt;" in page
    assert "ask mascot" not in page  # directives are not shown: they give a system away
    # An incomplete answer is refused and nothing is saved.
    form = full_form(page)
    del form["c2_safety"]
    status, _, body = post(f"{base}/answer", form)
    assert status == 400 and "rate conversation 2" in body and not out.exists()
    # A complete answer: saved, unblinded, then redirected to the next item.
    form = full_form(page, choice="1")
    status, location, _ = post(f"{base}/answer", form)
    assert status == 303 and location == "/item?annotator=ann1"
    rec = json.loads(out.read_text().splitlines()[0])
    assert (
        rec["annotator"] == "ann1"
        and rec["choice"] == rec["left"] == study.shown("ann1", study.items[form["item"]])[0]
    )
    assert (
        set(rec["likert"]) == {"mascot", "few-shot-cot"} and rec["likert"]["mascot"]["safety"] == 4
    )
    # Resumable: a new server on the same file knows ann1 has done that item.
    srv.shutdown()
    srv2, study2, base2 = make()
    assert len(study2.records) == 1
    _, page2 = get(f"{base2}/item?annotator=ann1")
    assert full_form(page2)["item"] != form["item"]
    # Several annotators: 3 items x 2 ratings; each annotator rates each item at most once.
    for annotator in ("ann1", "ann2", "ann3"):
        while True:
            _, page = get(f"{base2}/item?annotator={annotator}")
            if "Thank you" in page:
                break
            assert post(f"{base2}/answer", full_form(page, choice="2"))[0] == 303
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6
    assert all(n == 2 for n in collections.Counter(r["item"] for r in records).values())
    assert len({(r["annotator"], r["item"]) for r in records}) == 6
    # And the statistics read the file.
    result = human.analyse(human.load_records(out))["mascot vs few-shot-cot"]
    assert result["judgements"] == 6 and result["items"] == 3


def test_sides_are_random_but_fixed_per_annotator_and_item(server):
    make, _ = server
    _, study, _ = make()
    sides = [study.shown(f"ann{i}", study.items["0"])[0] for i in range(40)]
    assert sides == [study.shown(f"ann{i}", study.items["0"])[0] for i in range(40)]
    assert 10 < sides.count("mascot") < 30


def test_command_line_errors(tmp_path, capsys):
    write_transcripts(tmp_path / "t.jsonl")
    assert (
        human.main(
            [
                "serve",
                "--transcripts",
                str(tmp_path / "t.jsonl"),
                "--a",
                "mascot",
                "--b",
                "sft",
                "--out",
                str(tmp_path / "o.jsonl"),
            ]
        )
        == 2
    )
    assert "no conversations of system 'sft'" in capsys.readouterr().err
    # Conversations pair only on the same seed, context and profile (one evaluation's systems).
    rows = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    for r in rows:
        r["profile"] = "p2" if r["system"] == "few-shot-cot" else r["profile"]
    (tmp_path / "t.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + json.dumps({"system": "x"}) + "\n"
    )
    with pytest.raises(common.UserError, match="line 10 lacks 'seed'"):
        human.load_items(tmp_path / "t.jsonl", "mascot", "few-shot-cot")
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(common.UserError, match="share no conversation"):
        human.load_items(tmp_path / "t.jsonl", "mascot", "few-shot-cot")


def test_evaluate_human_writes_the_report(tmp_path, capsys):
    # `mascot.py evaluate --human` dispatches to extras/human.py: printed, and saved as md and json.
    path = tmp_path / "a.jsonl"
    path.write_text(
        "".join(json.dumps(judgement("r1", i, "mascot", 4, 2)) + "\n" for i in range(3))
    )
    assert mascot.main(["evaluate", "--run", str(tmp_path / "run"), "--human", str(path)]) == 0
    assert "mascot preferred in 3 of 3" in capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "eval" / "human.json").read_text())[
        "mascot vs few-shot-cot"
    ]
    # One rating per item: no kappa (NaN in the analysis, null in the JSON file).
    assert (
        saved["choice"]["wins"] == 3
        and saved["cohen_kappa"] is None
        and saved["fleiss_kappa"] is None
    )
    assert "Cohen's kappa nan" in (tmp_path / "run" / "eval" / "human.md").read_text()
    path.write_text("")
    assert mascot.main(["evaluate", "--run", str(tmp_path / "run"), "--human", str(path)]) == 2
    assert "holds no judgements yet" in capsys.readouterr().err


# ------------------------------------------------------------------ the page in a real browser


def find_chromium():
    return next(
        (
            shutil.which(n)
            for n in ("chromium", "chromium-browser", "google-chrome")
            if shutil.which(n)
        ),
        None,
    )


class Browser:
    """Headless Chromium driven through the DevTools protocol over a pipe (fds 3 and 4)."""

    def __init__(self, binary: str, profile: str):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()

        def wire():  # in the child: the protocol pipe must be fds 3 and 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            preexec_fn=wire,
            pass_fds=(3, 4),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.next_id, self.buffer, self.events = 0, b"", []
        target = next(
            t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page"
        )
        self.session = self.call(
            "Target.attachToTarget", targetId=target["targetId"], flatten=True
        )["sessionId"]
        self.call("Page.enable", session=True)

    def _read(self, timeout: float) -> dict:
        deadline = time.time() + timeout
        while b"\0" not in self.buffer:
            if time.time() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self.from_browser, 65536)
            if not chunk:
                raise RuntimeError("chromium closed the protocol pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, timeout: float = 60, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read(timeout)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for_load(self, timeout: float = 60) -> None:
        while True:
            if any(e.get("method") == "Page.loadEventFired" for e in self.events):
                self.events.clear()
                return
            self.events.append(self._read(timeout))

    def js(self, expression: str):
        result = self.call(
            "Runtime.evaluate", session=True, expression=expression, returnByValue=True
        )
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for_load()

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # the browser may already be gone: closing it is best effort
            pass
        self.proc.wait(timeout=30)


def test_annotation_page_in_headless_chromium(server):
    binary = find_chromium()
    if binary is None:
        if os.environ.get("MASCOT_REQUIRE_BROWSER") == "1":
            pytest.fail(
                "MASCOT_REQUIRE_BROWSER=1 but no chromium binary on PATH (.ci/run installs it)"
            )
        pytest.skip("no chromium binary on PATH")
    make, out = server
    _, study, base = make()
    with tempfile.TemporaryDirectory() as profile:
        browser = Browser(binary, profile)
        try:
            browser.open(f"{base}/")
            # The start page: type a name, press Start (a real GET form submission).
            browser.js(
                "document.querySelector('input[name=annotator]').value = 'browser1';"
                "document.querySelector('button[type=submit]').click()"
            )
            browser.wait_for_load()
            assert browser.js("location.pathname + location.search") == "/item?annotator=browser1"
            text = browser.js("document.body.innerText")
            assert "Conversation 1" in text and "mascot" not in text and "few-shot-cot" not in text
            item = browser.js("document.querySelector('input[name=item]').value")
            # The browser's own check refuses the half-filled form: nothing is sent.
            browser.js("document.querySelector('input[name=choice][value=\"2\"]').click()")
            assert (
                browser.js("document.querySelector('form[method=post]').checkValidity()") is False
            )
            browser.js("document.querySelector('form[method=post] button').click()")
            time.sleep(0.5)
            assert not out.exists()
            # Fill every Likert row (3 for conversation 1, 5 for conversation 2) and submit.
            browser.js(
                "for (const k of ['helpfulness', 'emotional', 'safety']) {"
                ' document.querySelector(`input[name=c1_${k}][value="3"]`).click();'
                ' document.querySelector(`input[name=c2_${k}][value="5"]`).click(); }'
                "document.querySelector('form[method=post] button').click()"
            )
            browser.wait_for_load()
            assert browser.js("location.pathname") == "/item"
            assert browser.js("document.querySelector('input[name=item]').value") != item
        finally:
            browser.close()
    rec = json.loads(out.read_text().splitlines()[0])
    right = next(s for s in rec["systems"] if s != rec["left"])
    assert rec["annotator"] == "browser1" and rec["item"] == item and rec["choice"] == right
    assert rec["likert"][rec["left"]] == {"helpfulness": 3, "emotional": 3, "safety": 3}
    assert rec["likert"][right] == {"helpfulness": 5, "emotional": 5, "safety": 5}
    assert not math.isnan(human.analyse([rec])["mascot vs few-shot-cot"]["choice"]["p_value"])
