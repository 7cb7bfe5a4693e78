"""Evaluation: how we measure whether MASCOT's agent group talks better than the alternatives.

Where this sits in the pipeline
-------------------------------
Last step. Phase I (persona-aligned speakers) and Phase II (the trained director) produce a
system; this module runs several systems on the same held-out contexts and simulated users, and
scores the conversations they produce. It has two parts:

1. Metrics: pure functions (the top section). Functions of strings, counts and tensors, each
   checked against hand-computed numbers in tests/test_metrics.py:
   - redundancy between agent turns of one conversation, as in the paper (Section "Redundancy"):
     NLI relation rates over pairs of agent turns (entailment = restating / agreeing,
     contradiction, neutral), Self-BLEU (Zhu et al. 2018, Texygen) for surface overlap, plus two
     extras of ours: distinct-n and an embedding-based "semantic redundancy rate";
   - LLM-as-judge rubric scores: reading the judge's answer robustly, rescaling it to 0-100 as
     the paper reports it;
   - statistics: percentile-bootstrap confidence intervals over conversations, and the exact
     two-sided binomial (sign) test the paper uses for pairwise preferences.
2. Systems and the evaluation run (the bottom section, `run`, tested in tests/test_evaluate.py):
   simulate every system on the same conversations, score them, print and write the tables.

Systems compared
----------------
The paper compares MASCOT with prompting baselines (zero-shot, zero-shot CoT, few-shot,
few-shot + CoT, self-consistency, SFT, MultiAgentESC) and two ablations: MASCOT-P (no persona
alignment: base speakers) and MASCOT-C (no director: random speaking order). We run the ones
this project can build (SYSTEMS below):

    zero-shot          base model, "You are {name}, {role}. Reply briefly.", personas in turn
    few-shot-cot       base model, our worked examples (data/fewshot.json) with a one-sentence
                       "Thinking:" before each "Reply:"; only the reply is kept (simulate.py)
    round-robin        base speakers with the full persona card, fixed order (MultiAgentESC-like)
    prompted-director  the untrained base model as director + base speakers
    mascot-p           trained director (RUN/stage2/director) + base speakers
    mascot-c           trained speakers (RUN/stage1/speakers) + random speaking order
    mascot             trained director + trained speakers

A system whose checkpoint is missing is skipped with a note, never stood in for. The simulated
user is the base model for every system, and conversation i of every system has the same
context, Big Five profile and sampling seeds, so differences come from the system alone.

What we simplify relative to the paper
--------------------------------------
- The paper's judges are GPT-4o, Gemma-3-27B-IT and Phi-4; its rubric texts, score scale and NLI
  model are not published. We use whatever `--judge` names, our own rubrics (AGENT_METRICS,
  COLLECTIVE_METRICS) on a 1-5 scale rescaled to 0-100, and whatever
  `AutoModelForSequenceClassification` NLI model `--nli-model` gives (labels read from its config).
- Agent-specific metrics are judged per agent turn and averaged over the conversation's agent
  turns; collective metrics once per conversation.
- The default offline judge is not an LLM and cannot read a rubric. It approximates two metrics
  (APPROXIMATIONS: persona consistency from its score, response relevance from its context
  feature), marked with * in the tables; every other rubric metric is shown as n/a.
- The paper crosses 50 contexts with 10 profiles (500 conversations). We take `--contexts`
  held-out contexts and assign `--profiles` round-robin (plan_conversations), which costs one
  conversation per context instead of ten.
- The Self-BLEU n-gram order is not published; we use Texygen's BLEU-4 setting (max_n=4).
- Pairwise preference comes from the judge, not from people (the paper asked humans).

How to run
----------
    python mascot.py evaluate --help                  # the flags, with defaults
    python mascot.py evaluate                         # every system with checkpoints, 8 contexts
    python mascot.py evaluate --profiles all --contexts 11 --systems round-robin,mascot
    python mascot.py evaluate --set meeting           # meeting contexts, sliced by domain
    python mascot.py evaluate --data ../shared/datasets/esconv/train.jsonl   # ESConv: held-out transfer
    python mascot.py evaluate --judge hf:HuggingFaceTB/SmolLM2-1.7B-Instruct --nli-model <folder>
    .venv/bin/python -m pytest -q tests/test_metrics.py tests/test_evaluate.py

ESConv as transfer: the speakers and director were trained on the bundled (or ED) contexts, so
`--data ...esconv...` evaluates them on a dataset they never saw (its held-out split, as for any
other source). Output: a table per metric group on stdout, slice tables (support valence,
meeting domain, profile), the pairwise line, and RUN/eval/{results.md, results.json,
transcripts.jsonl}.
"""

import argparse
import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

import director as dr
import models
from data import UserError, positive_int
from judge import JudgeState, make_judge, parse_ab
from simulate import SAFETY, USER, Cast, run_conversations


# =====================================================================================
# Metrics: pure functions
# =====================================================================================
# Everything in this section is a function of its arguments only: no files, no globals that
# change, no models loaded here (nli_rates is handed its model). That is what makes each one
# testable against a number computed by hand.


# -------------------------------------------------------------------------------------
# Tokens and n-grams (shared by Self-BLEU and distinct-n)
# -------------------------------------------------------------------------------------

