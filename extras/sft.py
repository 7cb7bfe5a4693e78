"""sft.py: supervised fine-tuning: the SFT baseline of the evaluation (the base model fine-tuned on what human
supporters wrote), the speakers' warm start of stage 1 on ESConv (card against card) and the director's warm start
before stage 2's GRPO (the last two sections of this file).

The paper compares MASCOT with an SFT model. ESConv (Liu et al. 2021) labels every supporter turn
of real support conversations with a strategy, and each support persona's card lists the strategies
that are its job (personas.json "esconv_strategies": a Question is Catalyst's, a Suggestion Guide's).
Each such supporter turn becomes one example: MASCOT's own speaker prompt for that persona and the
dialogue so far (simulate.speaker_messages) -> the supporter's words. Training is plain maximum
likelihood (supervised_finetune below, the routine of the director's warm start too), full
fine-tuning with AdamW, on the training split only; the held-out split's loss, the mean negative
log-likelihood per target token, is printed before and after. The model goes to RUN/sft/model,
where `mascot.py evaluate` finds it for its `sft` system.

Self-disclosure ("I went through that too") is left out: the model learns the supporter's own
WORDS, and a companion should not learn to claim lived experiences. (The director's warm start
keeps it: there only WHO speaks is learnt, and the disclosure's purpose, validation, is Anchor's.)

    python mascot.py sft --data path/to/esconv/train.jsonl [--steps 40 --batch-size 4 --lr 3e-5]
"""

import random
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # the project's modules, from the repo root
import data                                                       # noqa: E402
import director as dr                                             # noqa: E402
import grpo                                                       # noqa: E402
import models                                                     # noqa: E402
from data import UserError, flag_type                             # noqa: E402
from extras.strategies import classifier_halves, require_mapping  # noqa: E402
from reward import shown                                          # noqa: E402
from simulate import USER, Turn, speaker_messages                 # noqa: E402

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


def supporter_examples(contexts, personas) -> list[tuple[list[dict], str]]:
    """(speaker prompt, supporter's words) per supporter turn whose strategy maps to a persona of the
    set: the prompt is exactly what the speaker sees in a conversation (the "persona" style)."""
    return [(speaker_messages(personas.find(name), personas, ctx, turns), text)
            for ctx, name, turns, text in mapped_supporter_turns(contexts, strategy_owners(personas))]


@torch.no_grad()
def mean_nll(model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8) -> float | None:
    """Mean negative log-likelihood per target token over the examples (no update); None for none."""
    rows, total, count = token_rows(tok, examples), 0.0, 0
    for start in range(0, len(rows), batch_size):
        logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows[start:start + batch_size])   # (B, C)
        total -= (logps * mask).sum().item()
        count += int(mask.sum())
    return total / count if count else None


def parse_args(argv: list[str], cli):
    p = cli.Parser(prog="mascot.py sft", formatter_class=cli.Formatter,
                                description="the SFT baseline: the base model fine-tuned on ESConv supporter turns")
    cli.common_flags(p, trained=False)
    p.add_argument("--steps", type=flag_type("--steps", int, "positive"), default=40, help="AdamW steps")
    p.add_argument("--batch-size", type=flag_type("--batch-size", int, "positive"), default=4, help="examples per step")
    p.add_argument("--lr", type=flag_type("--lr", float, "positive"), default=3e-5, help="learning rate")
    p.add_argument("--heldout-examples", type=flag_type("--heldout-examples", int, "positive"), default=32,
                   help="supporter turns of held-out dialogues whose loss is printed before and after")
    return p.parse_args(argv)


def main(argv: list[str], cli) -> int:
    """`mascot.py sft ...` (argv[0] is "sft"; cli is mascot.py, for the shared flags and loaders)."""
    train_sft(parse_args(argv[1:], cli), cli)
    return 0


