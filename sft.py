"""sft.py: supervised fine-tuning, the plain maximum-likelihood step the project needs twice.

Where it sits in MASCOT: not a stage of the paper's method, but two parts use it:
  - the SFT baseline of the evaluation (the paper compares MASCOT with an SFT model): the base
    model fine-tuned on what human supporters wrote. ESConv's supporter turns carry one of eight
    strategy labels; ESCONV_STRATEGIES maps seven of them to the support persona whose job that
    strategy is (a question is Catalyst's, a suggestion Guide's...), and each such turn becomes one
    example: MASCOT's speaker prompt for that persona and the dialogue so far -> the supporter's
    words. `python mascot.py sft` trains it (train split only) and reports the held-out loss;
  - the director's warm start before stage-2 GRPO (our addition): a few steps on well-formed
    `Agent / Action / Tone` directives, so that GRPO has directives to compare at all. With ESConv
    the targets are the same strategy mapping read as directives (who should speak at this point
    of a real support dialogue); without it, random agents that teach only the format.
The loss is the mean negative log-likelihood of the target tokens given the prompt, over every
target token of the batch; the prompt tokens are context only. Full fine-tuning with AdamW, like
the GRPO that follows, and log-probs through grpo.completion_logprobs, so that the prompt never
gets logits and the (B, T, V) tensor is never built.

Run: python mascot.py sft --data path/to/esconv/train.jsonl     # the SFT baseline -> RUN/sft/model
     python mascot.py train --stage 2 --director-warmup N \
         --director-warmup-data path/to/esconv/train.jsonl        # the director's warm start
"""

from __future__ import annotations

import random
import time
from collections import Counter

import torch

import grpo
from data import Context, PersonaSet, UserError, atomic_folder, read_json, write_json, write_jsonl
from director import DirectorConfig, LLMDirector, Rollout, describe_heldout, director_messages, parse_directive
from simulate import USER, Conversation, Directive, Turn, least_spoken_agent, speaker_messages

# ----------------------------------------------------------------------------------------------
# ESConv's strategy labels, mapped onto the support personas
# ----------------------------------------------------------------------------------------------
# ESConv (Liu et al. 2021) annotates every supporter turn of real support conversations with one
# of 8 strategies, and the strategies map onto the support personas. The mapping (ESConv's
# definitions in quotes):
#   Question                          -> Catalyst: "ask for information related to the problem"
#                                        is Catalyst's one probing question at a time;
#   Restatement or Paraphrasing       -> Anchor: reflecting back what was said;
#   Reflection of feelings            -> Anchor: naming the feeling;
#   Self-disclosure                   -> Anchor: "divulge similar experiences ... to express your
#                                        empathy": its purpose is validation (not advice, not
#                                        praise), so it belongs to the validator;
#   Affirmation and Reassurance       -> Beacon: "affirm the help-seeker's strengths, motivation,
#                                        and capabilities": the growth advocate's job word for word;
#   Providing Suggestions, Information -> Guide: a concrete step, or facts and resources to act on;
#   Others                            -> no target: greetings, thanks and small talk have no
#                                        persona; such turns stay in the history (spoken by the
#                                        least-spoken agent, the project's fallback rule) but are
#                                        never a target.
# For the director, the action comes from the strategy (from the persona set's vocabulary where
# one fits) and the tone is fixed per strategy. Only the training split of the contexts is read
# (the caller splits them as mascot.load_inputs does), so held-out dialogues stay held out.

ESCONV_STRATEGIES = {
    "Question": ("Catalyst", "ask a probing question", "curious"),
    "Restatement or Paraphrasing": ("Anchor", "reflect back what was said", "calm and steady"),
    "Reflection of feelings": ("Anchor", "validate the feeling", "warm"),
    "Self-disclosure": ("Anchor", "share a similar feeling so they feel less alone", "gentle"),
    "Affirmation and Reassurance": ("Beacon", "name a strength", "encouraging"),
    "Providing Suggestions": ("Guide", "suggest one small step", "practical"),
    "Information": ("Guide", "share useful information", "thoughtful"),
}
# ESConv dialogues run ~15 supporter turns; ours last 2-6 agent turns. Targets come from the
# first ESCONV_MAX_POSITION supporter turns, which cover ESConv's exploration -> comforting ->
# action arc; later turns are mostly closing pleasantries ("Others").
ESCONV_MAX_POSITION = 8
# The SFT baseline learns the supporter's own WORDS, so it leaves out Self-disclosure ("I went
# through that too"): a companion model should not learn to claim lived experiences. The director
# learns only WHO speaks, and there the disclosure's purpose, validation, is Anchor's.
SFT_STRATEGIES = {s: agent for s, (agent, _, _) in ESCONV_STRATEGIES.items() if s != "Self-disclosure"}


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