# A word is a run of letters/digits, optionally joined by apostrophes ("don't", "user's");
# any other non-space character is a token by itself ("!", ",", "?").
_TOKEN_RE = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Split text into lower-case word and punctuation tokens.

    Texygen tokenises with nltk.word_tokenize. We keep the same idea (words and punctuation
    are separate tokens) with one regular expression and no dependency. Differences: we keep
    contractions whole ("don't" is one token, where NLTK gives "do" + "n't") and we lower-case,
    so "You" at the start of a turn and "you" inside one count as the same word: Self-BLEU is
    meant to measure repeated phrasing, not capitalisation. Curly apostrophes are mapped to
    straight ones first, because generated text mixes both.

    Args:
        text: any string.
    Returns:
        list of tokens, e.g. tokenize("Don’t worry, Sam!") == ["don't", "worry", ",", "sam", "!"]
    """
    return _TOKEN_RE.findall(text.replace("\u2019", "'").lower())


def ngram_counts(tokens: list[str], n: int) -> Counter:
    """Count the n-grams (as tuples) of one token list. Fewer than n tokens -> empty Counter."""
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


# -------------------------------------------------------------------------------------
# BLEU and Self-BLEU (Papineni et al. 2002; Zhu et al. 2018, Texygen)
# -------------------------------------------------------------------------------------

# NLTK SmoothingFunction().method1, which Texygen uses: a precision whose numerator is 0 becomes
# epsilon / (number of hypothesis n-grams), so one missing 4-gram does not zero the whole
# geometric mean (log 0). NLTK's default epsilon is 0.1.
SMOOTHING_EPSILON = 0.1


def modified_precision(hyp: list[str], refs: list[list[str]], n: int) -> tuple[int, int]:
    """BLEU's clipped n-gram precision, as a (numerator, denominator) pair of counts.

    Each hypothesis n-gram counts at most as often as it appears in the single reference that
    contains it most often ("clipping"), so "the the the" cannot score by repeating a common
    word. The denominator is max(1, number of hypothesis n-grams), as in NLTK, so a hypothesis
    shorter than n gets 0/1 (then smoothed), not a division by zero.

    Args:
        hyp: hypothesis tokens.
        refs: one or more reference token lists.
        n: n-gram order.
    Returns:
        (clipped matches, total hypothesis n-grams or 1).
    """
    hyp_counts = ngram_counts(hyp, n)
    max_ref_counts = Counter()
    for ref in refs:
        max_ref_counts |= ngram_counts(ref, n)  # Counter "|" is the element-wise max
    clipped = sum(min(count, max_ref_counts[gram]) for gram, count in hyp_counts.items())
    return clipped, max(1, sum(hyp_counts.values()))


def brevity_penalty(hyp_len: int, ref_lens: list[int]) -> float:
    """BLEU's brevity penalty against the reference length closest to the hypothesis length.

    Ties go to the shorter reference (NLTK's closest_ref_length). A hypothesis longer than that
    reference is not penalised; a shorter one gets exp(1 - r / c) < 1; an empty one gets 0.
    """
    closest = min(ref_lens, key=lambda ref_len: (abs(ref_len - hyp_len), ref_len))
    if hyp_len > closest:
        return 1.0
    if hyp_len == 0:
        return 0.0
    return math.exp(1.0 - closest / hyp_len)


def sentence_bleu(hyp_tokens: list[str], refs_tokens: list[list[str]], max_n: int = 4) -> float:
    """Sentence BLEU with uniform weights 1/max_n, written to match NLTK's sentence_bleu with
    SmoothingFunction().method1 (what Texygen calls).

        BLEU = BP * exp( (1/max_n) * sum_n log p_n )
        p_n  = clipped n-gram matches / hypothesis n-grams    (epsilon / hypothesis n-grams if 0)

    One rule we copy from NLTK on purpose: if not even one unigram matches, the score is exactly
    0, whatever the smoothing (with no shared word there is nothing to smooth). So two turns
    with no word in common score 0, and Self-BLEU is 0 only for word-disjoint texts.
    A consequence of the NLTK denominator rule worth knowing: a hypothesis shorter than max_n
    tokens has no 4-grams, gets p_4 = epsilon / 1, and scores below 1 even against an identical
    reference (a 3-token text scores 0.1 ** (1/4) = 0.56 against itself).

    Args:
        hyp_tokens: hypothesis tokens.
        refs_tokens: non-empty list of reference token lists.
        max_n: highest n-gram order (4 = BLEU-4).
    Returns:
        BLEU in [0, 1].
    """
    if not refs_tokens:
        raise ValueError("sentence_bleu needs at least one reference")
    precisions = [modified_precision(hyp_tokens, refs_tokens, n) for n in range(1, max_n + 1)]
    if precisions[0][0] == 0:  # no unigram match -> no n-gram match at all (NLTK returns 0)
        return 0.0
    log_p = [math.log((matches if matches > 0 else SMOOTHING_EPSILON) / total)
             for matches, total in precisions]
    bp = brevity_penalty(len(hyp_tokens), [len(ref) for ref in refs_tokens])
    return bp * math.exp(math.fsum(log_p) / max_n)  # uniform weights: a geometric mean


def self_bleu(texts: list[str], max_n: int = 4) -> float:
    """Self-BLEU (Zhu et al. 2018, Texygen): how much the texts repeat each other's phrasing.

    Each text in turn is the hypothesis and all the OTHER texts are its references (Texygen's
    get_bleu_parallel leaves the hypothesis out: with itself as a reference every score would
    be 1). The result is the mean sentence BLEU over hypotheses. Higher = more repeated
    phrasing = less lexical diversity. The paper applies it to the agent turns of one
    conversation.

    Args:
        texts: the agent turns of one conversation (raw strings; tokenised with tokenize()).
        max_n: highest n-gram order.
    Returns:
        mean BLEU in [0, 1]; 0.0 for fewer than 2 texts (nothing to repeat: no redundancy).

    Example:
        >>> self_bleu(["thank you for telling us this", "thank you for telling us this"])
        1.0
        >>> self_bleu(["good morning", "see you soon"])  # no shared word
        0.0
    """
    tokenized = [tokenize(text) for text in texts]
    if len(tokenized) < 2:
        return 0.0
    scores = [sentence_bleu(hyp, tokenized[:i] + tokenized[i + 1:], max_n)
              for i, hyp in enumerate(tokenized)]
    return sum(scores) / len(scores)


def distinct_n(texts: list[str], n: int) -> float:
    """distinct-n (Li et al. 2016): unique n-grams / all n-grams, pooled over the texts.

    N-grams are taken inside each text (none spans two texts); uniqueness is counted over the
    pool, so a phrase one agent repeats from another lowers the score.

    Args:
        texts: e.g. the agent turns of one conversation.
        n: n-gram order (1 and 2 are the usual reports).
    Returns:
        a ratio in [0, 1]; 0.0 when the texts contain no n-gram at all.
    """
    pooled = Counter()
    for text in texts:
        pooled += ngram_counts(tokenize(text), n)
    total = sum(pooled.values())
    return len(pooled) / total if total else 0.0


# -------------------------------------------------------------------------------------
# Pairwise preferences: exact binomial (sign) test, win rate
# -------------------------------------------------------------------------------------

def binomial_two_sided_p(k: int, n: int, p: float = 0.5) -> float:
    """Exact two-sided binomial test p-value, computed with exact fractions.

    Definition (the one scipy.stats.binomtest uses): the probability, under X ~ Binomial(n, p),
    of an outcome at most as likely as the one observed:
        p_value = sum of P(X = i) over all i with P(X = i) <= P(X = k).
    scipy compares floats with a relative tolerance of 1e-7 so that mirror-image outcomes count
    as ties; with Fractions the comparison is exact and needs no tolerance. The cost is big
    integers, which is fine for the few hundred conversations of an evaluation.

    Args:
        k: observed successes (e.g. wins of system A), 0 <= k <= n.
        n: trials (non-tie comparisons).
        p: success probability under the null; 0.5 = "neither system is preferred". A float is
           read as the shortest decimal that prints as it (0.3 -> 3/10), i.e. the number typed.
    Returns:
        p-value in [0, 1]; 1.0 when n == 0.

    Example: binomial_two_sided_p(9, 10) == 0.021484375  (= 22 / 1024: outcomes 0, 1, 9, 10).
    """
    if not 0 <= k <= n:
        raise ValueError(f"binomial test needs 0 <= k <= n, got k={k}, n={n}")
    if not 0 <= p <= 1:
        raise ValueError(f"binomial test needs 0 <= p <= 1, got p={p}")
    if n == 0:
        return 1.0
    prob = p if isinstance(p, Fraction) else Fraction(repr(float(p)))
    pmf = [math.comb(n, i) * prob ** i * (1 - prob) ** (n - i) for i in range(n + 1)]  # exact
    return float(min(Fraction(1), sum(q for q in pmf if q <= pmf[k])))


def win_rate(outcomes: list[str]) -> dict:
    """Summarise pairwise judgments of system A against system B.

    Ties are left out of the win rate and of the test (the classic sign test): a tie says
    nothing about which system is better, and counting it as half a win would pull every
    comparison towards 50%. Report the tie count beside the rate so the reader sees it.

    Args:
        outcomes: one of "A", "B", "tie" per conversation (A = the system being evaluated).
    Returns:
        {"wins": int, "losses": int, "ties": int,
         "win_rate": wins / (wins + losses), nan when every outcome is a tie,
         "p_value": exact two-sided binomial test of wins against p = 0.5 (1.0 when no non-tie)}.
    """
    counts = Counter(outcomes)
    unknown = set(counts) - {"A", "B", "tie"}
    if unknown:
        raise ValueError(f"win_rate outcomes must be 'A', 'B' or 'tie', got {sorted(unknown)}")
    wins, losses, ties = counts["A"], counts["B"], counts["tie"]
    decided = wins + losses
    return {"wins": wins, "losses": losses, "ties": ties,
            "win_rate": wins / decided if decided else float("nan"),
            "p_value": binomial_two_sided_p(wins, decided)}


# -------------------------------------------------------------------------------------
# Confidence intervals and score scales
# -------------------------------------------------------------------------------------

def bootstrap_ci(values: list[float], n_boot: int = 1000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float, float]:
    """Mean with a percentile-bootstrap confidence interval.

    Resample the items (conversations: the unit we drew at random, so the unit we resample)
    with replacement n_boot times, take each resample's mean, and report the alpha/2 and
    1 - alpha/2 quantiles of those means. A seeded numpy Generator makes the interval
    reproducible run to run.

    Args:
        values: one number per conversation (e.g. a rescaled judge score). NaN propagates.
        n_boot: number of bootstrap resamples.
        alpha: 0.05 -> a 95% interval.
        seed: seed of the resampling generator.
    Returns:
        (mean, low, high); (nan, nan, nan) for no values; (v, v, v) for one value.
    """
    data = np.asarray(values, dtype=float)  # (N,)
    if data.size == 0:
        return (float("nan"),) * 3
    if data.size == 1:
        return (float(data[0]),) * 3
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, data.size, size=(n_boot, data.size))  # (n_boot, N) resampled items
    means = data[idx].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(data.mean()), float(low), float(high)


def rescale_0_100(score: float, lo: float, hi: float) -> float:
    """Linearly map a rubric score on [lo, hi] to [0, 100], as the paper reports judge scores.

    Example: on a 1-5 rubric, 1 -> 0, 3 -> 50, 4 -> 75, 5 -> 100.
    """
    if hi <= lo:
        raise ValueError(f"rubric scale needs lo < hi, got lo={lo}, hi={hi}")
    if not lo <= score <= hi:
        raise ValueError(f"rubric score {score} is outside the scale [{lo}, {hi}]")
    return 100.0 * (score - lo) / (hi - lo)


# -------------------------------------------------------------------------------------
# Reading a judge's rubric answer
# -------------------------------------------------------------------------------------
# Judges are asked to end with "Score: N", but models wander: "**4**", "4/5", '{"score": 4}',
# "I'd give it a 4 out of 5". The parser collects every statement that LOOKS like a score and
# accepts the answer only if all of them agree. Only ASCII digits count: int() would accept
# Arabic-Indic or full-width digits but our prompts never ask for them, and a superscript "²"
# passes str.isdigit() yet makes int() raise.

_NUM = r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)(?![0-9])"  # an integer or decimal, not part of another
_QUOTES = r"[\s*_\"'`]*"  # markdown bold/italics, JSON or code quotes around a label or number
_LABELLED_RE = re.compile(
    r"\b(?:score|rating|grade)s?\b" + _QUOTES      # the label: Score, rating, "score", **Grade**
    + r"(?:[:=]|-(?=\s)|\bis\b|\bof\b)?" + _QUOTES  # separator: ':' '=' ' - ' 'is' 'of' or none
    + _NUM                                           # the number
    + r"(?:\s*(?:/|\bout\s+of\b)\s*" + _NUM + r")?",  # optional "/ 5" or "out of 5"
    re.IGNORECASE)
_FRACTION_RE = re.compile(_NUM + r"\s*(?:/|\bout\s+of\b)\s*" + _NUM, re.IGNORECASE)
_BOLD_RE = re.compile(r"\*\*\s*" + _NUM + r"\s*\*\*")
_BARE_RE = re.compile(r"[\s*_\"'`(\[]*" + _NUM + r"[\s*_\"'`)\].!]*")
_MAX_DIGITS = 6  # longer digit runs are out of range anyway; never int() a 5,000-digit string


def _score_value(number: str, lo: int, hi: int) -> int | None:
    """'4' -> 4 and '4.0' -> 4 when inside [lo, hi]; anything else (4.5, 0, 99999999) -> None."""
    whole, _, fraction = number.partition(".")
    if fraction.strip("0") or len(whole) > _MAX_DIGITS:
        return None
    value = int(whole)
    return value if lo <= value <= hi else None


def parse_rubric_score(text: str, lo: int = 1, hi: int = 5) -> int | None:
    """Read an integer rubric score in [lo, hi] from a judge's free-text answer.

    Recognised score statements (case-insensitive):
      - labelled: "Score: 4", "**Score:** 4", "Rating - 3", "score is 4", '{"score": 4}',
        "Final score: 4/5";
      - a fraction over the scale's top: "4/5", "4 out of 5" (fractions over anything else,
        like "1/2 of the points", are not scores and are ignored);
      - a bold number "**4**", or an answer that is nothing but the number ("4", " 4. ").
    Scale descriptions such as "(1-5)" or "1 to 5" are removed first, so "Rating (1-5): 4" reads 4.

    Which number wins when there are several: none unless they agree. "Score: 4/5" -> 4 (two
    statements, one value), but "5/5 ... no, 2/5" -> None: we cannot tell a self-correction
    from a quotation, and a silently wrong score is worse than a missing one, which the caller
    counts and reports. Likewise any out-of-range or non-integer statement ("Score: 7",
    "Score: 4.5", "8/10" after a label) makes the whole answer None.

    Args:
        text: the judge's answer. Never raises for any str; a non-str (e.g. None from a failed
              call) also gives None.
        lo, hi: the rubric scale.
    Returns:
        the score as an int in [lo, hi], or None when missing, out of range, contradictory
        or unreadable.
    """
    if not isinstance(text, str):
        return None
    # Drop scale descriptions "1-5", "(1 to 5)", "1–5": they mention lo and hi but are not scores.
    scale = re.compile(rf"\(?(?<![0-9.]){lo}\s*(?:-|–|—|to)\s*{hi}(?![0-9])\)?", re.IGNORECASE)
    text = scale.sub(" ", text)

    statements: list[int | None] = []  # one entry per score statement; None = invalid value
    for match in _LABELLED_RE.finditer(text):
        number, denominator = match.group(1), match.group(2)
        wrong_scale = denominator is not None and _score_value(denominator, hi, hi) is None
        statements.append(None if wrong_scale else _score_value(number, lo, hi))
    for match in _FRACTION_RE.finditer(text):
        if _score_value(match.group(2), hi, hi) is not None:  # only "x / hi" is a score
            statements.append(_score_value(match.group(1), lo, hi))
    for match in _BOLD_RE.finditer(text):
        statements.append(_score_value(match.group(1), lo, hi))
    bare = _BARE_RE.fullmatch(text)
    if bare:
        statements.append(_score_value(bare.group(1), lo, hi))

    # Accept only when there is at least one statement and all agree; an invalid statement
    # (None) either disagrees with a valid one or is the only value, so it yields None too.
    if len(set(statements)) != 1:
        return None
    return statements[0]


# -------------------------------------------------------------------------------------
# Semantic redundancy between agent turns: NLI relation rates (the paper) and embeddings (ours)
# -------------------------------------------------------------------------------------

def pairs_of_turns(texts: list) -> list[tuple[int, int]]:
    """All pairs (i, j) with i < j: premise = the earlier turn i, hypothesis = the later turn j.

    NLI is directional ("A entails B" is not "B entails A"), so a pair needs an order. The
    question the paper asks is whether a later agent turn merely restates or agrees with what
    was already said (entailment = redundancy / sycophancy) or contradicts it, so the earlier
    turn is the premise. Scoring both directions would double-count each pair and add a
    question (does the earlier turn follow from the later one?) that says nothing about
    redundancy. n texts -> n(n-1)/2 pairs, in conversation order.
    """
    n = len(texts)
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


NLI_RELATIONS = ("entailment", "contradiction", "neutral")


def nli_label_index(id2label: dict, model_name: str) -> dict[str, int]:
    """Find which output index of an NLI classifier means which relation.

    Checkpoints disagree on label order (roberta-large-mnli: contradiction, neutral,
    entailment; others start with entailment), so we read it from the config instead of
    assuming. Names match case-insensitively: "entail*", "contra*", "neutral".

    Returns:
        {"entailment": index, "contradiction": index, "neutral": index}.
    Raises:
        UserError naming the model when the labels are not exactly these three.
    """
    index: dict[str, int] = {}
    for idx, name in id2label.items():
        low = str(name).strip().lower()
        relation = ("entailment" if low.startswith("entail") else
                    "contradiction" if low.startswith("contra") else
                    "neutral" if low == "neutral" else None)
        if relation is None or relation in index:
            break
        index[relation] = int(idx)
    if len(index) != 3 or len(id2label) != 3:
        labels = [id2label[key] for key in sorted(id2label)]
        raise UserError(f"NLI model '{model_name}' has labels {labels}; it must have exactly "
                        "entailment / contradiction / neutral: pass an MNLI-style NLI model")
    return index


def nli_rates(texts: list[str], model, tokenizer, batch_size: int = 16) -> dict:
    """Entailment / contradiction / neutral rates over the (earlier, later) pairs of agent turns.

    The paper's semantic-redundancy measure (after Williams et al. 2018): high entailment =
    agents restate or agree with each other; high contradiction = disagreement (useful challenge
    or fragmented coordination); high neutral = new content (or off-topic: read it together with
    the relevance scores). Each pair gets the classifier's argmax label.

    Args:
        texts: the agent turns of one conversation, in order.
        model: any transformers AutoModelForSequenceClassification NLI model (put in eval mode
               here: dropout would make the labels random).
        tokenizer: its tokenizer; pairs are encoded as (premise, hypothesis) sentence pairs,
               truncated to the tokenizer's model_max_length.
        batch_size: pairs per forward pass.
    Returns:
        {"entailment": r, "contradiction": r, "neutral": r, "pairs": n}; the rates sum to 1,
        or are all 0.0 with pairs 0 for fewer than two turns.
    """
    model_name = model.config.name_or_path or type(model).__name__
    label_index = nli_label_index(model.config.id2label, model_name)  # fail fast on a wrong model
    pairs = pairs_of_turns(texts)
    if not pairs:
        return {**{relation: 0.0 for relation in NLI_RELATIONS}, "pairs": 0}

    model.eval()
    device = next(model.parameters()).device
    counts = torch.zeros(3, dtype=torch.long)  # (3,) predictions per output index
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            batch = pairs[start:start + batch_size]
            encoded = tokenizer([texts[i] for i, _ in batch], [texts[j] for _, j in batch],
                                padding=True, truncation=True, return_tensors="pt").to(device)
            logits = model(**encoded).logits  # (B, 3)
            counts += torch.bincount(logits.argmax(dim=-1).cpu(), minlength=3)
    rates = {relation: counts[label_index[relation]].item() / len(pairs)
             for relation in NLI_RELATIONS}
    return {**rates, "pairs": len(pairs)}


def _pairwise_cosines(embeddings: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every unordered pair (i < j) of L2-normalised rows.

    Args:
        embeddings: (N, D), each row of unit length.
    Returns:
        (N(N-1)/2,) similarities.
    """
    norms = embeddings.norm(dim=-1)  # (N,)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-3):
        raise ValueError("embeddings must be L2-normalised rows: "
                         "use torch.nn.functional.normalize(x, dim=-1)")
    sims = embeddings @ embeddings.T  # (N, N): dot product of unit vectors = cosine
    i, j = torch.triu_indices(len(embeddings), len(embeddings), offset=1)  # (2, N(N-1)/2)
    return sims[i, j]


