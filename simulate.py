"""simulate.py: the conversation engine: companions, a turn-taking policy and a simulated user.

A MASCOT conversation (arXiv 2601.14230) is one person talking with a small group of companion
agents. Each round:

    1. a turn-taking policy picks WHO speaks next and HOW: a fixed rule defined here (round-robin,
       random order, least-spoken) or the LLM director (director.py), as a
       Directive(agent="Anchor", action="validate the feeling", tone="warm");
    2. that agent's reply comes from the shared speaker model, conditioned on its persona card, the
       conversation so far and the directive (`speaker_messages`);
    3. after every `user_every` agent turns the simulated user answers: an LLM given the situation
       and a Big Five personality profile (`user_messages`).

Where it sits: the engine both stages and the evaluation use. Stage 1 (reward.py) grows the
speakers' training states from its conversations; stage 2 (director.py) rolls a sampled directive
and the turns after it forward with `advance`; the evaluation (evaluate.py) plays every system's
conversations with `run_conversations`. All three grade a reply on the same view of it
(`judge_state`), so they judge alike.

Everything is batched ACROSS conversations: all advance one turn together, so a turn is one call
of models.generate_texts for the speakers and one for the user. That is what makes the evaluation
and the rollouts of stage 2 affordable on a CPU. Where a person reads the conversation (chat,
simulate, evaluate), a crisis guard (extras/safety.py) can be handed in: it reads every user
message before any agent answers and ends the conversation with its fixed message when one
signals danger. Training rollouts run without it.

Simplifications vs the paper: one speaker model plays every agent, conditioned on the persona (the
paper also shares a backbone); the simulated user is a small LLM, not GPT-4o. The prompt styles
(STYLES: the paper's prompting baselines) all start from the same persona card, as the paper asks
("all methods use identical role settings").

    python mascot.py simulate --contexts 4 --policy round-robin --profile average
"""

import random
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable

import models
from metrics import diagnose
from plumbing.common import derive_seed, progress
from scenarios import Context, Persona, PersonaSet, Profile

USER = "User"  # the speaker label of the person (real or simulated)
SAFETY = "Safety"  # the speaker label of the crisis guard's fixed message
# How much of the conversation each reader sees, in turns: the speakers, the simulated user and the
# director read SEEN_TURNS; every grader (the judges, the reward model, the block judgement)
# JUDGE_TURNS, since small judges have short windows. (The persona-ID evaluator reads 2:
# evaluate.py.)
SEEN_TURNS = 8
JUDGE_TURNS = 6


# --- Directives, turns, conversations -----------------------------------------------------------
@dataclass
class Directive:
    """The director's decision for one turn (the paper's `Agent / Action / Tone`)."""

    agent: str
    action: str = ""  # "" for the fixed rules
    tone: str = ""
    valid: bool = True  # False when the director's text could not be parsed (a fallback spoke)
    raw: str = ""  # the director's raw text, kept for the transcripts


@dataclass
class Turn:
    """One message of a conversation."""

    speaker: str  # USER, SAFETY or an agent name
    text: str
    directive: Directive | None = None  # set on agent turns


@dataclass
class Conversation:
    """One conversation as it grows, and what its transcript file records of it."""

    context: Context
    persona_set: str
    profile: str  # the simulated user's Big Five profile id
    policy: str  # the turn-taking policy's name
    seed: int
    turns: list[Turn] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)  # {"type": "crisis", ...}
    ended: bool = False  # set when the crisis guard stops the conversation

    def agent_turns(self) -> list[Turn]:
        """The companions' turns, in order (neither the person's nor the crisis message)."""
        return [t for t in self.turns if t.speaker not in (USER, SAFETY)]

    def to_json(self) -> dict:
        """One line of a transcript file (JSON lines): the context, who played it, every turn."""
        c = self.context
        return {
            "context_id": c.id,
            "persona_set": self.persona_set,
            "situation": c.situation,
            "emotion": c.emotion,
            "valence": c.valence,
            "domain": c.domain,
            "profile": self.profile,
            "policy": self.policy,
            "seed": self.seed,
            "events": self.events,
            "turns": [
                {
                    "speaker": t.speaker,
                    "text": t.text,
                    "directive": asdict(t.directive) if t.directive else None,
                }
                for t in self.turns
            ],
        }


