"""director.py and simulate.py: directive parsing, prompts, reproducible rollouts, and GRPO on a
tiny director raising a programmatic group reward."""

import math
import random
import string

import pytest
import torch

import corpora
import data
import director as dr
import grpo
import models
import sft
import simulate
from data import Persona, PersonaSet
from simulate import USER, Cast, Conversation, Turn, run_conversations, user_messages


@pytest.fixture(scope="module")
def support():
    return data.load_personas("personas.json", "support")


@pytest.fixture(scope="module")
def context():
    return corpora.load_contexts("bundled", persona_set="support")[0]


def conv_with(ctx, speakers, seed=0):
    c = Conversation(ctx, "support", "average", "test", seed)
    c.turns = [Turn(USER, ctx.first_message)] + [Turn(s, "Some reply.") for s in speakers]
    return c


@pytest.mark.parametrize("text, agent, action, tone", [
    ("Agent: Beacon\nAction: name a strength\nTone: upbeat", "Beacon", "name a strength", "upbeat"),
    ("agent:beacon\naction:  name a strength  \ntone: upbeat", "Beacon", "name a strength", "upbeat"),
    ("**Agent:** Catalyst\n**Action:** ask a probing question\n**Tone:** curious", "Catalyst",
     "ask a probing question", "curious"),
    ("Sure! Here is my choice.\nAgent: Guide\nAction: suggest one small step\nTone: practical\nHope it helps",
     "Guide", "suggest one small step", "practical"),
    ("Agent: the emotional validator\nAction: validate\nTone: warm", "Anchor", "validate", "warm"),
    ("Speaker: action guide\nStrategy: plan\nTone: calm", "Guide", "plan", "calm"),
    ("Agent: I think Beacon should go next\nAction: affirm\nTone: warm", "Beacon", "affirm", "warm"),
])
def test_parse_well_formed_and_messy_directives(support, text, agent, action, tone):
    d = dr.parse_directive(text, support, fallback_agent="Anchor")
    assert (d.agent, d.action, d.tone, d.valid) == (agent, action, tone, True)


@pytest.mark.parametrize("text", ["", "   ", "Agent: Bob\nAction: x", "blah blah", "Action: validate only",
                                  "Agent:\nTone: warm", None, "A" * 10_000])
def test_unusable_directives_fall_back_and_are_marked(support, text):
    d = dr.parse_directive(text, support, fallback_agent="Catalyst")
    assert d.agent == "Catalyst" and not d.valid


def test_directive_parser_never_raises_on_fuzz(support):
    rng = random.Random(0)
    alphabet = string.printable + "äöüß€🙂\u200b\u0000:*#-–—"
    pieces = ["Agent:", "Action:", "Tone:", "Anchor", "guide", "\n", "**", ":", "Speaker", " "]
    for _ in range(3000):
        if rng.random() < 0.5:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        else:
            text = "".join(rng.choice(pieces + [rng.choice(alphabet)]) for _ in range(rng.randint(0, 30)))
        d = dr.parse_directive(text, support, fallback_agent="Anchor")
        assert d.agent in support.names()


def test_fallback_is_the_least_spoken_agent_never_the_last(support, context):
    assert simulate.least_spoken_agent(support, conv_with(context, [])) == "Anchor"
    assert simulate.least_spoken_agent(support, conv_with(context, ["Anchor", "Catalyst", "Beacon"])) == "Guide"
    # Everyone spoke once and Guide spoke last: the roster order decides, Guide is avoided.
    assert simulate.least_spoken_agent(support, conv_with(context, ["Anchor", "Catalyst", "Beacon", "Guide"])) == "Anchor"


def test_policies(support, context):
    convs = [conv_with(context, ["Anchor"] * k, seed=k) for k in range(4)]
    assert [d.agent for d in simulate.RoundRobin(support).choose(convs)] == ["Anchor", "Catalyst", "Beacon", "Guide"]
    random_picks = [d.agent for d in simulate.RandomOrder(support, seed=1).choose(convs)]
    assert random_picks == [d.agent for d in simulate.RandomOrder(support, seed=1).choose(convs)]
    assert all(p in support.names() for p in random_picks)
    with pytest.raises(data.UserError, match="--policy"):
        dr.make_policy("psychic", support)


def test_big_five_profiles_give_distinct_user_prompts(context):
    profiles = data.load_profiles("data/profiles.json")
    assert len(profiles) == 11
    prompts = {p.id: user_messages(p, context, [Turn(USER, context.first_message)])[0]["content"]
               for p in profiles}
    assert len(set(prompts.values())) == 11


