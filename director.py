"""director.py: who speaks next, and how (the paper's Phase II, collaborative dialogue optimisation).

The director reads the conversation and writes a directive in the format of the paper's figure:

    Agent: Anchor
    Action: validate the feeling of guilt and make them feel safe
    Tone: calm and empathetic

This file holds, in reading order:
  1. the director's prompt and a robust parser for its answer (`parse_directive`);
  2. speaker-selection policies with one interface, `choose(convs) -> list[Directive]`:
     round-robin, random order (the paper's MASCOT-C ablation), and the LLM director
     (prompted base model, or the model trained here);
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
import json
import math
import random
import re
from collections import Counter
from dataclasses import dataclass

import models
from data import PersonaSet
from simulate import SAFETY, USER, Conversation, Directive, render_history

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


def least_spoken_agent(personas: PersonaSet, conv: Conversation) -> str:
    """The documented fallback choice: the agent who has spoken least (earliest in the roster on ties),
    never the one who spoke last when another is available. It keeps the group balanced."""
    agent_turns = conv.agent_turns()
    counts = Counter(t.speaker for t in agent_turns)
    last = agent_turns[-1].speaker if agent_turns else None
    names = personas.names()
    order = sorted(range(len(names)), key=lambda i: (counts.get(names[i], 0), names[i] == last, i))
    return names[order[0]]


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
# 2. Speaker-selection policies (one interface: name + choose(convs) -> list[Directive])
# ----------------------------------------------------------------------------------------------

class RoundRobin:
    """Agents speak in roster order, cycling (the MultiAgentESC-style fixed order baseline)."""
    name = "round-robin"

    def __init__(self, personas: PersonaSet):
        self.personas = personas

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        names = self.personas.names()
        return [Directive(names[len(c.agent_turns()) % len(names)]) for c in convs]


class RandomOrder:
    """A uniformly random agent each turn, no strategy (the paper's MASCOT-C: no director)."""
    name = "random"

    def __init__(self, personas: PersonaSet, seed: int = 0):
        self.personas = personas
        self.seed = seed

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        # Seeded per (conversation, turn), so the order does not depend on batch composition.
        return [Directive(random.Random(c.seed * 7_919 + len(c.turns) + self.seed)
                          .choice(self.personas.names())) for c in convs]


class LeastSpoken:
    """The agent who has spoken least; the rollout policy of stage 2 and the parse fallback."""
    name = "least-spoken"

    def __init__(self, personas: PersonaSet):
        self.personas = personas

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        return [Directive(least_spoken_agent(self.personas, c)) for c in convs]


class LLMDirector:
    """A language model that writes the directive: prompted base model or the trained director.

    `choose` decodes greedily (evaluation, chat). While training, grpo.train_grpo samples from
    the same model with the same prompt (`director_messages`), so what is trained is what runs.
    """

    def __init__(self, model, tokenizer, personas: PersonaSet, name: str = "director",
                 max_new_tokens: int = 40):
        self.model, self.tok, self.personas = model, tokenizer, personas
        self.name = name
        self.max_new_tokens = max_new_tokens
        self.invalid = 0          # directives that needed the fallback, for the logs
        self.total = 0

    def choose(self, convs: list[Conversation]) -> list[Directive]:
        prompts = [director_messages(self.personas, c) for c in convs]
        gen = models.generate(self.model, self.tok, prompts, self.max_new_tokens, seeds=None)
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
    from data import UserError
    raise UserError(f"--policy {name}: unknown policy; use round-robin, random, least-spoken or director")


# ----------------------------------------------------------------------------------------------
# 3. The group reward of an N-turn block
# ----------------------------------------------------------------------------------------------

@dataclass
class RewardWeights:
    """Weights of the group reward's components (flags of `train --stage 2`, defaults there)."""
    coherence: float = 1.0
    nonredundancy: float = 1.0
    contribution: float = 0.5
    balance: float = 0.5
    format: float = 0.5


CONTENT_STOPWORDS = set("""a an the and or but if so to of in on at for with from by as is are was were be been
being am i you he she it we they me him her us them my your his its our their this that these those
do does did have has had not no yes just very really can could would should will shall may might
must what which who whom how why when where there here all any some more most much many such than
too also only own same about into over under again then once now feel feeling""".split())


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.lower()) if w not in CONTENT_STOPWORDS and len(w) > 2}


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
    from evaluate import sentence_bleu, tokenize  # the Self-BLEU building block, one definition
    from judge import JudgeState
    new_agent = [(i, t) for i, t in enumerate(conv.turns) if i >= block_start
                 and t.speaker not in (USER, SAFETY)]
    earlier = [t.text for t in conv.turns[:block_start] if t.speaker not in (USER, SAFETY)]
    comp = {"coherence": 0.0, "nonredundancy": 1.0, "contribution": 0.0, "balance": 0.0,
            "format": 1.0 if directive.valid else 0.0}
    if new_agent:
        states, replies = [], []
        for i, t in new_agent:
            persona = personas.find(t.speaker)
            last_user = next((u.text for u in reversed(conv.turns[:i]) if u.speaker == USER), "")
            states.append(JudgeState(persona.name, f"{persona.role}: {persona.description}", last_user,
                                     [{"speaker": u.speaker, "text": u.text} for u in conv.turns[:i][-6:]],
                                     conv.context.situation))
            replies.append(t.text)
        comp["coherence"] = sum(judge.score_many(states, replies)) / len(replies)
        texts = [t.text for _, t in new_agent]
        redund = []
        for k, (i, t) in enumerate(new_agent):
            before = earlier + texts[:k]
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
        new_words = set().union(*(content_words(t) for t in texts))
        comp["contribution"] = len(new_words - old_words) / len(new_words) if new_words else 0.0
    counts = Counter(t.speaker for t in conv.agent_turns())
    n = len(personas.personas)
    total = sum(counts.values())
    if total:
        entropy = -sum(c / total * math.log(c / total) for c in counts.values())
        agent_seq = [t.speaker for t in conv.agent_turns()]
        first_new = len(agent_seq) - len(new_agent)
        repeats = sum(agent_seq[j] == agent_seq[j - 1] for j in range(max(first_new, 1), len(agent_seq)))
        comp["balance"] = entropy / math.log(n) * (1 - repeats / max(len(new_agent), 1))
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
    from simulate import assign_profiles, run_conversations
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
    with open(path, "w", encoding="utf-8") as f:
        for split, pts in (("train", train_points), ("heldout", held_points)):
            for p in pts:
                f.write(json.dumps({"split": split, **p.to_json()}, ensure_ascii=False) + "\n")


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
        from simulate import advance
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


