"""plumbing/served.py: models served elsewhere, through one OpenAI-compatible client (skip on first reading).

It holds the HTTP client (ChatClient), a served frozen role (ServedModel) and a served judge (OpenAIJudge).
Any server speaking the OpenAI chat API (vLLM, llama.cpp, Ollama, a hosted API) can be the judge (judge(): an
OpenAIJudge, for `--judge openai:<base url>`) or a frozen role (served_role(): a ServedModel, `--speakers openai:...`,
--user, --director). Every request goes through a ChatClient and each answer is cached as it arrives, so a crashed
run loses at most the requests in flight. The client promises (tests/test_judge.py, tests/test_served.py check each):
  - one deadline per request for connect, headers and body together (--served-timeout): a trickle fails on time;
  - 429, 5xx, connection errors, deadlines: retried (--served-retries), jittered backoff or Retry-After, <= max_backoff;
  - any other 4xx fails at once as one line (a UserError) quoting the server's message, with a hint and the key
    masked: $MASCOT_JUDGE_API_KEY (roles: $MASCOT_API_KEY), read per request, never stored;
  - `content: null` (a reasoning model that spent its tokens thinking) is its own error;
  - a preflight request (max_tokens=1) before any work, so a bad URL, key or model name fails first;
  - a reply is bounded twice: a body over MAX_REPLY_BYTES is refused while it is read (never parsed, never
    cached), and the text is cut to max_tokens x CHARS_PER_TOKEN characters before anyone (the cache
    included) sees it: a server that ignores max_tokens cannot flood the cache or a local model's prompt.
Simplified: no streaming, no HTTP proxies (the deadline needs http.client's own socket), no HTTP-date Retry-After.
    python mascot.py judge-eval --judge openai:http://localhost:8000/v1 --judge-model qwen3 --pairs ...
    python mascot.py evaluate --speakers openai:http://localhost:8000/v1 --speakers-model qwen3 ...
"""

import contextlib
import http.client
import json
import os
import random
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from judge import Judge, combine_orders, judge_messages
from plumbing.answers import parse_ab, parse_rubric_score
from plumbing.common import UserError
from plumbing.files import AnswerCache, cached_answers

MESSAGE_CHARS = 200  # how much of a server's error body an error message quotes
# A chat completion's body: a few KB for the replies asked here (at most a few hundred tokens, each
# JSON-escaped); 1 MiB is far above that and far below what would hurt the cache or memory.
MAX_REPLY_BYTES = 1 << 20
# A reply of max_tokens tokens is at most this many characters per token: tokenizers' pieces are
# words or parts of words (a few characters); 32 leaves room for long runs of spaces or dashes.
CHARS_PER_TOKEN = 32


def printable(text: str) -> str:
    """Only the printable characters: what a server sends ends up in an error line on the user's
    terminal, where an escape sequence would act (set the title, clear the screen) instead of show."""
    return "".join(ch for ch in text if ch.isprintable())


def server_message(raw: bytes, secret: str) -> str:
    """An error body on one line, `secret` masked, cut to MESSAGE_CHARS; OpenAI-style {"error": {"message"}} if any."""
    text = raw.decode("utf-8", errors="replace")
    with contextlib.suppress(json.JSONDecodeError, AttributeError):
        error = json.loads(text).get("error")
        if isinstance(error, dict):
            text = error.get("message", text)
        elif error:
            text = error
    text = printable(" ".join(str(text).split()))
    if secret:
        text = text.replace(secret, "***")
    if len(text) > MESSAGE_CHARS:
        return text[:MESSAGE_CHARS] + "..."
    return text


class DeadlineExceeded(TimeoutError):
    """The whole request took longer than the client's timeout."""


class ReplyTooLarge(Exception):
    """A 200 reply's body is over the client's max_reply_bytes (not an OSError: never retried, since a
    server that ignores max_tokens would only send it again)."""