def semantic_redundancy_rate(embeddings: torch.Tensor, threshold: float = 0.8) -> float:
    """Fraction of unordered pairs of agent turns that are near-paraphrases of each other.

    Our addition to the paper's metrics: a cheap, label-free check of "agents say the same
    thing in different words", which Self-BLEU misses. Why 0.8 for all-MiniLM-L6-v2 (mean-pooled,
    normalised): on a handful of our own support sentences, paraphrases ("You must feel so proud
    that you completed the marathon." / "It sounds like you are really proud of finishing that
    marathon.") scored 0.85-0.90, while complementary turns on the same topic (a question about
    the training, a suggestion to rest) scored 0.23-0.47. 0.8 sits between. Another embedding
    model needs its own threshold.

    Args:
        embeddings: (N, D) L2-normalised sentence embeddings of one conversation's agent turns.
        threshold: cosine similarity at or above which a pair counts as redundant.
    Returns:
        the fraction in [0, 1]; 0.0 for fewer than two turns (no pair, no redundancy).
    """
    if len(embeddings) < 2:
        return 0.0
    sims = _pairwise_cosines(embeddings)  # (P,)
    return (sims >= threshold).float().mean().item()


def mean_pairwise_similarity(embeddings: torch.Tensor) -> float:
    """Mean cosine similarity over unordered pairs of agent turns (higher = more alike).

    Args:
        embeddings: (N, D) L2-normalised sentence embeddings.
    Returns:
        the mean in [-1, 1]; nan for fewer than two turns (0.0 would wrongly read as
        "unrelated"), so callers skip such conversations.
    """
    if len(embeddings) < 2:
        return float("nan")
    return _pairwise_cosines(embeddings).mean().item()


