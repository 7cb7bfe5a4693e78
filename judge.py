"""judge.py: the AI feedback of MASCOT stage 1. Which of two replies is better, and how good is one?

Where it sits in MASCOT (arXiv 2601.14230, Phase I, RLAIF): for every (context, persona) the base
speaker samples several candidate replies; a judge scores them for persona adherence and fit to
the conversation; replies whose scores differ clearly become preference pairs for the reward model
(reward.py), which GRPO then optimises (grpo.py). Stage 2 reuses `score_many` as the coherence term
of the director's reward (director.py), and evaluation uses it where no LLM judge is given.

One interface, four backends (pick one with `--judge`):

    offline            OfflineJudge  the default: sentence-encoder and word features, no LLM,
                                     seconds per hundred pairs on a 2-core CPU, built to resist
                                     reward hacks (docs/JUDGE.md: how it was built, how well it does)
    hf:<id-or-folder>  HFJudge       a local chat LLM: reads the probabilities of the labels A / B
    openai:<base-url>  OpenAIJudge   any OpenAI-compatible /chat/completions server (urllib only);
                                     model from --judge-model or MASCOT_JUDGE_MODEL, key from the
                                     environment variable MASCOT_JUDGE_API_KEY
    rm:<folder>        RMJudge       a reward model trained by reward.py

    class Judge:  score(state, reply) -> float in [0, 1]      pointwise quality
                  compare(state, a, b) -> Verdict             pairwise: which reply is better
                  score_many / compare_many                   the same, batched
                  complete(prompt) -> str                     greedy text (LLM backends only)

Every backend goes through an AnswerCache (an append-only JSON-lines file) when a cache path is
given, so a repeated run never pays twice for the same judgement. The openai: judge writes each
judgement the moment it arrives, so a crashed run loses at most the requests in flight.

What we decide where the paper is silent:
  - The paper's judges are GPT-4o, Gemma-3-27B-IT and Phi-4 with unpublished prompts. Ours are
    text files in data/prompts/ (judge_system, judge_pairwise, judge_pointwise).
  - LLM judges prefer whichever reply they read first (position bias; Zheng et al. 2023, "Judging
    LLM-as-a-Judge with MT-Bench and Chatbot Arena"). Every pairwise question is asked
    in both orders, and a verdict counts only when both orders agree.
  - The offline judge is not an LLM at all. A 135M chat model asked "A or B?" answers "A" whatever
    the replies say, so the default judge is a handful of measured features over MiniLM
    sentence embeddings and the reply's words, with one penalty per reward hack a policy found
    (copying the context, reciting the persona, leaking the prompt, ...; see hacks.py). It is a
    stand-in that lets the whole pipeline run on a laptop, not a replacement for a strong judge.

Measure a judge on labelled pairs (judge_eval.py; data/judge_pairs_*.jsonl, schema in data/README.md):

    python mascot.py judge-eval --pairs data/judge_pairs_support.jsonl data/judge_pairs_meeting.jsonl
    python mascot.py judge-eval --judge openai:http://localhost:8000/v1 --judge-model qwen3 \\
        --pairs data/judge_pairs_support.jsonl
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import data
import hacks
import models
import reward
import sampler
from data import AnswerCache, UserError, cached_answers
from judge_features import (OFFLINE_RECIPE, OFFLINE_WEIGHTS, RELEVANCE_CAP, REPEAT_FLOOR, COPY_RUN, COPY_FLOOR,
                            RECITAL_FLOOR, MIN_WORDS, LIST_FLOOR, FUNCTION_FLOOR, OFFLINE_CENTER, OFFLINE_SCALE,
                            PROMPT_TALK, persona_does, split_sentences, lexical_features, semantic_features, weighted_sum,
                            sigmoid, logit)
from metrics import parse_ab, parse_rubric_score
from openai_client import ChatClient, run_concurrently
from simulate import JudgeState


# ----------------------------------------------------------------------------------------------
# What a pairwise judgement returns
# ----------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """The outcome of one pairwise comparison."""
    preferred: int | None      # 0 = first reply, 1 = second, None = no verdict / order flip
    p_first: float             # probability that the first reply is better, averaged over both orders
    detail: dict = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# The interface every backend shares
# ----------------------------------------------------------------------------------------------

class Judge:
    """Base class: caching and batching live here; backends implement the `_..._uncached` methods.

    A backend returns None for a judgement it could not make (an unreadable LLM answer). None is
    never cached, so a later run asks again; `score` turns it into a neutral 0.5 and `compare`
    into a Verdict with preferred=None.

    `backend_calls` counts the requests that actually reached the backend (HTTP requests, model
    prompts, featurised replies): the tests use it to check that a cached judgement is never
    asked twice.
    """
    name = "judge"
    can_generate = False

    def __init__(self, cache_path: str | Path | None = None):
        self.cache = AnswerCache(cache_path) if cache_path else None
        self.backend_calls = 0

    # --- the cache --------------------------------------------------------------------------
    def _cached_batch(self, method: str, inputs: list[dict], compute, keep=lambda v: v is not None) -> list:
        """Look every input up in the cache, compute only the misses (in one batch), store them.

        compute(todo) returns JSON-able values for the inputs at the indices `todo`; only values
        with keep(value) true are stored (an unreadable answer is not a judgement worth keeping).
        An input repeated within one batch is computed once, with or without a cache file.
        """
        keys = [AnswerCache.make_key(self.name, method, x) for x in inputs]
        return cached_answers(self.cache, keys, lambda todo, store: self._compute_misses(todo, compute, store), keep)

    def _compute_misses(self, todo: list[int], compute, store) -> None:
        """Compute the inputs at `todo` and store(i, value) each. Here: one batch, the fastest
        way for a local model; OpenAIJudge sends one request per input, concurrently."""
        for i, value in zip(todo, compute(todo)):
            store(i, value)

    # --- the public interface ---------------------------------------------------------------
    def score(self, state: JudgeState, reply: str) -> float:
        """How good `reply` is for this persona and conversation, in [0, 1]."""
        return self.score_many([state], [reply])[0]

    def score_many(self, states: list[JudgeState], replies: list[str]) -> list[float]:
        """score() for many (state, reply) rows at once; unjudgeable rows get a neutral 0.5."""
        if len(states) != len(replies):
            raise ValueError(f"score_many: {len(states)} states but {len(replies)} replies")
        inputs = [{"state": asdict(s), "reply": r} for s, r in zip(states, replies)]
        values = self._cached_batch(
            "score", inputs,
            lambda todo: self._score_uncached([states[i] for i in todo], [replies[i] for i in todo]))
        return [0.5 if v is None else float(v) for v in values]

    def compare(self, state: JudgeState, a: str, b: str) -> Verdict:
        """Is `a` (first) or `b` (second) the better reply? Asked in both orders by LLM backends."""
        return self.compare_many([state], [a], [b])[0]

    def compare_many(self, states: list[JudgeState], firsts: list[str],
                     seconds: list[str]) -> list[Verdict]:
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")
        inputs = [{"state": asdict(s), "a": a, "b": b} for s, a, b in zip(states, firsts, seconds)]

        def compute(todo):
            verdicts = self._compare_uncached([states[i] for i in todo], [firsts[i] for i in todo],
                                              [seconds[i] for i in todo])
            return [asdict(v) for v in verdicts]

        # An unreadable answer is not a judgement: not cached, so the next run asks again.
        values = self._cached_batch("compare", inputs, compute,
                                    keep=lambda v: not v["detail"].get("unparseable"))
        return [Verdict(**v) for v in values]

    def complete(self, prompt: str, max_new_tokens: int = 64) -> str:
        """Greedy (temperature 0) text from an LLM judge; the offline judge cannot generate."""
        return self.complete_many([prompt], max_new_tokens)[0]

    def complete_many(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        """complete() for many prompts, in order (an openai: judge sends them concurrently)."""
        if not self.can_generate:
            raise UserError(f"judge {self.name!r} cannot generate text; use --judge hf:<model> "
                            "or --judge openai:<base-url> for this step")
        inputs = [{"prompt": p, "max_new_tokens": max_new_tokens} for p in prompts]
        return self._cached_batch("complete", inputs,
                                  lambda todo: [self._complete_uncached(prompts[i], max_new_tokens) for i in todo])

    # --- what a backend implements ----------------------------------------------------------
    def _score_uncached(self, states: list[JudgeState], replies: list[str]) -> list[float | None]:
        raise NotImplementedError

    def _compare_uncached(self, states: list[JudgeState], firsts: list[str],
                          seconds: list[str]) -> list[Verdict]:
        raise NotImplementedError

    def _complete_uncached(self, prompt: str, max_new_tokens: int) -> str:
        raise NotImplementedError


def combine_orders(p_ab: float | None, p_ba: float | None) -> Verdict:
    """One Verdict from the two orders of a pairwise question.

    p_ab: P(first reply better) when shown as (A = first, B = second);
    p_ba: P(first reply better) when shown swapped (A = second, B = first), i.e. P("B").
    The verdict counts only when both orders agree; otherwise the judge was following the
    position, not the content, and we return no verdict. None means the answer was unreadable.
    """
    if p_ab is None or p_ba is None:
        known = [p for p in (p_ab, p_ba) if p is not None]
        return Verdict(None, sum(known) / len(known) if known else 0.5,
                       {"p_ab": p_ab, "p_ba": p_ba, "unparseable": True})
    preferred = 0 if p_ab > 0.5 and p_ba > 0.5 else 1 if p_ab < 0.5 and p_ba < 0.5 else None
    return Verdict(preferred, (p_ab + p_ba) / 2, {"p_ab": p_ab, "p_ba": p_ba})


# ----------------------------------------------------------------------------------------------
# The judging prompts of the LLM backends (data/prompts/judge_*.txt: our own text, since the paper
# does not publish its prompts). Kept short and explicit because the local judges are small; the
# answer labels are single tokens ("A"/"B", "1".."5") so that HFJudge can read their probabilities.
# ----------------------------------------------------------------------------------------------

MAX_HISTORY_TURNS = 8      # older turns are dropped: small judges have short context windows
MAX_TURN_CHARS = 600       # one runaway turn must not crowd out the rest of the prompt


def render_conversation(state: JudgeState) -> str:
    """'Speaker: text' lines for the recent history, then the user's latest message."""
    lines = [f"Situation: {state.situation}"] if state.situation else []
    for turn in state.history[-MAX_HISTORY_TURNS:]:
        lines.append(f"{turn['speaker']}: {turn['text'][:MAX_TURN_CHARS]}")
    lines.append(f"user: {state.context[:MAX_TURN_CHARS]}")
    return "\n".join(lines)


