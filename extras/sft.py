"""sft.py: the SFT baseline of the evaluation: the base model fine-tuned on what human supporters wrote.

The paper compares MASCOT with an SFT model. ESConv (Liu et al. 2021) labels every supporter turn
of real support conversations with a strategy, and each support persona's card lists the strategies
that are its job (personas.json "esconv_strategies": a Question is Catalyst's, a Suggestion Guide's).
Each such supporter turn becomes one example: MASCOT's own speaker prompt for that persona and the
dialogue so far (simulate.speaker_messages) -> the supporter's words. Training is plain maximum
likelihood (director.supervised_finetune, the routine of the director's warm start), full
fine-tuning with AdamW, on the training split only; the held-out split's loss, the mean negative
log-likelihood per target token, is printed before and after. The model goes to RUN/sft/model,
where `mascot.py evaluate` finds it for its `sft` system.

Self-disclosure ("I went through that too") is left out: the model learns the supporter's own
WORDS, and a companion should not learn to claim lived experiences. (The director's warm start
keeps it: there only WHO speaks is learnt, and the disclosure's purpose, validation, is Anchor's.)

    python mascot.py sft --data path/to/esconv/train.jsonl [--steps 40 --batch-size 4 --lr 3e-5]
"""

import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # the project's modules, from the repo root
import data                                                       # noqa: E402
import director as dr                                             # noqa: E402
import grpo                                                       # noqa: E402
import models                                                     # noqa: E402
from data import UserError, flag_type                             # noqa: E402
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
            if t["speaker"] == "user":
                turns.append(Turn(USER, t["text"]))
                continue
            name = mapping.get(t.get("strategy", ""))
            if name and turns:
                yield ctx, name, list(turns), t["text"]
            turns.append(Turn(name or "Companion", t["text"]))


def supporter_examples(contexts, personas) -> list[tuple[list[dict], str]]:
    """(speaker prompt, supporter's words) per supporter turn whose strategy maps to a persona of the
    set: the prompt is exactly what the speaker sees in a conversation (the "persona" style)."""
    return [(speaker_messages(personas.find(name), personas, ctx, turns), text)
            for ctx, name, turns, text in mapped_supporter_turns(contexts, strategy_owners(personas))]


@torch.no_grad()
def mean_nll(model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8) -> float | None:
    """Mean negative log-likelihood per target token over the examples (no update); None for none."""
    rows, total, count = dr.token_rows(tok, examples), 0.0, 0
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
    losses = dr.supervised_finetune(model, tok, train, args.steps, args.batch_size, args.lr,
                                    log=lambda line: print(line.replace("warm start", "sft step"), flush=True))
    after = mean_nll(model, tok, held)
    print(f"held-out loss after:  {shown(after)} nats per token")
    folder = data.save_model(model, tok, out / "model")
    summary = {"train_examples": len(train), "heldout_examples": len(held), "heldout_loss_before": before,
               "heldout_loss_after": after, "losses": losses, "model": args.model, "sft": str(folder)}
    data.write_json(out / "summary.json", summary)
    print(f"sft done: model saved to {folder}")
    return summary