# =====================================================================================
# Systems, conversations and the results tables (`python mascot.py evaluate`)
# =====================================================================================
# Everything below runs models. The protocol, in the order `run` follows it:
#   1. pick the held-out contexts and give each conversation a Big Five profile and a seed;
#   2. for each system, simulate all its conversations together (simulate.run_conversations),
#      with the SAME contexts, profiles and seeds as every other system;
#   3. score every conversation (judge rubrics, redundancy, crisis events), then report means
#      with bootstrap CIs over conversations, per system and per slice;
#   4. pairwise preference between two systems, conversation by conversation.


@dataclass(frozen=True)
class System:
    """One row of the results table: which speakers, which prompt, which speaking order."""
    name: str
    speakers: str     # "base" (the --model) | "trained" (RUN/stage1/speakers)
    order: str        # "round-robin" | "random" | "prompted-director" | "trained-director"
    style: str        # speaker prompt style (simulate.STYLES)
    about: str        # one line for the system list in results.md


SYSTEMS = (
    System("zero-shot", "base", "round-robin", "plain",
           "base model speaks each persona in turn from a plain prompt (name and role only)"),
    System("few-shot-cot", "base", "round-robin", "fewshot-cot",
           "base model, worked examples with one-sentence thinking (data/fewshot.json), reply kept"),
    System("round-robin", "base", "round-robin", "persona",
           "base speakers with the full persona card, fixed turn order (MultiAgentESC-style)"),
    System("prompted-director", "base", "prompted-director", "persona",
           "untrained LLM director (the base model) + base speakers"),
    System("mascot-p", "base", "trained-director", "persona",
           "trained director + base speakers (ablation: no persona alignment)"),
    System("mascot-c", "trained", "random", "persona",
           "trained speakers + random speaking order (ablation: no director)"),
    System("mascot", "trained", "trained-director", "persona",
           "trained director + trained speakers (the full system)"),
)
SYSTEM_NAMES = tuple(s.name for s in SYSTEMS)


@dataclass(frozen=True)
class Metric:
    """One column: a key in results.json, a title in the tables, and its rubric if judged."""
    key: str
    title: str
    rubric: str = ""   # what the judge is asked (rubric metrics only); our own text
    digits: int = 1    # decimals shown: 1 for 0-100 judge scores, 3 for rates in [0, 1]


# The paper's rubric texts are not published; these are ours. Each names what 1, 3 and 5 mean,
# because small judges score more consistently against anchored levels than against a bare scale.
AGENT_METRICS = (
    Metric("emotional_expressiveness", "emotional expressiveness",
           "Does the message show emotion that fits the persona and the moment? 1 = flat, robotic or "
           "mismatched; 3 = some fitting emotion, a little generic; 5 = natural, well-judged emotion."),
    Metric("empathetic_support", "empathetic support quality",
           "Does the message help the person feel understood or move them forward? 1 = dismissive, "
           "harmful or off-topic; 3 = kind but generic; 5 = specific, attuned support."),
    Metric("persona_consistency", "persona consistency",
           "Does the message do what this persona does, in its voice, and avoid what it never does? "
           "1 = acts like a different role; 3 = partly in role; 5 = clearly and only this persona."),
    Metric("response_relevance", "response relevance",
           "Does the message respond to the person's latest message and situation? 1 = ignores "
           "them; 3 = on topic but vague; 5 = directly addresses their specifics."),
    Metric("social_contribution", "social contribution",
           "Does the message add something the group has not said yet? 1 = repeats or contradicts "
           "the others pointlessly; 3 = adds a little; 5 = a clear new, useful contribution."),
    Metric("agent_overall", "agent overall",
           "Overall, how good is this message as this companion's turn in this group chat? "
           "1 = poor; 3 = acceptable; 5 = excellent."),
)
COLLECTIVE_METRICS = (
    Metric("persona_fidelity", "persona fidelity",
           "Do the companions stay distinct and true to their personas across the conversation? "
           "1 = they blur into one generic voice; 3 = partly distinct; 5 = each clearly itself."),
    Metric("originality_specificity", "originality & specificity",
           "Are the group's messages specific to this person and free of stock phrases? "
           "1 = generic platitudes; 3 = mixed; 5 = concrete and tailored throughout."),
    Metric("relevance_coherence", "relevance & coherence",
           "Does the conversation stay on the person's concern and build turn on turn? "
           "1 = disjointed or off-topic; 3 = mostly on topic, loosely connected; 5 = coherent."),
    Metric("engagement_quality", "engagement quality",
           "Would the person want to keep talking with this group? 1 = repetitive, tiring or "
           "off-putting; 3 = fine; 5 = engaging, with complementary voices."),
    Metric("collective_overall", "collective overall",
           "Overall, how good is this group conversation for the person? 1 = poor; 3 = acceptable; "
           "5 = excellent."),
)
RUBRIC_METRICS = AGENT_METRICS + COLLECTIVE_METRICS
REDUNDANCY_METRICS = (
    Metric("self_bleu", "Self-BLEU", digits=3),
    Metric("distinct_1", "distinct-1", digits=3),
    Metric("distinct_2", "distinct-2", digits=3),
    Metric("semantic_redundancy", "semantic redundancy", digits=3),
    Metric("mean_similarity", "mean similarity", digits=3),
    Metric("nli_entailment", "NLI entailment", digits=3),
    Metric("nli_contradiction", "NLI contradiction", digits=3),
    Metric("nli_neutral", "NLI neutral", digits=3),
)
ALL_METRICS = RUBRIC_METRICS + REDUNDANCY_METRICS
RUBRIC_LO, RUBRIC_HI = 1, 5
JUDGE_MAX_TOKENS = 32   # room for "Score: 4" and a few words a judge adds; cached, so cheap to re-run

