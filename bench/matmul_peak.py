"""bench/matmul_peak.py: how many matmul FLOP/s this machine really delivers, fp32 and bf16.

Model-FLOPs utilisation (MFU) = FLOPs a step needs / (seconds x peak FLOP/s). The peak used here is
MEASURED, not a datasheet number: a large square matmul, the best kernel the machine has, timed a
few times. bench/grpo_step.py and bench/gpu_check.sh divide by it. A matmul of two n x n matrices
costs 2 n^3 FLOPs (n^3 multiply-adds).

On a shared CPU the number moves with whatever else is running, so we print the best and the
median of several timings; the best is the closest to what the hardware can do.

bf16 is measured when the device runs bf16 matmuls at all. On CPUs without native bf16 (no
AVX512-BF16 / AMX) it is emulated and slower than fp32; the number shows that too.

Run from the repo root:
    python bench/matmul_peak.py                  # CPU, fp32 and bf16
    python bench/matmul_peak.py --device cuda    # GPU
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_flops(device: str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
                 repeats: int = 7, min_seconds: float = 0.2) -> dict:
    """Time `repeats` rounds of n x n @ n x n matmuls; return FLOP/s of each round.

    Each round runs enough matmuls to last at least `min_seconds` (timer noise), after a warm-up
    that lets the library pick its kernel. Returns {"best", "median", "rounds"} in FLOP/s, or
    {"error": message} when the device cannot multiply in this dtype.
    """
    try:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        for _ in range(3):                                   # warm-up: kernel choice, caches
            a @ b
    except RuntimeError as err:
        return {"error": str(err).splitlines()[0]}
    _sync(device)
    t0 = time.perf_counter()
    a @ b
    _sync(device)
    per_call = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(min_seconds / per_call))
    rounds = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(calls):
            a @ b
        _sync(device)
        rounds.append(2 * n**3 * calls / (time.perf_counter() - t0))
    return {"best": max(rounds), "median": statistics.median(rounds), "rounds": rounds}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--n", type=int, default=0, help="matrix size (default 1024 on CPU, 8192 on GPU)")
    p.add_argument("--repeats", type=int, default=7, help="timed rounds per dtype")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.n or (8192 if args.device.startswith("cuda") else 1024)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"matmul peak on {where}, n = {n}, {args.repeats} rounds")
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        r = matmul_flops(args.device, dtype, n, args.repeats)
        if "error" in r:
            print(f"  {name}: not supported ({r['error']})")
            continue
        spread = f"{min(r['rounds']) / 1e9:.1f}..{max(r['rounds']) / 1e9:.1f}"
        print(f"  {name}: best {r['best'] / 1e9:8.1f} GFLOP/s   median {r['median'] / 1e9:8.1f}   "
              f"rounds {spread}")


if __name__ == "__main__":
    main()
