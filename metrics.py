"""metrics.py: every number the rewards and the evaluation compute, each formula a pure function.

The paper (arXiv 2601.14230) measures redundancy between the agent turns of one conversation
(Self-BLEU and NLI relation rates), reports judge rubrics rescaled to 0-100 and tests pairwise
preferences with an exact sign test. Those formulas live here, with the statistics the logs print
(bootstrap intervals, standard errors, paired changes, the entropy and mutual information of the
director's choices) and the reward-hack diagnostics that every GRPO step and every evaluation
table counts.

Where it sits: beside every stage. The training stages log the hack diagnostics of every sampled
reply (simulate.diagnose_reply applies `diagnose` to one reply in a conversation); director.py
also scores a block's novelty (content_words, sentence_bleu) and tests what the director's choices
depend on (entropy, mutual information, permutation test); judge.py reads the meta-text patterns;
evaluate.py computes every table's numbers from here (Self-BLEU, distinct-n, NLI and embedding
redundancy, win rates, bootstrap intervals).

What it simplifies: nothing is approximated, but nothing is loaded either: no file is read and no
model is loaded here (nli_rates is handed its model, the embedding rates their vectors), so each
function is tested against a number computed by hand:
    python -m pytest -q tests/test_metrics.py tests/test_hacks.py
"""

import itertools
import math
import random
import re
from collections import Counter
from fractions import Fraction

import numpy as np
import torch

# --- Tokens, BLEU and Self-BLEU (Papineni et al. 2002; Zhu et al. 2018, Texygen) -------------
# A word is a run of letters/digits, optionally joined by apostrophes ("don't"); any other
# non-space character is a token by itself. Texygen tokenises with nltk.word_tokenize; we keep
# contractions whole and lower-case, since Self-BLEU is about repeated phrasing, not capitals.
_TOKEN_RE = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """tokenize("Don’t worry, Sam!") == ["don't", "worry", ",", "sam", "!"]"""
    return _TOKEN_RE.findall(text.replace("\u2019", "'").lower())


# Words that carry no content of their own: what a turn adds (the director's contribution term)
# and what keyword stuffing piles up (the hack generator) are counted without them.
STOPWORDS = frozenset(
    """a an the and or but if so to of in on at for with from by as is are was were be been
being am i you he she it we they me him her us them my your his its our their this that these those
do does did have has had not no yes just very really can could would should will shall may might
must what which who whom how why when where there here all any some more most much many such than
too also only own same about into over under again then once now feel feeling""".split()
)


def content_words(text: str) -> set[str]:
    """The lower-case words of 3+ letters that are not STOPWORDS."""
    return {w for w in re.findall(r"[a-z']+", text.lower()) if w not in STOPWORDS and len(w) > 2}


def ngram_counts(tokens: list[str], n: int) -> Counter:
    """How often each run of n consecutive tokens occurs."""
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


SMOOTHING_EPSILON = 0.1  # NLTK SmoothingFunction().method1, which Texygen uses


def sentence_bleu(hyp: list[str], refs: list[list[str]], max_n: int = 4) -> float:
    """Sentence BLEU with uniform weights, as NLTK's sentence_bleu with smoothing method1:

        BLEU = BP * exp(mean_n log p_n),  p_n = clipped n-gram matches / hypothesis n-grams
    Clipping: a hypothesis n-gram counts at most as often as the one reference that holds it most.
    A zero numerator becomes epsilon (method1); no unigram match at all gives exactly 0. The
    brevity penalty uses the reference length closest to the hypothesis (ties: the shorter).
    """
    if not refs:
        raise ValueError("sentence_bleu needs at least one reference")
    log_p = []  # log p_n for n = 1 .. max_n
    for n in range(1, max_n + 1):
        hyp_counts = ngram_counts(hyp, n)
        best = Counter()  # each n-gram's largest count in any one reference
        for ref in refs:
            best |= ngram_counts(ref, n)  # element-wise max over references
        matches = sum(min(c, best[g]) for g, c in hyp_counts.items())
        if n == 1 and matches == 0:
            return 0.0  # nothing shared: nothing to smooth
        log_p.append(math.log((matches or SMOOTHING_EPSILON) / max(1, sum(hyp_counts.values()))))
    closest = min((len(r) for r in refs), key=lambda r: (abs(r - len(hyp)), r))
    # Brevity penalty: a hypothesis shorter than its reference cannot win on precision alone.
    if len(hyp) > closest:
        bp = 1.0
    elif not hyp:
        bp = 0.0
    else:
        bp = math.exp(1 - closest / len(hyp))
    return bp * math.exp(math.fsum(log_p) / max_n)