def train_sft(args, cli) -> dict:
    """Fine-tune, report the held-out loss before and after, save RUN/sft/; returns the summary."""
    out = Path(args.run) / "sft"
    inputs = cli.load_inputs(args)
    cli.check_device(args)
    train = supporter_examples(inputs.train, inputs.personas)
    held = supporter_examples(inputs.held_out, inputs.personas)[:args.heldout_examples]
    if not train:
        raise UserError(f"--data {args.data}: no strategy-labelled supporter turns in the training split; the "
                        "SFT baseline learns from ESConv (ESConv.json or an ESConv .jsonl)")
    data.save_config(vars(args), out)
    random.Random(args.seed).shuffle(train)          # supervised_finetune cycles through them in order
    print(f"sft: {len(train)} supporter turns from {len(inputs.train)} training dialogues ({inputs.split}); "
          f"{len(held)} held-out turns")
    model, tok = models.load_model(args.model, device=args.device)
    before = mean_nll(model, tok, held)
    print(f"held-out loss before: {shown(before)} nats per token")
    losses = supervised_finetune(model, tok, train, args.steps, args.batch_size, args.lr,
                                    log=lambda line: print(line.replace("warm start", "sft step"), flush=True))
    after = mean_nll(model, tok, held)
    print(f"held-out loss after:  {shown(after)} nats per token")
    folder = data.save_model(model, tok, out / "model")
    summary = {"train_examples": len(train), "heldout_examples": len(held), "heldout_loss_before": before,
               "heldout_loss_after": after, "losses": losses, "model": args.model, "sft": str(folder)}
    data.write_json(out / "summary.json", summary)
    print(f"sft done: model saved to {folder}")
    return summary


# --- The speakers' warm start, card against card (our addition; train --stage 1 on ESConv) ----------------
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
    return [by[n][i % len(by[n])] for i in range(max(map(len, by.values()), default=0)) for n in order]


def card_contrastive_finetune(model, tok, examples, steps: int, batch_size: int = 4, lr: float = 4e-5,
                              contrast: float = 1.0, log=print, folder: Path | None = None, every: int = 20) -> list[dict]:
    """`steps` AdamW steps of `batch_size` card_examples. Per example, with L (K,) the reply's log-likelihood under each
    card and k its own: loss = -L[k] / reply tokens + contrast * -log softmax(L)[k]. The first keeps the words human; the
    second rises only where the reply is likelier under its own card than under the others (contrast 0: plain SFT).
    Returns per step the likelihood term ("nll", nats per token) and the card term ("card_ce", log K = chance). With
    `folder`, a checkpoint every `every` steps: a call that finds one goes on from it, to the uninterrupted weights."""
    opt, history, start = models.adamw(model, lr, weight_decay=0.0), [], 0
    if folder and grpo.checkpoints(folder):          # weights, AdamW moments and RNG, then the steps' history
        start = grpo.load_checkpoint(folder, model, opt)[1]
        history = data.read_json(folder / "history.json")[:start]
    model.train()
    for step in range(start, steps):
        opt.zero_grad(set_to_none=True)
        nll = card_ce = 0.0
        for j in range(batch_size):                   # one turn (K rows) per forward/backward
            prompts, text, own = examples[(step * batch_size + j) % len(examples)]
            rows = token_rows(tok, [(m, text) for m in prompts])                  # the reply under each card
            logps, mask = grpo.target_logprobs(model, tok.pad_token_id, rows)         # (K, C): row k is card k
            n = -(logps[own] * mask[own]).sum() / mask[own].sum()                             # () nats per token
            c = torch.nn.functional.cross_entropy((logps * mask).sum(1)[None], torch.tensor([own], device=mask.device))
            ((n + contrast * c) / batch_size).backward()
            nll, card_ce = nll + n.item() / batch_size, card_ce + c.item() / batch_size
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        models.release_memory()
        history.append({"nll": nll, "card_ce": card_ce})
        log(f"speakers' warm start {step + 1}/{steps}: nll {nll:.3f}, card cross-entropy {card_ce:.3f}")
        if folder and (step + 1) % every == 0 and step + 1 < steps:   # the history first: it may run ahead, never behind
            data.write_json(folder / "history.json", history)
            grpo.save_checkpoint(folder, step + 1, model, tok, opt)
    model.eval()
    return history