@dataclass
class JudgeState:
    """What a judge (judge.py) or the reward model (reward.py) sees besides the reply itself."""

    persona_name: str
    persona_desc: str  # "<role>: <description>"
    context: str  # the user's latest message
    # The earlier turns [{"speaker", "text"}], oldest first.
    history: list[dict] = field(default_factory=list)
    situation: str = ""


def judge_state(persona: Persona, turns: list[Turn], situation: str) -> JudgeState:
    """The graders' view of the reply that comes after `turns`, spoken by `persona`: the user's
    latest message is the `context` it answers; `history` holds the other turns before the reply
    (the agents' turns after that message included), so copying the user and repeating an agent are
    both visible. Stage 1, stage 2 and the evaluation all build the state here, so they judge
    alike."""
    last_user = max((k for k, t in enumerate(turns) if t.speaker == USER), default=None)
    earlier = [t for k, t in enumerate(turns) if k != last_user][-JUDGE_TURNS:]
    latest = ""
    if last_user is not None:
        latest = turns[last_user].text
    return JudgeState(
        persona.name,
        f"{persona.role}: {persona.description}",
        latest,
        [{"speaker": t.speaker, "text": t.text} for t in earlier],
        situation,
    )


def start_conversation(
    context: Context, persona_set: str, profile: str, policy: str, seed: int, guard=None
) -> Conversation:
    """A new conversation that opens with the context's first user message (seen by the guard)."""
    conv = Conversation(context, persona_set, profile, policy, seed)
    add_user_turn(conv, context.first_message, guard)
    return conv


def add_user_turn(conv: Conversation, text: str, guard=None) -> None:
    """Append a user message; a guard (extras/safety.py) that flags it ends the conversation with
    its fixed message, and the event records why, so every stop can be audited."""
    conv.turns.append(Turn(USER, text))
    if guard is None:
        return
    flag = guard.check(text)
    if flag is None or not flag.flagged:
        return
    conv.turns.append(Turn(SAFETY, guard.message))
    score = None
    if flag.score is not None:
        score = round(flag.score, 3)
    event = {
        "type": "crisis",
        "turn": len(conv.turns) - 2,  # the user's message, before the guard's
        "text": text,
        "category": flag.category,
        "score": score,
    }
    conv.events.append(event)
    conv.ended = True


# --- Prompts ------------------------------------------------------------------------------------
def render_history(turns: list[Turn], max_turns: int = SEEN_TURNS) -> str:
    """The last turns as 'Speaker: text' lines: the one transcript layout of every prompt."""
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns[-max_turns:])


def persona_card(persona: Persona) -> str:
    """The persona's system-prompt card; fields left empty (the name-only role setting) are left
    out."""
    card = f"You are {persona.name}, the {persona.role}."
    if persona.description:
        card += f" {persona.description}"
    if persona.style:
        card += f" Style: {persona.style}"
    if persona.examples:
        card += " Examples of your voice: " + " / ".join(f'"{e}"' for e in persona.examples[:3])
    return card


def diagnose_reply(
    persona: Persona, turns: list[Turn], situation: str, reply: str, names: list[str]
) -> dict:
    """metrics.diagnose for the reply that follows `turns`, spoken by `persona`: stage 1 logs it for
    every sampled reply, the evaluation for every agent turn, the stress test for every pick."""
    card = [persona.role, persona.description, persona.style, *persona.examples]  # to recite
    user_texts = [situation] + [t.text for t in turns if t.speaker == USER]
    agent_texts = [t.text for t in turns if t.speaker not in (USER, SAFETY)]
    return diagnose(reply, user_texts, card, agent_texts, names + [USER])