class ChatClient:
    """Chat completions from one model on one server, as the module docstring promises; thread-safe. `flag` is how
    errors name the endpoint ("--judge openai:..."); `api_key_env` the NAME of the variable holding the key."""

    def __init__(
        self,
        base_url: str,
        model: str,
        flag: str,
        api_key_env: str = "MASCOT_JUDGE_API_KEY",
        timeout: float = 60,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.flag = flag
        self.api_key_env = api_key_env
        self.parts = urllib.parse.urlsplit(self.base_url)
        self.url = self.base_url + "/chat/completions"
        if self.parts.scheme not in ("http", "https") or not self.parts.hostname:
            raise self._fail(
                f"{self.base_url!r} is not an http:// or https:// URL; write the whole base URL, "
                "e.g. openai:http://localhost:8000/v1"
            )
        self.timeout = timeout  # seconds for one whole request: connect, headers and body
        self.max_retries = max_retries
        self.backoff = backoff  # the first wait before a retry, doubled each time
        self.max_backoff = max_backoff
        self.requests = 0  # HTTP attempts sent, retries included
        self.max_reply_bytes = MAX_REPLY_BYTES  # tests lower it
        self.sleep = time.sleep  # tests record the waits instead
        self.clock = time.monotonic
        self._jitter = random.Random()
        self._lock = threading.Lock()  # guards `requests` across the request threads

    def __repr__(self) -> str:
        return f"ChatClient(url={self.url!r}, model={self.model!r})"

    def _fail(self, reason: str) -> UserError:
        return UserError(f"{self.flag}: {reason}")

    def _status_hint(self, status: int) -> str:
        """What to check after an HTTP error the server will not fix by itself."""
        key = f"check the API key in ${self.api_key_env}"
        return {
            400: "the server rejected the request (e.g. the prompt is longer than the model's context)",
            401: key,
            403: key,
            404: f"check the base URL (it usually ends in /v1) and the model name {self.model!r}",
        }.get(status, f"check the URL, the model name {self.model!r} and ${self.api_key_env}")

    def _post(self, body: bytes, headers: dict) -> tuple[int, http.client.HTTPMessage, bytes]:
        """POST once: (status, headers, body); DeadlineExceeded past `timeout` seconds in all."""
        deadline = self.clock() + self.timeout

        def remaining() -> float:
            if (left := deadline - self.clock()) <= 0:
                raise DeadlineExceeded(f"no complete answer within {self.timeout:g} s")
            return left

        if self.parts.scheme == "https":
            kind = http.client.HTTPSConnection
        else:
            kind = http.client.HTTPConnection
        conn = kind(self.parts.hostname, self.parts.port, timeout=remaining())
        try:
            conn.request(
                "POST", urllib.parse.urlsplit(self.url).path or "/", body=body, headers=headers
            )
            sock = conn.sock  # the response keeps reading from it: no read may outlast the deadline
            sock.settimeout(remaining())
            with conn.getresponse() as response:
                return response.status, response.headers, self._read_body(response, sock, remaining)
        except TimeoutError as err:  # socket.timeout is TimeoutError since 3.10
            raise DeadlineExceeded(f"no complete answer within {self.timeout:g} s") from err
        finally:
            conn.close()

    def _read_body(self, response, sock, remaining) -> bytes:
        """The body, chunk by chunk (a trickle cannot outlast the deadline), at most max_reply_bytes:
        a 200 over it is ReplyTooLarge (nothing of it is kept); an error body is cut there (only its
        first MESSAGE_CHARS are ever quoted)."""
        limit = self.max_reply_bytes
        length = response.getheader("Content-Length") or ""  # announced: refused before reading
        if response.status == 200 and length.isdigit() and int(length) > limit:
            raise ReplyTooLarge(int(length))
        chunks, size = [], 0
        while True:
            sock.settimeout(remaining())
            if not (chunk := response.read1(65536)):
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                if response.status == 200:
                    raise ReplyTooLarge(size)
                return (b"".join(chunks) + chunk)[:limit]
            chunks.append(chunk)

    def chat(
        self,
        messages: list[dict],
        max_tokens: int,
        temperature: float = 0.0,
        top_p: float | None = None,
        seed: int | None = None,
    ) -> str:
        """One chat completion, with retries: the text, at most max_tokens x CHARS_PER_TOKEN
        characters; `seed` asks for reproducible sampling (vLLM, llama.cpp)."""
        request = {
            "model": self.model,
            "messages": messages,
            "temperature": temperature,
            "max_tokens": max_tokens,
        }
        if top_p is not None:
            request["top_p"] = top_p
        if seed is not None:
            request["seed"] = seed
        key = os.environ.get(self.api_key_env, "")  # read per request, never stored
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        try:
            text = self._with_retries(json.dumps(request).encode("utf-8"), headers, key)
        except ReplyTooLarge as err:
            raise self._fail(
                f"{self.url} sent a reply of {err.args[0]} bytes or more, over the "
                f"{self.max_reply_bytes} a chat completion may have (max_tokens {max_tokens} was "
                "asked); does the server honour max_tokens?"
            ) from None
        # A server that ignores max_tokens: no more than it could have said reaches the caller.
        return text[: max_tokens * CHARS_PER_TOKEN]

    def _with_retries(self, body: bytes, headers: dict, key: str) -> str:
        """POST until an answer, a request the server refuses, or max_retries retries spent."""
        last_error = ""
        for attempt in range(self.max_retries + 1):
            with self._lock:
                self.requests += 1
            wait = None  # the server's Retry-After, if it sends one
            try:
                status, reply_headers, raw = self._post(body, headers)
            except (OSError, http.client.HTTPException) as err:  # refused, reset, deadline, ...
                # e.g. BadStatusLine quotes the server's status line
                last_error = printable(f"{type(err).__name__}: {err}".splitlines()[0])
            else:
                if status == 200:
                    return self._reply_text(raw)
                message = server_message(raw, key)
                # Any other 4xx: the request itself is wrong, and retrying cannot help.
                if status != 429 and status < 500:
                    raise self._fail(
                        f"HTTP {status} from {self.url}: {message!r}; " + self._status_hint(status)
                    )
                last_error = f"HTTP {status}: {message!r}"
                # No Retry-After, or an HTTP date (not supported): our own backoff below.
                with contextlib.suppress(TypeError, ValueError):
                    wait = max(0.0, float(reply_headers.get("Retry-After")))
            if attempt < self.max_retries:
                if wait is None:  # exponential backoff with jitter, so clients do not retry in step
                    wait = self.backoff * 2**attempt * self._jitter.uniform(0.5, 1.5)
                self.sleep(min(wait, self.max_backoff))
        if last_error.startswith("DeadlineExceeded"):
            hint = "raise --served-timeout if the server is just slow"
        else:
            hint = "check that the server is running and reachable"
        raise self._fail(
            f"no answer from {self.url} after {self.max_retries + 1} attempts (last: {last_error}); {hint}"
        )

    def _reply_text(self, raw: bytes) -> str:
        try:
            message = json.loads(raw.decode("utf-8"))["choices"][0]["message"]
            content = message["content"]
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise self._fail(
                f"{self.url} did not return a chat completion (no choices[0].message.content); "
                "is the base URL right?"
            ) from None
        if content is None:
            thinking = ""
            if message.get("reasoning_content"):
                thinking = (
                    " (it sent reasoning_content: a reasoning model that spent max_tokens thinking; turn its "
                    "reasoning off or serve a non-reasoning model)"
                )
            raise self._fail(f"{self.url} answered with content null{thinking}")
        if not isinstance(content, str):  # e.g. a list of parts: not what the callers read
            raise self._fail(
                f"{self.url} answered with a {type(content).__name__} as content, not a "
                "string; serve a plain chat model"
            )
        return content

    def preflight(self) -> None:
        """One tiny request before any work; content null passes (one token is too few for a reasoning model)."""
        try:
            self.chat([{"role": "user", "content": "Say OK."}], max_tokens=1)
        except UserError as err:
            if "content null" not in str(err):
                raise UserError(f"{err} (preflight request, before any work)") from None


def run_concurrently(todo: list, compute_one, store, concurrency: int) -> None:
    """compute_one(item) for every item on `concurrency` threads (waiting on servers); store(item, result) runs here on
    arrival, so it is cached at once. The first failure cancels the rest, stores what is in flight, then raises."""
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="openai")
    try:
        futures = {pool.submit(compute_one, item): item for item in todo}
        error = None
        for future in as_completed(futures):
            if future.cancelled():
                continue
            try:
                store(futures[future], future.result())
            except Exception as err:  # the first failure wins; the rest are its echoes
                if error is None:
                    error = err
                    for f in futures:
                        f.cancel()
        if error is not None:
            raise error
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class ServedModel:
    """A frozen chat model on a server in place of a local one (same settings and row seeds; the server applies its chat
    template): one request per conversation, `concurrency` at a time, each cached; no tokens, so never GRPO's policy."""

    API_KEY_ENV = "MASCOT_API_KEY"  # the NAME of the variable that holds the roles' key

    def __init__(
        self,
        base_url: str,
        model: str | None,
        flag: str,
        model_flag: str,
        timeout: float = 60,
        retries: int = 5,
        concurrency: int = 8,
        cache_path: str | Path | None = None,
    ):
        if not model:
            raise UserError(
                f"{flag}: no model name; pass {model_flag} NAME (the name the server serves)"
            )
        self.client = ChatClient(base_url, model, flag, self.API_KEY_ENV, timeout, retries)
        self.name = f"openai:{self.client.base_url}:{model}"
        self.concurrency = concurrency
        self.cache = AnswerCache(cache_path) if cache_path else None

    def __repr__(self) -> str:
        return f"ServedModel({self.name!r})"

    def generate_texts(
        self,
        conversations: list[list[dict]],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seeds: list[int] | int | None = None,
    ) -> list[str]:
        """One reply per conversation, in order (models.generate_texts's arguments and meaning)."""
        if isinstance(seeds, int):
            seeds = [seeds + i for i in range(len(conversations))]
        settings = []  # chat()'s arguments per conversation, and what its cache key is made of
        for i, messages in enumerate(conversations):
            request = {"messages": messages, "max_tokens": max_new_tokens}
            if seeds is None:  # no seeds: greedy, as models.generate_texts
                request["temperature"] = 0.0
            else:
                request.update(temperature=temperature, top_p=top_p, seed=seeds[i])
            settings.append(request)
        keys = [AnswerCache.make_key(self.name, "chat", x) for x in settings]

        def ask(i: int) -> str:
            return self.client.chat(**settings[i])

        def compute_misses(todo: list[int], store) -> None:
            run_concurrently(todo, ask, store, self.concurrency)

        texts = cached_answers(self.cache, keys, compute_misses)
        # chat() trims what it gets; a cache written before it did may still hold a longer reply.
        limit = max_new_tokens * CHARS_PER_TOKEN
        return [t[:limit] if isinstance(t, str) else t for t in texts]


