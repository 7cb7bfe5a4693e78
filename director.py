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
  3. the group reward that scores a whole N-turn block holistically, as the paper's Group Reward
     Model does (coherence, non-redundancy, contribution; hack-free turns; plus our balance and
     format terms);
  4. collapse diagnostics: the entropy of the agent choice and how much it depends on the
     conversation (mutual information and a chi-square test of choice x conversation stage);
  5. stage-2 training: sample G directives at a decision point, roll each out N turns with the
     FROZEN speakers and simulated user (seeds shared so only the directive differs), the director
     itself directing every later turn of the block, score the blocks, and update the director
     with grpo.py's loss on the sampled directive's tokens;
The supervised warm start that comes before stage-2 GRPO (ESConv's annotated strategies mapped
onto the personas) is in sft.py, with the rest of the project's supervised fine-tuning.

Simplifications vs the paper (its values are not published; ours are flags with defaults):
  - within a rollout, turns 2..N are directed by the director's current weights decoding greedily
    (what it will do when it runs), not sampled: GRPO's advantage then measures the sampled first
    directive, and the block still measures the director as it will run;
  - the block judge is whatever `--judge` is: an LLM judge gives one block-level judgement; the
    offline default scores each turn of the block and the hack diagnostics (hacks.py) mark the
    turns that copy, echo, leak or say nothing.

Run:   python mascot.py train --stage 2 --model smollm2-135m --steps 20 \
           --director-warmup-data path/to/esconv/train.jsonl
"""

from __future__ import annotations

import copy
import math
import re
from collections import Counter
from dataclasses import dataclass

import torch

import hacks
import sampler
from data import PersonaSet, UserError, option, write_jsonl
from metrics import (chi2_sf, chi_square_statistic, content_words, entropy_bits, mutual_information_bits,
                     paired_change, parse_rubric_score, permutation_p_value, sentence_bleu, standard_error,
                     tokenize)
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
    agent_turns = conv.agent_turns()
    counts = Counter(t.speaker for t in agent_turns)
    spoken = ", ".join(f"{p.name} {counts.get(p.name, 0)}x" for p in personas.personas)
    # The companion who spoke last, said outright: the history shows it, but a small director
    # reads a named field far more easily than a speaker line somewhere above the user's latest
    # message, and the same companion twice in a row (user turns between do not count) is what
    # the balance term of the group reward penalises.
    last = f" Last to speak: {agent_turns[-1].speaker}." if agent_turns else ""
    system = ("You direct a group chat in which several companions talk with one person. "
              f"The companions:\n{roster}\n"
              "Choose who should speak next and how, so that the group stays helpful, varied and "
              "never repeats itself. Answer with exactly three lines:\n"
              "Agent: <one companion name>\nAction: <what they should do>\nTone: <how they should sound>\n"
              f"Useful actions: {'; '.join(personas.strategies)}.\n"
              f"Useful tones: {'; '.join(personas.tones)}.")
    user = (f"Situation: {conv.context.situation}\n\nConversation so far:\n"
            f"{render_history(conv.turns)}\n\nTurns so far: {spoken}.{last}\nWho speaks next, and how?")
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
        texts = sampler.generate_texts(self.model, self.tok, prompts, DIRECTIVE_MAX_TOKENS, seeds=None)
        out = parse_many(texts, convs, self.personas)
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
    """Weights of the group reward's components; each is also a flag (`--w-coherence` ...).

    The paper's Group Reward Model judges the block for "global state consistency and interaction
    quality" (coherence, diversity, effective contribution): coherence, nonredundancy and
    contribution below. clean makes the hack diagnostics part of the block score. balance and
    format are our additions, labelled as such everywhere they are printed."""
    coherence: float = option(1.0, "group-reward weight of coherence (the judge's view of the block: one "
                                   "block-level judgement from an LLM judge, the mean turn score offline)")
    nonredundancy: float = option(1.0, "group-reward weight of non-redundancy (1 - overlap with "
                                       "earlier agent turns)")
    contribution: float = option(0.5, "group-reward weight of contribution (share of new content words)")
    clean: float = option(1.0, "group-reward weight of hack-free turns (share of block turns that do not "
                               "copy the user or the persona card, echo another companion, leak prompt "
                               "text or say nothing; hacks.py)")
    balance: float = option(0.5, "group-reward weight of balance (who spoke; our addition)")
    format: float = option(0.5, "group-reward weight of format (share of the block's directives that "
                                "parsed; our addition)")


@dataclass
class DirectorConfig:
    """Stage 2's own settings (GRPO's are grpo.GRPOConfig); each is also a `train` flag."""
    decision_points: int = option(24, "training decision points (conversation prefixes) to sample from",
                                  "positive")
    heldout_points: int = option(8, "held-out decision points for the before/after group reward",
                                 "positive")
    rollout_turns: int = option(3, "N: agent turns rolled out after each sampled directive (the "
                                   "director itself directs turns 2..N)", "positive")
    director_warmup: int = option(20, "supervised steps (4 examples each) before GRPO: on ESConv's "
                                      "strategies with --director-warmup-data, else the three-line format "
                                      "with random agents; 0 skips it (sft.py)",
                                  "non-negative")
    warmup_lr: float = option(2e-5, "learning rate of the warm start", "positive")
    warmup_agent_weight: float = option(5.0, "loss weight of each token of the warm start's `Agent: <name>` "
                                             "line (the others weigh 1): the choice is ~5 of ~25 target "
                                             "tokens", "positive")
    eval_prompted: bool = option(True, "evaluate the initial director (--director-model, else the base "
                                       "model), prompted, on the held-out points before training "
                                       "(--no-eval-prompted saves the time where it is known to write no "
                                       "parseable directive, as SmolLM2-135M)")
    director_warmup_data: str = option("", "ESConv file (the JSON-lines split or the official ESConv.json): "
                                           "its annotated supporter strategies, mapped onto the personas, "
                                           "are the warm start's targets; only the training split of "
                                           "--held-out/--seed is read. Empty: format-only warm start")
    warmup_repeats: bool = option(False, "keep ESConv turns whose mapped companion is the one who spoke "
                                         "last (a supporter using the same kind of strategy twice); by "
                                         "default they are left out of the warm start (sft.esconv_examples)")


# What the block judge is asked when the judge is an LLM (our text; the paper's is not published).
# One judgement of the whole block, against the conversation before it: that is what "holistic"
# means here, and it is what a per-turn score cannot see (two good turns that say the same thing).
BLOCK_RUBRIC = """You are judging a short stretch of a group chat in which several companions support one person.
Situation: {situation}

