"""plumbing/devices.py: where the models run, and in which precision (skip on first reading).

check_device     --device and --dtype checked before any work
frozen_dtype     the precision of models that only run (bf16 where the device computes it natively)
native_bf16      does this CPU or GPU compute bf16 natively?
autocast         bf16 matmuls in training, fp32 master weights
release_memory   hand freed memory back to the operating system between phases
"""

import ctypes
import gc

import torch

from plumbing.common import UserError


def frozen_dtype(args) -> torch.dtype:
    """The --dtype of models that only run: auto = bf16 where native (native_bf16)."""
    if args.dtype == "auto":
        return torch.bfloat16 if native_bf16(args.device) else torch.float32
    return getattr(torch, args.dtype)


def check_device(args) -> None:
    """Refuse a --device or --dtype this machine cannot run, before any work starts."""
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda: this torch sees no CUDA device; install a CUDA build of torch or use --device cpu"
        )
    if args.dtype == "bfloat16" and not native_bf16(args.device):
        raise UserError(
            f"--dtype bfloat16: {args.device} has no native bf16 here; use --dtype auto or float32"
        )


def native_bf16(device: str | torch.device) -> bool:
    """Does this device compute bf16 natively (CUDA with bf16, a CPU with AVX512-BF16 or AMX)?
    Elsewhere bf16 matmuls are emulated and slower than fp32, so we keep fp32 there. PyTorch must also
    use its AVX-512 kernels: under ATEN_CPU_CAPABILITY=default its bf16 attention fails even with AMX."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return (
        device.type == "cpu"
        and torch.backends.cpu.get_cpu_capability().startswith("AVX512")
        and (torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    )


def release_memory() -> None:
    """Hand freed memory back to the operating system: glibc keeps what PyTorch frees in pieces the
    next phase (sampling after training, a new stage) often cannot reuse, so resident memory would
    grow towards the sum of the phases' peaks. Linux with glibc; elsewhere this does nothing."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def autocast(cfg, device: torch.device):
    """bf16 autocast with fp32 master weights: the matmuls run in bf16 while parameters, gradients
    and AdamW stay fp32 (bf16's 8 significant bits would lose an update of lr 5e-6 to a weight of
    1e-2). The log-sum-exp of completion_logprobs stays fp32."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)