def self_bleu(texts: list[str], max_n: int = 4) -> float | None:
    """Mean BLEU of each text against all the others (Texygen leaves the hypothesis out of its own
    references). Higher = the agents repeat each other's phrasing. None for fewer than two texts:
    with nothing to repeat there is no evidence either way, and 0 would read as "no redundancy".

    >>> self_bleu(["thank you for telling us this"] * 2)
    1.0
    >>> self_bleu(["good morning", "see you soon"])
    0.0
    """
    toks = [tokenize(t) for t in texts]
    if len(toks) < 2:
        return None
    scores = []
    for i, hyp in enumerate(toks):
        others = toks[:i] + toks[i + 1 :]  # every text but the hypothesis itself
        scores.append(sentence_bleu(hyp, others, max_n))
    return sum(scores) / len(toks)


def distinct_n(texts: list[str], n: int) -> float | None:
    """distinct-n (Li et al. 2016): unique n-grams / all n-grams, pooled over the texts (n-grams
    never span two texts). None when there is no n-gram at all."""
    pooled = sum((ngram_counts(tokenize(t), n) for t in texts), Counter())
    total = sum(pooled.values())
    if not total:
        return None
    return len(pooled) / total


# --- Statistics ------------------------------------------------------------------------------
def binomial_two_sided_p(k: int, n: int, p: float = 0.5) -> float:
    """Exact two-sided binomial test (scipy.stats.binomtest's definition): the probability, under
    Binomial(n, p), of an outcome at most as likely as k; in exact fractions, so mirror-image
    outcomes tie exactly. binomial_two_sided_p(9, 10) == 0.021484375 (= 22 / 1024)."""
    if not 0 <= k <= n or not 0 <= p <= 1:
        raise ValueError(
            f"binomial test needs 0 <= k <= n and 0 <= p <= 1, got k={k}, n={n}, p={p}"
        )
    if n == 0:
        return 1.0
    q = Fraction(repr(float(p)))
    pmf = [math.comb(n, i) * q**i * (1 - q) ** (n - i) for i in range(n + 1)]
    return float(min(Fraction(1), sum(x for x in pmf if x <= pmf[k])))


def win_rate(outcomes: list[str]) -> dict:
    """Pairwise judgments of A against B ("A", "B" or "tie" each). Ties are left out of the rate
    and the test (the classic sign test): a tie says nothing about which is better."""
    counts = Counter(outcomes)
    if set(counts) - {"A", "B", "tie"}:
        raise ValueError(f"win_rate outcomes must be 'A', 'B' or 'tie', got {sorted(counts)}")
    wins = counts["A"]
    losses = counts["B"]
    rate = None  # no decisive judgement: no rate
    if wins + losses:
        rate = wins / (wins + losses)
    return {
        "wins": wins,
        "losses": losses,
        "ties": counts["tie"],
        "win_rate": rate,
        "p_value": binomial_two_sided_p(wins, wins + losses),
    }


