"""plumbing/answers.py: reading an LLM judge's free-text answers (skip on first reading).

judge.py asks an LLM judge two kinds of question: which of two replies is better (it answers "A" or
"B", usually in prose: "I think Response B is better") and a 1-5 rubric score ("Score: 4", "4/5",
"**4**"). Small judges wander, so an answer is read by patterns, the most explicit first, and an
answer that says two different things reads as no answer (None): a silently wrong verdict or score
is worse than a missing one, which the callers count as unreadable.
"""

import re

# Small judges answer in prose ("I think Response B is better"), so an answer is read by patterns,
# the most explicit first.
_LABEL_NAME = r"(?:(?i:reply|response|answer|option|choice)\s+)"
_PICKS = [
    # "B is better", "Reply A was clearly stronger"
    re.compile(
        _LABEL_NAME + r"?(?<![A-Za-z])([AB])(?![A-Za-z])[*\"'`)\]]*\s+(?:is|was|seems)\s+"
        r"(?:clearly\s+|much\s+|slightly\s+|the\s+)?(?i:better|stronger|preferred)"
    ),
    # "the better reply is B", "I prefer A", "I choose Response B"
    re.compile(
        r"(?i:better(?:\s+(?:reply|response|answer|option|choice|one))?\s+is|prefer|pick|choose)"
        r"\s+" + _LABEL_NAME + r"?[*\"'`(\[]*([AB])(?![A-Za-z])"
    ),
    # the answer opens with the label: "B", "**A**"
    re.compile(r"^[\s\"'*`(\[]*([AB])(?![A-Za-z])"),
    # a named label anywhere: "Response: B"
    re.compile(
        r"\b(?:reply|response|answer|option|choice)\b[\s:*\"'`(\[-]*([AB])(?![A-Za-z])",
        re.IGNORECASE,
    ),
    # the first standalone A or B
    re.compile(r"(?<![A-Za-z])([AB])(?![A-Za-z])"),
]
# "A better reply is B": that A is an article, not a label.
_ARTICLE = re.compile(r"[Aa]\s+(?!is\b|wins\b|was\b|seems\b)[a-z]")


def parse_ab(text: str) -> int | None:
    """0 for "A", 1 for "B", None. Tried in order: a sentence saying which is better ("I prefer
    B"), so "A: Reply B is better." is B; the leading label; a named label; the first standalone
    A/B."""
    if not isinstance(text, str):
        return None
    for pattern in _PICKS:
        for m in pattern.finditer(text):
            if not _ARTICLE.match(text, m.start(1)):
                return "AB".index(m.group(1).upper())
    return None


# A 1-5 rubric answer: every statement that looks like a score is read, and all must agree.
_NUM = r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)(?![0-9])"  # a whole number or a decimal, captured
_QUOTES = r"[\s*_\"'`]*"  # markdown and quotes around a label or a number
# "Score: 4", "rating is 4", "Score - 4/5", "grade of 4 out of 5"
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
_FRACTION_RE = re.compile(_NUM + r"\s*(?:/|\bout\s+of\b)\s*" + _NUM, re.IGNORECASE)  # "4 out of 5"
_BOLD_RE = re.compile(r"\*\*\s*" + _NUM + r"\s*\*\*")  # "**4**"
_STARS_RE = re.compile(_NUM + r"\s*stars?\b", re.IGNORECASE)  # "4 stars"
_BARE_RE = re.compile(r"[\s*_\"'`(\[]*" + _NUM + r"[\s*_\"'`)\].!]*")  # an answer that is a number


def _score_value(number: str, lo: int, hi: int) -> int | None:
    """'4' and '4.0' -> 4 inside [lo, hi]; 4.5, 0 or a 99-digit run -> None."""
    whole, _, fraction = number.partition(".")
    if fraction.strip("0") or len(whole) > 6:
        return None
    value = int(whole)
    if lo <= value <= hi:
        return value
    return None


def _on_scale(top: str, hi: int) -> bool:
    """Is the number after "/" or "out of" the scale's top? "4/10" is on another scale."""
    return _score_value(top, hi, hi) is not None


def _labelled_score(m: re.Match, lo: int, hi: int) -> int | None:
    if m.group(2) is not None and not _on_scale(m.group(2), hi):
        return None  # "Score: 4/10": another scale, so no reading of it can be trusted
    return _score_value(m.group(1), lo, hi)


def parse_rubric_score(text: str, lo: int = 1, hi: int = 5) -> int | None:
    """An integer rubric score in [lo, hi] read from free text, or None. Judges are asked to end
    with "Score: N", but models wander, so every statement that LOOKS like a score is read: labelled
    ("Score: 4", "rating is 4", "4/5"), a fraction over the scale's top ("4 out of 5"), a bold
    number, "4 stars", or an answer that is only the number, after scale descriptions ("(1-5)",
    "1 to 5") are removed. All must agree ("5/5 ... no, 2/5" is None): a self-correction cannot be
    told from a quotation, and a silently wrong score is worse than a missing one."""
    if not isinstance(text, str):
        return None
    scale = rf"\(?(?<![0-9.]){lo}\s*(?:-|–|—|to)\s*{hi}(?![0-9])\)?"
    text = re.sub(scale, " ", text, flags=re.IGNORECASE)
    found = [_labelled_score(m, lo, hi) for m in _LABELLED_RE.finditer(text)]
    for m in _FRACTION_RE.finditer(text):
        if _on_scale(m.group(2), hi):
            found.append(_score_value(m.group(1), lo, hi))
    for pattern in (_BOLD_RE, _STARS_RE):
        found += [_score_value(m.group(1), lo, hi) for m in pattern.finditer(text)]
    bare = _BARE_RE.fullmatch(text)
    if bare:
        found.append(_score_value(bare.group(1), lo, hi))
    if len(set(found)) == 1:
        return found[0]
    return None
