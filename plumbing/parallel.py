"""plumbing/parallel.py: one process, or data-parallel GRPO across several (skip on first reading).

It holds `OneProcess` (every operation the identity: what a reader of grpo.py may assume) and `Ranks`, the
torchrun version with the same operations.

torchrun starts N copies of the command, each told its rank; mascot.py builds `Ranks(args)` when WORLD_SIZE > 1. Every
process holds a full copy of the policy and they split the batch; in one GRPO step (grpo.grpo_step, grpo.policy_update):
  1. every rank draws the SAME global batch and keeps its contiguous share (`shard`): whole groups, so the advantages
     need no communication; each row keeps its one-process sampling seed;
  2. the rewards are gathered (`gather`): every rank logs the whole batch's statistics;
  3. the loss denominator is the WHOLE batch's (`all_sum` of the ranks' real tokens), so the SUM of the ranks' gradients
     is the full-batch gradient; DDP (`wrap`) all-reduces it in buckets in the last micro-batch's backward;
  4. every rank clips the same gradient and takes the same AdamW step from the same weights (DDP copies rank 0's at the
     wrap): the copies stay identical, and the update is the one-process one (tests/test_parallel.py).
Rank 0 alone prints and writes, and builds stage 1's states, candidates, judgements and reward model (each judge call
paid once) and stage 2's warm start while the others wait (--dist-timeout). Backends: gloo on CPU, NCCL on GPUs.
    torchrun --nproc_per_node N -- mascot.py train --stage 1|2 ...     ("--" ends torchrun's flags)
"""

import atexit
import gc
import itertools
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from plumbing.common import UserError


def leave() -> None:
    """At exit: free what still holds the process group (a DDP wrapper in a reference cycle), then leave it."""
    gc.collect()
    dist.destroy_process_group()


class Ranks:
    """Joins the process group torchrun describes (once) and sets args.device to this rank's GPU."""

    def __init__(self, args):
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if getattr(args, "prompts_per_step", 0) % world:  # say so before any work, on every rank
            raise UserError(
                f"--prompts-per-step {args.prompts_per_step}: must be a multiple of the {world} "
                "torchrun processes, so each gets the same share of the batch"
            )
        if args.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise UserError("--device cuda: this torch sees no CUDA device; use --device cpu")
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            args.device = f"cuda:{torch.cuda.current_device()}"
        if not dist.is_initialized():
            dist.init_process_group(
                "nccl" if args.device.startswith("cuda") else "gloo",
                timeout=timedelta(minutes=getattr(args, "dist_timeout", 180.0)),
            )
            atexit.register(leave)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.is_main = self.rank == 0
        # The tensors the ranks exchange: NCCL takes GPU tensors only, gloo CPU ones.
        self.device = torch.device(args.device if dist.get_backend() == "nccl" else "cpu")
        if not self.is_main:
            sys.stdout = open(os.devnull, "w")  # one log, rank 0's; errors reach stderr

    def shard(self, n: int) -> slice:
        """This rank's contiguous share of n items (n divides evenly: checked above)."""
        return slice(self.rank * (n // self.world), (self.rank + 1) * (n // self.world))

    def gather(self, items: list) -> list:
        """Every rank's list, in rank order: the global batch's."""
        parts = [None] * self.world
        dist.all_gather_object(parts, list(items))
        return list(itertools.chain.from_iterable(parts))

    def all_sum(self, value: float) -> float:
        """The sum over ranks of a number (token counts, loss sums)."""
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item())

    def wrap(self, scorer: torch.nn.Module) -> torch.nn.Module:
        """DDP around grpo.LogProbs: rank 0's weights to every rank; each synced backward all-reduces the gradients."""
        local = [self.device.index] if self.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(scorer, device_ids=local)

    def barrier(self) -> None:
        dist.barrier()


class OneProcess:
    """`ranks` for one process: every operation is the identity. `Ranks` above is the torchrun
    version (each rank samples its share of the prompts; the loss denominators are summed over
    ranks and DDP sums the gradients; rank 0 writes), with the same operations."""

    rank = 0
    world = 1
    is_main = True

    @staticmethod
    def wrap(scorer: torch.nn.Module) -> torch.nn.Module:
        return scorer  # torchrun: DistributedDataParallel(scorer)

    @staticmethod
    def barrier() -> None:
        pass  # nothing to wait for in one process

    def shard(self, n: int) -> slice:
        return slice(0, n)

    def gather(self, items: list) -> list:
        return list(items)

    def all_sum(self, value: float) -> float:
        return value
