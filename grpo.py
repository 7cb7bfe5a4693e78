"""GRPO: the reinforcement-learning step that trains both MASCOT stages.

What GRPO is (DeepSeekMath, Shao et al. 2024), in ten lines:
  1. Take a prompt q and sample a *group* of G completions o_1..o_G from the current policy.
  2. Score each completion with a reward function: R_1..R_G (one number per completion).
  3. Advantage of completion i = how much better it did than its siblings:
     A_i = (R_i - mean(R)) / std(R). No value network: the group mean is the baseline.
  4. Every token of o_i gets the same advantage A_i.
  5. Per token, the PPO ratio r = pi_theta(token) / pi_old(token) is clipped to
     [1 - eps_low, 1 + eps_high], and the objective is min(r * A, clip(r) * A).
  6. Optionally subtract beta * KL(pi_theta || pi_ref) to stay near the starting model.
  7. Average the per-token objective (which average matters, see `grpo_loss`) and take a
     gradient step that makes above-average completions more likely, below-average ones less.
  8. Repeat with fresh samples. Nothing else: no critic, no GAE, no reward whitening over the batch.

Where it sits in MASCOT (arXiv 2601.14230):
  - Stage 1 (speakers, Phase I): the prompt is a persona's system prompt plus the conversation so
    far; the completion is that persona's next reply; the reward is the reward-model score for
    persona fit + context fit plus a format reward. One group = G replies to the same
    (context, persona).
  - Stage 2 (director, Phase II): the speakers and the simulated user are frozen; the prompt is the
    conversation so far; the completion is a directive ("Agent: ... / Action: ... / Tone: ...");
    its reward comes from rolling the conversation forward a few turns under that directive and
    scoring the block for coherence, diversity and effective contribution. One group = G
    directives sampled at the same point of the same conversation.
  Both stages hand this file the same thing: token ids of prompt + completion, and one reward per
  completion. That is why one GRPO implementation serves both.

What this file simplifies relative to DeepSeekMath and TRL's GRPOTrainer:
  - Token-level importance ratios only (no GSPO sequence-level ratio), no entropy masking, no
    importance-sampling correction for a separate inference engine: we sample with
    sampler.generate from the policy itself or from a SamplingCopy of it, and log the gap,
    `logp_mismatch` (mean |logp_sampler - logp_trainer| per token); see bench/README.md for its size.
  - Two loss normalisations only: "grpo" (DeepSeekMath's per-sequence mean) and "dapo" (token mean
    over the batch, the default). Dr. GRPO's unscaled advantage is `scale=False`; its constant
    denominator (batch size x max length) is not offered: "dapo" already removes the length bias.
  - No DAPO dynamic sampling (re-sampling groups whose rewards are all equal). Such groups get
    advantage exactly 0 and so no policy gradient; we log their fraction (`frac_zero_std`) instead.
  - Data parallelism is plain (parallel.py, torchrun): each process samples a share of the batch and
    the gradients are summed; no sharded optimiser states, no tensor or pipeline parallelism.
  - Full fine-tuning of a small model instead of the paper's LoRA.

How to run (the training loop is below the pure functions):
    python mascot.py train --stage 1      # speakers
    python mascot.py train --stage 2      # director (needs the stage-1 speakers)
    python mascot.py train --help         # every flag, with its default
The GRPO loss printed while training hovers near zero: that is normal (advantages average to zero
within each group). Watch the reward mean instead.
"""

import json
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, load_model, save_file

import models
import parallel
import sampler
from data import UserError, append_jsonl, atomic_folder, derive_seed, option, read_jsonl, write_jsonl


# ---------------------------------------------------------------------------------------------
# Core math: pure functions
# ---------------------------------------------------------------------------------------------
# Shapes: B = completions in the (micro-)batch, C = completion width in tokens (right-padded),
# P = prompt width (left-padded), T = P + C, H = hidden size, V = vocabulary size.


