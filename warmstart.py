"""warmstart.py: the supervised steps before each stage's GRPO (our additions; the paper
describes none).

GRPO can only reinforce what the policy already samples. Where the small base model does not do
something on its own, a few steps of supervised fine-tuning on what people wrote teach it first,
and GRPO takes over from there. The file reads top to bottom:
  1. supervised fine-tuning, shared by both warm starts and the SFT baseline: plain maximum
     likelihood of a target given its prompt (`token_rows`, `supervised_finetune`), full
     fine-tuning with AdamW, on the training split only;
  2. the speakers' warm start (stage 1, on ESConv): one shared speaker model should sound different
     under each persona card, but SmolLM2-135M hardly reads its card: every card gets the same mix
     of support strategies, which no reward can sort out. ESConv (Liu et al. 2021) labels every
     human supporter turn with its strategy, and each card lists the strategies that are its job
     (personas.json "esconv_strategies"). Each labelled turn is scored under EVERY card and the
     model is trained to find it likelier under its own card than under the others
     (`card_contrastive_finetune`); `speaker_warm_start` is the step mascot.train_stage1 runs first;
  3. the director's warm start (stage 2): asked for a directive, the base model almost never writes
     the three lines `Agent / Action / Tone`, so every sample of a GRPO group falls back to the same
     agent, the rewards are equal and the advantages zero. A few supervised steps fix the format;
     with ESConv the targets are what real supporters did next, mapped onto the companions
     (`esconv_examples`), otherwise random agents teach the format alone (`format_examples`);
     `warm_start` is the step mascot.train_stage2 runs before GRPO.
Held-out checks are printed before and after each warm start. Simplified: full fine-tuning, not
the LoRA the paper appears to use (arXiv 2601.14230), and a fixed number of steps, no early stop.

    python mascot.py train --stage 1 --data path/to/esconv/train.jsonl   # 2, then stage 1
    python mascot.py train --stage 2 --director-warmup-data path/to/esconv/train.jsonl  # 3, GRPO
"""

import random
import shutil
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import NamedTuple

import torch

import director as dr
import grpo
import models
from director import directive_for, director_messages
from metrics import standard_error
from plumbing.common import UserError
from plumbing.devices import release_memory
from plumbing.files import read_json, save_model, write_json
from plumbing.loading import load_model
from plumbing.runs import checkpoints, load_checkpoint, save_checkpoint
from plumbing.templates import render_chat
from reward import shown
from scenarios import classifier_halves, require_mapping, split_contexts
from simulate import USER, Conversation, Directive, Turn, least_spoken_agent, speaker_messages


# --- 1. Supervised fine-tuning, shared by both warm starts and the SFT baseline ------------------
@dataclass
class SFTSettings:
    """The hyperparameters of `supervised_finetune`."""

    steps: int  # AdamW steps
    batch_size: int = 4  # examples per step, cycling through them in order
    lr: float = 2e-5  # the director's warm start's default (--warmup-lr)
    # The loss weight of the target's first line: the `Agent:` line decides who speaks; Action and
    # Tone follow from it and would dominate an unweighted loss.
    first_line_weight: float = 1.0
    # The rate falls linearly to lr / steps, so the last few batches do not decide whom it favours.
    decay: bool = False