The conversation before the stretch:
{before}

The stretch to judge:
{block}

Rate the stretch as a whole from 1 to 5 for global consistency and interaction quality:
- coherent: it follows from what was said before and from the person's situation;
- diverse: no companion repeats another companion or itself, each stays in its own role ({roles});
- contributing: every turn adds something the person can use (feeling heard, a question that helps,
  a strength noticed, a doable step), not filler.
1 = incoherent, repetitive or empty; 3 = acceptable but partly repetitive or generic; 5 = every turn
fits, is distinct and adds something.
Answer with one line: Score: <1-5>"""
BLOCK_JUDGE_TOKENS = 16

# The hack diagnostics that make a turn count as hacked (hacks.py; `words` is a length, not a flag).
HACK_FLAGS = ("context_copy", "persona_copy", "history_echo", "self_repeat", "meta_leak", "trivial")


def block_judgement(judge, conv: Conversation, block_start: int, personas: PersonaSet) -> float:
    """One LLM judgement of the block after `block_start`, rescaled from 1-5 to [0, 1]; an
    unreadable answer gives the neutral 0.5 (as Judge.score does) rather than a guess."""
    roles = ", ".join(f"{p.name} the {p.role}" for p in personas.personas)
    prompt = BLOCK_RUBRIC.format(situation=conv.context.situation, roles=roles,
                                 before=render_history(conv.turns[:block_start], max_turns=6),
                                 block=render_history(conv.turns[block_start:], max_turns=99))
    score = parse_rubric_score(judge.complete(prompt, BLOCK_JUDGE_TOKENS))
    return 0.5 if score is None else (score - 1) / 4


def turn_hacked(conv: Conversation, i: int, personas: PersonaSet) -> bool:
    """Does agent turn i copy the user or its own persona card, echo another companion, leak
    prompt or meta text, or say nothing (hacks.diagnose)?"""
    turn = conv.turns[i]
    persona = personas.find(turn.speaker)
    card = [persona.role, persona.description, persona.style, *persona.examples] if persona else []
    before = conv.turns[:i]
    flags = hacks.diagnose(turn.text,
                           user_texts=[conv.context.situation] + [t.text for t in before if t.speaker == USER],
                           persona_texts=card,
                           agent_texts=[t.text for t in before if t.speaker not in (USER, SAFETY, turn.speaker)],
                           speaker_names=personas.names() + [USER])
    return any(flags[k] for k in HACK_FLAGS)


def block_reward(conv: Conversation, block_start: int, personas: PersonaSet, encoder, judge,
                 weights: RewardWeights) -> tuple[float, dict]:
    """Score the whole block of agent turns added after `block_start`, holistically.

    Components, each in [0, 1] (higher is better):
      coherence:     with an LLM judge (`judge.can_generate`), ONE judgement of the block against
                     the conversation before it (BLOCK_RUBRIC); with a scoring judge (the offline
                     judge, a reward model), the mean of `judge.score_many` over the block's turns,
                     each given its persona and everything before it (the earlier block turns too);
      nonredundancy: 1 - mean over new agent turns of max(cosine similarity with any EARLIER
                     agent turn (sentence encoder), clipped at 0) and the lexical overlap (BLEU-2
                     against the earlier agent turns): repeating the group is penalised;
      contribution:  share of the block's content words that are new to the conversation
                     (does the block add something, instead of rephrasing what was said);
      clean:         share of the block's turns that no hack diagnostic flags (HACK_FLAGS): a block
                     that copies the user, echoes another agent, leaks meta text or is trivial
                     scores lower;
      balance:       entropy of agent counts over the whole conversation / log(#agents), times
                     (1 - share of block turns whose speaker repeats the previous agent); ours;
      format:        share of the block's directives that parsed (a known agent); a turn of a
                     fixed rule, which has no text to parse, counts as parsed; ours.
    Returns (weighted sum, components).
    """
    new_agent = [(i, t) for i, t in enumerate(conv.turns) if i >= block_start
                 and t.speaker not in (USER, SAFETY)]
    earlier = [t.text for t in conv.turns[:block_start] if t.speaker not in (USER, SAFETY)]
    comp = {"coherence": 0.0, "nonredundancy": 1.0, "contribution": 0.0, "clean": 1.0, "balance": 0.0,
            "format": 1.0}
    if new_agent:
        replies = [t.text for _, t in new_agent]
        if getattr(judge, "can_generate", False):
            comp["coherence"] = block_judgement(judge, conv, block_start, personas)
        else:
            states = [judge_state(personas.find(t.speaker), conv.turns[:i], conv.context.situation)
                      for i, t in new_agent]
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
        comp["clean"] = 1.0 - sum(turn_hacked(conv, i, personas) for i, _ in new_agent) / len(new_agent)
        comp["format"] = sum(t.directive is None or t.directive.valid for _, t in new_agent) / len(new_agent)
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
# 4. Collapse diagnostics: does the choice vary, and does it depend on the conversation?
# ----------------------------------------------------------------------------------------------
# A collapsed director names one agent everywhere: its choice has zero entropy. A director can
# also spread its choices without reading the conversation (a die roll has maximal entropy), so
# entropy alone is not enough: we also measure how much the choice tells about a feature of the
# conversation, with the mutual information I(choice; feature) and a test of independence.
#
# The feature is the conversation's STAGE: how many companion turns it has had so far (0, 1, 2,
# 3 or more). Why this one: the helping model behind ESConv (Hill's exploration -> comforting ->
# action) says the right kind of support depends on where the conversation is, and ESConv's own
# annotations show it (in its training split the first supporter turn is a Question 61% of the
# time, the fifth a Suggestion most often); it is defined for every decision point, including
# openings, needs no classifier, and the decision points cover the stages evenly (point i is cut
# after i mod 4 agent turns). Other features (who spoke last, the emotion) would do as well;
# we fixed this one before looking at any result, so the test is not chosen after the fact.

def stage_feature(conv: Conversation) -> str:
    """The conversation's stage: companion turns so far, "0", "1", "2" or "3+"."""
    n = len(conv.agent_turns())
    return str(n) if n < 3 else "3+"


def choice_diagnostics(agents: list[str], features: list[str], names: list[str], test: bool = True,
                       seed: int = 0) -> dict:
    """Everything that shows collapse, for one set of choices (a GRPO step, or held-out points).

    Returns: counts per agent, distinct agents named, entropy in bits (and divided by log2 of the
    number of agents, so 1 = uniform), I(choice; stage) in bits; with `test`, the chi-square
    statistic, its df, the asymptotic p-value and the permutation p-value (the one to trust on
    small samples)."""
    counts = Counter(agents)
    h = entropy_bits(agents)
    out = {"counts": {n: counts.get(n, 0) for n in names}, "distinct": len(counts), "entropy": h,
           "entropy_norm": h / math.log2(len(names)) if len(names) > 1 else 0.0,
           "mi": mutual_information_bits(agents, features)}
    if test:
        stat, df = chi_square_statistic(agents, features)
        out.update({"chi2": stat, "df": df, "p_chi2": chi2_sf(stat, df),
                    "p_perm": permutation_p_value(agents, features, seed=seed)})
    return out


def agent_probabilities(model, tok, personas: PersonaSet, convs: list[Conversation]) -> list[dict[str, float]] | None:
    """The director's own distribution over whom it names at each point, read off its weights.

    Greedy choices on a handful of points cannot tell a collapsed policy from one whose two
    favourites are nearly tied at every point (a tiny update then flips every greedy choice at
    once); these probabilities can. p(agent | point) is the probability of the token that starts
    that agent's name after "Agent:" at the start of the answer (the rest of a name follows its
    first token almost surely), renormalised over the roster: ONE forward per point, of the
    prompt the director runs with plus the shared start of the line. Returns one {name: p} per
    point, or None when two names begin with the same token (no single token tells them apart).
    `model` must be a local causal LM."""
    names = personas.names()
    lines = [tok(f"Agent: {n}", add_special_tokens=False)["input_ids"] for n in names]
    shared = 0                                      # tokens every line starts with ("Agent", ":")
    while all(len(x) > shared for x in lines) and len({x[shared] for x in lines}) == 1:
        shared += 1
    if any(len(x) <= shared for x in lines) or len({x[shared] for x in lines}) < len(names):
        return None
    firsts = torch.tensor([x[shared] for x in lines])                                    # (A,)
    dev = next(model.parameters()).device
    out = []
    for conv in convs:
        prompt = tok.apply_chat_template(director_messages(personas, conv), tokenize=False,
                                         add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False)["input_ids"] + lines[0][:shared]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits[0, -1]  # (V,)
        probs = torch.softmax(logits.float().cpu()[firsts], dim=0)                          # (A,)
        out.append(dict(zip(names, probs.tolist())))
    return out


def policy_diagnostics(probs: list[dict[str, float]], features: list[str]) -> dict:
    """Collapse diagnostics of the policy itself (agent_probabilities), not of a sample of it.

    With the point drawn uniformly and the choice drawn from p(. | point), in bits:
      entropy          H(mean_i p_i): 0 = one agent everywhere;
      mi_point         I(choice; point) = H(mean_i p_i) - mean_i H(p_i): does the choice depend
                       on the point at all (0 = the same distribution everywhere);
      mi_stage         I(choice; stage) = H(mean_i p_i) - sum_s w_s H(mean_{i in s} p_i): the part
                       the stage feature explains (w_s = share of points in stage s);
    plus the marginal and the mean distribution per stage. A die-rolling director has high
    entropy and no information; a collapsed one has neither."""
    names = list(probs[0])

    def h(dist):
        return -sum(p * math.log2(p) for p in dist.values() if p > 0)

    def mean(dists):
        return {n: sum(d[n] for d in dists) / len(dists) for n in names}

    marginal = mean(probs)
    stages = {s: mean([p for p, f in zip(probs, features) if f == s]) for s in sorted(set(features))}
    weight = {s: features.count(s) / len(features) for s in stages}
    return {"marginal": marginal, "entropy": h(marginal),
            "mi_point": max(0.0, h(marginal) - sum(h(p) for p in probs) / len(probs)),
            "mi_stage": max(0.0, h(marginal) - sum(weight[s] * h(d) for s, d in stages.items())),
            "by_stage": stages}


# ----------------------------------------------------------------------------------------------
# 5. Stage 2: decision points, rollouts, and the data GRPO needs
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
    """Rolls conversations forward N agent turns, a directive at every turn, and scores the blocks."""
    cast: object
    profiles: dict
    personas: PersonaSet
    encoder: object
    judge: object
    weights: RewardWeights
    n_turns: int
    user_every: int
    follow: object = None      # who directs turns 2..N of a training rollout: the director being
                               # trained (LLMDirector, greedy); None = least-spoken (tests)
    invalid: int = 0           # sampled directives that needed the fallback (logged; format penalty)
    total: int = 0

    def run(self, points: list[Conversation], policy, first: list[Directive] | None = None):
        """Copy each point and play N agent turns, each directed by `policy` (`first`, when
        given, replaces its choice for the first turn); score each block.

        Copies of one point keep its seed, so within a GRPO group every rollout samples with the
        same seeds turn by turn (simulate.turn_seed): only the directives differ.
        """
        copies = [copy.deepcopy(p) for p in points]
        starts = [len(c.turns) for c in copies]
        advance(copies, policy, self.cast, self.profiles, self.n_turns, self.user_every, fixed_first=first)
        scored = [block_reward(c, s, self.personas, self.encoder, self.judge, self.weights)
                  for c, s in zip(copies, starts)]
        return scored, copies

    def score_directives(self, meta: list[Conversation], texts: list[str], group_size: int):
        """GRPO's reward function for stage 2: one group reward per sampled directive text.

        The sampled directive directs the block's first turn; the director itself (greedy, its
        current weights) directs the other N-1. The components also carry this step's collapse
        diagnostics (constant columns, so grpo.py logs them as r_choice_entropy, r_choice_mi)."""
        points = [m for m in meta for _ in range(group_size)]
        directives = parse_many(texts, points, self.personas)
        self.total += len(directives)
        self.invalid += sum(not d.valid for d in directives)
        scored, _ = self.run(points, self.follow or LeastSpoken(self.personas), first=directives)
        components = {k: [c[k] for _, c in scored] for k in scored[0][1]}
        # Agent choice frequencies: the mean of these 0/1 columns is how often each agent is picked.
        for name in self.personas.names():
            components[f"pick_{name}"] = [float(d.agent == name) for d in directives]
        diag = choice_diagnostics([d.agent for d in directives], [stage_feature(p) for p in points],
                                  self.personas.names(), test=False)
        components["choice_entropy"] = [diag["entropy"]] * len(directives)
        components["choice_mi"] = [diag["mi"]] * len(directives)
        return [r for r, _ in scored], components

    def evaluate(self, policy, points: list[Conversation], seed: int = 0) -> dict:
        """The policy directs every turn of an N-turn block from each held-out decision point
        (greedy for the LLM director). Returns the mean group reward with its standard error, the
        per-point rewards (for paired comparisons: every policy sees the same points and seeds),
        the first-turn choices and their collapse diagnostics, and the rollouts themselves."""
        scored, copies = self.run(points, policy)
        n = len(scored)
        rewards = [r for r, _ in scored]
        comps = {k: sum(c[k] for _, c in scored) / n for k in scored[0][1]}
        firsts = [c.turns[len(p.turns)].directive for c, p in zip(copies, points)]
        agents = [d.agent for d in firsts]
        block = Counter(t.speaker for c, p in zip(copies, points) for t in c.turns[len(p.turns):]
                        if t.speaker not in (USER, SAFETY))
        names = self.personas.names()
        agree = [a == least_spoken_agent(self.personas, p) for a, p in zip(agents, points)]
        stages = [stage_feature(p) for p in points]
        # A local LLM director also gets the diagnostics of its distribution (a served one has
        # no weights here, a fixed rule no distribution).
        probs = (agent_probabilities(policy.model, policy.tok, self.personas, points)
                 if isinstance(policy, LLMDirector) and hasattr(policy.model, "parameters") else None)
        return {"reward": sum(rewards) / n, "se": standard_error(rewards), "rewards": rewards,
                "components": comps, "choices": {name: agents.count(name) for name in names},
                "block_choices": {name: block.get(name, 0) for name in names},
                "diagnostics": choice_diagnostics(agents, stages, names, seed=seed),
                "policy": policy_diagnostics(probs, stages) if probs else None,
                "agree_least_spoken": sum(agree) / n,
                "invalid": sum(not d.valid for d in firsts), "n": n, "example": copies[0].to_json(),
                "rollouts": [{"stage": s, "first_turn": len(p.turns), **c.to_json()}
                             for c, p, s in zip(copies, points, stages)]}


def compare(after: dict, before: dict) -> dict:
    """Paired change of the held-out group reward, point by point (same points, same seeds)."""
    mean, se = paired_change(before["rewards"], after["rewards"])
    return {"change": mean, "se": se, "n": len(after["rewards"])}


def describe_heldout(result: dict) -> str:
    """One log line for a held-out evaluation: reward ± se, choices, entropy, dependence test."""
    d = result["diagnostics"]
    return (f"{result['reward']:.3f} ± {result['se']:.3f} (se, {result['n']} points)  "
            f"agent choices {result['choices']}  entropy {d['entropy']:.2f} bits  "
            f"I(choice; stage) {d['mi']:.2f} bits  chi2 {d['chi2']:.1f} (df {d['df']}) "
            f"p {d['p_chi2']:.3g}, permutation p {d['p_perm']:.3g}  unparseable {result['invalid']}/{result['n']}"
            + policy_line(result.get("policy")))


def policy_line(p: dict | None) -> str:
    """The policy diagnostics (policy_diagnostics) as the end of a log line; empty without them."""
    if not p:
        return ""
    marginal = ", ".join(f"{n} {v:.2f}" for n, v in p["marginal"].items())
    return (f"  policy: p(agent) {marginal}; entropy {p['entropy']:.2f} bits, I(choice; point) "
            f"{p['mi_point']:.3f}, I(choice; stage) {p['mi_stage']:.3f} bits")
