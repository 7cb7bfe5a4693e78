"""extras/baselines.py: the two prompting baselines that make several model calls per turn.

The paper (arXiv 2601.14230) compares MASCOT in evaluation with prompting baselines; two of them are procedures:
  self-consistency (Wang et al. 2023): sample k chains of thought, keep the answer most of them agree on; for free
      text, the sample that agrees most with the others (`consensus_pick`), or the judge's pick (`--sc-pick judge`).
  MultiAgentESC (Xu et al., EMNLP 2025): a training-free team for emotional support (dialogue analysis, strategy
      deliberation, response generation). Per agent turn (speakers in roster order: the paper's fixed round-robin):
        1. analysis:  one call describes what the person feels, why, and what they need;
        2. proposals: every companion proposes one strategy of the persona set's vocabulary;
        3. responses: the speaker writes one candidate per distinct proposed strategy;
        4. vote:      every companion votes for one; the plurality wins (ties: the earliest);
        5. refine:    the speaker revises the winning candidate, which is the turn.
What we simplify: one round of each stage (the original iterates discussion within a stage), one shared base model
plays every role, and our strategy vocabulary replaces ESConv's eight.
Both are `speak(convs, directives, cast)` callables (evaluate.py builds them and sets them as Cast.speak) that
simulate.advance calls in place of simulate.agents_speak: the persona cards, user, guard, contexts and seeds of every
other system.
    python mascot.py evaluate --systems self-consistency,multiagentesc,round-robin
"""

import json
import re
from collections import Counter
from dataclasses import dataclass, field

import models
from metrics import sentence_bleu, tokenize
from plumbing import common, files
from simulate import (
    Directive,
    Turn,
    judge_state,
    persona_card,
    render_history,
    reply_text,
    speaker_messages,
    turn_seed,
)

VOTE_TOKENS = 4  # a vote or a proposal: a number, and room for a stray word
ANALYSIS_TOKENS = 48


def _generate(cast, prompts: list[list[dict]], max_new_tokens: int, seeds: list[int]) -> list[str]:
    """The speakers' model on chat prompts, at the cast's sampling settings, one seed a prompt."""
    if not prompts:
        return []
    return models.generate_texts(
        cast.speaker_model,
        cast.speaker_tok,
        prompts,
        max_new_tokens,
        cast.temperature,
        cast.top_p,
        seeds=seeds,
    )


def _live(convs, directives, cast):
    """(conversation, speaking persona) of every conversation that has not ended."""
    return [
        (c, cast.personas.find(d.agent) or cast.personas.personas[0])
        for c, d in zip(convs, directives)
        if not c.ended
    ]


def _clean(cast, raw: str, persona, style: str = "persona") -> str:
    """A sampled reply as the speakers' replies are cleaned; "..." if nothing is left."""
    return models.clean_reply(reply_text(raw, style), persona.name, cast.personas.names()) or "..."


def user_message(text: str) -> list[dict]:
    """A chat of one user message: the prompt of a step that is not the speaker's own turn."""
    return [{"role": "user", "content": text}]


# --- Self-consistency ---------------------------------------------------------------------------
def consensus_pick(texts: list[str]) -> int:
    """Index of the text agreeing most with the others (highest sentence BLEU-2 against them; ties: the first): a vote.
    >>> consensus_pick(["take a short walk tonight", "take a walk tonight", "call your sister tonight"])
    1
    """
    if len(texts) < 2:
        return 0
    toks = [tokenize(t) for t in texts]
    scores = [sentence_bleu(t, toks[:i] + toks[i + 1 :], max_n=2) for i, t in enumerate(toks)]
    return max(range(len(texts)), key=lambda i: (scores[i], -i))


