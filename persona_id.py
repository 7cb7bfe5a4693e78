"""persona_id.py: an evaluator that training cannot game: which persona does the FROZEN base model
think wrote this turn?

Where it sits in MASCOT (arXiv 2601.14230): evaluation. The paper measures persona consistency
with LLM judges (GPT-4o, Gemma, Phi-4) that took no part in training. Our default judge cannot do
that: the offline judge (sentence-embedding features) labelled the preference pairs the reward
model learned from, and GRPO maximised that reward model, so "the offline judge's persona score
went up" may only mean "the speakers learned the offline judge's blind spots" (hacks.py). This
file gives evaluate.py a persona-consistency measure from a model no stage of training used as a
reward or a judge:

    for every agent turn y, spoken by persona s after conversation c, and every persona k of the set,
        lp_k = log p_base(y | card_k, c)       the frozen base LM (--model), teacher-forced
    persona-ID accuracy  = 1 if argmax_k lp_k == s             (chance = 1 / number of personas)
    persona log-ratio    = (lp_s - log mean_{k != s} exp lp_k) / tokens(y)
    equal-length accuracy = the accuracy with lp_k summed over the first EQUAL_TOKENS tokens of y
                           only (turns shorter than that are left out)

The log-ratio is the log Bayes factor "own card vs the others" (uniform prior over personas), per
token of the reply, so long and short replies count alike; everything that does not depend on the
card (fluency, length, how likely the words are anyway) cancels out of it. It is > 0 when the base
model finds the reply more typical of its own persona than of the others.

Why it is independent of training:
  - it is not the reward: stage 1 optimises reward-model score + format reward, and stage 2 the
    group reward (judge coherence, embedding and BLEU-2 non-redundancy, contribution, balance);
  - it is not the judge that labelled the reward model's pairs (--judge of stage 1, by default the
    offline MiniLM judge): it reads no embedding and no judge score;
  - the one link: with --beta > 0, stage 1's KL term keeps the speakers close to this same base
    model conditioned on the speaker's OWN card. That term never sees the other cards, so it does
    not reward being distinguishable from them; with --beta 0 the base model takes no part at all.
Why an equal-length accuracy: the accuracy compares SUMMED log-probabilities, so a longer turn gives
the evaluator more evidence at the same per-token distinctiveness, and a training run whose replies
grew gains accuracy without being more in role. Cutting every turn to the same number of tokens
removes that. It costs nothing: the model is causal, so the first tokens' log-probs are read from
the same teacher-forced pass as the whole turn's.
Its blind spot, which the hack columns cover: a reply that recites its own card (persona_copy)
is very likely under that card and scores well here too.
Names are masked: every persona name in the reply is replaced by NEUTRAL_NAME, one no card holds,
before scoring. A reply that names its speaker ("Anchor here: ...") is near-certain under the card
that opens "You are Anchor", whatever else it says (docs/RESULTS.md, Session 11, measures it), so
a speaker could learn to sign its turns; the evaluator must read the role. Only the capitalised
name is masked: "I can guide you" and "a beacon of hope" are ordinary words, and a role's own.

What we simplify: the conversation the card is shown with is cut to the last HISTORY_TURNS turns
(the user's latest message, usually); each extra turn costs 4 more forward passes per agent turn.

Validity is measured, not assumed: `python persona_id.py data/judge_pairs_*.jsonl` prints how often
it prefers the in-role reply of the labelled wrong-role / off-role pairs (README, docs/RESULTS.md).
`python persona_id.py --esconv=path/to/esconv/train.jsonl` identifies real ESConv supporters' turns
under the strategy-to-persona mapping of the SFT baseline: what imitating them can gain here.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass

import torch

import grpo
import models
import sampler
from data import Persona, PersonaSet
from metrics import binomial_two_sided_p, mean_or_none

HISTORY_TURNS = 2     # conversation turns shown with the card (the reply's immediate context)
BATCH_ROWS = 16       # (reply, card) rows per forward pass
EQUAL_TOKENS = 32     # the equal-length accuracy reads each turn's first this many tokens
IN_ROLE_FAILURES = ("wrong-role", "off-role")   # pair kinds whose worse reply belongs to another persona
NEUTRAL_NAME = "Alex"  # stands in for every persona name in a scored reply (no card names it)


def mask_names(reply: str, names: list[str]) -> str:
    """The reply with every persona name, as a whole word spelt as the name is, replaced by
    NEUTRAL_NAME."""
    if not names:
        return reply
    pattern = r"(?<!\w)(" + "|".join(re.escape(n) for n in names) + r")(?!\w)"
    return re.sub(pattern, NEUTRAL_NAME, reply)


def card_text(persona: Persona) -> str:
    """The card the base model is conditioned on: name, role, description, style.

    The example lines of personas.json are left out on purpose: a speaker prompted with them can
    copy them, and a copied line would be near-certain under its own card."""
    return f"You are {persona.name}, the {persona.role}. {persona.description} Style: {persona.style}"


def id_messages(persona: Persona, situation: str, history: list[tuple[str, str]]) -> list[dict]:
    """Chat prompt whose assistant reply is scored: the card, then the conversation's last turns."""
    lines = "\n".join(f"{who}: {text}" for who, text in history[-HISTORY_TURNS:])
    task = f"Situation: {situation}\n\nConversation so far:\n{lines}\n\nWrite {persona.name}'s next message."
    return [{"role": "system", "content": card_text(persona)}, {"role": "user", "content": task}]


