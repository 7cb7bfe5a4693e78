"""--offload-optimizer (plumbing/offload.py): the model trains in bf16, AdamW's fp32 master weights
and moments live in CPU memory (models.adamw picks it for any bf16 model). Here, on the CPU, it
must train the tiny model as plain fp32 AdamW does, and its checkpoints must resume exactly.

Run: .venv/bin/python -m pytest -q tests/test_offload.py
"""

import copy

import torch

import grpo
import models
from plumbing import runs
from plumbing.offload import OffloadedAdamW

TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 4,
    "A friend in need is a friend indeed, they say. " * 4,
]


def in_bf16(model):
    """A copy of the model whose parameters are bf16, as --offload-optimizer loads it."""
    model = copy.deepcopy(model)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16)
    return model


def lm_loss(model, batch) -> torch.Tensor:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return model(input_ids=ids, attention_mask=mask, labels=ids).loss


def train(model, batch, optimizer, steps: int) -> None:
    model.train()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        lm_loss(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


def test_offloaded_adamw_trains_a_tiny_model_to_the_fp32_loss(tiny):
    # 40 steps at lr 1e-3 take the loss from 10.83 to ~5.7 either way. The offloaded run's forward
    # and backward see bf16 weights (8 significant bits), its update is fp32 AdamW on fp32 masters:
    # measured 1e-4 relative apart here; 1% leaves room for other CPUs' kernels, and a lost update
    # (AdamW on bf16 weights, or masters never copied back) misses by far more.
    model, tok = tiny
    batch = tok(TEXT, return_tensors="pt", padding=True)
    plain = copy.deepcopy(model)
    train(plain, batch, models.adamw(plain, 1e-3, 0.0), steps=40)
    offloaded = in_bf16(model)
    optimizer = models.adamw(offloaded, 1e-3, 0.0)
    assert isinstance(optimizer, OffloadedAdamW)
    train(offloaded, batch, optimizer, steps=40)
    with torch.no_grad():
        start = lm_loss(model.eval(), batch).item()
        want = lm_loss(plain.eval(), batch).item()
        got = lm_loss(offloaded.float().eval(), batch).item()
    assert start - want > 4.0  # it learns
    assert abs(got - want) <= 0.01 * want


def test_masters_carry_updates_too_small_for_bf16(tiny):
    # A step of 1e-6 on weights of size ~1e-2 is below bf16's resolution (~4e-5 there): applied to
    # bf16 weights it would vanish; the fp32 masters keep it, and many add up.
    model = copy.deepcopy(tiny[0])
    optimizer = OffloadedAdamW(model, lr=1e-6, weight_decay=0.0)
    before = [m.clone() for m in optimizer.masters]
    for _ in range(3):
        for p in optimizer.params:
            p.grad = torch.ones_like(p)
        optimizer.step()
    moved = max((m - b).abs().max().item() for m, b in zip(optimizer.masters, before))
    assert 2e-6 < moved < 4e-6  # three AdamW steps of lr 1e-6 on a constant gradient


def test_an_offloaded_checkpoint_resumes_exactly(tiny, tmp_path):
    model, tok = tiny
    batch = tok(TEXT, return_tensors="pt", padding=True)
    whole = in_bf16(model)
    whole_opt = models.adamw(whole, 1e-3, 0.0)
    train(whole, batch, whole_opt, steps=4)

    first = in_bf16(model)
    first_opt = models.adamw(first, 1e-3, 0.0)
    train(first, batch, first_opt, steps=2)
    runs.save_checkpoint(tmp_path, 2, first, tok, first_opt)
    resumed = in_bf16(model)
    resumed_opt = models.adamw(resumed, 1e-3, 0.0)
    assert runs.load_checkpoint(tmp_path, resumed, resumed_opt)[1] == 2
    train(resumed, batch, resumed_opt, steps=2)
    for a, b in zip(whole_opt.masters, resumed_opt.masters):
        assert torch.equal(a, b)  # the fp32 masters, not only their bf16 roundings
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_grpo_runs_with_the_optimizer_offloaded(tiny, tmp_path):
    from test_grpo_loop import config, low_id_task

    model = in_bf16(tiny[0])
    tok = tiny[1]
    cfg = config(max_steps=2)
    rows = grpo.train_grpo(model, tok, grpo.Task(*low_id_task(tok)), cfg, tmp_path)
    assert len(rows) == 2 and not any(r["skipped"] for r in rows)
    assert all(p.dtype == torch.bfloat16 and torch.isfinite(p).all() for p in model.parameters())


def test_both_stages_train_with_the_optimizer_offloaded(tmp_path, monkeypatch):
    # The flag reaches every model a stage trains: the reward model, the speakers, the director and
    # its warm start (each then bf16, with fp32 masters); the saved speakers are bf16.
    import json

    import mascot
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    common = ["--model", "tiny", "--run", str(tmp_path), "--quiet", "--offload-optimizer"]
    budget = ["--max-new-tokens", "6", "--steps", "1", "--prompts-per-step", "1"]
    stage1 = ["--states", "2", "--heldout-states", "1", "--candidates", "3", "--margin", "0"]
    stage2 = ["--decision-points", "2", "--heldout-points", "1", "--rollout-turns", "1"]
    stage2 += ["--director-warmup", "1", "--no-eval-prompted"]
    assert mascot.main(["train", "--stage", "1", *common, *budget, *stage1]) == 0
    assert mascot.main(["train", "--stage", "2", *common, *budget, *stage2]) == 0
    config = json.loads((tmp_path / "stage1" / "speakers" / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