def bootstrap_ci(values: list[float], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0):
    """(mean, low, high): the percentile bootstrap over the items (conversations, the unit drawn at
    random, so the unit resampled). None for no values; the interval is None for one value."""
    x = np.asarray(values, dtype=float)  # (N,)
    if x.size == 0:
        return None, None, None
    if x.size == 1:
        return float(x[0]), None, None
    idx = np.random.default_rng(seed).integers(0, x.size, size=(n_boot, x.size))  # (n_boot, N)
    low, high = np.quantile(x[idx].mean(axis=1), [alpha / 2, 1 - alpha / 2])
    return float(x.mean()), float(low), float(high)


def mean_or_none(values: list) -> float | None:
    """The mean of the values that are not None; None when none is left."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return sum(values) / len(values)


def standard_error(values: list[float]) -> float | None:
    """std / sqrt(n) with the n-1 sample std; None for fewer than two values (no spread to see)."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def cluster_means(values: list[float], clusters: list) -> list[float]:
    """The mean of the values of each cluster, in order of first appearance. Two replies sampled
    for one held-out state are not independent evidence: a standard error must count states."""
    groups: dict = {}
    for v, c in zip(values, clusters):
        groups.setdefault(c, []).append(v)
    return [sum(g) / len(g) for g in groups.values()]


def paired_change(before: list[float], after: list[float], clusters: list | None = None):
    """(mean, se) of after - before, row by row (same states, same seeds, so pairing removes the
    between-state spread); with `clusters`, the rows of one cluster are averaged first."""
    diffs = [a - b for a, b in zip(after, before)]
    if clusters is not None:
        diffs = cluster_means(diffs, clusters)
    return sum(diffs) / max(len(diffs), 1), standard_error(diffs)


def rescale_0_100(score: float, lo: float, hi: float) -> float:
    """A rubric score on [lo, hi] mapped to [0, 100], as the paper reports: on 1-5, 4 -> 75."""
    if hi <= lo or not lo <= score <= hi:
        raise ValueError(f"rubric score {score} is outside the scale [{lo}, {hi}]")
    return 100.0 * (score - lo) / (hi - lo)


def entropy_bits(labels: list) -> float:
    """Plug-in Shannon entropy in bits: 0 for one label, 2 for four equally frequent agents."""
    n = len(labels)
    if not n:
        return 0.0
    # 0.0 - ...: one label gives 0.0, not -0.0
    return 0.0 - sum(c / n * math.log2(c / n) for c in Counter(labels).values())


def mutual_information_bits(xs: list, ys: list) -> float:
    """I(X; Y) = H(X) + H(Y) - H(X, Y): 0 when the choice x ignores the feature y. The plug-in
    estimate is biased upwards on few samples; permutation_p_value says whether it is real."""
    return max(0.0, entropy_bits(xs) + entropy_bits(ys) - entropy_bits(list(zip(xs, ys))))


def chi_square_statistic(xs: list, ys: list) -> float:
    """Pearson's chi-square statistic of the table of x by y (labels that occur only): the sum
    over cells of (observed - expected)^2 / expected, expected = row total * column total / n."""
    n = len(xs)
    if not n:
        return 0.0
    cx = Counter(xs)  # row totals
    cy = Counter(ys)  # column totals
    joint = Counter(zip(xs, ys))  # cell counts
    terms = []
    for a in cx:
        for b in cy:
            expected = cx[a] * cy[b] / n
            terms.append((joint.get((a, b), 0) - expected) ** 2 / expected)
    return sum(terms)


def permutation_p_value(xs: list, ys: list, n_perm: int = 2000, seed: int = 0) -> float:
    """P-value of independence of x and y: the chi-square statistic against shuffles of y, which
    keep both margins; exact where the chi-square distribution is poor (cells of a few counts).
    (1 + hits) / (1 + n_perm), never 0 (Phipson & Smyth 2010); 1 when x or y is constant."""
    if len(set(xs)) < 2 or len(set(ys)) < 2:
        return 1.0
    observed = chi_square_statistic(xs, ys)
    rng = random.Random(seed)
    shuffled = list(ys)
    hits = 0  # shuffles at least as extreme as the data
    for _ in range(n_perm):
        rng.shuffle(shuffled)
        # 1e-12: a shuffle that rebuilds the same table must count, whatever the rounding
        hits += chi_square_statistic(xs, shuffled) >= observed - 1e-12
    return (1 + hits) / (1 + n_perm)