def pairwise_messages(state: JudgeState, a: str, b: str) -> list[dict]:
    text = data.prompt("judge_pairwise").format(name=state.persona_name, desc=state.persona_desc,
                                                conversation=render_conversation(state), a=a, b=b)
    return [{"role": "system", "content": data.prompt("judge_system")}, {"role": "user", "content": text}]


def pointwise_messages(state: JudgeState, reply: str) -> list[dict]:
    text = data.prompt("judge_pointwise").format(name=state.persona_name, desc=state.persona_desc,
                                                 conversation=render_conversation(state), reply=reply)
    return [{"role": "system", "content": data.prompt("judge_system")}, {"role": "user", "content": text}]


SCORE_LABELS = ("1", "2", "3", "4", "5")


def rubric_to_unit(score: float) -> float:
    """Map a 1-5 rubric score to [0, 1]: 1 -> 0.0, 3 -> 0.5, 5 -> 1.0."""
    return (score - 1.0) / 4.0


# ----------------------------------------------------------------------------------------------
# HFJudge: a local chat LLM, read through its next-token probabilities
# ----------------------------------------------------------------------------------------------

def label_token_ids(tokenizer, label: str) -> list[int]:
    """Token ids that spell `label` as ONE token: "A" and " A" are different tokens in BPE
    vocabularies, and which one a model emits after the assistant header depends on its chat
    template, so the probability of the label is the sum over both."""
    ids = []
    for variant in (label, " " + label):
        pieces = tokenizer.encode(variant, add_special_tokens=False)
        if len(pieces) == 1 and pieces[0] not in ids:
            ids.append(pieces[0])
    if not ids:
        raise UserError(f"judge: the tokenizer has no single token for the label {label!r}, so "
                        "its probability cannot be read; use an openai:<base-url> judge instead")
    return ids


