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
import contextlib
import html
import json
import math
import os
import shutil
import socket
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

    def start(ratings, per_annotator, serve_kw):
        items = human.load_items(tmp_path / "transcripts.jsonl", "mascot", "few-shot-cot")
        study = human.Study(items, out, ratings, per_annotator, likert=True, seed=0)
        srv = human.serve(study, 0, **serve_kw)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv, study, f"http://127.0.0.1:{srv.server_address[1]}"

    servers = []

    def make(ratings=2, per_annotator=10, **serve_kw):
        servers.append(start(ratings, per_annotator, serve_kw))
        return servers[-1]

    yield make, out
    for srv, _, _ in servers:
        srv.shutdown()
        srv.server_close()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def post(url, form, headers=None):
    """POST a form; headers (a Host, an Origin) replace urllib's own."""
    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, urllib.parse.urlencode(form).encode(), headers or {})
    try:
        with opener.open(request, timeout=30) as r:
            return r.status, r.headers.get("Location"), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Location"), err.read().decode()


def hidden(page, name):
    """The value of the page's hidden field `name`, as a browser would send it."""
    return page.split(f'name="{name}" value="')[1].split('"')[0]


def token_of(base):
    """The token a page of this server carries ("" from a page without one)."""
    page = get(f"{base}/item?annotator=a1")[1]
    return hidden(page, "token") if 'name="token"' in page else ""


def full_form(page, choice="1", rating="4"):
    form = {"annotator": hidden(page, "annotator"), "item": hidden(page, "item"), "choice": choice}
    if 'name="token"' in page:  # (the form as the server served it, its token included)
        form["token"] = hidden(page, "token")
    form.update({f"c{pos}_{k}": rating for pos in (1, 2) for k in human.LIKERT})
    return form


def answer_form(annotator, item, token, choice="1"):
    """An answer as a direct request would make it, without loading the page first."""
    form = {"annotator": annotator, "item": str(item), "token": token, "choice": choice}
    form.update({f"c{pos}_{k}": "4" for pos in (1, 2) for k in human.LIKERT})
    return form


def raw(base, lines, body=b"", wait=10.0):
    """Send a request byte for byte (urllib will not send a malformed one): `lines` are the request
    line and the headers. Reads until the server closes; returns (status, whole response). A
    server that holds the connection longer than `wait` seconds fails the test (socket timeout)."""
    port = int(base.rsplit(":", 1)[1])
    request = "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + body
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    status = int(data.split(b" ", 2)[1]) if data else 0
    return status, data.decode("utf-8", "replace")


def stored(out):
    """The judgements in the file so far."""
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


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


# ------------------------------------------------------------------ the server refuses what its page did not send
# Each test below first reproduced a defect a tester found with curl (the server then stored the
# forged or over-limit answer, held a thread, or printed a traceback).


def test_forged_cross_site_post_is_refused(server):
    # A page on another site posting into the annotator's browser: the tester's curl, stored as
    # {"annotator": "victim"} before the fix.
    make, out = server
    _, _, base = make()
    port = base.rsplit(":", 1)[1]
    forged = {"annotator": "victim", "item": "0", "choice": "1"}
    forged.update({f"c{pos}_{k}": "5" for pos in (1, 2) for k in human.LIKERT})
    evil = {"Origin": "http://evil.example", "Host": f"attacker.example:{port}"}
    status, _, body = post(f"{base}/answer", forged, evil)
    assert status == 403 and "Host header" in html.unescape(body)
    # With the right Host, another site's Origin or Referer is refused even with a valid token
    # (which such a page cannot read: the token is defence one, Origin defence two).
    _, page = get(f"{base}/item?annotator=victim")
    form = full_form(page)
    for headers in (
        {"Origin": "http://evil.example"},
        {"Origin": "null"},  # a sandboxed frame or a data: page
        {"Origin": f"https://127.0.0.1:{port}"},  # another scheme is another origin
        {"Referer": "http://evil.example/page.html"},
        {"Origin": base, "Referer": f"http://127.0.0.1.evil.example:{port}/"},
    ):
        status, _, body = post(f"{base}/answer", form, headers)
        assert status == 403 and "names another site" in html.unescape(body), headers
    assert stored(out) == []
    # What a browser sends from our own page is taken.
    ours = {"Origin": base, "Referer": f"{base}/item?annotator=victim"}
    assert post(f"{base}/answer", form, ours)[0] == 303
    assert [r["annotator"] for r in stored(out)] == ["victim"]