# What a judge that cannot read rubrics (the offline judge, a reward model) stands in with.
# Only these two; every other rubric metric is reported as n/a rather than guessed.
APPROXIMATIONS = {
    "persona_consistency": "100 x the judge's score in [0, 1] of each agent turn given its persona "
                           "and the conversation before it, averaged over the conversation's agent turns",
    "response_relevance": "100 x max(0, cosine(agent turn, the user's latest message)), the offline "
                          "judge's context feature, averaged over agent turns",
}

AGENT_PROMPT = """You are rating one message in a group chat between a person and several AI companions.

The companion who wrote it: {name}, the {role}. {description}

Situation: {situation}

Conversation before the message:
{history}

{name}'s message: {reply}

Criterion: {title}. {rubric}
Rate the message on this criterion from 1 to 5. Answer with "Score: N" and nothing else."""

COLLECTIVE_PROMPT = """You are rating a whole group chat between a person and several AI companions.

The companions: {roster}

Situation: {situation}

Conversation:
{transcript}

Criterion: {title}. {rubric}
Rate the group's conversation on this criterion from 1 to 5. Answer with "Score: N" and nothing else."""

PAIRWISE_PROMPT = """Two groups of AI companions answered the same person in the same situation.

The companions: {roster}

Situation: {situation}

Conversation A:
{a}

Conversation B:
{b}

Which group served the person better: each companion in its own role, specific to the person,
not repeating each other, and helpful? Answer with A or B."""


# -------------------------------------------------------------------------------------
# Flags (mascot.py adds the common ones: --model, --run, --seed, --data, --set, --judge, ...)
# -------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `mascot.py evaluate`, on top of mascot.add_common (call that first)."""
    g = parser.add_argument_group("evaluate")
    g.add_argument("--systems", default="all",
                   help="comma-separated subset of " + ", ".join(SYSTEM_NAMES)
                        + "; 'all' = every system whose checkpoints exist")
    g.add_argument("--contexts", type=positive_int("--contexts"), default=8,
                   help="held-out contexts to evaluate on (8 keeps a CPU run to minutes)")
    g.add_argument("--profiles", default="average",
                   help="simulated-user profile ids (comma-separated), or 'all' = the 10 one-trait "
                        "profiles + average, assigned round-robin so each gets as many conversations")
    g.add_argument("--turns", type=positive_int("--turns"), default=4, help="agent turns per conversation")
    g.add_argument("--user-every", type=int, default=2,
                   help="the simulated user answers after every N agent turns")
    g.add_argument("--speakers", default=None,
                   help="trained speakers for mascot / mascot-c (default RUN/stage1/speakers)")
    g.add_argument("--director", default=None,
                   help="trained director for mascot / mascot-p (default RUN/stage2/director)")
    g.add_argument("--nli-model", default=None,
                   help="folder or hub id of an MNLI-style sequence classifier for the NLI "
                        "redundancy rates; skipped when not given")
    g.add_argument("--pairwise", default=None,
                   help="A,B: judge system A against system B per conversation "
                        "(default mascot,round-robin when both ran)")


# -------------------------------------------------------------------------------------
# Which conversations: held-out contexts x profiles, the same for every system
# -------------------------------------------------------------------------------------

def plan_conversations(contexts: list, n_contexts: int, profile_ids: list[str]) -> list[tuple]:
    """(context, profile id) of every conversation, identical for every system.

    The first n_contexts contexts are used; profiles are assigned round-robin (conversation i
    gets profile i mod P). With several profiles the number of conversations is rounded UP to a
    multiple of P, the contexts cycling, so each profile gets the same number of conversations
    (the paper crosses every context with every profile: 50 x 10; that is P times the cost).

    Example: 3 contexts c0..c2, profiles [p, q] -> (c0,p) (c1,q) (c2,p) (c0,q).
    """
    n_ctx = min(n_contexts, len(contexts))
    P = len(profile_ids)
    total = -(-n_ctx // P) * P                     # ceil(n_ctx / P) * P
    return [(contexts[i % n_ctx], profile_ids[i % P]) for i in range(total)]


def resolve_profiles(spec: str, profiles: dict) -> list[str]:
    """'all' -> every profile id in file order; 'a,b' -> those ids, checked."""
    if spec.strip() == "all":
        return list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in ids if p not in profiles]
    if not ids or unknown:
        raise UserError(f"--profiles {spec}: unknown profile id '{(unknown or [''])[0]}'; "
                        f"use 'all' or ids from the profiles file: {', '.join(profiles)}")
    return ids


def load_fewshot(path, persona_set: str) -> list[dict]:
    """The worked examples (with their 'thinking') of one persona set from data/fewshot.json."""
    path = Path(path)
    try:
        examples = json.loads(path.read_text(encoding="utf-8"))[persona_set]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise UserError(f"{path}: cannot read the '{persona_set}' few-shot examples ({type(err).__name__}); "
                        "restore data/fewshot.json from the repo") from None
    fields = ("situation", "user", "persona", "thinking", "reply")
    if not isinstance(examples, list) or not examples or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), str) for k in fields) for e in examples):
        raise UserError(f"{path}: '{persona_set}' must be a list of examples with "
                        + ", ".join(fields))
    return examples


# -------------------------------------------------------------------------------------
# Per-conversation metrics
# -------------------------------------------------------------------------------------

class MemoEncoder:
    """A sentence encoder that embeds each distinct text once per run.

    The offline judge's scores, its features and the redundancy metrics all embed the same agent
    turns, persona descriptions and user messages; on a CPU the encoder is the slow part of
    scoring, so the vectors are kept (384 floats per text: a few MB for a whole evaluation).
    Same interface as models.SentenceEncoder: embed(texts) -> (N, D) unit vectors.
    """

    def __init__(self, encoder):
        self.encoder = encoder
        self.vectors: dict[str, torch.Tensor] = {}

    def embed(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        todo = sorted({t for t in texts if t not in self.vectors}, key=len)  # similar lengths batch well
        if todo:
            self.vectors.update(zip(todo, self.encoder.embed(todo, batch_size)))
        if not texts:
            return self.encoder.embed([])                                    # (0, D)
        return torch.stack([self.vectors[t] for t in texts])                 # (N, D)


def agent_turn_states(conv, personas) -> list[tuple]:
    """(JudgeState, reply) for every agent turn: its persona, the user's latest message before
    it, and the conversation before it (the same view the stage-2 coherence reward uses)."""
    rows = []
    for i, turn in enumerate(conv.turns):
        if turn.speaker in (USER, SAFETY):
            continue
        persona = personas.find(turn.speaker)
        last_user = next((t.text for t in reversed(conv.turns[:i]) if t.speaker == USER), "")
        state = JudgeState(persona.name, f"{persona.role}: {persona.description}", last_user,
                           [{"speaker": t.speaker, "text": t.text} for t in conv.turns[:i]],
                           conv.context.situation)
        rows.append((state, turn.text))
    return rows


def _lines(turns) -> str:
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns)


def rubric_scores(conv, personas, judge) -> tuple[dict, Counter]:
    """Every rubric metric of one conversation from an LLM judge, on 0-100.

    Agent-specific metrics: one prompt per (agent turn, metric), the scores averaged over the
    conversation's agent turns. Collective metrics: one prompt per metric on the whole transcript.
    judge.complete decodes greedily (temperature 0, as in the paper). An answer that
    parse_rubric_score cannot read is counted in the returned Counter and left out of the mean;
    a metric with no readable answer at all is None for this conversation, and so is every
    metric of a conversation without agent turns (nothing of the system's to judge).

    Returns:
        ({metric key: score in [0, 100] or None}, Counter {metric key: unparseable answers}).
    """
    values, unparseable = {}, Counter()
    agent_idx = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    for m in AGENT_METRICS:
        scores = []
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            prompt = AGENT_PROMPT.format(name=p.name, role=p.role, description=p.description,
                                         situation=conv.context.situation,
                                         history=_lines(conv.turns[:i]), reply=conv.turns[i].text,
                                         title=m.title, rubric=m.rubric)
            score = parse_rubric_score(judge.complete(prompt, max_new_tokens=JUDGE_MAX_TOKENS),
                                       RUBRIC_LO, RUBRIC_HI)
            if score is None:
                unparseable[m.key] += 1
            else:
                scores.append(rescale_0_100(score, RUBRIC_LO, RUBRIC_HI))
        values[m.key] = sum(scores) / len(scores) if scores else None
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for m in COLLECTIVE_METRICS:
        if not agent_idx:               # stopped by the crisis guard before any agent spoke
            values[m.key] = None
            continue
        prompt = COLLECTIVE_PROMPT.format(roster=roster, situation=conv.context.situation,
                                          transcript=_lines(conv.turns), title=m.title, rubric=m.rubric)
        score = parse_rubric_score(judge.complete(prompt, max_new_tokens=JUDGE_MAX_TOKENS),
                                   RUBRIC_LO, RUBRIC_HI)
        if score is None:
            unparseable[m.key] += 1
        values[m.key] = None if score is None else rescale_0_100(score, RUBRIC_LO, RUBRIC_HI)
    return values, unparseable


