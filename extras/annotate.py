"""extras/annotate.py: the annotation page of the human studies, served on 127.0.0.1.

Not a chapter: a tool. It shows people what the paper's human studies showed them (human.py):
one situation and two conversations from RUN/eval/transcripts.jsonl, system A against system B,
names hidden and sides random, with the forced choice "which provides better support?" and, for
each conversation, the three Likert items (helpfulness, emotional appropriateness, perceived
safety; 1-5). Every answer is appended at once to a JSON-lines file (flush + fsync), so the study
survives a crash and resumes where it stopped; several annotators can work at the same time, each
under their own name. Items go to the annotator who asks next, fewest ratings first, until every
item has --ratings judgements (the paper: 2) or the annotator has done --per-annotator (the paper:
at most 10, against fatigue). The side is a function of (seed, annotator, item), so a reloaded
page shows the same layout.

    python extras/annotate.py --transcripts runs/default/eval/transcripts.jsonl --a mascot --b few-shot-cot \
        --out runs/default/human/annotations.jsonl            # then open http://127.0.0.1:8765/
    python mascot.py evaluate --human runs/default/human/annotations.jsonl     # the statistics

Plain standard library (http.server), plain HTML forms, no JavaScript: the browser's own
`required` check keeps half-filled forms from being sent, and the server checks again.
A terminal UI would be simpler to write, but reading two multi-turn conversations side by side is
what the raters do, and a page does that better; it also runs on any machine with a browser.
"""

from __future__ import annotations

import argparse
import datetime
import html
import random
import sys
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import data    # noqa: E402  (the project's modules, from the repository root)
import human   # noqa: E402

STYLE = """body{font-family:sans-serif;max-width:1200px;margin:1em auto;padding:0 1em;color:#222}
.pair{display:flex;gap:1.5em}.conv{flex:1;border:1px solid #bbb;border-radius:6px;padding:.5em 1em}
.turn{margin:.4em 0}.who{font-weight:bold}.user .who{color:#555}.likert{margin:.3em 0}
fieldset{border:1px solid #ddd;margin:.8em 0}button{font-size:1.1em;padding:.4em 1.5em}.err{color:#a00}"""


class Study:
    """The items, the judgements so far (read back from the file: resumable) and who gets what."""

    def __init__(self, items: list[dict], out: Path, ratings: int, per_annotator: int, likert: bool, seed: int):
        self.items = {it["item"]: it for it in items}
        self.out, self.ratings, self.per_annotator, self.likert, self.seed = out, ratings, per_annotator, likert, seed
        systems = items[0]["systems"] if items else []
        self.records = [r for r in (human.load_records(out) if out.exists() else []) if r["systems"] == systems]
        self.lock = threading.Lock()

    def left_system(self, annotator: str, item: dict) -> str:
        """Which system is shown on the left (as "Conversation 1"): random, but fixed per annotator and item."""
        a, b = item["systems"]
        return a if random.Random(data.derive_seed(self.seed, annotator, item["item"])).random() < 0.5 else b

    def next_item(self, annotator: str) -> tuple[dict | None, int]:
        """(the item this annotator should judge next or None, how many they have done)."""
        done = {r["item"] for r in self.records if r["annotator"] == annotator}
        if len(done) >= self.per_annotator:
            return None, len(done)
        counts = Counter(r["item"] for r in self.records)
        order = sorted(self.items)
        random.Random(data.derive_seed(self.seed, annotator)).shuffle(order)
        open_items = [i for i in order if i not in done and counts[i] < self.ratings]
        if not open_items:
            return None, len(done)
        return self.items[min(open_items, key=lambda i: counts[i])], len(done)

    def answer(self, form: dict[str, str]) -> str:
        """Check one submitted form and append its judgement; returns the annotator, or raises ValueError."""
        annotator, item = form.get("annotator", "").strip(), self.items.get(form.get("item", ""))
        if not annotator or item is None:
            raise ValueError("the form lost its annotator or item; go back to the start page")
        left = self.left_system(annotator, item)
        shown = [left, next(s for s in item["systems"] if s != left)]            # Conversation 1, 2
        if form.get("choice") not in ("1", "2"):
            raise ValueError("choose the conversation that provides better support")
        record = {"annotator": annotator, "item": item["item"], "context_id": item["context_id"],
                  "systems": item["systems"], "left": left, "choice": shown[int(form["choice"]) - 1]}
        if self.likert:
            record["likert"] = {}
            for pos, system in enumerate(shown, start=1):
                ratings = {k: form.get(f"c{pos}_{k}", "") for k in human.LIKERT}
                if any(v not in ("1", "2", "3", "4", "5") for v in ratings.values()):
                    raise ValueError(f"rate conversation {pos} on every statement (1-5)")
                record["likert"][system] = {k: int(v) for k, v in ratings.items()}
        record["time"] = datetime.datetime.now().isoformat(timespec="seconds")
        with self.lock:
            if any(r["annotator"] == annotator and r["item"] == item["item"] for r in self.records):
                return annotator                                   # a double submit: keep the first
            data.append_jsonl(self.out, record)
            self.records.append(record)
        return annotator


# ----------------------------------------------------------------------------------------------
# Pages
# ----------------------------------------------------------------------------------------------

def page(title: str, body: str) -> bytes:
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>").encode("utf-8")


