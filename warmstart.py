"""warmstart.py: the supervised steps before each stage's GRPO (our additions; the paper describes none).

GRPO can only reinforce what the policy already samples. Two things the small base model does not do
on its own, each taught first by supervised fine-tuning on what people wrote, then left to GRPO:
  1. the speakers' warm start (stage 1, on ESConv): one shared speaker model should sound different
     under each persona card. SmolLM2-135M hardly reads its card: every card gets the same mix of
     support strategies, which no reward can sort out (docs/RESULTS.md, section 11). ESConv (Liu et
     al. 2021) labels every human supporter turn with its strategy, and each card lists the strategies
     that are its job (personas.json "esconv_strategies"). Each labelled turn is scored under EVERY card
     and the model is trained to find it likelier under its own card than under the others
     (`card_contrastive_finetune`); `speaker_warm_start` is the step mascot.train_stage1 runs first.
  2. the director's warm start (stage 2): asked for a directive, the base model almost never writes
     the three lines `Agent / Action / Tone`, so every sample of a GRPO group falls back to the same
     agent, the rewards are equal and the advantages zero. A few supervised steps fix the format; with
     ESConv the targets are what real supporters did next, mapped onto the companions
     (`esconv_examples`), otherwise random agents teach the format alone (`format_examples`).
Both are plain maximum likelihood (`supervised_finetune`, `token_rows`), full fine-tuning with AdamW,
on the training split only; held-out checks are printed before and after.

    python mascot.py train --stage 1 --data path/to/esconv/train.jsonl       # runs 1, then stage 1
    python mascot.py train --stage 2 --director-warmup-data path/to/esconv/train.jsonl   # 2, then GRPO
"""

import random
import shutil
from collections import Counter
from pathlib import Path

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
from reward import shown
from scenarios import classifier_halves, require_mapping, split_contexts
from simulate import USER, Conversation, Directive, Turn, least_spoken_agent, speaker_messages

# --- 1. Supervised fine-tuning, shared by both warm starts and the SFT baseline ----------------------