@dataclass
class Item:
    """One reply to identify: who spoke it and what it answered."""
    speaker: str                       # persona name
    situation: str
    history: list[tuple[str, str]]     # (speaker, text) of the turns before it, oldest first
    reply: str


class PersonaIdentifier:
    """The frozen base model, asked which card makes each reply most likely."""

    def __init__(self, model, tokenizer, personas: PersonaSet, model_name: str = ""):
        self.model, self.tok, self.personas = model, tokenizer, personas
        self.name = f"persona-id:{model_name or 'base'}"

    def reply_ids(self, reply: str) -> list[int]:
        """The reply's tokens as the assistant turn would hold them, persona names masked
        (mask_names; an empty reply: end-of-text)."""
        text = mask_names(reply.strip(), self.personas.names())
        return self.tok(text, add_special_tokens=False)["input_ids"] or [self.tok.eos_token_id]

    @torch.no_grad()
    def logprobs(self, items: list[Item]) -> tuple[list[list[float]], list[list[float]]]:
        """(lp, first): lp[i][k] = sum of log p(reply_i tokens | card_k, history_i) under the frozen
        model; first[i][k] = the same sum over reply_i's first EQUAL_TOKENS tokens only."""
        cards = self.personas.personas
        rows = []                                        # (item index, card index, prompt ids, reply ids)
        for i, item in enumerate(items):
            reply_ids = self.reply_ids(item.reply)
            for k, persona in enumerate(cards):
                prompt = sampler.chat_prompt_ids(self.tok, [id_messages(persona, item.situation, item.history)])[0]
                rows.append((i, k, prompt, reply_ids))
        out = [[0.0] * len(cards) for _ in items]
        first = [[0.0] * len(cards) for _ in items]
        # Similar lengths batch with little padding; rows that share a prompt (the candidates of one
        # state under one card, in judge-stress) sit next to each other, so completion_logprobs
        # runs that prompt once for all of them (grpo.completion_hidden).
        rows.sort(key=lambda r: (len(r[2]), r[2], len(r[3])))
        for start in range(0, len(rows), BATCH_ROWS):
            batch = rows[start:start + BATCH_ROWS]
            logps, mask = grpo.target_logprobs(self.model, self.tok.pad_token_id,
                                               [(r[2], r[3]) for r in batch])                  # (B, C) each
            per_token = logps * mask                                                           # (B, C)
            # Targets are left-aligned (target_logprobs), so column t is the reply's t-th token.
            sums, firsts = per_token.sum(1), per_token[:, :EQUAL_TOKENS].sum(1)                # (B,) each
            for (i, k, _, _), s, f in zip(batch, sums.tolist(), firsts.tolist()):
                out[i][k], first[i][k] = s, f
        return out, first

    def score(self, items: list[Item]) -> list[dict]:
        """Per item: {"correct": 0/1, "log_ratio": nats per reply token, "correct_equal": 0/1 from
        the first EQUAL_TOKENS tokens (None for a shorter reply), "tokens"}; an item whose speaker
        is not in the persona set gets None values."""
        names = [p.name for p in self.personas.personas]
        results = []
        best = lambda values: max(range(len(values)), key=lambda k: values[k])  # noqa: E731
        for item, lp, lp_first in zip(items, *self.logprobs(items)):
            if item.speaker not in names or len(names) < 2:
                results.append({"correct": None, "log_ratio": None, "correct_equal": None, "tokens": 0})
                continue
            s = names.index(item.speaker)
            others = [v for k, v in enumerate(lp) if k != s]
            top = max(others)                                    # log-mean-exp, computed stably
            log_mean_others = top + math.log(sum(math.exp(v - top) for v in others) / len(others))
            n_tokens = len(self.reply_ids(item.reply))
            results.append({"correct": float(best(lp) == s),
                            "log_ratio": (lp[s] - log_mean_others) / n_tokens,
                            "correct_equal": float(best(lp_first) == s) if n_tokens >= EQUAL_TOKENS else None,
                            "tokens": n_tokens})
        return results