# --- Redundancy between agent turns: NLI relation rates (the paper) and embeddings (ours) ----
NLI_RELATIONS = ("entailment", "contradiction", "neutral")


def nli_label_index(id2label: dict, model_name: str) -> dict[str, int]:
    """Which output of an NLI classifier is which relation, read from its config (checkpoints
    disagree on the order). ValueError unless the labels are exactly the three relations."""
    index = {}
    for i, name in id2label.items():
        for rel in NLI_RELATIONS:
            # The first six letters name the relation in every spelling: "ENTAILMENT", "Entails".
            if str(name).strip().lower().startswith(rel[:6]):
                index[rel] = int(i)
    if len(index) != 3 or len(id2label) != 3:
        raise ValueError(
            f"NLI model '{model_name}' has labels {list(id2label.values())}; it needs exactly "
            "entailment / contradiction / neutral"
        )
    return index


def nli_rates(texts: list[str], model, tokenizer, batch_size: int = 16) -> dict | None:
    """Entailment / contradiction / neutral rates over the (earlier, later) pairs of agent turns.

    NLI is directional: the premise is the earlier turn, since the question is whether a later turn
    merely restates (entailment: redundancy, sycophancy) or contradicts what was said. Each pair
    gets the classifier's argmax label. None for fewer than two turns (no pair)."""
    name = model.config.name_or_path or type(model).__name__
    index = nli_label_index(model.config.id2label, name)
    pairs = list(itertools.combinations(range(len(texts)), 2))  # (earlier, later), in order
    if not pairs:
        return None
    model.eval()
    counts = torch.zeros(3, dtype=torch.long)  # (3,) predictions per output
    with torch.no_grad():
        for start in range(0, len(pairs), batch_size):
            batch = pairs[start : start + batch_size]
            enc = tokenizer(
                [texts[i] for i, _ in batch],
                [texts[j] for _, j in batch],
                padding=True,
                truncation=True,
                return_tensors="pt",
            ).to(next(model.parameters()).device)
            labels = model(**enc).logits.argmax(-1).cpu()  # (B, 3) -> (B,)
            counts += torch.bincount(labels, minlength=3)  # (3,)
    return {rel: counts[index[rel]].item() / len(pairs) for rel in NLI_RELATIONS}


def pairwise_cosines(emb: torch.Tensor) -> torch.Tensor:
    """(N(N-1)/2,) cosines of every pair i < j of the (N, D) unit-length rows."""
    norms = emb.norm(dim=-1)
    if not torch.allclose(norms, torch.ones_like(norms), atol=1e-3):
        raise ValueError("embeddings must be L2-normalised rows")
    i, j = torch.triu_indices(len(emb), len(emb), offset=1)
    return (emb @ emb.T)[i, j]  # dot of unit vectors = cosine


def semantic_redundancy_rate(emb: torch.Tensor, threshold: float = 0.8) -> float | None:
    """Share of pairs of agent turns that are near-paraphrases (cosine >= threshold), our addition:
    "the same thing in other words", which Self-BLEU misses. The threshold sits between what
    all-MiniLM-L6-v2 gives paraphrases (above it) and complementary turns on one topic (well
    below); another encoder needs its own threshold. None for fewer than two turns."""
    if len(emb) < 2:
        return None
    return (pairwise_cosines(emb) >= threshold).float().mean().item()


def mean_pairwise_similarity(emb: torch.Tensor) -> float | None:
    """The mean cosine over pairs of agent turns: redundancy without a threshold. None for fewer
    than two turns."""
    if len(emb) < 2:
        return None
    return pairwise_cosines(emb).mean().item()


