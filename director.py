"""director.py: who speaks next, and how (the paper's Phase II, collaborative dialogue optimisation).

The director reads the conversation and writes a directive in the format of the paper's figure:

    Agent: Anchor
    Action: validate the feeling of guilt and make them feel safe
    Tone: calm and empathetic

This file holds, in reading order:
  1. the director's prompt and a robust parser for its answer (`parse_directive`);
  2. the LLM director (prompted base model, or the model trained here), a turn-taking policy with
     the same interface, `choose(convs) -> list[Directive]`, as the fixed rules in simulate.py
     (round-robin, random order = the paper's MASCOT-C ablation, least-spoken);
  3. the group reward that scores an N-turn block after a directive (coherence, non-redundancy,
     contribution, persona balance, format);
  4. stage-2 training: sample G directives at a decision point, roll each out N turns with the
     FROZEN speakers and simulated user (seeds shared so only the directive differs), score the
     blocks, and update the director with grpo.py's loss on the directive tokens.

Simplifications vs the paper (its values are not published; ours are flags with defaults):
  - after the sampled directive, the remaining N-1 turns of a rollout follow a fixed, cheap
    rollout policy (the agent who has spoken least, no directive), so the block's reward
    measures the sampled decision and not the director's later ones;
  - the judge for coherence is whatever `--judge` is (the offline default on a laptop).

Run:   python mascot.py train --stage 2 --model smollm2-135m --steps 20
"""

from __future__ import annotations

import copy
import math
import random
import re
import time
from collections import Counter
from dataclasses import dataclass

import grpo
import models
import sft
from data import PersonaSet, UserError, atomic_folder, option, read_json, write_json, write_jsonl
from metrics import content_words, sentence_bleu, tokenize
from simulate import (SAFETY, USER, Conversation, Directive, LeastSpoken, RandomOrder, RoundRobin, advance,
                      assign_profiles, judge_state, least_spoken_agent, render_history, run_conversations)

# ----------------------------------------------------------------------------------------------
# 1. The director's prompt and the parser for its answer
# ----------------------------------------------------------------------------------------------

def director_messages(personas: PersonaSet, conv: Conversation) -> list[dict]:
    """The chat prompt asking the director for the next `Agent / Action / Tone` directive.

    The roster gives each companion's name and role only, not the full persona description: the
    director decides WHO and HOW, the speakers' own prompts carry the descriptions, and the
    shorter prompt (support set, measured with the SmolLM2 tokenizer: system part 184 instead of
    372 tokens, a whole opening prompt 305 instead of 493 on average) makes every director
    generation and GRPO pass on it cheaper."""
    roster = "\n".join(f"- {p.name}, the {p.role}" for p in personas.personas)
    counts = Counter(t.speaker for t in conv.agent_turns())
    spoken = ", ".join(f"{p.name} {counts.get(p.name, 0)}x" for p in personas.personas)
    system = ("You direct a group chat in which several companions talk with one person. "
              f"The companions:\n{roster}\n"
              "Choose who should speak next and how, so that the group stays helpful, varied and "
              "never repeats itself. Answer with exactly three lines:\n"
              "Agent: <one companion name>\nAction: <what they should do>\nTone: <how they should sound>\n"
              f"Useful actions: {'; '.join(personas.strategies)}.\n"
              f"Useful tones: {'; '.join(personas.tones)}.")
    user = (f"Situation: {conv.context.situation}\n\nConversation so far:\n"
            f"{render_history(conv.turns)}\n\nTurns so far: {spoken}.\nWho speaks next, and how?")
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


_FIELD = re.compile(r"^[\s\*\-#>\"'`]*(agent|speaker|next|action|strategy|tone)[\s\*\"'`]*[:=\-–—]\s*(.*)$",
                    re.IGNORECASE)