def label_distribution(probs, label_ids: list[list[int]]):
    """Probabilities of a few labels, renormalised among themselves.

    probs: (N, V) next-token distribution; label_ids: per label, the token ids that spell it.
    Returns (N, L): each row sums to 1, so P("A") + P("B") = 1 however much mass the model put
    on other tokens ("Reply", "The", ...).
    """
    mass = torch.stack([probs[:, ids].sum(-1) for ids in label_ids], dim=-1)   # (N, L)
    return mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)                   # (N, L)


class HFJudge(Judge):
    """A local causal LM as judge, at temperature 0: we read P(label) instead of sampling text.

    compare(): the pairwise prompt in both orders; p_first = mean over the orders of P(first
    reply better); the verdict counts only when both orders agree (combine_orders).
    score(): the 1-5 rubric prompt; the expected score sum_k k * P("k") mapped to [0, 1], which
    is smoother than the single most likely digit.
    """
    can_generate = True

    def __init__(self, model_or_path: str, cache_path: str | Path | None = None,
                 batch_size: int = 8, device: str = "cpu"):
        super().__init__(cache_path)
        self.name = f"hf:{model_or_path}"
        try:
            self.model, self.tokenizer = models.load_model(model_or_path, device=device, frozen=True)
        except UserError as err:    # its message names --model; here the flag is --judge
            raise UserError(f"--judge hf:{model_or_path}: {err}") from None
        self.batch_size = batch_size
        self.ab_ids = [label_token_ids(self.tokenizer, "A"), label_token_ids(self.tokenizer, "B")]
        self.digit_ids = [label_token_ids(self.tokenizer, d) for d in SCORE_LABELS]

    def __repr__(self) -> str:
        return f"HFJudge({self.name!r})"

    def label_probs(self, conversations: list[list[dict]], label_ids: list[list[int]]):
        """(N, L) probabilities of the labels as the next token after each chat prompt."""
        rows = []
        for start in range(0, len(conversations), self.batch_size):
            prompt_rows = sampler.chat_prompt_ids(self.tokenizer, conversations[start:start + self.batch_size])
            ids, mask = sampler.left_pad(prompt_rows, self.tokenizer.pad_token_id)       # (B, P)
            device = next(self.model.parameters()).device
            ids, mask = ids.to(device), mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)                              # (B, P)
            with torch.no_grad():
                logits = self.model(input_ids=ids, attention_mask=mask,
                                    position_ids=positions).logits[:, -1, :]            # (B, V)
            probs = torch.softmax(logits.float(), dim=-1)                               # (B, V)
            rows.append(label_distribution(probs, label_ids).cpu())                     # (B, L)
            self.backend_calls += len(prompt_rows)
        return torch.cat(rows)                                                          # (N, L)

    def _compare_uncached(self, states, firsts, seconds):
        conversations = []
        for s, a, b in zip(states, firsts, seconds):
            conversations += [pairwise_messages(s, a, b), pairwise_messages(s, b, a)]
        p = self.label_probs(conversations, self.ab_ids)                    # (2N, 2): P(A), P(B)
        # Row 2i shows (first, second): P(first better) = P("A").
        # Row 2i+1 shows (second, first): P(first better) = P("B").
        return [combine_orders(float(p[2 * i, 0]), float(p[2 * i + 1, 1])) for i in range(len(states))]

    def _score_uncached(self, states, replies):
        p = self.label_probs([pointwise_messages(s, r) for s, r in zip(states, replies)],
                             self.digit_ids)                                # (N, 5)
        expected = (p * torch.arange(1, 6, dtype=p.dtype)).sum(-1)         # (N,) in [1, 5]
        return [rubric_to_unit(float(e)) for e in expected]

    def _complete_uncached(self, prompt, max_new_tokens):
        self.backend_calls += 1
        chat = [{"role": "user", "content": prompt}]
        return sampler.generate(self.model, self.tokenizer, [chat], max_new_tokens=max_new_tokens,
                               seeds=None).texts[0]


