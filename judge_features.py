"""judge_features.py: what the offline judge measures in a reply. Pure functions, no model.

The default judge (judge.OfflineJudge) scores a reply as a weighted sum of features, every one
"higher is better": quality features over MiniLM sentence embeddings (`semantic_features`, given
unit vectors) and one penalty per reward hack over the reply's words (`lexical_features`, given
strings). judge.py embeds the texts and adds the features up; this module only does the
arithmetic, so each feature can be read, and tested, by hand:

    python -m pytest -q tests/test_judge.py -k "copied or list or meta or features"
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING

import hacks
from metrics import STOPWORDS

if TYPE_CHECKING:                 # only for the annotation: this module imports nothing of the pipeline
    from simulate import JudgeState


# A reward-hacking policy (hacks.py) learns what an overlap-based grader pays for: version 1 of
# this judge rewarded similarity to the user's message and to the persona description, so copying
# either one won. Version 2 keeps version 1's quality features, makes them stop paying at a point,
# and adds one penalty per way of gaming them. Every feature is "higher is better":
#
#   quality: how good an honest reply is
#     persona          cos(reply, what the persona does), averaged with cos(reply, its example lines)
#     relevance        cos(reply, the user's latest message), capped at RELEVANCE_CAP
#     repetition       -(max cos(reply, an earlier turn) - REPEAT_FLOOR)+
#     generic          -max cos(any sentence of the reply, a bank of generic phrases)
#     off_role         -(cos(reply, another persona's lines) - cos(reply, its own lines))+
#   hack penalties: 0 for an honest reply, down to -1 for a reply that is nothing but the hack
#     context_copy     share of the reply copied from the user's messages (4-word runs), beyond COPY_FLOOR
#     history_echo     share copied from the earlier companion turns, beyond COPY_FLOOR
#     persona_copy     share copied from the persona's own description, role and style
#     persona_recital  cos(reply, the persona's description or style) beyond RECITAL_FLOOR
#     meta_leak        -1 when the reply contains prompt or meta text
#     too_short        -(MIN_WORDS - words)+ / MIN_WORDS
#     keyword_list     share of the words in 1-2 word fragments ("guilt, grief, Gran"), beyond LIST_FLOOR,
#                      or too few function words (a list without commas)
#
# `context` (the uncapped cosine with the user's message) is reported too, unweighted:
# evaluate.py reads it as its relevance approximation.
# docs/JUDGE.md has the measurement behind every constant, and what was tried and left out.

OFFLINE_RECIPE = 2         # bump when a feature's definition changes: it is part of the cache name

# Quality weights are version 1's (2, 1, 1, 2), chosen on the 70 ordinary pairs; off_role
# sharpens `persona` and gets persona's weight. Every hack penalty weighs 2: a reply that is
# entirely a hack loses 2, four standard deviations of z over honest replies (0.50), so no quality
# feature can buy it back. The penalties are 0 on almost every honest reply, so their weight does
# not move the ordinary pairs (0.886 with 1, 2 or 3); on the 84 hack pairs 1 gives 0.952 (lists
# slip through), 2 and 3 0.976. A logistic regression of the penalty weights on 1,008 generated
# hacks (bench/judge_speed.py --synthetic) gives 0.6 to 1.7, the same on held-out generated hacks
# (1.000) and 0.988 on the hack pairs: we keep the one round number.
OFFLINE_WEIGHTS = {"persona": 2.0, "relevance": 1.0, "repetition": 1.0, "generic": 2.0,
                   "off_role": 2.0,
                   "context_copy": 2.0, "history_echo": 2.0, "persona_copy": 2.0,
                   "persona_recital": 2.0, "meta_leak": 2.0, "too_short": 2.0, "keyword_list": 2.0}

# Similarity to the user's message stops paying at RELEVANCE_CAP, so a reply gains nothing by
# parroting the message (copies have cosine 0.88 to 1.00 with it; 90% of the good replies of our
# labelled pairs stay below 0.73). A lower cap would catch more copies that the word features miss
# (without context_copy, the copy pairs score 0.75 at a cap of 0.6, 0.50 at 0.8) but costs
# ordinary accuracy (0.857 at 0.7 or below, 0.886 at 0.8): the meeting recorder's good replies
# restate the message and reach 0.92.
RELEVANCE_CAP = 0.8

# Only similarity to an earlier turn beyond REPEAT_FLOOR counts as repeating it, so a reply is not
# penalised just for staying on the topic of the conversation. In our labelled pairs a good
# reply's closest earlier turn has cosine 0.25 (median; 0.57 at the 90th percentile), a reply
# that repeats one has 0.89 (0.85 to 0.92). Any floor from 0.2 to 0.5 gives the same accuracy.
REPEAT_FLOOR = 0.5

# Copying is measured in runs of COPY_RUN words: the share of the reply's words that sit inside
# a 4-word run also found in the source (after mapping I/my/me to you/your, so "I failed my test"
# and "you failed your test" match). Honest replies quote a name or a short phrase: 95% of the
# good replies of our pairs share no 4-word run with the user at all, the meeting recorder's
# read-backs up to 55% of their words; the copies of the hack pairs 85% to 100%. The first
# COPY_FLOOR of the reply is free. Any floor from 0.3 to 0.7 scores all our labelled pairs alike
# (bench/judge_speed.py), so the floor is set by the partial copy it must still catch: a reply
# that is 60% copy loses 0.57 x 2 at 0.3 but only 0.2 x 2 at 0.5, less than what the copy
# gains in relevance. The recorder's 55% read-back pays 0.36 x 2: restate, do not copy.
COPY_RUN = 4
COPY_FLOOR = 0.3

# A reply that recites its persona card is close in meaning to the description or the style:
# 0.45 to 0.89 for recitals, at most 0.50 (90% below 0.32) for the good replies of our pairs.
RECITAL_FLOOR = 0.4

# The speaker prompt asks for one to three sentences; the good replies of our pairs have 14 words
# or more, trivial hacks ("Okay.", "...", an emoji) 0 to 2.
MIN_WORDS = 6

# Keyword stuffing is a list of 1-2 word fragments: 48% to 82% of its words sit in such fragments,
# at most 27% in the good replies of our pairs (terse meeting notes: "Noted: ... Agreed: ...").
LIST_FLOOR = 0.3

# A keyword list without punctuation ("barking window neighbour complaint terrier") has no
# function words (a, the, to, is, you ... : metrics.STOPWORDS); English sentences need them. Our
# good replies have at least 7% (terse meeting notes), 48% typically; below FUNCTION_FLOOR a reply
# of MIN_WORDS or more words counts as a list. It is only a floor, not a graded feature: stuffing
# with commas keeps up to 32% function words ("what if", "by when"), more than the tersest good
# replies, so the list share does the grading.
FUNCTION_FLOOR = 0.05

# score = sigmoid(OFFLINE_SCALE * (z - OFFLINE_CENTER)), z = the weighted feature sum. The centre
# and 1 / scale are the mean (-0.02) and standard deviation (0.50) of z over the 140 replies of the
# ordinary labelled pairs (bench/judge_speed.py prints them), so a typical honest reply scores 0.5,
# one standard deviation better 0.73, and a reply that is entirely one hack (z lower by 2) about
# 0.02. They change no comparison, only the absolute scores that reward.py thresholds into pairs
# and the director averages.
OFFLINE_CENTER = -0.02
OFFLINE_SCALE = 2.0

# Where a persona description turns from what the persona does to what it must not do.
_NEGATION = re.compile(r"[;,.]?\s*\b(?:never|avoiding|instead of|without)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_FRAGMENT_END = re.compile(r"[,;:.!?/|&+\n]+|\s(?:and|or)\s", re.IGNORECASE)

# First person maps to second person, so a reply that reflects the user's words back ("you failed
# your test") matches the message it copies ("I failed my test"). Applied to both sides.
_SAME_PERSON = {"i": "you", "me": "you", "my": "your", "mine": "yours", "myself": "yourself",
                "i'm": "you're", "i've": "you've", "i'd": "you'd", "i'll": "you'll",
                "am": "are", "was": "were"}

# Prompt talk that hacks.META_PATTERNS does not list, each one way a small chat model leaks its
# prompt or its assistant training into a companion's turn. {name} and {role} are the speaker's.
PROMPT_TALK = [
    r"\bthe user\b(?!s)",                                   # the prompt's word for the person
    r"<\|[^|>]*\|>",                                        # chat-template tokens
    r"\b(?:i am|i'm) (?:just )?(?:an? )?(?:ai|artificial intelligence|chatbot|bot|virtual assistant"
    r"|assistant|language model|program)\b",              # "I'm an AI" in other words
    r"\bhope (?:this|that) helps\b|\blet me know if (?:you'd like|you want|this)\b",  # assistant sign-offs
    r"\bmy (?:\w+ )?(?:role|purpose|instructions?)\b|\bmy job (?:here )?(?:is|as)\b",  # its instructions
    r"\b(?:i am|i'm|as) (?:the |your |an? )?{role}\b",      # self-introduction by role
    r"\b(?:i am|i'm|as) (?:the )?{name}\b|\b{name} here\b",  # self-introduction by name
    r"^\s*[(\[][^)\]]{{1,60}}[)\]]",                      # an opening stage direction: "(gently) ..."
    r"[(\[*][^)\]*]{{0,40}}\b{name}\b[^)\]*]{{0,40}}[)\]*]",  # a stage direction naming itself: "(Anchor nods)"
]


def persona_does(desc: str) -> str:
    """The part of a persona description that says what the persona does.

    "Anchor: names feelings; never gives advice" -> "Anchor: names feelings". A sentence
    embedding does not understand "never", so "never gives advice" would make advice look
    in-role; we drop the never-part. A description that starts with "Never" is kept whole.
    """
    head = _NEGATION.split(desc, maxsplit=1)[0].strip()
    return head or desc


def split_sentences(text: str) -> list[str]:
    """Split at ., ! or ? followed by a space; a text without any stays one sentence."""
    parts = [p for p in _SENTENCE_END.split(text.strip()) if p]
    return parts or [text]


def hinge(x: float, floor: float) -> float:
    """How far x goes beyond floor, rescaled so that x = 1 gives 1: (x - floor)+ / (1 - floor)."""
    return max(0.0, x - floor) / (1.0 - floor)


# --- features of the words --------------------------------------------------------------------

def person_neutral_words(text: str) -> list[str]:
    """hacks.words with first person mapped to second: "I failed my test" -> you failed your test."""
    return [_SAME_PERSON.get(w, w) for w in hacks.words(text)]


def copied_share(reply: list[str], sources: list[list[str]], run: int = COPY_RUN) -> float:
    """Share of the reply's words that sit inside a run of `run` words also found in a source.

    A graded version of hacks.copies: copying half the message costs half as much as copying all.
    reply and sources are word lists (person_neutral_words); 4 of these 6 words are copied:
    >>> copied_share("so you failed your test again".split(), [["you", "failed", "your", "test"]])
    0.6666666666666666
    """
    if len(reply) < run:
        return 0.0
    seen = {tuple(s[i:i + run]) for s in sources for i in range(len(s) - run + 1)}
    covered = [False] * len(reply)
    for i in range(len(reply) - run + 1):
        if tuple(reply[i:i + run]) in seen:
            covered[i:i + run] = [True] * run
    return sum(covered) / len(reply)


def list_share(text: str) -> float:
    """Share of the words that sit in fragments of at most 2 words, fragments being split at
    , ; : . ! ? / | & + line breaks and the words "and" / "or" (a list joined by "and" is still a
    list). "Guilt, Gran, care home and love." -> 1.0; a sentence -> 0."""
    fragments = [hacks.words(f) for f in _FRAGMENT_END.split(text)]
    total = sum(len(f) for f in fragments)
    return sum(len(f) for f in fragments if len(f) <= 2) / total if total else 0.0


def function_share(text: str) -> float:
    """Share of the words that are function words (metrics.STOPWORDS; "you're" counts as "you")."""
    tokens = hacks.words(text)
    return sum(t.split("'")[0] in STOPWORDS for t in tokens) / len(tokens) if tokens else 0.0


def list_likeness(text: str) -> float:
    """How much the reply reads as a keyword list, in [0, 1]: the larger of its list share beyond
    LIST_FLOOR and its shortfall of function words below FUNCTION_FLOOR. Replies shorter than
    MIN_WORDS get 0: "Okay." is too_short's business, not a list."""
    if len(hacks.words(text)) < MIN_WORDS:
        return 0.0
    shortfall = max(0.0, FUNCTION_FLOOR - function_share(text)) / FUNCTION_FLOOR
    return max(hinge(list_share(text), LIST_FLOOR), shortfall)