def test_dns_rebinding_host_is_refused(server):
    # attacker.example re-resolved to 127.0.0.1: same origin for the browser, so it could read
    # the page (and its token) and post. Its requests carry its own name in Host.
    make, out = server
    _, _, base = make()
    port = base.rsplit(":", 1)[1]
    status, body = get(f"{base}/item?annotator=a1", {"Host": f"attacker.example:{port}"})
    assert status == 403 and 'name="token"' not in body and "Host header" in html.unescape(body)
    status, body = get(f"{base}/", {"Host": "127.0.0.1"})  # the port is part of the address
    assert status == 403
    _, page = get(f"{base}/item?annotator=a1")
    form = full_form(page)
    for host in (f"attacker.example:{port}", f"127.0.0.1:{int(port) + 1}", f"localhost.:{port}"):
        assert post(f"{base}/answer", form, {"Host": host})[0] == 403, host
    body = urllib.parse.urlencode(form)
    no_host = ["POST /answer HTTP/1.0", f"Content-Length: {len(body)}"]
    assert raw(base, no_host, body.encode())[0] == 403
    two_hosts = no_host + [f"Host: 127.0.0.1:{port}", f"Host: attacker.example:{port}"]
    assert raw(base, two_hosts, body.encode())[0] == 403
    assert stored(out) == []
    # 127.0.0.1 and localhost, with the port, are this server.
    assert get(f"http://localhost:{port}/item?annotator=a1")[0] == 200
    assert post(f"{base}/answer", form, {"Host": f"LocalHost:{port}"})[0] == 303
    assert len(stored(out)) == 1


def test_token_is_required_on_every_post(server):
    make, out = server
    _, _, base = make()
    _, _, other_base = make()
    _, page = get(f"{base}/item?annotator=a1")
    _, other_page = get(f"{other_base}/item?annotator=a1")
    assert 'type="hidden" name="token"' in page  # the form carries it: a browser sends it back
    token = hidden(page, "token")
    assert len(token) >= 40 and token != hidden(other_page, "token")  # one secret per server
    assert hidden(get(f"{base}/item?annotator=a2")[1], "token") == token  # the same for everyone
    form = full_form(page)
    for wrong in (None, "", token[:-1], token + "x", hidden(other_page, "token"), "é" * 43):
        bad = dict(form)
        if wrong is None:
            del bad["token"]
        else:
            bad["token"] = wrong
        status, _, body = post(f"{base}/answer", bad)
        assert status == 403 and "'token'" in html.unescape(body), wrong
    assert stored(out) == []
    assert post(f"{base}/answer", form)[0] == 303