def parse_directive(text: str, personas: PersonaSet, fallback_agent: str) -> Directive:
    """Read `Agent / Action / Tone` out of free model text; never raises.

    Robust to case, spacing, markdown decoration ("**Agent:**"), extra text around the three lines,
    "Speaker"/"Strategy" as synonyms, and an agent given by its role ("the action guide"). When no
    known agent can be found the directive is marked invalid and `fallback_agent` speaks; stage 2
    gives such directives a format penalty and the logs count them.
    """
    text = text if isinstance(text, str) else ""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m:
            key = {"speaker": "agent", "next": "agent", "strategy": "action"}.get(m.group(1).lower(),
                                                                                 m.group(1).lower())
            value = m.group(2).strip().strip("*\"'`").strip()
            fields.setdefault(key, value[:200])
    persona = personas.find(fields.get("agent", "")) if fields.get("agent") else None
    if persona is None and "agent" in fields:
        # "Agent: I think Beacon should go" -> look for a known name or role inside the value.
        persona = find_mentioned(fields["agent"], personas)
    valid = persona is not None
    return Directive(agent=persona.name if persona else fallback_agent,
                     action=fields.get("action", ""), tone=fields.get("tone", ""),
                     valid=valid, raw=text[:1000])


def parse_many(texts: list[str], convs: list[Conversation], personas: PersonaSet) -> list[Directive]:
    """Parse one directive per conversation, each falling back to that conversation's least-spoken agent."""
    return [parse_directive(t, personas, least_spoken_agent(personas, c)) for t, c in zip(texts, convs)]


def find_mentioned(value: str, personas: PersonaSet):
    """The first persona whose name or role appears as whole words in `value`, else None."""
    low = value.lower()
    hits = []
    for p in personas.personas:
        for key in (p.name, p.role):
            m = re.search(rf"\b{re.escape(key.lower())}\b", low)
            if m:
                hits.append((m.start(), p))
    return min(hits, key=lambda h: h[0])[1] if hits else None


# ----------------------------------------------------------------------------------------------
# 2. The LLM director: a speaker-selection policy (simulate.py has the fixed rules it is compared with)
# ----------------------------------------------------------------------------------------------

# A directive is three short lines; 40 tokens hold them with room to spare. The same budget is used
# when GRPO samples directives and when the director runs (evaluation, chat), so what is trained
# is what runs.
DIRECTIVE_MAX_TOKENS = 40


class LLMDirector:
    """A language model that writes the directive: prompted base model or the trained director.

    `choose` decodes greedily (evaluation, chat). While training, grpo.train_grpo samples from
    the same model with the same prompt (`director_messages`), so what is trained is what runs.
    """

    def __init__(self, model, tokenizer, personas: PersonaSet, name: str = "director"):
        self.model, self.tok, self.personas = model, tokenizer, personas
        self.name = name
        self.invalid = 0          # directives that needed the fallback, for the logs
        self.total = 0

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        prompts = [director_messages(self.personas, c) for c in convs]
        gen = models.generate(self.model, self.tok, prompts, DIRECTIVE_MAX_TOKENS, seeds=None)
        out = parse_many(gen.texts, convs, self.personas)
        self.total += len(out)
        self.invalid += sum(not d.valid for d in out)
        return out


def make_policy(name: str, personas: PersonaSet, director=None, seed: int = 0):
    """Build a policy from a `--policy` value: round-robin | random | least-spoken | director."""
    if name == "round-robin":
        return RoundRobin(personas)
    if name == "random":
        return RandomOrder(personas, seed)
    if name == "least-spoken":
        return LeastSpoken(personas)
    if name == "director":
        model, tok = director
        return LLMDirector(model, tok, personas)
    raise UserError(f"--policy {name}: unknown policy; use round-robin, random, least-spoken or director")


# ----------------------------------------------------------------------------------------------
# 3. The group reward of an N-turn block
# ----------------------------------------------------------------------------------------------