class SelfConsistency:
    """k zero-shot-CoT samples per turn; the consensus (or the judge) picks the one kept."""

    def __init__(self, k: int, pick: str = "majority", judge=None, style: str = "zero-shot-cot"):
        self.k = k  # samples per turn
        self.pick = pick  # "majority" (consensus_pick) or "judge"
        self.judge = judge
        self.style = style  # the speaker prompt's style: a chain of thought, then the reply

    def __call__(self, convs, directives, cast) -> None:
        live = _live(convs, directives, cast)
        prompts = []  # k per live conversation, conversation-major
        seeds = []
        for conv, persona in live:
            prompt = speaker_messages(
                persona, cast.personas, conv.context, conv.turns, style=self.style
            )
            for j in range(self.k):
                prompts.append(prompt)
                seeds.append(common.derive_seed(turn_seed(conv), j))
        raw = _generate(cast, prompts, cast.max_new_tokens * 2, seeds)  # CoT: twice the tokens
        for n, (conv, persona) in enumerate(live):
            samples = [
                _clean(cast, r, persona, self.style) for r in raw[n * self.k : (n + 1) * self.k]
            ]
            if self.pick == "judge":
                state = judge_state(persona, conv.turns, conv.context.situation)
                scores = self.judge.score_many([state] * len(samples), samples)
                best = max(range(len(samples)), key=lambda i: (scores[i], -i))
            else:
                best = consensus_pick(samples)
            conv.turns.append(
                Turn(persona.name, samples[best], Directive(persona.name, raw=json.dumps(samples)))
            )


# --- MultiAgentESC: analysis -> strategy proposals -> one response per strategy -> vote -> refine ---
def parse_number(text: str, n: int) -> int | None:
    """The first whole number 1..n in the text, as a 0-based index; None if there is none."""
    return next(
        (int(m.group()) - 1 for m in re.finditer(r"\d+", text) if 1 <= int(m.group()) <= n), None
    )


@dataclass
class Deliberation:
    """One MultiAgentESC turn of every live conversation, filled in step by step; each list has one
    entry per conversation, in the order of `live`."""

    live: list  # (conversation, speaking persona)
    fields: list[dict]  # the situation and the history, for the prompts
    seeds: list[int]  # each conversation's turn seed; every call's seed derives from it
    analysis: list[str] = field(default_factory=list)  # step 1
    proposals: list[list[str]] = field(default_factory=list)  # step 2: the distinct strategies
    candidates: list[list[str]] = field(default_factory=list)  # step 3: one per proposal
    votes: list[Counter] = field(default_factory=list)  # step 4: candidate index -> votes
    winner: list[int] = field(default_factory=list)  # step 4: the index of the kept candidate


