"""plumbing/offload.py: AdamW with its fp32 state in CPU memory (skip on first reading).

`--offload-optimizer` (a `train` flag; models.adamw picks this optimiser for any bf16 model): the memory trick that lets Qwen3-1.7B's
stage 1 train on a 24 GB card without LoRA (docs/PERFORMANCE.md has the arithmetic). Full
fine-tuning with fp32 AdamW needs 16 bytes a parameter on the GPU (weights, gradients, two moments):
27.5 GB for 1.7B parameters before anything else. Here the GPU holds the policy in bf16 (2 bytes)
and its bf16 gradients (2 bytes); the fp32 master weights and AdamW's two moments (12 bytes) live in
CPU memory, the ZeRO-Offload idea (Ren et al. 2021) in plain PyTorch:
    backward on the GPU (bf16) -> gradients to the CPU (fp32) -> AdamW on the fp32 masters there
    -> masters rounded to bf16, back into the GPU's weights.
What it changes in the update: the forward and backward passes see bf16-rounded weights and give
bf16 gradients (8 significant bits instead of 24), so the gradient is noisier; the update itself is
fp32 AdamW on fp32 masters, so a small step is not lost to bf16 rounding, which is why the masters
exist (Micikevicius et al. 2018). Its cost: the gradients and the weights cross PCIe once a step
each, and AdamW runs on the CPU (bench/offload_step.py measures it). Saved models are the bf16 weights;
checkpoints also hold the fp32 masters, so a resumed run goes on exactly.
"""

import torch


class OffloadedAdamW:
    """AdamW over fp32 master copies in CPU memory of a model that trains in bf16 (on any device).
    The parts of torch.optim.AdamW the training loops use: param_groups (the learning rate is set
    there every step), zero_grad, step, state_dict and load_state_dict."""

    def __init__(self, model: torch.nn.Module, lr: float, weight_decay: float):
        self.params = [p for p in model.parameters() if p.requires_grad]
        pin = torch.cuda.is_available()  # pinned host memory copies to and from a GPU faster
        self.masters = []
        for p in self.params:
            master = p.detach().to("cpu", torch.float32, copy=True)
            self.masters.append(master.pin_memory() if pin else master)
        # fused: one kernel updates each master in place (models.adamw says why).
        self.inner = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay, fused=True)
        # The weights the forward and backward passes use, in bf16. Parameters only: buffers such as
        # RoPE's frequencies stay fp32, as a model loaded in bf16 keeps them.
        for p in self.params:
            p.data = p.data.to(torch.bfloat16)

    @property
    def param_groups(self) -> list[dict]:
        return self.inner.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """The gradients (already clipped) to the CPU in fp32, AdamW on the masters, and the
        masters back into the model's bf16 weights."""
        for p, master in zip(self.params, self.masters):
            # Over PCIe in bf16 (2 bytes a parameter), widened to fp32 on the CPU.
            master.grad = None if p.grad is None else p.grad.to("cpu").float()
        self.inner.step()
        for p, master in zip(self.params, self.masters):
            p.copy_(
                master.to(torch.bfloat16), non_blocking=True
            )  # rounded on the CPU, sent in bf16
            master.grad = None

    def state_dict(self) -> dict:
        """AdamW's state, with each parameter's fp32 master beside its moments ("master")."""
        state = self.inner.state_dict()
        for i, master in enumerate(self.masters):
            state["state"].setdefault(i, {})["master"] = master.detach()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore the moments and the masters, and the model's weights from the masters."""
        inner = {"state": {}, "param_groups": state["param_groups"]}
        for i, entry in state["state"].items():
            entry = dict(entry)
            master = entry.pop("master", None)
            if master is not None:
                self.masters[int(i)].copy_(master)
            if entry:
                inner["state"][int(i)] = entry
        self.inner.load_state_dict(inner)
        for p, master in zip(self.params, self.masters):
            p.copy_(master)