def token_rows(tok, examples: list[tuple[list[dict], str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) per example: the chat rendered (models.render_chat) with and without
    the assistant turn, and the difference, cut after its first stop token, so the target ends with
    the template's own end-of-turn marker, where the sampler stops (not with what some templates
    write after it: Phi-3 adds the end-of-text token)."""
    stops = set(models.stop_token_ids(tok))
    rows = []
    for messages, target in examples:
        prompt = render_chat(tok, messages, add_generation_prompt=True)
        answered = messages + [{"role": "assistant", "content": target}]
        full = render_chat(tok, answered, add_generation_prompt=False)
        if full.startswith(prompt):
            completion = full[len(prompt) :].rstrip("\n")
        else:  # a template that renders the history differently once it is answered
            completion = target + (tok.eos_token or "")
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        completion_ids = tok(completion, add_special_tokens=False)["input_ids"]
        ends = [i for i, t in enumerate(completion_ids) if t in stops]
        if ends:
            completion_ids = completion_ids[: ends[0] + 1]
        rows.append((prompt_ids, completion_ids))
    return rows


def first_line_weights(tok, target: list[int], weight: float) -> list[float]:
    """A loss weight per target token: `weight` up to and including the token that ends the first
    line, 1 after it (a target of one line gets `weight` throughout)."""
    k = next(
        (i + 1 for i in range(len(target)) if "\n" in tok.decode(target[: i + 1])), len(target)
    )
    return [weight] * k + [1.0] * (len(target) - k)


def supervised_finetune(model, tok, examples, settings: SFTSettings, log=print) -> list[float]:
    """Maximum likelihood of each target given its prompt: `settings.steps` AdamW steps of
    `settings.batch_size` examples (cycling), one example per forward/backward (director prompts
    run to ~700 tokens), the step's weighted target-token count the one denominator, so the step
    is the full batch's, as if the batch ran in one forward. Returns the per-step loss (mean
    negative log-probability per target token), which should fall."""
    rows = token_rows(tok, examples)
    weights = [first_line_weights(tok, target, settings.first_line_weight) for _, target in rows]
    opt = models.adamw(model, settings.lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(settings.steps):
        for group in opt.param_groups:
            group["lr"] = sft_rate(settings, step)
        picked = [(step * settings.batch_size + j) % len(rows) for j in range(settings.batch_size)]
        total = sum(sum(weights[i]) for i in picked)  # the step's one denominator
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0  # one example per forward/backward; the step's gradient is the batch's
        for i in picked:
            logps, _ = grpo.target_logprobs(model, tok.pad_token_id, [rows[i]])  # (1, C)
            loss = -(logps[0] * torch.tensor(weights[i])).sum() / total
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        release_memory()  # the step's activations, before the next example's
        losses.append(loss_sum)
        log(f"warm start {step + 1}/{settings.steps}: loss {loss_sum:.3f}")
    model.eval()
    del opt
    release_memory()
    return losses


def sft_rate(settings: SFTSettings, step: int) -> float:
    """The learning rate of a step: constant, or with `decay` falling linearly to lr / steps."""
    if settings.decay:
        return settings.lr * (settings.steps - step) / settings.steps
    return settings.lr


@torch.no_grad()
def mean_nll(
    model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8
) -> float | None:
    """Mean negative log-likelihood per target token over the examples (no update); None for
    none."""
    rows = token_rows(tok, examples)
    total = 0.0
    count = 0
    for start in range(0, len(rows), batch_size):
        logps, mask = grpo.target_logprobs(
            model, tok.pad_token_id, rows[start : start + batch_size]
        )  # (B, C)
        total -= (logps * mask).sum().item()
        count += int(mask.sum())
    return total / count if count else None


# --- 2. The speakers' warm start, card against card (train --stage 1 on ESConv) ------------------
# Why card against card: the same mix of strategies under every card scores chance on persona
# function whatever the mix, and plain likelihood on human turns (the SFT baseline, extras/sft.py)
# only moves the shared mix. What must rise is p(reply | own card) AGAINST p(reply | the other
# cards) at the same point: each human turn is scored under every card, and the model read as a
# classifier of its own card (softmax over the cards' log-likelihoods, a uniform prior) is
# trained beside likelihood.

# Self-disclosure ("I went through that too") is left out of the speakers' targets: they learn the
# supporter's own WORDS, and a companion should not learn to claim lived experiences. (The
# director's warm start keeps it: there only WHO speaks is learnt, and the disclosure's purpose,
# validation, is Anchor's.)
LEFT_OUT = {"Self-disclosure"}


@dataclass
class CardSettings:
    """The hyperparameters of `card_contrastive_finetune`."""

    steps: int  # AdamW steps
    batch_size: int = 4  # supporter turns per step (each K rows, one per card)
    lr: float = 4e-5  # the rate the warm start was measured at (docs/RESULTS.md)
    contrast: float = 1.0  # the weight of the card term; 0: plain SFT


def strategy_owners(personas) -> dict[str, str]:
    """{strategy: the persona whose card lists it}, without LEFT_OUT."""
    owners = {}
    for p in personas.personas:
        for s in p.esconv_strategies:
            if s not in LEFT_OUT:
                owners[s] = p.name
    return owners


def mapped_supporter_turns(contexts, mapping: dict[str, str]):
    """Yield (context, persona name, turns before, supporter's words) for every supporter turn of
    the contexts' recorded dialogues whose strategy `mapping` gives to a persona. The turns before
    are simulate.Turns: seeker turns spoken by USER, earlier supporter turns by their mapped persona
    (or "Companion" when their strategy maps to none). A dialogue's first turn answers nothing and
    is never yielded."""
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


def card_examples(contexts, personas, seed: int) -> list[tuple[list[list[dict]], str, int]]:
    """(the speaker prompt under EVERY card, the supporter's words, the index of the card whose job
    the strategy is) per supporter turn of 4+ words. The history is cut to 4 turns (the card stays
    near the reply; a 135M model attends to what is close). Personas take turns (Guide's
    suggestions would otherwise dominate), each's shuffled."""
    names = personas.names()
    by = {}  # persona name -> its examples
    for ctx, name, turns, text in mapped_supporter_turns(contexts, strategy_owners(personas)):
        if len(text.split()) >= 4:
            prompts = [speaker_messages(p, personas, ctx, turns[-4:]) for p in personas.personas]
            by.setdefault(name, []).append((prompts, text, names.index(name)))
    rng = random.Random(seed)
    order = [n for n in names if n in by]
    for v in by.values():
        rng.shuffle(v)
    # Round robin over the personas, the shorter lists cycling, until the longest is used up.
    examples = []
    for i in range(max(map(len, by.values()), default=0)):
        for n in order:
            examples.append(by[n][i % len(by[n])])
    return examples


def card_terms(logps: torch.Tensor, mask: torch.Tensor, own: int):
    """The two terms of one supporter turn's loss. logps and mask (K, C): the reply's target
    log-probabilities under each card, row k card k; L (K,): its log-likelihood under each card.
      nll      -L[own] / reply tokens: keeps the words human;
      card_ce  -log softmax(L)[own] (log K: chance): lowering it raises p(reply | own card) only
               AGAINST the other cards."""
    nll = -(logps[own] * mask[own]).sum() / mask[own].sum()  # () nats per token
    card = (logps * mask).sum(1)  # (K,) log p(reply | card k)
    target = torch.tensor([own], device=mask.device)
    card_ce = torch.nn.functional.cross_entropy(card[None], target)  # ()
    return nll, card_ce


def card_contrastive_finetune(
    model, tok, examples, settings: CardSettings, log=print, folder: Path | None = None, every=20
) -> list[dict]:
    """`settings.steps` AdamW steps of `settings.batch_size` card_examples, each loss
    nll + contrast * card_ce (`card_terms`; contrast 0: plain SFT). Returns per step the two
    terms ("nll", nats per token; "card_ce", log K = chance). With `folder`, a checkpoint every
    `every` steps: a call that finds one goes on from it, to the uninterrupted weights."""
    opt = models.adamw(model, settings.lr, weight_decay=0.0)
    history = []
    start = 0
    if folder and checkpoints(folder):  # weights, AdamW moments and RNG, then the steps' history
        start = load_checkpoint(folder, model, opt)[1]
        history = read_json(folder / "history.json")[:start]
    model.train()
    for step in range(start, settings.steps):
        opt.zero_grad(set_to_none=True)
        nll = 0.0
        card_ce = 0.0
        for j in range(settings.batch_size):  # one turn (K rows) per forward/backward
            prompts, text, own = examples[(step * settings.batch_size + j) % len(examples)]
            rows = token_rows(tok, [(m, text) for m in prompts])  # the reply under each card
            logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows)  # (K, C)
            n, c = card_terms(logps, mask, own)
            ((n + settings.contrast * c) / settings.batch_size).backward()
            nll += n.item() / settings.batch_size
            card_ce += c.item() / settings.batch_size
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        release_memory()
        history.append({"nll": nll, "card_ce": card_ce})
        log(
            f"speakers' warm start {step + 1}/{settings.steps}: nll {nll:.3f}, "
            f"card cross-entropy {card_ce:.3f}"
        )
        # No checkpoint after the last step: the caller saves the model itself.
        if folder and (step + 1) % every == 0 and step + 1 < settings.steps:
            write_json(folder / "history.json", history)  # first: it may run ahead, never behind
            save_checkpoint(folder, step + 1, model, tok, opt)
    model.eval()
    return history


