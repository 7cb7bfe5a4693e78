"""director.py: who speaks next, and how (the paper's Phase II, collaborative dialogue optimisation).

The director reads the conversation and writes a directive in the format of the paper's figure:

    Agent: Anchor
    Action: validate the feeling of guilt and make them feel safe
    Tone: calm and empathetic

Stage 2, as grpo.py runs it: at a decision point sample G directives; roll each out N agent turns with the FROZEN
speakers and simulated user (the same seeds, so only the directive differs), the director itself (greedy, its current
weights) directing turns 2..N; score each block; update the director on the sampled directive's tokens.
Simplifications (the paper publishes none of this): the horizon N, the weights and the block judge are flags; with an
LLM judge the block gets one holistic judgement, with the offline judge the mean score of its turns.

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
    """The chat asking for the next `Agent / Action / Tone`. The roster gives names and roles only (the speakers'
    prompts carry the descriptions): a third shorter, so every director generation and GRPO pass is cheaper. Who spoke
    last, and what they were asked to do, is said outright: a small director reads a named field far more easily than
    a speaker line above the user's message, and what real supporters do next depends on what was just done."""
    spoken = conv.agent_turns()
    counts, d = Counter(t.speaker for t in spoken), spoken[-1].directive if spoken else None
    last = (
        f" Last to speak: {spoken[-1].speaker}{f', asked to {d.action}' if d and d.action else ''}."
        if spoken
        else ""
    )
    system = (
        "You direct a group chat in which several companions talk with one person. The companions:\n"
        + "\n".join(f"- {p.name}, the {p.role}" for p in personas.personas)
        + "\n"
        "Choose who should speak next and how, so that the group stays helpful, varied and never repeats "
        "itself. Answer with exactly three lines:\nAgent: <one companion name>\nAction: <what they should do>\n"
        f"Tone: <how they should sound>\nUseful actions: {'; '.join(personas.strategies)}.\n"
        f"Useful tones: {'; '.join(personas.tones)}."
    )
    user = (
        f"Situation: {conv.context.situation}\n\nConversation so far:\n{render_history(conv.turns)}\n\nTurns so far: "
        + ", ".join(f"{p.name} {counts.get(p.name, 0)}x" for p in personas.personas)
        + f".{last}\nWho speaks next, and how?"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


_FIELD = re.compile(
    r"^[\s\*\-#>\"'`]*(agent|speaker|next|action|strategy|tone)[\s\*\"'`]*[:=\-–—]\s*(.*)$",
    re.IGNORECASE,
)


def parse_directive(text: str, personas: PersonaSet, fallback_agent: str) -> Directive:
    """`Agent / Action / Tone` out of free text; never raises. Robust to case, markdown ("**Agent:**"),
    extra text, "Speaker"/"Strategy" as synonyms and an agent named by its role or inside a phrase
    ("Agent: I think Beacon should go"). No known agent: invalid, and `fallback_agent` speaks (the
    format term of the group reward penalises it; the logs count it)."""
    fields: dict[str, str] = {}
    for line in (text if isinstance(text, str) else "").splitlines():
        m = _FIELD.match(line)
        if m:
            key = {"speaker": "agent", "next": "agent", "strategy": "action"}.get(
                m.group(1).lower(), m.group(1).lower()
            )
            fields.setdefault(key, m.group(2).strip().strip("*\"'`").strip()[:200])
    persona = personas.find(fields["agent"]) if fields.get("agent") else None
    if persona is None and fields.get("agent"):
        hits = [
            (m.start(), p)
            for p in personas.personas
            for key in (p.name, p.role)
            for m in [re.search(rf"\b{re.escape(key.lower())}\b", fields["agent"].lower())]
            if m
        ]
        persona = min(hits, key=lambda h: h[0])[1] if hits else None
    return Directive(
        persona.name if persona else fallback_agent,
        fields.get("action", ""),
        fields.get("tone", ""),
        persona is not None,
        (text or "")[:1000],
    )


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
        self.model, self.tok, self.personas, self.name = model, tok, personas, name
        self.invalid = self.total = 0  # directives that needed the fallback, for the logs

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        texts = models.generate_texts(
            self.model,
            self.tok,
            [director_messages(self.personas, c) for c in convs],
            DIRECTIVE_MAX_TOKENS,
            seeds=None,
        )
        out = parse_many(texts, convs, self.personas)
        self.total, self.invalid = (
            self.total + len(out),
            self.invalid + sum(not d.valid for d in out),
        )
        return out


# --- 3. The group reward of an N-turn block, and collapse -----------------------------------------
@dataclass
class RewardWeights:
    """The group reward's weights, each a flag (`--w-coherence` ...). The paper's Group Reward Model
    judges "global state consistency and interaction quality" (coherence, diversity, effective
    contribution); clean makes the hack diagnostics part of the score; balance and format are ours."""

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
    """The weighted sum of the block's components (turns from `start` on), each in [0, 1]:
      coherence      an LLM judge: ONE judgement of the whole block against what came before, which a
                     per-turn score cannot give (two good turns that say the same thing); our question,
                     data/prompts/block_judge.txt; an unreadable answer is 0.5, counted in
                     counts["unreadable"]. A scoring judge: the mean score of the block's turns;
      nonredundancy  1 - mean over new turns of max(cosine with an earlier agent turn, BLEU-2 with them);
      contribution   share of the block's content words new to the conversation;
      clean          share of the block's turns no hack diagnostic flags (metrics.HACKS);
      balance        entropy of who spoke over the conversation / log(#agents), times 1 - the share of
                     block turns whose speaker repeats the previous agent (ours);
      format         share of the block's directives that parsed; a fixed rule's always do (ours).
    With `grounding` (ESConv's labels: extras/strategies.Grounding), plausible and compliant too (ours).
    A block without an agent turn (the conversation had ended) scores 0 on every component: it
    cannot be better than a block in which someone spoke."""
    comp = dict.fromkeys(
        ("coherence", "nonredundancy", "contribution", "clean", "balance", "format"), 0.0
    )
    comp.update(grounding(conv, start) if grounding else {})  # both 0 when no companion spoke
    new = [
        (i, t) for i, t in enumerate(conv.turns) if i >= start and t.speaker not in (USER, SAFETY)
    ]
    if not new:
        return 0.0, comp
    replies = [t.text for _, t in new]
    if judge.can_generate:
        score = judge.rate_many(
            [
                prompt("block_judge").format(
                    situation=conv.context.situation,
                    roles=", ".join(f"{p.name} the {p.role}" for p in personas.personas),
                    before=render_history(conv.turns[:start], JUDGE_TURNS),
                    block=render_history(conv.turns[start:], 99),
                )
            ],
            16,
        )[0]
        if counts is not None:
            counts["unreadable"] += score is None
        comp["coherence"] = 0.5 if score is None else (score - 1) / 4
    else:
        states = [
            judge_state(personas.find(t.speaker), conv.turns[:i], conv.context.situation)
            for i, t in new
        ]
        comp["coherence"] = sum(judge.score_many(states, replies)) / len(replies)
    earlier, redund = [t.text for t in conv.turns[:start] if t.speaker not in (USER, SAFETY)], []
    for k, text in enumerate(replies):
        before = earlier + replies[:k]
        if before:
            vecs = encoder.embed([text] + before)  # (1 + m, D)
            redund.append(
                max(
                    float((vecs[1:] @ vecs[0]).max().clamp(min=0.0)),
                    sentence_bleu(tokenize(text), [tokenize(b) for b in before], max_n=2),
                )
            )
    comp["nonredundancy"] = 1.0 - sum(redund) / len(replies)
    old = set().union(*(content_words(t.text) for t in conv.turns[:start]))
    fresh = set().union(*(content_words(t) for t in replies))
    comp["contribution"] = len(fresh - old) / len(fresh) if fresh else 0.0
    names = personas.names()
    comp["clean"] = 1.0 - sum(
        any(
            diagnose_reply(
                personas.find(t.speaker), conv.turns[:i], conv.context.situation, t.text, names
            )[k]
            for k in HACKS
        )
        for i, t in new
    ) / len(new)
    comp["format"] = sum(t.directive is None or t.directive.valid for _, t in new) / len(new)
    speakers = [t.speaker for t in conv.agent_turns()]
    repeats = sum(
        speakers[j] == speakers[j - 1]
        for j in range(max(len(speakers) - len(new), 1), len(speakers))
    )
    # With one persona nobody else could have spoken: perfect balance (and no log(1) = 0 to divide by).
    comp["balance"] = (
        entropy_bits(speakers) / math.log2(len(names)) * (1 - repeats / len(new))
        if len(names) > 1
        else 1.0
    )
    return sum(getattr(weights, k) * v for k, v in comp.items()), comp


# --- The director's warm start on what real supporters did next (train --director-warmup-data) --------
# personas.json says whose job each strategy is (in ESConv's words, Affirmation and Reassurance "affirm[s]
# the help-seeker's strengths", Beacon's job; Self-disclosure, "divulge similar experiences ... to express
# your empathy", is validation, Anchor's); here, the Action and Tone of a directive for each. "Others"
# (greetings, thanks) is nobody's job: such a turn stays in the history, never a target.
STRATEGY_DIRECTIVES = {
    "Question": ("ask a probing question", "curious"),
    "Restatement or Paraphrasing": ("reflect back what was said", "calm and steady"),
    "Reflection of feelings": ("validate the feeling", "warm"),
    "Self-disclosure": ("share a similar feeling so they feel less alone", "gentle"),
    "Affirmation and Reassurance": ("name a strength", "encouraging"),
    "Providing Suggestions": ("suggest one small step", "practical"),
    "Information": ("share useful information", "thoughtful"),
}


def directive_for(strategy: str, personas) -> Directive | None:
    """The directive a supporter turn of this strategy answers: its persona (the card that lists the
    strategy), the strategy's action and tone; None for a strategy no card lists."""
    agent = next((p.name for p in personas.personas if strategy in p.esconv_strategies), None)
    return (
        Directive(agent, *STRATEGY_DIRECTIVES[strategy])
        if agent and strategy in STRATEGY_DIRECTIVES
        else None
    )


# --- The group reward's grounded terms (train --stage 2 --director-warmup-data ESCONV) ---------------------------
class Grounding:
    """director.block_reward's two terms from human labels, each a mean over the block's agent turns in [0, 1]:
      plausible  E_q[P(s | stage, previous)] / max_s P(s | stage, previous): q is the judge's strategy classifier's
                 reading of the turn (judge.StrategyClassifier), P how often ESConv's supporters used strategy s
                 at that stage (supporter turns so far: 0, 1, 2, 3+) after the previous one (the classifier's top
                 reading of the agent turn before; none at the start), counted on the training dialogues with
                 add-one smoothing. 1: the turn did what real supporters most often do at that point.
      compliant  q's mass on what the directive asked, chance-corrected: (q(A) - pi(A)) / (1 - pi(A)), A the strategy
                 whose warm-start action (STRATEGY_DIRECTIVES) its Action names, else the strategies of the speaker's
                 card (a rule's directive names no action), pi(A) the share of training turns labelled in A. 1: did
                 what was asked, 0: as often as any supporter turn would, so one strategy asked for is not held
                 to a lower mark than a card's three.
    Held-out dialogues (held_out, seed: the run's split) are left out of the counts."""

    def __init__(self, contexts, personas, encoder, held_out: float, seed: int):
        require_mapping(personas)
        self.classifier, self.personas, start = (
            StrategyClassifier(encoder),
            personas,
            len(SUPPORT_STRATEGIES),
        )
        counts = torch.ones(4, start + 1, start)  # (stage, previous or start, strategy)
        seen = torch.ones(start)  # (strategy,): its labels, add-one
        for context in split_contexts(contexts, held_out, seed)[0]:
            labels = [
                SUPPORT_STRATEGIES.index(t["strategy"])
                for t in context.turns
                if t["speaker"] != "user" and t.get("strategy") in SUPPORT_STRATEGIES
            ]
            for k, s in enumerate(labels):
                counts[min(k, 3), labels[k - 1] if k else start, s] += 1
                seen[s] += 1
        self.transition = counts / counts.sum(-1, keepdim=True)  # (4, 9, 8): P(s | stage, previous)
        self.prior = seen / seen.sum()  # (8,): pi(s)

    def __call__(self, conv: Conversation, start: int) -> dict[str, float]:
        agent = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
        first = next((k for k, i in enumerate(agent) if i >= start), len(agent))
        if first == len(agent):
            return {"plausible": 0.0, "compliant": 0.0}
        before = min(first, 1)  # the agent turn before the block is read for its strategy only
        read = agent[first - before :]
        said = [
            next(
                (t.text for t in reversed(conv.turns[:i]) if t.speaker == USER),
                conv.context.situation,
            )
            for i in read
        ]  # what each turn answers
        q = self.classifier.probs([conv.turns[i].text for i in read], said)  # (M, 8)
        plausible, compliant = [], []
        for m in range(before, len(read)):
            k, turn = first - before + m, conv.turns[read[m]]  # k: agent turns before this one
            p = self.transition[
                min(k, 3), int(q[m - 1].argmax()) if m else len(SUPPORT_STRATEGIES)
            ]  # (8,)
            plausible.append(float(q[m] @ p / p.max()))
            action = turn.directive.action.lower() if turn.directive else ""
            asked = [
                s for s, (a, _) in STRATEGY_DIRECTIVES.items() if a in action
            ] or self.personas.find(turn.speaker).esconv_strategies
            ix = [SUPPORT_STRATEGIES.index(s) for s in asked]
            compliant.append(
                float((q[m, ix].sum() - self.prior[ix].sum()) / (1 - self.prior[ix].sum()))
            )
        return {
            "plausible": sum(plausible) / len(plausible),
            "compliant": sum(compliant) / len(compliant),
        }


def stage_feature(conv: Conversation) -> str:
    n = len(conv.agent_turns())
    return str(n) if n < 3 else "3+"


def choice_diagnostics(
    agents: list[str], stages: list[str], names: list[str], test: bool = True, seed: int = 0
) -> dict:
    """Counts per agent, entropy in bits (and / log2 #agents: 1 = uniform), I(choice; stage) in bits,
    and with `test` the permutation p-value of independence (exact on a few dozen points)."""
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


# --- 4. Stage 2: decision points, rollouts, and the reward of a sampled directive ----------------
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
        max_prefix,
        user_every,
        seed,
        desc="decision points, agent turns",
    )
    points = []
    for i, conv in enumerate(convs):
        agent_idx = [j for j, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
        k = i % (max_prefix + 1)
        cut = (
            agent_idx[k - 1] + 1 if k and len(agent_idx) >= k else 1 if k == 0 else len(conv.turns)
        )
        while cut < len(conv.turns) and conv.turns[cut].speaker == USER:
            cut += 1  # include the user's answer to that turn
        point = copy.deepcopy(conv)
        point.turns, point.policy = point.turns[:cut], "prefix"
        if not point.ended:
            points.append(point)
    return points


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
    follow: object = (
        None  # who directs turns 2..N of a training rollout: the director being trained
    )
    invalid: int = 0  # sampled directives that needed the fallback
    total: int = 0
    counts: Counter = field(
        default_factory=Counter
    )  # "unreadable": block judgements an LLM judge garbled
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
            self.n_turns,
            self.user_every,
            fixed_first=first,
            desc=desc,
        )
        return [
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
            for c, s in zip(copies, starts)
        ], copies

    def score_directives(self, points: list[Conversation], texts: list[str]):
        """GRPO's reward for stage 2: the group reward of each sampled directive's block (its decision point in
        `points`), with the components, how often each agent was picked and this step's collapse diagnostics."""
        directives = parse_many(texts, points, self.personas)
        self.total, self.invalid = (
            self.total + len(directives),
            self.invalid + sum(not d.valid for d in directives),
        )
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
        comps["choice_entropy"], comps["choice_mi"] = (
            [diag["entropy"]] * len(points),
            [diag["mi"]] * len(points),
        )
        return [r for r, _ in scored], comps

    def evaluate(self, policy, points: list[Conversation], seed: int = 0) -> dict:
        """The policy directs every turn of a block from each held-out point (same points and seeds
        for every policy, so per-point rewards can be paired): mean reward, its se, the components,
        the first-turn choices and their diagnostics, and the rollouts themselves."""
        unreadable = self.counts["unreadable"]
        scored, copies = self.run(points, policy, desc="held-out rollouts, agent turns")
        rewards, n = [r for r, _ in scored], len(scored)
        firsts = [c.turns[len(p.turns)].directive for c, p in zip(copies, points)]
        agents, stages = [d.agent for d in firsts], [stage_feature(p) for p in points]
        return {
            "reward": sum(rewards) / n,
            "se": standard_error(rewards),
            "rewards": rewards,
            "n": n,
            "components": {k: sum(c[k] for _, c in scored) / n for k in scored[0][1]},
            "choices": {a: agents.count(a) for a in self.personas.names()},
            "block_choices": {
                a: sum(
                    t.speaker == a for c, p in zip(copies, points) for t in c.turns[len(p.turns) :]
                )
                for a in self.personas.names()
            },
            "diagnostics": choice_diagnostics(agents, stages, self.personas.names(), seed=seed),
            "agree_least_spoken": sum(
                a == least_spoken_agent(self.personas, p) for a, p in zip(agents, points)
            )
            / n,
            "invalid": sum(not d.valid for d in firsts),
            "unreadable_judgements": self.counts["unreadable"] - unreadable,
            "rollouts": [
                {"stage": s, "first_turn": len(p.turns), "components": k, **c.to_json()}
                for c, p, s, (_, k) in zip(copies, points, stages, scored)
            ],
        }


def compare(after: dict, before: dict) -> dict:
    """The paired change of the held-out group reward, point by point (same points and seeds)."""
    change, se = paired_change(before["rewards"], after["rewards"])
    return {"change": change, "se": se, "n": len(after["rewards"])}


def describe_heldout(r: dict) -> str:
    d, se = r["diagnostics"], "-" if r["se"] is None else f"{r['se']:.3f}"
    return (
        f"{r['reward']:.3f} ± {se} (se, {r['n']} points)  agent choices {r['choices']}  entropy "
        f"{d['entropy']:.2f} bits  I(choice; stage) {d['mi']:.2f} bits, permutation p {d['p_perm']:.3g}  "
        f"unparseable {r['invalid']}/{r['n']}"
        + (
            f"  unreadable judgements {r['unreadable_judgements']}"
            if r["unreadable_judgements"]
            else ""
        )
    )
