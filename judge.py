"""judge.py: the AI feedback of MASCOT. How good is one reply, and which of two is better?

Where it sits: stage 1 (arXiv 2601.14230, Phase I, RLAIF) samples candidate replies per (context,
persona); a judge scores them for persona adherence and fit to the conversation, and clear gaps
become the reward model's preference pairs (reward.py). Stage 2 reuses `score_many` as the
coherence term of the director's group reward (director.block_reward), and the evaluation asks an
LLM judge its rubrics (evaluate.py).

    class Judge:  score(state, reply) -> float in [0, 1]      pointwise quality
                  compare(state, a, b) -> Verdict             pairwise: which reply is better
                  score_many / compare_many                   the same, batched and cached
                  complete(prompt) -> str                     greedy text (LLM judges only)

The file reads: the interface (Judge, ScoreJudge); the ESConv strategy classifier; the offline
judge's features and OfflineJudge; reading an LLM judge's answers (A/B, a 1-5 score); the judge
prompts; HFJudge, a local chat LLM read through its next-token probabilities.

Simplified: the paper's judge is a strong LLM (its evaluation asks GPT-4o, Gemma-3-27B-IT and
Phi-4 at temperature 0). The default here, OfflineJudge, runs on a laptop with no LLM (a 135M
chat model makes no usable judge): for the support personas a classifier of the strategies human
annotators labelled in ESConv (StrategyClassifier), else features over MiniLM embeddings and
words, each with one penalty per reward hack a policy found. A stand-in, not a replacement for a
strong judge; how it was built and measured: docs/JUDGE.md. LLM judges plug in beside it: HFJudge
here (hf:), reward.RMJudge (rm:), plumbing/served.py (openai:); mascot.make_judge picks one. Every
judgement goes through an AnswerCache when a cache path is given, so no run pays twice for the
same one.

    python mascot.py judge-eval --pairs data/judge_pairs_support.jsonl    # measure a judge
"""

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

import models
import scenarios
from metrics import (
    META_PATTERNS,
    SALAD_MIN_WORDS,
    SALAD_PAIRS,
    SALAD_QUESTION_WORDS,
    SALAD_QUESTIONS,
    STOPWORDS,
    leaks_meta,
    word_salad,
    words,
)
from plumbing import files, loading
from plumbing.answers import parse_rubric_score
from plumbing.common import UserError
from plumbing.files import AnswerCache, cached_answers
from simulate import JUDGE_TURNS, JudgeState


# --- 1. The interface: a verdict, a judge, and a judge that compares by its scores --------------
@dataclass
class Verdict:
    """A pairwise judgement. An LLM judge is asked both orders (A/B and B/A) to cancel its position
    bias, so p_first is their mean and `preferred` is set only when the two orders agree."""

    # 0 = first reply, 1 = second, None = no verdict (orders disagreed, unreadable)
    preferred: int | None
    p_first: float  # P(first reply better), averaged over both orders
    detail: dict = field(default_factory=dict)


def is_answer(value) -> bool:
    """Cache only real answers: None (an unreadable one) is asked again by a later run."""
    return value is not None


def is_readable_verdict(value: dict) -> bool:
    """Cache a verdict unless an answer behind it could not be read."""
    return not value["detail"].get("unparseable")


