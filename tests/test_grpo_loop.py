"""The GRPO training loop (grpo.train_grpo) on the tiny model: it learns, and it resumes exactly."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import grpo
from plumbing import loading, runs

ROOT = Path(__file__).resolve().parents[1]


def low_id_task(tok, n_prompts=8):
    """A programmatic reward a random tiny model can learn: the share of completion tokens whose
    id is in the lower half of the vocabulary. At temperature 0.1 the random model's choices are
    peaked enough that GRPO can shift them within a few steps."""
    V = len(tok)
    prompts = [
        [{"role": "user", "content": f"Say something number {i}."}] for i in range(n_prompts)
    ]

    def sample_prompts(step):
        i = (step * 2) % n_prompts
        return prompts[i : i + 2], [i, i + 1]

    def reward_fn(meta, texts, gen):
        rewards = []
        for row in range(gen.completion_ids.shape[0]):
            ids = gen.completion_ids[row][gen.completion_mask[row].bool()]
            rewards.append(float((ids < V // 2).float().mean()) if len(ids) else 0.0)
        return rewards, {"low": rewards}

    return sample_prompts, reward_fn


def config(**kw):
    base = dict(
        max_steps=10,
        prompts_per_step=2,
        num_generations=8,
        learning_rate=3e-3,
        warmup_steps=0,
        max_new_tokens=8,
        temperature=0.1,
        save_steps=100,
        dump_every=1,
        seed=0,
        beta=0.0,
    )
    base.update(kw)
    return grpo.GRPOConfig(**base)


def test_grpo_raises_a_programmatic_reward_on_the_tiny_model(tmp_path):
    model, tok = loading.load_model("tiny")
    sample_prompts, reward_fn = low_id_task(tok)
    # 12 steps: over seeds 0-7 the first two steps average 0.45-0.55 and the last three 0.98-1.00.
    # The sampled tokens depend on the last bits of the logits, so another CPU's kernels can send a
    # run along another path (the plain kernels do, for seed 0, from step 4): the thresholds leave
    # room for any of those paths, not for one run's exact numbers.
    task = grpo.Task(sample_prompts, reward_fn)
    rows = grpo.train_grpo(model, tok, task, config(max_steps=12), tmp_path)
    first = sum(r["reward"] for r in rows[:2]) / 2
    last = sum(r["reward"] for r in rows[-3:]) / 3
    print(f"reward first 2 steps {first:.3f}, last 3 steps {last:.3f}")
    assert first < 0.7  # starts near chance (0.5)
    assert last > 0.85 and last > first + 0.2
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 12 and json.loads(lines[-1])["step"] == 12


def test_checkpoint_round_trip_and_resume_refuses_without_one(tmp_path):
    from plumbing.common import UserError

    model, tok = loading.load_model("tiny")
    sample_prompts, reward_fn = low_id_task(tok)
    with pytest.raises(UserError, match="--resume"):
        grpo.train_grpo(
            model,
            tok,
            grpo.Task(sample_prompts, reward_fn),
            config(max_steps=2),
            tmp_path,
            resume=True,
        )
    grpo.train_grpo(
        model,
        tok,
        grpo.Task(sample_prompts, reward_fn),
        config(max_steps=2, save_steps=1),
        tmp_path,
    )
    ckpt = runs.checkpoints(tmp_path / "checkpoints")[0]  # the newest complete one
    assert ckpt.name == "ckpt-000002" and not list((tmp_path / "checkpoints").glob("*.tmp"))
    # Every file of a checkpoint is safetensors or JSON: nothing needs pickle to load.
    suffixes = {p.suffix for p in ckpt.rglob("*") if p.is_file()}
    assert suffixes <= {".safetensors", ".json", ".jinja"}


RUNNER = """
import os, sys, json
sys.path.insert(0, {root!r})
os.environ.setdefault("MASCOT_CACHE", {cache!r})
import torch
torch.set_num_threads(1)
from pathlib import Path
import grpo
from plumbing import loading
sys.path.insert(0, {tests!r})
from test_grpo_loop import low_id_task, config
model, tok = loading.load_model("tiny")
sample_prompts, reward_fn = low_id_task(tok)
out = Path(sys.argv[1])
grpo.train_grpo(model, tok, grpo.Task(sample_prompts, reward_fn), config(max_steps=6, save_steps=2), out,
                resume=sys.argv[2] == "resume")