# ----------------------------------------------------------------------------------------------
# OpenAIJudge: any OpenAI-compatible /chat/completions endpoint, with urllib only
# ----------------------------------------------------------------------------------------------

class OpenAIJudge(Judge):
    """A remote (or local server) chat model behind the OpenAI /chat/completions protocol.

    Temperature 0. HTTP, retries, deadlines and error messages live in openai_client.ChatClient
    (the API key is read from the environment variable named by `api_key_env` at each request and
    never stored, so it cannot leak into reprs, logs, cache files or error messages).

    Requests run concurrently, up to `concurrency` at a time (a thread pool, so a batching server
    such as vLLM can work on them together), and every judgement is written to the
    cache the moment it arrives, so a failure loses at most the requests in flight and a rerun
    asks only what is missing. An answer we cannot read is not an error: it is counted in
    `unparseable` and gives no verdict (and is not cached).
    """
    can_generate = True
    LABEL_MAX_TOKENS = 16    # room for "Reply A" or "**B**", not for an essay

    def __init__(self, base_url: str, model: str | None, api_key_env: str = "MASCOT_JUDGE_API_KEY",
                 timeout: float = 60, max_retries: int = 5, backoff: float = 1.0,
                 max_backoff: float = 60.0, concurrency: int = 8, cache_path: str | Path | None = None):
        flag = f"--judge openai:{base_url}"
        if not model:
            raise UserError(f"{flag}: no model name; pass --judge-model NAME or set MASCOT_JUDGE_MODEL")
        if concurrency < 1:
            raise UserError(f"--judge-concurrency {concurrency}: must be at least 1")
        self.client = ChatClient(base_url, model, flag, api_key_env, timeout, max_retries, backoff, max_backoff)
        super().__init__(cache_path)
        self.base_url, self.model, self.concurrency = self.client.base_url, model, concurrency
        self.name = f"openai:{self.base_url}:{model}"
        self.unparseable = 0
        self._lock = threading.Lock()          # guards `unparseable` across the request threads

    # backend_calls is the client's count of HTTP requests (retries included).
    backend_calls = property(lambda self: self.client.requests,
                             lambda self, value: setattr(self.client, "requests", value))

    def __repr__(self) -> str:
        return f"OpenAIJudge(base_url={self.base_url!r}, model={self.model!r})"

    def chat(self, messages: list[dict], max_tokens: int) -> str:
        """One chat completion at temperature 0, with retries; returns the reply text."""
        return self.client.chat(messages, max_tokens)

    def preflight(self) -> None:
        """One tiny request, so a bad URL, key or model fails before any expensive work."""
        self.client.preflight()

    def _count_unparseable(self, n: int) -> None:
        with self._lock:
            self.unparseable += n

    def _compute_misses(self, todo, compute, store):
        """Each missing input as its own request, up to `concurrency` at once, each stored as it
        arrives (openai_client.run_concurrently)."""
        run_concurrently(todo, lambda i: compute([i])[0], store, self.concurrency)

    def _compare_uncached(self, states, firsts, seconds):
        verdicts = []
        for s, a, b in zip(states, firsts, seconds):
            answers = [self.chat(pairwise_messages(s, a, b), self.LABEL_MAX_TOKENS),
                       self.chat(pairwise_messages(s, b, a), self.LABEL_MAX_TOKENS)]
            picks = [parse_ab(t) for t in answers]
            self._count_unparseable(sum(p is None for p in picks))
            # Order (a, b): "A" means the first is better; order (b, a): "B" does.
            p_ab = None if picks[0] is None else float(picks[0] == 0)
            p_ba = None if picks[1] is None else float(picks[1] == 1)
            verdict = combine_orders(p_ab, p_ba)
            verdict.detail["answers"] = answers
            verdicts.append(verdict)
        return verdicts

    def _score_uncached(self, states, replies):
        scores = []
        for s, r in zip(states, replies):
            value = parse_rubric_score(self.chat(pointwise_messages(s, r), self.LABEL_MAX_TOKENS))
            if value is None:
                self._count_unparseable(1)
            scores.append(None if value is None else rubric_to_unit(value))
        return scores

    def _complete_uncached(self, prompt, max_new_tokens):
        return self.chat([{"role": "user", "content": prompt}], max_new_tokens)