def role_setting(personas: PersonaSet, setting: str) -> PersonaSet:
    """The persona set as the speakers' prompts show it: "full" (every system's default) or "name"
    (name and role only: the ablation that shows what the card itself is worth)."""
    if setting == "full":
        return personas
    return PersonaSet(
        personas.name,
        personas.description,
        [Persona(p.name, p.role, "", "", []) for p in personas.personas],
        personas.strategies,
        personas.tones,
    )


# The speaker's prompt styles: ours ("persona", the default) and the paper's prompting baselines.
STYLES = ("persona", "zero-shot", "zero-shot-cot", "few-shot", "few-shot-cot")
COT_STYLES = ("zero-shot-cot", "few-shot-cot")  # think first, then reply (chain of thought)
EXAMPLE_STYLES = ("few-shot", "few-shot-cot")  # worked examples in the prompt (data/fewshot.json)
_THINK_THEN_REPLY = (
    "First write one sentence of thinking after 'Thinking:' (what the person needs and what your "
    "role adds), then your short reply after 'Reply:'."
)


def fewshot_block(examples: list[dict], thinking: bool = True) -> str:
    """The worked examples of the few-shot styles, one block each; `thinking` keeps their
    "Thinking:" line (few-shot-cot) or drops it (few-shot)."""
    blocks = []
    for e in examples:
        block = f"Situation: {e['situation']}\nUser: {e['user']}\nCompanion: {e['persona']}\n"
        if thinking:
            block += f"Thinking: {e['thinking']}\n"
        block += f"Reply: {e['reply']}"
        blocks.append(block)
    return "\n\n".join(blocks)


def style_instruction(style: str, others: str, examples: list[dict]) -> str:
    """What the speaker's system message asks after the persona card, in each style of STYLES."""
    if style == "persona":
        return (
            f"You are one of several companions in a group chat with one person. The others are "
            f"{others}. Stay in your own role and do not repeat them. Reply with one short message "
            "of one to three sentences, in your own voice. Do not write your name or anyone "
            "else's lines."
        )
    if style == "zero-shot":
        return "Reply to the person with one short message of one to three sentences."
    if style == "zero-shot-cot":
        return _THINK_THEN_REPLY
    if style == "few-shot":
        shots = fewshot_block(examples, thinking=False)
        return (
            f"Examples of companions replying:\n\n{shots}\n\nWrite your short reply after 'Reply:'."
        )
    if style == "few-shot-cot":
        shots = fewshot_block(examples)
        return f"Examples of companions thinking, then replying:\n\n{shots}\n\n{_THINK_THEN_REPLY}"
    raise ValueError(f"speaker_messages: unknown style {style!r}; use one of {', '.join(STYLES)}")


def speaker_messages(
    persona: Persona,
    personas: PersonaSet,
    context: Context,
    turns: list[Turn],
    directive: Directive | None = None,
    style: str = "persona",
    examples: list[dict] = (),
) -> list[dict]:
    """The chat prompt for one agent's next reply.

    The system message opens with the persona card (one shared model, a different card per agent),
    then what the style asks, then the situation; the director's instruction, when it gave one, is
    its last sentence in plain words ("In your next message, name a strength, in an encouraging
    tone."). The conversation follows as chat turns seen from this agent. Why this layout: a small
    model copies whatever labels its prompt holds into its reply ("Situation: ...", "(Your
    director asks you to: ...)"), and chat roles need the fewest labels; the one left, "(Beacon,
    another companion):", is still echoed sometimes, and counted as a meta leak."""
    if style in EXAMPLE_STYLES and not examples:
        raise ValueError(f"speaker_messages: style {style!r} needs examples (data/fewshot.json)")
    others = ", ".join(f"{p.name} ({p.role})" for p in personas.personas if p.name != persona.name)
    system = persona_card(persona) + "\n" + style_instruction(style, others, examples)
    system += f"\nBackground: {context.situation}"
    if directive is not None and (directive.action or directive.tone):
        system += "\n" + directive_sentence(directive)
    chat = transcript_messages(persona, turns)
    if not chat or chat[-1]["role"] == "assistant":
        chat.append({"role": "user", "content": f"(It is {persona.name}'s turn.)"})
    return [{"role": "system", "content": system}] + chat