@torch.no_grad()
def card_accuracy(model, tok, examples) -> dict:
    """How often a supporter turn is likeliest under its own card (chance 1/K), and its mean
    posterior there."""
    hits = 0.0
    posterior = 0.0
    for prompts, text, own in examples:
        rows = token_rows(tok, [(m, text) for m in prompts])
        logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows)  # (K, C)
        card = (logps * mask).sum(1)  # (K,) log p(reply | card k)
        hits += float(card.argmax() == own)
        posterior += float(torch.softmax(card, 0)[own])
    return {
        "accuracy": hits / len(examples),
        "posterior": posterior / len(examples),
        "n": len(examples),
    }


def has_strategy_labels(contexts) -> bool:
    """Does any turn carry an ESConv strategy label (is this ESConv)?"""
    for c in contexts:
        if any(t.get("strategy") for t in c.turns):
            return True
    return False


def speaker_warm_start(args, out: Path, inputs, check: int = 60) -> str:
    """train --stage 1 on ESConv: warm-start the speakers (--speaker-warmup steps of 4 turns from
    --model, lr 4e-5) on the judge's half of the training dialogues (the evaluator's half stays
    unseen), print the held-out card accuracy (on `check` turns) before and after, save to
    out/speakers_warm and return that folder, where the rest of stage 1 starts. Once per run folder
    (config.json pins its settings): a finished one is reused, an interrupted one goes on from
    out/speakers_warm_checkpoints. Without strategy labels, or with --speaker-warmup 0, it returns
    --model."""
    folder = out / "speakers_warm"
    if not args.speaker_warmup or not has_strategy_labels(inputs.train):
        return args.model  # not ESConv: no human turns to learn
    if (out / "speaker_warm_start.json").exists():
        return str(folder)
    require_mapping(inputs.personas, "--speaker-warmup")  # whose job each labelled turn is
    judge_half = classifier_halves(inputs.train, args.seed)[0]
    train = card_examples(judge_half, inputs.personas, args.seed)
    held = card_examples(inputs.held_out, inputs.personas, args.seed)[:check]
    if not train or not held:
        raise UserError(
            "--speaker-warmup: no strategy-labelled supporter turns in the training or "
            "held-out dialogues"
        )
    # With --offload-optimizer the model trains in bf16 (plumbing/offload.py): load it so, and the
    # held-out check before and after compares one precision.
    offload = getattr(args, "offload_optimizer", False)
    model, tok = load_model(args.model, device=args.device, dtype=models.policy_dtype(offload))
    grpo.check_logprobs(model, tok)  # an architecture we cannot score is refused before any work
    before = card_accuracy(model, tok, held)
    distinct = len({(t, k) for _, t, k in train})  # card_examples cycles the shorter lists
    chance = 1 / len(inputs.personas.personas)
    print(
        f"speakers' warm start: {distinct} supporter turns of {len(judge_half)} dialogues (the "
        f"judge's half), {args.speaker_warmup} steps of 4; held-out turns likeliest under their "
        f"own card: {before['accuracy']:.3f} (chance {chance:.3f}, {before['n']} turns)",
        flush=True,
    )
    checkpoint_folder = out / "speakers_warm_checkpoints"
    settings = CardSettings(args.speaker_warmup)
    history = card_contrastive_finetune(model, tok, train, settings, folder=checkpoint_folder)
    after = card_accuracy(model, tok, held)
    print(
        f"after the warm start: {after['accuracy']:.3f} of held-out turns likeliest under their "
        f"own card (mean posterior {before['posterior']:.3f} -> {after['posterior']:.3f})",
        flush=True,
    )
    save_model(model, tok, folder)
    record = {"before": before, "after": after, "history": history}
    write_json(out / "speaker_warm_start.json", record)
    shutil.rmtree(checkpoint_folder, ignore_errors=True)  # two checkpoints: 3 GB at 135M
    del model
    release_memory()
    return str(folder)


