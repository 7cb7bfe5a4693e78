"""openai_client.py: one OpenAI-compatible /chat/completions client (standard library only).

Where it sits: this is how MASCOT scales out to models served elsewhere. Any server that speaks
the OpenAI chat API works: vLLM, a llama.cpp server, Ollama, a hosted API.
  - judge.py's OpenAIJudge (`--judge openai:<base-url>`) sends every request through a
    ChatClient: the client knows HTTP, retries and deadlines, the judge knows prompts, answers
    and the cache;
  - ServedModel (`--speakers openai:<base-url>`, `--user ...`, `--director ...`) stands in for a
    local model in a frozen role: the same prompts and sampling settings, one request per reply,
    `concurrency` at a time, each reply cached as it arrives.

What the client promises, each checked against a real llama.cpp server and tested against a
local fake server (tests/test_judge.py):
  - one total deadline per request (`timeout` seconds for connect, headers and body together):
    the body is read in chunks and the deadline checked between them, so a reply trickling in
    one byte a second fails on time instead of never;
  - HTTP 429, 5xx, connection errors and deadlines are retried with exponential backoff plus
    jitter, or as long as the server's Retry-After asks, never longer than `max_backoff`;
  - any other 4xx fails at once with the server's own message (its first 200 characters) and a
    hint per status, as one line (data.UserError), with the API key masked out;
  - `content: null` (a reasoning model that spent its tokens thinking) is its own error, not an
    empty answer;
  - the key is read from the environment at each request and never stored, logged or cached.

What it simplifies: no streaming, no HTTP proxies (it talks to the server directly with
http.client, which is what makes the socket reachable for the deadline), HTTP-date Retry-After
values are ignored (our own backoff is used instead).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from data import AnswerCache, UserError, cached_answers

MESSAGE_CHARS = 200        # how much of a server's error body an error message quotes


def check_base_url(base_url: str, flag: str) -> urllib.parse.SplitResult:
    """The parsed base URL; a UserError at once when it is not http(s)://host[:port][/path]."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{flag}: {base_url!r} is not an http:// or https:// URL; write the whole base "
                        "URL, e.g. openai:http://localhost:8000/v1")
    return parts


def retry_after_seconds(value: str | None) -> float | None:
    """The Retry-After header in seconds, or None when absent or an HTTP date (not supported)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def status_hint(status: int, model: str, key_env: str) -> str:
    """What to check after an HTTP error the server will not fix by itself."""
    if status == 400:
        return "the server rejected the request (e.g. the prompt is longer than the model's context)"
    if status in (401, 403):
        return f"check the API key in ${key_env}"
    if status == 404:
        return f"check the base URL (it usually ends in /v1) and the model name {model!r}"
    if status == 429 or status >= 500:
        return "the server is overloaded or failing; it was retried"
    return f"check the URL, the model name {model!r} and ${key_env}"


def server_message(raw: bytes, secret: str) -> str:
    """The first MESSAGE_CHARS characters of an error body, on one line, with `secret` masked.

    OpenAI-style servers answer {"error": {"message": ...}}; anything else is quoted as text."""
    text = raw.decode("utf-8", errors="replace")
    try:
        error = json.loads(text).get("error")
        text = error.get("message", text) if isinstance(error, dict) else (error or text)
    except (json.JSONDecodeError, AttributeError):
        pass
    text = " ".join(str(text).split())
    if secret:
        text = text.replace(secret, "***")
    return text[:MESSAGE_CHARS] + ("..." if len(text) > MESSAGE_CHARS else "")


class DeadlineExceeded(TimeoutError):
    """The whole request took longer than the client's timeout."""