def group_advantages(rewards, group_size, scale=True):
    """Group-relative advantages: each completion's reward compared with its own group.

    A_i = (R_i - mean(group)) / (std(group) + 1e-4)      (scale=True, DeepSeekMath / TRL)
    A_i =  R_i - mean(group)                             (scale=False, Dr. GRPO)

    std is the *unbiased* sample std (divide by G - 1), as `torch.std` and TRL compute it, so our
    numbers can be checked against TRL's. The biased std (divide by G) would only multiply every
    advantage by sqrt((G - 1) / G), a constant that the learning rate absorbs; there is no deeper
    reason to prefer one. Dr. GRPO (Liu et al. 2025) argues against dividing at all: it up-weights
    groups whose rewards barely differ (nearly solved or hopeless prompts), hence `scale=False`.

    Example: rewards [1, 2, 3, 4], group_size 2 -> groups [1, 2] and [3, 4]; each has mean +- 0.5
    and std sqrt(0.5) = 0.7071, so advantages are about [-0.7070, 0.7070, -0.7070, 0.7070].

    Args:
        rewards: (B,) float tensor, B = n_groups * group_size, each group's completions contiguous.
        group_size: G, completions sampled per prompt (>= 2: one completion has nothing to compare).
        scale: divide by the group std (True) or not (False, Dr. GRPO).

    Returns:
        advantages: (B,) float tensor, no gradient. A group whose rewards are all equal gets
            exactly 0.0 (never NaN): it says nothing about which completion was better.
        stats: dict of python floats: "frac_zero_std" (fraction of groups with all rewards
            equal: they carry no learning signal), "reward_mean", "reward_std" (over the batch).

    Raises:
        ValueError: rewards is not 1-D, group_size < 2, or B is not a multiple of group_size.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 to compare completions, got {group_size}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    rewards = rewards.detach().float()                             # (B,) rewards are constants
    grouped = rewards.view(-1, group_size)                         # (n_groups, G)
    mean = grouped.mean(dim=1, keepdim=True)                       # (n_groups, 1)
    advantages = grouped - mean                                    # (n_groups, G)
    if scale:
        std = grouped.std(dim=1, keepdim=True)                     # (n_groups, 1) unbiased, G - 1
        advantages = advantages / (std + 1e-4)                     # (n_groups, G) 1e-4 as in TRL
    # All-equal group: mean of G identical floats can differ from them in the last bit, leaving
    # a 1e-8 / 1e-4 advantage. Set it to exactly zero instead.
    zero_std = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)  # (n_groups, 1) bool
    advantages = advantages.masked_fill(zero_std, 0.0)            # (n_groups, G)
    stats = {
        "frac_zero_std": zero_std.float().mean().item(),
        "reward_mean": rewards.mean().item(),
        "reward_std": rewards.std().item(),                        # unbiased, like the groups
    }
    return advantages.view(-1), stats                              # (B,)


def sequence_mean(values, mask):
    """Mean of each row over its real tokens.

    Args:
        values: (B, C) per-token values.
        mask: (B, C) 1 for real completion tokens, 0 for padding.

    Returns:
        (B,) per-sequence means; a row with no real token gives 0 (its sum is 0, divided by 1).
    """
    mask = mask.to(values.dtype)                                   # (B, C)
    return (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B,)


def masked_mean(values, mask):
    """Mean over all real tokens of the batch (every token weighs the same).

    Args:
        values: (B, C) per-token values.
        mask: (B, C) 1 for real completion tokens, 0 for padding.

    Returns:
        0-dim tensor; 0 if the batch has no real token.
    """
    mask = mask.to(values.dtype)                                   # (B, C)
    return (values * mask).sum() / mask.sum().clamp(min=1)         # ()


def grpo_loss(logps, old_logps, ref_logps, advantages, mask, eps_low=0.2, eps_high=0.28,
              beta=0.0, loss_type="dapo", normalizer=None):
    """Clipped GRPO surrogate loss (to minimise), per token, with an optional k3 KL penalty.

    Per real token t of completion i, with r = exp(logp - old_logp):
        loss_t = -min(r * A_i, clip(r, 1 - eps_low, 1 + eps_high) * A_i) + beta * KL_t
        KL_t   = exp(ref - logp) - (ref - logp) - 1      (k3 estimator, Schulman 2020:
                 unbiased for KL(pi_theta || pi_ref) on samples from pi_theta, and >= 0 always)
    eps_high > eps_low is DAPO's "clip-higher": a rare token with positive advantage may grow
    further before the clip stops it, which keeps exploration (entropy) from collapsing.

    Averaging (the denominator is a real design choice):
        "grpo": mean over each sequence's real tokens, then mean over sequences (DeepSeekMath).
            Length-biased: a token of a 10-token reply weighs 10x a token of a 100-token reply.
            For A > 0 short replies are pushed up harder; for A < 0 a long bad reply is pushed
            down only weakly per token, so wrong answers drift longer (Dr. GRPO, Liu et al. 2025).
        "dapo": sum over all real tokens of the batch / number of real tokens (DAPO, Yu et al.
            2025; TRL's default). Every token weighs the same, whatever its reply's length.
    normalizer: with gradient accumulation a batch is split into micro-batches whose gradients
        are summed. Dividing each micro-batch by its *own* token count would weigh tokens of
        short micro-batches more. Pass the total over the whole optimiser step instead: real
        tokens for "dapo", sequences for "grpo". Then the summed micro-batch losses equal the
        full-batch loss exactly, and so do the gradients.

    With one optimiser step per sampled batch (pass old_logps=None), pi_old = pi_theta, so r = 1
    and clipping never binds, yet d r / d logp = r = 1: the gradient is exactly the
    policy-gradient -A * grad(logp) / denominator. The ratio matters only when a batch is reused.

    Args:
        logps: (B, C) log-probs of the sampled tokens under the policy being trained (grad).
        old_logps: (B, C) log-probs under the policy that sampled them, or None: logps.detach().
        ref_logps: (B, C) log-probs under the frozen reference model, or None (then beta must be
            0 and the "kl" stat is NaN: nothing to compare against).
        advantages: (B,) one advantage per completion, from `group_advantages`.
        mask: (B, C) 1 for real completion tokens, 0 for padding after the end of the reply.
        eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] for the ratio.
        beta: weight of the KL penalty (0 = no reference model needed, as in DAPO / Dr. GRPO).
        loss_type: "dapo" or "grpo" (see above).
        normalizer: None (this batch is the whole optimiser step) or an int: total real tokens
            ("dapo") or total sequences ("grpo") over all micro-batches of the optimiser step.

    Returns:
        loss: 0-dim tensor with gradient w.r.t. logps.
        stats: dict of python floats (no gradient): "kl" (mean k3 KL per real token), "clip_frac"
            (fraction of real tokens where the clipped branch is the active one), "ratio_mean"
            (mean ratio per real token), "n_tokens" (real tokens in this micro-batch).
    """
    if loss_type not in ("dapo", "grpo"):
        raise ValueError(f"loss_type must be 'dapo' or 'grpo', got {loss_type!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (log-probs under the reference model)")
    if old_logps is None:
        old_logps = logps.detach()                                 # (B, C) num_iterations = 1
    mask = mask.to(logps.dtype)                                    # (B, C) 1.0 real, 0.0 padding
    adv = advantages.to(logps.dtype).unsqueeze(1)                  # (B, 1) broadcast over tokens

    ratio = torch.exp(logps - old_logps)                           # (B, C) pi_theta / pi_old
    clipped_ratio = ratio.clamp(1 - eps_low, 1 + eps_high)         # (B, C)
    # min of the two objectives = the pessimistic one: once the ratio has moved past the clip
    # edge in the direction A rewards, the clipped branch is a constant and the gradient stops.
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)       # (B, C)
    if ref_logps is not None:
        log_ref_over_pi = ref_logps - logps                        # (B, C) log(pi_ref / pi_theta)
        kl = torch.exp(log_ref_over_pi) - log_ref_over_pi - 1      # (B, C) k3, >= 0
        if beta != 0.0:
            per_token = per_token + beta * kl                      # (B, C)

    summed = per_token * mask                                      # (B, C) padding contributes 0
    if loss_type == "dapo":
        # denominator: real tokens of this batch, or of the whole optimiser step if given
        denom = mask.sum().clamp(min=1) if normalizer is None else normalizer
        loss = summed.sum() / denom                                # ()
    else:
        # per-sequence token mean first, then sequences: divide by this batch's B or the step's
        per_seq = summed.sum(dim=1) / mask.sum(dim=1).clamp(min=1)  # (B,)
        denom = per_seq.shape[0] if normalizer is None else normalizer
        loss = per_seq.sum() / denom                               # ()

    with torch.no_grad():
        # Clipped branch active, following TRL: the ratio is below 1 - eps_low while A < 0
        # (the model already made this bad token rarer enough) or above 1 + eps_high while A > 0
        # (already made this good token likelier enough). A ratio out of range in the other
        # direction is NOT clipped: min() keeps the unclipped branch, so the gradient flows back.
        low = (ratio < 1 - eps_low) & (adv < 0)                    # (B, C) bool
        high = (ratio > 1 + eps_high) & (adv > 0)                  # (B, C) bool
        stats = {
            "kl": masked_mean(kl, mask).item() if ref_logps is not None else float("nan"),
            "clip_frac": masked_mean((low | high).to(mask.dtype), mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "n_tokens": int(mask.sum().item()),
        }
    return loss, stats


def shared_prefix_forward(body, prefix_ids, prefix_mask, prefix_positions, index, own_ids, own_mask, own_positions):
    """Final hidden states of B rows that each begin with one of U distinct prefixes, every prefix
    run through the transformer body once: ((U, P, H) of the prefixes, (B, S, H) of the rows' own tokens).

    The prefixes run with a KV cache; index_select gives row b the keys and values of prefix
    index[b] (autograd turns that into a sum of the rows' gradients in backward); then only the
    rows' own B x S tokens run, attending to that cache. Every token attends to exactly what it
    attends to in one plain forward over the whole rows, so hidden states and gradients equal the
    plain path's up to float summation order. Used for GRPO's shared prompts (completion_hidden)
    and for a preference pair's shared conversation (reward.RewardModel.score_shared).
    prefix_*: (U, P); index: (B,) long; own_*: (B, S), own_mask 0 after a row's end.
    """
    prefix = body(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=prefix_positions, use_cache=True)
    cache = prefix.past_key_values
    cache.batch_select_indices(index)                              # (U, ...) -> (B, ...) rows
    own = body(input_ids=own_ids, attention_mask=torch.cat([prefix_mask[index], own_mask], 1),
               position_ids=own_positions, past_key_values=cache, use_cache=True).last_hidden_state  # (B, S, H)
    return prefix.last_hidden_state, own


def completion_hidden(model, input_ids, attention_mask, position_ids, n_prompt, share_prompts=True):
    """The final hidden states that predict the completion tokens, (B, C, H): positions P-1 .. T-2.

    Plain path: one forward of the transformer body over all B x (P + C) tokens, then a slice.

    Shared prompts (GRPO's case: the G completions of a group share one prompt, so a batch of
    2 prompts x G 4 holds only 2 distinct prompts): run the body over each DISTINCT prompt once,
    U x P tokens, then over the B x C completion tokens only, attending to the prompts' keys and
    values (shared_prefix_forward). Gradients reach the prompt's activations through the cache,
    so the log-probs and their gradients are the plain path's, up to float summation order
    (tests/test_grpo_tricks.py). At ~300-token prompts and ~32-token
    replies this is 2 x 300 + 8 x 32 = 856 tokens instead of 8 x 332 = 2656: the update's
    forward and backward cost about a third. The same idea as the sampler's shared prefill.

    Under activation checkpointing HF switches the cache off in training, so that case, and a
    batch whose prompts are all different, take the plain path.
    """
    body = model.get_decoder()                                     # LlamaModel: no LM head
    P = n_prompt
    first, index = sampler.distinct_rows(torch.cat([input_ids[:, :P], attention_mask[:, :P]], 1).tolist())
    checkpointing = getattr(body, "gradient_checkpointing", False) and body.training
    if not share_prompts or len(first) == input_ids.shape[0] or checkpointing:
        hidden = body(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids, use_cache=False).last_hidden_state  # (B, T, H)
        return hidden[:, P - 1:-1]                                 # (B, C, H)
    first = torch.tensor(first, device=input_ids.device)          # (U,) one row per distinct prompt
    index = torch.tensor(index, device=input_ids.device)          # (B,) each row's distinct prompt
    prompt, rest = shared_prefix_forward(body, input_ids[first, :P], attention_mask[first, :P], position_ids[first, :P],
                                         index, input_ids[:, P:], attention_mask[:, P:], position_ids[:, P:])
    last_prompt = prompt[index, -1:]                               # (B, 1, H) predicts token P
    return torch.cat([last_prompt, rest[:, :-1]], dim=1)           # (B, C, H)


def completion_logprobs(model, input_ids, attention_mask, n_prompt, chunk_size=512,
                        return_entropy=False, temperature=1.0, share_prompts=True):
    """Log-probs of the completion tokens under a HF causal LM, without a (B, T, V) tensor.

    The usual recipe, `log_softmax(model(ids).logits)` then gather, builds logits for every
    position of prompt AND completion, (B, T, V), then a log-softmax copy of the same size (and
    its float32 upcast). With SmolLM2's V = 49152, B = 16 and T = 1024 that is 805M floats,
    3.2 GB per copy. Here instead:
      1. run the transformer body (no LM head) to get final hidden states, H = 576 for
         SmolLM2-135M, each distinct prompt only once (`completion_hidden`);
      2. keep only positions P-1 .. P+C-2: the hidden state at position t predicts token t+1, so
         these C positions predict exactly the C completion tokens; the prompt needs no logits;
      3. apply the LM head to `chunk_size` rows at a time and reduce each chunk to one number
         per row: logp = logit[target] - logsumexp(logits).
    Without gradient (old / reference log-probs) the peak is one (chunk_size, V) block. With
    gradient, autograd keeps each chunk's logits for the backward pass: (B*C, V) in total, still
    only the completion positions and one copy instead of three.

    Left padding: prompts of different lengths are left-padded to width P. We pass position ids
    that count real tokens only (cumsum(mask) - 1), as HF `generate` does while sampling; a plain
    forward call would number the pads too. With rotary embeddings (Llama, SmolLM2) a uniform
    shift happens to cancel out, since RoPE attention depends only on relative offsets; with
    absolute position embeddings (GPT-2) a padded row would get different log-probs from the
    same row unpadded. Both cases are tested.

    Works for models whose logits are exactly `lm_head(final hidden state)` (Llama, SmolLM2,
    Qwen). Models that post-process logits (e.g. Gemma-2's soft-capping) would need it here too.

    Args:
        model: a HF `...ForCausalLM` model.
        input_ids: (B, P + C) left-padded prompt followed by the (right-padded) completion.
        attention_mask: (B, P + C) 1 for real tokens, 0 for padding on either side.
        n_prompt: P, the prompt width including left padding (>= 1).
        chunk_size: rows (tokens) sent through the LM head at once; trades memory for speed.
        return_entropy: also return the entropy of the next-token distribution at each position.
        temperature: the sampling temperature; logits are divided by it (as in TRL) so that the
            log-probs are those of the distribution the completions were actually drawn from.
        share_prompts: run each distinct prompt once (False: one plain forward over every row).

    Returns:
        logps: (B, C) float32 log-probs of the completion tokens, with gradient. Values at
            padding positions are finite but meaningless; mask them in the loss.
        entropy: (B, C) float32, only if return_entropy. Detached: it is a diagnostic (falling
            entropy = the policy is getting sure of itself), not part of the loss.
    """
    B, T = input_ids.shape
    P, C = n_prompt, T - n_prompt
    if not 1 <= P < T:
        raise ValueError(f"n_prompt must be in [1, {T - 1}] for input width {T}, got {P}")
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    hidden = completion_hidden(model, input_ids, attention_mask, position_ids, P,
                               share_prompts).reshape(B * C, -1)   # (B*C, H) predicts P..T-1
    targets = input_ids[:, P:].reshape(B * C)                      # (B*C,) the completion tokens
    lm_head = model.get_output_embeddings()                        # Linear H -> V

    logps, entropies = [], []
    for start in range(0, B * C, chunk_size):
        rows = slice(start, start + chunk_size)
        logits = lm_head(hidden[rows]).float() / temperature       # (n, V) n <= chunk_size
        lse = torch.logsumexp(logits, dim=-1)                      # (n,) log of the normaliser
        target_logit = logits.gather(1, targets[rows, None]).squeeze(1)  # (n,)
        logps.append(target_logit - lse)                           # (n,) log softmax at target
        if return_entropy:
            with torch.no_grad():
                probs = torch.softmax(logits, dim=-1)              # (n, V)
                # H = -sum p log p = -sum p (logit - lse) = lse - sum p * logit
                entropies.append(lse - (probs * logits).sum(dim=-1))  # (n,)
    logps = torch.cat(logps).view(B, C)                            # (B, C)
    if return_entropy:
        return logps, torch.cat(entropies).view(B, C)              # (B, C), (B, C)
    return logps


def target_logprobs(model, pad_id: int, rows: list[tuple[list[int], list[int]]]):
    """Log-probs of each row's target tokens given its prompt, (B, C), and the targets' mask, (B, C).

    Prompts left-padded (sampler.left_pad), targets right-padded, one sequence per row, so
    completion_logprobs reads exactly the target positions. Used for supervised targets (sft.py)
    and for scoring a fixed reply under several prompts (persona_id.py)."""
    p_ids, p_mask = sampler.left_pad([p for p, _ in rows], pad_id)                # (B, P)
    width = max(len(c) for _, c in rows)
    c_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)             # (B, C), right-padded
    c_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (_, c) in enumerate(rows):
        c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
        c_mask[r, :len(c)] = 1
    dev = next(model.parameters()).device
    logps = completion_logprobs(model, torch.cat([p_ids, c_ids], 1).to(dev),
                                torch.cat([p_mask, c_mask], 1).to(dev), p_ids.shape[1])  # (B, C)
    return logps, c_mask.to(dev)


# ---------------------------------------------------------------------------------------------
# The training loop: sample -> reward -> advantages -> clipped update (shared by both stages)
# ---------------------------------------------------------------------------------------------

@dataclass
class GRPOConfig:
    """Every GRPO hyper-parameter, declared once. Each `option` is also a flag of
    `mascot.py train` (`--group-size` for group_size), so this is where every default lives."""
    seed: int                       # the run's seed (--seed); sampling seeds derive from it
    max_new_tokens: int             # longest completion (--max-new-tokens)
    steps: int = option(20, "optimiser steps", "positive")
    prompts_per_step: int = option(4, "distinct prompts (states / decision points) per step", "positive")
    group_size: int = option(4, "G completions per prompt; the group mean is the baseline", "at-least-2")
    lr: float = option(5e-6, "AdamW learning rate (full fine-tuning: keep it small)", "positive")
    beta: float = option(0.02, "KL weight to the frozen reference; 0 skips the reference pass",
                         "non-negative")
    eps_low: float = option(0.2, "lower clip range: the ratio may fall to 1 - eps_low", "non-negative")
    eps_high: float = option(0.28, "upper clip range (DAPO clip-higher): up to 1 + eps_high", "non-negative")
    loss_type: str = option("dapo", "dapo: token mean over the step; grpo: per-sequence mean "
                                    "(DeepSeekMath)", ["dapo", "grpo"])
    scale_rewards: bool = option(True, "divide advantages by the group std (--no-scale-rewards: "
                                       "Dr. GRPO's unscaled advantages)")
    num_iterations: int = option(1, "optimisation passes over each sampled batch (mu)", "positive")
    micro_batch: int = option(8, "completions per forward/backward (gradient accumulation)", "positive")
    temperature: float = option(1.0, "sampling temperature while training", "positive")
    save_every: int = option(10, "checkpoint every N steps (and at the end)", "positive")
    dump_every: int = option(5, "write the sampled completions every N steps", "positive")
    # Two GPU memory/speed switches, off by default (the CPU path is plain fp32). Neither changes
    # what is optimised; tests/test_grpo_tricks.py checks each against the plain path.
    autocast_bf16: bool = option(False, "bf16 autocast for forward passes (GPU); weights, "
                                        "gradients and AdamW stay fp32")
    gradient_checkpointing: bool = option(False, "recompute activations in backward: much less "
                                                 "memory, ~1/3 more compute")
    # Sampling (sampler.generate): "ours" shares each prompt's prefill across its G rows; "hf" is
    # the fallback (HF's cache, one prefill per row). The loss always uses the fp32 policy; the
    # sampler-trainer gap is logged as `logp_mismatch`.
    sampler: str = option("ours", "ours: our KV-cache sampler with one prefill per distinct prompt; "
                                  "hf: the HF-cache fallback", ["ours", "hf"])
    sampling_copy: str = option("none", "sample from the policy itself (none) or from a copy refreshed "
                                        "every step: packed (fp32, oneDNN-packed weights, CPU) or bf16 "
                                        "(GPU, or CPUs with native bf16)", ["none", "packed", "bf16"])
    compile_decode: bool = option(False, "torch.compile the one-token decode step (GPU)")
    # Fixed choices, not flags: say why where they are used.
    warmup_steps: int = 2           # linear warm-up, then constant (lr_at)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0      # gradient clipping, as TRL's default
    top_p: float = 1.0              # no nucleus truncation while training: sample the policy itself
    max_bad_steps: int = 3          # consecutive non-finite steps before the run stops


def lr_at(step: int, cfg: GRPOConfig) -> float:
    """Linear warm-up over `warmup_steps`, then constant: a pure function of the step, so a
    resumed run needs no scheduler state beyond the step number."""
    if cfg.warmup_steps <= 0:
        return cfg.lr
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps)


def sample_seeds(cfg: GRPOConfig, step: int, n: int) -> list[int]:
    """Per-row sampling seeds derived from (run seed, step): a resumed run samples the same tokens."""
    return [derive_seed(cfg.seed, step, r) for r in range(n)]


def sample_batch(pool: list, cfg: GRPOConfig, step: int) -> list:
    """The prompts of one step: cfg.prompts_per_step items of `pool`, drawn with a seed derived
    from (run seed, step), so a resumed run sees exactly the prompts an uninterrupted one did."""
    return random.Random(derive_seed(cfg.seed, step)).sample(pool, min(cfg.prompts_per_step, len(pool)))


def autocast(cfg: GRPOConfig, device: torch.device):
    """bfloat16 autocast for forward passes when `cfg.autocast_bf16`, else a context that does nothing.

    Mixed precision with fp32 master weights: inside torch.autocast the matmuls run in bf16 (2x
    less memory traffic, tensor cores on a GPU) while the parameters themselves stay fp32, so the
    gradients arrive in fp32 and AdamW updates fp32 weights. Why not bf16 weights: bf16 keeps only
    8 significant bits, so an update of lr 5e-6 to a weight of size 1e-2 is far below its rounding
    step and would be lost. bf16 has fp32's exponent range, so unlike fp16 it needs no loss scaling.
    The price is rounding in the activations: log-probs move by up to ~1e-2 (bf16's 2^-8 relative
    step on logits of size ~1; tests/test_grpo_tricks.py measures ~1e-3 on the tiny model and
    bounds the loss change). completion_logprobs still does the log-sum-exp in fp32 (it calls
    .float() on each logits chunk).
    """
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=cfg.autocast_bf16)


def batched_logprobs(model, ids, attn, n_prompt, micro_batch, temperature=1.0):
    """Completion log-probs of a whole batch without gradient, micro-batch by micro-batch.

    Used for the reference and old-policy passes: their log-probs are constants of the loss, so no
    autograd graph is built (no stored activations, no backward), only one micro-batch at a time.
    """
    with torch.no_grad():
        return torch.cat([completion_logprobs(model, ids[i:i + micro_batch], attn[i:i + micro_batch],
                                              n_prompt, temperature=temperature) for i in range(0, ids.shape[0], micro_batch)])


def policy_update(policy, optimizer, gen, advantages, cfg: GRPOConfig, ref_model=None) -> dict:
    """One GRPO update on a sampled batch: `num_iterations` optimiser steps.

    Args:
        gen: sampler.Generation holding prompt/completion ids and masks for B = groups x G rows.
        advantages: (B,) from group_advantages.
    Returns: stats (loss, kl, clip_frac, grad_norm, finite) averaged over the passes.
    """
    # Trim padding to the longest real completion: generation may have run longer for nothing.
    C = int(gen.completion_mask.sum(1).max().item())
    ids = torch.cat([gen.prompt_ids, gen.completion_ids[:, :C]], dim=1)       # (B, P + C)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask[:, :C]], dim=1)    # (B, P + C)
    mask = gen.completion_mask[:, :C]                                         # (B, C)
    P, B = gen.prompt_ids.shape[1], ids.shape[0]
    device = next(policy.parameters()).device
    ids, attn, mask, advantages = ids.to(device), attn.to(device), mask.to(device), advantages.to(device)
    models.set_gradient_checkpointing(policy, cfg.gradient_checkpointing)
    with autocast(cfg, device):
        # The reference pass only exists for the KL term; with beta = 0 it is skipped entirely.
        ref_logps = batched_logprobs(ref_model, ids, attn, P, cfg.micro_batch, cfg.temperature) if cfg.beta > 0 else None
        # With one pass per batch pi_old == pi_theta numerically: grpo_loss uses logps.detach() for
        # old_logps (ratio 1, gradient still flows through the numerator), so we skip that pass too.
        old_logps = batched_logprobs(policy, ids, attn, P, cfg.micro_batch, cfg.temperature) if cfg.num_iterations > 1 else None
    # One denominator for the whole optimiser step, so accumulating micro-batches gives exactly
    # the gradient of the full batch: all real tokens ("dapo") or all sequences ("grpo"), summed
    # over the ranks under torchrun (parallel.py), whose gradients are then summed too.
    total_tokens = int(parallel.all_sum(mask.sum().item()))
    normalizer = total_tokens if cfg.loss_type == "dapo" else int(parallel.all_sum(B))
    sampler_logps = None if gen.sampler_logprobs is None else gen.sampler_logprobs[:, :C].to(device)
    totals = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "finite": 1.0,
              "logp_mismatch": None}
    for it in range(cfg.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, stats_sum = 0.0, {"kl": 0.0, "clip_frac": 0.0}
        for i in range(0, B, cfg.micro_batch):
            sl = slice(i, i + cfg.micro_batch)
            # Autocast wraps the forward only; backward replays the same casts by itself.
            with autocast(cfg, device):
                logps = completion_logprobs(policy, ids[sl], attn[sl], P,
                                            temperature=cfg.temperature)      # (b, C)
            loss, st = grpo_loss(logps, None if old_logps is None else old_logps[sl],
                                 None if ref_logps is None else ref_logps[sl], advantages[sl],
                                 mask[sl], cfg.eps_low, cfg.eps_high, cfg.beta, cfg.loss_type,
                                 normalizer=normalizer)
            loss.backward()
            share = st["n_tokens"] / max(total_tokens, 1)                     # token-weighted stats
            if it == 0 and sampler_logps is not None:
                # How far the sampler's distribution is from the one trained: ~1e-6 when the fp32
                # policy sampled, larger with a bf16 sampling copy (before any update of this step).
                gap = masked_mean((logps.detach() - sampler_logps[sl]).abs(), mask[sl]).item()
                totals["logp_mismatch"] = (totals["logp_mismatch"] or 0.0) + gap * share
            loss_sum += float(loss.item())
            stats_sum["kl"] += (st["kl"] * share) if ref_logps is not None else 0.0
            stats_sum["clip_frac"] += st["clip_frac"] * share
        parallel.sum_gradients(policy)                # every rank now holds the whole batch's gradient
        loss_sum = parallel.all_sum(loss_sum)
        stats_sum = {k: parallel.all_sum(v) for k, v in stats_sum.items()}
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm))
        finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
        if finite:
            optimizer.step()
        else:
            # Numerical guard: never apply a NaN/inf update; the caller counts bad steps.
            optimizer.zero_grad(set_to_none=True)
        totals["loss"] += loss_sum / cfg.num_iterations
        # KL is only measured when a reference pass ran (beta > 0); otherwise it is logged as None.
        totals["kl"] = None if ref_logps is None else totals["kl"] + stats_sum["kl"] / cfg.num_iterations
        totals["clip_frac"] += stats_sum["clip_frac"] / cfg.num_iterations
        totals["grad_norm"] += grad_norm / cfg.num_iterations
        totals["finite"] = min(totals["finite"], float(finite))
    if totals["logp_mismatch"] is not None:                  # token-weighted over the whole batch
        totals["logp_mismatch"] = parallel.all_sum(totals["logp_mismatch"])
    return totals


# ----------------------------------------------------------------------------------------------
# Checkpoints: safetensors + JSON only (no pickle), written atomically
# ----------------------------------------------------------------------------------------------

def save_checkpoint(folder: Path, step: int, policy, tokenizer, optimizer, extra: dict) -> Path:
    """Write `folder/ckpt-<step>/` atomically: model, optimiser moments, RNG state, step.

    Built under a temporary name and renamed at the end (data.atomic_folder): a crash mid-write
    leaves only a `.tmp` folder, which `latest_checkpoint` ignores. The two newest are kept.
    """
    final = folder / f"ckpt-{step:06d}"
    with atomic_folder(final) as tmp:
        policy.save_pretrained(tmp / "model")
        tokenizer.save_pretrained(tmp / "model")
        # AdamW state flattened to named tensors: "<param index>.<exp_avg|exp_avg_sq|step>".
        opt = optimizer.state_dict()
        tensors = {f"{i}.{k}": (v if torch.is_tensor(v) else torch.tensor(v)).contiguous()
                   for i, st in opt["state"].items() for k, v in st.items()}
        tensors["rng.torch"] = torch.get_rng_state()
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        meta = {"step": step, "param_groups": opt["param_groups"],
                "python_random": _jsonable(random.getstate()), "extra": extra}
        (tmp / "state.json").write_text(json.dumps(meta), encoding="utf-8")
    for old in sorted(folder.glob("ckpt-??????"))[:-2]:
        shutil.rmtree(old)
    return final


def _jsonable(obj):
    return [_jsonable(o) for o in obj] if isinstance(obj, (tuple, list)) else obj


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest COMPLETE checkpoint (renamed from .tmp), or None."""
    done = sorted(p for p in folder.glob("ckpt-??????") if (p / "state.json").exists())
    return done[-1] if done else None


def load_checkpoint(path: Path, policy, optimizer) -> dict:
    """Restore model weights, optimiser moments and RNG state in place; return state.json."""
    load_model(policy, str(path / "model" / "model.safetensors"), strict=False)
    meta = json.loads((path / "state.json").read_text(encoding="utf-8"))
    tensors = load_file(str(path / "optimizer.safetensors"))
    torch.set_rng_state(tensors.pop("rng.torch"))
    state: dict[int, dict] = {}
    for name, t in tensors.items():
        i, key = name.split(".", 1)
        state.setdefault(int(i), {})[key] = t
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    random.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in meta["python_random"]))
    return meta


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------

def grpo_step(policy, tokenizer, optimizer, prompts, meta, reward_fn, cfg: GRPOConfig, step: int,
              ref_model=None, sampling=None):
    """One GRPO step: sample G completions per prompt, score them, update the policy once.

    All G x len(prompts) completions are sampled in ONE batched `generate` call (prompt-major:
    rows g*G .. g*G+G-1 answer prompt g). bench/grpo_step.py times exactly this function.
    Under torchrun each rank takes its share of the prompts (parallel.py); the rest is the same.

    Returns:
        stats: the step's metrics row without "step" and "seconds" (train_grpo adds those).
        gen: this rank's sampled rows (all of them in one process); rewards: the whole batch's.
    """
    G = cfg.group_size
    device = next(policy.parameters()).device
    mine = parallel.shard(len(prompts))                                    # this rank's prompts
    meta = None if meta is None else meta[mine]
    rows_in = [p for p in prompts[mine] for _ in range(G)]                 # prompt-major groups
    # Each row keeps the seed it has in a one-process run: row r of the global batch, seed r.
    seeds = sample_seeds(cfg, step, len(prompts) * G)[mine.start * G:mine.stop * G]
    policy.eval()
    if sampling is not None:
        sampling.refresh()                  # a sampler.SamplingCopy: take the last update's weights
    with autocast(cfg, device):
        gen = sampler.generate(policy if sampling is None else sampling.model, tokenizer, rows_in,
                              cfg.max_new_tokens, cfg.temperature, cfg.top_p,
                              seeds=seeds, sampler=cfg.sampler,
                              compile_decode=cfg.compile_decode)
    # Rewards are constants of the loss: a reward model must never record an autograd graph.
    with torch.no_grad():
        rewards, components = reward_fn(meta, gen.texts, gen)
    # The whole batch's rewards on every rank (for the logged statistics); groups never straddle
    # ranks, so the advantages of this rank's rows are the one-process ones.
    rewards = parallel.gather(rewards)
    components = {k: parallel.gather(v) for k, v in components.items()}
    rewards_t = torch.tensor(rewards, dtype=torch.float32)                # (B_global,)
    advantages, astats = group_advantages(rewards_t, G, scale=cfg.scale_rewards)
    advantages = advantages[mine.start * G:mine.stop * G]                 # (B,) this rank's rows
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step - 1, cfg)
    policy.train()
    ustats = policy_update(policy, optimizer, gen, advantages, cfg, ref_model)
    # Back to inference mode: callers sample next, and in train mode HF's gradient checkpointing
    # would switch off the KV cache that generation relies on.
    policy.eval()
    stats = {"reward_mean": astats["reward_mean"], "reward_std": astats["reward_std"],
             "frac_zero_std": astats["frac_zero_std"],
             **{f"r_{k}": sum(v) / len(v) for k, v in components.items() if v},
             "loss": ustats["loss"], "kl": ustats["kl"], "clip_frac": ustats["clip_frac"],
             "grad_norm": ustats["grad_norm"], "skipped": not ustats["finite"],
             "logp_mismatch": ustats["logp_mismatch"],
             "length": parallel.all_sum(float(gen.completion_mask.sum())) / len(rewards),
             "lr": lr_at(step - 1, cfg)}
    return stats, gen, rewards