@torch.no_grad()
def card_accuracy(model, tok, examples) -> dict:
    """How often a supporter turn is likeliest under its own card (chance 1/K), and its mean posterior there."""
    hits = posterior = 0.0
    for prompts, text, own in examples:
        logps, mask = grpo.target_logprobs(model, tok.pad_token_id, token_rows(tok, [(m, text) for m in prompts]))
        card = (logps * mask).sum(1)                                                 # (K,) log p(reply | card k)
        hits, posterior = hits + float(card.argmax() == own), posterior + float(torch.softmax(card, 0)[own])
    return {"accuracy": hits / len(examples), "posterior": posterior / len(examples), "n": len(examples)}


def speaker_warm_start(args, out: Path, inputs, check: int = 60) -> str:
    """train --stage 1 on ESConv: warm-start the speakers (--speaker-warmup steps of 4 turns from --model, lr 4e-5) on
    the judge's half of the training dialogues (the evaluator's half stays unseen), print the held-out card accuracy
    (on `check` turns) before and after, save to out/speakers_warm and return that folder, where the rest of stage 1
    starts. Once per run folder (config.json pins its settings): a finished one is reused, an interrupted one goes on
    from out/speakers_warm_checkpoints. Without strategy labels, or with --speaker-warmup 0, it returns --model."""
    folder = out / "speakers_warm"
    if not args.speaker_warmup or not any(t.get("strategy") for c in inputs.train for t in c.turns):
        return args.model                                                   # not ESConv: no human turns to learn
    if (out / "speaker_warm_start.json").exists():
        return str(folder)
    require_mapping(inputs.personas, "--speaker-warmup")                   # whose job each labelled turn is
    judge_half = classifier_halves(inputs.train, args.seed)[0]
    train = card_examples(judge_half, inputs.personas, args.seed)
    held = card_examples(inputs.held_out, inputs.personas, args.seed)[:check]
    if not train or not held:
        raise UserError("--speaker-warmup: no strategy-labelled supporter turns in the training or held-out dialogues")
    model, tok = models.load_model(args.model, device=args.device)
    before = card_accuracy(model, tok, held)
    print(f"speakers' warm start: {len({(t, k) for _, t, k in train})} supporter turns of {len(judge_half)} dialogues (the "
          f"judge's half), {args.speaker_warmup} steps of 4; held-out turns likeliest under their own card: "
          f"{before['accuracy']:.3f} (chance {1 / len(inputs.personas.personas):.3f}, {before['n']} turns)", flush=True)
    history = card_contrastive_finetune(model, tok, train, args.speaker_warmup, folder=out / "speakers_warm_checkpoints")
    after = card_accuracy(model, tok, held)
    print(f"after the warm start: {after['accuracy']:.3f} of held-out turns likeliest under their own card "
          f"(mean posterior {before['posterior']:.3f} -> {after['posterior']:.3f})", flush=True)
    data.save_model(model, tok, folder)
    data.write_json(out / "speaker_warm_start.json", {"before": before, "after": after, "history": history})
    shutil.rmtree(out / "speakers_warm_checkpoints", ignore_errors=True)    # two checkpoints: 3 GB at 135M
    del model
    models.release_memory()
    return str(folder)


# --- The director's warm start (our addition; the paper describes none) ----------------------------
# GRPO can only reinforce what the policy already samples. SmolLM2-135M asked for a directive almost
# never writes the three lines (0 of 32 parseable when we measured), so every sample of a group falls
# back to the same agent, every reward of the group is equal and the advantages are all zero. A few
# supervised steps on well-formed directives fix the format first. With ESConv the targets are what
# real supporters did next (extras/strategies.py); without it random agents teach the format only.

def format_examples(personas, points, n: int, seed: int = 0):
    """Without ESConv: the exact three-line format with a uniformly random agent, action and tone,
    cycling over the decision points. It teaches how to answer, not whom to pick."""
    rng = random.Random(seed)
    return [(dr.director_messages(personas, points[i % len(points)]), f"Agent: {rng.choice(personas.names())}\n"
             f"Action: {rng.choice(personas.strategies)}\nTone: {rng.choice(personas.tones)}") for i in range(n)]