# --- Reward hacking, made visible -------------------------------------------------------------
# GRPO maximises whatever reward it is given; with an automatic grader the policy finds the
# grader's blind spots long before better replies (Gao et al. 2022): copying the user's words
# scores as "relevant", reciting the persona card as "in persona". These checks of one reply are
# counted for every GRPO step, every evaluation table and every best-of-N pick:
#   context_copy   a 6-word span of the user's messages or the situation
#   persona_copy   a 6-word span of its own persona card
#   history_echo   a 6-word span of an earlier companion turn (its own or another's)
#   self_repeat    a 6-word span twice within itself, or one sentence of 3+ words again
#   meta_leak      prompt or meta text, or a transcript speaker label
#   trivial        fewer than 3 words
# A 6-word span is the unit because honest replies almost never share six words in a row with
# what they answer, while copies nearly always do. Lexical on purpose, so a reader sees why a
# reply was counted; they miss paraphrased copies: a floor on hacking, not a ceiling.

SPAN, TRIVIAL_WORDS = 6, 3
HACKS = (
    "context_copy",
    "persona_copy",
    "history_echo",
    "self_repeat",
    "meta_leak",
    "trivial",
    "word_salad",
)
DIAGNOSTICS = HACKS + ("words",)  # + the length in words (growth without content is a hack too)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """The lower-case words of a reply (curly apostrophes made straight), as the checks count."""
    return _WORD.findall(text.replace("\u2019", "'").lower())


def longest_shared_span(a: list[str], b: list[str]) -> int:
    """The longest run of consecutive words in both lists (dynamic programming over (i, j)).

    >>> longest_shared_span("i failed my exam today".split(), "you failed my exam".split())
    3
    """
    best = 0
    previous = [0] * (len(b) + 1)  # previous[j]: the run ending at the last x and b[j - 1]
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b, start=1):
            if x == y:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


def copies(reply: str, sources: list[str], span: int = SPAN) -> bool:
    """Does the reply share a run of `span` words with any source?"""
    w = words(reply)
    return len(w) >= span and any(longest_shared_span(w, words(s)) >= span for s in sources if s)


# Prompt and meta text a reply must never contain: our own prompt labels ("Background:", "(Beacon,
# another companion):", "(It is Anchor's turn.)", the directive sentence "In your next message,
# ...") and the evaluator's ("Situation:", "Conversation so far:", "Write <name>'s next
# message"), the system prompt read back, instruction echoes, assistant boilerplate, notes about
# the director.
META_PATTERNS = [
    r"\bsituation\s*:",
    r"\bbackground\s*:",
    r"\banother companion\b",
    r"\bit is \w+'s turn\b",
    r"\bgroup chat\b",
    r"\bthe user\b(?!s)",
    r"\byou are (?:an? |the |one of )?(?:several |two |\d+ )?(?:ai|assistant|chatbot|companions)\b",
    r"\bconversation so far\b",
    r"\bwrite \w+(?:'s)? next message\b",
    r"\b\w+'s next message\b",
    r"\byour (?:response|reply|answer|message) should\b",
    r"\bhere(?:'s| is) (?:a|my|the|\w+'s) (?:continuation|response|reply|answer|message)\b",
    r"\bas an ai\b|\blanguage model\b",
    r"\b(?:the )?director (?:asks|wants|told|says)\b",
    r"\(\s*your director\b",
    r"\bin your next message\s*,",
    r"\b(?:instructions?|output|note|tone)\s*:",
    r"^\W*(?:reply|response|answer|thinking)\s*:",
    r"\[(?:insert|item|name|date|task)[^\]]*\]",
]
_META = [re.compile(p, re.IGNORECASE | re.MULTILINE) for p in META_PATTERNS]


def leaks_meta(reply: str, speaker_names: list[str] = ()) -> bool:
    """Prompt or meta text, or a speaker label ("Anchor:", "User:") of the transcript."""
    if any(p.search(reply) for p in _META):
        return True
    names = "|".join(re.escape(n) for n in [*speaker_names, "User", "Assistant"] if n)
    return bool(
        re.search(r"(?:^|\n|\s)[\*\"']*(?:" + names + r")[\*\"']*\s*:", reply, re.IGNORECASE)
    )