class FakeJudge:
    """score_many by reply text, so the coherence term is known exactly."""
    def __init__(self, scores):
        self.scores = scores

    def score_many(self, states, replies):
        return [self.scores[r] for r in replies]


class FakeEncoder:
    """Unit vectors chosen by hand, so every cosine in the test is known exactly."""
    def __init__(self, vectors):
        self.vectors = {t: torch.tensor(v) for t, v in vectors.items()}

    def embed(self, texts):
        return torch.stack([self.vectors[t] for t in texts])


def test_block_reward_components_hand_computed(support):
    ctx = data.Context(id="t", persona_set="support", situation="exam", first_message="I failed my exam")
    conv = Conversation(ctx, "support", "average", "test", 0)
    conv.turns = [Turn(USER, "I failed my exam"), Turn("Anchor", "that hurts"),        # before the block
                  Turn("Guide", "plan one small step tonight"), Turn("Beacon", "that hurts")]
    judge = FakeJudge({"plan one small step tonight": 0.8, "that hurts": 0.4})
    enc = FakeEncoder({"that hurts": [1.0, 0.0], "plan one small step tonight": [0.6, 0.8]})
    total, c = dr.block_reward(conv, 2, dr.Directive("Guide"), support, enc, judge, dr.RewardWeights())
    # coherence: mean judge score of the two new turns = (0.8 + 0.4) / 2 = 0.6
    assert c["coherence"] == pytest.approx(0.6)
    # non-redundancy: Guide's turn shares no word with "that hurts" (BLEU-2 = 0), cosine 0.6 ->
    # 0.6; Beacon repeats Anchor word for word: cosine 1 and BLEU-2 1 -> 1.0; 1 - (0.6 + 1) / 2 = 0.2
    assert c["nonredundancy"] == pytest.approx(0.2)
    # contribution: earlier content words {failed, exam, hurts}; the block's {plan, one, small,
    # step, tonight, hurts}: 5 of 6 are new
    assert c["contribution"] == pytest.approx(5 / 6)
    # balance: Anchor, Guide, Beacon once each, 4 personas: log 3 / log 4 = 0.792481; no speaker
    # follows itself, so the repeat factor is 1
    assert c["balance"] == pytest.approx(math.log(3) / math.log(4))
    assert c["format"] == 1.0
    # weights 1, 1, 0.5, 0.5, 0.5
    assert total == pytest.approx(0.6 + 0.2 + 0.5 * 5 / 6 + 0.5 * math.log(3) / math.log(4) + 0.5)
    # An unparseable directive loses exactly the format term's weight.
    total_bad, c_bad = dr.block_reward(conv, 2, dr.Directive("Guide", valid=False), support, enc, judge,
                                       dr.RewardWeights())
    assert c_bad["format"] == 0.0 and total - total_bad == pytest.approx(0.5)


def test_block_reward_with_a_single_persona_is_defined():
    solo = PersonaSet("solo", "one companion", [Persona("Anchor", "listener", "Listens.", "Warm.", ["Hm."])],
                      ["listen"], ["warm"])
    ctx = data.Context(id="t", persona_set="support", situation="exam", first_message="I failed my exam")
    conv = Conversation(ctx, "support", "average", "test", 0)
    conv.turns = [Turn(USER, "I failed my exam"), Turn("Anchor", "that hurts"), Turn("Anchor", "plan one small step tonight")]
    enc = FakeEncoder({"that hurts": [1.0, 0.0], "plan one small step tonight": [0.6, 0.8]})
    _, c = dr.block_reward(conv, 2, dr.Directive("Anchor"), solo, enc,
                           FakeJudge({"plan one small step tonight": 0.5}), dr.RewardWeights())
    assert c["balance"] == 1.0          # nobody else could have spoken (and no division by log 1 = 0)


def test_rollouts_are_reproducible_with_a_fixed_seed(support):
    model, tok = models.load_model("tiny")
    profiles = {p.id: p for p in data.load_profiles("data/profiles.json")}
    ctxs = corpora.load_contexts("bundled", persona_set="support")[:2]
    cast = Cast(support, model, tok, model, tok, max_new_tokens=6)

    def once():
        convs = run_conversations(ctxs, simulate.RandomOrder(support, 3), cast, profiles, ["average", "openness-high"],
                                  n_agent_turns=3, user_every=2, seed=5)
        return [[(t.speaker, t.text) for t in c.turns] for c in convs]

    a, b = once(), once()
    assert a == b
    assert [s for s, _ in a[0]].count(USER) == 2          # opening + one answer after 2 agent turns


