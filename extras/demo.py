"""extras/demo.py: `python mascot.py demo` (make demo): every stage on the embedded model, sized for a 2-core CPU, then
a short summary a newcomer can read.

A tool beside the method: it only calls mascot.py's own commands, with small budgets.

Stage 1, stage 2, the evaluation and the HTML report, each through mascot.py's own commands, each skipped when already
complete and resumed from its newest checkpoint when interrupted (run `make demo` again to continue). Small on purpose:
the point is to see every stage run and print real numbers; at this size they are noise, and the closing verdict line
says whether any change is beyond it. For a real run, use `train` and `evaluate` without these budgets.
    python mascot.py demo [--run runs/demo] [--model smollm2-135m]
"""

import argparse
import resource
import shutil
import textwrap
import time
from pathlib import Path

from evaluate import REFERENCE, all_metrics
from metrics import binomial_two_sided_p
from plumbing import devices, files, loading, runs
from plumbing.results import cell

# Activation checkpointing keeps every training pass near one layer's activations, for ~1/5 more compute in those
# passes. --beta 0: three steps at lr 1e-5 stay within a KL of ~0.001 of the start, where the KL term changes nothing,
# and without it no frozen reference is held (0.54 GB in fp32): the demo fits in 4 GB even without native bf16.
STAGE1 = (
    "--states 6 --heldout-states 3 --candidates 4 --pairs-per-state 1 --hack-pairs 1 "
    "--max-steps 3 --prompts-per-step 2 --num-generations 4 --max-completion-length 32 "
    "--learning-rate 1e-5 --beta 0 --save-steps 3 --dump-every 3 --gradient-checkpointing"
).split()
# Supervised steps first teach the 135M director the format (prompted, it writes nothing parseable: no GRPO signal).
STAGE2 = (
    "--decision-points 4 --heldout-points 3 --max-steps 2 --prompts-per-step 1 "
    "--num-generations 3 --rollout-turns 2 --max-completion-length 32 --learning-rate 1e-5 "
    "--beta 0 --director-warmup 5 --warmup-lr 1e-4 --no-eval-prompted --save-steps 2 "
    "--dump-every 2 --gradient-checkpointing"
).split()
EVAL = (
    "--contexts 3 --turns 3 --max-new-tokens 24 "
    "--systems zero-shot,round-robin,mascot-p,mascot-c,mascot"
).split()


def main(argv: list[str], cli) -> int:
    """`mascot.py demo`: stage 1, stage 2, evaluate and report, each skipped when already done."""
    p = cli.Parser(
        prog="mascot.py demo",
        formatter_class=cli.Formatter,
        description="every stage on the embedded model, sized for a 2-core CPU, then a summary",
    )
    p.add_argument("--run", default="runs/demo", help="run folder")
    p.add_argument("--model", default=loading.EMBEDDED, help="base model")
    args = p.parse_args(argv[1:])
    run = Path(args.run)
    common = ["--model", args.model, "--run", args.run]
    t0 = time.time()

    def so_far() -> str:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux's ru_maxrss: KiB
        return f"{time.time() - t0:.0f} s so far, peak memory {peak / 1e9:.1f} GB"

    with runs.run_lock(run):  # one command at a time in a run folder, as train's
        for stage, budget in ((1, STAGE1), (2, STAGE2)):
            folder = run / f"stage{stage}"
            if (folder / "summary.json").exists():
                print(f"demo: stage {stage} already done in {folder}")
                continue
            print(f"\n=== demo: stage {stage} ({so_far()}) ===")
            resume = ["--resume"] if runs.checkpoints(folder / "checkpoints") else []
            train = cli.train_stage1 if stage == 1 else cli.train_stage2
            argv = ["train", "--stage", str(stage), *common, *budget, *resume]
            # argv travels in the namespace too: the model cards record the command.
            train(cli.build_parser().parse_args(argv, argparse.Namespace(argv=argv)))
            drop_resume_checkpoints(folder)
            devices.release_memory()  # one process runs every stage: free the last one's memory
        print(f"\n=== demo: evaluation ({so_far()}) ===")
        results = cli.evaluate_cmd(cli.build_parser().parse_args(["evaluate", *common, *EVAL]))
        path = cli.extra("report").build_report(run)
        print_side_by_side(run / "eval" / "transcripts.jsonl")
        print("\n" + "\n".join(verdict(results)))
    print(f"\ndemo finished ({so_far()}); results in {run}/eval/results.md, report: {path}")
    return 0


