"""extras/evaluators.py: an evaluator training cannot game: which persona does the FROZEN base model think wrote a turn?

The paper measures persona consistency with LLM judges that took no part in training. Our default judge cannot: it
labelled the pairs the reward model learned from, so "its persona score went up" may only mean "the speakers learned its
blind spots". mascot.py hands this evaluator to evaluate.score_conversations (persona ID columns) and judge-stress.
For an agent turn y of persona s after conversation c and every persona k of the set,
    lp_k = log p_base(y | card_k, c)    (the frozen --model, teacher-forced)
  persona ID   = 1 if argmax_k lp_k == s (chance 1 / #personas)
  log-ratio    = (lp_s - log mean_{k != s} exp lp_k) / tokens(y): the log Bayes factor "own card vs the others"
                 per token; fluency and length cancel out of it
  persona ID, first 32 tokens: the same on the first EQUAL_TOKENS tokens only, so longer turns cannot gain by length
Independent of training: not the reward, not the judge that labelled the pairs, no embedding; the one link is stage 1's
KL term, which anchors the speakers to this model under their OWN card only. Persona names in the turn are masked, so a
speaker cannot win by signing its turns; its blind spot, a reply that recites its own card, is what persona_copy counts.
    python mascot.py evaluate [--no-persona-id]       # every table has its columns
"""

import math
import re
import sys
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the project's modules, from the repo root
import grpo  # noqa: E402
import models  # noqa: E402
from scenarios import Persona, PersonaSet

ID_TURNS, EQUAL_TOKENS, NEUTRAL_NAME = 2, 32, "Alex"


class Item(NamedTuple):
    speaker: str  # the persona who spoke the turn
    situation: str
    history: list[tuple[str, str]]  # (speaker, text) of the turns before it
    reply: str


def mask_names(reply: str, names: list[str]) -> str:
    """Persona names (whole words, capitalised as the name) replaced by NEUTRAL_NAME: "I can guide you" stays."""
    return (
        re.sub(r"(?<!\w)(" + "|".join(map(re.escape, names)) + r")(?!\w)", NEUTRAL_NAME, reply)
        if names
        else reply
    )


def card_text(p: Persona) -> str:
    """The card the base model is conditioned on; no example lines (a speaker could copy them)."""
    return f"You are {p.name}, the {p.role}. {p.description} Style: {p.style}"


def id_messages(p: Persona, situation: str, history: list[tuple[str, str]]) -> list[dict]:
    lines = "\n".join(f"{who}: {text}" for who, text in history[-ID_TURNS:])
    return [
        {"role": "system", "content": card_text(p)},
        {
            "role": "user",
            "content": f"Situation: {situation}\n\nConversation so far:\n{lines}\n\nWrite {p.name}'s next message.",
        },
    ]


class PersonaIdentifier:
    def __init__(self, model, tok, personas: PersonaSet):
        self.model, self.tok, self.personas = model, tok, personas

    def reply_ids(self, reply: str) -> list[int]:
        return self.tok(mask_names(reply.strip(), self.personas.names()), add_special_tokens=False)[
            "input_ids"
        ] or [self.tok.eos_token_id]

    @torch.no_grad()
    def logprobs(self, items: list[Item]) -> tuple[list[list[float]], list[list[float]]]:
        """lp[i][k] = log p(reply_i | card_k, history_i) under the frozen model, and the same sum over
        the reply's first EQUAL_TOKENS tokens (read from the same teacher-forced pass: it is causal)."""
        cards = self.personas.personas
        rows = sorted(
            (
                (
                    i,
                    k,
                    models.chat_prompt_ids(self.tok, [id_messages(c, it.situation, it.history)])[0],
                )
                for i, it in enumerate(items)
                for k, c in enumerate(cards)
            ),
            key=lambda r: (len(r[2]), r[2]),
        )
        lp, first = [[0.0] * len(cards) for _ in items], [[0.0] * len(cards) for _ in items]
        for start in range(0, len(rows), 16):  # similar lengths batch with little padding
            batch = rows[start : start + 16]
            logps, mask = grpo.target_logprobs(
                self.model,
                self.tok.pad_token_id,
                [(p, self.reply_ids(items[i].reply)) for i, _, p in batch],
            )
            per_token = logps * mask  # (B, C) column t = token t
            for (i, k, _), s_, f in zip(
                batch, per_token.sum(1).tolist(), per_token[:, :EQUAL_TOKENS].sum(1).tolist()
            ):
                lp[i][k], first[i][k] = s_, f
        return lp, first

    def score(self, items: list) -> list[dict]:
        """{"correct", "log_ratio", "correct_equal", "tokens"} per item; None values for a speaker
        outside the set, and correct_equal None for a reply shorter than EQUAL_TOKENS."""
        names, out = self.personas.names(), []
        best = lambda v: max(range(len(v)), key=v.__getitem__)  # noqa: E731
        items = [Item(*it) for it in items]
        for item, own, head in zip(items, *self.logprobs(items)):
            if item.speaker not in names or len(names) < 2:
                out.append({"correct": None, "log_ratio": None, "correct_equal": None, "tokens": 0})
                continue
            s, n = names.index(item.speaker), len(self.reply_ids(item.reply))
            others = [v for k, v in enumerate(own) if k != s]
            log_mean = max(others) + math.log(
                sum(math.exp(v - max(others)) for v in others) / len(others)
            )
            out.append(
                {
                    "correct": float(best(own) == s),
                    "log_ratio": (own[s] - log_mean) / n,
                    "correct_equal": float(best(head) == s) if n >= EQUAL_TOKENS else None,
                    "tokens": n,
                }
            )
        return out