def token_rows(tok, examples: list[tuple[list[dict], str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) of each (messages, target) example (completion_text's split)."""
    rows = []
    for messages, target in examples:
        prompt, completion = completion_text(tok, messages, target)
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                     tok(completion, add_special_tokens=False)["input_ids"]))
    return rows


def first_line_length(tok, ids: list[int]) -> int:
    """How many of `ids` spell the text's first line, its newline included (all when none)."""
    for i in range(len(ids)):
        if "\n" in tok.decode(ids[:i + 1]):
            return i + 1
    return len(ids)


def token_weights(tok, rows, first_line_weight: float) -> list[list[float]]:
    """A loss weight per target token: first_line_weight on the target's first line, 1 after."""
    weights = []
    for _, target in rows:
        k = first_line_length(tok, target) if first_line_weight != 1.0 else 0
        weights.append([first_line_weight] * k + [1.0] * (len(target) - k))
    return weights


def supervised_finetune(model, tok, examples: list[tuple[list[dict], str]], steps: int,
                          batch_size: int = 8, lr: float = 2e-5, log=print,
                          micro_batch: int | None = None, first_line_weight: float = 1.0,
                          decay: bool = False) -> list[float]:
    """Maximum likelihood of each target given its prompt, `steps` AdamW steps of `batch_size`
    examples (cycling). Returns the per-step loss (mean negative log-probability per target
    token, weighted), which should fall. Full fine-tuning, like the GRPO that follows.

    first_line_weight: the loss weight of each token of a target's first line (the others weigh
    1; the mean is over the weights). The director's warm start weighs its `Agent: <name>` line
    up: it is ~5 tokens of a ~25-token directive, and the one that decides who speaks, while the
    Action and Tone lines follow from it (sft.ESCONV_STRATEGIES) and dominate an unweighted loss.

    decay: the learning rate falls linearly from lr to lr / steps over the steps. The director's
    warm start uses it: with 4 examples a step at 1e-4, the last few batches otherwise decide
    which agent it ends up favouring (docs/RESULTS.md, Session 7).

    micro_batch: examples per forward/backward (None: the whole batch at once). The gradients of
    the micro-batches add up, with the whole batch's target-token count as the one denominator,
    so the step is the full batch's (as grpo.policy_update accumulates). Why: the director's
    prompts run to ~700 tokens, and four at once kept ~4 GB of activations for the backward pass;
    the warm start and the SFT command go one example at a time."""
    if steps <= 0 or not examples:
        return []
    rows = token_rows(tok, examples)
    weights = token_weights(tok, rows, first_line_weight)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        if decay:
            for group in opt.param_groups:
                group["lr"] = lr * (steps - step) / steps
        picked = [(step * batch_size + j) % len(rows) for j in range(batch_size)]
        total = sum(sum(weights[i]) for i in picked)                        # the step's denominator
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        step_rows = micro_batch or len(picked)
        for start in range(0, len(picked), step_rows):
            part = picked[start:start + step_rows]
            logps, _ = grpo.target_logprobs(model, tok.pad_token_id, [rows[i] for i in part])     # (b, C)
            w = torch.zeros_like(logps)                                     # (b, C), 0 on padding
            for r, i in enumerate(part):
                w[r, :len(weights[i])] = torch.tensor(weights[i])
            loss = -(logps * w).sum() / total
            loss.backward()                                                 # gradients add up
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss_sum)
        log(f"warm start {step + 1}/{steps}: loss {loss_sum:.3f}")
    model.eval()
    return losses


def mapped_supporter_turns(contexts, mapping: dict[str, str]):
    """Walk the contexts' recorded dialogues and yield (context, persona name, turns before,
    supporter's words) for every supporter turn whose strategy `mapping` gives to a persona.

    The turns before are simulate.Turns: seeker turns spoken by USER, earlier supporter turns by
    their mapped persona (or "Companion" when their strategy maps to none). A dialogue's first
    turn has nothing to answer and is never yielded. Used by supporter_examples (the SFT data) and
    persona_id.reference_items (the independent evaluator on real supporters' turns)."""
    for ctx in contexts:
        turns: list[Turn] = []
        for t in ctx.turns:
            if t["speaker"] == "user":
                turns.append(Turn(USER, t["text"]))
                continue
            name = mapping.get(t.get("strategy", ""))
            if name and turns:
                yield ctx, name, list(turns), t["text"]
            turns.append(Turn(name or "Companion", t["text"]))


