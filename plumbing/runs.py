"""plumbing/runs.py: one run folder, one run (skip on first reading).

A run folder holds everything a command makes. This file keeps it consistent: a lock (a second command
on the same folder stops at once), the record of what made each stage (config.json, with a fingerprint
of the data, persona and profile files), the refusal of a command whose settings differ, GRPO's
checkpoints (safetensors and JSON, no pickle) and the model cards of saved models.
"""

import fcntl
import json
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file

from plumbing.common import UserError, warn
from plumbing.devices import check_device
from plumbing.files import (
    atomic_folder,
    fingerprint,
    read_json,
    save_model,
    write_json,
)


@contextmanager
def run_lock(folder: str | Path):
    """An exclusive lock on a run folder while the block runs: a second mascot command there stops at once
    instead of interleaving checkpoints and paid judgements. The OS drops it when the process ends (kill -9 too)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    with open(Path(folder) / ".lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"{folder} is in use by another mascot command; wait for it, or use another --run"
            ) from None
        yield


def save_config(config: dict, folder: Path) -> None:
    """Write the resolved settings to folder/config.json and print them once."""
    write_json(Path(folder) / "config.json", config)
    print("config: " + " ".join(f"{k}={v}" for k, v in config.items()), flush=True)


# What may differ between commands that build one stage folder: how, where, how long (files: by content).
# "run" is where the folder lies: a run moved or copied elsewhere is the same run.
OPERATIONAL = {
    "resume",
    "run",
    "device",
    "max_steps",
    "save_steps",
    "dump_every",
    "micro_batch",
    "gradient_checkpointing",
    "served_timeout",
    "served_retries",
    "served_concurrency",
    "data",
    "personas",
    "profiles_file",
    "argv",
    "quiet",
    "dist_timeout",
}


def start_stage(args, out: Path, ranks, data_file: Path) -> None:
    """Checks before any work (the device; that the folder's record, config.json, matches; that its
    checkpoints are resumed or refused), then the config.
    data_file: the contexts file --data names, fingerprinted with the persona and profile files."""
    check_device(args)
    if args.resume and not checkpoints(out / "checkpoints"):
        raise UserError(
            f"--resume: no GRPO checkpoint in {out / 'checkpoints'} yet; run without --resume"
        )
    config = {
        **vars(args),
        "fingerprint": fingerprint(data_file, args.personas, args.profiles_file),
    }
    made = {}  # the record of what made the folder's files, if it holds any besides config.json
    if any(f.name != "config.json" for f in out.glob("*")):
        made = read_json(out / "config.json")
    for key in config:
        if key not in made or key in OPERATIONAL or same_setting(key, made, config):
            continue
        if key == "fingerprint":
            what = "--data, --personas or --profiles-file: their files differ from those that"
        else:
            what = f"--{key.replace('_', '-')} {config[key]}: {key} {made[key]} is what"
        raise UserError(
            f"{what} made {out}; use its settings (with --resume to continue it) or a new --run"
        )
    # GRPO (grpo.start_or_resume) refuses them too, but only after states, judging, the reward
    # model and the held-out pass: say so before any of that work.
    if not args.resume and checkpoints(out / "checkpoints"):
        raise UserError(
            f"{out / 'checkpoints'} holds checkpoints of an earlier run; continue it with --resume, or use a new --run"
        )
    if ranks.is_main:
        save_config(config, out)


def same_setting(key: str, made: dict, config: dict) -> bool:
    """Does a setting match the record? A path inside the run folder (stage 1's speakers, say)
    matches the same path inside the folder where the run now lies."""
    if made[key] == config[key]:
        return True
    inside = [in_run(record[key], record.get("run")) for record in (made, config)]
    return inside[0] is not None and inside[0] == inside[1]


def in_run(value, run) -> str | None:
    """A path-valued setting relative to its run folder ("stage1/speakers"), or None for another
    value. Lexical, as the recorded run folder may have moved away (relative: to the same cwd)."""
    if not isinstance(value, str) or not isinstance(run, str) or not value:
        return None
    path, root = Path(os.path.abspath(value)), Path(os.path.abspath(run))
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def model_card(
    role: str, base: str, command: list[str], personas, prompt: list[dict], metrics: dict
) -> str:
    """A saved model's README.md: the command, key metrics, one training prompt (the layout to reproduce, as chat
    messages for the tokenizer's template) and the persona cards."""
    cards = {"set": personas.name, "personas": [vars(p) for p in personas.personas]}
    return (
        f"# mascot {role}\n\nTrained by mascot (MASCOT, arXiv 2601.14230) from `{base}`.\n\nCommand: `python "
        f"mascot.py {' '.join(command)}`\n\n## Key metrics\n"
        + "".join(f"- {k}: {v}\n" for k, v in metrics.items())
        + "\n## Prompt layout (one training prompt)\n"
        + _json_block(prompt)
        + "\n## Persona cards\n"
        + _json_block(cards)
    )


def _json_block(value) -> str:
    """A fenced JSON code block of a model card."""
    return "```json\n" + json.dumps(value, indent=1, ensure_ascii=False) + "\n```\n"


# --- Checkpoints: safetensors + JSON only (no pickle), written atomically ----------------------
def save_checkpoint(folder: Path, step: int, policy, tok, optimizer) -> Path:
    """folder/ckpt-<step>/: model, AdamW moments, RNG states, step; built under .tmp and renamed,
    so a crash mid-write leaves no half checkpoint. The two newest are kept."""
    final = folder / f"ckpt-{step:06d}"
    with atomic_folder(final) as tmp:
        save_model(policy, tok, tmp / "model")
        opt = optimizer.state_dict()
        tensors = {}  # "<param index>.<exp_avg|exp_avg_sq|step>" -> tensor
        for i, param_state in opt["state"].items():
            for k, v in param_state.items():
                tensors[f"{i}.{k}"] = (v if torch.is_tensor(v) else torch.tensor(v)).contiguous()
        tensors["rng.torch"] = torch.get_rng_state()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        state = random.getstate()
        meta = {
            "step": step,
            "param_groups": opt["param_groups"],
            "python_random": [state[0], list(state[1]), state[2]],
        }
        (tmp / "state.json").write_text(json.dumps(meta), encoding="utf-8")
    for old in sorted(folder.glob("ckpt-??????"))[:-2]:
        shutil.rmtree(old)
    return final


def checkpoints(folder: Path) -> list[Path]:
    """The complete checkpoints (renamed from .tmp), newest first."""
    return sorted(
        (p for p in folder.glob("ckpt-??????") if (p / "state.json").exists()), reverse=True
    )


def load_checkpoint(folder: Path, policy, optimizer) -> tuple[Path, int]:
    """Restore the newest checkpoint that loads (weights, AdamW moments, RNG states) in place; a
    damaged one (a truncated file, garbage JSON, a missing field, tensor or weight) is skipped with a
    warning for the one before it."""
    for path in checkpoints(folder):
        try:
            # Read and checked before anything is restored. What can still fail below (a weight of
            # another shape) leaves the model half restored, which the checkpoint before it, restoring
            # everything, overwrites.
            meta, state, rng = read_checkpoint(path, policy, optimizer)
            load_model(policy, str(path / "model" / "model.safetensors"), strict=False)
            optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
            torch.set_rng_state(rng)
        except Exception as err:  # safetensors, JSON, missing files, fields and tensors alike
            warn(
                f"{path} cannot be loaded ({type(err).__name__}: {str(err)[:80]}); trying the one before it"
            )
            continue
        r = meta["python_random"]
        random.setstate((r[0], tuple(r[1]), r[2]))
        return path, meta["step"]
    raise UserError(
        f"--resume: no complete checkpoint in {folder} loads; run without --resume and a new --run folder"
    )


def read_checkpoint(path: Path, policy, optimizer) -> tuple[dict, dict, torch.Tensor]:
    """(state.json, the AdamW state by parameter index, the torch RNG state) of one checkpoint, each
    checked; a ValueError (or the reader's own error) names what is damaged."""
    meta = json.loads((path / "state.json").read_text(encoding="utf-8"))
    if not isinstance(meta, dict) or not all(k in meta for k in CHECKPOINT_FIELDS):
        raise ValueError(f"state.json lacks one of {', '.join(CHECKPOINT_FIELDS)}")
    r = meta["python_random"]
    if not isinstance(meta["step"], int) or not (isinstance(r, list) and len(r) == 3):
        raise ValueError("state.json: step or python_random is malformed")
    tensors = load_file(str(path / "optimizer.safetensors"))
    if "rng.torch" not in tensors:
        raise ValueError("optimizer.safetensors lacks rng.torch")
    rng = tensors.pop("rng.torch")
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        i, key = name.split(".", 1)
        state.setdefault(int(i), {})[key] = t
    check_moments(state, optimizer)
    missing = missing_weights(policy, path / "model" / "model.safetensors")
    if missing:
        raise ValueError(f"model.safetensors lacks {len(missing)} weights ({missing[0]}, ...)")
    return meta, state, rng


def check_moments(state: dict[int, dict], optimizer) -> None:
    """A ValueError unless every saved AdamW tensor belongs to a parameter and has its shape (the
    optimizer takes any tensor, and the first step would fail on a wrong one)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, entry in state.items():
        if not 0 <= i < len(params):
            raise ValueError(f"optimizer.safetensors: parameter {i} of {len(params)}")
        for key, t in entry.items():
            if t.dim() and t.shape != params[i].shape:  # "step" is a scalar
                raise ValueError(f"optimizer.safetensors: {i}.{key} has shape {list(t.shape)}")


CHECKPOINT_FIELDS = ("step", "param_groups", "python_random")  # what save_checkpoint writes


def missing_weights(model, file: Path) -> list[str]:
    """The model's weights that a safetensors file does not hold. Tied weights (lm_head sharing the
    embedding's storage) are saved once, under one of their names: a tied group counts as present
    when any of its names is in the file."""
    with safe_open(str(file), framework="pt") as f:
        saved = set(f.keys())
    groups: dict[tuple, list[str]] = {}  # one storage (where, shape) -> the names that share it
    for name, t in model.state_dict().items():
        where = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        groups.setdefault(where, []).append(name)
    return sorted(n for names in groups.values() if not saved.intersection(names) for n in names)