def train_grpo(policy, tokenizer, sample_prompts, reward_fn, cfg: GRPOConfig, out_dir: Path,
               ref_model=None, resume: bool = False, log=print, describe=None) -> list[dict]:
    """Train `policy` with GRPO. Used by stage 1 (speakers) and stage 2 (director).

    Args:
        sample_prompts(step) -> (prompts, meta): `cfg.prompts_per_step` chat prompts for this step
            (deterministic in `step`, so a resumed run sees the same data) and per-prompt metadata.
        reward_fn(meta, texts, gen) -> (rewards, components): one reward per completion (B*G,
            prompt-major: rows g*G .. g*G+G-1 belong to prompt g) and named lists of components.
        describe(meta, texts, rewards) -> list[dict]: rows for the sample dumps (optional).
    Writes out_dir/metrics.jsonl (one line per step), out_dir/samples/, out_dir/checkpoints/
    (under torchrun: rank 0 only). Returns the metrics rows of this run.
    """
    parallel.check_share(cfg.prompts_per_step)
    main = parallel.is_main()
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out_dir / "checkpoints"
    metrics_path = out_dir / "metrics.jsonl"
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if resume:
        ckpt = latest_checkpoint(ckpt_dir)
        if ckpt is None:
            raise UserError(f"--resume: no complete checkpoint in {ckpt_dir}; run without --resume")
        start = load_checkpoint(ckpt, policy, optimizer)["step"]
        # Drop metric lines of steps after the checkpoint: they are about to be redone.
        if main:
            kept = [r for r in read_jsonl(metrics_path) if r["step"] <= start] if metrics_path.exists() else []
            write_jsonl(metrics_path, kept)
        log(f"resumed from {ckpt} at step {start}")
    elif metrics_path.exists() and main:
        metrics_path.unlink()
    parallel.broadcast_parameters(policy)         # torchrun: every rank starts from rank 0's weights
    # A sampling copy is made once (after any resume) and refreshed inside every step.
    sampling = None if cfg.sampling_copy == "none" else sampler.SamplingCopy(
        policy, {"packed": torch.float32, "bf16": torch.bfloat16}[cfg.sampling_copy])
    rows, bad = [], 0
    for step in range(start + 1, cfg.steps + 1):
        t0 = time.time()
        prompts, meta = sample_prompts(step)
        stats, gen, rewards = grpo_step(policy, tokenizer, optimizer, prompts, meta, reward_fn, cfg,
                                        step, ref_model, sampling)
        row = {"step": step, **stats, "seconds": time.time() - t0}
        bad = 0 if not row["skipped"] else bad + 1
        rows.append(row)
        dump = describe is not None and step % cfg.dump_every == 0
        texts = parallel.gather(gen.texts) if dump else None                # the whole batch's replies
        if not main:
            if bad >= cfg.max_bad_steps:
                raise UserError(f"training stopped: {bad} non-finite steps in a row at step {step}")
            continue                              # rank 0 alone logs and writes
        append_jsonl(metrics_path, row)
        log(f"step {step:4d}/{cfg.steps} reward {row['reward_mean']:+.3f} ±{row['reward_std']:.3f} "
            f"kl {'-' if row['kl'] is None else format(row['kl'], '.4f')} clip {row['clip_frac']:.3f} len {row['length']:.1f} "
            f"zero-std {row['frac_zero_std']:.2f} gnorm {row['grad_norm']:.2f} "
            f"mismatch {'-' if row['logp_mismatch'] is None else format(row['logp_mismatch'], '.4f')} "
            f"{'SKIPPED (non-finite) ' if row['skipped'] else ''}{row['seconds']:.1f}s")
        if dump:
            write_jsonl(out_dir / "samples" / f"step-{step:06d}.jsonl", describe(meta, texts, rewards))
        if bad >= cfg.max_bad_steps:
            path = save_checkpoint(ckpt_dir, step, policy, tokenizer, optimizer, {"stopped": "non-finite"})
            raise UserError(f"training stopped: {bad} non-finite steps in a row at step {step} "
                            f"(lower --lr?); the last good state is saved in {path}")
        if step % cfg.save_every == 0 or step == cfg.steps:
            save_checkpoint(ckpt_dir, step, policy, tokenizer, optimizer, {})
    parallel.barrier()                            # the last checkpoint is written before anyone goes on
    return rows
