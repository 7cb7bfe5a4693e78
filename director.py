"""director.py: who speaks next, and how (the paper's Phase II, collaborative dialogue
optimisation).

The director reads the conversation and writes a directive in the format of the paper's figure
(arXiv 2601.14230, Fig. 2):

    Agent: Anchor
    Action: validate the feeling of guilt and make them feel safe
    Tone: calm and empathetic

Where it sits: stage 2 of `mascot.py train`, after the speakers of stage 1 are frozen. As grpo.py
runs it: at a decision point sample G directives; roll each out N agent turns with the FROZEN
speakers and simulated user (the same seeds, so only the directive differs), the director itself
(greedy, its current weights) directing turns 2..N; score each block with the group reward
(`block_reward`); update the director on the sampled directive's tokens. The evaluation runs the
same director greedily (`LLMDirector`).

The file reads in the order of a stage-2 step:
  1. the prompt and a parser for the answer;
  2. the LLM director;
  3. the group reward of an N-turn block, one small function per component;
  4. with ESConv, the group reward's two grounded terms (`Grounding`) and the directives that map
     ESConv's strategies onto the companions (`STRATEGY_DIRECTIVES`);
  5. collapse diagnostics: does the director always name the same agent?
  6. decision points, rollouts and the reward of a sampled directive.

Simplified: the paper publishes neither the group reward model nor its inputs. The horizon N, the
weights and the block judge are flags; with an LLM judge the block gets one holistic judgement,
with the offline judge the mean score of its turns; balance, format and the grounded terms are ours.

    python mascot.py train --stage 2 --director-warmup-data path/to/esconv/train.jsonl
"""

import copy
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import torch

import models
from judge import StrategyClassifier
from metrics import (
    HACKS,
    content_words,
    entropy_bits,
    mutual_information_bits,
    paired_change,
    permutation_p_value,
    sentence_bleu,
    standard_error,
    tokenize,
)
from plumbing.common import option
from plumbing.files import prompt
from scenarios import SUPPORT_STRATEGIES, PersonaSet, require_mapping, split_contexts
from simulate import (
    JUDGE_TURNS,
    SAFETY,
    USER,
    Conversation,
    Directive,
    LeastSpoken,
    RandomOrder,
    TurnPlan,
    advance,
    assign_profiles,
    diagnose_reply,
    judge_state,
    least_spoken_agent,
    render_history,
    run_conversations,
)


