"""parallel.py: data-parallel GRPO across processes (torchrun), in a handful of small functions.

    torchrun --nproc_per_node N -- mascot.py train --stage 1|2 ...

(the "--" ends torchrun's own flags; without it torchrun reads our --run as its --run-path).

torchrun starts N copies of the command and tells each its rank (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR/PORT in the environment). Every process holds a full copy of the policy; what they
split is the batch. One GRPO step then runs like this (grpo.grpo_step, grpo.policy_update):

  1. every rank draws the SAME global batch of prompts (seeded by run seed and step) and keeps its
     contiguous share (`shard`): whole groups, so group advantages need no communication; each
     row keeps the sampling seed it has in a one-process run;
  2. each rank samples and scores its share; the rewards are gathered (`gather`) so that every
     rank logs the statistics of the whole batch;
  3. the loss denominator is the WHOLE batch's (real tokens for "dapo", sequences for "grpo"):
     each rank sums its own real tokens and `all_sum` adds them up. Each rank's loss is then its
     share of the full-batch loss, and the SUM of the ranks' gradients is the full-batch gradient;
  4. `sum_gradients` adds the gradients up across ranks (an all-reduce: what DDP does during
     backward, written out here after backward so that micro-batch accumulation stays as it is;
     DDP would average, and with our global denominator we need the sum);
  5. every rank clips the same global gradient norm and takes the same AdamW step, so the copies
     stay identical (they start identical too: `broadcast_parameters` from rank 0).
The result is the one-process update on the same global batch (tests/test_parallel.py checks the
weights to 1e-6 with two gloo processes). Rank 0 alone prints, writes metrics and checkpoints,
and runs the held-out checks; a resumed run loads the same checkpoint on every rank.

Backends: gloo on CPU (the tests), NCCL on GPUs (each rank on cuda:LOCAL_RANK). Without torchrun
(WORLD_SIZE unset or 1) every function here is the one-process identity.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from data import UserError


def init(device: str) -> str:
    """Join the process group torchrun describes, once; return the device this rank should use
    (cuda -> cuda:LOCAL_RANK). A single process (no torchrun) stays as it is."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return device
    if device.startswith("cuda"):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    return device


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    """Rank 0: the process that prints, writes files and runs the held-out checks."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank got here (e.g. until rank 0 has written the files the others read)."""
    if dist.is_initialized():
        dist.barrier()


def check_share(prompts_per_step: int) -> None:
    """Every rank must get the same number of prompts: say so before any work if not."""
    if prompts_per_step % world():
        raise UserError(f"--prompts-per-step {prompts_per_step}: must be a multiple of the {world()} "
                        "torchrun processes, so each gets the same share of the batch")


def shard(n: int) -> slice:
    """This rank's contiguous share of n items (the global batch's prompts); n must divide evenly,
    so that every rank runs the same number of rows (checked by the caller with a clear error)."""
    size = n // world()
    return slice(rank() * size, (rank() + 1) * size)


def all_sum(value: float) -> float:
    """The sum of a number over all ranks (token counts, loss sums for the log)."""
    if not dist.is_initialized():
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t.item())


def gather(items: list) -> list:
    """Every rank's list, concatenated in rank order: the global batch's rewards or texts."""
    if not dist.is_initialized():
        return list(items)
    parts = [None] * world()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def sum_gradients(model) -> None:
    """Replace each parameter's gradient by its sum over all ranks (one all-reduce per tensor)."""
    if not dist.is_initialized():
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def broadcast_parameters(model) -> None:
    """Make every rank's weights (and buffers) rank 0's, so all copies start identical."""
    if not dist.is_initialized():
        return
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t.data, src=0)


def _device() -> torch.device:
    """NCCL only moves GPU tensors; gloo moves CPU ones."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
