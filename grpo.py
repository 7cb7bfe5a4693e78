"""grpo.py: GRPO, the reinforcement-learning step that trains both MASCOT stages.

What GRPO is (DeepSeekMath, Shao et al. 2024), in eight lines:
  1. take a prompt q and sample a *group* of G completions o_1..o_G from the current policy;
  2. score each with a reward function: R_1..R_G;
  3. advantage of completion i = how much better it did than its siblings:
     A_i = (R_i - mean(R)) / std(R); no value network, the group mean is the baseline;
  4. every token of o_i gets the same advantage A_i;
  5. per token, the ratio r = pi_theta / pi_old is clipped to [1 - eps_low, 1 + eps_high] and the
     objective is min(r A, clip(r) A), minus beta * KL(pi_theta || pi_ref) to stay near the start;
  6. average the per-token objective (which average matters: `grpo_loss`) and take a gradient step.
Stage 1 (the speakers): the prompt is a persona's card and the conversation so far, a completion is that persona's
reply, the reward comes from reward.py. Stage 2 (the director): the prompt is the conversation, a completion is a
directive ("Agent: ... / Action: ... / Tone: ..."), the reward comes from rolling the conversation forward under it
(director.py). Both hand this file token ids and one reward per completion, so one implementation serves both.

Settings and logged metrics carry TRL's GRPOConfig names (README: "Coming from TRL"). Simplified relative to
DeepSeekMath and TRL's GRPOTrainer: token-level ratios only; no dynamic sampling (a group whose rewards are all equal
gets advantage 0 and no gradient; we log their share, `zero-std`); plain data parallelism (extras/multigpu.py); full
fine-tuning of a small model instead of the paper's LoRA. We sample with models.generate from the policy, or from a
bf16 copy where bf16 is native, and log the gap (`mismatch`).

    python mascot.py train --stage 1 | 2      (train --help: every flag, with its default)
The GRPO loss hovers near zero by construction (advantages average to zero within each group):
watch the reward instead.
"""

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

import models
from plumbing.common import UserError, derive_seed, option
from plumbing.devices import autocast, release_memory
from plumbing.files import append_jsonl, read_jsonl, write_jsonl
from plumbing.parallel import OneProcess
from plumbing.runs import checkpoints, load_checkpoint, save_checkpoint

# --- The core math: pure functions -------------------------------------------------------------
# Shapes: B = completions in the (micro-)batch, C = completion width (right-padded), P = prompt
# width (left-padded), T = P + C, H = hidden size, V = vocabulary size.


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group"):
    """A_i = (R_i - mean(group)) / (std + 1e-4), std the group's ("group"), the whole batch's ("batch"),
    or no division ("none": Dr. GRPO, Liu et al. 2025: dividing up-weights groups whose rewards barely differ).

    std is the unbiased sample std (G - 1), as torch.std and TRL compute it. Example: rewards
    [1, 2, 3, 4], G = 2 -> groups [1, 2] and [3, 4], each +-0.5 / 0.7071: about [-0.707, 0.707, ...].
    rewards: (B,), each group's G completions contiguous. Returns (advantages (B,), stats): a
    group whose rewards are all equal gets exactly 0 (never NaN); stats hold "frac_zero_std" (such
    groups carry no signal), "reward" (the mean) and "reward_std" over the batch.
    """
    if rewards.dim() != 1 or group_size < 2 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be (n_groups * G,) with G >= 2; got {tuple(rewards.shape)}, G = {group_size}"
        )
    rewards = rewards.detach().float()  # (B,) constants of the loss
    grouped = rewards.view(-1, group_size)  # (n_groups, G)
    advantages = grouped - grouped.mean(dim=1, keepdim=True)  # (n_groups, G)
    if scale != "none":  # 1e-4 as TRL
        advantages = advantages / (
            (grouped.std(dim=1, keepdim=True) if scale == "group" else rewards.std()) + 1e-4
        )
    # The mean of G equal floats can differ from them in the last bit: make equal groups exactly 0.
    zero_std = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # (n_groups, 1)
    advantages = advantages.masked_fill(zero_std, 0.0)
    return advantages.view(-1), {
        "frac_reward_zero_std": zero_std.float().mean().item(),
        "reward": rewards.mean().item(),
        "reward_std": rewards.std().item(),
    }


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens of (B, C) values (0 when there is none)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


# TRL's choices of the loss denominator (grpo_loss) and of the advantages' scale (group_advantages).
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
SCALINGS = ["group", "batch", "none"]