# --- 3. The director's warm start (train --stage 2) ---------------------------------------------
def format_examples(personas, points, n: int, seed: int = 0):
    """Without ESConv: the exact three-line format with a uniformly random agent, action and tone,
    cycling over the decision points. It teaches how to answer, not whom to pick."""
    rng = random.Random(seed)
    examples = []
    for i in range(n):
        messages = dr.director_messages(personas, points[i % len(points)])
        target = (
            f"Agent: {rng.choice(personas.names())}\n"
            f"Action: {rng.choice(personas.strategies)}\nTone: {rng.choice(personas.tones)}"
        )
        examples.append((messages, target))
    return examples


MAX_POSITION = 8  # the first 8 supporter turns cover ESConv's exploration -> comfort -> action arc


def esconv_prefix(context, end: int, personas) -> Conversation:
    """The first `end` recorded turns of an ESConv dialogue as one of our group conversations: each
    supporter turn is spoken by the persona its strategy maps to, an unmapped one by the
    least-spoken."""
    conv = Conversation(context, personas.name, "average", "esconv", 0)
    for turn in context.turns[:end]:
        if turn["speaker"] == "user":
            conv.turns.append(Turn(USER, turn["text"]))
            continue
        d = directive_for(turn.get("strategy", ""), personas)
        if d is None:
            d = Directive(least_spoken_agent(personas, conv))
        conv.turns.append(Turn(d.agent, turn["text"], d))
    return conv