def test_grpo_on_a_tiny_director_raises_a_programmatic_group_reward(tmp_path, context):
    """Group reward: 1 when the directive is valid and picks the agent who has spoken least (Dan,
    who has not spoken at any decision point), else 0. A random tiny model cannot write
    'Agent: Dan' at all, so it is first taught the format with 60 supervised steps on
    uniformly random names (a warm start, as any small director would get); then GRPO alone
    must shift its choice towards the least-spoken agent."""
    torch.manual_seed(0)
    names = ["Amy", "Bob", "Cal", "Dan"]                   # one token each in SmolLM2's vocabulary
    base = data.load_personas("personas.json", "support")
    personas = PersonaSet("test", "", [Persona(n, r, "d", "s", ["e"]) for n, r in
                                       zip(names, ["listener", "analyst", "encourager", "planner"])],
                          base.strategies, base.tones)
    ctxs = corpora.load_contexts("bundled", persona_set="support")[:6]
    points = []
    for i, ctx in enumerate(ctxs):
        c = conv_with(ctx, ["Amy", "Bob", "Cal"], seed=i)
        c.turns.append(Turn(USER, "ok"))
        points.append(c)
    prompts = [dr.director_messages(personas, p) for p in points]
    model, tok = models.load_model("tiny")
    # Supervised warm start on the format (director.py, section 5), here with one-line targets.
    examples = [(prompts[k % 6], f"Agent: {names[random.Random(k).randrange(4)]}") for k in range(480)]
    sft.supervised_finetune(model, tok, examples, steps=60, batch_size=8, lr=1e-2, log=lambda s: None)

    def sample_prompts(step):
        idx = [(step * 2 + j) % 6 for j in range(2)]
        return [prompts[i] for i in idx], [points[i] for i in idx]

    def reward_fn(meta, texts, gen):
        picks = [dr.parse_directive(t, personas, "Amy") for t in texts]
        wanted = [simulate.least_spoken_agent(personas, m) for m in meta for _ in range(8)]
        r = [float(d.valid and d.agent == w) for d, w in zip(picks, wanted)]
        return r, {"least_spoken": r}

    cfg = grpo.GRPOConfig(steps=10, prompts_per_step=2, group_size=8, lr=3e-3, warmup_steps=0,
                          max_new_tokens=8, save_every=100, dump_every=1, seed=0, beta=0.0)
    rows = grpo.train_grpo(model, tok, sample_prompts, reward_fn, cfg, tmp_path, log=lambda s: None)
    first = sum(r["reward_mean"] for r in rows[:3]) / 3
    last = sum(r["reward_mean"] for r in rows[-4:]) / 4
    print(f"group reward first 3 steps {first:.3f}, last 4 steps {last:.3f}")
    assert last > first + 0.15


def test_completion_text_is_the_assistant_turn_with_its_end_marker():
    tok = models.load_model("tiny")[1]
    messages = [{"role": "user", "content": "hi"}]
    prompt, completion = sft.completion_text(tok, messages, "Agent: Anchor\nAction: validate\nTone: warm")
    assert prompt.endswith("<|im_start|>assistant\n")
    assert completion == "Agent: Anchor\nAction: validate\nTone: warm<|im_end|>"


def test_format_examples_use_the_vocabularies_and_every_agent(support, context):
    points = [conv_with(context, [], seed=i) for i in range(3)]
    examples = dr.format_examples(support, points, 40, seed=0)
    assert len(examples) == 40
    agents = set()
    for messages, target in examples:
        d = dr.parse_directive(target, support, "nobody")
        assert d.valid and d.action in support.strategies and d.tone in support.tones
        agents.add(d.agent)
    assert agents == set(support.names())                  # uniform targets: no agent is favoured


def test_format_warm_start_teaches_a_tiny_director_the_three_lines(support, context):
    """A random tiny model writes no parseable directive; 100 supervised steps make it write them."""
    torch.manual_seed(0)
    model, tok = models.load_model("tiny")
    points = [conv_with(context, ["Anchor", "Beacon"][:i % 3], seed=i) for i in range(4)]
    director = dr.LLMDirector(model, tok, support)
    before = sum(d.valid for d in director.choose(points))
    examples = dr.format_examples(support, points, 800, seed=0)
    losses = sft.supervised_finetune(model, tok, examples, steps=100, batch_size=8, lr=1e-2, log=lambda s: None)
    after = sum(d.valid for d in director.choose(points))
    print(f"loss {losses[0]:.2f} -> {losses[-1]:.2f}; parseable {before}/4 -> {after}/4")
    assert losses[-1] < losses[0] / 3
    assert before == 0 and after >= 3