def token_rows(tok, examples: list[tuple[list[dict], str]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, target ids) per example: the chat rendered with and without the assistant turn,
    and the difference, so the target ends with the template's own end-of-turn marker."""
    rows = []
    for messages, target in examples:
        prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        full = tok.apply_chat_template(messages + [{"role": "assistant", "content": target}], tokenize=False)
        completion = full[len(prompt):].rstrip("\n") if full.startswith(prompt) else target + (tok.eos_token or "")
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"], tok(completion, add_special_tokens=False)["input_ids"]))
    return rows


def supervised_finetune(model, tok, examples, steps: int, batch_size: int = 4, lr: float = 2e-5, log=print,
                        first_line_weight: float = 1.0, decay: bool = False) -> list[float]:
    """Maximum likelihood of each target given its prompt: `steps` AdamW steps of `batch_size` examples (cycling), one
    example per forward/backward (director prompts run to ~700 tokens), the step's weighted target-token count the one
    denominator, so the step is the full batch's. first_line_weight: the loss weight of the target's first line (the
    `Agent:` line decides who speaks; Action and Tone follow from it and would dominate an unweighted loss). decay:
    the rate falls linearly to lr / steps, so the last few batches do not decide whom it favours. Returns the per-step
    loss (mean negative log-probability per target token), which should fall."""
    rows, losses, weights = token_rows(tok, examples), [], []
    for _, target in rows:
        k = next((i + 1 for i in range(len(target)) if "\n" in tok.decode(target[:i + 1])), len(target))
        weights.append([first_line_weight] * k + [1.0] * (len(target) - k))
    opt = models.adamw(model, lr, weight_decay=0.0)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * (steps - step) / steps if decay else lr
        picked = [(step * batch_size + j) % len(rows) for j in range(batch_size)]
        total = sum(sum(weights[i]) for i in picked)
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0                   # one example per forward/backward; the step's gradient is the batch's
        for i in picked:
            logps, _ = grpo.target_logprobs(model, tok.pad_token_id, [rows[i]])           # (1, C)
            loss = -(logps[0] * torch.tensor(weights[i])).sum() / total
            loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        models.release_memory()                   # the step's activations, before the next example's
        losses.append(loss_sum)
        log(f"warm start {step + 1}/{steps}: loss {loss_sum:.3f}")
    model.eval()
    del opt
    models.release_memory()
    return losses


def warm_start(cfg, out: Path, policy, tok, personas, examples, source: str, agreement, held_out,
               resume: bool) -> dict | None:
    """The warm start, once per run: its losses, its held-out group reward (held_out(label, director, when): the
    caller's check) and, with ESConv, the held-out next-agent agreement before and after (agreement(model, tok))
    to out/warm_start.json, its weights to out/director_warm (GRPO's KL anchor). A resumed run with GRPO
    checkpoints skips it (they were trained from the warm-started weights)."""
    if cfg.director_warmup == 0:
        return None
    if resume and grpo.checkpoints(out / "checkpoints") and (out / "warm_start.json").exists():
        return data.read_json(out / "warm_start.json")
    before = agreement and agreement(policy, tok)
    losses = supervised_finetune(policy, tok, examples, cfg.director_warmup, lr=cfg.warmup_lr,
                                 first_line_weight=cfg.warmup_agent_weight, decay=True)
    after = agreement and agreement(policy, tok)
    if agreement:
        print(f"held-out next-agent agreement with ESConv's supporters: {before['agreement']:.3f} before the warm start, "
              f"{after['agreement']:.3f} ± {shown(after['se'])} after (se, {after['n']} turns; always the commonest: "
              f"{after['majority']:.3f})", flush=True)
    held = held_out("warm-start", dr.LLMDirector(policy, tok, personas), f"after the {source.split(' warm start')[0]} warm start")
    data.save_model(policy, tok, out / "director_warm")
    warm = {"steps": cfg.director_warmup, "lr": cfg.warmup_lr, "source": source, "losses": losses, "heldout": held,
            "targets": dict(Counter(dr.parse_directive(t, personas, "?").agent for _, t in examples)),
            "agreement_before": before, "agreement": after}
    data.write_json(out / "warm_start.json", warm)
    return warm
