"""baselines.py: the two prompting baselines that make several model calls per turn.

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
Both are `speak(convs, directives, cast)` callables (evaluate.py builds them) that simulate.advance(..., speak=...)
calls in place of simulate.agents_speak: the persona cards, user, guard, contexts and seeds of every other system.
    python mascot.py evaluate --systems self-consistency,multiagentesc,round-robin
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the project's modules, from the repo root
import models  # noqa: E402
from metrics import sentence_bleu, tokenize  # noqa: E402
from plumbing import common, files
from simulate import (
    Directive,
    Turn,
    judge_state,
    persona_card,
    render_history,
    reply_text,  # noqa: E402
    speaker_messages,
    turn_seed,
)

VOTE_TOKENS, ANALYSIS_TOKENS = 4, 48  # a vote: a number, and room for a stray word


def _generate(cast, prompts: list[list[dict]], max_new_tokens: int, seeds: list[int]) -> list[str]:
    return (
        models.generate_texts(
            cast.speaker_model,
            cast.speaker_tok,
            prompts,
            max_new_tokens,
            cast.temperature,
            cast.top_p,
            seeds=seeds,
        )
        if prompts
        else []
    )


def _live(convs, directives, cast):
    """(conversation, speaking persona) of every conversation that has not ended."""
    return [
        (c, cast.personas.find(d.agent) or cast.personas.personas[0])
        for c, d in zip(convs, directives)
        if not c.ended
    ]


def _clean(cast, raw: str, persona, style: str = "persona") -> str:
    return models.clean_reply(reply_text(raw, style), persona.name, cast.personas.names()) or "..."


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
        self.k, self.pick, self.judge, self.style = k, pick, judge, style

    def __call__(self, convs, directives, cast) -> None:
        live = _live(convs, directives, cast)
        prompts = [
            speaker_messages(persona, cast.personas, conv.context, conv.turns, style=self.style)
            for conv, persona in live
            for _ in range(self.k)
        ]
        seeds = [common.derive_seed(turn_seed(conv), j) for conv, _ in live for j in range(self.k)]
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


class MultiAgentESC:
    """The five-step pipeline above; counts unparseable proposals and votes (results notes)."""

    def __init__(self):
        self.unparseable, self.asked = Counter(), Counter()  # "proposal" | "vote" -> count

    def __call__(self, convs, directives, cast) -> None:
        live, personas = _live(convs, directives, cast), cast.personas
        names, strategies = personas.names(), personas.strategies
        user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
        fields = [
            dict(situation=c.context.situation, history=render_history(c.turns)) for c, _ in live
        ]
        seed = [turn_seed(c) for c, _ in live]
        # 1. analysis
        analysis = _generate(
            cast,
            [user(files.prompt("eval_mesc_analysis").format(**f)) for f in fields],
            ANALYSIS_TOKENS,
            [common.derive_seed(s, 1) for s in seed],
        )
        analysis = [models.clean_reply(a, "", names) for a in analysis]
        # 2. every companion proposes a strategy for the speaker
        options = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(strategies))
        prompts = [
            user(
                files.prompt("eval_mesc_propose").format(
                    card=persona_card(p), analysis=a, options=options, speaker=speaker.name, **f
                )
            )
            for (_, speaker), a, f in zip(live, analysis, fields)
            for p in personas.personas
        ]
        raw = _generate(
            cast,
            prompts,
            VOTE_TOKENS,
            [common.derive_seed(s, 2, k) for s in seed for k in range(len(names))],
        )
        proposals = []
        for n in range(len(live)):
            picks = [
                parse_number(r, len(strategies)) for r in raw[n * len(names) : (n + 1) * len(names)]
            ]
            self.asked["proposal"] += len(picks)
            self.unparseable["proposal"] += sum(p is None for p in picks)
            proposals.append(
                list(dict.fromkeys(strategies[p] for p in picks if p is not None)) or [""]
            )
        # 3. the speaker writes one candidate per distinct proposed strategy
        rows = [(n, s) for n, props in enumerate(proposals) for s in props]
        prompts = [
            speaker_messages(
                live[n][1],
                personas,
                live[n][0].context,
                live[n][0].turns,
                Directive(live[n][1].name, action=s),
            )
            for n, s in rows
        ]
        raw = _generate(
            cast,
            prompts,
            cast.max_new_tokens,
            [common.derive_seed(seed[n], 3, j) for j, (n, _) in enumerate(rows)],
        )
        candidates = [
            [_clean(cast, r, p) for (m, _), r in zip(rows, raw) if m == n]
            for n, (_, p) in enumerate(live)
        ]
        # 4. every companion votes for one candidate (a single candidate needs no vote)
        ballots = [
            (n, p) for n in range(len(live)) if len(candidates[n]) > 1 for p in personas.personas
        ]
        prompts = [
            user(
                files.prompt("eval_mesc_vote").format(
                    card=persona_card(p),
                    speaker=live[n][1].name,
                    role=live[n][1].role,
                    **fields[n],
                    candidates="\n".join(f"{i + 1}. {c}" for i, c in enumerate(candidates[n])),
                )
            )
            for n, p in ballots
        ]
        raw = _generate(
            cast,
            prompts,
            VOTE_TOKENS,
            [common.derive_seed(seed[n], 4, j) for j, (n, _) in enumerate(ballots)],
        )
        votes = [Counter() for _ in live]
        for (n, _), r in zip(ballots, raw):
            choice = parse_number(r, len(candidates[n]))
            self.asked["vote"] += 1
            self.unparseable["vote"] += choice is None
            votes[n][choice] += 1  # an unparseable vote (None) counts for no candidate
        winner = [
            max(range(len(candidates[n])), key=lambda i: (votes[n][i], -i))
            for n in range(len(live))
        ]
        # 5. the speaker refines the winning candidate
        prompts = [
            user(
                files.prompt("eval_mesc_refine").format(
                    card=persona_card(p),
                    strategy=proposals[n][winner[n]],
                    draft=candidates[n][winner[n]],
                    **fields[n],
                )
            )
            for n, (_, p) in enumerate(live)
        ]
        raw = _generate(
            cast, prompts, cast.max_new_tokens, [common.derive_seed(s, 5) for s in seed]
        )
        for n, ((conv, persona), r) in enumerate(zip(live, raw)):
            text = models.clean_reply(r, persona.name, names) or candidates[n][winner[n]]
            record = {
                "analysis": analysis[n],
                "strategies": proposals[n],
                "candidates": candidates[n],
                "votes": [votes[n][i] for i in range(len(candidates[n]))],
            }
            conv.turns.append(
                Turn(
                    persona.name,
                    text,
                    Directive(persona.name, action=proposals[n][winner[n]], raw=json.dumps(record)),
                )
            )