def start_page() -> bytes:
    return page("Companion conversations: annotation", """<h1>Rating group conversations</h1>
<p>You will read a person's situation and two conversations in which a group of AI companions talks
with that person. Choose the conversation that supports the person better, then rate each conversation
on three statements. The order of the two conversations is random.</p>
<form method="get" action="/item"><label>Your annotator name:
<input name="annotator" required pattern="[A-Za-z0-9_.-]{1,40}"></label> <button type="submit">Start</button></form>""")


def item_page(study: Study, annotator: str, item: dict, done: int, error: str = "") -> bytes:
    left = study.left_system(annotator, item)
    shown = [left, next(s for s in item["systems"] if s != left)]
    convs = []
    for pos, system in enumerate(shown, start=1):
        turns = "".join(f"<div class='turn{' user' if t['speaker'] == 'User' else ''}'><span class='who'>"
                        f"{html.escape(t['speaker'])}:</span> {html.escape(t['text'])}</div>"
                        for t in item["turns"][system])
        convs.append(f"<div class='conv'><h2>Conversation {pos}</h2>{turns}</div>")
    likert = ""
    if study.likert:
        for pos in (1, 2):
            rows = "".join(f"<div class='likert'>{html.escape(text)}<br>strongly disagree "
                           + " ".join(f"<label><input type='radio' name='c{pos}_{key}' value='{v}' required>{v}</label>"
                                      for v in range(1, 6)) + " strongly agree</div>"
                           for key, text in human.LIKERT.items())
            likert += f"<fieldset><legend>Conversation {pos}</legend>{rows}</fieldset>"
    err = f"<p class='err'>{html.escape(error)}</p>" if error else ""
    total = min(study.per_annotator, len(study.items))
    return page("Which conversation supports better?", f"""<p>{html.escape(annotator)}: item {done + 1} of at most
{total}</p>{err}<h1>The situation</h1><p>{html.escape(item['situation'])}</p><div class='pair'>{''.join(convs)}</div>
<form method="post" action="/answer"><input type="hidden" name="annotator" value="{html.escape(annotator)}">
<input type="hidden" name="item" value="{html.escape(item['item'])}">
<fieldset><legend>{html.escape(human.QUESTION)}</legend>
<label><input type="radio" name="choice" value="1" required> Conversation 1</label>
<label><input type="radio" name="choice" value="2" required> Conversation 2</label></fieldset>
{likert}<button type="submit">Save and continue</button></form>""")


def done_page(annotator: str, done: int) -> bytes:
    return page("Thank you", f"<h1>Thank you, {html.escape(annotator)}</h1><p>You rated {done} item(s); "
                             "there is nothing left for you. You can close this page.</p>")


def make_handler(study: Study):
    class Handler(BaseHTTPRequestHandler):
        def send(self, status: int, body: bytes = b"", location: str = "") -> None:
            self.send_response(status)
            if location:
                self.send_header("Location", location)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/":
                return self.send(200, start_page())
            if url.path == "/item":
                annotator = parse_qs(url.query).get("annotator", [""])[0].strip()
                if not annotator:
                    return self.send(303, location="/")
                item, done = study.next_item(annotator)
                return self.send(200, item_page(study, annotator, item, done) if item else done_page(annotator, done))
            self.send(404, page("Not found", "<p>Not found. <a href='/'>Start page</a></p>"))

        def do_POST(self):
            if urlparse(self.path).path != "/answer":
                return self.send(404, page("Not found", "<p>Not found.</p>"))
            length = int(self.headers.get("Content-Length") or 0)
            form = {k: v[0] for k, v in parse_qs(self.rfile.read(length).decode("utf-8")).items()}
            try:
                annotator = study.answer(form)
            except ValueError as err:
                item = study.items.get(form.get("item", ""))
                done = sum(r["annotator"] == form.get("annotator") for r in study.records)
                body = (item_page(study, form["annotator"], item, done, str(err)) if item and form.get("annotator")
                        else page("Error", f"<p class='err'>{html.escape(str(err))}</p><a href='/'>Start page</a>"))
                return self.send(400, body)
            self.send(303, location="/item?" + urlencode({"annotator": annotator}))

        def log_message(self, *args):      # quiet: the JSONL file is the log
            pass
    return Handler


def serve(study: Study, port: int = 8765) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1 only (never reachable from another machine); port 0 = any free port."""
    return ThreadingHTTPServer(("127.0.0.1", port), make_handler(study))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--transcripts", required=True, help="RUN/eval/transcripts.jsonl written by evaluate")
    p.add_argument("--a", required=True, help="the system under test (e.g. mascot)")
    p.add_argument("--b", required=True, help="the system it is compared with (e.g. few-shot-cot)")
    p.add_argument("--out", required=True, help="JSON-lines file of judgements (appended; resumable)")
    p.add_argument("--ratings", type=int, default=2, help="judgements per item")
    p.add_argument("--per-annotator", type=int, default=10, help="most items one annotator rates")
    p.add_argument("--likert", action=argparse.BooleanOptionalAction, default=True,
                   help="also ask the three Likert items per conversation")
    p.add_argument("--seed", type=int, default=0, help="seed of the sides and of each annotator's order")
    p.add_argument("--port", type=int, default=8765)
    args = p.parse_args(argv)
    try:
        items = human.load_items(args.transcripts, args.a, args.b)
        if not items:
            raise data.UserError(f"{args.transcripts}: no conversation index that both {args.a} and {args.b} have")
        study = Study(items, Path(args.out), args.ratings, args.per_annotator, args.likert, args.seed)
    except data.UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    server = serve(study, args.port)
    print(f"{len(items)} items, {len(study.records)} judgements so far in {args.out}; "
          f"open http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