def supporter_examples(contexts, personas) -> list[tuple[list[dict], str]]:
    """(speaker prompt, supporter's words) for every strategy-labelled supporter turn of the
    contexts' recorded dialogues whose strategy maps to a persona of the set (SFT_STRATEGIES).

    The prompt is exactly what the speaker sees in a conversation (simulate.speaker_messages, the
    "persona" style): its card, the situation and the dialogue so far, in which earlier supporter
    turns are labelled with their persona (or "Companion") and seeker turns with "User"."""
    mapping = {s: name for s, name in SFT_STRATEGIES.items() if personas.find(name) is not None}
    return [(speaker_messages(personas.find(name), personas, ctx, turns), text)
            for ctx, name, turns, text in mapped_supporter_turns(contexts, mapping)]


@torch.no_grad()
def mean_nll(model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8) -> float:
    """Mean negative log-likelihood per target token over the examples (no update): the number
    the SFT command prints before and after training, on held-out dialogues."""
    total, count = 0.0, 0
    rows = token_rows(tok, examples)
    for start in range(0, len(rows), batch_size):
        logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows[start:start + batch_size])   # (B, C)
        total -= (logps * mask).sum().item()
        count += int(mask.sum())
    return total / max(count, 1)


# ----------------------------------------------------------------------------------------------
# The director's warm start (our addition; the paper does not describe one)
# ----------------------------------------------------------------------------------------------
# GRPO can only reinforce what the policy already samples. SmolLM2-135M asked for a directive
# almost never writes the three lines (0 of 32 parseable when we measured), so every sample of a
# group falls back to the same agent, the rollouts are identical, every reward in the group is
# equal, and the advantages are all zero: no learning signal at all. A few supervised steps on
# well-formed directives fix the FORMAT first.
#
# Which targets? Random agents (format_examples) teach the format and nothing about whom to
# pick; measured, the greedy director then names one agent everywhere (the collapse GRPO starts
# from). Real strategy SEQUENCES from ESConv (esconv_examples) give targets that depend on the
# conversation.


def esconv_prefix(context: Context, end: int, personas: PersonaSet) -> Conversation:
    """The first `end` recorded turns of an ESConv dialogue as one of our group conversations:
    seeker turns are the user's, each supporter turn is spoken by the persona its strategy maps
    to (with that directive), an unmapped one by the least-spoken persona."""
    conv = Conversation(context, personas.name, "average", "esconv", 0)
    for turn in context.turns[:end]:
        if turn["speaker"] == "user":
            conv.turns.append(Turn(USER, turn["text"]))
            continue
        mapped = ESCONV_STRATEGIES.get(turn.get("strategy", ""))
        directive = Directive(*mapped) if mapped else Directive(least_spoken_agent(personas, conv))
        conv.turns.append(Turn(directive.agent, turn["text"], directive))
    return conv


def esconv_examples(contexts: list[Context], personas: PersonaSet, n: int, seed: int = 0,
                    balanced: bool = True, repeats: bool = False) -> list[tuple[list[dict], str]]:
    """n (director prompt, target directive) pairs from ESConv's annotated supporter turns.

    Every supporter turn among the first ESCONV_MAX_POSITION of a dialogue whose strategy maps to
    a persona is a candidate: the prompt is the dialogue up to that turn (esconv_prefix), the
    target that turn's `Agent / Action / Tone`.

    balanced (the default): the same number of candidates for every agent that is some turn's
    target (n / #agents, the remainder to the first agents in persona order), each agent's drawn
    without replacement while it has enough. Why: the targets are unequal (three of the seven
    strategies map to Anchor; over the first eight supporter turns of our training split, at
    --held-out 0.25 --seed 0, Anchor is 32% of the mapped turns, Catalyst 28%, Guide 24%, Beacon
    17%), and a warm start on a plain draw can put one agent first at every stage, so that its
    greedy choice is that agent everywhere (docs/RESULTS.md, Sessions 6 and 7). With equal counts
    the prior is flat and what is left to learn is how the conversation changes the odds (a
    Question opens most dialogues, Suggestions come later): the conditionals, which is what the
    director is for. balanced=False: n candidates drawn without replacement (seeded; with
    replacement only when there are fewer than n).

    repeats=False (the default) leaves out a turn whose target is the companion who spoke last in
    the prefix (user turns between do not count). ESConv has one supporter; when they use the
    same kind of strategy in two consecutive supporter turns (31% of the mapped supporter turns
    that come after another mapped one, in ESConv's published training data), the mapping makes
    that the same companion twice in a row, which in a group is one companion taking two turns and
    is what the group reward's balance term penalises. Left in, the warm start teaches the
    director the repeat that GRPO then has to unlearn (docs/RESULTS.md, Sessions 6, 7 and 11)."""
    missing = sorted({a for a, _, _ in ESCONV_STRATEGIES.values()} - set(personas.names()))
    if missing:
        raise UserError(f"--director-warmup-data: the ESConv strategy mapping needs the personas "
                        f"{', '.join(missing)}, which the '{personas.name}' set lacks; use --set support")
    candidates, repeated = [], 0
    for context in contexts:
        # Who speaks each recorded turn in our group: esconv_prefix keeps one turn per record, so
        # the whole dialogue, built once, gives every prefix's last companion.
        speakers = [t.speaker for t in esconv_prefix(context, len(context.turns), personas).turns]
        position, last = 0, None
        for j, turn in enumerate(context.turns):
            if turn["speaker"] != "supporter":
                continue
            if position >= ESCONV_MAX_POSITION:
                break
            position += 1
            target = ESCONV_STRATEGIES.get(turn.get("strategy", ""))
            before, last = last, speakers[j]
            if target is None:
                continue
            if target[0] == before and not repeats:
                repeated += 1
                continue
            candidates.append((context, j))
    if not candidates and repeated:
        raise UserError("--director-warmup-data: every supporter turn with an ESConv strategy label "
                        "repeats the companion before it; add --warmup-repeats to keep such turns")
    if not candidates:
        raise UserError("--director-warmup-data: no supporter turn with an ESConv strategy label; "
                        "is this ESConv (ESConv.json or the JSON-lines split)?")
    rng = random.Random(seed)
    if balanced:
        pools = [[c for c in candidates if ESCONV_STRATEGIES[c[0].turns[c[1]]["strategy"]][0] == a]
                 for a in personas.names()]
        pools = [pool for pool in pools if pool]       # an agent no turn maps to gets no share
        chosen = []
        for k, pool in enumerate(pools):
            chosen += draw(rng, pool, n // len(pools) + (k < n % len(pools)))
        rng.shuffle(chosen)
    else:
        chosen = draw(rng, candidates, n)
    examples = []
    for context, j in chosen:
        agent, action, tone = ESCONV_STRATEGIES[context.turns[j]["strategy"]]
        examples.append((director_messages(personas, esconv_prefix(context, j, personas)),
                         f"Agent: {agent}\nAction: {action}\nTone: {tone}"))
    return examples


def draw(rng: random.Random, pool: list, n: int) -> list:
    """n items of pool: without replacement when it has that many, else with replacement."""
    return rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]