class MultiAgentESC:
    """The five-step pipeline above; counts unparseable proposals and votes (results notes)."""

    def __init__(self):
        self.unparseable = Counter()  # "proposal" | "vote" -> answers without a usable number
        self.asked = Counter()  # "proposal" | "vote" -> answers asked for

    def __call__(self, convs, directives, cast) -> None:
        live = _live(convs, directives, cast)
        fields = [
            dict(situation=c.context.situation, history=render_history(c.turns)) for c, _ in live
        ]
        d = Deliberation(live, fields, [turn_seed(c) for c, _ in live])
        self.analyse(d, cast)
        self.propose(d, cast)
        self.respond(d, cast)
        self.vote(d, cast)
        self.refine(d, cast)

    def analyse(self, d: Deliberation, cast) -> None:
        """1. One call per conversation: what the person feels, why, and what they need."""
        prompts = [user_message(files.prompt("eval_mesc_analysis").format(**f)) for f in d.fields]
        seeds = [common.derive_seed(s, 1) for s in d.seeds]
        analysis = _generate(cast, prompts, ANALYSIS_TOKENS, seeds)
        d.analysis = [models.clean_reply(a, "", cast.personas.names()) for a in analysis]

    def propose(self, d: Deliberation, cast) -> None:
        """2. Every companion proposes one strategy for the speaker; the distinct ones are kept."""
        personas = cast.personas
        strategies = personas.strategies
        options = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(strategies))
        prompts = []  # one per (conversation, companion), conversation-major
        seeds = []
        for n, (_, speaker) in enumerate(d.live):
            for k, p in enumerate(personas.personas):
                text = files.prompt("eval_mesc_propose").format(
                    card=persona_card(p),
                    analysis=d.analysis[n],
                    options=options,
                    speaker=speaker.name,
                    **d.fields[n],
                )
                prompts.append(user_message(text))
                seeds.append(common.derive_seed(d.seeds[n], 2, k))
        raw = _generate(cast, prompts, VOTE_TOKENS, seeds)
        size = len(personas.personas)
        for n in range(len(d.live)):
            picks = [parse_number(r, len(strategies)) for r in raw[n * size : (n + 1) * size]]
            self.asked["proposal"] += len(picks)
            self.unparseable["proposal"] += sum(p is None for p in picks)
            distinct = list(dict.fromkeys(strategies[p] for p in picks if p is not None))
            d.proposals.append(distinct or [""])  # none readable: one candidate without a strategy

    def respond(self, d: Deliberation, cast) -> None:
        """3. The speaker writes one candidate per distinct proposed strategy."""
        rows = []  # (conversation index, strategy), one per candidate
        for n, proposals in enumerate(d.proposals):
            for strategy in proposals:
                rows.append((n, strategy))
        prompts = []
        for n, strategy in rows:
            conv, speaker = d.live[n]
            directive = Directive(speaker.name, action=strategy)
            prompts.append(
                speaker_messages(speaker, cast.personas, conv.context, conv.turns, directive)
            )
        seeds = [common.derive_seed(d.seeds[n], 3, j) for j, (n, _) in enumerate(rows)]
        raw = _generate(cast, prompts, cast.max_new_tokens, seeds)
        for n, (_, speaker) in enumerate(d.live):
            mine = [_clean(cast, r, speaker) for (m, _), r in zip(rows, raw) if m == n]
            d.candidates.append(mine)

    def vote(self, d: Deliberation, cast) -> None:
        """4. Every companion votes for one candidate (a single candidate needs no vote); the
        plurality wins, a tie the earliest."""
        ballots = []  # (conversation index, voting companion)
        for n in range(len(d.live)):
            if len(d.candidates[n]) > 1:
                for p in cast.personas.personas:
                    ballots.append((n, p))
        prompts = []
        for n, p in ballots:
            _, speaker = d.live[n]
            listed = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(d.candidates[n]))
            text = files.prompt("eval_mesc_vote").format(
                card=persona_card(p),
                speaker=speaker.name,
                role=speaker.role,
                **d.fields[n],
                candidates=listed,
            )
            prompts.append(user_message(text))
        seeds = [common.derive_seed(d.seeds[n], 4, j) for j, (n, _) in enumerate(ballots)]
        raw = _generate(cast, prompts, VOTE_TOKENS, seeds)
        d.votes = [Counter() for _ in d.live]
        for (n, _), r in zip(ballots, raw):
            choice = parse_number(r, len(d.candidates[n]))
            self.asked["vote"] += 1
            self.unparseable["vote"] += choice is None
            d.votes[n][choice] += 1  # an unparseable vote (None) counts for no candidate
        for n in range(len(d.live)):
            votes = d.votes[n]
            d.winner.append(max(range(len(d.candidates[n])), key=lambda i: (votes[i], -i)))

    def refine(self, d: Deliberation, cast) -> None:
        """5. The speaker revises the winning candidate, which becomes the turn (the draft itself
        if the revision comes back empty)."""
        prompts = []
        for n, (_, speaker) in enumerate(d.live):
            w = d.winner[n]
            text = files.prompt("eval_mesc_refine").format(
                card=persona_card(speaker),
                strategy=d.proposals[n][w],
                draft=d.candidates[n][w],
                **d.fields[n],
            )
            prompts.append(user_message(text))
        seeds = [common.derive_seed(s, 5) for s in d.seeds]
        raw = _generate(cast, prompts, cast.max_new_tokens, seeds)
        names = cast.personas.names()
        for n, ((conv, persona), r) in enumerate(zip(d.live, raw)):
            w = d.winner[n]
            text = models.clean_reply(r, persona.name, names) or d.candidates[n][w]
            record = {
                "analysis": d.analysis[n],
                "strategies": d.proposals[n],
                "candidates": d.candidates[n],
                "votes": [d.votes[n][i] for i in range(len(d.candidates[n]))],
            }
            directive = Directive(persona.name, action=d.proposals[n][w], raw=json.dumps(record))
            conv.turns.append(Turn(persona.name, text, directive))