def completion_text(tok, messages: list[dict], target: str) -> tuple[str, str]:
    """(prompt text, completion text) with the chat template's own end-of-turn after the target.

    Rendering the conversation with and without the assistant turn and taking the difference
    gives exactly the tokens the model must learn to write, end-of-turn marker included, for
    any chat template (a plain `target + eos` would be wrong for templates that add more)."""
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": target}], tokenize=False)
    if full.startswith(prompt):
        return prompt, full[len(prompt):].rstrip("\n")
    return prompt, target + (tok.eos_token or "")


def supervised_warm_start(model, tok, examples: list[tuple[list[dict], str]], steps: int,
                          batch_size: int = 8, lr: float = 2e-5, log=print) -> list[float]:
    """Maximum likelihood of each target given its prompt, `steps` AdamW steps of `batch_size`
    examples (cycling). Returns the per-step loss (mean negative log-probability per target
    token), which should fall. Full fine-tuning, like the GRPO that follows."""
    import torch

    import grpo
    if steps <= 0 or not examples:
        return []
    rows = []
    for messages, target in examples:
        prompt, completion = completion_text(tok, messages, target)
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                     tok(completion, add_special_tokens=False)["input_ids"]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        batch = [rows[(step * batch_size + j) % len(rows)] for j in range(batch_size)]
        p_ids, p_mask = models.left_pad([p for p, _ in batch], tok.pad_token_id)      # (B, P)
        width = max(len(c) for _, c in batch)
        c_ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)   # (B, C), right-padded
        c_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, c) in enumerate(batch):
            c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[r, :len(c)] = 1
        dev = next(model.parameters()).device
        logps = grpo.completion_logprobs(model, torch.cat([p_ids, c_ids], 1).to(dev),
                                         torch.cat([p_mask, c_mask], 1).to(dev), p_ids.shape[1])  # (B, C)
        mask = c_mask.to(dev).float()
        loss = -(logps * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        log(f"warm start {step + 1}/{steps}: loss {loss.item():.3f}")
    model.eval()
    return losses