def test_limits_are_enforced_on_the_server(server):
    # --per-annotator 1 --ratings 1: direct POSTs stored 3 items for one annotator and 3 ratings
    # for one item before the fix (the limits lived only in the page the server chose to show).
    make, out = server
    _, _, base = make(ratings=1, per_annotator=1)
    token = token_of(base)
    assert post(f"{base}/answer", answer_form("a1", 0, token))[0] == 303
    status, _, body = post(f"{base}/answer", answer_form("a1", 1, token))
    assert status == 409 and "--per-annotator" in html.unescape(body)
    status, _, body = post(f"{base}/answer", answer_form("a2", 0, token))
    assert status == 409 and "--ratings" in html.unescape(body)
    assert post(f"{base}/answer", answer_form("a1", 0, token, choice="2"))[0] == 303  # resubmit
    assert [(r["annotator"], r["item"]) for r in stored(out)] == [("a1", "0")]
    assert stored(out)[0]["choice"] == stored(out)[0]["left"]  # the first answer kept
    # Ten annotators at once on item 1, which takes one rating: the check and the write are one
    # step under the lock, so exactly one is stored.
    results = []

    def answer(name):
        results.append(post(f"{base}/answer", answer_form(name, 1, token))[0])

    threads = [threading.Thread(target=answer, args=(f"b{i}",)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [303] + [409] * 9
    assert collections.Counter(r["item"] for r in stored(out)) == {"0": 1, "1": 1}


def test_annotator_names_are_bounded_and_fields_checked(server, capfd):
    # Before the fix a 100 KB name and a name with a newline in it were stored as they came.
    make, out = server
    _, _, base = make()
    token = token_of(base)
    status, _, body = post(f"{base}/answer", answer_form("x" * 100_000, 0, token))
    # Over the body cap: refused from its Content-Length header, the body never read.
    assert status == 413 and "Content-Length" in html.unescape(body)
    for name in ("x" * 41, "x" * 3000, "a\nb", "victim\n", " a1", "a b", "\x1b[31mred", "é", ""):
        status, _, body = post(f"{base}/answer", answer_form(name, 0, token))
        assert status == 400 and "'annotator'" in html.unescape(body), name
    assert get(f"{base}/item?annotator=a%0Ab")[0] == 400
    assert get(f"{base}/item?annotator={'x' * 41}")[0] == 400
    # Every other field: known names only, once each, values from the form's own choices.
    cases = [
        ({"item": "99"}, "'item'"),
        ({"item": "0 "}, "'item'"),
        ({"extra": "1"}, "unknown field"),
        ({"choice": "3"}, "choose the conversation"),
        ({"c1_safety": "9"}, "rate conversation 1"),
        ({"c2_emotional": "4.0"}, "rate conversation 2"),
    ]
    for change, reason in cases:
        status, _, body = post(f"{base}/answer", {**answer_form("a1", 0, token), **change})
        assert status == 400 and reason in html.unescape(body), change
    twice = urllib.parse.urlencode(answer_form("a1", 0, token)) + "&choice=2"
    port = base.rsplit(":", 1)[1]
    head = ["POST /answer HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(twice)}"]
    status, body = raw(base, head, twice.encode())
    assert status == 400 and "'choice' is given 2 times" in html.unescape(body)
    assert stored(out) == [] and "Traceback" not in capfd.readouterr().err


def test_malformed_requests_are_400_not_a_traceback(server, capfd):
    # Before the fix: "Content-Length: abc" or a non-UTF-8 body printed a traceback and dropped
    # the connection, and -1 (read to the end) held a thread until the client left.
    make, out = server
    _, _, base = make()
    port = base.rsplit(":", 1)[1]
    token = token_of(base)
    body = urllib.parse.urlencode(answer_form("a1", 0, token)).encode()
    head = ["POST /answer HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    for length, status in [
        ("abc", 400),
        ("-1", 400),
        ("+5", 400),
        ("1_0", 400),
        ("0x10", 400),
        ("", 400),
        ("99999999999999999999", 413),
        ("1000000", 413),  # a whole number, but over the cap (human.MAX_BODY)
    ]:
        assert raw(base, head + [f"Content-Length: {length}"], body)[0] == status, length
    assert raw(base, head, body)[0] == 411  # no Content-Length
    two = head + [f"Content-Length: {len(body)}", f"Content-Length: {len(body)}"]
    assert raw(base, two, body)[0] == 400
    chunked = head + ["Transfer-Encoding: chunked"]
    assert raw(base, chunked, b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))[0] == 400
    # Not UTF-8, as bytes or as percent escapes; not a url-encoded form at all.
    for bad in (body + b"&x=\xff\xfe", body.replace(b"annotator=a1", b"annotator=a%FF"), b"&&="):
        status, text = raw(base, head + [f"Content-Length: {len(bad)}"], bad)
        assert status == 400 and "not a url-encoded UTF-8 form" in html.unescape(text), bad
    assert stored(out) == []
    assert get(f"{base}/")[0] == 200  # still serving
    assert "Traceback" not in capfd.readouterr().err


def test_short_body_does_not_hold_a_thread(server, capfd):
    # A Content-Length larger than the body: the read waited for bytes that never came.
    make, out = server
    _, _, base = make(seconds=0.5)
    port = base.rsplit(":", 1)[1]
    token = token_of(base)
    body = urllib.parse.urlencode(answer_form("a1", 0, token)).encode()
    head = ["POST /answer HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    start = time.monotonic()
    status, text = raw(base, head + [f"Content-Length: {len(body) + 100}"], body, wait=5)
    assert status == 408 and "did not arrive within 0.5 s" in html.unescape(text)
    assert time.monotonic() - start < 4
    # A body sent a byte at a time (each byte well within the limit): the limit is for the whole
    # body, so the server answers after 0.5 s instead of waiting the ~4 s the drip takes.
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as sock:
        sock.sendall(("\r\n".join(head + [f"Content-Length: {len(body)}"]) + "\r\n\r\n").encode())

        def drip():
            with contextlib.suppress(OSError):  # the server closes while we still send
                for byte in body:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.02)

        dripping = threading.Thread(target=drip)
        start = time.monotonic()
        dripping.start()
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.0 408") and time.monotonic() - start < 2.5
        dripping.join(timeout=10)
    # A client that connects and sends nothing is dropped after the limit too.
    with socket.create_connection(("127.0.0.1", int(port)), timeout=5) as idle:
        start = time.monotonic()
        assert idle.recv(100) == b"" and time.monotonic() - start < 4
    assert stored(out) == [] and "Traceback" not in capfd.readouterr().err


def test_a_failed_write_is_a_500_not_a_traceback(server, monkeypatch, capfd):
    # A full disk or a read-only file: the annotator is told, nothing is counted as stored.
    make, out = server
    _, study, base = make()
    token = token_of(base)

    def full_disk(path, record):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(human.files, "append_jsonl", full_disk)
    status, _, body = post(f"{base}/answer", answer_form("a1", 0, token))
    assert status == 500 and "could not be saved" in html.unescape(body) and study.records == []
    assert "Traceback" not in capfd.readouterr().err


def test_pages_cannot_be_framed_by_another_site(server):
    # Framed by another site, the item page (with its token) could be clicked through unseen.
    make, _ = server
    _, _, base = make()
    with urllib.request.urlopen(f"{base}/item?annotator=a1", timeout=30) as r:
        assert r.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
        assert r.headers["Cache-Control"] == "no-store"


def test_port_and_host_flags_are_checked_when_parsed(tmp_path, capsys):
    # Before the fix --port 80000 was an OverflowError traceback when binding.
    write_transcripts(tmp_path / "t.jsonl")
    serve = ["serve", "--transcripts", str(tmp_path / "t.jsonl"), "--a", "mascot"]
    serve += ["--b", "few-shot-cot", "--out", str(tmp_path / "o.jsonl")]
    for port in ("80000", "0", "-1", "abc", "65536", "1e3"):
        assert human.main(serve + ["--port", port]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--port must be a whole number from 1 to 65535" in err
    for host in ("0.0.0.0", "evil host", "a/b"):
        assert human.main(serve + ["--host", host]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--host" in err
    assert human.loopback("localhost") and human.loopback("127.0.0.2")  # no warning for these
    assert not human.loopback("192.168.1.5") and not human.loopback("example.org")
    assert human.main(serve[:-2]) == 2  # a flag left out: one line too
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out" in err
    assert not (tmp_path / "o.jsonl").exists()


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