class ChatClient:
    """Chat completions from one model on one server.

    Thread-safe: OpenAIJudge calls `chat` from up to --judge-concurrency threads at once; the
    only shared state is the request counter, kept under a lock.

    Args:
        base_url: e.g. http://localhost:8000/v1 (".../chat/completions" is appended).
        model: the served model's name.
        flag: how errors name the endpoint, e.g. "--judge openai:http://localhost:8000/v1".
        api_key_env: the NAME of the environment variable holding the key (none: no header).
        timeout: total seconds per request (connect, headers and body together).
        max_retries: retries after the first attempt for 429, 5xx, connection errors, deadlines.
        backoff, max_backoff: wait backoff * 2^attempt * U(0.5, 1.5) seconds, at most max_backoff
            (which also caps the server's Retry-After).
    """

    def __init__(self, base_url: str, model: str, flag: str, api_key_env: str = "MASCOT_JUDGE_API_KEY",
                 timeout: float = 60, max_retries: int = 5, backoff: float = 1.0, max_backoff: float = 60.0):
        self.base_url = base_url.rstrip("/")
        self.parts = check_base_url(self.base_url, flag)
        self.url = self.base_url + "/chat/completions"
        self.model, self.flag, self.api_key_env = model, flag, api_key_env
        self.timeout, self.max_retries = timeout, max_retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self.requests = 0                       # HTTP attempts sent, retries included
        self.sleep = time.sleep                 # tests replace it to record the waits
        self.clock = time.monotonic
        self._jitter = random.Random()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ChatClient(url={self.url!r}, model={self.model!r})"

    def _fail(self, reason: str) -> UserError:
        return UserError(f"{self.flag}: {reason}")

    # --- one HTTP attempt -------------------------------------------------------------------
    def _post(self, body: bytes, headers: dict) -> tuple[int, http.client.HTTPMessage, bytes]:
        """POST once; (status, headers, body). Raises DeadlineExceeded past `timeout` seconds."""
        deadline = self.clock() + self.timeout

        def remaining() -> float:
            left = deadline - self.clock()
            if left <= 0:
                raise DeadlineExceeded(f"no complete answer within {self.timeout:g} s")
            return left

        kind = http.client.HTTPSConnection if self.parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(self.parts.hostname, self.parts.port, timeout=remaining())
        try:
            path = urllib.parse.urlsplit(self.url).path or "/"
            conn.request("POST", path, body=body, headers=headers)
            sock = conn.sock                        # the response keeps reading from it after
            sock.settimeout(remaining())            # getresponse(); no read may outlast the deadline
            with conn.getresponse() as response:
                chunks = []
                while True:                         # chunk by chunk: a trickle cannot outlast it
                    sock.settimeout(remaining())
                    chunk = response.read1(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                return response.status, response.headers, b"".join(chunks)
        except TimeoutError as err:                 # socket.timeout is TimeoutError since 3.10
            raise DeadlineExceeded(f"no complete answer within {self.timeout:g} s") from err
        finally:
            conn.close()

    # --- a request with retries -------------------------------------------------------------
    def chat(self, messages: list[dict], max_tokens: int, temperature: float = 0.0, top_p: float | None = None,
             seed: int | None = None) -> str:
        """One chat completion, with retries; returns the reply text. Temperature 0 (the judge's)
        unless given; `seed` asks the server for reproducible sampling (vLLM and llama.cpp honour it)."""
        request = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if top_p is not None:
            request["top_p"] = top_p
        if seed is not None:
            request["seed"] = seed
        body = json.dumps(request).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(self.api_key_env, "")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        last_error = ""
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            wait = None
            try:
                status, reply_headers, raw = self._post(body, headers)
            except (OSError, http.client.HTTPException) as err:     # refused, reset, deadline, ...
                last_error = f"{type(err).__name__}: {err}".splitlines()[0]
            else:
                if status == 200:
                    return self._reply_text(raw)
                message = server_message(raw, key)
                hint = status_hint(status, self.model, self.api_key_env)
                if status != 429 and status < 500:      # the request itself is wrong: retrying cannot help
                    raise self._fail(f"HTTP {status} from {self.url}: {message!r}; {hint}")
                last_error = f"HTTP {status}: {message!r}"
                wait = retry_after_seconds(reply_headers.get("Retry-After"))
            if attempt < self.max_retries:
                if wait is None:    # no Retry-After from the server: our own backoff
                    wait = self.backoff * 2 ** attempt * self._jitter.uniform(0.5, 1.5)
                self.sleep(min(wait, self.max_backoff))
        hint = ("raise --judge-timeout if the server is just slow" if last_error.startswith("DeadlineExceeded")
                else "check that the server is running and reachable")
        raise self._fail(f"no answer from {self.url} after {self.max_retries + 1} attempts "
                         f"(last: {last_error}); {hint}")

    def _reply_text(self, raw: bytes) -> str:
        try:
            message = json.loads(raw.decode("utf-8"))["choices"][0]["message"]
            content = message["content"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise self._fail(f"{self.url} did not return a chat completion "
                             "(no choices[0].message.content); is the base URL right?") from None
        if content is None:
            thinking = " (it sent reasoning_content: a reasoning model that spent max_tokens thinking; " \
                       "turn its reasoning off or serve a non-reasoning model)" if message.get("reasoning_content") else ""
            raise self._fail(f"{self.url} answered with content null{thinking}")
        return content

    def preflight(self) -> None:
        """One tiny request (max_tokens=1), so a bad URL, key or model name fails before any
        expensive work. Only the HTTP status and the reply's shape are checked: one token is
        too few for a reasoning model to answer, so content null is accepted here."""
        try:
            self.chat([{"role": "user", "content": "Say OK."}], max_tokens=1)
        except UserError as err:
            if "content null" not in str(err):
                raise UserError(f"{err} (preflight request, before any work)") from None


def run_concurrently(todo: list, compute_one, store, concurrency: int) -> None:
    """compute_one(item) for every item of `todo`, up to `concurrency` at once (threads: the work
    is waiting for a server), calling store(item, result) in this thread as each result arrives,
    so a caller can write it to its cache at once. On the first failure the items not yet started
    are cancelled, the ones in flight are awaited and stored, then the error is raised."""
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai")
    try:
        futures = {pool.submit(compute_one, item): item for item in todo}
        error = None
        for future in as_completed(futures):
            if future.cancelled():
                continue
            try:
                store(futures[future], future.result())
            except Exception as err:         # the first failure wins; the rest are its echoes
                if error is None:
                    error = err
                    for f in futures:
                        f.cancel()
        if error is not None:
            raise error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# ----------------------------------------------------------------------------------------------
# A served model in a frozen role: speakers, simulated user, director (--speakers openai:URL ...)
# ----------------------------------------------------------------------------------------------

class ServedModel:
    """A frozen chat model behind an OpenAI-compatible server, standing in for a local one.

    What a local model does with sampler.generate, this does with one request per conversation:
    the same chat messages, max_new_tokens, temperature, top_p and the row's seed are sent as they
    are (the server applies its own chat template). Greedy decoding (seeds None) is temperature 0.
    Requests run `concurrency` at a time, and every reply is cached as it arrives (AnswerCache,
    keyed by model, messages and every sampling setting), so an interrupted run asks only for
    what it has not got and a repeated one asks nothing.

    There are no token tensors, so a served model can fill every frozen role (the speakers and
    simulated user of stage 2, simulate and evaluate; a director under evaluation) but cannot be
    the policy GRPO trains.
    """

    def __init__(self, base_url: str, model: str | None, flag: str, model_flag: str, timeout: float = 60,
                 retries: int = 5, concurrency: int = 8, cache_path: str | Path | None = None,
                 api_key_env: str = "MASCOT_API_KEY"):
        if not model:
            raise UserError(f"{flag}: no model name; pass {model_flag} NAME (the name the server serves)")
        if concurrency < 1:
            raise UserError(f"{flag}: concurrency {concurrency} must be at least 1")
        self.client = ChatClient(base_url, model, flag, api_key_env, timeout, retries)
        self.name = f"openai:{self.client.base_url}:{model}"
        self.concurrency = concurrency
        self.cache = AnswerCache(cache_path) if cache_path else None

    def __repr__(self) -> str:
        return f"ServedModel({self.name!r})"

    def preflight(self) -> None:
        self.client.preflight()

    def generate_texts(self, conversations: list[list[dict]], max_new_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seeds: list[int] | int | None = None) -> list[str]:
        """One reply per conversation, in order (sampler.generate's arguments and meaning)."""
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(len(conversations))]
        settings = [{"messages": m, "max_tokens": max_new_tokens} | (
            {"temperature": 0.0} if seeds is None else {"temperature": temperature, "top_p": top_p, "seed": seeds[i]})
            for i, m in enumerate(conversations)]
        keys = [AnswerCache.make_key(self.name, "chat", x) for x in settings]

        def ask(i):
            s = settings[i]
            return self.client.chat(s["messages"], max_new_tokens, s["temperature"], s.get("top_p"), s.get("seed"))

        return cached_answers(self.cache, keys, lambda todo, store: run_concurrently(todo, ask, store, self.concurrency))
