"""plumbing/cli.py: turning settings into command-line flags (skip on first reading).

Every hyperparameter is declared once, as an `option` field of a settings dataclass beside the code
that uses it (grpo.GRPOConfig, reward.RLAIFConfig, director.DirectorConfig, evaluate.EvalConfig);
`add_options` makes each field a flag (`--num-generations` for num_generations) and `options` reads
them back. `common_flags` are the flags every command that runs models shares.
"""

import argparse
import dataclasses

from plumbing.common import UserError
from plumbing.files import HERE as ROOT
from plumbing.loading import EMBEDDED

_CHECKS = {
    "positive": (lambda v: v > 0, "> 0"),
    "non-negative": (lambda v: v >= 0, ">= 0"),
    "at-least-2": (lambda v: v >= 2, ">= 2"),
    "fraction": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "": (lambda v: True, ""),
}


def flag_type(name: str, kind: type, check: str = ""):
    """An argparse `type=` that parses int or float, refuses NaN and infinity, and applies `check`:
    `error: argument --learning-rate/--lr: --learning-rate must be > 0, got -1.0` (exit status 2)."""
    ok, rule = _CHECKS[check]

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be {'a whole number' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{name} must be a finite number, got {text!r}")
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{name} must be {rule}, got {value}")
        return value

    return parse


# --- Flags: each declared once, here or as an `option` field of a settings dataclass -------------
class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad flag is one line (argparse's own prints the whole usage
    first): a UserError, which mascot.main prints."""

    def error(self, message):
        raise UserError(f"{message} (python {self.prog} --help lists every flag)")


class Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default once: not when its help already names it, nor for store_true."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def _flag_kind(f: dataclasses.Field, name: str, check) -> dict:
    """How argparse reads one `option` field: a bool as --x / --no-x, a list of choices, text as
    it is, a number through flag_type (which applies the check)."""
    if isinstance(f.default, bool):
        return {"action": argparse.BooleanOptionalAction}
    if isinstance(check, list):
        return {"choices": check}
    if isinstance(f.default, str):
        return {}
    return {"type": flag_type(name, type(f.default), check)}


def add_options(group, cls, prefix: str = "") -> None:
    """One flag per `option` field of a settings dataclass (`--num-generations` for num_generations): the default,
    help and valid range come from the field (plumbing.common.option); a bool becomes --x / --no-x."""
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue  # a field set in code, not from the command line
        name = "--" + prefix + f.name.replace("_", "-")
        aliases = [f.metadata["alias"]] if f.metadata["alias"] else []
        group.add_argument(
            name,
            *aliases,
            dest=(prefix + f.name).replace("-", "_"),
            default=f.default,
            help=f.metadata["help"],
            **_flag_kind(f, name, f.metadata["check"]),
        )


def options(cls, args, prefix: str = "", **given):
    """The settings dataclass `cls` filled from the parsed flags (plus `given` fields that are not flags)."""
    return cls(
        **{
            f.name: getattr(args, (prefix + f.name).replace("-", "_"))
            for f in dataclasses.fields(cls)
            if "help" in f.metadata
        },
        **given,
    )


def common_flags(p, trained: bool = True) -> None:
    """What every command that runs models needs; `trained`: the commands that run the trained roles."""
    _model_and_data_flags(p)
    if trained:
        _role_flags(p)
    _served_flags(p)
    p.add_argument(
        "--quiet", action="store_true", help="no progress bars (a terminal) or phase lines (a log)"
    )
    p.add_argument(
        "--user-every",
        type=flag_type("--user-every", int, "non-negative"),
        default=2,
        help="the simulated user answers after every N agent turns (0: never)",
    )


def _model_and_data_flags(p) -> None:
    """The base model, where it runs, the persona and data files, the run folder, the judge."""
    p.add_argument(
        "--model",
        default=EMBEDDED,
        help="smollm2-135m (embedded), tiny (tests), a folder or a hub id",
    )
    p.add_argument("--personas", default=str(ROOT / "personas.json"), help="persona file")
    p.add_argument("--set", default="support", help="persona set: support | meeting")
    p.add_argument("--run", default="runs/default", help="run folder for every artifact")
    p.add_argument(
        "--seed", type=int, default=0, help="one seed for everything (data split, sampling)"
    )
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the models run")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="frozen roles, the reference, the reward model's scoring and the sampling copy; auto: bfloat16 "
        "where native (CUDA, CPUs with AVX512-BF16 or AMX), else float32. Training is always float32",
    )
    p.add_argument(
        "--max-new-tokens",
        "--max-completion-length",
        type=flag_type("--max-new-tokens", int, "positive"),
        default=48,
        help="longest generated turn (speakers and simulated user), in tokens",
    )
    p.add_argument(
        "--data",
        default="bundled",
        help="bundled, our contexts .jsonl, or ED / ESConv / QMSum as published",
    )
    p.add_argument(
        "--profiles-file",
        default=str(ROOT / "data" / "profiles.json"),
        help="Big Five user profiles",
    )
    p.add_argument(
        "--held-out",
        type=flag_type("--held-out", float, "fraction"),
        default=0.25,
        help="share of contexts held out for evaluation (without official splits)",
    )
    p.add_argument(
        "--judge",
        default="offline",
        help="offline (strategy classifier + hack guards where the cards list ESConv "
        "strategies, features elsewhere) | offline-features | hf:<model or folder> | openai:<base url> | rm:<folder>",
    )
    p.add_argument("--judge-model", default=None, help="the model name for an openai: judge")


def _role_flags(p) -> None:
    """Which model plays each role: a trained folder, the base model, or one served elsewhere."""
    p.add_argument(
        "--speakers",
        default=None,
        help="a folder or openai:<base url> (default: RUN/stage1/speakers "
        "if it exists, else --model)",
    )
    p.add_argument(
        "--director",
        default=None,
        help="a folder or openai:<base url> (default: RUN/stage2/director "
        "if it exists, else --model; train --stage 2 starts from it)",
    )
    p.add_argument(
        "--user",
        default=None,
        help="the simulated user: a folder or openai:<base url> (default: --model)",
    )
    for role in ("speakers", "director", "user"):
        p.add_argument(
            f"--{role}-model",
            default=None,
            help=f"the served model's name for --{role} openai:...",
        )


def _served_flags(p) -> None:
    """How long and how often to wait for a served role or judge (plumbing/served.py)."""
    p.add_argument(
        "--served-timeout",
        type=flag_type("--served-timeout", float, "positive"),
        default=120.0,
        help="openai: roles and judge: seconds per request in all, retried after",
    )
    p.add_argument(
        "--served-retries",
        type=flag_type("--served-retries", int, "non-negative"),
        default=5,
        help="openai: roles and judge: retries after HTTP 429/5xx, refused connections, timeouts",
    )
    p.add_argument(
        "--served-concurrency",
        type=flag_type("--served-concurrency", int, "positive"),
        default=8,
        help="openai: roles and judge: requests in flight at once; each answer is cached as it arrives",
    )