@dataclass(frozen=True)
class LossSettings:
    """The knobs of grpo_loss; GRPOConfig.loss_settings() reads them from the flags."""

    eps_low: float = 0.2  # the ratio may fall to 1 - eps_low (PPO's clip, Schulman et al. 2017)
    eps_high: float = 0.28  # ... and rise to 1 + eps_high (DAPO's clip-higher, Yu et al. 2025)
    beta: float = 0.0  # the KL weight; 0: no reference model needed
    loss_type: str = "dapo"  # the denominator, one of LOSS_TYPES (see grpo_loss)


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, knobs=LossSettings(), normalizer=None):
    """The clipped GRPO surrogate (to minimise), per token, with an optional k3 KL penalty:

        loss_t = -min(r A_i, clip(r, 1 - eps_low, 1 + eps_high) A_i) + beta KL_t,  r = exp(logp - old_logp)
        KL_t   = exp(ref - logp) - (ref - logp) - 1   (k3, Schulman 2020: unbiased on samples of pi_theta, >= 0)
    eps_high > eps_low is DAPO's clip-higher: a rare good token may grow further before the clip
    stops it, which keeps entropy from collapsing.

    The denominator is a real choice (TRL's names): "grpo" averages each sequence's tokens, then the sequences
    (DeepSeekMath; length-biased: a token of a short reply weighs more); "dapo" sums every real token and divides by
    their number (DAPO, TRL's default); "bnpo" the same within each micro-batch; "dr_grpo" divides the sum by a
    constant, sequences x the longest allowed completion (Dr. GRPO). With gradient accumulation, pass `normalizer` =
    the whole optimiser step's total (real tokens for "dapo", sequences for "grpo", sequences x max length for
    "dr_grpo"), so the summed micro-batch gradients are exactly the full batch's.

    With one update per sampled batch (old_logps None), pi_old = pi_theta: r = 1 and the clip
    never binds, but d r / d logp = 1, so the gradient is exactly -A grad(logp) / denominator.

    logps: (B, C) under the policy (with grad); old_logps, ref_logps: (B, C) or None (beta must then be 0);
    advantages: (B,); mask: (B, C) 1 for real completion tokens; knobs: LossSettings. Returns (loss, stats)
    with "kl" (NaN without a reference), "clip_frac", "ratio_mean", "n_tokens"."""
    if knobs.loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {knobs.loss_type!r}")
    if knobs.beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (log-probs under the reference model)")
    if old_logps is None:
        old_logps = logps.detach()  # (B, C) one update per batch: pi_old is pi_theta
    mask = mask.to(logps.dtype)  # (B, C) 1.0 real, 0.0 padding
    adv = advantages.to(logps.dtype).unsqueeze(1)  # (B, 1) broadcast over tokens
    ratio = torch.exp(logps - old_logps)  # (B, C) pi_theta / pi_old
    clipped_ratio = ratio.clamp(1 - knobs.eps_low, 1 + knobs.eps_high)  # (B, C)
    # min of the two = the pessimistic one: once the ratio has moved past the clip edge in the
    # direction A rewards, the clipped branch is a constant and the gradient stops.
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # (B, C)
    kl = None
    if ref_logps is not None:
        log_ref_over_pi = ref_logps - logps  # (B, C)
        kl = torch.exp(log_ref_over_pi) - log_ref_over_pi - 1  # (B, C) k3, >= 0
        per_token = per_token + knobs.beta * kl
    loss = reduce_loss(per_token * mask, mask, knobs.loss_type, normalizer)  # padding contributes 0
    return loss, loss_stats(ratio, adv, kl, mask, knobs)


def reduce_loss(summed, mask, loss_type: str, normalizer=None):
    """The per-token losses (B, C), zero at padding, to one number, by loss_type's denominator
    (grpo_loss's docstring says why each). normalizer: the whole optimiser step's count."""
    if loss_type in ("dapo", "bnpo"):
        if normalizer is None:
            normalizer = mask.sum().clamp(min=1)  # the real tokens of this batch
        return summed.sum() / normalizer  # ()
    if loss_type == "dr_grpo":
        if normalizer is None:
            normalizer = mask.numel()  # sequences x the completion width
        return summed.sum() / normalizer
    per_seq = summed.sum(1) / mask.sum(1).clamp(min=1)  # (B,) each sequence's mean
    if normalizer is None:
        normalizer = len(per_seq)
    return per_seq.sum() / normalizer


@torch.no_grad()
def loss_stats(ratio, adv, kl, mask, knobs: LossSettings) -> dict:
    """What the step's log line shows of the loss: the KL (NaN without a reference), the share of
    tokens clipped, the mean ratio, the number of real tokens."""
    # Clipped in the binding direction, as TRL counts it: a bad token already made rare enough
    # (r < 1 - eps_low, A < 0) or a good one likely enough (r > 1 + eps_high, A > 0).
    fell = (ratio < 1 - knobs.eps_low) & (adv < 0)  # (B, C)
    rose = (ratio > 1 + knobs.eps_high) & (adv > 0)  # (B, C)
    clipped = fell | rose
    return {
        "kl": masked_mean(kl, mask).item() if kl is not None else float("nan"),
        "clip_frac": masked_mean(clipped.to(mask.dtype), mask).item(),
        "ratio_mean": masked_mean(ratio, mask).item(),
        "n_tokens": int(mask.sum().item()),
    }


# --- Log-probs of completions under a causal LM -------------------------------------------------
def completion_hidden(model, ids, mask, positions, P: int):
    """The final hidden states that predict the completion tokens, (B, C, H); ids, mask, positions: (B, P + C).

    GRPO's G completions of a group share their prompt, so each DISTINCT prompt runs through the body once
    with its completions packed after it in ONE sequence, [prompt, reply 1, ..., reply G]: a reply's positions
    continue from the prompt's end, and a mask lets its tokens see the prompt and the earlier tokens of their
    own reply only, exactly what they would see in their own row. So states and gradients are the plain path's
    (up to float summation order), while the prompt's activations exist once per group: 2 x (300 + 4 x 32)
    tokens instead of 8 x 332 at our shapes: the sampler's shared prefill, for training.

    Packing replaces the model's own attention mask with ours, so it is used only where that is
    exact (`packed_mask_for`); elsewhere each row runs on its own (`unpacked_hidden`)."""
    C = ids.shape[1] - P
    seq_ids, seq_pos, who, rows = pack_groups(ids, mask, positions, P)  # (U, L) each
    packed_mask = packed_mask_for(model, who)
    if packed_mask is None:
        return unpacked_hidden(model, ids, mask, positions, P)
    hidden = model.get_decoder()(
        input_ids=seq_ids,
        position_ids=seq_pos,
        attention_mask=packed_mask,  # (U, 1, L, L): one head dimension
        use_cache=False,
    ).last_hidden_state  # (U, L, H)
    return unpack_completions(hidden, rows, len(ids), C)  # (B, C, H)


def packed_mask_for(model, who: torch.Tensor):
    """The packed sequences' 4D mask in the form the model's attention honours, or None where a
    custom mask would be wrong. transformers hands a 4D mask to the attention unchanged: SDPA reads a
    boolean mask as allowed / not allowed, but eager attention ADDS the mask to its scores, so there
    it must be 0 / -inf-like (a boolean one would mask nothing). None: another attention kernel (flash
    attention takes no 4D mask), or a sliding window shorter than the packed sequence (our mask
    would override the window; Gemma 2 and 3 alternate window layers with full ones)."""
    config = model.config
    impl = getattr(config, "_attn_implementation", "eager")
    if impl not in ("sdpa", "eager"):
        return None
    if sliding_window_of(config) and who.shape[1] > sliding_window_of(config):
        return None
    allowed = packed_attention(who)[:, None]  # (U, 1, L, L) boolean
    if impl == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    additive = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)  # (U, 1, L, L) 0 or min