# ----------------------------------------------------------------------------------------------
# Validity on labelled pairs: does it prefer the in-role reply?  python persona_id.py PAIRS...
# ----------------------------------------------------------------------------------------------

def pair_items(pair: dict) -> tuple[Item, Item]:
    """The (better, worse) replies of one labelled judge pair (data/README.md) as Items."""
    history = [(("User" if t["speaker"].lower() == "user" else t["speaker"]), t["text"])
               for t in pair.get("history", [])] + [("User", pair["context"])]
    make = lambda reply: Item(pair["persona"], pair.get("situation", ""), history, reply)  # noqa: E731
    return make(pair["better"]), make(pair["worse"])


def validate(identifier_for_set, pairs: list[dict]) -> dict:
    """Per failure kind: how often log_ratio(better) > log_ratio(worse), and the turn-level
    persona-ID accuracy of the better (in-role) replies. identifier_for_set(persona name) gives
    the PersonaIdentifier of the persona set that holds that name."""
    by_kind: dict[str, dict] = {}
    for pair in pairs:
        ident = identifier_for_set(pair["persona"])
        better, worse = ident.score(list(pair_items(pair)))
        row = by_kind.setdefault(pair.get("failure", "-"), {"n": 0, "prefers_better": 0, "ties": 0, "id_correct": 0})
        row["n"] += 1
        row["prefers_better"] += better["log_ratio"] > worse["log_ratio"]
        row["ties"] += better["log_ratio"] == worse["log_ratio"]
        row["id_correct"] += int(better["correct"])
    for row in by_kind.values():
        row["p_value"] = binomial_two_sided_p(row["prefers_better"], row["n"] - row["ties"])
    return by_kind


# ----------------------------------------------------------------------------------------------
# Real supporters' words: python persona_id.py --esconv=path/to/esconv/train.jsonl
# ----------------------------------------------------------------------------------------------
# The SFT baseline (sft.py) teaches each persona the words real ESConv supporters wrote when their
# annotated strategy is that persona's job (a question is Catalyst's, a suggestion Guide's). A
# model that writes like those supporters scores roughly what the supporters' own turns score
# here, so this shows roughly what that SFT can gain on this evaluator (not a strict bound).

def reference_items(contexts, mapping: dict[str, str]) -> list[Item]:
    """Every recorded supporter turn whose strategy `mapping` gives to a persona, as an Item spoken
    by that persona after the dialogue so far (sft.mapped_supporter_turns: earlier supporter turns
    under their mapped persona, or "Companion"; the walk the SFT baseline's data is built by)."""
    import sft
    return [Item(name, ctx.situation, [(t.speaker, t.text) for t in turns], text)
            for ctx, name, turns, text in sft.mapped_supporter_turns(contexts, mapping)]


def identification_table(items: list[Item], results: list[dict], names: list[str]) -> list[dict]:
    """Per persona (in `names` order) and for all items: turns, accuracy, mean log-ratio, mean
    tokens, and the equal-length accuracy over the turns at least EQUAL_TOKENS long."""
    rows = []
    for name in [*names, "all"]:
        rs = [r for it, r in zip(items, results) if name in ("all", it.speaker) and r["correct"] is not None]
        if not rs:
            continue
        long = [r["correct_equal"] for r in rs if r["correct_equal"] is not None]
        rows.append({"persona": name, "n": len(rs), "accuracy": mean_or_none([r["correct"] for r in rs]),
                     "log_ratio": mean_or_none([r["log_ratio"] for r in rs]),
                     "tokens": mean_or_none([r["tokens"] for r in rs]),
                     "n_equal": len(long), "accuracy_equal": mean_or_none(long)})
    return rows