class Judge:
    """Caching and batching live here; a backend implements the `_..._uncached` methods and returns
    None for a judgement it could not make (an unreadable answer). None is never cached, so a later
    run asks again; `score` turns it into a neutral 0.5 and counts it in `unreadable`, `compare`
    into a Verdict with preferred=None. `backend_calls` counts what reached the backend."""

    name = "judge"
    can_generate = False  # only LLM judges write text (complete, rate_many)

    def __init__(self, cache_path: str | Path | None = None):
        self.cache = AnswerCache(cache_path) if cache_path else None
        self.backend_calls = 0
        self.unreadable = 0

    def _cached(self, method: str, inputs: list[dict], compute, keep=is_answer) -> list:
        """Cache lookups, then compute(todo) for the missing indices only, each distinct input once.
        The key names the judge (its recipe), the method and the input, so judges never share."""
        keys = [AnswerCache.make_key(self.name, method, x) for x in inputs]

        def compute_misses(todo, store):
            self._compute_misses(todo, compute, store)

        return cached_answers(self.cache, keys, compute_misses, keep)

    def _compute_misses(self, todo: list[int], compute, store) -> None:
        # One batch here; a served judge overrides this to send its requests concurrently.
        for i, value in zip(todo, compute(todo)):
            store(i, value)

    def score(self, state: JudgeState, reply: str) -> float:
        return self.score_many([state], [reply])[0]

    def score_many(self, states: list[JudgeState], replies: list[str]) -> list[float]:
        if len(states) != len(replies):
            raise ValueError(f"score_many: {len(states)} states but {len(replies)} replies")

        def compute(todo):
            return self._score_uncached([states[i] for i in todo], [replies[i] for i in todo])

        inputs = [{"state": asdict(s), "reply": r} for s, r in zip(states, replies)]
        values = self._cached("score", inputs, compute)
        self.unreadable += sum(v is None for v in values)
        # An unreadable score is neutral: it neither rewards nor punishes the reply.
        return [0.5 if v is None else float(v) for v in values]

    def compare(self, state: JudgeState, a: str, b: str) -> Verdict:
        return self.compare_many([state], [a], [b])[0]

    def compare_many(self, states, firsts, seconds) -> list[Verdict]:
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")

        def compute(todo):
            verdicts = self._compare_uncached(
                [states[i] for i in todo], [firsts[i] for i in todo], [seconds[i] for i in todo]
            )
            return [asdict(v) for v in verdicts]  # the cache stores plain JSON

        inputs = [{"state": asdict(s), "a": a, "b": b} for s, a, b in zip(states, firsts, seconds)]
        values = self._cached("compare", inputs, compute, keep=is_readable_verdict)
        return [Verdict(**v) for v in values]

    def rate_many(self, prompts: list[str], max_new_tokens: int = 32) -> list[int | None]:
        """A 1-5 score per rubric prompt from an LLM judge's greedy answers; None for an answer it
        cannot read. Each LLM backend reads its own answers (`read_score`: parse_rubric_score)."""
        return [self.read_score(a) for a in self.complete_many(prompts, max_new_tokens)]

    def read_score(self, answer: str) -> int | None:
        raise UserError(f"judge {self.name!r} cannot read rubric answers; use an LLM judge")

    def complete_many(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        """Greedy text for each prompt, in order (LLM judges only)."""
        if not self.can_generate:
            raise UserError(
                f"judge {self.name!r} cannot generate text; "
                "use --judge hf:<model> or openai:<base-url>"
            )

        def compute(todo):
            return [self._complete_uncached(prompts[i], max_new_tokens) for i in todo]

        inputs = [{"prompt": p, "max_new_tokens": max_new_tokens} for p in prompts]
        return self._cached("complete", inputs, compute)


class ScoreJudge(Judge):
    """A judge that compares by its scores: P(first better) = sigmoid(logit(a) - logit(b)), a
    Bradley-Terry comparison; symmetric by construction, so there is no position bias to cancel."""

    def compare_many(self, states, firsts, seconds):
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")
        # One batched call scores every first and every second reply.
        scores = self.score_many(list(states) * 2, list(firsts) + list(seconds))
        n = len(states)
        return [
            Verdict(
                higher(a, b), sigmoid(logit(a) - logit(b)), {"score_first": a, "score_second": b}
            )
            for a, b in zip(scores[:n], scores[n:])
        ]


def higher(a: float, b: float) -> int | None:
    """0 if the first score is higher, 1 if the second, None on a tie (no verdict)."""
    if a > b:
        return 0
    if b > a:
        return 1
    return None


def sigmoid(x: float) -> float:
    # Two forms, so exp never overflows: exp(-x) for x >= 0, exp(x) below.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    return math.exp(x) / (1.0 + math.exp(x))


def logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)  # a score of exactly 0 or 1 would be infinite
    return math.log(p / (1 - p))


# --- 2. The persona-function classifier: what ESConv's annotators would call a reply ------------
class StrategyClassifier:
    """p(strategy | reply, the message it answers) over ESConv's eight support strategies
    (scenarios.SUPPORT_STRATEGIES), learnt from the labels human annotators gave 12,759 supporter
    turns (Liu et al. 2021; `python mascot.py strategies` fits it with extras/strategies.py,
    measures it on held-out dialogues and writes data/strategy_classifier.safetensors):
        x = [e(reply), e(message), e(reply) * e(message)]   (3D,)  e: MiniLM, unit vectors
        p = softmax(W x + b)                                  (8,)   multinomial logistic regression
    The message is there because a strategy answers something: "that must be hard" after "I failed"
    reflects a feeling, after "thanks" it does not. A persona's FUNCTION is the mass p puts on the
    strategies its card lists (personas.json "esconv_strategies"): does the reply do its job?"""

    FILE = files.HERE / "data" / "strategy_classifier.safetensors"

    def __init__(self, encoder, path: str | Path = FILE):
        if not Path(path).is_file():
            raise UserError(
                f"{path}: no strategy classifier; "
                "fit one with `python mascot.py strategies --esconv FILE`"
            )
        weights = load_file(str(path))
        self.encoder = encoder
        self.weight = weights["weight"]  # (8, 3D)
        self.bias = weights["bias"]  # (8,)
        # The weights' fingerprint is part of OfflineJudge's name: a refit never reads old scores.
        self.digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]

    def probs(self, replies: list[str], messages: list[str]) -> torch.Tensor:
        x = strategy_features(self.encoder, replies, messages).to(self.weight.dtype)  # (N, 3D)
        return torch.softmax(x @ self.weight.T + self.bias, dim=-1)  # (N, 8)


