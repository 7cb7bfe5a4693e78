"""judge.py: the AI feedback of MASCOT. How good is one reply, and which of two is better?

Stage 1 (arXiv 2601.14230, Phase I, RLAIF) samples candidate replies per (context, persona); a judge
scores them for persona adherence and fit to the conversation, and clear gaps become the reward
model's preference pairs (reward.py). Stage 2 reuses `score_many` as the coherence term of the
director's reward, and the evaluation asks an LLM judge its rubrics.

    class Judge:  score(state, reply) -> float in [0, 1]      pointwise quality
                  compare(state, a, b) -> Verdict             pairwise: which reply is better
                  score_many / compare_many                   the same, batched and cached
                  complete(prompt) -> str                     greedy text (LLM judges only)

This file holds the interface and its offline default, OfflineJudge: no LLM (a 135M chat model answers "A" whatever
the replies say) but, for the support personas, a classifier of the strategies human annotators labelled in ESConv
(StrategyClassifier), else features over MiniLM embeddings and words, each with one penalty per reward hack a policy
found (docs/JUDGE.md): a stand-in that runs on a laptop, not a replacement for a strong judge. LLM backends plug in
from extras/judges.py (hf:, rm:) and extras/served.py (openai:); mascot.make_judge picks one. Every judgement goes
through an AnswerCache when a cache path is given, so no run pays twice for the same one.

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
from metrics import META_PATTERNS, STOPWORDS, leaks_meta, words
from plumbing import files, loading
from plumbing.common import UserError
from plumbing.files import AnswerCache, cached_answers
from simulate import JUDGE_TURNS, JudgeState


@dataclass
class Verdict:
    preferred: (
        int | None
    )  # 0 = first reply, 1 = second, None = no verdict (orders disagreed, unreadable)
    p_first: float  # P(first reply better), averaged over both orders
    detail: dict = field(default_factory=dict)


class Judge:
    """Caching and batching live here; a backend implements the `_..._uncached` methods and returns
    None for a judgement it could not make (an unreadable answer). None is never cached, so a later
    run asks again; `score` turns it into a neutral 0.5 and counts it in `unreadable`, `compare`
    into a Verdict with preferred=None. `backend_calls` counts what reached the backend."""

    name, can_generate = "judge", False

    def __init__(self, cache_path: str | Path | None = None):
        self.cache = AnswerCache(cache_path) if cache_path else None
        self.backend_calls, self.unreadable = 0, 0

    def _cached(
        self, method: str, inputs: list[dict], compute, keep=lambda v: v is not None
    ) -> list:
        """Cache lookups, then compute(todo) for the missing indices only, each distinct input once."""
        keys = [AnswerCache.make_key(self.name, method, x) for x in inputs]
        return cached_answers(
            self.cache, keys, lambda todo, store: self._compute_misses(todo, compute, store), keep
        )

    def _compute_misses(self, todo: list[int], compute, store) -> None:
        for i, value in zip(
            todo, compute(todo)
        ):  # one batch; a served judge sends requests concurrently
            store(i, value)

    def score(self, state: JudgeState, reply: str) -> float:
        return self.score_many([state], [reply])[0]

    def score_many(self, states: list[JudgeState], replies: list[str]) -> list[float]:
        if len(states) != len(replies):
            raise ValueError(f"score_many: {len(states)} states but {len(replies)} replies")
        values = self._cached(
            "score",
            [{"state": asdict(s), "reply": r} for s, r in zip(states, replies)],
            lambda todo: self._score_uncached(
                [states[i] for i in todo], [replies[i] for i in todo]
            ),
        )
        self.unreadable += sum(v is None for v in values)
        return [0.5 if v is None else float(v) for v in values]

    def compare(self, state: JudgeState, a: str, b: str) -> Verdict:
        return self.compare_many([state], [a], [b])[0]

    def compare_many(self, states, firsts, seconds) -> list[Verdict]:
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")

        def compute(todo):
            return [
                asdict(v)
                for v in self._compare_uncached(
                    [states[i] for i in todo], [firsts[i] for i in todo], [seconds[i] for i in todo]
                )
            ]

        values = self._cached(
            "compare",
            [{"state": asdict(s), "a": a, "b": b} for s, a, b in zip(states, firsts, seconds)],
            compute,
            keep=lambda v: not v["detail"].get("unparseable"),
        )
        return [Verdict(**v) for v in values]

    def rate_many(self, prompts: list[str], max_new_tokens: int = 32) -> list[int | None]:
        """A 1-5 score per rubric prompt from an LLM judge's greedy answers; None for an answer it cannot
        read. Each LLM backend reads its own answers (`read_score`, extras/judges.parse_rubric_score)."""
        return [self.read_score(a) for a in self.complete_many(prompts, max_new_tokens)]

    def read_score(self, answer: str) -> int | None:
        raise UserError(f"judge {self.name!r} cannot read rubric answers; use an LLM judge")

    def complete_many(self, prompts: list[str], max_new_tokens: int = 64) -> list[str]:
        """Greedy text for each prompt, in order (LLM judges only)."""
        if not self.can_generate:
            raise UserError(
                f"judge {self.name!r} cannot generate text; use --judge hf:<model> or openai:<base-url>"
            )
        return self._cached(
            "complete",
            [{"prompt": p, "max_new_tokens": max_new_tokens} for p in prompts],
            lambda todo: [self._complete_uncached(prompts[i], max_new_tokens) for i in todo],
        )


class ScoreJudge(Judge):
    """A judge that compares by its scores: P(first better) = sigmoid(logit(a) - logit(b)), a
    Bradley-Terry comparison; symmetric by construction, so there is no position bias to cancel."""

    def compare_many(self, states, firsts, seconds):
        if not len(states) == len(firsts) == len(seconds):
            raise ValueError("compare_many: states, firsts and seconds must have the same length")
        scores = self.score_many(list(states) * 2, list(firsts) + list(seconds))
        n = len(states)
        return [
            Verdict(
                0 if a > b else 1 if b > a else None,
                sigmoid(logit(a) - logit(b)),
                {"score_first": a, "score_second": b},
            )
            for a, b in zip(scores[:n], scores[n:])
        ]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))


# --- The persona-function classifier: what ESConv's annotators would call a reply -----------------
class StrategyClassifier:
    """p(strategy | reply, the message it answers) over ESConv's eight support strategies (scenarios.SUPPORT_STRATEGIES),
    learnt from the labels human annotators gave 12,759 supporter turns (Liu et al. 2021; extras/strategies.py fits
    it, measures it on held-out dialogues and writes data/strategy_classifier.safetensors):
        x = [e(reply), e(message), e(reply) * e(message)]     (3D,)  e: MiniLM, unit vectors
        p = softmax(W x + b)                                    (8,)   multinomial logistic regression
    The message is there because a strategy answers something: "that must be hard" after "I failed"
    reflects a feeling, after "thanks" it does not. A persona's FUNCTION is the mass p puts on the
    strategies its card lists (personas.json "esconv_strategies"): does the reply do its job?"""

    FILE = files.HERE / "data" / "strategy_classifier.safetensors"

    def __init__(self, encoder, path: str | Path = FILE):
        if not Path(path).is_file():
            raise UserError(
                f"{path}: no strategy classifier; fit one with `python mascot.py strategies --esconv FILE`"
            )
        weights = load_file(str(path))
        self.encoder, self.weight, self.bias = (
            encoder,
            weights["weight"],
            weights["bias"],
        )  # (8, 3D), (8,)
        self.digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]

    def probs(self, replies: list[str], messages: list[str]) -> torch.Tensor:
        x = strategy_features(self.encoder, replies, messages).to(self.weight.dtype)  # (N, 3D)
        return torch.softmax(x @ self.weight.T + self.bias, dim=-1)  # (N, 8)


def strategy_features(encoder, replies: list[str], messages: list[str]) -> torch.Tensor:
    r, m = encoder.embed(replies), encoder.embed(messages)  # (N, D) each
    return torch.cat([r, m, r * m], dim=-1)  # (N, 3D)


# --- The offline judge's features ---------------------------------------------------------------
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
# Each constant's measurement on our labelled pairs, and what was tried instead: docs/JUDGE.md.

OFFLINE_RECIPE = 2  # bump when a feature's definition changes: it is part of the cache name
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
}
RELEVANCE_CAP = 0.8  # copies have cosine 0.88-1.00 with the message; good replies mostly < 0.73
REPEAT_FLOOR = 0.5  # staying on the topic is not repeating a turn (repeats: 0.85-0.92)
COPY_RUN, COPY_FLOOR = 4, 0.3  # a 4-word run copied; the first 30% of a reply may quote
RECITAL_FLOOR = 0.4  # recitals 0.45-0.89 with the card; good replies at most 0.50, 90% < 0.32
MIN_WORDS = 6  # good replies have 14+ words; trivial hacks 0-2
LIST_FLOOR = 0.3  # keyword stuffing puts 48-82% of its words in fragments; good replies <= 27%
FUNCTION_FLOOR = 0.05  # English sentences need function words; our tersest good replies have 7%
OFFLINE_CENTER, OFFLINE_SCALE = (
    -0.02,
    2.0,
)  # mean and 1 / std of z over honest replies: a typical one scores 0.5
# Where the speaker's card lists ESConv strategies and a StrategyClassifier is given, its function
# probability replaces the embedding guesses at role (persona, off_role): human labels are the
# signal of role; relevance (the paper's "contextual appropriateness") and generic (the collapse into
# stock comfort) stay as they were; the hack penalties are constraints: a reply that is all hack
# loses 3, more than the whole range of the function term (2), so no job done buys a hack back.
FUNCTION_WEIGHTS = {
    "function": 2.0,
    "relevance": 1.0,
    "generic": 2.0,
    "repetition": 1.0,
    **{
        k: 3.0
        for k in (
            "context_copy",
            "history_echo",
            "persona_copy",
            "persona_recital",
            "meta_leak",
            "too_short",
            "keyword_list",
        )
    },
}
FUNCTION_CENTER, FUNCTION_SCALE = (
    0.42,
    2.5,
)  # mean and 1 / std of z over our 49 labelled support pairs' better replies

_NEGATION = re.compile(r"[;,.]?\s*\b(?:never|avoiding|instead of|without)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
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
    r"\bthe user\b(?!s)",
    r"<\|[^|>]*\|>",
    r"\b(?:i am|i'm) (?:just )?(?:an? )?(?:ai|artificial intelligence|chatbot|bot|virtual assistant"
    r"|assistant|language model|program)\b",
    r"\bhope (?:this|that) helps\b|\blet me know if (?:you'd like|you want|this)\b",
    r"\bmy (?:\w+ )?(?:role|purpose|instructions?)\b|\bmy job (?:here )?(?:is|as)\b",
    r"\b(?:i am|i'm|as) (?:the |your |an? )?{role}\b",
    r"\b(?:i am|i'm|as) (?:the )?{name}\b|\b{name} here\b",
    r"^\s*[(\[][^)\]]{{1,60}}[)\]]",
    r"[(\[*][^)\]*]{{0,40}}\b{name}\b[^)\]*]{{0,40}}[)\]*]",
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
    seen = {tuple(s[i : i + run]) for s in sources for i in range(len(s) - run + 1)}
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
    if leaks_meta(reply, [name, *speaker_names]):
        return True
    fill = {
        "name": re.escape(name.lower()) if name else r"\b\B",
        "role": re.escape(role.lower()) if role else r"\b\B",
    }
    return any(re.search(p.format(**fill), reply, re.IGNORECASE) for p in PROMPT_TALK)


def lexical_features(
    reply: str, state: JudgeState, card_texts: list[str], role: str = ""
) -> dict[str, float]:
    """The hack penalties that read the reply's words, each in [-1, 0]. card_texts: the persona's
    description, role and style (never its example lines: those are what in-role sounds like)."""
    mine = person_neutral_words(reply)
    is_user = [t["speaker"].casefold() == "user" for t in state.history]
    user = [state.context, state.situation] + [
        t["text"] for t, u in zip(state.history, is_user) if u
    ]
    agents = [t["text"] for t, u in zip(state.history, is_user) if not u]
    return {
        "context_copy": -hinge(
            copied_share(mine, [person_neutral_words(t) for t in user if t]), COPY_FLOOR
        ),
        "history_echo": -hinge(
            copied_share(mine, [person_neutral_words(t) for t in agents]), COPY_FLOOR
        ),
        "persona_copy": -copied_share(mine, [person_neutral_words(t) for t in card_texts]),
        "meta_leak": -float(
            talks_about_prompt(
                reply, state.persona_name, role, [t["speaker"] for t in state.history]
            )
        ),
        "too_short": -max(0, MIN_WORDS - len(words(reply))) / MIN_WORDS,
        "keyword_list": -list_likeness(reply),
    }


def semantic_features(
    reply, sentences, does, card, context, history, bank, own=None, others=None
) -> dict:
    """The features over unit sentence embeddings (a dot product is a cosine): reply (D,), its
    sentences (S, D), persona_does (D,), card (C, D), the user's message (D,), earlier turns (H, D),
    the generic phrases (K, D); own (D,) and others (P, D): the centroids of the persona's example
    lines and of the other personas' in its set, when the persona is in the persona file."""
    repeat = float((history @ reply).max()) if len(history) else 0.0  # (H,) -> max
    persona, off_role = float(does @ reply), 0.0
    if own is not None:
        mine = float(own @ reply)
        persona = (persona + mine) / 2
        if others is not None and len(others):
            off_role = -max(0.0, float((others @ reply).max()) - mine)  # (P,) -> max
    context_cos = float(context @ reply)
    return {
        "persona": persona,
        "context": context_cos,
        "relevance": min(context_cos, RELEVANCE_CAP),
        "repetition": -max(0.0, repeat - REPEAT_FLOOR),
        "generic": -float((sentences @ bank.T).max()),
        "off_role": off_role,
        "persona_recital": -hinge(float((card @ reply).max()), RECITAL_FLOOR),
    }


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
    classifier: a StrategyClassifier (True: the shipped one); speakers whose cards list ESConv strategies
    are then scored by FUNCTION_WEIGHTS (the support set, mascot.make_judge's default), others by `weights`."""

    def __init__(
        self,
        persona_sets: list,
        cache_path=None,
        encoder=None,
        weights: dict | None = None,
        classifier: StrategyClassifier | bool | None = None,
    ):
        super().__init__(cache_path)
        self.encoder = encoder or models.SentenceEncoder()
        labelled = any(p.esconv_strategies for s in persona_sets for p in s.personas)
        self.classifier = (
            (StrategyClassifier(self.encoder) if labelled else None)
            if classifier is True
            else classifier
        )
        self.weights = dict(OFFLINE_WEIGHTS if weights is None else weights)
        phrases = files.asset("generic_phrases.json")["phrases"]
        # The name carries everything that decides a score, so a changed weight, constant, phrase or
        # persona card never reads stale scores from an old cache.
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
            OFFLINE_CENTER,
            OFFLINE_SCALE,
            PROMPT_TALK,
            META_PATTERNS,
        ]
        cards = [asdict(p) for s in persona_sets for p in s.personas]
        function = self.classifier and [
            self.classifier.digest,
            FUNCTION_WEIGHTS,
            FUNCTION_CENTER,
            FUNCTION_SCALE,
        ]
        recipe = json.dumps([self.weights, constants, phrases, cards, function], sort_keys=True)
        self.name = "offline:" + hashlib.sha256(recipe.encode("utf-8")).hexdigest()[:12]
        self.bank = self.encoder.embed(phrases)  # (K, D)
        self.voices: dict[str, list[PersonaVoice]] = {}
        for s in persona_sets:
            lines = {
                p.name: torch.nn.functional.normalize(self.encoder.embed(p.examples).mean(0), dim=0)
                for p in s.personas
            }
            for p in s.personas:
                others = [c for n, c in lines.items() if n != p.name]
                self.voices.setdefault(p.name.casefold(), []).append(
                    PersonaVoice(
                        p.role,
                        [p.description, p.role, p.style],
                        self.encoder.embed([p.description, p.style]),
                        lines[p.name],
                        torch.stack(others) if others else torch.zeros(0, self.bank.shape[1]),
                        p.esconv_strategies if classifier else [],
                    )
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
        texts = set(replies)
        for s, r in zip(states, replies):
            texts.update(
                split_sentences(r)
                + [persona_does(s.persona_desc), s.persona_desc, s.context]
                + [t["text"] for t in s.history]
            )
        self.encoder.embed(
            sorted(texts, key=lambda t: (len(t), t))
        )  # one batched pass; the lookups below hit its memo
        out = []
        for s, reply in zip(states, replies):
            voice, vec = self.voice(s), self.encoder.embed
            card = (
                vec([s.persona_desc])
                if voice is None
                else torch.cat([vec([s.persona_desc]), voice.card])
            )
            f = semantic_features(
                vec([reply])[0],
                vec(split_sentences(reply)),
                vec([persona_does(s.persona_desc)])[0],
                card,
                vec([s.context])[0],
                vec([t["text"] for t in s.history]),
                self.bank,
                voice.own if voice else None,
                voice.others if voice else None,
            )
            f.update(
                lexical_features(
                    reply,
                    s,
                    [s.persona_desc] + (voice.card_texts if voice else []),
                    voice.role if voice else "",
                )
            )
            out.append(f)
        jobs = [
            (i, self.voice(s).strategies)
            for i, s in enumerate(states)
            if self.voice(s) and self.voice(s).strategies
        ]
        if jobs:  # the persona's function: p(its strategies | reply, the message)
            probs = self.classifier.probs(
                [replies[i] for i, _ in jobs], [states[i].context for i, _ in jobs]
            )
            for (i, mine), p in zip(jobs, probs):  # p: (8,)
                out[i]["function"] = float(
                    p[[scenarios.SUPPORT_STRATEGIES.index(k) for k in mine]].sum()
                )
        return out

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        out = []
        for f in self.features_many(states, replies):
            w, center, scale = (
                (FUNCTION_WEIGHTS, FUNCTION_CENTER, FUNCTION_SCALE)
                if "function" in f
                else (self.weights, OFFLINE_CENTER, OFFLINE_SCALE)
            )
            out.append(sigmoid(scale * (sum(w[k] * f[k] for k in w) - center)))
        return out


# --- Reading an answer: which reply did the judge pick? -----------------------------------------
_LABEL_NAME = r"(?:(?i:reply|response|answer|option|choice)\s+)"


_PICKS = [
    re.compile(
        _LABEL_NAME + r"?(?<![A-Za-z])([AB])(?![A-Za-z])[*\"'`)\]]*\s+(?:is|was|seems)\s+"
        r"(?:clearly\s+|much\s+|slightly\s+|the\s+)?(?i:better|stronger|preferred)"
    ),
    re.compile(
        r"(?i:better(?:\s+(?:reply|response|answer|option|choice|one))?\s+is|prefer|pick|choose)"
        r"\s+" + _LABEL_NAME + r"?[*\"'`(\[]*([AB])(?![A-Za-z])"
    ),
    re.compile(r"^[\s\"'*`(\[]*([AB])(?![A-Za-z])"),
    re.compile(
        r"\b(?:reply|response|answer|option|choice)\b[\s:*\"'`(\[-]*([AB])(?![A-Za-z])",
        re.IGNORECASE,
    ),
    re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])"),
]