# ----------------------------------------------------------------------------------------------
# OfflineJudge: measured features of the reply's meaning (MiniLM) and of its words (the default)
# ----------------------------------------------------------------------------------------------
# The features and their constants live in judge_features.py (pure functions).


class ScoreJudge(Judge):
    """A judge that compares two replies by their scores (the offline judge, a reward model).

    P(first better) = sigmoid(logit(score_first) - logit(score_second)): a Bradley-Terry
    comparison of the two scores. It is symmetric by construction: swapping the replies swaps the
    scores, so compare(b, a) mirrors compare(a, b) and there is no position bias to cancel.
    """

    def compare_many(self, states, firsts, seconds):
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")
        scores = self.score_many(list(states) * 2, list(firsts) + list(seconds))  # cached per reply
        n = len(states)
        return [Verdict(0 if a > b else 1 if b > a else None, sigmoid(logit(a) - logit(b)),
                        {"score_first": a, "score_second": b}) for a, b in zip(scores[:n], scores[n:])]


@dataclass
class PersonaVoice:
    """What personas.json adds to a persona's one-line description, embedded once per judge."""
    role: str
    card_texts: list[str]       # description, role, style: what a reply must not recite
    card: torch.Tensor          # (2, D) the description and the style
    own: torch.Tensor           # (D,) unit centroid of its example lines
    others: torch.Tensor        # (P, D) unit centroids of the other personas' lines in its set