# --- 1. The prompt, and a parser for the answer -------------------------------------------------
def director_messages(personas: PersonaSet, conv: Conversation) -> list[dict]:
    """The chat asking for the next `Agent / Action / Tone`.

    The roster gives names and roles only (the speakers' prompts carry the descriptions): a third
    shorter, so every director generation and GRPO pass is cheaper. Who spoke last, and what they
    were asked to do, is said outright: a small director reads a named field far more easily than
    a speaker line above the user's message, and what real supporters do next depends on what was
    just done."""
    spoken = conv.agent_turns()
    counts = Counter(t.speaker for t in spoken)
    last = ""
    if spoken:
        last = f" Last to speak: {spoken[-1].speaker}"
        asked = spoken[-1].directive
        if asked and asked.action:
            last += f", asked to {asked.action}"
        last += "."
    roster = "\n".join(f"- {p.name}, the {p.role}" for p in personas.personas)
    system = (
        "You direct a group chat in which several companions talk with one person. "
        "The companions:\n"
        f"{roster}\n"
        "Choose who should speak next and how, so that the group stays helpful, varied and "
        "never repeats itself. Answer with exactly three lines:\n"
        "Agent: <one companion name>\n"
        "Action: <what they should do>\n"
        "Tone: <how they should sound>\n"
        f"Useful actions: {'; '.join(personas.strategies)}.\n"
        f"Useful tones: {'; '.join(personas.tones)}."
    )
    so_far = ", ".join(f"{p.name} {counts.get(p.name, 0)}x" for p in personas.personas)
    user = (
        f"Situation: {conv.context.situation}\n\n"
        f"Conversation so far:\n{render_history(conv.turns)}\n\n"
        f"Turns so far: {so_far}.{last}\n"
        "Who speaks next, and how?"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# One field per line, whatever markdown a small model wraps it in ("**Agent:** Beacon",
# "- Tone = warm").
_FIELD = re.compile(
    r"^[\s\*\-#>\"'`]*(agent|speaker|next|action|strategy|tone)[\s\*\"'`]*[:=\-–—]\s*(.*)$",
    re.IGNORECASE,
)
# Words models use for the same field: "Speaker: Anchor" names the agent, "Strategy:" the action.
_SYNONYMS = {"speaker": "agent", "next": "agent", "strategy": "action"}
# What a directive may carry into a speaker's prompt. The Action stays free text (the paper's
# director writes its own actions) but short: the set's strategies are under 50 characters and the
# paper's example about 55. A Tone is a word or three ("calm and steady").
ACTION_CHARS = 120
TONE_CHARS = 40


def parse_directive(text: str, personas: PersonaSet, fallback_agent: str) -> Directive:
    """`Agent / Action / Tone` out of free text; never raises.

    Robust to case, markdown ("**Agent:**"), extra text, "Speaker"/"Strategy" as synonyms and an
    agent named by its role or inside a phrase ("Agent: I think Beacon should go"). No known agent:
    invalid, and `fallback_agent` speaks (the format term of the group reward penalises it; the logs
    count it). What reaches a speaker's prompt is bounded (`bounded_field`, `known_tone`): a served
    or trained director's text is not trusted to be a directive."""
    fields: dict[str, str] = {}
    for line in (text if isinstance(text, str) else "").splitlines():
        m = _FIELD.match(line)
        if m:
            key = _SYNONYMS.get(m.group(1).lower(), m.group(1).lower())
            fields.setdefault(key, m.group(2))  # the first value of a field wins
    named = bounded_field(fields.get("agent", ""), 200)  # only ever matched against the roster
    action = bounded_field(fields.get("action", ""), ACTION_CHARS)
    tone = known_tone(bounded_field(fields.get("tone", ""), TONE_CHARS), personas.tones)
    persona = personas.find(named) if named else None
    if persona is None and named:
        persona = first_persona_named(named, personas)
    agent = persona.name if persona else fallback_agent
    return Directive(agent, action, tone, persona is not None, (text or "")[:1000])


def bounded_field(value: str, limit: int) -> str:
    """One field's value as a prompt may carry it: one line of printable characters (a control or
    format character, e.g. an escape sequence's ESC, a bidi override or a zero-width space, is
    dropped; any other space becomes a plain one), markdown quotes and stars stripped, at most
    `limit` characters."""
    kept = "".join(" " if ch.isspace() else ch for ch in value if ch.isprintable() or ch.isspace())
    return kept.strip().strip("*\"'`").strip()[:limit].rstrip()


def known_tone(tone: str, tones: list[str]) -> str:
    """The tone if every word of it is a word of the set's tone list ("calm" of "calm and steady",
    "warm and gentle"), else "" (none). Dropped, not replaced by the nearest listed tone: that would
    put a choice in the director's mouth; without a tone the speaker keeps its card's own style."""
    vocabulary = {w for t in tones for w in re.findall(r"[^\W\d_]+", t.casefold())}
    words = re.findall(r"[^\W\d_]+", tone.casefold())
    if not tones or (words and set(words) <= vocabulary):
        return tone
    return ""


def first_persona_named(phrase: str, personas: PersonaSet):
    """The persona whose name or role comes first in a phrase ("I think Beacon should go"), or None.
    Whole words only, so "Guide" does not match inside "guidelines"."""
    best = None  # (position, persona)
    for p in personas.personas:
        for key in (p.name, p.role):
            m = re.search(rf"\b{re.escape(key.lower())}\b", phrase.lower())
            if m and (best is None or m.start() < best[0]):
                best = (m.start(), p)
    return best[1] if best else None


def parse_many(
    texts: list[str], convs: list[Conversation], personas: PersonaSet
) -> list[Directive]:
    """One directive per conversation, each falling back to its least-spoken agent."""
    return [
        parse_directive(t, personas, least_spoken_agent(personas, c)) for t, c in zip(texts, convs)
    ]


# --- 2. The LLM director ------------------------------------------------------------------------
# Three short lines fit in 40 tokens; the same budget when GRPO samples and when the director runs.
DIRECTIVE_MAX_TOKENS = 40


class LLMDirector:
    """A language model that writes the directive, greedily (evaluation, chat); GRPO samples from
    the same model with the same prompt, so what is trained is what runs."""

    def __init__(self, model, tok, personas: PersonaSet, name: str = "director"):
        self.model = model
        self.tok = tok
        self.personas = personas
        self.name = name
        self.invalid = 0  # directives that needed the fallback, for the logs
        self.total = 0

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        texts = models.generate_texts(
            self.model,
            self.tok,
            [director_messages(self.personas, c) for c in convs],
            DIRECTIVE_MAX_TOKENS,
            seeds=None,
        )
        out = parse_many(texts, convs, self.personas)
        self.total += len(out)
        self.invalid += sum(not d.valid for d in out)
        return out


# --- 3. The group reward of an N-turn block -----------------------------------------------------
@dataclass
class RewardWeights:
    """The group reward's weights, each a flag (`--w-coherence` ...). The paper's Group Reward Model
    judges "global state consistency and interaction quality" (coherence, diversity, effective
    contribution); clean makes the hack diagnostics part of the score; balance and format are
    ours."""

    coherence: float = option(
        1.0, "weight of coherence (an LLM judge's view of the block, or the mean turn score)"
    )
    nonredundancy: float = option(
        1.0, "weight of non-redundancy (1 - overlap with earlier agent turns)"
    )
    contribution: float = option(0.5, "weight of contribution (share of new content words)")
    clean: float = option(
        1.0, "weight of hack-free turns (share of the block's turns no hack diagnostic flags)"
    )
    balance: float = option(0.5, "weight of balance (who spoke; our addition)")
    format: float = option(
        0.5, "weight of format (share of the block's directives that parsed; our addition)"
    )
    plausible: float = option(
        1.0, "weight of plausible (what real supporters do next; with ESConv, our addition)"
    )
    compliant: float = option(
        1.0, "weight of compliant (each agent did what it was asked; with ESConv, our addition)"
    )


# The components every block gets, in the order they are logged and summed.
BLOCK_COMPONENTS = ("coherence", "nonredundancy", "contribution", "clean", "balance", "format")


def block_reward(
    conv: Conversation,
    start: int,
    personas: PersonaSet,
    encoder,
    judge,
    weights: RewardWeights,
    counts: Counter | None = None,
    grounding=None,
) -> tuple[float, dict]:
    """The group reward of the block of turns from `start` on: sum over components k of
    weights.k * component k, each component one small function below, each in [0, 1]:
      coherence      the block hangs together, and with what came before   coherence_term
      nonredundancy  no turn restates an earlier agent turn                nonredundancy_term
      contribution   the block brings content words new to the talk        contribution_term
      clean          no hack diagnostic flags a turn                       clean_term
      format         the block's directives parsed (ours)                  format_term
      balance        every companion speaks, none twice running (ours)     balance_term
    With `grounding` (ESConv's labels: `Grounding`, section 4), plausible and compliant join them
    (ours; compliant falls below 0 for a turn less compliant than chance).

    The paper's group reward model judges coherence, diversity and effective contribution
    (arXiv 2601.14230, Phase II) and publishes no more; each component here is one of those, or a
    guard we add so that GRPO cannot raise the sum by a shortcut (hacked turns, one agent speaking
    every turn, unparseable directives). `counts["unreadable"]` counts an LLM judge's garbled
    answers. A block without an agent turn (the conversation had ended) scores 0 on every
    component: it cannot be better than a block in which someone spoke."""
    comp = dict.fromkeys(BLOCK_COMPONENTS, 0.0)
    comp.update(grounding(conv, start) if grounding else {})  # both 0 when no companion spoke
    new = block_turns(conv, start)
    if not new:
        return 0.0, comp
    comp["coherence"] = coherence_term(conv, start, new, personas, judge, counts)
    comp["nonredundancy"] = nonredundancy_term(conv, start, new, encoder)
    comp["contribution"] = contribution_term(conv, start, new)
    comp["clean"] = clean_term(conv, new, personas)
    comp["format"] = format_term(new)
    comp["balance"] = balance_term(conv, new, personas)
    total = sum(getattr(weights, k) * v for k, v in comp.items())
    return total, comp


def block_turns(conv: Conversation, start: int) -> list[tuple[int, object]]:
    """(index, turn) of the block's agent turns: the simulated user and the safety guard speak in
    a block too, but the group reward is about what the companions said."""
    return [
        (i, t) for i, t in enumerate(conv.turns) if i >= start and t.speaker not in (USER, SAFETY)
    ]


def coherence_term(conv, start, new, personas, judge, counts) -> float:
    """Does the block hang together, and with what came before? An LLM judge answers for the block
    as a whole (`judged_block`); a scoring judge (offline, reward model) can only score turns, so
    the block gets the mean score of its turns (`mean_turn_score`)."""
    if judge.can_generate:
        return judged_block(conv, start, personas, judge, counts)
    return mean_turn_score(conv, new, personas, judge)


def judged_block(conv, start, personas, judge, counts) -> float:
    """ONE 1-5 judgement of the whole block against what came before, which a per-turn score
    cannot give (two good turns that say the same thing). The question is ours (the paper's is not
    published): data/prompts/block_judge.txt. An unreadable answer is a neutral 0.5, counted in
    counts["unreadable"] so the logs show how often the judge garbles."""
    question = prompt("block_judge").format(
        situation=conv.context.situation,
        roles=", ".join(f"{p.name} the {p.role}" for p in personas.personas),
        before=render_history(conv.turns[:start], JUDGE_TURNS),
        block=render_history(conv.turns[start:], 99),  # every turn of the block
    )
    score = judge.rate_many([question], 16)[0]  # "Score: N" fits in 16 tokens
    if counts is not None:
        counts["unreadable"] += score is None
    if score is None:
        return 0.5
    return (score - 1) / 4  # 1..5 -> [0, 1]


def mean_turn_score(conv, new, personas, judge) -> float:
    """The mean judge score of the block's turns, each judged as stage 1 judges a reply: by its
    speaker's persona, against the turns before it (simulate.judge_state)."""
    states = [
        judge_state(personas.find(t.speaker), conv.turns[:i], conv.context.situation)
        for i, t in new
    ]
    replies = [t.text for _, t in new]
    return sum(judge.score_many(states, replies)) / len(replies)


def nonredundancy_term(conv, start, new, encoder) -> float:
    """1 - mean over the block's turns of its overlap with every agent turn before it (earlier in
    the conversation or in the block). The paper's diversity: companions that restate each other
    are the "poor interaction synergy" it sets out to fix. A turn with nothing before it overlaps
    with nothing (it still counts in the mean)."""
    earlier = [t.text for t in conv.turns[:start] if t.speaker not in (USER, SAFETY)]
    replies = [t.text for _, t in new]
    overlaps = []
    for k, text in enumerate(replies):
        before = earlier + replies[:k]
        if before:
            overlaps.append(overlap(text, before, encoder))
    return 1.0 - sum(overlaps) / len(replies)


def overlap(text: str, before: list[str], encoder) -> float:
    """How much `text` repeats its nearest earlier turn, in [0, 1]: the larger of the cosine of
    their sentence embeddings (the same point in other words) and BLEU-2 (the same words, which an
    embedding of a short turn can miss)."""
    vecs = encoder.embed([text] + before)  # (1 + m, D) unit rows
    cosine = float((vecs[1:] @ vecs[0]).max().clamp(min=0.0))  # (m,) -> nearest earlier turn
    bleu = sentence_bleu(tokenize(text), [tokenize(b) for b in before], max_n=2)
    return max(cosine, bleu)


def contribution_term(conv, start, new) -> float:
    """The paper's effective contribution, measured as the share of the block's content words that
    are new to the conversation: a turn that adds nothing the person has not heard scores 0."""
    old = set().union(*(content_words(t.text) for t in conv.turns[:start]))
    fresh = set().union(*(content_words(t.text) for _, t in new))
    if not fresh:
        return 0.0
    return len(fresh - old) / len(fresh)


def clean_term(conv, new, personas) -> float:
    """The share of the block's turns that no hack diagnostic flags (metrics.HACKS: copying the
    user, echoing another agent, leaking the prompt, trivial turns, reciting the card). The
    diagnostics that stage 1 logs become part of stage 2's score, so a block of hacked turns does
    not score well where the judge misses the hack."""
    names = personas.names()
    flagged = 0
    for i, t in new:
        persona = personas.find(t.speaker)
        flags = diagnose_reply(persona, conv.turns[:i], conv.context.situation, t.text, names)
        flagged += any(flags[k] for k in HACKS)
    return 1.0 - flagged / len(new)


def format_term(new) -> float:
    """The share of the block's directives that parsed (ours): an unparseable one hands the turn to
    the least-spoken fallback, and without this term GRPO would be indifferent to writing one. A
    fixed rule's turn (directive None) always counts as parsed."""
    parsed = sum(t.directive is None or t.directive.valid for _, t in new)
    return parsed / len(new)


def balance_term(conv, new, personas) -> float:
    """Who spoke (ours): the entropy of the speakers over the whole conversation / log2(#agents)
    (1: every companion as often), times 1 - the share of block turns whose speaker repeats the
    agent turn before. Without it a director could name one favourite agent every turn (the
    collapse that section 5 measures)."""
    names = personas.names()
    if len(names) <= 1:
        # With one persona nobody else could have spoken: perfect balance (and no log(1) = 0 to
        # divide by).
        return 1.0
    speakers = [t.speaker for t in conv.agent_turns()]
    # The block's turns are the last len(new) agent turns, each compared with the agent turn before
    # it (the block's first with the one before the block; the conversation's first with none).
    first = max(len(speakers) - len(new), 1)
    repeats = sum(speakers[j] == speakers[j - 1] for j in range(first, len(speakers)))
    spread = entropy_bits(speakers) / math.log2(len(names))
    return spread * (1 - repeats / len(new))


# --- 4. With ESConv: whose job each strategy is, and the group reward's grounded terms ----------
# personas.json says whose job each strategy is (in ESConv's words, Affirmation and Reassurance
# "affirm[s] the help-seeker's strengths", Beacon's job; Self-disclosure, "divulge similar
# experiences ... to express your empathy", is validation, Anchor's); here, the Action and Tone of a
# directive for each. The director's warm start (warmstart.py) writes these as its targets, and
# `Grounding` reads them back out of a directive. "Others" (greetings, thanks) is nobody's job: such
# a turn stays in the history, never a target.
STRATEGY_DIRECTIVES = {
    "Question": ("ask a probing question", "curious"),
    "Restatement or Paraphrasing": ("reflect back what was said", "calm and steady"),
    "Reflection of feelings": ("validate the feeling", "warm"),
    "Self-disclosure": ("share a similar feeling so they feel less alone", "gentle"),
    "Affirmation and Reassurance": ("name a strength", "encouraging"),
    "Providing Suggestions": ("suggest one small step", "practical"),
    "Information": ("share useful information", "thoughtful"),
}
# Where a supporter is in a dialogue: 0, 1, 2 or 3+ supporter turns so far. ESConv's dialogues move
# from exploration to comfort to action (Liu et al. 2021), so what is plausible depends on it.
STAGES = 4
# The row of the transition table for "no previous strategy" (the block opens the dialogue).
OPENING = len(SUPPORT_STRATEGIES)


def directive_for(strategy: str, personas) -> Directive | None:
    """The directive a supporter turn of this strategy answers: its persona (the card that lists the
    strategy), the strategy's action and tone; None for a strategy no card lists."""
    agent = next((p.name for p in personas.personas if strategy in p.esconv_strategies), None)
    if agent and strategy in STRATEGY_DIRECTIVES:
        action, tone = STRATEGY_DIRECTIVES[strategy]
        return Directive(agent, action, tone)
    return None


def plausible_term(q: torch.Tensor, p: torch.Tensor) -> float:
    """E_q[P(s)] / max_s P(s): q (8,) the classifier's reading of a turn, p (8,) how often real
    supporters used each strategy at that point. 1: the turn did what real supporters most often
    do there: dividing by the max puts the best possible turn at 1 at every point, however spread
    real supporters' choices were there."""
    return float(q @ p / p.max())


def compliant_term(q: torch.Tensor, asked: list[int], prior: torch.Tensor) -> float:
    """q's mass on the asked strategies, chance-corrected: (q(A) - pi(A)) / (1 - pi(A)), q (8,)
    the classifier's reading of the turn, A the asked strategies' indices, pi (8,) the share of
    training turns labelled with each. 1: did what was asked; 0: as often as any supporter turn
    would, so one strategy asked for is not held to a lower mark than a card's three."""
    chance = prior[asked].sum()
    return float((q[asked].sum() - chance) / (1 - chance))


def strategy_counts(dialogues) -> tuple[torch.Tensor, torch.Tensor]:
    """How often ESConv's supporters used each strategy, add-one smoothed: the transitions
    P(s | stage, previous strategy) (STAGES, 9, 8), the previous one OPENING at a dialogue's start,
    and the prior pi(s) (8,). Turns labelled with no ESConv strategy are skipped."""
    n = len(SUPPORT_STRATEGIES)
    counts = torch.ones(STAGES, n + 1, n)  # (stage, previous or opening, strategy)
    seen = torch.ones(n)  # (strategy,): its labels, add-one
    for context in dialogues:
        labels = [
            SUPPORT_STRATEGIES.index(t["strategy"])
            for t in context.turns
            if t["speaker"] != "user" and t.get("strategy") in SUPPORT_STRATEGIES
        ]
        for k, s in enumerate(labels):
            previous = labels[k - 1] if k else OPENING
            counts[min(k, STAGES - 1), previous, s] += 1
            seen[s] += 1
    transition = counts / counts.sum(-1, keepdim=True)  # (4, 9, 8): P(s | stage, previous)
    prior = seen / seen.sum()  # (8,): pi(s)
    return transition, prior


class Grounding:
    """block_reward's two terms from human labels (ours), each a mean over the block's agent turns:
      plausible  did the turn do what ESConv's supporters most often did at that point (its stage,
                 after the previous agent turn's strategy)? `plausible_term`;
      compliant  did the agent do what its directive asked? `compliant_term`, A the strategy whose
                 warm-start action (STRATEGY_DIRECTIVES) its Action names, else the strategies of
                 the speaker's card (a rule's directive names no action).
    A turn's strategies are read by the judge's classifier (judge.StrategyClassifier), the previous
    turn's as its top reading. The counts come from the training dialogues only: held-out dialogues
    (held_out, seed: the run's split) are left out. The offline judge scores a reply; these terms
    say whether the group did, at that moment, what real supporters do (Liu et al. 2021 ESConv)."""

    def __init__(self, contexts, personas, encoder, held_out: float, seed: int):
        require_mapping(personas)
        self.classifier = StrategyClassifier(encoder)
        self.personas = personas
        train = split_contexts(contexts, held_out, seed)[0]
        self.transition, self.prior = strategy_counts(train)  # (4, 9, 8), (8,)

    def __call__(self, conv: Conversation, start: int) -> dict[str, float]:
        agent = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
        first = next((k for k, i in enumerate(agent) if i >= start), len(agent))
        if first == len(agent):
            return {"plausible": 0.0, "compliant": 0.0}
        before = min(first, 1)  # the agent turn before the block is read for its strategy only
        read = agent[first - before :]
        texts = [conv.turns[i].text for i in read]
        answered = [what_it_answers(conv, i) for i in read]
        q = self.classifier.probs(texts, answered)  # (M, 8)
        plausible = []
        compliant = []
        for m in range(before, len(read)):
            k = first - before + m  # agent turns before this one
            previous = OPENING
            if m:
                previous = int(q[m - 1].argmax())
            p = self.transition[min(k, STAGES - 1), previous]  # (8,)
            plausible.append(plausible_term(q[m], p))
            asked = self.asked(conv.turns[read[m]])
            compliant.append(compliant_term(q[m], asked, self.prior))
        return {
            "plausible": sum(plausible) / len(plausible),
            "compliant": sum(compliant) / len(compliant),
        }

    def asked(self, turn) -> list[int]:
        """The indices of the strategies a turn was asked for: those whose warm-start action its
        directive names, else its speaker card's."""
        action = turn.directive.action.lower() if turn.directive else ""
        named = [s for s, (a, _) in STRATEGY_DIRECTIVES.items() if a in action]
        strategies = named or self.personas.find(turn.speaker).esconv_strategies
        return [SUPPORT_STRATEGIES.index(s) for s in strategies]


def what_it_answers(conv: Conversation, i: int) -> str:
    """The user's message a turn answers (the last one before it), else the situation: a strategy
    answers something, and the classifier reads the two together."""
    for t in reversed(conv.turns[:i]):
        if t.speaker == USER:
            return t.text
    return conv.context.situation


# --- 5. Collapse: does the director always name the same agent? ---------------------------------
def stage_feature(conv: Conversation) -> str:
    """How far the conversation is (agent turns so far: 0, 1, 2, 3+): a director that reads the
    conversation should choose differently at different stages."""
    n = len(conv.agent_turns())
    return str(n) if n < 3 else "3+"


def choice_diagnostics(
    agents: list[str], stages: list[str], names: list[str], test: bool = True, seed: int = 0
) -> dict:
    """Counts per agent, entropy in bits (and / log2 #agents: 1 = uniform), I(choice; stage) in
    bits, and with `test` the permutation p-value of independence (exact on a few dozen points). Low
    entropy is collapse onto one agent; zero mutual information a director that ignores where the
    conversation is."""
    h = entropy_bits(agents)
    out = {
        "counts": {n: agents.count(n) for n in names},
        "distinct": len(set(agents)),
        "entropy": h,
        "entropy_norm": h / math.log2(len(names)) if len(names) > 1 else 0.0,
        "mi": mutual_information_bits(agents, stages),
    }
    if test:
        out["p_perm"] = permutation_p_value(agents, stages, seed=seed)
    return out


# --- 6. Stage 2: decision points, rollouts, and the reward of a sampled directive ----------------
@dataclass
class DirectorConfig:
    """Stage 2's own settings (GRPO's are grpo.GRPOConfig); each is also a `train` flag."""

    decision_points: int = option(
        24, "training decision points (conversation prefixes)", "positive"
    )
    heldout_points: int = option(
        8, "held-out decision points for the before/after group reward", "positive"
    )
    rollout_turns: int = option(
        3,
        "N: agent turns rolled out after each sampled directive (the director "
        "itself directs turns 2..N)",
        "positive",
    )
    director_warmup: int = option(
        20,
        "supervised steps (4 examples each) before GRPO on ESConv's strategies "
        "(--director-warmup-data) or the format alone; 0: none",
        "non-negative",
    )
    warmup_lr: float = option(2e-5, "learning rate of the warm start", "positive")
    warmup_agent_weight: float = option(
        5.0, "loss weight of the warm start's `Agent:` tokens (~5 of ~25)", "positive"
    )
    eval_prompted: bool = option(
        True, "evaluate the initial director, prompted, on the held-out points first"
    )
    director_warmup_data: str = option(
        "", "ESConv file: its supporters' strategies, mapped onto personas, as targets"
    )
    warmup_balanced: bool = option(
        False, "ESConv targets: as many per agent, none repeating the last speaker"
    )


def build_decision_points(
    contexts, n: int, cast, profiles, user_every: int, seed: int, max_prefix: int = 3
):
    """Conversation prefixes at DIFFERENT positions: point i starts from context i (cycling) with a
    Big Five profile and is cut after i mod (max_prefix + 1) agent turns (and the user's answer),
    so openings and mid-conversation choices are both learnt. Generated once, in random speaking
    order (varied histories), by the frozen speakers and user."""
    convs = run_conversations(
        [contexts[i % len(contexts)] for i in range(n)],
        RandomOrder(cast.personas, seed),
        cast,
        profiles,
        assign_profiles(n, sorted(profiles), seed),
        TurnPlan(max_prefix, user_every),
        seed,
        desc="decision points, agent turns",
    )
    points = []
    for i, conv in enumerate(convs):
        cut = prefix_end(conv, i % (max_prefix + 1))
        point = copy.deepcopy(conv)
        point.turns = point.turns[:cut]
        point.policy = "prefix"
        if not point.ended:
            points.append(point)
    return points


def prefix_end(conv: Conversation, k: int) -> int:
    """Where a decision point after k agent turns ends: just after the k-th agent turn and the
    user's answer to it; k = 0 keeps only the user's opening message; a conversation with fewer
    than k agent turns is kept whole."""
    agent_idx = [j for j, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    if k == 0:
        cut = 1
    elif len(agent_idx) >= k:
        cut = agent_idx[k - 1] + 1
    else:
        cut = len(conv.turns)
    while cut < len(conv.turns) and conv.turns[cut].speaker == USER:
        cut += 1  # include the user's answer to that turn
    return cut


@dataclass
class Rollout:
    """Rolls conversations forward N agent turns and scores the blocks."""

    cast: object
    profiles: dict
    personas: PersonaSet
    encoder: object
    judge: object
    weights: RewardWeights
    n_turns: int
    user_every: int
    # Who directs turns 2..N of a training rollout: the director being trained.
    follow: object = None
    invalid: int = 0  # sampled directives that needed the fallback
    total: int = 0
    # "unreadable": block judgements an LLM judge garbled.
    counts: Counter = field(default_factory=Counter)
    grounding: object = None  # with ESConv: the plausible and compliant terms (block_reward)

    def run(
        self,
        points: list[Conversation],
        policy,
        first: list[Directive] | None = None,
        desc: str = "",
    ):
        """Copy each point and play N agent turns (`first` replaces the policy's first choice).
        Copies of one point keep its seed, so a GRPO group's rollouts sample alike turn by turn."""
        copies = [copy.deepcopy(p) for p in points]
        starts = [len(c.turns) for c in copies]
        advance(
            copies,
            policy,
            self.cast,
            self.profiles,
            TurnPlan(self.n_turns, self.user_every),
            fixed_first=first,
            desc=desc,
        )
        scored = []
        for c, s in zip(copies, starts):
            scored.append(
                block_reward(
                    c,
                    s,
                    self.personas,
                    self.encoder,
                    self.judge,
                    self.weights,
                    self.counts,
                    self.grounding,
                )
            )
        return scored, copies

    def score_directives(self, points: list[Conversation], texts: list[str]):
        """GRPO's reward for stage 2: the group reward of each sampled directive's block (its
        decision point in `points`), with the components, how often each agent was picked and this
        step's collapse diagnostics."""
        directives = parse_many(texts, points, self.personas)
        self.total += len(directives)
        self.invalid += sum(not d.valid for d in directives)
        scored, _ = self.run(points, self.follow or LeastSpoken(self.personas), first=directives)
        comps = {k: [c[k] for _, c in scored] for k in scored[0][1]}
        for name in self.personas.names():
            comps[f"pick_{name}"] = [float(d.agent == name) for d in directives]
        diag = choice_diagnostics(
            [d.agent for d in directives],
            [stage_feature(p) for p in points],
            self.personas.names(),
            test=False,
        )
        comps["choice_entropy"] = [diag["entropy"]] * len(points)
        comps["choice_mi"] = [diag["mi"]] * len(points)
        return [r for r, _ in scored], comps

    def evaluate(self, policy, points: list[Conversation], seed: int = 0) -> dict:
        """The policy directs every turn of a block from each held-out point (same points and seeds
        for every policy, so per-point rewards can be paired): mean reward, its se, the components,
        the first-turn choices and their diagnostics, and the rollouts themselves."""
        unreadable = self.counts["unreadable"]
        scored, copies = self.run(points, policy, desc="held-out rollouts, agent turns")
        rewards = [r for r, _ in scored]
        n = len(scored)
        firsts = [c.turns[len(p.turns)].directive for c, p in zip(copies, points)]
        agents = [d.agent for d in firsts]
        stages = [stage_feature(p) for p in points]
        names = self.personas.names()
        agree = sum(a == least_spoken_agent(self.personas, p) for a, p in zip(agents, points))
        return {
            "reward": sum(rewards) / n,
            "se": standard_error(rewards),
            "rewards": rewards,
            "n": n,
            "components": {k: sum(c[k] for _, c in scored) / n for k in scored[0][1]},
            "choices": {a: agents.count(a) for a in names},
            "block_choices": block_choices(copies, points, names),
            "diagnostics": choice_diagnostics(agents, stages, names, seed=seed),
            "agree_least_spoken": agree / n,
            "invalid": sum(not d.valid for d in firsts),
            "unreadable_judgements": self.counts["unreadable"] - unreadable,
            "rollouts": [
                {"stage": s, "first_turn": len(p.turns), "components": k, **c.to_json()}
                for c, p, s, (_, k) in zip(copies, points, stages, scored)
            ],
        }


def block_choices(copies: list[Conversation], points: list[Conversation], names) -> dict:
    """How often each agent spoke in the rolled-out blocks (every turn after its point's prefix)."""
    spoke = Counter()
    for c, p in zip(copies, points):
        spoke.update(t.speaker for t in c.turns[len(p.turns) :])
    return {a: spoke[a] for a in names}


def compare(after: dict, before: dict) -> dict:
    """The paired change of the held-out group reward, point by point (same points and seeds)."""
    change, se = paired_change(before["rewards"], after["rewards"])
    return {"change": change, "se": se, "n": len(after["rewards"])}


def describe_heldout(r: dict) -> str:
    """One log line for a held-out evaluation (Rollout.evaluate)."""
    d = r["diagnostics"]
    se = "-" if r["se"] is None else f"{r['se']:.3f}"
    line = (
        f"{r['reward']:.3f} ± {se} (se, {r['n']} points)  agent choices {r['choices']}  entropy "
        f"{d['entropy']:.2f} bits  I(choice; stage) {d['mi']:.2f} bits, "
        f"permutation p {d['p_perm']:.3g}  "
        f"unparseable {r['invalid']}/{r['n']}"
    )
    if r["unreadable_judgements"]:
        line += f"  unreadable judgements {r['unreadable_judgements']}"
    return line