def approximate_scores(convs, personas, judge) -> list[dict]:
    """What a judge that cannot read rubrics can still say, per conversation (APPROXIMATIONS).

    One batched judge.score_many over the agent turns of all conversations. Returns per
    conversation {"judge_score": mean score in [0, 1] (also used for pairwise preference),
    "persona_consistency": 0-100, and "response_relevance": 0-100 when the judge exposes its
    features (OfflineJudge.features_many)}; values are None for a conversation without agent turns.
    """
    rows = [agent_turn_states(c, personas) for c in convs]
    flat = [r for conv_rows in rows for r in conv_rows]
    states, replies = [s for s, _ in flat], [r for _, r in flat]
    scores = judge.score_many(states, replies) if flat else []
    relevance = None
    if flat and hasattr(judge, "features_many"):
        relevance = [max(0.0, f["context"]) for f in judge.features_many(states, replies)]
    out, start = [], 0
    for conv_rows in rows:
        end = start + len(conv_rows)
        s = scores[start:end]
        mean = sum(s) / len(s) if s else None
        rec = {"judge_score": mean, "persona_consistency": None if mean is None else rescale_0_100(mean, 0, 1)}
        if relevance is not None:
            r = relevance[start:end]
            rec["response_relevance"] = rescale_0_100(sum(r) / len(r), 0, 1) if r else None
        out.append(rec)
        start = end
    return out


def redundancy_scores(convs, encoder, nli=None) -> list[dict]:
    """The automatic metrics over each conversation's agent turns (one encoder call in all).

    nli: None, or (model, tokenizer) of an NLI classifier for the entailment / contradiction /
    neutral rates. mean_similarity and the NLI rates are None for fewer than two agent turns
    (no pair: no evidence either way), and every metric is None for a conversation without agent
    turns (the crisis guard stopped it at the opening): "no repetition" would flatter the system.
    """
    texts = [[t.text for t in c.agent_turns()] for c in convs]
    vectors = encoder.embed([t for ts in texts for t in ts])             # (sum of turns, D)
    out, start = [], 0
    for ts in texts:
        emb = vectors[start:start + len(ts)]                             # (n_turns, D)
        start += len(ts)
        if not ts:
            out.append({m.key: None for m in REDUNDANCY_METRICS if nli is not None or not m.key.startswith("nli_")})
            continue
        sim = mean_pairwise_similarity(emb) if len(ts) >= 2 else float("nan")
        rec = {"self_bleu": self_bleu(ts), "distinct_1": distinct_n(ts, 1), "distinct_2": distinct_n(ts, 2),
               "semantic_redundancy": semantic_redundancy_rate(emb),
               "mean_similarity": None if math.isnan(sim) else sim}
        if nli is not None:
            rates = nli_rates(ts, *nli)
            for relation in NLI_RELATIONS:
                rec[f"nli_{relation}"] = rates[relation] if rates["pairs"] else None
        out.append(rec)
    return out


def score_conversations(convs, personas, judge, encoder, nli=None) -> tuple[list[dict], Counter]:
    """One record per conversation: what it was (context, profile, slices), its metrics, its
    crisis events; plus the count of unparseable judge answers (LLM judges only)."""
    records = [{"index": i, "context_id": c.context.id, "profile": c.profile,
                "valence": c.context.valence, "domain": c.context.domain, "metrics": {},
                "crisis_events": sum(e.get("type") == "crisis" for e in c.events),
                "agent_turns": len(c.agent_turns())} for i, c in enumerate(convs)]
    unparseable = Counter()
    if judge.can_generate:
        for rec, conv in zip(records, convs):
            values, bad = rubric_scores(conv, personas, judge)
            rec["metrics"].update(values)
            unparseable += bad
    else:
        for rec, approx in zip(records, approximate_scores(convs, personas, judge)):
            rec["judge_score"] = approx.pop("judge_score")    # kept for the pairwise comparison
            rec["metrics"].update(approx)
    for rec, values in zip(records, redundancy_scores(convs, encoder, nli)):
        rec["metrics"].update(values)
    return records, unparseable


# -------------------------------------------------------------------------------------
# Pairwise preference
# -------------------------------------------------------------------------------------

def pairwise_outcomes(convs_a: list, convs_b: list, judge, personas,
                      scores_a: list | None = None, scores_b: list | None = None) -> tuple[list[str], int]:
    """Which system's conversation is better, conversation index by conversation index.

    LLM judge (judge.can_generate): PAIRWISE_PROMPT twice, with A shown first and then B shown
    first; the outcome counts only when both orders pick the same system, otherwise it is a tie
    (the judge followed the position, not the content; Zheng et al. 2023). An unreadable answer
    also gives a tie and is counted.
    Any other judge (offline, reward model): compare the mean judge score of each conversation's
    agent turns (scores_a / scores_b, from approximate_scores); the rule does not look at an
    order, so it is symmetric by construction; equal means are a tie.

    Returns:
        (outcomes "A" | "B" | "tie" per conversation, number of unreadable judge answers).
    """
    outcomes, unreadable = [], 0
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for i, (a, b) in enumerate(zip(convs_a, convs_b)):
        if not judge.can_generate:
            sa, sb = scores_a[i], scores_b[i]
            if sa is None or sb is None or sa == sb:
                outcomes.append("tie")
            else:
                outcomes.append("A" if sa > sb else "B")
            continue
        text_a, text_b = _lines(a.turns), _lines(b.turns)
        first = parse_ab(judge.complete(PAIRWISE_PROMPT.format(roster=roster, situation=a.context.situation,
                                                               a=text_a, b=text_b), max_new_tokens=8))
        second = parse_ab(judge.complete(PAIRWISE_PROMPT.format(roster=roster, situation=a.context.situation,
                                                                a=text_b, b=text_a), max_new_tokens=8))
        unreadable += (first is None) + (second is None)
        pick_first = {0: "A", 1: "B"}.get(first)        # A was shown first
        pick_second = {0: "B", 1: "A"}.get(second)      # B was shown first
        outcomes.append(pick_first if pick_first is not None and pick_first == pick_second else "tie")
    return outcomes, unreadable


# -------------------------------------------------------------------------------------
# Aggregation: means with bootstrap CIs, per system and per slice
# -------------------------------------------------------------------------------------

OK, APPROXIMATED = "ok", "approximated"


def metric_status(judge, nli_given: bool) -> dict[str, str]:
    """For every metric: "ok", "approximated", or the reason it has no number (shown in tables)."""
    status = {}
    kind = judge.name.split(":")[0]
    for m in RUBRIC_METRICS:
        if judge.can_generate:
            status[m.key] = OK
        elif m.key == "persona_consistency" or (m.key == "response_relevance" and hasattr(judge, "features_many")):
            status[m.key] = APPROXIMATED
        else:
            status[m.key] = f"n/a ({kind} judge)"
    for m in REDUNDANCY_METRICS:
        status[m.key] = OK if nli_given or not m.key.startswith("nli_") else "skipped (no --nli-model)"
    return status


def summarise(values: list, seed: int) -> dict:
    """Mean and 95% bootstrap CI of the per-conversation values; None (no score) is left out."""
    kept = [v for v in values if v is not None]
    mean, lo, hi = bootstrap_ci(kept, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(kept)}


def aggregate(records: list[dict], status: dict[str, str], seed: int) -> dict:
    """{metric key: summary + status} over the conversation records of one system (or slice)."""
    out = {}
    for m in ALL_METRICS:
        if status[m.key] in (OK, APPROXIMATED):
            out[m.key] = {**summarise([r["metrics"].get(m.key) for r in records], seed),
                          "status": status[m.key]}
        else:
            out[m.key] = {"status": status[m.key]}
    return out