def reference_main(path: str, turns: int, model_name: str) -> int:
    """Score `turns` supporter turns (seeded sample) of the held-out dialogues of mascot.py's
    default split (fraction 0.25, seed 0), so none of them was in the SFT baseline's data."""
    import random

    import corpora
    import data
    import sft
    personas = data.load_personas("personas.json", "support")
    held = data.split_contexts(corpora.load_contexts(path, persona_set="support"), 0.25, seed=0)[1]
    items = reference_items(held, sft.SFT_STRATEGIES)
    if not items:
        raise data.UserError(f"--esconv={path}: no strategy-labelled supporter turn in the held-out dialogues "
                             "(an ESConv file: ESConv.json or an ESConv .jsonl)")
    random.Random(0).shuffle(items)
    items = items[:turns]
    model, tok = models.load_model(model_name, frozen=True)
    rows = identification_table(items, PersonaIdentifier(model, tok, personas, model_name).score(items),
                                personas.names())
    print(f"persona identification of {len(items)} real supporter turns (held-out dialogues of {path}), each "
          f"given to the persona its strategy maps to (sft.SFT_STRATEGIES), under the frozen {model_name}; "
          f"chance {1 / len(personas.personas):.2f}")
    print(f"| persona | turns | identified | log-ratio (nats/token) | tokens | identified, first {EQUAL_TOKENS} tokens |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        equal = f"{r['accuracy_equal']:.3f} (n={r['n_equal']})" if r["n_equal"] else "-"
        print(f"| {r['persona']} | {r['n']} | {r['accuracy']:.3f} | {r['log_ratio']:+.4f} | {r['tokens']:.1f} | {equal} |")
    return 0


def main(argv: list[str]) -> int:
    import data
    model_name = next((a.split("=", 1)[1] for a in argv if a.startswith("--model=")), models.EMBEDDED)
    esconv = next((a.split("=", 1)[1] for a in argv if a.startswith("--esconv=")), None)
    if esconv is not None:
        turns = next((a.split("=", 1)[1] for a in argv if a.startswith("--turns=")), "240")
        if not turns.isdigit() or int(turns) < 1:
            raise data.UserError(f"--turns={turns}: give a positive whole number of supporter turns")
        return reference_main(esconv, int(turns), model_name)
    files = [a for a in argv if not a.startswith("--")] or ["data/judge_pairs_support.jsonl"]
    kinds = IN_ROLE_FAILURES if "--all-kinds" not in argv else None
    model, tok = models.load_model(model_name, frozen=True)
    sets = {name: data.load_personas("personas.json", name) for name in data.available_sets("personas.json")}
    idents = {name: PersonaIdentifier(model, tok, ps, model_name) for name, ps in sets.items()}
    owner = {p.name: idents[name] for name, ps in sets.items() for p in ps.personas}
    pairs = [p for f in files for p in data.read_jsonl(f) if kinds is None or p.get("failure") in kinds]
    pairs = [p for p in pairs if p["persona"] in owner]
    result = validate(owner.__getitem__, pairs)
    print(f"persona identification under the frozen {model_name}: {len(pairs)} pairs from {', '.join(files)}")
    print("| failure | pairs | prefers the in-role reply | exact two-sided p | in-role reply identified (chance 1/4) |")
    print("|---|---|---|---|---|")
    total = {"n": 0, "prefers_better": 0, "ties": 0, "id_correct": 0}
    for kind, row in sorted(result.items()):
        print(f"| {kind} | {row['n']} | {row['prefers_better']}/{row['n']} = {row['prefers_better'] / row['n']:.2f} "
              f"| {row['p_value']:.3g} | {row['id_correct']}/{row['n']} |")
        for key in total:
            total[key] += row[key]
    if total["n"]:
        p = binomial_two_sided_p(total["prefers_better"], total["n"] - total["ties"])
        print(f"| all | {total['n']} | {total['prefers_better']}/{total['n']} = {total['prefers_better'] / total['n']:.2f} "
              f"| {p:.3g} | {total['id_correct']}/{total['n']} |")
    return 0


if __name__ == "__main__":
    from data import UserError
    try:
        sys.exit(main(sys.argv[1:]))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