def token_rows(tok, examples: list[tuple[list[dict], str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) per example: the chat rendered with and without the assistant turn,
    and the difference, so the target ends with the template's own end-of-turn marker."""
    rows = []
    for messages, target in examples:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(
            messages + [{"role": "assistant", "content": target}], tokenize=False
        )
        completion = (
            full[len(prompt) :].rstrip("\n")
            if full.startswith(prompt)
            else target + (tok.eos_token or "")
        )
        rows.append(
            (
                tok(prompt, add_special_tokens=False)["input_ids"],
                tok(completion, add_special_tokens=False)["input_ids"],
            )
        )
    return rows


def supervised_finetune(
    model,
    tok,
    examples,
    steps: int,
    batch_size: int = 4,
    lr: float = 2e-5,
    log=print,
    first_line_weight: float = 1.0,
    decay: bool = False,
) -> list[float]:
    """Maximum likelihood of each target given its prompt: `steps` AdamW steps of `batch_size` examples (cycling), one
    example per forward/backward (director prompts run to ~700 tokens), the step's weighted target-token count the one
    denominator, so the step is the full batch's. first_line_weight: the loss weight of the target's first line (the
    `Agent:` line decides who speaks; Action and Tone follow from it and would dominate an unweighted loss). decay:
    the rate falls linearly to lr / steps, so the last few batches do not decide whom it favours. Returns the per-step
    loss (mean negative log-probability per target token), which should fall."""
    rows, losses, weights = token_rows(tok, examples), [], []
    for _, target in rows:
        k = next(
            (i + 1 for i in range(len(target)) if "\n" in tok.decode(target[: i + 1])), len(target)
        )
        weights.append([first_line_weight] * k + [1.0] * (len(target) - k))
    opt = models.adamw(model, lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * (steps - step) / steps if decay else lr
        picked = [(step * batch_size + j) % len(rows) for j in range(batch_size)]
        total = sum(sum(weights[i]) for i in picked)
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
        log(f"warm start {step + 1}/{steps}: loss {loss_sum:.3f}")
    model.eval()
    del opt
    release_memory()
    return losses


@torch.no_grad()
def mean_nll(
    model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8
) -> float | None:
    """Mean negative log-likelihood per target token over the examples (no update); None for none."""
    rows, total, count = token_rows(tok, examples), 0.0, 0
    for start in range(0, len(rows), batch_size):
        logps, mask = grpo.target_logprobs(
            model, tok.pad_token_id, rows[start : start + batch_size]
        )  # (B, C)
        total -= (logps * mask).sum().item()
        count += int(mask.sum())
    return total / count if count else None


# --- 2. The speakers' warm start, card against card (train --stage 1 on ESConv) ---------------------


LEFT_OUT = {"Self-disclosure"}


def strategy_owners(personas) -> dict[str, str]:
    """{strategy: the persona whose card lists it}, without LEFT_OUT."""
    return {s: p.name for p in personas.personas for s in p.esconv_strategies if s not in LEFT_OUT}


def mapped_supporter_turns(contexts, mapping: dict[str, str]):
    """Yield (context, persona name, turns before, supporter's words) for every supporter turn of
    the contexts' recorded dialogues whose strategy `mapping` gives to a persona. The turns before
    are simulate.Turns: seeker turns spoken by USER, earlier supporter turns by their mapped persona
    (or "Companion" when their strategy maps to none). A dialogue's first turn answers nothing and
    is never yielded."""
    for ctx in contexts:
        turns: list[Turn] = []
        for t in ctx.turns:
            name = None if t["speaker"] == "user" else mapping.get(t.get("strategy", ""))
            if name and turns:
                yield ctx, name, list(turns), t["text"]
            turns.append(Turn(USER if t["speaker"] == "user" else name or "Companion", t["text"]))


# One shared model speaks for every persona, and SmolLM2-135M hardly reads its card: the independent evaluator finds
# the same mix of strategies under every card (docs/RESULTS.md § 11), which scores chance on persona function whatever
# the mix. Plain likelihood on human turns (`sft`) moves the shared mix. What must rise is p(reply | own card) AGAINST
# p(reply | the other cards) at the same point: each human turn is scored under every card, and the model read as a
# classifier of its own card (softmax over the cards' log-likelihoods, a uniform prior) is trained beside likelihood.
def card_examples(contexts, personas, seed: int) -> list[tuple[list[list[dict]], str, int]]:
    """(the speaker prompt under EVERY card, the supporter's words, the index of the card whose job the strategy is)
    per supporter turn of 4+ words. The history is cut to 4 turns (the card stays near the reply; a 135M model
    attends to what is close). Personas take turns (Guide's suggestions would otherwise dominate), each's shuffled."""
    names, by = personas.names(), {}
    for ctx, name, turns, text in mapped_supporter_turns(contexts, strategy_owners(personas)):
        if len(text.split()) >= 4:
            prompts = [speaker_messages(p, personas, ctx, turns[-4:]) for p in personas.personas]
            by.setdefault(name, []).append((prompts, text, names.index(name)))
    rng, order = random.Random(seed), [n for n in names if n in by]
    for v in by.values():
        rng.shuffle(v)
    return [
        by[n][i % len(by[n])] for i in range(max(map(len, by.values()), default=0)) for n in order
    ]


def card_contrastive_finetune(
    model,
    tok,
    examples,
    steps: int,
    batch_size: int = 4,
    lr: float = 4e-5,
    contrast: float = 1.0,
    log=print,
    folder: Path | None = None,
    every: int = 20,
) -> list[dict]:
    """`steps` AdamW steps of `batch_size` card_examples. Per example, with L (K,) the reply's log-likelihood under each
    card and k its own: loss = -L[k] / reply tokens + contrast * -log softmax(L)[k]. The first keeps the words human; the
    second rises only where the reply is likelier under its own card than under the others (contrast 0: plain SFT).
    Returns per step the likelihood term ("nll", nats per token) and the card term ("card_ce", log K = chance). With
    `folder`, a checkpoint every `every` steps: a call that finds one goes on from it, to the uninterrupted weights."""
    opt, history, start = models.adamw(model, lr, weight_decay=0.0), [], 0
    if folder and checkpoints(folder):  # weights, AdamW moments and RNG, then the steps' history
        start = load_checkpoint(folder, model, opt)[1]
        history = read_json(folder / "history.json")[:start]
    model.train()
    for step in range(start, steps):
        opt.zero_grad(set_to_none=True)
        nll = card_ce = 0.0
        for j in range(batch_size):  # one turn (K rows) per forward/backward
            prompts, text, own = examples[(step * batch_size + j) % len(examples)]
            rows = token_rows(tok, [(m, text) for m in prompts])  # the reply under each card
            logps, mask = grpo.target_logprobs(
                model, tok.pad_token_id, rows
            )  # (K, C): row k is card k
            n = -(logps[own] * mask[own]).sum() / mask[own].sum()  # () nats per token
            c = torch.nn.functional.cross_entropy(
                (logps * mask).sum(1)[None], torch.tensor([own], device=mask.device)
            )
            ((n + contrast * c) / batch_size).backward()
            nll, card_ce = nll + n.item() / batch_size, card_ce + c.item() / batch_size
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        release_memory()
        history.append({"nll": nll, "card_ce": card_ce})
        log(
            f"speakers' warm start {step + 1}/{steps}: nll {nll:.3f}, card cross-entropy {card_ce:.3f}"
        )
        if (
            folder and (step + 1) % every == 0 and step + 1 < steps
        ):  # the history first: it may run ahead, never behind
            write_json(folder / "history.json", history)
            save_checkpoint(folder, step + 1, model, tok, opt)
    model.eval()
    return history


@torch.no_grad()
def card_accuracy(model, tok, examples) -> dict:
    """How often a supporter turn is likeliest under its own card (chance 1/K), and its mean posterior there."""
    hits = posterior = 0.0
    for prompts, text, own in examples:
        logps, mask = grpo.target_logprobs(
            model, tok.pad_token_id, token_rows(tok, [(m, text) for m in prompts])
        )
        card = (logps * mask).sum(1)  # (K,) log p(reply | card k)
        hits, posterior = (
            hits + float(card.argmax() == own),
            posterior + float(torch.softmax(card, 0)[own]),
        )
    return {
        "accuracy": hits / len(examples),
        "posterior": posterior / len(examples),
        "n": len(examples),
    }


def speaker_warm_start(args, out: Path, inputs, check: int = 60) -> str:
    """train --stage 1 on ESConv: warm-start the speakers (--speaker-warmup steps of 4 turns from --model, lr 4e-5) on
    the judge's half of the training dialogues (the evaluator's half stays unseen), print the held-out card accuracy
    (on `check` turns) before and after, save to out/speakers_warm and return that folder, where the rest of stage 1
    starts. Once per run folder (config.json pins its settings): a finished one is reused, an interrupted one goes on
    from out/speakers_warm_checkpoints. Without strategy labels, or with --speaker-warmup 0, it returns --model."""
    folder = out / "speakers_warm"
    if not args.speaker_warmup or not any(t.get("strategy") for c in inputs.train for t in c.turns):
        return args.model  # not ESConv: no human turns to learn
    if (out / "speaker_warm_start.json").exists():
        return str(folder)
    require_mapping(inputs.personas, "--speaker-warmup")  # whose job each labelled turn is
    judge_half = classifier_halves(inputs.train, args.seed)[0]
    train = card_examples(judge_half, inputs.personas, args.seed)
    held = card_examples(inputs.held_out, inputs.personas, args.seed)[:check]
    if not train or not held:
        raise UserError(
            "--speaker-warmup: no strategy-labelled supporter turns in the training or held-out dialogues"
        )
    model, tok = load_model(args.model, device=args.device)
    before = card_accuracy(model, tok, held)
    print(
        f"speakers' warm start: {len({(t, k) for _, t, k in train})} supporter turns of {len(judge_half)} dialogues (the "
        f"judge's half), {args.speaker_warmup} steps of 4; held-out turns likeliest under their own card: "
        f"{before['accuracy']:.3f} (chance {1 / len(inputs.personas.personas):.3f}, {before['n']} turns)",
        flush=True,
    )
    history = card_contrastive_finetune(
        model, tok, train, args.speaker_warmup, folder=out / "speakers_warm_checkpoints"
    )
    after = card_accuracy(model, tok, held)
    print(
        f"after the warm start: {after['accuracy']:.3f} of held-out turns likeliest under their own card "
        f"(mean posterior {before['posterior']:.3f} -> {after['posterior']:.3f})",
        flush=True,
    )
    save_model(model, tok, folder)
    write_json(
        out / "speaker_warm_start.json", {"before": before, "after": after, "history": history}
    )
    shutil.rmtree(
        out / "speakers_warm_checkpoints", ignore_errors=True
    )  # two checkpoints: 3 GB at 135M
    del model
    release_memory()
    return str(folder)


# --- 3. The director's warm start (train --stage 2) -----------------------------------------------


def format_examples(personas, points, n: int, seed: int = 0):
    """Without ESConv: the exact three-line format with a uniformly random agent, action and tone,
    cycling over the decision points. It teaches how to answer, not whom to pick."""
    rng = random.Random(seed)
    return [
        (
            dr.director_messages(personas, points[i % len(points)]),
            f"Agent: {rng.choice(personas.names())}\n"
            f"Action: {rng.choice(personas.strategies)}\nTone: {rng.choice(personas.tones)}",
        )
        for i in range(n)
    ]


MAX_POSITION = 8  # the first 8 supporter turns cover ESConv's exploration -> comfort -> action arc


def esconv_prefix(context, end: int, personas) -> Conversation:
    """The first `end` recorded turns of an ESConv dialogue as one of our group conversations: each
    supporter turn is spoken by the persona its strategy maps to, an unmapped one by the least-spoken."""
    conv = Conversation(context, personas.name, "average", "esconv", 0)
    for turn in context.turns[:end]:
        if turn["speaker"] == "user":
            conv.turns.append(Turn(USER, turn["text"]))
        else:
            d = directive_for(turn.get("strategy", ""), personas) or Directive(
                least_spoken_agent(personas, conv)
            )
            conv.turns.append(Turn(d.agent, turn["text"], d))
    return conv


def esconv_turns(contexts, personas, balanced: bool = False) -> list[tuple]:
    """(dialogue, turn index, target directive) of every supporter turn with a mapped strategy among the first
    MAX_POSITION of each dialogue; balanced=True leaves out a turn whose target spoke last (a companion
    speaking twice running, which the balance term penalises)."""
    require_mapping(personas)
    turns = []
    for context in contexts:
        speakers = [t.speaker for t in esconv_prefix(context, len(context.turns), personas).turns]
        supporter = [j for j, t in enumerate(context.turns) if t["speaker"] == "supporter"][
            :MAX_POSITION
        ]
        for k, j in enumerate(supporter):
            target = directive_for(context.turns[j].get("strategy", ""), personas)
            if target and not (balanced and k and target.agent == speakers[supporter[k - 1]]):
                turns.append((context, j, target))
    if not turns:
        raise UserError(
            "--director-warmup-data: no usable supporter turn with an ESConv strategy label"
            + (
                "; with --warmup-balanced every one repeats the companion before it"
                if balanced
                else "; is this ESConv (ESConv.json or its JSON-lines split)?"
            )
        )
    return turns


def esconv_examples(
    contexts, personas, n: int, seed: int = 0, balanced: bool = False
) -> list[tuple[list[dict], str]]:
    """n (director prompt, target directive) pairs: what real supporters did next, mapped onto the companions.
    Natural (the default): drawn uniformly from esconv_turns, so each companion is a target as often as its
    strategies were used and the same one may speak twice running, as real supporters do (a quarter of the
    turns); the director learns ESConv's own odds at each point of a dialogue. balanced=True: the SAME number
    for every agent and no repeats, a flat prior that leaves the conversation as the only cue; it agrees less often
    with real supporters on held-out dialogues (docs/RESULTS.md, section 4)."""
    turns, rng = esconv_turns(contexts, personas, balanced), random.Random(seed)
    if balanced:
        pools = [[t for t in turns if t[2].agent == a] for a in personas.names()]
        pools, chosen = [p for p in pools if p], []
        for k, pool in enumerate(pools):
            share = n // len(pools) + (k < n % len(pools))
            chosen += (
                rng.sample(pool, share)
                if share <= len(pool)
                else [rng.choice(pool) for _ in range(share)]
            )
        rng.shuffle(chosen)
    else:
        chosen = rng.sample(turns, n) if n <= len(turns) else [rng.choice(turns) for _ in range(n)]
    return [
        (
            director_messages(personas, esconv_prefix(c, j, personas)),
            f"Agent: {d.agent}\nAction: {d.action}\nTone: {d.tone}",
        )
        for c, j, d in chosen
    ]


@torch.no_grad()
def next_agent_agreement(model, tok, personas, contexts, n: int = 300, seed: int = 0) -> dict:
    """How often a director names the companion that a real supporter's next turn maps to, on up to n annotated
    turns of `contexts` (dialogues it never trained on; natural targets): its pick is the name likeliest to follow
    "Agent:", read from one forward at each name's first token (names that share one are scored whole). Beside
    it: `majority`, what always naming the commonest target would get."""
    turns = esconv_turns(contexts, personas)
    turns, names = random.Random(seed).sample(turns, min(n, len(turns))), personas.names()
    name_ids = [tok(" " + a, add_special_tokens=False)["input_ids"] for a in names]
    firsts, dev = [ids[0] for ids in name_ids], next(model.parameters()).device
    distinct = len(set(firsts)) == len(names)
    model.eval()
    hits = []
    for c, j, target in turns:
        chat = tok.apply_chat_template(
            director_messages(personas, esconv_prefix(c, j, personas)),
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tok(chat + "Agent:", add_special_tokens=False)["input_ids"]
        if distinct:
            scores = model(torch.tensor([ids], device=dev), logits_to_keep=1).logits[
                0, -1, firsts
            ]  # (A,)
        else:
            logps, mask = grpo.target_logprobs(
                model, tok.pad_token_id, [(ids, t) for t in name_ids]
            )  # (A, C)
            scores = (logps * mask).sum(1)  # (A,)
        hits.append(float(names[int(scores.argmax())] == target.agent))
    common = Counter(t[2].agent for t in turns).most_common(1)[0][1]
    return {
        "agreement": sum(hits) / len(hits),
        "se": standard_error(hits),
        "n": len(hits),
        "majority": common / len(hits),
    }


def warm_start_examples(contexts, personas, n: int, held_out: float, seed: int, balanced: bool):
    """mascot.py's ESConv warm start: n examples from the training split of the ESConv dialogues, where they came
    from, and the held-out next-agent agreement of a director (model, tok) on the held-out split."""
    train, held = split_contexts(contexts, held_out, seed)
    source = f"ESConv strategy warm start: {len(train)} training dialogues{', balanced' if balanced else ''}"
    return (
        esconv_examples(train, personas, n, seed, balanced),
        source,
        lambda model, tok: next_agent_agreement(model, tok, personas, held, seed=seed),
    )


def warm_start(
    cfg, out: Path, policy, tok, personas, examples, source: str, agreement, held_out, resume: bool
) -> dict | None:
    """The warm start, once per run: its losses, its held-out group reward (held_out(label, director, when): the
    caller's check) and, with ESConv, the held-out next-agent agreement before and after (agreement(model, tok))
    to out/warm_start.json, its weights to out/director_warm (GRPO's KL anchor). A resumed run with GRPO
    checkpoints skips it (they were trained from the warm-started weights)."""
    if cfg.director_warmup == 0:
        return None
    if resume and checkpoints(out / "checkpoints") and (out / "warm_start.json").exists():
        return read_json(out / "warm_start.json")
    before = agreement and agreement(policy, tok)
    losses = supervised_finetune(
        policy,
        tok,
        examples,
        cfg.director_warmup,
        lr=cfg.warmup_lr,
        first_line_weight=cfg.warmup_agent_weight,
        decay=True,
    )
    after = agreement and agreement(policy, tok)
    if agreement:
        print(
            f"held-out next-agent agreement with ESConv's supporters: {before['agreement']:.3f} before the warm start, "
            f"{after['agreement']:.3f} ± {shown(after['se'])} after (se, {after['n']} turns; always the commonest: "
            f"{after['majority']:.3f})",
            flush=True,
        )
    held = held_out(
        "warm-start",
        dr.LLMDirector(policy, tok, personas),
        f"after the {source.split(' warm start')[0]} warm start",
    )
    save_model(policy, tok, out / "director_warm")
    warm = {
        "steps": cfg.director_warmup,
        "lr": cfg.warmup_lr,
        "source": source,
        "losses": losses,
        "heldout": held,
        "targets": dict(Counter(dr.parse_directive(t, personas, "?").agent for _, t in examples)),
        "agreement_before": before,
        "agreement": after,
    }
    write_json(out / "warm_start.json", warm)
    return warm