def slice_fields(persona_set: str, records: list[dict]) -> list[str]:
    """Which slices to report: valence (support), domain (meeting), profile (several profiles)."""
    fields = []
    if persona_set == "support" and any(r["valence"] for r in records):
        fields.append("valence")
    if persona_set == "meeting" and any(r["domain"] for r in records):
        fields.append("domain")
    if len({r["profile"] for r in records}) > 1:
        fields.append("profile")
    return fields


def slices(records: list[dict], fields: list[str], status: dict[str, str], seed: int) -> dict:
    """{field: {value: {"n", "metrics"}}}: aggregate() within each valence / domain / profile."""
    out = {}
    for field in fields:
        out[field] = {}
        for value in sorted({r[field] or "-" for r in records}):
            group = [r for r in records if (r[field] or "-") == value]
            out[field][value] = {"n": len(group), "metrics": aggregate(group, status, seed)}
    return out


# -------------------------------------------------------------------------------------
# Tables (markdown: printed, and written to RUN/eval/results.md)
# -------------------------------------------------------------------------------------

def format_cell(summary: dict, digits: int, n_rows: int) -> str:
    """'mean [lo, hi]', with '(n=k)' when only k of the row's n_rows conversations have a value
    (no agent turn, or no readable judge answer); or the reason there is no number."""
    if summary["status"] not in (OK, APPROXIMATED):
        return summary["status"]
    if summary["n"] == 0:
        return "n/a (no score)"
    d = digits
    cell = f"{summary['mean']:.{d}f} [{summary['lo']:.{d}f}, {summary['hi']:.{d}f}]"
    return cell if summary["n"] == n_rows else f"{cell} (n={summary['n']})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":--" if i < 5 else "--:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def column_title(m: Metric, status: dict[str, str]) -> str:
    return m.title + ("*" if status[m.key] == APPROXIMATED else "")


def system_columns(entry: dict) -> list[str]:
    return [entry["speakers"], entry["director"], entry["judge"]]