def sliding_window_of(config) -> int | None:
    """The attention window of a model whose layers (some or all) attend locally, else None. Newer
    configs list each layer's kind (layer_types); older ones switch windows with use_sliding_window."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if "sliding_attention" in layer_types else None
    return window if getattr(config, "use_sliding_window", True) else None


def unpacked_hidden(model, ids, mask, positions, P: int):
    """(B, C, H) the plain way: every row through the body on its own, the model building its own
    causal, padding and sliding-window masks from the 2-D mask; the state at position t predicts
    token t + 1."""
    hidden = model.get_decoder()(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False
    ).last_hidden_state  # (B, P + C, H)
    return hidden[:, P - 1 : -1]  # (B, C, H)


def left_pad_1d(x: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """A 1-D tensor padded on the left with `value` to `width`."""
    return torch.cat([x.new_full((width - len(x),), value), x])


def pack_groups(ids, mask, positions, P: int):
    """One packed sequence per distinct prompt: its real prompt tokens, then each of its replies.
    Returns (tokens, positions, owner), each (U, L) and left-padded, and the rows of each sequence:
    owner is -2 on padding, -1 on the prompt, j on the tokens of the sequence's j-th reply."""
    B, C = len(ids), ids.shape[1] - P
    first, index = models.distinct_rows(torch.cat([ids[:, :P], mask[:, :P]], 1).tolist())
    seqs, pos, owner, rows = [], [], [], []
    for u, f in enumerate(first):
        mine = [b for b in range(B) if index[b] == u]  # the rows that answer this prompt
        real = mask[f, :P].bool()  # the prompt without its left padding
        seqs.append(torch.cat([ids[f, :P][real], ids[mine, P:].reshape(-1)]))
        pos.append(torch.cat([positions[f, :P][real], positions[mine, P:].reshape(-1)]))
        prompt_owner = torch.full((int(real.sum()),), -1)
        reply_owner = torch.arange(len(mine)).repeat_interleave(C)
        owner.append(torch.cat([prompt_owner, reply_owner]))
        rows.append(mine)
    L = max(len(x) for x in seqs)  # left-pad the packed sequences to one width
    seq_ids = torch.stack([left_pad_1d(x, L, 0) for x in seqs]).to(ids.device)  # (U, L)
    seq_pos = torch.stack([left_pad_1d(x, L, 0) for x in pos]).to(ids.device)  # (U, L)
    who = torch.stack([left_pad_1d(x, L, -2) for x in owner]).to(ids.device)  # (U, L)
    return seq_ids, seq_pos, who, rows


def packed_attention(who: torch.Tensor) -> torch.Tensor:
    """(U, L, L) boolean: may the query token (row) see the key token (column)? Causal, never padding,
    and a reply's token sees the prompt and its own reply only, never a sibling reply."""
    L = who.shape[1]
    q, k = who[:, :, None], who[:, None, :]  # (U, L, 1), (U, 1, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=who.device).tril()  # (L, L)
    allowed = causal & (k != -2) & ((k == -1) | (k == q))  # (U, L, L)
    # A padding row sees itself, so no row of the softmax is empty (that would be NaN).
    allowed |= torch.eye(L, dtype=torch.bool, device=who.device)
    return allowed


def unpack_completions(hidden, rows, B: int, C: int):
    """Back from packed (U, L, H) to one row per completion, (B, C, H): the states that PREDICT each
    reply token. The last prompt state predicts reply token 0; reply token t predicts token t + 1."""
    L = hidden.shape[1]
    out = hidden.new_empty(B, C, hidden.shape[-1])
    for u, mine in enumerate(rows):
        start = L - len(mine) * C  # where the packed replies begin
        for j, b in enumerate(mine):
            reply = start + j * C
            out[b] = torch.cat([hidden[u, start - 1 : start], hidden[u, reply : reply + C - 1]])
    return out


def completion_logprobs(
    model, input_ids, attention_mask, n_prompt: int, temperature: float = 1.0, chunk_size: int = 512
) -> torch.Tensor:
    """Log-probs (B, C) of the completion tokens, float32, with gradient, without a (B, T, V) tensor.

    The usual recipe, log_softmax(model(ids).logits), builds logits for every prompt AND completion position and a
    log-softmax copy of the same size (SmolLM2's V = 49,152: 3.2 GB per copy at B 16, T 1024). Here: the body's final
    states at the C positions that predict the completion (completion_hidden), then the LM head `chunk_size` rows at a
    time, each reduced at once to logit[target] - logsumexp(logits). Logits are divided by the sampling temperature
    (as TRL), so these are log-probs of the distribution the tokens were drawn from. Position ids count real tokens
    only, as the sampler did, so a left-padded row gets the log-probs it has unpadded. Logits are lm_head(final state),
    soft-capped where the model caps them (Gemma 2: cap x tanh(logits / cap)); `check_logprobs` refuses a model whose
    forward does something else. Values at padding are finite but meaningless: mask them.
    input_ids, attention_mask: (B, P + C), the prompt left-padded and the completion right-padded.
    """
    B, T = input_ids.shape
    P, C = n_prompt, T - n_prompt
    if not 1 <= P < T:
        raise ValueError(f"n_prompt must be in [1, {T - 1}] for input width {T}, got {P}")
    positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    hidden = completion_hidden(model, input_ids, attention_mask, positions, P)  # (B, C, H)
    hidden = hidden.reshape(B * C, -1)  # (B*C, H)
    targets = input_ids[:, P:].reshape(B * C)  # (B*C,)
    head = model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)
    out = []
    for start in range(0, B * C, chunk_size):
        logits = head(hidden[start : start + chunk_size]).float()  # (n, V)
        if cap:
            logits = cap * torch.tanh(logits / cap)  # as the model's own forward caps them
        logits = logits / temperature
        out.append(
            logits.gather(1, targets[start : start + chunk_size, None]).squeeze(1)
            - torch.logsumexp(logits, -1)
        )
    return torch.cat(out).view(B, C)  # (B, C)