def format_examples(personas: PersonaSet, points: list[Conversation], n: int,
                    seed: int = 0) -> list[tuple[list[dict], str]]:
    """The fallback without ESConv: n (director prompt, target directive) pairs, cycling over the
    decision points; every target is the exact three-line format with a uniformly random agent,
    action and tone. It teaches how to answer, not whom to pick."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        conv = points[i % len(points)]
        target = (f"Agent: {rng.choice(personas.names())}\n"
                  f"Action: {rng.choice(personas.strategies)}\nTone: {rng.choice(personas.tones)}")
        examples.append((director_messages(personas, conv), target))
    return examples


def warm_start(cfg: DirectorConfig, out, policy, tok, personas: PersonaSet, examples, source: str,
               held_points, rollout: Rollout, seed: int, resume: bool) -> dict | None:
    """Run the warm start once per run, before GRPO; None when cfg.director_warmup is 0.

    `examples`: (prompt, target) pairs (esconv_examples or format_examples); `source` says which.
    Its result (losses, held-out group reward) goes to out/warm_start.json, its held-out rollouts
    to out/heldout_warm-start.jsonl and the weights to
    out/director_warm (the KL anchor of GRPO when beta > 0). A resumed run that already has GRPO
    checkpoints skips it, because those checkpoints were trained from the warm-started weights.
    """
    path = out / "warm_start.json"
    if cfg.director_warmup == 0:
        return None
    if resume and grpo.latest_checkpoint(out / "checkpoints") and path.exists():
        return read_json(path)
    t0 = time.time()
    losses = supervised_finetune(policy, tok, examples, cfg.director_warmup, batch_size=4,
                                 lr=cfg.warmup_lr, log=lambda s: print(s, flush=True), micro_batch=1,
                                 first_line_weight=cfg.warmup_agent_weight, decay=True)
    seconds = time.time() - t0
    held = rollout.evaluate(LLMDirector(policy, tok, personas), held_points, seed)
    write_jsonl(out / "heldout_warm-start.jsonl", held.pop("rollouts"))
    print(f"held-out mean group reward after the {source.split(' warm start')[0]} warm start: "
          f"{describe_heldout(held)}", flush=True)
    with atomic_folder(out / "director_warm") as tmp:
        policy.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    targets = Counter(parse_directive(t, personas, "?").agent for _, t in examples)
    warm = {"steps": cfg.director_warmup, "lr": cfg.warmup_lr, "source": source, "losses": losses,
            "targets": dict(targets), "seconds": round(seconds, 1), "heldout": held}
    write_json(path, warm)
    return warm