def directive_sentence(directive: Directive) -> str:
    """The director's Action and Tone as one plain sentence for the speaker's system message.

    >>> directive_sentence(Directive("Beacon", "Name a strength.", "encouraging"))
    'In your next message, name a strength, in an encouraging tone.'
    """

    action = as_clause(directive.action, "respond")
    tone = as_clause(directive.tone, "natural")
    article = "an" if tone[0] in "aeiouAEIOU" else "a"
    return f"In your next message, {action}, in {article} {tone} tone."


def as_clause(text: str, default: str) -> str:
    """The director's free text made to fit mid-sentence: no end punctuation, a lower-case first
    letter unless the first word is an acronym or "I'..."; `default` when nothing is left."""
    text = text.strip().rstrip(".!;:,").strip() or default
    first = text.split()[0]
    if first.isupper() or first.startswith("I'"):
        return text
    return text[0].lower() + text[1:]


def transcript_messages(persona: Persona, turns: list[Turn]) -> list[dict]:
    """The last SEEN_TURNS turns as chat messages seen from `persona`: its own turns are the
    assistant's, the person's the user's, another companion's a user message that names it.
    Neighbouring messages of one role are joined: chat templates expect roles to alternate."""
    out = []
    for t in turns[-SEEN_TURNS:]:
        if t.speaker == persona.name:
            role = "assistant"
        else:
            role = "user"
        if t.speaker in (persona.name, USER):
            text = t.text
        else:
            text = f"{models.OTHER_LABEL.format(t.speaker)}: {t.text}"
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n" + text
        else:
            out.append({"role": role, "content": text})
    return out


_REPLY_LABEL = re.compile(r"\breply\s*\**\s*:\s*\**", re.IGNORECASE)
_NEXT_EXAMPLE = re.compile(r"\b(?:thinking|situation|companion)\s*\**\s*:", re.IGNORECASE)


def reply_text(raw: str, style: str = "persona") -> str:
    """For the "Reply:" styles, the text after the first "Reply:", cut where the model starts
    another example; without the label the text is kept whole (judged on what it said). Others:
    unchanged.

    >>> raw = "Thinking: they are proud. Reply: That took nerve! Thinking: more"
    >>> reply_text(raw, "few-shot-cot")
    'That took nerve! '
    """
    if style not in COT_STYLES + EXAMPLE_STYLES:
        return raw
    parts = _REPLY_LABEL.split(raw, maxsplit=1)
    if len(parts) != 2:
        return raw  # no "Reply:" label
    return _NEXT_EXAMPLE.split(parts[1], maxsplit=1)[0]