def target_logprobs(model, pad_id: int, rows: list[tuple[list[int], list[int]]]):
    """((B, C) log-probs of each row's target tokens given its prompt, (B, C) mask): prompts left-padded, targets
    right-padded, so column t is the target's t-th token. For supervised targets (the director's warm start) and a
    fixed reply under several cards (the persona-ID evaluator)."""
    p_ids, p_mask = models.left_pad([p for p, _ in rows], pad_id)  # (B, P)
    c_ids = torch.full((len(rows), max(len(c) for _, c in rows)), pad_id, dtype=torch.long)
    c_mask = torch.zeros_like(c_ids)
    for r, (_, c) in enumerate(rows):
        c_ids[r, : len(c)] = torch.tensor(c, dtype=torch.long)
        c_mask[r, : len(c)] = 1
    dev = next(model.parameters()).device
    logps = completion_logprobs(
        model,
        torch.cat([p_ids, c_ids], 1).to(dev),
        torch.cat([p_mask, c_mask], 1).to(dev),
        p_ids.shape[1],
    )
    return logps, c_mask.to(dev)


def check_logprobs(model, tok) -> float:
    """Refuse, with one line, a model whose log-probabilities completion_logprobs cannot reproduce:
    two replies to one chat (so the packed path runs) scored both ways, against log_softmax of the
    model's own forward. Returns the largest gap per token (fp32: ~1e-6; bf16 weights: ~1e-2)."""
    prompt = models.chat_prompt_ids(tok, [[{"role": "user", "content": "Say something kind."}]])[0]
    replies = [tok(t, add_special_tokens=False)["input_ids"] for t in ("You did well.", "Hi.")]
    rows = [(prompt, reply) for reply in replies]
    was_training = model.training
    model.eval()
    with torch.no_grad():
        ours, mask = target_logprobs(model, tok.pad_token_id, rows)  # (2, C)
        gap = 0.0
        for r, (p, reply) in enumerate(rows):
            ids = torch.tensor([p + reply], device=mask.device)  # (1, T) one row, no padding
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)  # (T, V)
            theirs = logp[len(p) - 1 : -1].gather(1, ids[0, len(p) :, None]).squeeze(1)  # (C_r,)
            gap = max(gap, float((ours[r, : len(reply)] - theirs).abs().max()))
    model.train(was_training)
    bound = 5e-3 if next(model.parameters()).dtype == torch.float32 else 5e-2
    if gap > bound:
        raise UserError(
            f"{getattr(model.config, 'name_or_path', '') or type(model).__name__}: the trainer's "
            f"log-probabilities differ from the model's own by {gap:.3g} nats a token; "
            "grpo.completion_logprobs cannot train this architecture (its logits are not "
            "lm_head(final state), capped as config says)"
        )
    return gap