def results_markdown(results: dict) -> str:
    """The whole report: protocol line, three metric tables, slice tables, pairwise, notes."""
    status = results["status"]
    systems = results["systems"]
    head = ["system", "speakers", "director", "judge", "n"]
    out = ["# Evaluation", "", results["protocol"]["summary"], ""]
    out += [f"- **{name}**: {e['about']}" for name, e in systems.items()] + [""]
    groups = [("Agent-specific (judge rubric, 0-100, mean over agent turns)", AGENT_METRICS),
              ("Collective (judge rubric, 0-100, whole conversation)", COLLECTIVE_METRICS),
              ("Redundancy over agent turns (automatic) and crisis events", REDUNDANCY_METRICS)]
    for title, metrics in groups:
        shown = [m for m in metrics if not status[m.key].startswith("skipped")]
        header = head + [column_title(m, status) for m in shown]
        if metrics is REDUNDANCY_METRICS:
            header.append("crisis events")
        rows = []
        for name, e in systems.items():
            row = [name] + system_columns(e) + [str(e["n"])]
            row += [format_cell(e["metrics"][m.key], m.digits, e["n"]) for m in shown]
            if metrics is REDUNDANCY_METRICS:
                row.append(str(e["crisis_events"]))
            rows.append(row)
        out += [f"## {title}", "", markdown_table(header, rows), ""]
    headline = [m for m in ALL_METRICS if m.key in HEADLINE and status[m.key] in (OK, APPROXIMATED)]
    for field in results["slice_fields"]:
        rows = []
        for name, e in systems.items():
            for value, sl in e["slices"][field].items():
                rows.append([name] + system_columns(e) + [value, str(sl["n"])]
                            + [format_cell(sl["metrics"][m.key], m.digits, sl["n"]) for m in headline])
        header = head[:4] + [field, "n"] + [column_title(m, status) for m in headline]
        out += [f"## Per {field}", "", markdown_table(header, rows), ""]
    out += ["## Pairwise preference", "", results["pairwise"]["line"], ""]
    out += ["## Notes", ""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(out) + "\n"


# The metrics the slice tables show (the full set per slice is in results.json).
HEADLINE = ("agent_overall", "collective_overall", "persona_consistency", "response_relevance",
            "self_bleu", "distinct_2", "semantic_redundancy", "nli_entailment")


def _json_safe(value):
    """NaN is not JSON: write null instead (an empty CI, a win rate with no decided pair)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# -------------------------------------------------------------------------------------
# The run
# -------------------------------------------------------------------------------------

def choose_systems(spec: str, has_speakers: bool, has_director: bool,
                   speakers_dir: str, director_dir: str) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped} for those whose checkpoints are missing."""
    names = list(SYSTEM_NAMES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEM_NAMES]
    if not names or unknown:
        raise UserError(f"--systems {spec}: unknown system '{(unknown or [''])[0]}'; "
                        f"use 'all' or a comma-separated subset of {', '.join(SYSTEM_NAMES)}")
    chosen, skipped = [], {}
    for system in SYSTEMS:
        if system.name not in names:
            continue
        if system.speakers == "trained" and not has_speakers:
            skipped[system.name] = (f"no trained speakers at {speakers_dir} "
                                    "(run: python mascot.py train --stage 1, or pass --speakers)")
        elif system.order == "trained-director" and not has_director:
            skipped[system.name] = (f"no trained director at {director_dir} "
                                    "(run: python mascot.py train --stage 2, or pass --director)")
        else:
            chosen.append(system)
    return chosen, skipped


def load_nli(name: str, device: str):
    """(model, tokenizer) of an MNLI-style classifier, checked for the three labels up front."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSequenceClassification.from_pretrained(name).to(device).eval()
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"--nli-model {name}: cannot load it ({first}); pass a local folder of an "
                        "MNLI-style sequence classifier") from None
    nli_label_index(model.config.id2label, name)
    return model, tok


def result_notes(entries: dict, judge, status: dict[str, str], nli_given: bool, seed: int) -> list[str]:
    """The notes under the tables: what is approximated or missing, and how to read the numbers."""
    notes = []
    if judge.can_generate:
        convs = [r for e in entries.values() for r in e["conversations"]]
        asked = (sum(r["agent_turns"] for r in convs) * len(AGENT_METRICS)
                 + sum(r["agent_turns"] > 0 for r in convs) * len(COLLECTIVE_METRICS))
        bad = sum(sum(e["unparseable"].values()) for e in entries.values())
        notes.append(f"unparseable judge answers: {bad} of {asked}, left out of the means "
                     "(per system and metric in results.json)")
    else:
        approx = [m for m in RUBRIC_METRICS if status[m.key] == APPROXIMATED]
        notes.append(f"* approximated: the {judge.name.split(':')[0]} judge ({judge.name}) cannot read rubrics, so "
                     + "; ".join(f"{m.title} = {APPROXIMATIONS[m.key]}" for m in approx)
                     + ". Every other rubric metric is n/a: it needs an LLM judge "
                       "(--judge hf:<model or folder> or openai:<base url>).")
    silent = {n: sum(r["agent_turns"] == 0 for r in e["conversations"]) for n, e in entries.items()}
    if any(silent.values()):
        notes.append("conversations the crisis guard stopped before any agent spoke count in n and in "
                     "crisis events but have no agent-turn metrics: "
                     + ", ".join(f"{n} {k}" for n, k in silent.items()))
    if not nli_given:
        notes.append("NLI relation rates skipped: no --nli-model given (any MNLI-style classifier folder)")
    for name, e in entries.items():
        if "directives" in e:
            notes.append(f"{name}: {e['invalid_directives']} of {e['directives']} directives unparseable "
                         "(the least-spoken agent spoke instead)")
    notes.append("lower Self-BLEU, semantic redundancy (share of agent-turn pairs with cosine >= 0.8), "
                 "mean similarity and NLI entailment = less repetition; higher distinct-n = more varied wording")
    notes.append(f"[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples, seed {seed})")
    return notes


def run(args) -> dict:
    """`python mascot.py evaluate`: run the systems, score them, print and write the tables.

    Writes RUN/eval/{config.json, transcripts.jsonl, results.json, results.md} and returns the
    results dict (what results.json holds).
    """
    import mascot   # imported here: mascot.py imports this module to wire the command

    t_start = time.time()
    out = Path(args.run) / "eval"
    mascot.log_config(args, out)
    personas, _, held, profiles = mascot.load_inputs(args)
    notes = []

    # 1. Systems whose checkpoints exist.
    speakers_dir = args.speakers or str(Path(args.run) / "stage1" / "speakers")
    director_dir = args.director or str(Path(args.run) / "stage2" / "director")
    has_speakers = args.speakers is not None or (Path(speakers_dir) / "config.json").exists()
    has_director = args.director is not None or (Path(director_dir) / "config.json").exists()
    systems, skipped = choose_systems(args.systems, has_speakers, has_director, speakers_dir, director_dir)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
        notes.append(f"skipped **{name}**: {why}")
    if not systems:
        raise UserError(f"--systems {args.systems}: none of these systems can run; "
                        + "; ".join(f"{n}: {w}" for n, w in skipped.items()))

    # 2. The conversations every system gets: same contexts, profiles and seeds.
    profile_ids = resolve_profiles(args.profiles, profiles)
    plan = plan_conversations(held, args.contexts, profile_ids)
    if args.contexts > len(held):
        notes.append(f"asked for {args.contexts} contexts, the held-out split has {len(held)}: all are used")
    if len(plan) > min(args.contexts, len(held)):
        notes.append(f"{len(plan)} conversations (contexts cycle) so each of the {len(profile_ids)} "
                     "profiles gets the same number")
    contexts, conv_profiles = [c for c, _ in plan], [p for _, p in plan]

    # 3. Models: the base model is the simulated user of EVERY system and the base speakers.
    base = models.load_model(args.model, device=args.device)
    trained_speakers = (models.load_model(speakers_dir, device=args.device)
                        if any(s.speakers == "trained" for s in systems) else None)
    trained_director = (models.load_model(director_dir, device=args.device)
                        if any(s.order == "trained-director" for s in systems) else None)
    fewshot = load_fewshot(mascot.ROOT / "data" / "fewshot.json", args.set) \
        if any(s.style == "fewshot-cot" for s in systems) else []
    encoder = MemoEncoder(models.SentenceEncoder(device=args.device))
    judge_extra = {"encoder": encoder} if args.judge.strip() == "offline" else {}
    cache = None if args.judge.strip() == "offline" else out / "judge_cache.jsonl"
    judge = make_judge(args.judge, cache_path=cache, model_name=args.judge_model, **judge_extra)
    nli = load_nli(args.nli_model, args.device) if args.nli_model else None
    status = metric_status(judge, nli is not None)

    def speakers_label(system):
        where = speakers_dir if system.speakers == "trained" else args.model
        return f"{system.speakers}: {where}, {system.style} prompt"

    def director_label(system):
        return {"round-robin": "round-robin", "random": "random order",
                "prompted-director": f"prompted: {args.model}",
                "trained-director": f"trained: {director_dir}"}[system.order]

    # 4. Simulate and score, one system at a time (all its conversations advance together).
    transcripts = out / "transcripts.jsonl"
    transcripts.write_text("", encoding="utf-8")
    entries, convs_by_system, sim_seconds, metric_seconds = {}, {}, 0.0, 0.0
    for system in systems:
        t0 = time.time()
        speaker_model, speaker_tok = trained_speakers if system.speakers == "trained" else base
        cast = Cast(personas, speaker_model, speaker_tok, base[0], base[1], args.max_new_tokens,
                    style=system.style, examples=fewshot if system.style == "fewshot-cot" else [])
        if system.order == "round-robin":
            policy = dr.RoundRobin(personas)
        elif system.order == "random":
            policy = dr.RandomOrder(personas, args.seed)
        else:
            model, tok = base if system.order == "prompted-director" else trained_director
            policy = dr.LLMDirector(model, tok, personas, name=system.order)
        convs = run_conversations(contexts, policy, cast, profiles, conv_profiles, args.turns,
                                  args.user_every, args.seed)
        t1 = time.time()
        with open(transcripts, "a", encoding="utf-8") as f:
            for i, c in enumerate(convs):
                f.write(json.dumps({"system": system.name, "index": i, **c.to_json()}, ensure_ascii=False) + "\n")

        records, unparseable = score_conversations(convs, personas, judge, encoder, nli)
        t2 = time.time()
        sim_seconds += t1 - t0
        metric_seconds += t2 - t1

        entry = {"about": system.about, "speakers": speakers_label(system), "director": director_label(system),
                 "judge": judge.name, "n": len(convs), "seconds_simulate": round(t1 - t0, 1),
                 "seconds_metrics": round(t2 - t1, 1),
                 "metrics": aggregate(records, status, args.seed),
                 "unparseable": dict(unparseable),
                 "crisis_events": sum(r["crisis_events"] for r in records),
                 "crisis_conversations": sum(r["crisis_events"] > 0 for r in records),
                 "conversations": records}
        if isinstance(policy, dr.LLMDirector):
            entry["invalid_directives"], entry["directives"] = policy.invalid, policy.total
        entries[system.name] = entry
        convs_by_system[system.name] = convs
        print(f"{system.name}: {len(convs)} conversations simulated in {t1 - t0:.1f} s, "
              f"scored in {t2 - t1:.1f} s", flush=True)

    # 5. Slices: the same aggregation within each valence / domain / profile.
    fields = slice_fields(args.set, entries[systems[0].name]["conversations"])
    for entry in entries.values():
        entry["slices"] = slices(entry["conversations"], fields, status, args.seed)

    # 6. Pairwise preference.
    pairwise = run_pairwise(args.pairwise, convs_by_system, entries, judge, personas)

    # 7. Notes, then the tables.
    notes += result_notes(entries, judge, status, nli is not None, args.seed)
    total = time.time() - t_start
    notes.append(f"time: {total:.0f} s in all ({sim_seconds:.0f} s simulating, {metric_seconds:.0f} s scoring, "
                 f"the rest loading models and judging pairs) on {args.device}")
    n_ctx = len({c.id for c in contexts})
    summary = (f"{len(plan)} conversations per system on {n_ctx} held-out '{args.set}' contexts from "
               f"`{args.data}` (seed {args.seed}, held-out fraction {args.held_out}); simulated user: "
               f"{args.model} with profile(s) {', '.join(profile_ids)}; {args.turns} agent turns, user every "
               f"{args.user_every}; every system sees the same contexts, profiles and sampling seeds.")
    results = {"protocol": {"summary": summary, "contexts": [c.id for c in contexts], "profiles": conv_profiles,
                            "turns": args.turns, "user_every": args.user_every, "seed": args.seed,
                            "model": args.model, "data": args.data, "set": args.set},
               "judge": judge.name, "status": status,
               "approximations": {k: APPROXIMATIONS[k] for k, v in status.items() if v == APPROXIMATED},
               "systems": entries, "skipped": skipped, "slice_fields": fields, "pairwise": pairwise,
               "notes": notes, "seconds": round(total, 1)}
    text = results_markdown(results)
    (out / "results.md").write_text(text, encoding="utf-8")
    (out / "results.json").write_text(json.dumps(_json_safe(results), indent=1, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    print(text, flush=True)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {transcripts}", flush=True)
    return results


def run_pairwise(spec: str | None, convs_by_system: dict, entries: dict, judge, personas) -> dict:
    """Pairwise preference of system A over system B (--pairwise A,B; default mascot,round-robin)."""
    if spec:
        names = [s.strip() for s in spec.split(",")]
        if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
            raise UserError(f"--pairwise {spec}: give two different systems as A,B, from "
                            + ", ".join(SYSTEM_NAMES))
    else:
        names = ["mascot", "round-robin"]
    a, b = names
    missing = [n for n in names if n not in convs_by_system]
    if missing:
        return {"a": a, "b": b, "line": f"pairwise {a} vs {b}: not run ({', '.join(missing)} did not run)"}
    scores = {n: [r.get("judge_score") for r in entries[n]["conversations"]] for n in names}
    outcomes, unreadable = pairwise_outcomes(convs_by_system[a], convs_by_system[b], judge, personas,
                                             scores[a], scores[b])
    stats = win_rate(outcomes)
    how = ("asked in both presentation orders, a win only when both agree" if judge.can_generate
           else "the conversation whose agent turns have the higher mean judge score wins; order plays no part")
    rate = "n/a, every pair tied" if math.isnan(stats["win_rate"]) else f"{stats['win_rate']:.3f}"
    line = (f"**{a} vs {b}**, {len(outcomes)} conversation pairs: {a} wins {stats['wins']}, loses "
            f"{stats['losses']}, ties {stats['ties']}; win rate {rate} (ties left out); exact two-sided "
            f"binomial p = {stats['p_value']:.4g}. Judge {judge.name}: {how}.")
    if unreadable:
        line += f" {unreadable} unreadable judge answers made ties."
    return {"a": a, "b": b, "outcomes": outcomes, **stats, "unreadable": unreadable, "line": line}