@dataclass
class RewardWeights:
    """Weights of the group reward's components; each is also a flag (`--w-coherence` ...)."""
    coherence: float = option(1.0, "group-reward weight of coherence (judge score of the new turns)")
    nonredundancy: float = option(1.0, "group-reward weight of non-redundancy (1 - overlap with "
                                       "earlier agent turns)")
    contribution: float = option(0.5, "group-reward weight of contribution (share of new content words)")
    balance: float = option(0.5, "group-reward weight of balance (who spoke; our addition)")
    format: float = option(0.5, "group-reward weight of format (the directive parsed; our addition)")


@dataclass
class DirectorConfig:
    """Stage 2's own settings (GRPO's are grpo.GRPOConfig); each is also a `train` flag."""
    decision_points: int = option(24, "training decision points (conversation prefixes) to sample from",
                                  "positive")
    heldout_points: int = option(8, "held-out decision points for the before/after group reward",
                                 "positive")
    rollout_turns: int = option(3, "N: agent turns rolled out after each sampled directive", "positive")
    director_warmup: int = option(20, "supervised steps (4 examples each) teaching the director the "
                                      "three-line format before GRPO, with random agents; 0 skips it "
                                      "(director.py, section 5)", "non-negative")
    warmup_lr: float = option(2e-5, "learning rate of the format warm start", "positive")


def block_reward(conv: Conversation, block_start: int, directive: Directive, personas: PersonaSet,
                 encoder, judge, weights: RewardWeights) -> tuple[float, dict]:
    """Score the agent turns added after `block_start` (the block that followed `directive`).

    Components, each in [0, 1] (higher is better):
      coherence:     mean judge score of each new agent turn given its persona and the
                     conversation before it (persona fit + relevance to the user's situation);
      nonredundancy: 1 - mean over new agent turns of max(cosine similarity with any EARLIER
                     agent turn (sentence encoder), clipped at 0) and the lexical overlap (BLEU-2
                     against the earlier agent turns): repeating the group is penalised;
      contribution:  share of the block's content words that are new to the conversation
                     (does the block add something, instead of rephrasing what was said);
      balance:       entropy of agent counts over the whole conversation / log(#agents), times
                     (1 - share of block turns whose speaker repeats the previous agent);
      format:        1 if the directive parsed (a known agent), else 0 (the format penalty).
    Returns (weighted sum, components).
    """
    new_agent = [(i, t) for i, t in enumerate(conv.turns) if i >= block_start
                 and t.speaker not in (USER, SAFETY)]
    earlier = [t.text for t in conv.turns[:block_start] if t.speaker not in (USER, SAFETY)]
    comp = {"coherence": 0.0, "nonredundancy": 1.0, "contribution": 0.0, "balance": 0.0,
            "format": 1.0 if directive.valid else 0.0}
    if new_agent:
        states = [judge_state(personas.find(t.speaker), conv.turns[:i], conv.context.situation)
                  for i, t in new_agent]
        replies = [t.text for _, t in new_agent]
        comp["coherence"] = sum(judge.score_many(states, replies)) / len(replies)
        redund = []
        for k, (i, t) in enumerate(new_agent):
            before = earlier + replies[:k]
            if not before:
                redund.append(0.0)
                continue
            vecs = encoder.embed([t.text] + before)                          # (1 + m, D)
            sem = float((vecs[1:] @ vecs[0]).max().clamp(min=0.0))
            lex = sentence_bleu(tokenize(t.text), [tokenize(b) for b in before], max_n=2)
            redund.append(max(sem, lex))
        comp["nonredundancy"] = 1.0 - sum(redund) / len(redund)
        old_words = set().union(*(content_words(t.text) for t in conv.turns[:block_start])) \
            if block_start else set()
        new_words = set().union(*(content_words(t) for t in replies))
        comp["contribution"] = len(new_words - old_words) / len(new_words) if new_words else 0.0
    counts = Counter(t.speaker for t in conv.agent_turns())
    n = len(personas.personas)
    total = sum(counts.values())
    if total:
        entropy = -sum(c / total * math.log(c / total) for c in counts.values())
        agent_seq = [t.speaker for t in conv.agent_turns()]
        first_new = len(agent_seq) - len(new_agent)
        repeats = sum(agent_seq[j] == agent_seq[j - 1] for j in range(max(first_new, 1), len(agent_seq)))
        # With one persona nobody else could have spoken: balance is perfect, and log(1) = 0
        # must not be divided by.
        comp["balance"] = entropy / math.log(n) * (1 - repeats / max(len(new_agent), 1)) if n > 1 else 1.0
    total_reward = sum(getattr(weights, k) * v for k, v in comp.items())
    return total_reward, comp