def esconv_turns(contexts, personas, balanced: bool = False) -> list[tuple]:
    """(dialogue, turn index, target directive) of every supporter turn with a mapped strategy among
    the first MAX_POSITION of each dialogue; balanced=True leaves out a turn whose target spoke last
    (a companion speaking twice running, which the balance term penalises)."""
    require_mapping(personas)
    turns = []
    for context in contexts:
        speakers = [t.speaker for t in esconv_prefix(context, len(context.turns), personas).turns]
        supporter = [j for j, t in enumerate(context.turns) if t["speaker"] == "supporter"]
        supporter = supporter[:MAX_POSITION]
        for k, j in enumerate(supporter):
            target = directive_for(context.turns[j].get("strategy", ""), personas)
            repeats = bool(k) and target is not None and target.agent == speakers[supporter[k - 1]]
            if target and not (balanced and repeats):
                turns.append((context, j, target))
    if not turns:
        hint = "; is this ESConv (ESConv.json or its JSON-lines split)?"
        if balanced:
            hint = "; with --warmup-balanced every one repeats the companion before it"
        raise UserError(
            "--director-warmup-data: no usable supporter turn with an ESConv strategy label" + hint
        )
    return turns


def draw(rng: random.Random, pool: list, k: int) -> list:
    """k items of the pool: without replacement while it lasts, with replacement beyond."""
    if k <= len(pool):
        return rng.sample(pool, k)
    return [rng.choice(pool) for _ in range(k)]


def esconv_examples(
    contexts, personas, n: int, seed: int = 0, balanced: bool = False
) -> list[tuple[list[dict], str]]:
    """n (director prompt, target directive) pairs: what real supporters did next, mapped onto the
    companions. Natural (the default): drawn uniformly from esconv_turns, so each companion is a
    target as often as its strategies were used and the same one may speak twice running, as real
    supporters do (a quarter of the turns); the director learns ESConv's own odds at each point of
    a dialogue. balanced=True: the SAME number for every agent and no repeats, a flat prior that
    leaves the conversation as the only cue; it agrees less often with real supporters on
    held-out dialogues (docs/RESULTS.md)."""
    turns = esconv_turns(contexts, personas, balanced)
    rng = random.Random(seed)
    if balanced:
        chosen = balanced_draw(rng, turns, personas.names(), n)
    else:
        chosen = draw(rng, turns, n)
    return [
        (
            director_messages(personas, esconv_prefix(c, j, personas)),
            f"Agent: {d.agent}\nAction: {d.action}\nTone: {d.tone}",
        )
        for c, j, d in chosen
    ]


def balanced_draw(rng: random.Random, turns: list[tuple], names: list[str], n: int) -> list:
    """n turns, as many targeting each agent that has any (the first n mod #agents get one more),
    shuffled together."""
    pools = [[t for t in turns if t[2].agent == a] for a in names]
    pools = [p for p in pools if p]
    chosen = []
    for k, pool in enumerate(pools):
        share = n // len(pools) + (k < n % len(pools))
        chosen += draw(rng, pool, share)
    rng.shuffle(chosen)
    return chosen


@torch.no_grad()
def next_agent_agreement(model, tok, personas, contexts, n: int = 300, seed: int = 0) -> dict:
    """How often a director names the companion that a real supporter's next turn maps to, on up to
    n annotated turns of `contexts` (dialogues it never trained on; natural targets): its pick is
    the name likeliest to follow "Agent:" (`name_scores`). Beside it: `majority`, what always
    naming the commonest target would get."""
    turns = esconv_turns(contexts, personas)
    turns = random.Random(seed).sample(turns, min(n, len(turns)))
    names = personas.names()
    name_ids = [tok(" " + a, add_special_tokens=False)["input_ids"] for a in names]
    model.eval()
    hits = []
    for c, j, target in turns:
        messages = director_messages(personas, esconv_prefix(c, j, personas))
        chat = render_chat(tok, messages, add_generation_prompt=True)
        ids = tok(chat + "Agent:", add_special_tokens=False)["input_ids"]
        scores = name_scores(model, tok, ids, name_ids)  # (A,)
        hits.append(float(names[int(scores.argmax())] == target.agent))
    common = Counter(t[2].agent for t in turns).most_common(1)[0][1]
    return {
        "agreement": sum(hits) / len(hits),
        "se": standard_error(hits),
        "n": len(hits),
        "majority": common / len(hits),
    }


