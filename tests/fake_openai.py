"""A fake OpenAI-compatible server for the tests: scripted answers, faults on demand.

Used by test_judge.py (the judge client: retries, deadlines, errors) and test_served.py (served
speakers, simulated user and director).
"""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    """An OpenAI-style /chat/completions endpoint answering from a script.

    script: a list of steps, one per request, each (status, headers, body) or a callable
    taking the request JSON and returning that tuple; the last step repeats. A 4th element
    trickles the body, one byte per that many seconds; status None drops the connection unanswered
    (a killed server). `max_active`: the most requests it was answering at once.
    """

    def __init__(self, script, port=0):
        self.script, self.requests = list(script), []
        self.active = self.max_active = 0  # requests being answered at once, and the most seen
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "json": body}
                    )
                    step = server.script[min(len(server.requests), len(server.script)) - 1]
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    reply = step(body) if callable(step) else step
                finally:
                    # Counted as answered before the reply goes out: the client may send its next
                    # request the moment it has read this one, before this thread runs on.
                    with lock:
                        server.active -= 1
                self.answer(*reply)

            def answer(self, status, headers, payload, seconds_per_byte=0.0):
                if status is None:  # killed: the connection drops, no answer
                    self.close_connection = True
                    return
                raw = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    if not seconds_per_byte:
                        self.wfile.write(raw)
                    for i in range(len(raw) if seconds_per_byte else 0):  # a trickling reply
                        self.wfile.write(raw[i : i + 1])
                        self.wfile.flush()
                        threading.Event().wait(seconds_per_byte)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


def completion(text):
    return 200, {}, {"choices": [{"message": {"role": "assistant", "content": text}}]}
