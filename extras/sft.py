"""extras/sft.py: the SFT baseline of the evaluation: the base model fine-tuned on what human supporters wrote.

A baseline beside the method. The paper compares MASCOT with an SFT model. ESConv (Liu et al. 2021)
labels every supporter turn of real support conversations with a strategy, and each support persona's
card lists the strategies that are its job (personas.json "esconv_strategies": a Question is
Catalyst's, a Suggestion Guide's). Each such supporter turn becomes one example: MASCOT's own speaker
prompt for that persona and the dialogue so far (simulate.speaker_messages) -> the supporter's words.
Training is plain maximum likelihood with the routine the warm starts use (warmstart.supervised_finetune),
full fine-tuning with AdamW, on the training split only; the held-out split's loss, the mean negative
log-likelihood per target token, is printed before and after. The model goes to RUN/sft/model, where
`mascot.py evaluate` finds it for its `sft` system.

Simplified: a fixed budget of --steps AdamW steps through the shuffled examples, no search over
the settings. Self-disclosure ("I went through that too") is left out: the model learns the
supporter's own WORDS, and a companion should not learn to claim lived experiences.

    python mascot.py sft --data path/to/esconv/train.jsonl [--steps 40 --batch-size 4 --lr 3e-5]
"""

import random
from pathlib import Path

from plumbing import files, loading, runs
from plumbing.cli import flag_type
from plumbing.common import UserError
from reward import shown
from scenarios import contexts_path
from simulate import speaker_messages
from warmstart import (
    SFTSettings,
    mapped_supporter_turns,
    mean_nll,
    strategy_owners,
    supervised_finetune,
)


def supporter_examples(contexts, personas) -> list[tuple[list[dict], str]]:
    """(speaker prompt, supporter's words) per supporter turn whose strategy maps to a persona of the
    set: the prompt is exactly what the speaker sees in a conversation (the "persona" style)."""
    return [
        (speaker_messages(personas.find(name), personas, ctx, turns), text)
        for ctx, name, turns, text in mapped_supporter_turns(contexts, strategy_owners(personas))
    ]


def parse_args(argv: list[str], cli):
    """`mascot.py sft`'s flags: the shared ones (no trained roles), then the training budget."""
    p = cli.Parser(
        prog="mascot.py sft",
        formatter_class=cli.Formatter,
        description="the SFT baseline: the base model fine-tuned on ESConv supporter turns",
    )
    cli.common_flags(p, trained=False)
    p.add_argument(
        "--steps", type=flag_type("--steps", int, "positive"), default=40, help="AdamW steps"
    )
    p.add_argument(
        "--batch-size",
        type=flag_type("--batch-size", int, "positive"),
        default=4,
        help="examples per step",
    )
    p.add_argument(
        "--lr", type=flag_type("--lr", float, "positive"), default=3e-5, help="learning rate"
    )
    p.add_argument(
        "--heldout-examples",
        type=flag_type("--heldout-examples", int, "positive"),
        default=32,
        help="supporter turns of held-out dialogues whose loss is printed before and after",
    )
    return p.parse_args(argv)


def main(argv: list[str], cli) -> int:
    """`mascot.py sft ...` (argv[0] is "sft"; cli is mascot.py, for the shared flags and loaders).
    One command at a time in a run folder, as train's: two sft runs at once would each write the
    model and config.json, and the folder would record one's settings beside the other's model."""
    args = parse_args(argv[1:], cli)
    with runs.run_lock(args.run):
        train_sft(args, cli)
    return 0


def check_settings(args, out: Path) -> dict:
    """The settings to record in out/config.json, checked as runs.start_stage checks a stage's: once
    the folder holds what an earlier sft made, a setting that differs (the data, personas and
    profiles by content) is a UserError naming it; only runs.OPERATIONAL ones may change."""
    config = {
        **vars(args),
        "fingerprint": files.fingerprint(
            contexts_path(args.data), args.personas, args.profiles_file
        ),
    }
    made = {}
    if any(f.name != "config.json" for f in out.glob("*")):
        made = files.read_json(out / "config.json") if (out / "config.json").is_file() else {}
    for key, value in config.items():
        if key in made and key not in runs.OPERATIONAL and made[key] != value:
            what = f"--{key.replace('_', '-')} {value}: {key} {made[key]} is what"
            if key == "fingerprint":
                what = "--data, --personas or --profiles-file: their files differ from those that"
            raise UserError(f"{what} made {out}; use its settings or a new --run")
    return config


def train_sft(args, cli) -> dict:
    """Fine-tune, report the held-out loss before and after, save RUN/sft/; returns the summary."""
    out = Path(args.run) / "sft"
    inputs = cli.load_inputs(args)
    cli.check_device(args)
    train = supporter_examples(inputs.train, inputs.personas)
    held = supporter_examples(inputs.held_out, inputs.personas)[: args.heldout_examples]
    if not train:
        raise UserError(
            f"--data {args.data}: no strategy-labelled supporter turns in the training split; the "
            "SFT baseline learns from ESConv (ESConv.json or an ESConv .jsonl)"
        )
    runs.save_config(check_settings(args, out), out)
    random.Random(args.seed).shuffle(train)  # supervised_finetune cycles through them in order
    print(
        f"sft: {len(train)} supporter turns from {len(inputs.train)} training dialogues ({inputs.split}); "
        f"{len(held)} held-out turns"
    )
    model, tok = loading.load_model(args.model, device=args.device)
    before = mean_nll(model, tok, held)
    print(f"held-out loss before: {shown(before)} nats per token")
    losses = supervised_finetune(
        model,
        tok,
        train,
        SFTSettings(args.steps, args.batch_size, args.lr),
        log=lambda line: print(line.replace("warm start", "sft step"), flush=True),
    )
    after = mean_nll(model, tok, held)
    print(f"held-out loss after:  {shown(after)} nats per token")
    folder = files.save_model(model, tok, out / "model")
    summary = {
        "train_examples": len(train),
        "heldout_examples": len(held),
        "heldout_loss_before": before,
        "heldout_loss_after": after,
        "losses": losses,
        "model": args.model,
        "sft": str(folder),
    }
    files.write_json(out / "summary.json", summary)
    print(f"sft done: model saved to {folder}")
    return summary
