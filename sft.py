"""sft.py: supervised fine-tuning, the plain maximum-likelihood step the project needs twice.

Where it sits in MASCOT: not a stage of the paper's method, but two of our additions use it:
  - the director's format warm start (director.py, section 5): a few steps on well-formed
    `Agent / Action / Tone` directives, so that GRPO has directives to compare at all;
  - the SFT baseline of the evaluation (the paper compares MASCOT with an SFT model).
The loss is the mean negative log-likelihood of the target tokens given the prompt, over every
target token of the batch; the prompt tokens are context only. Full fine-tuning with AdamW, like
the GRPO that follows, and log-probs through grpo.completion_logprobs, so that the prompt never
gets logits and the (B, T, V) tensor is never built.

Run: it is called by `python mascot.py train --stage 2 --director-warmup N`.
"""

from __future__ import annotations

import torch

import grpo
import models


def completion_text(tok, messages: list[dict], target: str) -> tuple[str, str]:
    """(prompt text, completion text) with the chat template's own end-of-turn after the target.

    Rendering the conversation with and without the assistant turn and taking the difference
    gives exactly the tokens the model must learn to write, end-of-turn marker included, for
    any chat template (a plain `target + eos` would be wrong for templates that add more)."""
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": target}], tokenize=False)
    if full.startswith(prompt):
        return prompt, full[len(prompt):].rstrip("\n")
    return prompt, target + (tok.eos_token or "")


def supervised_finetune(model, tok, examples: list[tuple[list[dict], str]], steps: int,
                          batch_size: int = 8, lr: float = 2e-5, log=print) -> list[float]:
    """Maximum likelihood of each target given its prompt, `steps` AdamW steps of `batch_size`
    examples (cycling). Returns the per-step loss (mean negative log-probability per target
    token), which should fall. Full fine-tuning, like the GRPO that follows."""
    if steps <= 0 or not examples:
        return []
    rows = []
    for messages, target in examples:
        prompt, completion = completion_text(tok, messages, target)
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                     tok(completion, add_special_tokens=False)["input_ids"]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        batch = [rows[(step * batch_size + j) % len(rows)] for j in range(batch_size)]
        p_ids, p_mask = models.left_pad([p for p, _ in batch], tok.pad_token_id)      # (B, P)
        width = max(len(c) for _, c in batch)
        c_ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)   # (B, C), right-padded
        c_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, c) in enumerate(batch):
            c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[r, :len(c)] = 1
        dev = next(model.parameters()).device
        logps = grpo.completion_logprobs(model, torch.cat([p_ids, c_ids], 1).to(dev),
                                         torch.cat([p_mask, c_mask], 1).to(dev), p_ids.shape[1])  # (B, C)
        mask = c_mask.to(dev).float()
        loss = -(logps * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        log(f"warm start {step + 1}/{steps}: loss {loss.item():.3f}")
    model.eval()
    return losses
