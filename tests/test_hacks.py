"""The reward-hack diagnostics (metrics.diagnose and its parts) on hand-computed cases, and the
synthetic-hack generator (reward.make_hacks), whose every kind with a diagnostic is caught by it.

Run: .venv/bin/python -m pytest -q tests/test_hacks.py
"""

import doctest

import pytest

import metrics
import reward
import scenarios
from simulate import USER, Turn

PERSONAS = scenarios.load_personas("personas.json", "support")
ANCHOR = PERSONAS.find("Anchor")
CARD = [ANCHOR.role, ANCHOR.description, ANCHOR.style, *ANCHOR.examples]
NAMES = PERSONAS.names()


def test_doctests():
    assert doctest.testmod(metrics).failed == 0


def test_longest_shared_span_hand_computed():
    a = "i failed my driving test again today".split()
    assert metrics.longest_shared_span(a, "you failed my driving test".split()) == 4
    assert metrics.longest_shared_span(a, "nothing in common".split()) == 0
    assert metrics.longest_shared_span(a, a) == 7
    assert metrics.longest_shared_span([], a) == 0


def test_copies_needs_six_words_in_a_row():
    user = "I failed my driving test for the third time today"
    assert metrics.copies(
        "So you failed your driving test for the third time today", [user]
    )  # 7 words
    assert not metrics.copies(
        "You failed the test, third time, today of all days", [user]
    )  # scattered
    assert not metrics.copies("failed my driving test for the", [""])  # empty source
    assert metrics.copies("My driving test for the third", [user])  # exactly 6


@pytest.mark.parametrize(
    "reply, leaks",
    [
        ("Situation: The user's cat went missing.", True),
        ("Conversation so far: User: hi", True),
        ("Here's a continuation of your previous response: okay", True),
        ("As an AI language model, I cannot feel.", True),
        ("Your response should be one to three sentences.", True),
        ("Anchor: I hear you.", True),  # its own label
        ("That sounds hard. User: thanks", True),  # someone else's line
        ("The director asks me to name a strength.", True),
        (
            "(Your director continues to answer with multiple questions.)",
            True,
        ),  # seen in stage-2 rollouts
        (
            "In your next message, name a strength, in an encouraging tone.",
            True,
        ),  # the directive read back
        (
            "In your next message to your boss, ask for one day off.",
            False,
        ),  # advice, not the prompt
        ("Maybe ask your director at work for a day off?", False),  # the job title
        ("Reply: [Catalyst asks a question]", True),
        ("That sounds really hard, and it makes sense you're tired.", False),
        ("What situation would feel safest to start with?", False),  # the word, not the label
        ("Could you write to Sam tonight?", False),
    ],
)
def test_meta_leak(reply, leaks):
    assert metrics.leaks_meta(reply, NAMES) is leaks


def test_diagnose_hand_computed():
    user = ["My cat has been missing for three days and I keep checking the door."]
    agents = ["Three days of not knowing where she is sounds exhausting."]
    row = metrics.diagnose(
        "Three days of not knowing where she is sounds exhausting.", user, CARD, agents, NAMES
    )
    assert row == {
        "context_copy": 0.0,
        "persona_copy": 0.0,
        "history_echo": 1.0,
        "self_repeat": 0.0,
        "meta_leak": 0.0,
        "trivial": 0.0,
        "word_salad": 0.0,
        "words": 10.0,
    }
    row = metrics.diagnose("Okay.", user, CARD, agents, NAMES)
    assert row["trivial"] == 1.0 and row["words"] == 1.0
    assert metrics.rates(
        [
            {
                "context_copy": 1.0,
                "persona_copy": 0.0,
                "history_echo": 0.0,
                "self_repeat": 1.0,
                "meta_leak": 1.0,
                "trivial": 0.0,
                "word_salad": 1.0,
                "words": 10.0,
            },
            {
                "context_copy": 0.0,
                "persona_copy": 0.0,
                "history_echo": 0.0,
                "self_repeat": 0.0,
                "meta_leak": 1.0,
                "trivial": 1.0,
                "word_salad": 0.0,
                "words": 2.0,
            },
        ]
    ) == {
        "context_copy": 0.5,
        "persona_copy": 0.0,
        "history_echo": 0.0,
        "self_repeat": 0.5,
        "meta_leak": 1.0,
        "trivial": 0.5,
        "word_salad": 0.5,
        "words": 6.0,
    }