from safetensors.torch import save_file
save_file({{k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}},
          str(out / "final.safetensors"))
"""


def test_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path):
    """Kill a real training process with SIGKILL after step 3, resume it, compare with a clean run."""
    from safetensors.torch import load_file

    script = tmp_path / "runner.py"
    script.write_text(
        RUNNER.format(root=str(ROOT), cache=os.environ["MASCOT_CACHE"], tests=str(ROOT / "tests"))
    )
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    subprocess.run(
        [sys.executable, str(script), str(clean), "fresh"],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), str(killed), "fresh"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in proc.stdout:  # wait until step 3 is logged (checkpoint at 2)
        if line.startswith("step    3/"):
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "final.safetensors").exists()
    done = subprocess.run(
        [sys.executable, str(script), str(killed), "resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resumed from" in done.stdout
    a, b = load_file(str(clean / "final.safetensors")), load_file(str(killed / "final.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows_a = [json.loads(x) for x in (clean / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(x) for x in (killed / "metrics.jsonl").read_text().splitlines()]
    drop = {"seconds"}
    assert [{k: v for k, v in r.items() if k not in drop} for r in rows_a] == [
        {k: v for k, v in r.items() if k not in drop} for r in rows_b
    ]


def test_non_finite_steps_are_skipped_then_stop_the_run(tmp_path):
    from plumbing.common import UserError

    model, tok = loading.load_model("tiny")
    sample_prompts, _ = low_id_task(tok)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def nan_reward(meta, texts, gen):
        r = [float("nan")] * len(texts)
        return r, {"nan": r}

    with pytest.raises(UserError, match="non-finite"):
        grpo.train_grpo(
            model,
            tok,
            grpo.Task(sample_prompts, nan_reward),
            config(max_steps=5),
            tmp_path,
        )
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["skipped"] for r in rows)
    for k, v in model.state_dict().items():  # no NaN update was ever applied
        assert torch.equal(v, before[k]), k
    assert runs.checkpoints(tmp_path / "checkpoints") != []


def test_the_step_line_shows_hacking_in_either_stage():
    row = {
        "step": 3,
        "reward": 0.5,
        "reward_std": 0.1,
        "kl": None,
        "clip_ratio/region_mean": 0.0,
        "entropy": 1.5,
        "completions/mean_length": 20.0,
        "frac_reward_zero_std": 0.0,
        "grad_norm": 1.0,
        "logp_mismatch": 0.01,
        "skipped": False,
        "seconds": 2.0,
    }
    stage1 = grpo.log_line(
        {**row, "hack_context_copy": 0.25, "hack_meta_leak": 0.0, "hack_words": 12.0}, 10
    )
    assert "hacks [context_copy 0.25] " in stage1 and "clean" not in stage1
    assert "hacks [none] " in grpo.log_line(
        {**row, "hack_context_copy": 0.0}, 10
    )  # measured, none found
    stage2 = grpo.log_line({**row, "r_clean": 0.875}, 10)  # the director's block turns
    assert "clean 0.88 " in stage2 and "hacks" not in stage2
    assert "hacks" not in grpo.log_line(row, 10) and "clean" not in grpo.log_line(row, 10)


def test_an_interrupt_says_how_to_go_on(monkeypatch, capsys):
    import mascot

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(mascot, "evaluate_cmd", interrupted)
    monkeypatch.setattr(mascot, "train_stage1", interrupted)
    assert mascot.main(["evaluate", "--model", "tiny"]) == 130
    assert (
        capsys.readouterr().err.strip().endswith("run the same command (it picks up what is done)")
    )
    assert mascot.main(["train", "--stage", "1", "--model", "tiny"]) == 130
    assert capsys.readouterr().err.strip().endswith("run the same command with --resume")


@pytest.mark.parametrize(
    "damage", ["optimizer.safetensors", "model/model.safetensors", "state.json"]
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path, damage, capsys):
    """A truncated safetensors file or garbage state.json in the newest checkpoint: resume warns and
    continues from the previous complete checkpoint (no traceback), then runs to the end."""
    model, tok = loading.load_model("tiny")
    sample_prompts, reward_fn = low_id_task(tok)
    grpo.train_grpo(
        model,
        tok,
        grpo.Task(sample_prompts, reward_fn),
        config(max_steps=2, save_steps=1),
        tmp_path,
    )
    broken = tmp_path / "checkpoints" / "ckpt-000002" / damage
    broken.write_bytes(b"{not json" if damage == "state.json" else broken.read_bytes()[:100])
    model, tok = loading.load_model("tiny")
    rows = grpo.train_grpo(
        model,
        tok,
        grpo.Task(sample_prompts, reward_fn),
        config(max_steps=3, save_steps=1),
        tmp_path,
        resume=True,
    )
    captured = capsys.readouterr()
    assert "ckpt-000002 cannot be loaded" in captured.err
    lines = captured.out.splitlines()
    assert any("ckpt-000001" in line for line in lines) and [r["step"] for r in rows][-2:] == [2, 3]


def _empty_state(ckpt):
    (ckpt / "state.json").write_text("{}")


def _no_torch_rng(ckpt):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "optimizer.safetensors"))
    del tensors["rng.torch"]
    save_file(tensors, str(ckpt / "optimizer.safetensors"))


def _one_weight_only(ckpt):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model" / "model.safetensors"))
    assert len(tensors) == 20  # the tiny model's 21 names less the tied lm_head
    first = sorted(tensors)[0]
    save_file({first: tensors[first]}, str(ckpt / "model" / "model.safetensors"))


@pytest.mark.parametrize(
    "damage, needle",
    [
        (_empty_state, "state.json lacks"),
        (_no_torch_rng, "lacks rng.torch"),
        (_one_weight_only, "model.safetensors lacks 19 weights"),
    ],
)
def test_a_checkpoint_missing_a_field_tensor_or_weight_falls_back_too(
    tmp_path, damage, needle, capsys
):
    """Well-formed files that lack part of a checkpoint (state.json "{}", no rng.torch, a model file
    of 1 of its 20 tensors) are damage too: a warning and the checkpoint before it, never a KeyError
    or weights silently taken from the starting model."""
    model, tok = loading.load_model("tiny")
    sample_prompts, reward_fn = low_id_task(tok)
    task = grpo.Task(sample_prompts, reward_fn)
    grpo.train_grpo(model, tok, task, config(max_steps=2, save_steps=1), tmp_path)
    damage(tmp_path / "checkpoints" / "ckpt-000002")
    model, tok = loading.load_model("tiny")
    rows = grpo.train_grpo(
        model, tok, task, config(max_steps=3, save_steps=1), tmp_path, resume=True
    )
    captured = capsys.readouterr()
    assert "ckpt-000002 cannot be loaded" in captured.err and needle in captured.err
    assert "resumed from" in captured.out and "ckpt-000001 at step 1" in captured.out
    assert [r["step"] for r in rows] == [2, 3]


def test_missing_weights_ignores_tied_weights_only(tmp_path):
    """A tied lm_head is saved once, under either name: not missing. An untied one is a weight."""
    from safetensors.torch import save_file
    from transformers import LlamaForCausalLM

    tied, _ = loading.load_model("tiny")
    state = tied.state_dict()
    file = tmp_path / "model.safetensors"
    save_file({k: v for k, v in state.items() if k != "lm_head.weight"}, str(file))
    assert runs.missing_weights(tied, file) == []
    config = tied.config.to_dict() | {"tie_word_embeddings": False}
    untied = LlamaForCausalLM(type(tied.config).from_dict(config))
    assert runs.missing_weights(untied, file) == ["lm_head.weight"]
    save_file({"lm_head.weight": state["lm_head.weight"].clone()}, str(file))
    missing = runs.missing_weights(tied, file)
    assert len(missing) == 19 and "model.embed_tokens.weight" not in missing


def test_an_update_that_blows_the_weights_up_stops_the_run(tmp_path):
    """--lr 1e30 leaves finite weights of ~1e29: no model either. The run stops at the first such
    step with one line, before any checkpoint of the broken weights is written."""
    from plumbing.common import UserError

    model, tok = loading.load_model("tiny")
    task = grpo.Task(*low_id_task(tok))
    with pytest.raises(UserError, match="changed by more than 50% of their norm in one step"):
        grpo.train_grpo(model, tok, task, config(max_steps=2, learning_rate=1e30), tmp_path)
    assert runs.checkpoints(tmp_path / "checkpoints") == []