def strategy_features(encoder, replies: list[str], messages: list[str]) -> torch.Tensor:
    r = encoder.embed(replies)  # (N, D)
    m = encoder.embed(messages)  # (N, D)
    return torch.cat([r, m, r * m], dim=-1)  # (N, 3D): each, and how they interact


# --- 3. The offline judge's features ------------------------------------------------------------
# score = sigmoid(OFFLINE_SCALE * (z - OFFLINE_CENTER)), z = a weighted sum of features, each
# "higher is better". Quality: how good an honest reply is:
#   persona       cos(reply, what the persona does), averaged with cos(reply, its example lines)
#   relevance     cos(reply, the user's latest message), capped: parroting the message gains nothing
#   repetition    -(max cos(reply, an earlier turn) - REPEAT_FLOOR)+
#   generic       -max cos(a sentence of the reply, a bank of generic phrases)
#   off_role      -(cos(reply, another persona's lines) - cos(reply, its own lines))+
# Hack penalties, 0 for an honest reply, down to -1 for a reply that is nothing but the hack:
#   context_copy / history_echo   share of the reply inside 4-word runs of the user's / the other
#                                 companions' words, beyond COPY_FLOOR
#   persona_copy  share copied from its own description, role and style
#   persona_recital  cos(reply, the description or style) beyond RECITAL_FLOOR
#   meta_leak     -1 for prompt or meta text;  too_short  -(MIN_WORDS - words)+ / MIN_WORDS
#   keyword_list  a list of 1-2 word fragments, or too few function words for a sentence
#   word_salad    a pile of words (metrics.word_salad), or a reply a language model finds
#                 too surprising to be English (Fluency, SURPRISE_FLOOR); either way of reading
# Why a penalty per hack: stage 1 optimises whatever the judge pays for, and a judge that pays for
# similarity to the message and the card teaches the policy to copy and recite them. Each
# constant's measurement on our labelled pairs, and what was tried instead: docs/JUDGE.md.

OFFLINE_RECIPE = 3  # bump when a feature's definition changes: it is part of the cache name
# Every hack penalty weighs 2: a reply that is all hack loses 2, four standard deviations of z over
# honest replies, so no quality feature can buy it back.
OFFLINE_WEIGHTS = {
    "persona": 2.0,
    "relevance": 1.0,
    "repetition": 1.0,
    "generic": 2.0,
    "off_role": 2.0,
    "context_copy": 2.0,
    "history_echo": 2.0,
    "persona_copy": 2.0,
    "persona_recital": 2.0,
    "meta_leak": 2.0,
    "too_short": 2.0,
    "keyword_list": 2.0,
    "word_salad": 2.0,
}
RELEVANCE_CAP = 0.8  # above it, a reply is closer to a copy of the message than to an answer
REPEAT_FLOOR = 0.5  # staying on the topic is not repeating a turn
COPY_RUN = 4  # a copy is a run of 4 words found in the source, not a shared word or two
COPY_FLOOR = 0.3  # the first 30% of a reply may quote; a copy beyond it pays
RECITAL_FLOOR = 0.4  # good replies stay near or below it; recitals of the card go far above
MIN_WORDS = 6  # a companion's turn says something: "Okay." is a hack, not a reply
LIST_FLOOR = 0.3  # a sentence may list a few words; keyword stuffing lists most of them
FUNCTION_FLOOR = 0.05  # English sentences need function words; a bare keyword list has few
# Word salad also by surprise: the mean nats a token of the reply alone under the embedded SmolLM2.
# English is predictable to a language model whatever its words; a pile of words is not, however
# it is punctuated. Human supporter turns sit near 4 (95% under 6), piles far above.
SURPRISE_FLOOR = 7.5
SURPRISE_SPAN = 2.5  # the penalty grows to 1 at SURPRISE_FLOOR + SURPRISE_SPAN nats
OFFLINE_CENTER = -0.02  # the mean of z over honest replies: a typical one scores 0.5
OFFLINE_SCALE = 2.0  # 1 / the std of z over honest replies
# Where the speaker's card lists ESConv strategies and a StrategyClassifier is given, its function
# probability replaces the embedding guesses at role (persona, off_role): human labels are the
# signal of role; relevance (the paper's "contextual appropriateness") and generic (the collapse
# into stock comfort) stay as they were; the hack penalties are constraints: a reply that is all
# hack loses 3, more than the whole range of the function term (2), so no job done buys a hack back.
HACK_PENALTIES = (
    "context_copy",
    "history_echo",
    "persona_copy",
    "persona_recital",
    "meta_leak",
    "too_short",
    "keyword_list",
    "word_salad",
)
FUNCTION_WEIGHTS = {
    "function": 2.0,
    "relevance": 1.0,
    "generic": 2.0,
    "repetition": 1.0,
    **dict.fromkeys(HACK_PENALTIES, 3.0),
}
FUNCTION_CENTER = 0.42  # the mean of z over our labelled support pairs' better replies
FUNCTION_SCALE = 2.5  # 1 / their std