def user_messages(profile: Profile, context: Context, turns: list[Turn]) -> list[dict]:
    """The simulated user's prompt: the situation, and the Big Five profile as its personality."""
    feeling = f" You feel {context.emotion}." if context.emotion else ""
    system = (
        f"You are role-playing a real person chatting with a group of AI companions. Your "
        f"situation: {context.situation}{feeling} Your personality: {profile.description} Write "
        "only your own next chat message: one to three sentences, first person, no names, no "
        "quotation marks. Never act as an assistant."
    )
    task = (
        f"Conversation so far:\n{render_history(turns)}\n\nWrite your next message as the person."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


# --- Fixed turn-taking rules: the director's interface, name + choose(convs) -> list[Directive] --
def least_spoken_agent(personas: PersonaSet, conv: Conversation) -> str:
    """The agent who has spoken least (earliest in the roster on ties), never the last speaker when
    another is available: the fallback of every unparseable directive, and the rule to beat."""
    spoken = conv.agent_turns()
    counts = Counter(t.speaker for t in spoken)
    last = spoken[-1].speaker if spoken else None
    names = personas.names()

    def rank(i: int) -> tuple:
        # fewest turns first, then anyone but the last speaker, then roster order
        return (counts.get(names[i], 0), names[i] == last, i)

    return names[min(range(len(names)), key=rank)]


class Rule:
    """A fixed turn-taking rule: its name and choose(convs) -> a Directive per conversation."""

    def __init__(self, personas: PersonaSet, seed: int = 0):
        self.personas = personas
        self.seed = seed


class RoundRobin(Rule):
    """Agents speak in roster order (MultiAgentESC's fixed turns)."""

    name = "round-robin"

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        names = self.personas.names()
        return [Directive(names[len(c.agent_turns()) % len(names)]) for c in convs]


class RandomOrder(Rule):
    """A uniformly random agent each turn (the paper's MASCOT-C: no director)."""

    name = "random"

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        directives = []
        for c in convs:
            # Seeded per (conversation, turn): the order never depends on what else is in the batch.
            rng = random.Random(derive_seed(self.seed, c.seed, len(c.turns)))
            directives.append(Directive(rng.choice(self.personas.names())))
        return directives


class LeastSpoken(Rule):
    """The agent who has spoken least (least_spoken_agent): every agent is heard about equally."""

    name = "least-spoken"

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        return [Directive(least_spoken_agent(self.personas, c)) for c in convs]


# --- The conversation loop, batched across conversations ----------------------------------------
@dataclass
class Cast:
    """The frozen parts of a conversation. A model is local (plumbing/loading.load_model) or served
    (plumbing/served.py: any object with generate_texts; its tokenizer None)."""

    personas: PersonaSet
    speaker_model: object
    speaker_tok: object
    user_model: object
    user_tok: object
    max_new_tokens: int
    temperature: float = 0.8
    top_p: float = 0.95
    style: str = "persona"  # speaker prompt style (STYLES)
    examples: list = field(default_factory=list)  # data/fewshot.json entries for EXAMPLE_STYLES
    guard: object = None  # a crisis guard (extras/safety.py) where people read along
    on_token: object = None  # models.DecodeOptions.on_token for agent turns (the chat streams)
    # Who writes the agent turns, speak(convs, directives, cast): None is agents_speak, the
    # speakers themselves; a baseline's pipeline (extras/baselines.py) replaces it.
    speak: Callable | None = None


@dataclass(frozen=True)
class TurnPlan:
    """How the conversations unfold: how many agent turns, and when the simulated user answers."""

    n_agent_turns: int = 6
    user_every: int = 2  # the user answers once this many agents have spoken (0: never)


def turn_seed(conv: Conversation, salt: int = 0) -> int:
    """The next turn's seed, from the conversation's seed and length: two copies of a conversation
    (a GRPO group in stage 2) sample alike turn by turn, so only the director's choice differs."""
    return derive_seed(conv.seed, len(conv.turns), salt)


def agents_speak(convs: list[Conversation], directives: list[Directive], cast: Cast) -> None:
    """One agent turn for each live (conversation, directive), in one batch."""
    live = []  # (conversation, directive, persona) of the conversations still going
    for c, d in zip(convs, directives):
        if not c.ended:
            # A directive naming no known agent (a slip of the director) goes to the first one.
            live.append((c, d, cast.personas.find(d.agent) or cast.personas.personas[0]))
    if not live:
        return
    prompts = [
        speaker_messages(p, cast.personas, c.context, c.turns, d, cast.style, cast.examples)
        for c, d, p in live
    ]
    budget = cast.max_new_tokens
    if cast.style in COT_STYLES:
        budget *= 2  # the thinking must not eat the reply
    texts = models.generate_texts(
        cast.speaker_model,
        cast.speaker_tok,
        prompts,
        budget,
        cast.temperature,
        cast.top_p,
        seeds=[turn_seed(c) for c, _, _ in live],
        on_token=cast.on_token,
    )
    for (conv, d, persona), raw in zip(live, texts):
        reply = reply_text(raw, cast.style)
        # Nothing left once cleaned still makes a turn: the conversation keeps its shape.
        text = models.clean_reply(reply, persona.name, cast.personas.names()) or "..."
        conv.turns.append(Turn(persona.name, text, d))


def users_speak(convs: list[Conversation], profiles: dict[str, Profile], cast: Cast) -> None:
    """The simulated user's next message in each live conversation, in one batch. Its seeds are
    salted apart from the agents' (salt=1): a user message and an agent turn at the same point of
    a conversation never share a seed."""
    live = [c for c in convs if not c.ended]
    if not live:
        return
    texts = models.generate_texts(
        cast.user_model,
        cast.user_tok,
        [user_messages(profiles[c.profile], c.context, c.turns) for c in live],
        cast.max_new_tokens,
        cast.temperature,
        cast.top_p,
        seeds=[turn_seed(c, salt=1) for c in live],
    )
    for conv, raw in zip(live, texts):
        text = models.clean_reply(raw, USER, cast.personas.names()) or "Okay."
        add_user_turn(conv, text, cast.guard)


def turns_since_user(conv: Conversation) -> int:
    """Agent turns since the user (or the crisis message) last spoke."""
    people = [j for j, t in enumerate(conv.turns) if t.speaker in (USER, SAFETY)]
    last = max(people, default=-1)
    return len(conv.turns) - 1 - last


def advance(
    convs: list[Conversation],
    policy,
    cast: Cast,
    profiles: dict[str, Profile],
    plan: TurnPlan,
    fixed_first: list[Directive] | None = None,
    desc: str = "",
) -> None:
    """Advance every conversation by plan.n_agent_turns agent turns, the user answering a
    conversation once plan.user_every agents have spoken since its last message (0: never).
    fixed_first: directives for the FIRST turn instead of the policy's (stage 2 rolls out a sampled
    directive this way). desc: the progress line's label (plumbing/common.progress)."""
    speak = agents_speak
    if cast.speak is not None:
        speak = cast.speak  # a baseline's pipeline (extras/baselines.py)
    n = plan.n_agent_turns
    for k in progress(range(n), desc):
        if all(c.ended for c in convs):
            return
        if k == 0 and fixed_first is not None:
            directives = fixed_first
        else:
            directives = policy.choose(convs)
        speak(convs, directives, cast)
        every = plan.user_every
        due = [c for c in convs if not c.ended and turns_since_user(c) >= every]
        # No answer after the last agent turn: nothing would read it.
        if every > 0 and due and k < n - 1:
            users_speak(due, profiles, cast)


def run_conversations(
    contexts: list[Context],
    policy,
    cast: Cast,
    profiles: dict[str, Profile],
    profile_ids: list[str],
    plan: TurnPlan = TurnPlan(),
    seed: int = 0,
    desc: str = "",
) -> list[Conversation]:
    """One conversation per (context, profile id), all advanced together. Conversation i gets seed
    `seed + i`, so two systems compared on one seed see the same contexts, profiles and seeds."""
    convs = [
        start_conversation(ctx, cast.personas.name, pid, policy.name, seed + i, cast.guard)
        for i, (ctx, pid) in enumerate(zip(contexts, profile_ids))
    ]
    advance(convs, policy, cast, profiles, plan, desc=desc)
    return convs


def assign_profiles(n: int, profile_ids: list[str], seed: int) -> list[str]:
    """Profile ids spread over n conversations, cycling, then shuffled (seeded): every profile is
    used about as often, in no fixed order of the contexts."""
    ids = [profile_ids[i % len(profile_ids)] for i in range(n)]
    random.Random(seed).shuffle(ids)
    return ids