def repeats_itself(reply: str, span: int = SPAN) -> bool:
    """A run of `span` words twice (a loop counts), or a sentence of 3+ words again: a degenerate
    loop that copies nothing but itself, which a per-reply reward can miss and a policy can
    learn."""
    w = words(reply)
    spans = [tuple(w[i : i + span]) for i in range(len(w) - span + 1)]
    sentences = [tuple(words(s)) for s in re.split(r"(?<=[.!?])\s+|\n+", reply)]
    sentences = [s for s in sentences if len(s) >= TRIVIAL_WORDS]
    return len(spans) != len(set(spans)) or len(sentences) != len(set(sentences))


# Word salad: a pile of the persona's and the topic's words instead of sentences, which a judge of
# surface features may reward (docs/JUDGE.md). Read from the words alone, so punctuation cannot
# dress a pile up as sentences: English alternates content and function words, a pile runs content
# words together (neighbouring pairs of content words: human supporter turns ~0.1, piles 0.7-1.0);
# and a sentence asks a question or two, a question pile strings question words together.
QUESTION_WORDS = frozenset("what why how which who whom whose when where".split())
SALAD_MIN_WORDS = 8  # shorter replies are short (trivial, too_short), not salad
SALAD_PAIRS = 0.8  # share of neighbouring word pairs both content words, beyond which it is a pile
SALAD_QUESTIONS = 0.2  # share of question words (one question of ten words: 0.1) ...
SALAD_QUESTION_WORDS = 3  # ... among at least three of them ("what would you tell a friend who")


def word_salad(reply: str) -> float:
    """How much the reply reads as a pile of words, in [0, 1]: the larger of its share of
    neighbouring content-word pairs beyond SALAD_PAIRS and, once it has SALAD_QUESTION_WORDS
    question words, their share beyond SALAD_QUESTIONS, each scaled to reach 1 at 1. 0 for replies
    under SALAD_MIN_WORDS words."""
    w = words(reply)
    if len(w) < SALAD_MIN_WORDS:
        return 0.0
    content = [x.split("'")[0] not in STOPWORDS for x in w]
    pairs = sum(a and b for a, b in zip(content, content[1:])) / (len(w) - 1)
    asks = sum(x in QUESTION_WORDS for x in w)
    pile = max(0.0, pairs - SALAD_PAIRS) / (1 - SALAD_PAIRS)
    asked = 0.0
    if asks >= SALAD_QUESTION_WORDS:
        asked = max(0.0, asks / len(w) - SALAD_QUESTIONS) / (1 - SALAD_QUESTIONS)
    return max(pile, asked)


def diagnose(
    reply: str,
    user_texts: list[str],
    persona_texts: list[str],
    agent_texts: list[str],
    speaker_names: list[str] = (),
) -> dict:
    """Every diagnostic of one reply: 0/1 flags and the length in words. user_texts: the situation
    and the user's messages; persona_texts: the speaker's card; agent_texts: earlier companion
    turns."""
    return {
        "context_copy": float(copies(reply, user_texts)),
        "persona_copy": float(copies(reply, persona_texts)),
        "history_echo": float(copies(reply, agent_texts)),
        "self_repeat": float(repeats_itself(reply)),
        "meta_leak": float(leaks_meta(reply, speaker_names)),
        "trivial": float(len(words(reply)) < TRIVIAL_WORDS),
        "word_salad": float(word_salad(reply) > 0),
        "words": float(len(words(reply))),
    }


def rates(rows: list[dict]) -> dict[str, float]:
    """Mean of each diagnostic over replies: a share for the flags, the mean length for words."""
    if not rows:
        return {}
    return {k: sum(r[k] for r in rows) / len(rows) for k in DIAGNOSTICS}