_ARTICLE = re.compile(
    r"[Aa]\s+(?!is\b|wins\b|was\b|seems\b)[a-z]"
)  # "A better reply is B": an article


def parse_ab(text: str) -> int | None:
    """0 for "A", 1 for "B", None. Tried in order: a sentence saying which is better ("I prefer B"), so
    "A: Reply B is better." is B; the leading label; a named label; the first standalone A/B."""
    return (
        next(
            (
                "AB".index(m.group(1).upper())
                for pattern in _PICKS
                for m in pattern.finditer(text)
                if not _ARTICLE.match(text, m.start(1))
            ),
            None,
        )
        if isinstance(text, str)
        else None
    )


# --- Reading an LLM judge's 1-5 rubric answer ---------------------------------------------------
_NUM, _QUOTES = r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)(?![0-9])", r"[\s*_\"'`]*"


_LABELLED_RE = re.compile(
    r"\b(?:score|rating|grade)s?\b"
    + _QUOTES
    + r"(?:[:=]|-(?=\s)|\bis\b|\bof\b)?"
    + _QUOTES
    + _NUM
    + r"(?:\s*(?:/|\bout\s+of\b)\s*"
    + _NUM
    + r")?",
    re.IGNORECASE,
)


_FRACTION_RE = re.compile(_NUM + r"\s*(?:/|\bout\s+of\b)\s*" + _NUM, re.IGNORECASE)


_BOLD_RE, _STARS_RE = (
    re.compile(r"\*\*\s*" + _NUM + r"\s*\*\*"),
    re.compile(_NUM + r"\s*stars?\b", re.IGNORECASE),
)


_BARE_RE = re.compile(r"[\s*_\"'`(\[]*" + _NUM + r"[\s*_\"'`)\].!]*")


def _score_value(number: str, lo: int, hi: int) -> int | None:
    """'4' and '4.0' -> 4 inside [lo, hi]; 4.5, 0 or a 99-digit run -> None."""
    whole, _, fraction = number.partition(".")
    return (
        None
        if fraction.strip("0") or len(whole) > 6
        else int(whole)
        if lo <= int(whole) <= hi
        else None
    )


def parse_rubric_score(text: str, lo: int = 1, hi: int = 5) -> int | None:
    """An integer rubric score in [lo, hi] read from free text, or None. Judges are asked to end with "Score: N", but
    models wander, so every statement that LOOKS like a score is read: labelled ("Score: 4", "rating is 4", "4/5"),
    a fraction over the scale's top ("4 out of 5"), a bold number, "4 stars", or an answer that is only the number,
    after scale descriptions ("(1-5)", "1 to 5") are removed. All must agree ("5/5 ... no, 2/5" is None): a
    self-correction cannot be told from a quotation, and a silently wrong score is worse than a missing one."""
    if not isinstance(text, str):
        return None
    text = re.sub(
        rf"\(?(?<![0-9.]){lo}\s*(?:-|–|—|to)\s*{hi}(?![0-9])\)?", " ", text, flags=re.IGNORECASE
    )
    found = [
        None
        if m.group(2) is not None
        and _score_value(m.group(2), hi, hi) is None  # "4/10": another scale
        else _score_value(m.group(1), lo, hi)
        for m in _LABELLED_RE.finditer(text)
    ]
    found += [
        _score_value(m.group(1), lo, hi)
        for m in _FRACTION_RE.finditer(text)
        if _score_value(m.group(2), hi, hi) is not None
    ]
    found += [
        _score_value(m.group(1), lo, hi) for r in (_BOLD_RE, _STARS_RE) for m in r.finditer(text)
    ]
    if bare := _BARE_RE.fullmatch(text):
        found.append(_score_value(bare.group(1), lo, hi))
    return found[0] if len(set(found)) == 1 else None


def combine_orders(p_ab: float | None, p_ba: float | None) -> Verdict:
    """p_ab = P(first better) shown as (A = first, B = second), p_ba = the same shown swapped (P("B")); a
    verdict only when both agree, else the judge followed the position. None: an unreadable answer."""
    if p_ab is None or p_ba is None:
        known = [p for p in (p_ab, p_ba) if p is not None]
        return Verdict(
            None,
            sum(known) / len(known) if known else 0.5,
            {"p_ab": p_ab, "p_ba": p_ba, "unparseable": True},
        )
    preferred = 0 if p_ab > 0.5 and p_ba > 0.5 else 1 if p_ab < 0.5 and p_ba < 0.5 else None
    return Verdict(preferred, (p_ab + p_ba) / 2, {"p_ab": p_ab, "p_ba": p_ba})


# --- The prompts of the LLM judges ----------------------------------------------------------------
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


# --- HFJudge: a local chat LLM, read through its next-token probabilities --------------------------
def label_token_ids(tokenizer, label: str) -> list[int]:
    """Token ids that spell `label` as ONE token: "A" and " A" are different BPE tokens, and which one
    a model emits after the assistant header depends on its template, so P(label) sums both."""
    pieces = [tokenizer.encode(v, add_special_tokens=False) for v in (label, " " + label)]
    ids = list(dict.fromkeys(p[0] for p in pieces if len(p) == 1))
    if not ids:
        raise UserError(
            f"--judge hf: the tokenizer has no single token for the label {label!r}, so its "
            "probability cannot be read; use an openai:<base url> judge instead"
        )
    return ids


class HFJudge(Judge):
    """A local causal LM as judge at temperature 0; score() maps sum_k k P("k") to [0, 1] (smoother than one digit)."""

    can_generate, read_score = True, staticmethod(parse_rubric_score)

    def __init__(
        self, model_or_path: str, cache_path=None, batch_size: int = 8, device: str = "cpu"
    ):
        super().__init__(cache_path)
        self.name, self.batch_size = f"hf:{model_or_path}", batch_size
        try:
            self.model, self.tokenizer = loading.load_model(
                model_or_path, device=device, frozen=True
            )
        except UserError as err:  # its message names --model; here the flag is --judge
            raise UserError(f"--judge hf:{model_or_path}: {err}") from None
        self.ab_ids, self.digit_ids = (
            [label_token_ids(self.tokenizer, x) for x in labels] for labels in ("AB", "12345")
        )

    @torch.no_grad()
    def label_probs(
        self, conversations: list[list[dict]], label_ids: list[list[int]]
    ) -> torch.Tensor:  # (N, L)
        rows, device = [], next(self.model.parameters()).device
        for start in range(0, len(conversations), self.batch_size):
            prompts = models.chat_prompt_ids(
                self.tokenizer, conversations[start : start + self.batch_size]
            )
            ids, mask = (
                t.to(device) for t in models.left_pad(prompts, self.tokenizer.pad_token_id)
            )  # (B, P)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)  # a padded row reads as the row alone
            probs = torch.softmax(
                self.model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1
                )
                .logits[:, -1, :]
                .float(),
                dim=-1,
            )  # (B, V)
            mass = torch.stack([probs[:, t].sum(-1) for t in label_ids], dim=-1)  # (B, L)
            # Renormalised among the labels: P("A") + P("B") = 1 whatever went to "Reply", "The", ...
            rows.append((mass / mass.sum(-1, keepdim=True).clamp(min=1e-12)).cpu())
            self.backend_calls += len(prompts)
        return torch.cat(rows)

    def _compare_uncached(self, states, firsts, seconds):
        p = self.label_probs(
            [
                judge_messages("judge_pairwise", s, a=x, b=y)
                for s, a, b in zip(states, firsts, seconds)
                for x, y in ((a, b), (b, a))
            ],
            self.ab_ids,
        )
        # Row 2i shows (first, second): P(first better) = P("A"); row 2i+1 the swap: P("B").
        return [
            combine_orders(float(p[2 * i, 0]), float(p[2 * i + 1, 1])) for i in range(len(states))
        ]

    def _score_uncached(self, states, replies):
        p = self.label_probs(
            [judge_messages("judge_pointwise", s, reply=r) for s, r in zip(states, replies)],
            self.digit_ids,
        )  # (N, 5)
        return [
            (float(e) - 1) / 4 for e in (p * torch.arange(1, 6, dtype=p.dtype)).sum(-1)
        ]  # 1..5 -> [0, 1]

    def _complete_uncached(self, prompt, max_new_tokens):
        self.backend_calls += 1
        return models.generate(
            self.model,
            self.tokenizer,
            [[{"role": "user", "content": prompt}]],
            max_new_tokens=max_new_tokens,
            seeds=None,
        ).texts[0]