def drop_resume_checkpoints(folder: Path) -> None:
    """Delete a done stage's resume checkpoints (~1.6 GB each, SmolLM2-135M): nothing reads them; `train` keeps them."""
    if (folder / "summary.json").exists() and (folder / "checkpoints").is_dir():
        size = sum(f.stat().st_size for f in (folder / "checkpoints").rglob("*") if f.is_file())
        shutil.rmtree(folder / "checkpoints")
        print(f"demo: {folder.name} finished; its resume checkpoints removed ({size / 1e9:.1f} GB)")


def print_side_by_side(path: Path, width: int = 60) -> None:
    """Round-robin with base speakers beside the full trained system on one held-out context, profile and seeds."""
    if not path.exists():
        return
    rows = {}  # system -> its conversations
    for r in files.read_jsonl(path):
        rows.setdefault(r["system"], []).append(r)
    if "round-robin" not in rows or "mascot" not in rows:
        return
    a = rows["round-robin"][0]
    left = wrapped_turns(a, width)
    right = wrapped_turns(rows["mascot"][0], width)
    print(
        f"\ncontext {a['context_id']}, profile {a.get('profile', '-')}, the same seeds on both sides"
    )
    print(
        f"{'before: base speakers, round-robin order':<{width}} | after: trained speakers and director (mascot)"
    )
    print("-" * width + "-+-" + "-" * width)
    height = max(len(left), len(right))
    left += [""] * (height - len(left))
    right += [""] * (height - len(right))
    for before, after in zip(left, right):
        print(f"{before:<{width}} | {after}")


def wrapped_turns(conv: dict, width: int) -> list[str]:
    """A conversation's turns as lines of at most `width` characters, a blank line after each turn."""
    lines = []
    for t in conv["turns"]:
        lines += textwrap.wrap(f"{t['speaker']}: {t['text']}", width) + [""]
    return lines


def verdict(r: dict) -> list[str]:
    """A few columns (systems with n >= 2) and one line on whether any change against round-robin is beyond noise: its
    95% bootstrap interval excludes 0 AND its paired differences' sign test gives p < 0.05 (a bootstrap over three pairs
    excludes 0 whenever all three agree, by chance one time in four; the sign test needs six pairs)."""
    cols = [
        m
        for m in all_metrics()
        if m.key in ("persona_id_accuracy", "persona_consistency", "self_bleu", "context_copy")
        and r["status"][m.key] in ("ok", "approximated")
    ]
    lines = [f"{'system':<15} {'n':>2}   " + "  ".join(f"{m.title[:24]:>24}" for m in cols)]
    lines += [
        f"{n:<15} {e['n']:>2}   " + "  ".join(f"{cell(e['metrics'][m.key], 3):>24}" for m in cols)
        for n, e in r["systems"].items()
        if e["n"] >= 2
    ]
    base = r["systems"].get(REFERENCE, {}).get("conversations", [])
    beyond = []  # "system metric change" of every change beyond noise
    pairs = 0  # the most conversation pairs behind any change
    for name, changes in r["changes"].items():
        for m in all_metrics():
            if m.key not in changes or changes[m.key]["lo"] is None:
                continue  # not measured, or no interval
            c = changes[m.key]
            diffs = [
                a["metrics"][m.key] - b["metrics"][m.key]
                for a, b in zip(r["systems"][name]["conversations"], base)
                if a["metrics"].get(m.key) is not None and b["metrics"].get(m.key) is not None
            ]
            ups = sum(d > 0 for d in diffs)
            downs = sum(d < 0 for d in diffs)
            pairs = max(pairs, len(diffs))
            if (c["lo"] > 0 or c["hi"] < 0) and binomial_two_sided_p(ups, ups + downs) < 0.05:
                beyond.append(f"{name} {m.title} {c['mean']:+.3f}")
    if beyond:
        lines.append(
            "verdict: beyond noise against round-robin (95% interval and sign test p < 0.05): "
            + "; ".join(beyond)
        )
    else:
        lines.append(
            f"verdict: no change against round-robin is beyond noise: with {pairs} conversation "
            "pairs per system, what differs here is noise (a sign test needs 6 pairs to reach p < 0.05)"
        )
    return lines