def find_voice(state: JudgeState, voices: dict[str, list[PersonaVoice]]) -> PersonaVoice | None:
    """The card of the speaking persona: same name, and its role named in the state's description
    ("Anchor, the emotional validator: ..."), so a custom persona that merely shares a name with a
    bundled one is judged by its own description only."""
    desc = state.persona_desc.casefold()
    hits = [v for v in voices.get(state.persona_name.casefold(), []) if v.role.casefold() in desc]
    return hits[0] if len(hits) == 1 else None


class OfflineJudge(ScoreJudge):
    """The default judge: a weighted sum of embedding and word features, no LLM.

    score(state, reply) = sigmoid(OFFLINE_SCALE * (z - OFFLINE_CENTER)) with z the weighted sum of
    semantic_features and lexical_features; compare() derives from the two scores (ScoreJudge),
    which here is sigmoid(OFFLINE_SCALE * (z_first - z_second)).

    persona_sets: the persona cards to look speakers up in (default: every set of the shipped
    personas.json); a speaker without a card is judged by its description alone.
    """

    def __init__(self, cache_path: str | Path | None = None, encoder=None,
                 weights: dict[str, float] | None = None, persona_sets: list | None = None):
        super().__init__(cache_path)
        self.weights = dict(OFFLINE_WEIGHTS if weights is None else weights)
        if persona_sets is None:
            persona_sets = [data.load_personas("personas.json", s) for s in data.available_sets("personas.json")]
        # The name carries everything that decides a score, so changing a weight, a constant, the
        # phrase bank or a persona card never reads stale scores from an old cache.
        phrases = data.asset("generic_phrases.json")["phrases"]
        constants = [OFFLINE_RECIPE, RELEVANCE_CAP, REPEAT_FLOOR, COPY_RUN, COPY_FLOOR, RECITAL_FLOOR,
                     MIN_WORDS, LIST_FLOOR, FUNCTION_FLOOR, OFFLINE_CENTER, OFFLINE_SCALE, PROMPT_TALK,
                     hacks.META_PATTERNS]     # the meta_leak feature reads hacks.leaks_meta
        cards = [asdict(p) for s in persona_sets for p in s.personas]
        recipe = json.dumps([self.weights, constants, phrases, cards], sort_keys=True)
        self.name = "offline:" + hashlib.sha256(recipe.encode("utf-8")).hexdigest()[:12]
        self.encoder = encoder if encoder is not None else models.SentenceEncoder()
        self.bank = self.encoder.embed(phrases)                                 # (K, D)
        self.voices = self._voices(persona_sets)

    def __repr__(self) -> str:
        return f"OfflineJudge(weights={self.weights})"

    def _voices(self, persona_sets) -> dict[str, list[PersonaVoice]]:
        """Embed every persona's description, style and example lines once, in one batch."""
        texts = sorted({t for s in persona_sets for p in s.personas for t in [p.description, p.style, *p.examples]})
        vectors = self.encoder.embed(texts)                                     # (N, D)
        row = {t: i for i, t in enumerate(texts)}

        def centroid(lines):
            return torch.nn.functional.normalize(vectors[[row[t] for t in lines]].mean(0), dim=0)   # (D,)

        voices: dict[str, list[PersonaVoice]] = {}
        for persona_set in persona_sets:
            centroids = {p.name: centroid(p.examples) for p in persona_set.personas}
            for p in persona_set.personas:
                others = [c for n, c in centroids.items() if n != p.name]
                voices.setdefault(p.name.casefold(), []).append(PersonaVoice(
                    role=p.role, card_texts=[p.description, p.role, p.style],
                    card=vectors[[row[p.description], row[p.style]]],                          # (2, D)
                    own=centroids[p.name],
                    others=torch.stack(others) if others else torch.zeros(0, vectors.shape[1])))
        return voices

    def features_many(self, states: list[JudgeState], replies: list[str]) -> list[dict[str, float]]:
        """semantic_features and lexical_features for every (state, reply), embedding each
        distinct text once."""
        split = [split_sentences(r) for r in replies]
        texts = set(replies)
        for s, sentences in zip(states, split):
            texts.update(sentences)
            texts.update([persona_does(s.persona_desc), s.persona_desc, s.context] + [t["text"] for t in s.history])
        # Sorted by length, so each batch of the encoder pads its texts to similar lengths
        # (twice as fast as an arbitrary order on our pairs).
        texts = sorted(texts, key=lambda t: (len(t), t))
        vectors = self.encoder.embed(texts)                                     # (N, D)
        row = {t: i for i, t in enumerate(texts)}

        def vec(many):
            return vectors[[row[t] for t in many]]                              # (len, D)

        out = []
        for s, reply, sentences in zip(states, replies, split):
            voice = find_voice(s, self.voices)
            card = vec([s.persona_desc])                                        # (1, D)
            if voice is not None:
                card = torch.cat([card, voice.card])                            # (3, D)
            features = semantic_features(vectors[row[reply]], vec(sentences), vectors[row[persona_does(s.persona_desc)]],
                                         card, vectors[row[s.context]], vec([t["text"] for t in s.history]),
                                         self.bank, voice.own if voice else None, voice.others if voice else None)
            features.update(lexical_features(reply, s, [s.persona_desc] + (voice.card_texts if voice else []),
                                             voice.role if voice else ""))
            out.append(features)
        return out

    def raw_score(self, features: dict[str, float]) -> float:
        """z: the weighted feature sum, centred (0 = a typical honest reply of our labelled pairs)."""
        return weighted_sum(features, self.weights) - OFFLINE_CENTER

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        return [sigmoid(OFFLINE_SCALE * self.raw_score(f)) for f in self.features_many(states, replies)]