def talks_about_prompt(reply: str, name: str, role: str = "", speaker_names: list[str] = ()) -> bool:
    """hacks.leaks_meta (prompt labels, instruction echoes, "As an AI", speaker labels) or one of
    PROMPT_TALK with the speaker's own name and role filled in."""
    if hacks.leaks_meta(reply, [name, *speaker_names]):
        return True
    fill = {"name": re.escape(name.lower()) if name else r"\b\B", "role": re.escape(role.lower()) if role else r"\b\B"}
    return any(re.search(p.format(**fill), reply, re.IGNORECASE) for p in PROMPT_TALK)


def lexical_features(reply: str, state: JudgeState, card_texts: list[str], role: str = "") -> dict[str, float]:
    """The hack penalties that read the reply's words: copying, echoing, reciting, leaking,
    trivial and list-like replies. Pure function of strings; every value is in [-1, 0].

    card_texts: the persona's own description, role and style (never its example lines: those
    are what an in-role reply sounds like).
    """
    reply_words = person_neutral_words(reply)
    is_user = [t["speaker"].casefold() == "user" for t in state.history]
    user = [state.context, state.situation] + [t["text"] for t, u in zip(state.history, is_user) if u]
    agents = [t["text"] for t, u in zip(state.history, is_user) if not u]
    words = len(hacks.words(reply))
    return {
        "context_copy": -hinge(copied_share(reply_words, [person_neutral_words(t) for t in user if t]), COPY_FLOOR),
        "history_echo": -hinge(copied_share(reply_words, [person_neutral_words(t) for t in agents]), COPY_FLOOR),
        "persona_copy": -copied_share(reply_words, [person_neutral_words(t) for t in card_texts]),
        "meta_leak": -float(talks_about_prompt(reply, state.persona_name, role,
                                               [t["speaker"] for t in state.history])),
        "too_short": -max(0, MIN_WORDS - words) / MIN_WORDS,
        "keyword_list": -list_likeness(reply),
    }