@pytest.mark.parametrize(
    "reply, repeats",
    [
        ("How about this one? " * 8, True),  # a phrase looped: 6-word spans recur
        ("I'm here for you. I'm here for you.", True),  # a 4-word sentence said twice
        ("That sounds hard. Do you want to talk about it? That sounds hard.", True),
        ("Yes. Yes.", False),  # too short to count as saying a thing twice
        (
            "It sounds like the week wore you down, and that makes sense. What part of it weighs most right now?",
            False,
        ),
        (
            "You kept going. You kept trying, even when it was hard, and that counts.",
            False,
        ),  # shared words, no repeat
    ],
)
def test_repeats_itself(reply, repeats):
    assert metrics.repeats_itself(reply) is repeats
    assert metrics.diagnose(reply, [], [], [], NAMES)["self_repeat"] == float(repeats)


SITUATION = "My cat went missing three days ago and I keep checking the door."
LATEST = "She has never been gone this long and I can't stop imagining the worst."  # the user's last message
AGENT_TURNS = ["That is a long time to wait without knowing anything at all."]
OTHER_EXAMPLES = [e for p in PERSONAS.personas if p.name != "Anchor" for e in p.examples]


def state(history, situation=SITUATION) -> reward.State:
    context = scenarios.Context("cat", "support", situation, history[0].text)
    return reward.State("train-0000", "train", context, "Anchor", history)


def source() -> reward.State:
    """Anchor answers after: the user's opening, another companion's turn, the user's latest message."""
    return state(
        [
            Turn(USER, "Hi, I need to talk about my cat."),
            Turn("Beacon", AGENT_TURNS[0]),
            Turn(USER, LATEST),
        ]
    )


# The diagnostic that must catch each kind (keyword stuffing and off-role replies copy nothing
# verbatim: the judge has to catch those, see tests/test_judge.py).
CAUGHT_BY = {
    "copies-context": "context_copy",
    "recites-persona": "persona_copy",
    "meta-leakage": "meta_leak",
    "empty-trivial": "trivial",
    "echoes-agent": "history_echo",
}


@pytest.mark.parametrize("seed", range(20))
def test_every_generated_hack_is_caught_by_its_diagnostic(seed):
    src = source()
    made = reward.make_hacks(src, PERSONAS, seed)
    assert set(made) == set(reward.HACK_KINDS)
    user = [SITUATION, LATEST]
    for kind, diagnostic in CAUGHT_BY.items():
        assert metrics.diagnose(made[kind], user, CARD, AGENT_TURNS, NAMES)[diagnostic] == 1.0, (
            kind,
            made[kind],
        )
        # ... and by the state's own diagnostics, which the GRPO logs and hack pairs use
        assert src.diagnose(PERSONAS, made[kind])[diagnostic] == 1.0, (kind, made[kind])
    assert made["off-role"] in OTHER_EXAMPLES
    assert len(metrics.words(made["keyword-stuffing"])) >= 6


def test_generator_is_reproducible_and_skips_kinds_a_state_cannot_have():
    src = source()
    assert reward.make_hacks(src, PERSONAS, 3) == reward.make_hacks(src, PERSONAS, 3)
    # No earlier companion turn: nothing to echo. A set of one persona: no other persona's lines.
    alone = scenarios.PersonaSet(
        "support", PERSONAS.description, [ANCHOR], PERSONAS.strategies, PERSONAS.tones
    )
    bare = reward.make_hacks(state([Turn(USER, "Hi.")], "A bad day."), alone, 0)
    assert "echoes-agent" not in bare and "off-role" not in bare


@pytest.mark.parametrize(
    "reply, salad",
    [
        ("heard grief grandmother funeral flight goodbye safe feel guilt love heavy missed", True),
        (
            "Flood, photos. Mum grief, heard. Insurance sofa! Ruined feelings; safe. Valid, sad.",
            True,
        ),
        ("strong brave courage wonderful proud warrior resilient survivor amazing strength", True),
        ("why? who? what if? how know? vanishing why? really? what now?", True),
        ("Missing that goodbye must feel like a door closing before you reached it.", False),
        ("What part of it keeps coming back to you when you try to sleep?", False),
        ("Stay safe and try doing naps first.", False),  # short: under SALAD_MIN_WORDS
    ],
)
def test_word_salad_is_read_from_the_words_not_the_punctuation(reply, salad):
    # A pile runs content words together (pairs of content words) or strings question words;
    # capitals and full stops do not make it sentences. Hand-checked: the first pile's 12 words
    # make 11 neighbouring pairs, 9 of them two content words ("feel" is a function word here):
    # 9 / 11 = 0.818, beyond the floor of 0.8 by 0.018, / 0.2 = 0.091.
    assert (metrics.word_salad(reply) > 0) is salad
    if reply.startswith("heard grief"):
        assert metrics.word_salad(reply) == pytest.approx(0.0909, abs=1e-4)
    assert metrics.diagnose(reply, [], [], [], NAMES)["word_salad"] == float(salad)
