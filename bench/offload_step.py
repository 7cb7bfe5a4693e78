"""bench/offload_step.py: what --offload-optimizer adds to a GRPO step, measured on this CPU.

plumbing/offload.py keeps AdamW's fp32 master weights and moments in CPU memory: each optimiser
step copies the bf16 gradients to fp32 masters' gradients, runs fused AdamW on the CPU and rounds the
masters back into the bf16 weights. Without a GPU the two PCIe copies cannot be timed here; they are
estimated from the bytes (2 x 2 bytes a parameter) at a stated bandwidth. What this script times, on
`--millions` million parameters (default 100) in tensors of Qwen3-1.7B's shapes, is the CPU part:
    gradient bf16 -> fp32, fused AdamW on the masters, masters -> bf16,
and it scales the median to `--target` parameters (default 1.72e9, Qwen3-1.7B). The figures go to
docs/PERFORMANCE.md with the machine and the date.

    .venv/bin/python bench/offload_step.py [--millions 100] [--repeats 5] [--threads 2]
"""

import argparse
import statistics
import time

import torch

HIDDEN, INTERMEDIATE = 2048, 6144  # Qwen3-1.7B: an MLP projection is 2048 x 6144


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--millions", type=float, default=100.0, help="parameters timed, in millions")
    p.add_argument("--repeats", type=int, default=5, help="optimiser steps timed (median shown)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--target", type=float, default=1.72e9, help="parameters to scale to")
    p.add_argument("--pcie-gbs", type=float, default=25.0, help="GB/s assumed for the two copies")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    per_tensor = HIDDEN * INTERMEDIATE
    n_tensors = max(1, round(args.millions * 1e6 / per_tensor))
    n = n_tensors * per_tensor
    weights = [torch.randn(HIDDEN, INTERMEDIATE, dtype=torch.bfloat16) for _ in range(n_tensors)]
    grads = [torch.randn_like(w) * 1e-3 for w in weights]
    masters = [w.float().requires_grad_(True) for w in weights]
    opt = torch.optim.AdamW(masters, lr=1e-5, weight_decay=0.0, fused=True)
    seconds = []
    for step in range(args.repeats + 1):  # the first step allocates AdamW's state: not timed
        start = time.perf_counter()
        with torch.no_grad():
            for master, grad in zip(masters, grads):
                master.grad = grad.float()
            opt.step()
            for weight, master in zip(weights, masters):
                weight.copy_(master)
        if step:
            seconds.append(time.perf_counter() - start)
    median = statistics.median(seconds)
    scale = args.target / n
    pcie = 2 * 2 * args.target / (args.pcie_gbs * 1e9)  # bf16 gradients down, bf16 weights up
    print(
        f"{n / 1e6:.0f}M parameters, {torch.get_num_threads()} threads: CPU part of an offloaded "
        f"step {median:.3f} s (median of {args.repeats}; min {min(seconds):.3f} s)"
    )
    print(
        f"scaled to {args.target / 1e9:.2f}B parameters: {median * scale:.1f} s on this CPU, plus "
        f"~{pcie:.2f} s for the two PCIe copies at {args.pcie_gbs:.0f} GB/s (estimate)"
    )


if __name__ == "__main__":
    main()