def name_scores(model, tok, ids: list[int], name_ids: list[list[int]]) -> torch.Tensor:
    """(A,) how likely each companion's name is to follow the prompt `ids`: one forward read at
    each name's first token; names that share a first token are scored whole (summed
    log-probabilities)."""
    firsts = [n[0] for n in name_ids]
    if len(set(firsts)) == len(name_ids):
        dev = next(model.parameters()).device
        logits = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits
        return logits[0, -1, firsts]  # (A,)
    rows = [(ids, n) for n in name_ids]
    logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows)  # (A, C)
    return (logps * mask).sum(1)  # (A,)


class WarmStartTargets(NamedTuple):
    """What the director's warm start learns from, and how it is checked."""

    examples: list  # (director prompt, target directive) pairs
    source: str  # where they came from, for the logs and warm_start.json
    agreement: object  # agreement(model, tok) -> held-out next-agent agreement; None: no check


def warm_start_examples(contexts, personas, n: int, held_out: float, seed: int, balanced: bool):
    """mascot.py's ESConv warm start: n examples from the training split of the ESConv dialogues,
    where they came from, and the held-out next-agent agreement of a director (model, tok) on the
    held-out split."""
    train, held = split_contexts(contexts, held_out, seed)
    source = f"ESConv strategy warm start: {len(train)} training dialogues"
    if balanced:
        source += ", balanced"
    examples = esconv_examples(train, personas, n, seed, balanced)
    agreement = partial(next_agent_agreement, personas=personas, contexts=held, seed=seed)
    return WarmStartTargets(examples, source, agreement)


def warm_start(
    cfg, out: Path, policy, tok, personas, targets, held_out, resume: bool
) -> dict | None:
    """The director's warm start, once per run: its losses, its held-out group reward
    (held_out(label, director, when): the caller's check) and, with ESConv, the held-out
    next-agent agreement before and after to out/warm_start.json, its weights to
    out/director_warm (GRPO's KL anchor). targets: (examples, source, agreement), as
    warm_start_examples returns them (agreement None: no agreement check). A resumed run with
    GRPO checkpoints skips it (they were trained from the warm-started weights)."""
    if cfg.director_warmup == 0:
        return None
    if resume and checkpoints(out / "checkpoints") and (out / "warm_start.json").exists():
        return read_json(out / "warm_start.json")
    examples, source, agreement = targets
    grpo.check_logprobs(policy, tok)  # an architecture we cannot score is refused before any work
    before = None
    after = None
    if agreement:
        before = agreement(policy, tok)
    settings = SFTSettings(
        cfg.director_warmup,
        lr=cfg.warmup_lr,
        first_line_weight=cfg.warmup_agent_weight,
        decay=True,
    )
    losses = supervised_finetune(policy, tok, examples, settings)
    if agreement:
        after = agreement(policy, tok)
        print_agreement(before, after)
    director = dr.LLMDirector(policy, tok, personas)
    held = held_out(
        "warm-start", director, f"after the {source.split(' warm start')[0]} warm start"
    )
    save_model(policy, tok, out / "director_warm")
    targets_by_agent = Counter(dr.parse_directive(t, personas, "?").agent for _, t in examples)
    warm = {
        "steps": cfg.director_warmup,
        "lr": cfg.warmup_lr,
        "source": source,
        "losses": losses,
        "heldout": held,
        "targets": dict(targets_by_agent),
        "agreement_before": before,
        "agreement": after,
    }
    write_json(out / "warm_start.json", warm)
    return warm


def print_agreement(before: dict, after: dict) -> None:
    print(
        f"held-out next-agent agreement with ESConv's supporters: {before['agreement']:.3f} "
        f"before the warm start, {after['agreement']:.3f} ± {shown(after['se'])} after "
        f"(se, {after['n']} turns; always the commonest: {after['majority']:.3f})",
        flush=True,
    )
