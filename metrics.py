"""metrics.py: every number the evaluation and the rewards compute, as small pure functions.

Where it sits in MASCOT (arXiv 2601.14230): the paper measures redundancy between the agent turns
of one conversation (NLI relation rates and Self-BLEU), reports judge rubrics rescaled to 0-100,
tests pairwise human preferences with an exact sign test and Likert ratings with Mann-Whitney U.
Those formulas live here, together with the few statistics the training logs print (a standard
error, a paired change) and the agreement between annotators (kappa), so that `evaluate.py`,
`human.py`, `director.py` (the group reward) and `judge.py` share one definition of each.

Everything in this file is a function of its arguments only: no files, no project imports, no
model loaded here (nli_rates is handed its model). That is what makes each one testable against a
number computed by hand (tests/test_metrics.py).

    tokenize, ngram_counts, sentence_bleu, self_bleu, distinct_n      surface overlap
    binomial_two_sided_p, win_rate, bootstrap_ci, standard_error,     statistics
    paired_change
    mann_whitney_u, cohen_kappa, fleiss_kappa                         the human studies
    rescale_0_100, parse_rubric_score, parse_ab                       reading a judge's answer
    pairs_of_turns, nli_label_index, nli_rates                        NLI relation rates
    semantic_redundancy_rate, mean_pairwise_similarity                embedding redundancy
    entropy_bits, mutual_information_bits, chi_square_statistic,      does a choice depend on a
    chi2_sf, permutation_p_value                                      feature (director collapse)

Run the tests:  .venv/bin/python -m pytest -q tests/test_metrics.py
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import torch


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


# Words that carry no content of their own, for counting what a turn adds (director.py) and what
# keyword stuffing piles up (hacks.py).
STOPWORDS = frozenset("""a an the and or but if so to of in on at for with from by as is are was were be been
being am i you he she it we they me him her us them my your his its our their this that these those
do does did have has had not no yes just very really can could would should will shall may might
must what which who whom how why when where there here all any some more most much many such than
too also only own same about into over under again then once now feel feeling""".split())


def content_words(text: str) -> set[str]:
    """The set of lower-case words of 3+ letters that are not STOPWORDS."""
    return {w for w in re.findall(r"[a-z']+", text.lower()) if w not in STOPWORDS and len(w) > 2}


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
_STARS_RE = re.compile(_NUM + r"\s*stars?\b", re.IGNORECASE)   # "Your response is 5 stars." (SmolLM2)
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
      - a bold number "**4**", stars "4 stars", or an answer that is nothing but the number ("4", " 4. ").
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
    for match in _STARS_RE.finditer(text):
        statements.append(_score_value(match.group(1), lo, hi))
    bare = _BARE_RE.fullmatch(text)
    if bare:
        statements.append(_score_value(bare.group(1), lo, hi))

    # Accept only when there is at least one statement and all agree; an invalid statement
    # (None) either disagrees with a valid one or is the only value, so it yields None too.
    if len(set(statements)) != 1:
        return None
    return statements[0]


_LABEL_NAME = r"(?:(?i:reply|response|answer|option|choice)\s+)"
_SAYS_BETTER = re.compile(_LABEL_NAME + r"?(?<![A-Za-z])([AB])(?![A-Za-z])[*\"'`)\]]*\s+(?:is|was|seems)\s+"
                          r"(?:clearly\s+|much\s+|slightly\s+|the\s+)?(?i:better|stronger|preferred)")
_BETTER_IS = re.compile(r"(?i:better(?:\s+(?:reply|response|answer|option|choice|one))?\s+is|prefer|pick|choose)"
                        r"\s+" + _LABEL_NAME + r"?[*\"'`(\[]*([AB])(?![A-Za-z])")
_LEADING_LABEL = re.compile(r"^[\s\"'*`(\[]*([AB])(?![A-Za-z])")
_NAMED_LABEL = re.compile(r"\b(?:reply|response|answer|option|choice)\b[\s:*\"'`(\[-]*([AB])(?![A-Za-z])",
                          re.IGNORECASE)
_ANY_LABEL = re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])")
# "A" followed by a lower-case word is the article ("A better reply is B"), unless the word says
# something about reply A ("A is better", "A wins").
_ARTICLE = re.compile(r"[Aa]\s+(?!is\b|wins\b|was\b|seems\b)[a-z]")


def parse_ab(text: str) -> int | None:
    """Read the judge's choice from free text: 0 for "A", 1 for "B", None if there is none.

    Tried in order: a sentence saying which is better ("Reply B is better", "the better one is
    A", "I prefer B"): the verdict is what the answer says is better, so "A: Reply B is better."
    is B, its leading "A:" a label, not a verdict (14 of 200 answers of a real llama.cpp judge
    read like this); then the answer starting with the label ("B", "**A**", "(B) because...");
    a named label anywhere ("answer: a"); then the first standalone capital A/B.
    An "A" that reads as the article ("A better reply is B") is skipped.
    """
    if not isinstance(text, str):
        return None
    for pattern in (_SAYS_BETTER, _BETTER_IS, _LEADING_LABEL, _NAMED_LABEL, _ANY_LABEL):
        for match in pattern.finditer(text):
            if not _ARTICLE.match(text, match.start(1)):
                return "AB".index(match.group(1).upper())
    return None


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
        ValueError naming the model when the labels are not exactly these three (the caller,
        evaluate.load_nli, turns it into a one-line error for the --nli-model flag).
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
        raise ValueError(f"NLI model '{model_name}' has labels {labels}; it must have exactly "
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



# -------------------------------------------------------------------------------------
# Two statistics of the training logs: a standard error and a paired change
# -------------------------------------------------------------------------------------

def mean_or_none(values: list) -> float | None:
    """The mean of the values that are not None; None when none is left (a score that does not
    apply, e.g. the persona evaluator on a speaker outside the persona set, is skipped, not 0)."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def standard_error(values: list[float]) -> float:
    """Standard error of the mean, std / sqrt(n) with the n-1 sample std (0 for fewer than 2 values).
    A before/after change smaller than about twice this is noise."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def paired_change(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean and standard error of after - before, row by row. The held-out rows of one run use the
    same states and seeds before and after training, so pairing removes the between-state spread."""
    diffs = [a - b for a, b in zip(after, before)]
    return sum(diffs) / max(len(diffs), 1), standard_error(diffs)


# -------------------------------------------------------------------------------------
# The human studies: Mann-Whitney U for Likert ratings, kappa for agreement between raters
# -------------------------------------------------------------------------------------
# The paper tests its Likert items (helpfulness, emotional appropriateness, safety; 1-5) with
# two-sided Mann-Whitney U tests, and its pairwise choices with the sign test above
# (binomial_two_sided_p). Agreement between annotators is Cohen's kappa for two raters and
# Fleiss' kappa for more. All three follow the textbook formulas, and the U test follows
# scipy.stats.mannwhitneyu's defaults (method="auto", use_continuity=True), so its p-values can
# be compared with scipy's; tests/test_metrics.py checks each against numbers worked by hand.

def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z: erfc(z / sqrt 2) / 2, exact to double precision."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def average_ranks(values: list[float]) -> list[float]:
    """Ranks 1..n of the values, tied values sharing the mean of the ranks they occupy.

    >>> average_ranks([10, 20, 20, 30])
    [1.0, 2.5, 2.5, 4.0]
    """
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for j in range(start, end + 1):                     # positions start..end hold one value
            ranks[order[j]] = (start + end) / 2 + 1         # mean of ranks start+1 .. end+1
        start = end + 1
    return ranks


def mann_whitney_counts(m: int, n: int) -> list[int]:
    """How many of the C(m+n, m) orderings of two samples without ties give U = 0, 1, ..., m*n.

    Recursion on the largest observation: it belongs to the first sample (then it beats all n of
    the second: U drops by n) or to the second (U unchanged): c(m, n, u) = c(m-1, n, u-n) + c(m, n-1, u).
    """
    table = {(0, j): [1] for j in range(n + 1)}             # no first sample: U = 0, one way
    for i in range(1, m + 1):
        table[(i, 0)] = [1]
        for j in range(1, n + 1):
            counts = [0] * (i * j + 1)
            for u, c in enumerate(table[(i - 1, j)]):
                counts[u + j] += c
            for u, c in enumerate(table[(i, j - 1)]):
                counts[u] += c
            table[(i, j)] = counts
    return table[(m, n)]


def mann_whitney_u(x: list[float], y: list[float], method: str = "auto") -> dict:
    """Two-sided Mann-Whitney U test (Wilcoxon rank-sum) of two independent samples.

        U_x = R_x - n_x (n_x + 1) / 2      R_x = sum of x's ranks in the pooled sample (ties averaged)
        U_y = n_x n_y - U_x                U_x counts the (x, y) pairs with x > y, ties as 1/2

    method "exact": p = 2 P(U >= max(U_x, U_y)) under the null, from mann_whitney_counts (valid
    without ties only). method "asymptotic": the normal approximation with the tie correction and
    a continuity correction of 1/2:
        z = (max(U_x, U_y) - n_x n_y / 2 - 1/2) / sigma,
        sigma^2 = n_x n_y / 12 * ((N + 1) - sum_t (t^3 - t) / (N (N - 1))),  t = size of each tie group
    "auto" (scipy's rule) is exact when both samples have at most 8 values and there is no tie.

    Returns:
        {"u": U_x, "p_value": two-sided p in [0, 1], "method": "exact" | "asymptotic",
         "mean_x", "mean_y"}; p = 1.0 when every value is the same (no evidence either way).
    """
    nx, ny = len(x), len(y)
    if nx == 0 or ny == 0:
        raise ValueError(f"mann_whitney_u needs two non-empty samples, got sizes {nx} and {ny}")
    pooled = list(x) + list(y)
    ranks = average_ranks(pooled)
    u_x = sum(ranks[:nx]) - nx * (nx + 1) / 2
    u_big = max(u_x, nx * ny - u_x)
    ties = Counter(pooled)
    has_ties = any(t > 1 for t in ties.values())
    if method == "auto":
        method = "exact" if nx <= 8 and ny <= 8 and not has_ties else "asymptotic"
    if method == "exact":
        if has_ties:
            raise ValueError("the exact Mann-Whitney distribution assumes no ties; use method='asymptotic'")
        counts = mann_whitney_counts(nx, ny)
        p = 2 * sum(counts[int(round(u_big)):]) / sum(counts)
    elif method == "asymptotic":
        n = nx + ny
        tie_term = sum(t ** 3 - t for t in ties.values())
        var = nx * ny / 12 * ((n + 1) - tie_term / (n * (n - 1)))
        if var <= 0:
            p = 1.0                                          # all values equal
        else:
            p = 2 * normal_sf((u_big - nx * ny / 2 - 0.5) / math.sqrt(var))
    else:
        raise ValueError(f"mann_whitney_u method must be auto, exact or asymptotic, got {method!r}")
    return {"u": u_x, "p_value": min(1.0, p), "method": method,
            "mean_x": sum(x) / nx, "mean_y": sum(y) / ny}


def cohen_kappa(a: list, b: list) -> float:
    """Cohen's kappa of two raters' labels on the same items: (p_o - p_e) / (1 - p_e).

    p_o = share of items where they agree; p_e = sum over labels of the product of each rater's
    share of that label (agreement expected by chance). 1 = perfect, 0 = chance level.
    Returns nan when p_e = 1 (both raters gave one and the same label to everything: kappa is
    undefined) or when there are no items.
    """
    if len(a) != len(b):
        raise ValueError(f"cohen_kappa needs one label per item from each rater, got {len(a)} and {len(b)}")
    n = len(a)
    if n == 0:
        return float("nan")
    p_o = sum(u == v for u, v in zip(a, b)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[k] * cb[k] for k in ca) / (n * n)
    return float("nan") if p_e == 1 else (p_o - p_e) / (1 - p_e)


def fleiss_kappa(counts: list[list[int]]) -> float:
    """Fleiss' kappa for N items, each rated by the same number n >= 2 of raters into k categories.

    counts[i][j] = how many raters put item i in category j (each row sums to n).
        P_i   = (sum_j counts[i][j]^2 - n) / (n (n - 1))     agreement on item i
        p_j   = sum_i counts[i][j] / (N n)                     share of category j
        kappa = (mean P_i - sum_j p_j^2) / (1 - sum_j p_j^2)
    Returns nan when there are no items or every rating falls in one category.
    """
    if not counts:
        return float("nan")
    n = sum(counts[0])
    if n < 2 or any(sum(row) != n for row in counts):
        raise ValueError("fleiss_kappa needs the same number (>= 2) of ratings for every item")
    N = len(counts)
    p_bar = sum((sum(c * c for c in row) - n) / (n * (n - 1)) for row in counts) / N
    p_e = sum((sum(row[j] for row in counts) / (N * n)) ** 2 for j in range(len(counts[0])))
    return float("nan") if p_e == 1 else (p_bar - p_e) / (1 - p_e)


# ---------------------------------------------------------------------------------------------
# Does a choice depend on a feature? (the director's collapse diagnostics, director.py)
# ---------------------------------------------------------------------------------------------

def entropy_bits(labels: list[str]) -> float:
    """Plug-in Shannon entropy of the labels, in bits (0 for one label; log2 K for K equally
    frequent ones: 2 bits for four agents).

    >>> entropy_bits(["A", "A", "B", "B"])
    1.0
    """
    n = len(labels)
    return 0.0 - sum(c / n * math.log2(c / n) for c in Counter(labels).values()) if n else 0.0  # no -0.0


def mutual_information_bits(xs: list[str], ys: list[str]) -> float:
    """Plug-in mutual information I(X; Y) = H(X) + H(Y) - H(X, Y), in bits, of paired labels.

    0 when the choice x does not depend on the feature y (a constant choice, or one that is the
    same in every stage); H(X) when the feature determines the choice. The plug-in estimate is
    biased upwards on few samples, which is why the chi-square test below comes with it.
    """
    return max(0.0, entropy_bits(xs) + entropy_bits(ys) - entropy_bits(list(zip(xs, ys))))


def chi2_sf(x: float, df: int) -> float:
    """P(chi-square with df degrees of freedom > x), closed form for whole df (no scipy needed):
      even df: exp(-x/2) * sum_{i < df/2} (x/2)^i / i!
      odd df:  erfc(sqrt(x/2)) + exp(-x/2) * sum_{i=1}^{(df-1)/2} (x/2)^(i-1/2) / Gamma(i+1/2)
    (Abramowitz & Stegun 26.4.4 and 26.4.5).

    >>> round(chi2_sf(3.841458820694124, 1), 6), round(chi2_sf(5.991464547107979, 2), 6)
    (0.05, 0.05)
    """
    if df <= 0:
        return 1.0
    if x <= 0:
        return 1.0
    h = x / 2
    if df % 2 == 0:
        return math.exp(-h) * sum(h ** i / math.factorial(i) for i in range(df // 2))
    return math.erfc(math.sqrt(h)) + math.exp(-h) * sum(h ** (i - 0.5) / math.gamma(i + 0.5)
                                                        for i in range(1, (df - 1) // 2 + 1))


def chi_square_statistic(xs: list[str], ys: list[str]) -> tuple[float, int]:
    """Pearson's chi-square statistic of the contingency table of x by y, and its degrees of
    freedom (rows - 1) x (columns - 1). Only labels that occur count as rows and columns, so a
    constant choice has df 0 and statistic 0: no evidence of dependence."""
    n = len(xs)
    cx, cy, joint = Counter(xs), Counter(ys), Counter(zip(xs, ys))
    stat = sum((joint.get((a, b), 0) - cx[a] * cy[b] / n) ** 2 / (cx[a] * cy[b] / n)
               for a in cx for b in cy) if n else 0.0
    return stat, (len(cx) - 1) * (len(cy) - 1)


def permutation_p_value(xs: list[str], ys: list[str], n_perm: int = 2000, seed: int = 0) -> float:
    """P-value of the chi-square statistic under independence, by shuffling the features.

    With a few dozen held-out points many cells of the table expect fewer than 5 counts, where
    the chi-square distribution is a poor approximation; shuffling y keeps both margins and gives
    the exact null distribution up to Monte Carlo error. (1 + hits) / (1 + n_perm), so never 0
    (Phipson & Smyth 2010)."""
    observed, df = chi_square_statistic(xs, ys)
    if df == 0:
        return 1.0
    rng, shuffled, hits = random.Random(seed), list(ys), 0
    for _ in range(n_perm):
        rng.shuffle(shuffled)
        hits += chi_square_statistic(xs, shuffled)[0] >= observed - 1e-12
    return (1 + hits) / (1 + n_perm)