# --- features of the meaning ------------------------------------------------------------------

def semantic_features(reply, sentences, does, card, context, history, bank,
                      own=None, others=None) -> dict[str, float]:
    """The features that compare sentence embeddings; all inputs are unit vectors (a dot product
    is a cosine).

    reply: (D,) the whole reply; sentences: (S, D) its sentences; does: (D,) persona_does of the
    description; card: (C, D) the description and, when known, the card's description and style;
    context: (D,) the user's latest message; history: (H, D) earlier turns (H may be 0);
    bank: (K, D) the generic phrases (data/generic_phrases.json); own: (D,) the centroid of the
    persona's example lines and others: (P, D) those of the other personas of its set, when the
    persona is in personas.json (None otherwise).
    """
    repeat = float((history @ reply).max()) if len(history) else 0.0          # (H,) -> max
    persona, off_role = float(does @ reply), 0.0
    if own is not None:
        mine = float(own @ reply)
        persona = (persona + mine) / 2
        if others is not None and len(others):
            off_role = -max(0.0, float((others @ reply).max()) - mine)          # (P,) -> max
    context_cos = float(context @ reply)
    return {
        "persona": persona,
        "context": context_cos,
        "relevance": min(context_cos, RELEVANCE_CAP),
        "repetition": -max(0.0, repeat - REPEAT_FLOOR),
        "generic": -float((sentences @ bank.T).max()),                          # (S, K) -> max
        "off_role": off_role,
        "persona_recital": -hinge(float((card @ reply).max()), RECITAL_FLOOR),  # (C,) -> max
    }


def weighted_sum(features: dict[str, float], weights: dict[str, float]) -> float:
    return sum(weights[k] * features[k] for k in weights)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def logit(p: float) -> float:
    p = min(max(p, 1e-12), 1 - 1e-12)
    return math.log(p / (1 - p))