# ----------------------------------------------------------------------------------------------
# 4. Stage 2: decision points, rollouts, and the data GRPO needs
# ----------------------------------------------------------------------------------------------

def build_decision_points(contexts, n_points: int, cast, profiles, profile_ids: list[str],
                          user_every: int, seed: int, max_prefix: int = 3) -> list[Conversation]:
    """Conversation prefixes at DIFFERENT positions, from which the director must decide.

    Point i starts from context i (cycling) with a Big Five profile, and is cut after
    k = i mod (max_prefix + 1) agent turns (plus the user's answer when one followed), so the
    director learns openings as well as mid-conversation choices. The prefixes are generated once
    with random speaker order (varied histories) by the frozen speakers and user.
    """
    ctxs = [contexts[i % len(contexts)] for i in range(n_points)]
    convs = run_conversations(ctxs, RandomOrder(cast.personas, seed), cast, profiles,
                              assign_profiles(n_points, profile_ids, seed), max_prefix, user_every, seed)
    points = []
    for i, conv in enumerate(convs):
        k = i % (max_prefix + 1)
        cut, seen = 1, 0
        for j, t in enumerate(conv.turns):
            if seen == k:
                break
            if t.speaker not in (USER, SAFETY):
                seen += 1
            cut = j + 1
        while cut < len(conv.turns) and conv.turns[cut].speaker == USER:
            cut += 1                                   # include the user's answer to that turn
        point = copy.deepcopy(conv)
        point.turns = point.turns[:cut]
        point.policy = "prefix"
        if not point.ended:                            # a crisis prefix is no decision point
            points.append(point)
    return points


def save_decision_points(path, train_points, held_points) -> None:
    write_jsonl(path, [{"split": split, **p.to_json()}
                       for split, pts in (("train", train_points), ("heldout", held_points)) for p in pts])


@dataclass
class Rollout:
    """Rolls conversations forward N agent turns after a directive and scores the block."""
    cast: object
    profiles: dict
    personas: PersonaSet
    encoder: object
    judge: object
    weights: RewardWeights
    n_turns: int
    user_every: int
    invalid: int = 0           # directives that needed the fallback (logged; format penalty)
    total: int = 0

    def run(self, points: list[Conversation], directives: list[Directive]):
        """Copy each point, play the directive then N-1 least-spoken turns, score each block.

        Copies of one point keep its seed, so within a GRPO group every rollout samples with the
        same seeds turn by turn (simulate.turn_seed): only the directive differs.
        """
        copies = [copy.deepcopy(p) for p in points]
        starts = [len(c.turns) for c in copies]
        advance(copies, LeastSpoken(self.personas), self.cast, self.profiles, self.n_turns,
                self.user_every, fixed_first=directives)
        scored = [block_reward(c, s, d, self.personas, self.encoder, self.judge, self.weights)
                  for c, s, d in zip(copies, starts, directives)]
        return scored, copies

    def score_directives(self, meta: list[Conversation], texts: list[str], group_size: int):
        """GRPO's reward function for stage 2: one group reward per sampled directive text."""
        points = [m for m in meta for _ in range(group_size)]
        directives = parse_many(texts, points, self.personas)
        self.total += len(directives)
        self.invalid += sum(not d.valid for d in directives)
        scored, _ = self.run(points, directives)
        components = {k: [c[k] for _, c in scored] for k in scored[0][1]}
        # Agent choice frequencies: the mean of these 0/1 columns is how often each agent is picked.
        for name in self.personas.names():
            components[f"pick_{name}"] = [float(d.agent == name) for d in directives]
        return [r for r, _ in scored], components

    def evaluate(self, policy, points: list[Conversation]) -> dict:
        """Mean group reward of the policy's (greedy) directives on held-out decision points."""
        directives = policy.choose(points)
        scored, copies = self.run(points, directives)
        n = len(scored)
        comps = {k: sum(c[k] for _, c in scored) / n for k in scored[0][1]}
        choices = Counter(d.agent for d in directives)
        return {"reward": sum(r for r, _ in scored) / n, "components": comps,
                "choices": {name: choices.get(name, 0) for name in self.personas.names()},
                "invalid": sum(not d.valid for d in directives), "n": n,
                "example": copies[0].to_json()}