# An embedding does not understand "never": the part of a description after it is cut off.
_NEGATION = re.compile(r"[;,.]?\s*\b(?:never|avoiding|instead of|without)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Where a fragment of a list ends: punctuation, a slash or "and"/"or" between items.
_FRAGMENT_END = re.compile(r"[,;:.!?/|&+\n]+|\s(?:and|or)\s", re.IGNORECASE)
# First person maps to second, so "you failed your test" matches the "I failed my test" it copies.
_SAME_PERSON = {
    "i": "you",
    "me": "you",
    "my": "your",
    "mine": "yours",
    "myself": "yourself",
    "i'm": "you're",
    "i've": "you've",
    "i'd": "you'd",
    "i'll": "you'll",
    "am": "are",
    "was": "were",
}
# Prompt talk beyond META_PATTERNS: ways a small chat model leaks its prompt or its assistant
# training into a companion's turn; {name} and {role} are the speaker's.
PROMPT_TALK = [
    r"\bthe user\b(?!s)",  # the prompt's word for the person
    r"<\|[^|>]*\|>",  # chat-template tokens
    r"\b(?:i am|i'm) (?:just )?(?:an? )?(?:ai|artificial intelligence|chatbot|bot|virtual assistant"
    r"|assistant|language model|program)\b",  # "I'm an AI"
    r"\bhope (?:this|that) helps\b|\blet me know if (?:you'd like|you want|this)\b",  # sign-offs
    r"\bmy (?:\w+ )?(?:role|purpose|instructions?)\b|\bmy job (?:here )?(?:is|as)\b",
    r"\b(?:i am|i'm|as) (?:the |your |an? )?{role}\b",  # self-introductions by role
    r"\b(?:i am|i'm|as) (?:the )?{name}\b|\b{name} here\b",  # and by name
    r"^\s*[(\[][^)\]]{{1,60}}[)\]]",  # a stage direction: "(smiles warmly)"
    r"[(\[*][^)\]*]{{0,40}}\b{name}\b[^)\]*]{{0,40}}[)\]*]",  # "*Anchor nods*"
]


def persona_does(desc: str) -> str:
    """The part of a description that says what the persona does: "names feelings; never gives
    advice" -> "names feelings" (an embedding does not understand "never")."""
    return _NEGATION.split(desc, maxsplit=1)[0].strip() or desc


def split_sentences(text: str) -> list[str]:
    return [p for p in _SENTENCE_END.split(text.strip()) if p] or [text]


def hinge(x: float, floor: float) -> float:
    """(x - floor)+ / (1 - floor): how far x goes beyond the floor, 1 at x = 1."""
    return max(0.0, x - floor) / (1.0 - floor)


def person_neutral_words(text: str) -> list[str]:
    return [_SAME_PERSON.get(w, w) for w in words(text)]


def copied_share(reply: list[str], sources: list[list[str]], run: int = COPY_RUN) -> float:
    """Share of the reply's words inside a run of `run` words also found in a source: a graded copy.

    >>> copied_share("so you failed your test again".split(), [["you", "failed", "your", "test"]])
    0.6666666666666666
    """
    if len(reply) < run:
        return 0.0
    seen = set()  # every run of `run` words in the sources
    for s in sources:
        for i in range(len(s) - run + 1):
            seen.add(tuple(s[i : i + run]))
    covered = [False] * len(reply)
    for i in range(len(reply) - run + 1):
        if tuple(reply[i : i + run]) in seen:
            covered[i : i + run] = [True] * run
    return sum(covered) / len(reply)


def list_likeness(text: str) -> float:
    """How much the reply reads as a keyword list, in [0, 1]: the larger of its share of words in
    1-2 word fragments beyond LIST_FLOOR and its shortfall of function words below FUNCTION_FLOOR
    (a list without commas). Replies under MIN_WORDS get 0: "Okay." is too_short's business."""
    tokens = words(text)
    if len(tokens) < MIN_WORDS:
        return 0.0
    fragments = [words(f) for f in _FRAGMENT_END.split(text)]
    listed = sum(len(f) for f in fragments if len(f) <= 2) / max(1, sum(len(f) for f in fragments))
    function = sum(t.split("'")[0] in STOPWORDS for t in tokens) / len(tokens)
    return max(hinge(listed, LIST_FLOOR), max(0.0, FUNCTION_FLOOR - function) / FUNCTION_FLOOR)


def talks_about_prompt(
    reply: str, name: str, role: str = "", speaker_names: list[str] = ()
) -> bool:
    """Does the reply talk about its prompt or its role (metrics.leaks_meta, PROMPT_TALK)?"""
    if leaks_meta(reply, [name, *speaker_names]):
        return True
    # A pattern that can never match stands in for a missing name or role.
    fill = {"name": r"\b\B", "role": r"\b\B"}
    if name:
        fill["name"] = re.escape(name.lower())
    if role:
        fill["role"] = re.escape(role.lower())
    return any(re.search(p.format(**fill), reply, re.IGNORECASE) for p in PROMPT_TALK)


def lexical_features(
    reply: str, state: JudgeState, card_texts: list[str], role: str = ""
) -> dict[str, float]:
    """The hack penalties that read the reply's words, each in [-1, 0]. card_texts: the persona's
    description, role and style (never its example lines: those are what in-role sounds like)."""
    mine = person_neutral_words(reply)
    is_user = [t["speaker"].casefold() == "user" for t in state.history]
    user = [state.context, state.situation]
    user += [t["text"] for t, u in zip(state.history, is_user) if u]
    agents = [t["text"] for t, u in zip(state.history, is_user) if not u]
    speakers = [t["speaker"] for t in state.history]
    user_copied = copied_share(mine, [person_neutral_words(t) for t in user if t])
    agent_copied = copied_share(mine, [person_neutral_words(t) for t in agents])
    card_copied = copied_share(mine, [person_neutral_words(t) for t in card_texts])
    leaks = talks_about_prompt(reply, state.persona_name, role, speakers)
    return {
        "context_copy": -hinge(user_copied, COPY_FLOOR),
        "history_echo": -hinge(agent_copied, COPY_FLOOR),
        # The card has no free share: a companion has no reason to quote its own instructions.
        "persona_copy": -card_copied,
        "meta_leak": -float(leaks),
        "too_short": -max(0, MIN_WORDS - len(words(reply))) / MIN_WORDS,
        "keyword_list": -list_likeness(reply),
        "word_salad": -word_salad(reply),  # the OfflineJudge adds the surprise of the reply
    }


def semantic_features(reply, sentences, does, card, context, history, bank, lines=None) -> dict:
    """The features over unit sentence embeddings (a dot product is a cosine): reply (D,), its
    sentences (S, D), persona_does (D,), card (C, D), the user's message (D,), earlier turns (H, D),
    the generic phrases (K, D). lines, when the persona is in the persona file: (own (D,), others
    (P, D)), the centroids of its example lines and of the other personas' in its set."""
    repeat = 0.0
    if len(history):
        repeat = float((history @ reply).max())  # (H,) -> the closest earlier turn
    persona = float(does @ reply)
    off_role = 0.0
    if lines is not None:
        own, others = lines
        mine = float(own @ reply)
        persona = (persona + mine) / 2  # half what it does, half how it sounds
        if len(others):
            off_role = -max(0.0, float((others @ reply).max()) - mine)  # (P,) -> max
    context_cos = float(context @ reply)
    return {
        "persona": persona,
        "context": context_cos,  # uncapped, for evaluate.py's response relevance
        "relevance": min(context_cos, RELEVANCE_CAP),
        "repetition": -max(0.0, repeat - REPEAT_FLOOR),
        "generic": -float((sentences @ bank.T).max()),  # (S, K) -> the most generic sentence
        "off_role": off_role,
        "persona_recital": -hinge(float((card @ reply).max()), RECITAL_FLOOR),
    }


class Fluency:
    """The mean surprise, in nats a token, of a text alone under a small frozen language model (the
    embedded SmolLM2-135M): the word-salad guard that no punctuation fools. Loaded on first use."""

    def __init__(self, device: str = "cpu"):
        self.device = device
        self.model = None
        self.tok = None
        self.memo: dict[str, float] = {}  # a text's surprise, computed once

    @torch.no_grad()
    def surprise(self, texts: list[str], batch_size: int = 16) -> list[float]:
        if self.model is None:
            self.model, self.tok = loading.load_model(loading.EMBEDDED, self.device, frozen=True)
        todo = sorted(
            {t for t in texts if t not in self.memo}, key=len
        )  # similar lengths batch well
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            rows = [self.tok(t, add_special_tokens=False)["input_ids"] or [0] for t in chunk]
            ids, mask = models.left_pad(rows, self.tok.pad_token_id)  # (b, T)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as if each row were alone
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
            logp = torch.log_softmax(logits[:, :-1].float(), -1)  # (b, T - 1, V): token t + 1
            seen = logp.gather(2, ids[:, 1:, None])[..., 0] * mask[:, 1:]  # (b, T - 1)
            counts = mask[:, 1:].sum(1).clamp(min=1)  # (b,) the tokens that have a predecessor
            for text, nll in zip(chunk, (-seen.sum(1) / counts).tolist()):
                self.memo[text] = nll
        return [self.memo[t] for t in texts]


def surprise_penalty(nats: float) -> float:
    """0 up to SURPRISE_FLOOR nats a token, then linear to 1 at SURPRISE_FLOOR + SURPRISE_SPAN."""
    return min(1.0, max(0.0, nats - SURPRISE_FLOOR) / SURPRISE_SPAN)


# --- 4. The offline judge ------------------------------------------------------------------------
def every_persona(persona_sets) -> list:
    """The personas of all the sets, set after set."""
    personas = []
    for s in persona_sets:
        personas += s.personas
    return personas


@dataclass
class PersonaVoice:
    """What the persona file adds to a persona's one-line description, embedded once per judge."""

    role: str
    card_texts: list[str]  # description, role, style
    card: torch.Tensor  # (2, D) the description and the style
    own: torch.Tensor  # (D,) unit centroid of its example lines
    others: torch.Tensor  # (P, D) the other personas' centroids in its set
    strategies: list[str]  # its ESConv strategies (none: judged by the features alone)


class OfflineJudge(ScoreJudge):
    """The default judge: a weighted sum of embedding and word features, no LLM.
    persona_sets: the cards to look speakers up in (the run's --personas file); a speaker without a
    card (a labelled pair's custom persona) is judged by its one-line description alone.
    classifier: a StrategyClassifier (True: the shipped one); speakers whose cards list ESConv
    strategies are then scored by FUNCTION_WEIGHTS (the support set, mascot.make_judge's default),
    others by `weights`."""

    def __init__(
        self,
        persona_sets: list,
        cache_path=None,
        encoder=None,
        weights: dict | None = None,
        classifier: StrategyClassifier | bool | None = None,
    ):
        super().__init__(cache_path)
        self.encoder = encoder or loading.SentenceEncoder()
        self.classifier = self._pick_classifier(persona_sets, classifier)
        self.weights = dict(OFFLINE_WEIGHTS if weights is None else weights)
        phrases = files.asset("generic_phrases.json")["phrases"]
        self.name = self._recipe_name(persona_sets, phrases)
        self.bank = self.encoder.embed(phrases)  # (K, D)
        self.voices = self._persona_voices(persona_sets)
        self.fluency = Fluency(getattr(self.encoder, "device", "cpu"))

    def _pick_classifier(self, persona_sets, classifier):
        """True means the shipped classifier, loaded only when some card lists ESConv strategies
        (the meeting set has none to read); anything else is used as given."""
        if classifier is not True:
            return classifier
        labelled = any(p.esconv_strategies for p in every_persona(persona_sets))
        if labelled:
            return StrategyClassifier(self.encoder)
        return None

    def _recipe_name(self, persona_sets, phrases) -> str:
        """The name carries everything that decides a score, so a changed weight, constant, phrase
        or persona card never reads stale scores from an old cache (the name is the cache key)."""
        constants = [
            OFFLINE_RECIPE,
            RELEVANCE_CAP,
            REPEAT_FLOOR,
            COPY_RUN,
            COPY_FLOOR,
            RECITAL_FLOOR,
            MIN_WORDS,
            LIST_FLOOR,
            FUNCTION_FLOOR,
            SALAD_MIN_WORDS,
            SALAD_PAIRS,
            SALAD_QUESTIONS,
            SALAD_QUESTION_WORDS,
            SURPRISE_FLOOR,
            SURPRISE_SPAN,
            OFFLINE_CENTER,
            OFFLINE_SCALE,
            PROMPT_TALK,
            META_PATTERNS,
        ]
        cards = [asdict(p) for p in every_persona(persona_sets)]
        # Without a classifier this stays what was given (None or False), as names always were.
        function = self.classifier
        if self.classifier:
            function = [self.classifier.digest, FUNCTION_WEIGHTS, FUNCTION_CENTER, FUNCTION_SCALE]
        recipe = json.dumps([self.weights, constants, phrases, cards, function], sort_keys=True)
        return "offline:" + hashlib.sha256(recipe.encode("utf-8")).hexdigest()[:12]

    def _persona_voices(self, persona_sets) -> dict[str, list[PersonaVoice]]:
        """Every card's voice, by lower-case name; two sets may share a name (voice() tells them
        apart by role)."""
        voices: dict[str, list[PersonaVoice]] = {}
        for s in persona_sets:
            centroids = {}  # name -> (D,) unit centroid of its example lines
            for p in s.personas:
                lines = self.encoder.embed(p.examples)  # (E, D)
                centroids[p.name] = torch.nn.functional.normalize(lines.mean(0), dim=0)
            for p in s.personas:
                voice = self._voice_of(p, centroids)
                voices.setdefault(p.name.casefold(), []).append(voice)
        return voices

    def _voice_of(self, p, centroids: dict) -> PersonaVoice:
        others = [c for n, c in centroids.items() if n != p.name]
        if others:
            others = torch.stack(others)  # (P, D)
        else:
            others = torch.zeros(0, self.bank.shape[1])  # a set of one: nobody to be confused with
        strategies = p.esconv_strategies if self.classifier else []
        return PersonaVoice(
            p.role,
            [p.description, p.role, p.style],
            self.encoder.embed([p.description, p.style]),
            centroids[p.name],
            others,
            strategies,
        )

    def voice(self, state: JudgeState) -> PersonaVoice | None:
        """The speaker's card: same name, and its role named in the state's description, so a custom
        persona that merely shares a name with a bundled one is judged by its own description."""
        hits = [
            v
            for v in self.voices.get(state.persona_name.casefold(), [])
            if v.role.casefold() in state.persona_desc.casefold()
        ]
        return hits[0] if len(hits) == 1 else None

    def features_many(self, states: list[JudgeState], replies: list[str]) -> list[dict[str, float]]:
        """Every feature of every reply (section 3), and `function` where the speaker's card lists
        ESConv strategies and a classifier is given."""
        self._embed_once(states, replies)
        out = [self._features(s, r) for s, r in zip(states, replies)]
        self._add_function(states, replies, out)
        self._add_surprise(replies, out)
        return out

    def _add_surprise(self, replies, out) -> None:
        """The word-salad penalty, read both ways: the larger of the words' (lexical_features) and
        the language model's surprise, for replies long enough to be a pile (SALAD_MIN_WORDS)."""
        long = [i for i, r in enumerate(replies) if len(words(r)) >= SALAD_MIN_WORDS]
        nats = self.fluency.surprise([replies[i] for i in long])
        for i, n in zip(long, nats):
            out[i]["word_salad"] = min(out[i]["word_salad"], -surprise_penalty(n))

    def _embed_once(self, states, replies) -> None:
        """Every text the features read, in one batched pass (sorted: similar lengths batch
        together); the lookups of _features hit the encoder's memo."""
        texts = set(replies)
        for s, r in zip(states, replies):
            texts.update(split_sentences(r))
            texts.update([persona_does(s.persona_desc), s.persona_desc, s.context])
            texts.update(t["text"] for t in s.history)
        self.encoder.embed(sorted(texts, key=lambda t: (len(t), t)))

    def _features(self, s: JudgeState, reply: str) -> dict[str, float]:
        voice = self.voice(s)
        vec = self.encoder.embed
        card = vec([s.persona_desc])  # (1, D), and with a card its description and style: (3, D)
        card_texts = [s.persona_desc]
        role = ""
        lines = None
        if voice is not None:
            card = torch.cat([card, voice.card])
            card_texts += voice.card_texts
            role = voice.role
            lines = (voice.own, voice.others)
        f = semantic_features(
            vec([reply])[0],
            vec(split_sentences(reply)),
            vec([persona_does(s.persona_desc)])[0],
            card,
            vec([s.context])[0],
            vec([t["text"] for t in s.history]),
            self.bank,
            lines,
        )
        f.update(lexical_features(reply, s, card_texts, role))
        return f

    def _add_function(self, states, replies, out) -> None:
        """The persona's function: p(its strategies | reply, the message), one batched call."""
        jobs = []  # (index, the speaker's strategies)
        for i, s in enumerate(states):
            voice = self.voice(s)
            if voice and voice.strategies:
                jobs.append((i, voice.strategies))
        if not jobs:
            return
        probs = self.classifier.probs(
            [replies[i] for i, _ in jobs], [states[i].context for i, _ in jobs]
        )  # (J, 8)
        for (i, mine), p in zip(jobs, probs):  # p: (8,)
            ix = [scenarios.SUPPORT_STRATEGIES.index(k) for k in mine]
            out[i]["function"] = float(p[ix].sum())

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        out = []
        for f in self.features_many(states, replies):
            if "function" in f:  # judged by its job: the function recipe
                z = sum(FUNCTION_WEIGHTS[k] * f[k] for k in FUNCTION_WEIGHTS)
                out.append(sigmoid(FUNCTION_SCALE * (z - FUNCTION_CENTER)))
            else:  # judged by the features alone
                z = sum(self.weights[k] * f[k] for k in self.weights)
                out.append(sigmoid(OFFLINE_SCALE * (z - OFFLINE_CENTER)))
        return out


# --- 5. An LLM judge's verdict: asked in both orders -------------------------------------------
# How its free-text answers are read ("I think Response B is better", "Score: 4/5") is plumbing:
# plumbing/answers.py (parse_ab, parse_rubric_score).


def combine_orders(p_ab: float | None, p_ba: float | None) -> Verdict:
    """p_ab = P(first better) shown as (A = first, B = second), p_ba = the same shown swapped
    (P("B")); a verdict only when both agree, else the judge followed the position. None: an
    unreadable answer."""
    if p_ab is None or p_ba is None:
        known = [p for p in (p_ab, p_ba) if p is not None]
        p_first = sum(known) / len(known) if known else 0.5
        return Verdict(None, p_first, {"p_ab": p_ab, "p_ba": p_ba, "unparseable": True})
    preferred = None
    if p_ab > 0.5 and p_ba > 0.5:
        preferred = 0
    elif p_ab < 0.5 and p_ba < 0.5:
        preferred = 1
    return Verdict(preferred, (p_ab + p_ba) / 2, {"p_ab": p_ab, "p_ba": p_ba})


# --- 6. The prompts of the LLM judges -------------------------------------------------------------
MAX_TURN_CHARS = 600  # one runaway turn must not crowd out the rest of the prompt


def render_conversation(state: JudgeState) -> str:
    """'Speaker: text' lines for the last JUDGE_TURNS turns, then the user's latest message."""
    lines = [f"Situation: {state.situation}"] if state.situation else []
    lines += [f"{t['speaker']}: {t['text'][:MAX_TURN_CHARS]}" for t in state.history[-JUDGE_TURNS:]]
    return "\n".join(lines + [f"user: {state.context[:MAX_TURN_CHARS]}"])


def judge_messages(template: str, state: JudgeState, **fields) -> list[dict]:
    """data/prompts/<template>.txt: judge_pairwise (fields a, b) or judge_pointwise (reply)."""
    text = files.prompt(template).format(
        name=state.persona_name,
        desc=state.persona_desc,
        conversation=render_conversation(state),
        **fields,
    )
    return [
        {"role": "system", "content": files.prompt("judge_system")},
        {"role": "user", "content": text},
    ]


# --- 7. HFJudge: a local chat LLM, read through its next-token probabilities -------------------
def label_token_ids(tokenizer, label: str) -> list[int]:
    """Token ids that spell `label` as ONE token: "A" and " A" are different BPE tokens, and which
    one a model emits after the assistant header depends on its template, so P(label) sums both."""
    pieces = [tokenizer.encode(v, add_special_tokens=False) for v in (label, " " + label)]
    ids = list(dict.fromkeys(p[0] for p in pieces if len(p) == 1))
    if not ids:
        raise UserError(
            f"--judge hf: the tokenizer has no single token for the label {label!r}, so its "
            "probability cannot be read; use an openai:<base url> judge instead"
        )
    return ids


class HFJudge(Judge):
    """A local causal LM as judge at temperature 0, as the paper's judges run. Its verdicts and
    scores are read from the probabilities of the label tokens ("A"/"B", "1".."5") rather than
    from sampled text, so none is lost to an unreadable answer, and score() maps the expected
    digit sum_k k P("k") to [0, 1], smoother than one digit. Rubric answers (rate_many) are
    generated text, read by parse_rubric_score."""

    can_generate = True
    read_score = staticmethod(parse_rubric_score)

    def __init__(
        self, model_or_path: str, cache_path=None, batch_size: int = 8, device: str = "cpu"
    ):
        super().__init__(cache_path)
        self.name = f"hf:{model_or_path}"
        self.batch_size = batch_size
        try:
            self.model, self.tokenizer = loading.load_model(
                model_or_path, device=device, frozen=True
            )
        except UserError as err:  # its message names --model; here the flag is --judge
            raise UserError(f"--judge hf:{model_or_path}: {err}") from None
        self.ab_ids = [label_token_ids(self.tokenizer, x) for x in "AB"]
        self.digit_ids = [label_token_ids(self.tokenizer, x) for x in "12345"]

    @torch.no_grad()
    def label_probs(
        self, conversations: list[list[dict]], label_ids: list[list[int]]
    ) -> torch.Tensor:
        """(N, L): P(label l) at the first answer token of each conversation, among the labels."""
        device = next(self.model.parameters()).device
        rows = []
        for start in range(0, len(conversations), self.batch_size):
            batch = conversations[start : start + self.batch_size]
            prompts = models.chat_prompt_ids(self.tokenizer, batch)
            ids, mask = models.left_pad(prompts, self.tokenizer.pad_token_id)  # (B, P) each
            ids = ids.to(device)
            mask = mask.to(device)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # a padded row reads as the row alone
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1
            )
            probs = torch.softmax(out.logits[:, -1, :].float(), dim=-1)  # (B, V)
            mass = torch.stack([probs[:, t].sum(-1) for t in label_ids], dim=-1)  # (B, L)
            # Renormalised among the labels: P("A") + P("B") = 1 whatever went to "Reply", "The"...
            rows.append((mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)).cpu())
            self.backend_calls += len(prompts)
        return torch.cat(rows)

    def _compare_uncached(self, states, firsts, seconds):
        chats = []
        for s, a, b in zip(states, firsts, seconds):
            chats.append(judge_messages("judge_pairwise", s, a=a, b=b))  # row 2i: as given
            chats.append(judge_messages("judge_pairwise", s, a=b, b=a))  # row 2i+1: swapped
        p = self.label_probs(chats, self.ab_ids)  # (2N, 2)
        # Row 2i shows (first, second): P(first better) = P("A"); row 2i+1 the swap: P("B").
        return [
            combine_orders(float(p[2 * i, 0]), float(p[2 * i + 1, 1])) for i in range(len(states))
        ]

    def _score_uncached(self, states, replies):
        chats = [judge_messages("judge_pointwise", s, reply=r) for s, r in zip(states, replies)]
        p = self.label_probs(chats, self.digit_ids)  # (N, 5)
        expected = (p * torch.arange(1, 6, dtype=p.dtype)).sum(-1)  # (N,) sum_k k P("k")
        return [(float(e) - 1) / 4 for e in expected]  # 1..5 -> [0, 1]

    def _complete_uncached(self, prompt, max_new_tokens):
        self.backend_calls += 1
        return models.generate(
            self.model,
            self.tokenizer,
            [[{"role": "user", "content": prompt}]],
            max_new_tokens=max_new_tokens,
            seeds=None,
        ).texts[0]