class OpenAIJudge(Judge):
    """An OpenAI-protocol LLM judge at temperature 0, pairwise questions in both orders: a request per missing verdict,
    `concurrency` at a time, cached on arrival; an unreadable answer counts in `unreadable`: no verdict, not cached."""

    can_generate = True
    read_score = staticmethod(parse_rubric_score)
    LABEL_MAX_TOKENS = 16  # room for "Reply A" or "**B**", not for an essay
    API_KEY_ENV = "MASCOT_JUDGE_API_KEY"  # the NAME of the variable that holds the judge's key

    def __init__(
        self,
        base_url: str,
        model: str | None,
        timeout: float = 60,
        max_retries: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        concurrency: int = 8,
        cache_path: str | Path | None = None,
    ):
        flag = f"--judge openai:{base_url}"
        if not model:
            raise UserError(
                f"{flag}: no model name; pass --judge-model NAME or set MASCOT_JUDGE_MODEL"
            )
        self.client = ChatClient(
            base_url, model, flag, self.API_KEY_ENV, timeout, max_retries, backoff, max_backoff
        )
        super().__init__(cache_path)
        self.model = model
        self.concurrency = concurrency
        self.name = f"openai:{self.client.base_url}:{model}"
        self._lock = threading.Lock()  # guards `unreadable` across the request threads

    @property
    def backend_calls(self) -> int:
        """HTTP requests sent (Judge counts backend calls; here the client does)."""
        return self.client.requests

    @backend_calls.setter
    def backend_calls(self, value: int) -> None:
        self.client.requests = value

    def _compute_misses(self, todo, compute, store):
        def one(i):
            return compute([i])[0]

        run_concurrently(todo, one, store, self.concurrency)

    def _compare_uncached(self, states, firsts, seconds):
        verdicts = []
        for s, a, b in zip(states, firsts, seconds):
            answers = [
                self.client.chat(
                    judge_messages("judge_pairwise", s, a=x, b=y), self.LABEL_MAX_TOKENS
                )
                for x, y in ((a, b), (b, a))
            ]
            picks = [parse_ab(t) for t in answers]  # 0 ("A"), 1 ("B") or None (unreadable)
            with self._lock:
                self.unreadable += picks.count(None)
            # p_first of each order: in order (a, b) "A" (0) means a is better; in (b, a) "B" (1) does.
            p_first = [None if p is None else float(p == k) for k, p in enumerate(picks)]
            verdict = combine_orders(*p_first)
            verdict.detail["answers"] = answers
            verdicts.append(verdict)
        return verdicts

    def _score_uncached(self, states, replies):  # None (unreadable) is counted by Judge.score_many
        scores = []
        for s, r in zip(states, replies):
            answer = self.client.chat(
                judge_messages("judge_pointwise", s, reply=r), self.LABEL_MAX_TOKENS
            )
            value = parse_rubric_score(answer)  # 1..5, or None
            scores.append(None if value is None else (value - 1) / 4)  # 1..5 -> [0, 1]
        return scores

    def _complete_uncached(self, prompt, max_new_tokens):
        return self.client.chat([{"role": "user", "content": prompt}], max_new_tokens)


# --- The hooks mascot.py calls -------------------------------------------------------------------
def served_role(spec: str, role: str, args, cache: Path | None = None) -> ServedModel:
    """`--<role> openai:<base url>` (role: speakers | user | director), the model named by --<role>-model."""
    model = ServedModel(
        spec.partition(":")[2].strip(),
        getattr(args, f"{role}_model", None),
        f"--{role} {spec}",
        f"--{role}-model",
        args.served_timeout,
        args.served_retries,
        args.served_concurrency,
        cache,
    )
    model.client.preflight()
    return model


def judge(url: str, args, cache: Path | None = None) -> OpenAIJudge:
    """`--judge openai:<base url>`: the model from --judge-model or $MASCOT_JUDGE_MODEL, the --served-* flags."""
    j = OpenAIJudge(
        url,
        args.judge_model or os.environ.get("MASCOT_JUDGE_MODEL"),
        timeout=args.served_timeout,
        max_retries=args.served_retries,
        concurrency=args.served_concurrency,
        cache_path=cache,
    )
    j.client.preflight()
    return j
