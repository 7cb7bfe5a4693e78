"""extras/evaluators.py: an evaluator training cannot game: which persona does the FROZEN base model think wrote a turn?

A tool beside the method, used by evaluation (the persona ID columns) and by extras/judges.py.

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
Simplified: the base model reads only the last ID_TURNS turns, and each card without its example lines.
    python mascot.py evaluate [--no-persona-id]       # every table has its columns
"""

import math
import re
from typing import NamedTuple

import torch

import grpo
import models
from scenarios import Persona, PersonaSet

ID_TURNS = 2  # the turns of history the base model reads before the reply
EQUAL_TOKENS = 32  # "first 32 tokens": the same length for every reply
NEUTRAL_NAME = "Alex"  # what persona names in a reply become (no persona is called Alex)


class Item(NamedTuple):
    speaker: str  # the persona who spoke the turn
    situation: str
    history: list[tuple[str, str]]  # (speaker, text) of the turns before it
    reply: str


def mask_names(reply: str, names: list[str]) -> str:
    """Persona names (whole words, capitalised as the name) replaced by NEUTRAL_NAME: "I can guide you" stays."""
    if not names:
        return reply
    any_name = r"(?<!\w)(" + "|".join(map(re.escape, names)) + r")(?!\w)"
    return re.sub(any_name, NEUTRAL_NAME, reply)


def card_text(p: Persona) -> str:
    """The card the base model is conditioned on; no example lines (a speaker could copy them)."""
    return f"You are {p.name}, the {p.role}. {p.description} Style: {p.style}"


def id_messages(p: Persona, situation: str, history: list[tuple[str, str]]) -> list[dict]:
    """The prompt under card p: the card, the situation and the last ID_TURNS turns."""
    lines = "\n".join(f"{who}: {text}" for who, text in history[-ID_TURNS:])
    return [
        {"role": "system", "content": card_text(p)},
        {
            "role": "user",
            "content": f"Situation: {situation}\n\nConversation so far:\n{lines}\n\nWrite {p.name}'s next message.",
        },
    ]


def argmax(values: list[float]) -> int:
    """The index of the largest value (the first of a tie)."""
    return max(range(len(values)), key=values.__getitem__)


class PersonaIdentifier:
    """The module docstring's persona ID and log-ratio under a frozen (model, tok), for one persona set."""

    def __init__(self, model, tok, personas: PersonaSet):
        self.model = model
        self.tok = tok
        self.personas = personas

    def reply_ids(self, reply: str) -> list[int]:
        """The reply's tokens, persona names masked; an empty reply is one end-of-text token."""
        masked = mask_names(reply.strip(), self.personas.names())
        ids = self.tok(masked, add_special_tokens=False)["input_ids"]
        return ids or [self.tok.eos_token_id]

    @torch.no_grad()
    def logprobs(self, items: list[Item]) -> tuple[list[list[float]], list[list[float]]]:
        """lp[i][k] = log p(reply_i | card_k, history_i) under the frozen model, and the same sum over
        the reply's first EQUAL_TOKENS tokens (read from the same teacher-forced pass: it is causal)."""
        cards = self.personas.personas
        rows = []  # (item, card, prompt ids): every item under every card
        for i, it in enumerate(items):
            for k, c in enumerate(cards):
                prompt = models.chat_prompt_ids(
                    self.tok, [id_messages(c, it.situation, it.history)]
                )
                rows.append((i, k, prompt[0]))
        rows.sort(key=lambda r: (len(r[2]), r[2]))
        lp = [[0.0] * len(cards) for _ in items]
        first = [[0.0] * len(cards) for _ in items]
        for start in range(0, len(rows), 16):  # similar lengths batch with little padding
            batch = rows[start : start + 16]
            logps, mask = grpo.target_logprobs(
                self.model,
                self.tok.pad_token_id,
                [(p, self.reply_ids(items[i].reply)) for i, _, p in batch],
            )
            per_token = logps * mask  # (B, C) column t = token t
            whole = per_token.sum(1).tolist()  # (B,)
            head = per_token[:, :EQUAL_TOKENS].sum(1).tolist()  # (B,)
            for (i, k, _), w, h in zip(batch, whole, head):
                lp[i][k] = w
                first[i][k] = h
        return lp, first

    def score(self, items: list) -> list[dict]:
        """{"correct", "log_ratio", "correct_equal", "tokens"} per item; None values for a speaker
        outside the set, and correct_equal None for a reply shorter than EQUAL_TOKENS."""
        names = self.personas.names()
        out = []
        items = [Item(*it) for it in items]
        for item, own, head in zip(items, *self.logprobs(items)):
            if item.speaker not in names or len(names) < 2:
                out.append({"correct": None, "log_ratio": None, "correct_equal": None, "tokens": 0})
                continue
            s = names.index(item.speaker)
            n = len(self.reply_ids(item.reply))
            others = [v for k, v in enumerate(own) if k != s]
            # log mean_k exp(lp_k) over the other cards, shifted by the max so exp cannot overflow.
            top = max(others)
            log_mean = top + math.log(sum(math.exp(v - top) for v in others) / len(others))
            out.append(
                {
                    "correct": float(argmax(own) == s),
                    "log_ratio": (own[s] - log_mean) / n,
                    "correct_equal": float(argmax(head) == s) if n >= EQUAL_TOKENS else None,
                    "tokens": n,
                }
            )
        return out