# ----------------------------------------------------------------------------------------------
# 5. A supervised format warm start (our addition; the paper does not describe one)
# ----------------------------------------------------------------------------------------------
# GRPO can only reinforce what the policy already samples. SmolLM2-135M asked for a directive
# almost never writes the three lines (0 of 32 parseable when we measured), so every sample of a
# group falls back to the same agent, the rollouts are identical, every reward in the group is
# equal, and the advantages are all zero: no learning signal at all. A few steps of supervised
# fine-tuning on well-formed directives fix the FORMAT first. The targets pick the agent, action
# and tone uniformly at random, so the warm start teaches how to answer and not whom to pick:
# choosing well is left to GRPO and the group reward.

def format_examples(personas: PersonaSet, points: list[Conversation], n: int,
                    seed: int = 0) -> list[tuple[list[dict], str]]:
    """n (director prompt, target directive) pairs, cycling over the decision points; every
    target is the exact three-line format with a uniformly random agent, action and tone."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        conv = points[i % len(points)]
        target = (f"Agent: {rng.choice(personas.names())}\n"
                  f"Action: {rng.choice(personas.strategies)}\nTone: {rng.choice(personas.tones)}")
        examples.append((director_messages(personas, conv), target))
    return examples


def warm_start(cfg: DirectorConfig, out, policy, tok, personas: PersonaSet, train_points, held_points,
               rollout: Rollout, seed: int, resume: bool) -> dict | None:
    """Run the format warm start once per run, before GRPO; None when cfg.director_warmup is 0.

    Its result (losses, held-out group reward) goes to out/warm_start.json and the weights to
    out/director_warm (the KL anchor of GRPO when beta > 0). A resumed run that already has GRPO
    checkpoints skips it, because those checkpoints were trained from the warm-started weights.
    """
    path = out / "warm_start.json"
    if cfg.director_warmup == 0:
        return None
    if resume and grpo.latest_checkpoint(out / "checkpoints") and path.exists():
        return read_json(path)
    examples = format_examples(personas, train_points, cfg.director_warmup * 4, seed)
    t0 = time.time()
    losses = sft.supervised_finetune(policy, tok, examples, cfg.director_warmup, batch_size=4,
                                     lr=cfg.warmup_lr, log=lambda s: print(s, flush=True))
    seconds = time.time() - t0
    held = rollout.evaluate(LLMDirector(policy, tok, personas), held_points)
    print(f"held-out mean group reward after the format warm start: {held['reward']:.3f}  agent choices: "
          f"{held['choices']}  unparseable: {held['invalid']}/{held['n']}", flush=True)
    with atomic_folder(out / "director_warm") as tmp:
        policy.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    warm = {"steps": cfg.director_warmup, "lr": cfg.warmup_lr, "losses": losses,
            "seconds": round(seconds, 1), "heldout": held}
    write_json(path, warm)
    return warm