# ----------------------------------------------------------------------------------------------
# Choosing a judge from the --judge flag
# ----------------------------------------------------------------------------------------------

JUDGE_FORMS = ("'offline', 'hf:<model id or folder>', 'openai:<base url>' (model name from "
               "--judge-model or MASCOT_JUDGE_MODEL) or 'rm:<reward model folder>'")


class RMJudge(ScoreJudge):
    """A trained reward model (reward.py) used as a judge: score = sigmoid(r), compare from scores.

    Useful to measure the reward model with `judge-eval --judge rm:<folder>` on labelled pairs,
    or as the coherence judge of stage 2.
    """

    def __init__(self, folder: str | Path, cache_path: str | Path | None = None, device: str = "cpu"):
        super().__init__(cache_path)
        self.rm, self.tok = reward.RewardModel.load(folder, device=device)
        self.name = f"rm:{Path(folder).resolve()}"

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        chats = [reward.rm_messages(s, r) for s, r in zip(states, replies)]
        return [sigmoid(x) for x in self.rm.score_texts(self.tok, chats)]


def make_judge(spec: str = "offline", cache_path: str | Path | None = None,
               model_name: str | None = None, timeout: float = 60, retries: int = 5,
               concurrency: int = 8, preflight: bool = False, **kw) -> Judge:
    """Build the judge a `--judge` value names.

    Args:
        spec: "offline" | "hf:<id-or-folder>" | "openai:<base-url>" | "rm:<folder>".
        cache_path: a JSON-lines file where judgements are kept across runs (None: no cache).
        model_name: the model an openai: endpoint should run (default: $MASCOT_JUDGE_MODEL).
        timeout, retries, concurrency: --judge-timeout, --judge-retries, --judge-concurrency
            (openai: only): total seconds per request, retries per request, requests at once.
        preflight: for an openai: judge, send one tiny request now, so a bad URL, key or model
            name fails before the command spends time or money (train, evaluate, judge-eval, ...).
        kw: passed on to the backend (e.g. device= for hf:, encoder= for offline).
    """
    spec = (spec or "offline").strip()
    kind, _, arg = spec.partition(":")
    arg = arg.strip()
    if spec == "offline":
        return OfflineJudge(cache_path=cache_path, **kw)
    if kind == "hf" and arg:
        return HFJudge(arg, cache_path=cache_path, **kw)
    if kind == "openai" and arg:
        model = model_name or os.environ.get("MASCOT_JUDGE_MODEL")
        judge = OpenAIJudge(arg, model, timeout=timeout, max_retries=retries, concurrency=concurrency,
                            cache_path=cache_path, **kw)
        if preflight:
            judge.preflight()
        return judge
    if kind == "rm" and arg:
        return RMJudge(arg, cache_path=cache_path, **kw)
    raise UserError(f"--judge {spec!r}: not a judge; use {JUDGE_FORMS}")


def judge_from_flags(args, cache_path: str | Path | None, preflight: bool = True, **kw) -> Judge:
    """make_judge from the parsed --judge, --judge-model, --judge-timeout, --judge-retries and
    --judge-concurrency flags (mascot.add_judge_flags). `preflight`: an openai: judge sends one
    tiny request now, before the command spends time or money on anything else."""
    return make_judge(args.judge, cache_path=cache_path, model_name=args.judge_model, timeout=args.judge_timeout,
                      retries=args.judge_retries, concurrency=args.judge_concurrency, preflight=preflight, **kw)