# --- Settings, and one process or several -------------------------------------------------------
@dataclass
class GRPOConfig:
    """Every GRPO setting, declared once; each `option` is also a `train` flag (`--num-generations`)."""

    seed: int  # the run's --seed; every sampling seed derives from it
    max_new_tokens: int  # the longest completion
    # TRL's GRPOConfig names (the old spellings still work); where our default differs, the comment says why.
    max_steps: int = option(20, "optimiser steps", "positive", "--steps")
    prompts_per_step: int = option(
        4, "distinct prompts (states / decision points) per step", "positive"
    )
    num_generations: int = option(
        4, "G completions per prompt; the group mean is the baseline", "at-least-2", "--group-size"
    )  # TRL 8: 4 keeps a CPU step short
    learning_rate: float = option(
        5e-6, "AdamW learning rate (full fine-tuning: keep it small)", "positive", "--lr"
    )  # TRL 1e-6: our runs are tens of steps
    beta: float = option(
        0.02, "KL weight to the reference; 0: no reference pass", "non-negative"
    )  # TRL 0.0: KL anchor
    epsilon: float = option(
        0.2, "lower clip range: the ratio may fall to 1 - epsilon", "fraction", "--eps-low"
    )
    epsilon_high: float = option(
        0.28,
        "upper clip range (DAPO clip-higher): up to 1 + epsilon_high",
        "non-negative",
        "--eps-high",
    )  # TRL: = epsilon; 0.28 as DAPO
    loss_type: str = option("dapo", "the loss denominator (grpo_loss)", list(LOSS_TYPES))
    scale_rewards: str = option(
        "group", "advantages / the group's std, the batch's or none (Dr GRPO)", SCALINGS
    )
    num_iterations: int = option(1, "optimisation passes over each sampled batch (mu)", "positive")
    micro_batch: int = option(
        8, "completions per forward/backward (gradient accumulation)", "positive"
    )
    temperature: float = option(1.0, "sampling temperature while training", "positive")
    save_steps: int = option(
        10, "checkpoint every N steps (and at the end)", "positive", "--save-every"
    )
    dump_every: int = option(5, "write the sampled completions every N steps", "positive")
    eval_every: int = option(
        0,
        "score the held-out prompts every N steps: a curve in metrics.jsonl (0: only before "
        "and after)",
        "non-negative",
    )
    # Memory and speed on a GPU; neither changes what is optimised (tests/test_grpo_tricks.py).
    autocast_bf16: bool = option(
        False, "bf16 autocast for the forward passes (GPU); weights, gradients and AdamW stay fp32"
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute activations in backward (GRPO, the reward model, the "
        "director's warm start): far less memory, ~1/5 more compute",
    )
    # Sample from a bf16 copy of the policy (mascot.py sets it from --dtype; models.SamplingCopy).
    sample_bf16: bool = False
    # Fixed choices, not flags (why: where they are used).
    warmup_steps: int = 2  # linear warm-up, then constant (lr_at)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # TRL's default
    top_p: float = 1.0  # no nucleus truncation while training: sample the policy itself
    max_bad_steps: int = 3  # consecutive non-finite steps before the run stops

    def loss_settings(self) -> LossSettings:
        """The flags grpo_loss reads (--epsilon, --epsilon-high, --beta, --loss-type)."""
        return LossSettings(self.epsilon, self.epsilon_high, self.beta, self.loss_type)


def lr_at(step: int, cfg: GRPOConfig) -> float:
    """Linear warm-up, then constant: a function of the step alone, so a resume needs no scheduler."""
    if cfg.warmup_steps <= 0:
        return cfg.learning_rate
    return cfg.learning_rate * min(1.0, (step + 1) / cfg.warmup_steps)


def sample_batch(pool: list, cfg: GRPOConfig, step: int) -> list:
    """The step's prompts, drawn with a seed from (run seed, step): a resumed run sees the same ones."""
    return random.Random(derive_seed(cfg.seed, step)).sample(
        pool, min(cfg.prompts_per_step, len(pool))
    )


@dataclass
class Task:
    """What GRPO needs from a stage; the rest of this file is the same for both. Stage 1 (the speakers,
    mascot.speaker_task): prompts are speaker prompts of conversation states, the reward is the reward
    model's. Stage 2 (the director, mascot.director_task): prompts ask for a directive, the reward comes
    from rolling the conversation forward under it (director.Rollout)."""

    # prompts(step) -> (cfg.prompts_per_step chat prompts, one item of metadata per prompt); the same
    # for the same step, so a resumed run sees what an uninterrupted one did (sample_batch).
    prompts: Callable
    # reward(meta, texts, gen) -> (one reward per completion, {name: one value per completion}); meta
    # holds each prompt's item G times, one per completion (prompt-major); the names are logged r_<name>.
    reward: Callable
    # describe(meta, texts, rewards) -> rows for out/samples/step-N.jsonl (read them: a rising reward
    # is not a result until the samples say so).
    describe: Callable | None = None
    # diagnose(meta, texts) -> {name: [0 or 1 per completion]}: the reward-hack diagnostics, logged
    # as hack_<name> beside the reward (not part of it), so a reward that rises by copying shows.
    diagnose: Callable | None = None
    # evaluate(step) -> {"reward", "se"}: the held-out check, every cfg.eval_every steps (rank 0).
    evaluate: Callable | None = None


class LogProbs(torch.nn.Module):
    """completion_logprobs as a module's forward: the one thing DistributedDataParallel wraps (DDP syncs the gradients
    of what runs through its wrapper's forward, and our forward is the body plus the chunked head, not model())."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, attn, n_prompt: int, temperature: float):
        return completion_logprobs(self.model, ids, attn, n_prompt, temperature)


@dataclass
class Learner:
    """The models and the optimiser of one GRPO run, built once by train_grpo."""

    policy: torch.nn.Module  # the model trained (fp32)
    tok: object  # its tokenizer
    optimizer: torch.optim.Optimizer  # AdamW over the policy's parameters
    ref_model: torch.nn.Module | None = None  # the KL anchor (frozen); None without a KL term
    ranks: object = field(default_factory=OneProcess)  # one process, or torchrun's (parallel.Ranks)
    sampling: models.SamplingCopy | None = None  # a bf16 copy that samples, where bf16 is native
    scorer: torch.nn.Module | None = (
        None  # what the gradient pass runs through (DDP under torchrun)
    )


# --- The update ---------------------------------------------------------------------------------
@dataclass
class UpdateBatch:
    """One sampled batch as the update reads it, on the policy's device."""

    ids: torch.Tensor  # (B, P + C) prompt (left-padded) and completion (right-padded)
    attn: torch.Tensor  # (B, P + C) 1 for real tokens
    mask: torch.Tensor  # (B, C) 1 for the completion tokens the loss counts
    advantages: torch.Tensor  # (B,)
    sampler_logprobs: torch.Tensor  # (B, C) what the sampler computed for its own tokens
    n_prompt: int  # P
    old: torch.Tensor | None = None  # (B, C) log-probs before this batch's first update, if needed
    ref: torch.Tensor | None = None  # (B, C) log-probs under the reference, if beta > 0


def update_batch(gen, advantages, device) -> UpdateBatch:
    """The tensors of a models.Generation, trimmed after the longest reply, on `device`."""
    C = int(gen.completion_mask.sum(1).max().item())  # trim padding after the longest reply
    ids = torch.cat([gen.prompt_ids, gen.completion_ids[:, :C]], 1)  # (B, P + C)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask[:, :C]], 1)  # (B, P + C)
    return UpdateBatch(
        ids=ids.to(device),
        attn=attn.to(device),
        mask=gen.completion_mask[:, :C].to(device),
        advantages=advantages.to(device),
        sampler_logprobs=gen.sampler_logprobs[:, :C].to(device),
        n_prompt=gen.prompt_ids.shape[1],
    )


def micro_logps(run, batch: UpdateBatch, i: int, cfg: GRPOConfig, grad: bool):
    """Log-probs (b, C) of micro-batch rows i .. i + micro_batch under `run` (a LogProbs or its DDP)."""
    device = batch.ids.device
    rows = slice(i, i + cfg.micro_batch)
    with torch.set_grad_enabled(grad), autocast(cfg, device):
        return run(batch.ids[rows], batch.attn[rows], batch.n_prompt, cfg.temperature)


def frozen_logps(model, batch: UpdateBatch, cfg: GRPOConfig):
    """(B, C) log-probs without gradient, one micro-batch at a time."""
    run = LogProbs(model)
    starts = range(0, len(batch.ids), cfg.micro_batch)
    return torch.cat([micro_logps(run, batch, i, cfg, grad=False) for i in starts])


def step_normalizer(batch: UpdateBatch, cfg: GRPOConfig, ranks):
    """ONE denominator for the whole optimiser step (grpo_loss), summed over the ranks here (DDP syncs
    gradients, not counts), so micro-batches and processes add up to exactly the full batch's
    gradient. Returns (normalizer, real tokens in the step, micro-batches in the step)."""
    total_tokens = int(ranks.all_sum(batch.mask.sum().item()))
    sequences = int(ranks.all_sum(len(batch.ids)))
    n_micro = math.ceil(len(batch.ids) / cfg.micro_batch) * ranks.world  # equal shares per rank
    normalizers = {
        "dapo": total_tokens,
        "grpo": sequences,
        "bnpo": None,  # a mean of micro-batch means: each divides by its own tokens, then by n_micro
        "dr_grpo": sequences * cfg.max_new_tokens,
    }
    return normalizers[cfg.loss_type], total_tokens, n_micro


def accumulate_gradients(learner: Learner, batch: UpdateBatch, cfg: GRPOConfig, first_pass: bool):
    """Forward and backward every micro-batch, summing the gradients in the parameters. Returns the
    pass's loss, its token-weighted clip share and KL, and (on the first pass) the sampler-trainer
    log-prob gap per token (`mismatch`: how far the distribution sampled is from the one trained)."""
    ranks, scorer = learner.ranks, learner.scorer or LogProbs(learner.policy)
    normalizer, total_tokens, n_micro = step_normalizer(batch, cfg, ranks)
    sums = {"loss": 0.0, "clip": 0.0, "kl": 0.0, "mismatch": 0.0}
    B = len(batch.ids)
    for i in range(0, B, cfg.micro_batch):
        rows = slice(i, i + cfg.micro_batch)
        # DDP all-reduces in the last micro-batch's backward only (no_sync before it: accumulate locally).
        last = i + cfg.micro_batch >= B
        sync = contextlib.nullcontext()
        if not last and hasattr(scorer, "no_sync"):
            sync = scorer.no_sync()
        with sync:
            logps = micro_logps(scorer, batch, i, cfg, grad=True)  # (b, C)
            old = None if batch.old is None else batch.old[rows]
            ref = None if batch.ref is None else batch.ref[rows]
            loss, st = grpo_loss(
                logps,
                old,
                ref,
                batch.advantages[rows],
                batch.mask[rows],
                cfg.loss_settings(),
                normalizer,
            )
            if cfg.loss_type == "bnpo":
                loss = loss / n_micro
            # DDP AVERAGES the ranks' gradients; the denominators are already global, so x world gives their sum.
            (loss * ranks.world).backward()
        share = st["n_tokens"] / max(total_tokens, 1)  # token-weighted statistics
        sums["loss"] += loss.item()
        sums["clip"] += st["clip_frac"] * share
        sums["kl"] += st["kl"] * share
        if first_pass:
            gap = (logps.detach() - batch.sampler_logprobs[rows]).abs()  # (b, C)
            sums["mismatch"] += masked_mean(gap, batch.mask[rows]).item() * share
    return sums


def apply_update(learner: Learner, loss_sum: float, cfg: GRPOConfig):
    """Clip the gradient norm and step AdamW; never apply a NaN or inf update. Returns (norm, finite)."""
    params = learner.policy.parameters()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
    finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
    if finite:
        learner.optimizer.step()
    else:
        learner.optimizer.zero_grad(set_to_none=True)
    return grad_norm, finite


def policy_update(
    policy,
    optimizer,
    gen,
    advantages,
    cfg: GRPOConfig,
    ref_model=None,
    ranks=OneProcess(),
    scorer=None,
) -> dict:
    """`num_iterations` optimiser steps on one sampled batch (a models.Generation of B rows). scorer: what the gradient
    pass runs through, ranks.wrap(LogProbs(policy)), built once by train_grpo (None: LogProbs(policy))."""
    learner = Learner(policy, None, optimizer, ref_model, ranks, scorer=scorer)
    batch = update_batch(gen, advantages, next(policy.parameters()).device)
    models.set_gradient_checkpointing(policy, cfg.gradient_checkpointing)
    # The reference pass exists only for the KL term (none with beta 0). With one pass per batch
    # pi_old == pi_theta, so grpo_loss uses logps.detach() and the old-policy pass is skipped too.
    if cfg.beta > 0:
        batch.ref = frozen_logps(ref_model, batch, cfg)
    if cfg.num_iterations > 1:
        batch.old = frozen_logps(policy, batch, cfg)
    n = cfg.num_iterations
    out = {"loss": 0.0, "kl": None, "clip_frac": 0.0, "grad_norm": 0.0, "finite": True}
    for it in range(n):
        optimizer.zero_grad(set_to_none=True)
        sums = accumulate_gradients(learner, batch, cfg, first_pass=it == 0)
        if it == 0:
            out["logp_mismatch"] = ranks.all_sum(sums["mismatch"])
        loss_sum = ranks.all_sum(sums["loss"])  # every rank holds the whole batch's gradient
        grad_norm, finite = apply_update(learner, loss_sum, cfg)
        out["finite"] &= finite
        out["loss"] += loss_sum / n
        out["clip_frac"] += ranks.all_sum(sums["clip"]) / n
        out["grad_norm"] += grad_norm / n
        if batch.ref is not None:
            out["kl"] = (out["kl"] or 0.0) + ranks.all_sum(sums["kl"]) / n
    return out


# --- The loop -----------------------------------------------------------------------------------
def sample_group(learner: Learner, prompts: list, cfg: GRPOConfig, step: int):
    """G completions for each of this rank's prompts in ONE batched generate call (prompt-major:
    rows g*G .. g*G+G-1 answer prompt g). Each row keeps the seed it has in a one-process run:
    row r of the global batch samples with seed (run, step, r)."""
    G, mine = cfg.num_generations, learner.ranks.shard(len(prompts))
    seeds = [derive_seed(cfg.seed, step, r) for r in range(mine.start * G, mine.stop * G)]
    chats = [p for p in prompts[mine] for _ in range(G)]
    learner.policy.eval()
    sampler = learner.policy
    if learner.sampling is not None:
        learner.sampling.refresh()  # the bf16 copy takes the last update
        sampler = learner.sampling.model
    with autocast(cfg, next(learner.policy.parameters()).device):
        gen = models.generate(
            sampler, learner.tok, chats, cfg.max_new_tokens, cfg.temperature, cfg.top_p, seeds=seeds
        )
    if learner.sampling is not None:
        learner.sampling.release()
    return gen


def grpo_step(learner: Learner, task: Task, prompts: list, meta: list, cfg: GRPOConfig, step: int):
    """One GRPO step: sample G completions per prompt, score them, update once.
    Returns (stats for the log line, the Generation, the whole batch's rewards)."""
    ranks, G = learner.ranks, cfg.num_generations
    mine = ranks.shard(len(prompts))  # this rank's share of the prompts
    gen = sample_group(learner, prompts, cfg, step)
    meta = [m for m in meta[mine] for _ in range(G)]  # one per completion, as texts and rewards
    with torch.no_grad():  # a reward model must record no graph
        rewards, components = task.reward(meta, gen.texts, gen)
    diagnostics = task.diagnose(meta, gen.texts) if task.diagnose is not None else {}
    rewards = ranks.gather(rewards)  # the whole batch, for the statistics
    components = {k: ranks.gather(v) for k, v in components.items()}
    diagnostics = {k: ranks.gather(v) for k, v in diagnostics.items()}
    rewards_t = torch.tensor(rewards, dtype=torch.float32)  # (B,)
    advantages, astats = group_advantages(rewards_t, G, cfg.scale_rewards)
    for group in learner.optimizer.param_groups:
        group["lr"] = lr_at(step - 1, cfg)
    learner.policy.train()
    release_memory()  # what sampling and scoring freed, before the update's activations
    my_advantages = advantages[mine.start * G : mine.stop * G]
    ustats = policy_update(
        learner.policy,
        learner.optimizer,
        gen,
        my_advantages,
        cfg,
        learner.ref_model,
        ranks,
        learner.scorer,
    )
    learner.policy.eval()  # callers sample next, and train mode would switch HF's KV cache off
    learner.optimizer.zero_grad(set_to_none=True)  # free the gradients while the next batch samples
    release_memory()
    stats = dict(astats)
    stats.update({f"r_{k}": sum(v) / len(v) for k, v in components.items() if v})
    stats.update({f"hack_{k}": sum(v) / len(v) for k, v in diagnostics.items() if v})
    stats.update(step_stats(gen, rewards, ustats, ranks, lr_at(step - 1, cfg)))
    return stats, gen, rewards


def step_stats(gen, rewards: list, ustats: dict, ranks, lr: float) -> dict:
    """The update's numbers and the samples' lengths and entropy, under TRL's metric names."""
    tokens = ranks.all_sum(float(gen.completion_mask.sum()))
    cut_off = ranks.all_sum(float(len(gen.finished) - sum(gen.finished)))  # hit the length limit
    entropy_sum = ranks.all_sum(float((gen.sampler_entropy * gen.completion_mask).sum()))
    stats = {k: ustats[k] for k in ("loss", "kl", "grad_norm", "logp_mismatch")}
    stats["skipped"] = not ustats["finite"]
    stats["clip_ratio/region_mean"] = ustats["clip_frac"]
    stats["learning_rate"] = lr
    stats["completions/mean_length"] = tokens / len(rewards)
    stats["completions/clipped_ratio"] = cut_off / len(rewards)
    # The mean per-token entropy of the sampling distribution: falling fast = the policy collapsing.
    stats["entropy"] = entropy_sum / max(tokens, 1.0)
    return stats


def shown_or_dash(row: dict, key: str) -> str:
    """A log line's number with 4 decimals, '-' when there is none (no KL without a reference)."""
    return "-" if row.get(key) is None else format(row[key], ".4f")


def log_line(row: dict, steps: int) -> str:
    """One line per step: the reward (the curve to watch), KL, clipping, length and the rest."""
    hacks = " ".join(
        f"{k[5:]} {v:.2f}"
        for k, v in row.items()
        if k.startswith("hack_") and k != "hack_words" and v
    )
    # Stage 1: the share of replies each hack diagnostic flags; stage 2: its reward's share of clean block turns.
    shown = ""
    if any(k.startswith("hack_") for k in row):
        shown = f"hacks [{hacks or 'none'}] "
    elif "r_clean" in row:
        shown = f"clean {row['r_clean']:.2f} "
    skipped = "SKIPPED (non-finite) " if row["skipped"] else ""
    if "heldout_reward" in row:
        shown += f"held-out {row['heldout_reward']:+.3f} ±{shown_or_dash(row, 'heldout_se')} "
    return (
        f"step {row['step']:4d}/{steps} reward {row['reward']:+.3f} ±{row['reward_std']:.3f} "
        f"kl {shown_or_dash(row, 'kl')} clip {row['clip_ratio/region_mean']:.3f} "
        f"len {row['completions/mean_length']:.1f} entropy {row['entropy']:.2f} "
        f"zero-std {row['frac_reward_zero_std']:.2f} gnorm {row['grad_norm']:.2f} "
        f"mismatch {shown_or_dash(row, 'logp_mismatch')} {shown}{skipped}{row['seconds']:.1f}s"
    )


def start_or_resume(learner: Learner, out: Path, resume: bool) -> int:
    """The step to start after: 0, or the newest checkpoint's step with --resume (weights, AdamW
    moments and RNG restored; the metric lines after it dropped, they are redone)."""
    ckpt_dir, metrics_path = out / "checkpoints", out / "metrics.jsonl"
    main = learner.ranks.is_main
    if resume:
        path, start = load_checkpoint(ckpt_dir, learner.policy, learner.optimizer)
        if main:
            kept = []
            if metrics_path.exists():
                kept = [r for r in read_jsonl(metrics_path) if r["step"] <= start]
            write_jsonl(metrics_path, kept)
        print(f"resumed from {path} at step {start}", flush=True)
        return start
    if checkpoints(ckpt_dir):
        raise UserError(
            f"{ckpt_dir} holds checkpoints of an earlier run; continue it with --resume, or use a new --run"
        )
    if main and metrics_path.exists():
        metrics_path.unlink()
    return 0


MAX_WEIGHT_CHANGE = 0.5  # a step moves the weights' norm by ~lr (1e-5); by half, it broke them


def weights_norm(model) -> float:
    """The L2 norm of all the model's weights together."""
    return float(torch.sqrt(sum(p.detach().float().pow(2).sum() for p in model.parameters())))


def refuse_broken_weights(learner: Learner, row: dict, out: Path, norm_before: float) -> None:
    """Stop at once, with one line, if an applied update made a weight NaN or inf, or blew the
    weights up (--lr 1e30 leaves finite weights of 1e29, which are no model either): their norm
    moved by more than MAX_WEIGHT_CHANGE of itself in one step. The checkpoints on disk are from
    before it."""
    if row["skipped"]:
        return
    params = learner.policy.parameters()
    broken = ""
    if not all(torch.isfinite(p).all() for p in params):
        broken = "became non-finite"
    elif abs(weights_norm(learner.policy) - norm_before) > MAX_WEIGHT_CHANGE * norm_before:
        broken = f"changed by more than {MAX_WEIGHT_CHANGE:.0%} of their norm in one step"
    if broken:
        raise UserError(
            f"training stopped: the weights {broken} at step {row['step']} (lower --lr); "
            f"the checkpoints in {out / 'checkpoints'} are intact"
        )


def stop_after_bad_steps(learner: Learner, row: dict, bad: int, cfg: GRPOConfig, out: Path) -> None:
    """Stop, with one line, after max_bad_steps skipped steps in a row: a skipped step left the
    weights as they were, so they are the last good state, saved here."""
    if bad < cfg.max_bad_steps:
        return
    path = out / "checkpoints"
    if learner.ranks.is_main:
        path = save_checkpoint(path, row["step"], learner.policy, learner.tok, learner.optimizer)
    raise UserError(
        f"training stopped: {bad} non-finite steps in a row at step {row['step']} (lower --lr?); "
        f"the last good state is saved in {path}"
    )


def record_step(row: dict, task: Task, sampled: tuple, cfg: GRPOConfig, out: Path) -> None:
    """Rank 0's files: the metrics line, the log line and, every dump_every steps, the samples.
    sampled: (meta per prompt, the whole batch's texts or None, its rewards)."""
    meta, texts, rewards = sampled
    append_jsonl(out / "metrics.jsonl", row)
    print(log_line(row, cfg.max_steps), flush=True)
    if texts is not None:  # describe, like the reward, gets each prompt's meta once per completion
        per_completion = [m for m in meta for _ in range(cfg.num_generations)]
        dump = task.describe(per_completion, texts, rewards)
        write_jsonl(out / "samples" / f"step-{row['step']:06d}.jsonl", dump)


def train_grpo(
    policy,
    tok,
    task: Task,
    cfg: GRPOConfig,
    out: Path,
    ref_model=None,
    resume=False,
    ranks=OneProcess(),
) -> list[dict]:
    """Train `policy` with GRPO on `task`; used by stage 1 (speakers) and stage 2 (director).
    Writes out/metrics.jsonl (a line per step), out/samples/ and out/checkpoints/ (rank 0 only);
    returns the steps' metric rows."""
    if cfg.prompts_per_step % ranks.world:
        raise UserError(
            f"--prompts-per-step {cfg.prompts_per_step}: must be a multiple of the {ranks.world} processes"
        )
    check_logprobs(policy, tok)  # an architecture we cannot score is refused before any work
    # A bf16 policy (--offload-optimizer) trains through fp32 masters in CPU memory (models.adamw).
    optimizer = models.adamw(policy, cfg.learning_rate, cfg.weight_decay)
    learner = Learner(policy, tok, optimizer, ref_model, ranks)
    start = start_or_resume(learner, out, resume)
    learner.scorer = ranks.wrap(
        LogProbs(policy)
    )  # torchrun: DDP, which also copies rank 0's weights
    if (
        cfg.sample_bf16 and next(policy.parameters()).dtype == torch.float32
    ):  # a bf16 one samples itself
        learner.sampling = models.SamplingCopy(policy)
    rows, bad = [], 0
    for step in range(start + 1, cfg.max_steps + 1):
        t0 = time.time()
        prompts, meta = task.prompts(step)
        norm_before = weights_norm(policy)
        stats, gen, rewards = grpo_step(learner, task, prompts, meta, cfg, step)
        row = {"step": step, **stats, "seconds": time.time() - t0}
        refuse_broken_weights(learner, row, out, norm_before)
        if task.evaluate and cfg.eval_every and step % cfg.eval_every == 0 and ranks.is_main:
            held = task.evaluate(step)  # the curve to trust: prompts GRPO never trains on
            row["heldout_reward"], row["heldout_se"] = held["reward"], held["se"]
        bad = bad + 1 if row["skipped"] else 0
        rows.append(row)
        texts = None
        if task.describe is not None and step % cfg.dump_every == 0:
            texts = ranks.gather(gen.texts)
        if ranks.is_main:
            record_step(row, task, (meta, texts, rewards), cfg, out)
        stop_after_bad_steps(learner, row, bad, cfg, out)
        if ranks.is_main and (step % cfg.save_steps == 0 or step == cfg.max_steps):
            save_checkpoint(out / "checkpoints", step, policy, tok, optimizer)
    ranks.barrier()  # the last checkpoint exists before anyone goes on
    return rows
