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
from dataclasses import dataclass
from pathlib import Path

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


LOSS_TYPES, SCALINGS = (
    ("dapo", "grpo", "dr_grpo", "bnpo"),
    ["group", "batch", "none"],
)  # TRL's choices


def grpo_loss(
    logps,
    old_logps,
    ref_logps,
    advantages,
    mask,
    eps_low=0.2,
    eps_high=0.28,
    beta=0.0,
    loss_type="dapo",
    normalizer=None,
):
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
    advantages: (B,); mask: (B, C) 1 for real completion tokens. Returns (loss, stats) with "kl" (NaN without a
    reference), "clip_frac", "ratio_mean", "n_tokens"."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if beta != 0.0 and ref_logps is None:
        raise ValueError("beta > 0 needs ref_logps (log-probs under the reference model)")
    old_logps = logps.detach() if old_logps is None else old_logps  # (B, C)
    mask = mask.to(logps.dtype)  # (B, C) 1.0 real, 0.0 padding
    adv = advantages.to(logps.dtype).unsqueeze(1)  # (B, 1) broadcast over tokens
    ratio = torch.exp(logps - old_logps)  # (B, C) pi_theta / pi_old
    # min of the two = the pessimistic one: once the ratio has moved past the clip edge in the
    # direction A rewards, the clipped branch is a constant and the gradient stops.
    per_token = -torch.min(ratio * adv, ratio.clamp(1 - eps_low, 1 + eps_high) * adv)  # (B, C)
    if ref_logps is not None:
        log_ref_over_pi = ref_logps - logps  # (B, C)
        kl = torch.exp(log_ref_over_pi) - log_ref_over_pi - 1  # (B, C) k3, >= 0
        per_token = per_token + beta * kl
    summed = per_token * mask  # (B, C) padding contributes 0
    if loss_type in ("dapo", "bnpo"):
        loss = summed.sum() / (mask.sum().clamp(min=1) if normalizer is None else normalizer)  # ()
    elif loss_type == "dr_grpo":
        loss = summed.sum() / (mask.numel() if normalizer is None else normalizer)
    else:
        per_seq = summed.sum(1) / mask.sum(1).clamp(min=1)  # (B,)
        loss = per_seq.sum() / (len(per_seq) if normalizer is None else normalizer)
    with torch.no_grad():
        # Clipped in the binding direction, as TRL counts it: a bad token already made rare enough
        # (r < 1 - eps_low, A < 0) or a good one likely enough (r > 1 + eps_high, A > 0).
        clipped = ((ratio < 1 - eps_low) & (adv < 0)) | ((ratio > 1 + eps_high) & (adv > 0))
        stats = {
            "kl": masked_mean(kl, mask).item() if ref_logps is not None else float("nan"),
            "clip_frac": masked_mean(clipped.to(mask.dtype), mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "n_tokens": int(mask.sum().item()),
        }
    return loss, stats


# --- Log-probs of completions under a causal LM -------------------------------------------------
def completion_hidden(model, ids, mask, positions, P: int):
    """The final hidden states that predict the completion tokens, (B, C, H); ids, mask, positions: (B, P + C).

    GRPO's G completions of a group share their prompt, so each DISTINCT prompt runs through the body once
    with its completions packed after it in ONE sequence, [prompt, reply 1, ..., reply G]: a reply's positions
    continue from the prompt's end, and a mask lets its tokens see the prompt and the earlier tokens of their
    own reply only, exactly what they would see in their own row. So states and gradients are the plain path's
    (up to float summation order), while the prompt's activations exist once per group: 2 x (300 + 4 x 32)
    tokens instead of 8 x 332 at our shapes: the sampler's shared prefill, for training."""
    B, C = len(ids), ids.shape[1] - P
    first, index = models.distinct_rows(torch.cat([ids[:, :P], mask[:, :P]], 1).tolist())
    seqs, pos, owner, rows = (
        [],
        [],
        [],
        [],
    )  # per distinct prompt: tokens, positions, reply of each token
    for u, f in enumerate(first):
        mine = [b for b in range(B) if index[b] == u]
        real = mask[f, :P].bool()  # the prompt without its left padding
        seqs.append(torch.cat([ids[f, :P][real], ids[mine, P:].reshape(-1)]))
        pos.append(torch.cat([positions[f, :P][real], positions[mine, P:].reshape(-1)]))
        owner.append(
            torch.cat(
                [torch.full((int(real.sum()),), -1), torch.arange(len(mine)).repeat_interleave(C)]
            )
        )
        rows.append(mine)
    L = max(len(x) for x in seqs)  # left-pad the packed sequences to one width
    pad = lambda x, v: torch.cat([x.new_full((L - len(x),), v), x])  # noqa: E731
    seq_ids = torch.stack([pad(x, 0) for x in seqs]).to(ids.device)  # (U, L)
    seq_pos = torch.stack([pad(x, 0) for x in pos]).to(ids.device)  # (U, L)
    who = torch.stack([pad(x, -2) for x in owner]).to(ids.device)  # (U, L) -2 pad, -1 prompt
    q, k = who[:, :, None], who[:, None, :]  # (U, L, 1), (U, 1, L)
    causal = torch.ones(L, L, dtype=torch.bool, device=ids.device).tril()  # (L, L)
    allowed = causal & (k != -2) & ((k == -1) | (k == q))  # (U, L, L)
    allowed |= torch.eye(
        L, dtype=torch.bool, device=ids.device
    )  # a padding row sees itself: no empty softmax
    hidden = model.get_decoder()(
        input_ids=seq_ids, position_ids=seq_pos, attention_mask=allowed[:, None], use_cache=False
    ).last_hidden_state  # (U, L, H)
    out = hidden.new_empty(B, C, hidden.shape[-1])
    for u, mine in enumerate(rows):
        start = L - len(mine) * C  # where the packed replies begin
        for j, b in enumerate(mine):
            reply = start + j * C
            # The last prompt state predicts reply token 0; reply token t predicts token t + 1.
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
    only, as the sampler did, so a left-padded row gets the log-probs it has unpadded. Works where logits are exactly
    lm_head(final state) (Llama, SmolLM2, Qwen). Values at padding are finite but meaningless: mask them.
    input_ids, attention_mask: (B, P + C), the prompt left-padded and the completion right-padded.
    """
    B, T = input_ids.shape
    P, C = n_prompt, T - n_prompt
    if not 1 <= P < T:
        raise ValueError(f"n_prompt must be in [1, {T - 1}] for input width {T}, got {P}")
    positions = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    hidden = completion_hidden(model, input_ids, attention_mask, positions, P).reshape(
        B * C, -1
    )  # (B*C, H)
    targets = input_ids[:, P:].reshape(B * C)  # (B*C,)
    head, out = model.get_output_embeddings(), []
    for start in range(0, B * C, chunk_size):
        logits = head(hidden[start : start + chunk_size]).float() / temperature  # (n, V)
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
        c_ids[r, : len(c)], c_mask[r, : len(c)] = torch.tensor(c, dtype=torch.long), 1
    dev = next(model.parameters()).device
    logps = completion_logprobs(
        model,
        torch.cat([p_ids, c_ids], 1).to(dev),
        torch.cat([p_mask, c_mask], 1).to(dev),
        p_ids.shape[1],
    )
    return logps, c_mask.to(dev)


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
    # Memory and speed on a GPU; neither changes what is optimised (tests/test_grpo_tricks.py).
    autocast_bf16: bool = option(
        False, "bf16 autocast for the forward passes (GPU); weights, gradients and AdamW stay fp32"
    )
    gradient_checkpointing: bool = option(
        False,
        "recompute activations in backward (GRPO, the reward model, the "
        "director's warm start): far less memory, ~1/5 more compute",
    )
    sample_bf16: bool = (
        False  # sample from a bf16 copy of the policy (mascot: --dtype; models.SamplingCopy)
    )
    # Fixed choices, not flags (why: where they are used).
    warmup_steps: int = 2  # linear warm-up, then constant (lr_at)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0  # TRL's default
    top_p: float = 1.0  # no nucleus truncation while training: sample the policy itself
    max_bad_steps: int = 3  # consecutive non-finite steps before the run stops


def lr_at(step: int, cfg: GRPOConfig) -> float:
    """Linear warm-up, then constant: a function of the step alone, so a resume needs no scheduler."""
    return (
        cfg.learning_rate * min(1.0, (step + 1) / cfg.warmup_steps)
        if cfg.warmup_steps > 0
        else cfg.learning_rate
    )


def sample_batch(pool: list, cfg: GRPOConfig, step: int) -> list:
    """The step's prompts, drawn with a seed from (run seed, step): a resumed run sees the same ones."""
    return random.Random(derive_seed(cfg.seed, step)).sample(
        pool, min(cfg.prompts_per_step, len(pool))
    )


class LogProbs(torch.nn.Module):
    """completion_logprobs as a module's forward: the one thing DistributedDataParallel wraps (DDP syncs the gradients
    of what runs through its wrapper's forward, and our forward is the body plus the chunked head, not model())."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, attn, n_prompt: int, temperature: float):
        return completion_logprobs(self.model, ids, attn, n_prompt, temperature)


# --- The update ---------------------------------------------------------------------------------
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
    C = int(gen.completion_mask.sum(1).max().item())  # trim padding after the longest reply
    device = next(policy.parameters()).device
    ids = torch.cat([gen.prompt_ids, gen.completion_ids[:, :C]], 1).to(device)  # (B, P + C)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask[:, :C]], 1).to(device)  # (B, P + C)
    mask, advantages = gen.completion_mask[:, :C].to(device), advantages.to(device)  # (B, C), (B,)
    P, B, mb = gen.prompt_ids.shape[1], len(ids), cfg.micro_batch
    models.set_gradient_checkpointing(policy, cfg.gradient_checkpointing)

    def logps_of(model, grad: bool, i: int):
        with torch.set_grad_enabled(grad), autocast(cfg, device):
            run = (scorer or LogProbs(policy)) if grad else LogProbs(model)
            return run(ids[i : i + mb], attn[i : i + mb], P, cfg.temperature)  # (b, C)

    # The reference pass exists only for the KL term (none with beta 0). With one pass per batch
    # pi_old == pi_theta, so grpo_loss uses logps.detach() and the old-policy pass is skipped too.
    ref = (
        torch.cat([logps_of(ref_model, False, i) for i in range(0, B, mb)])
        if cfg.beta > 0
        else None
    )
    old = (
        torch.cat([logps_of(policy, False, i) for i in range(0, B, mb)])
        if cfg.num_iterations > 1
        else None
    )
    # ONE denominator for the whole optimiser step, summed over the ranks here (DDP syncs gradients, not counts), so
    # micro-batches (and processes) add up to exactly the full batch's gradient ("bnpo": a mean of micro-batch means).
    total_tokens, sequences = int(ranks.all_sum(mask.sum().item())), int(ranks.all_sum(B))
    n_micro = math.ceil(B / mb) * ranks.world  # every rank holds an equal share of the batch
    normalizer = {
        "dapo": total_tokens,
        "grpo": sequences,
        "bnpo": None,
        "dr_grpo": sequences * cfg.max_new_tokens,
    }[cfg.loss_type]
    out = {
        "loss": 0.0,
        "kl": None,
        "clip_frac": 0.0,
        "grad_norm": 0.0,
        "finite": True,
        "logp_mismatch": 0.0,
    }
    for it in range(cfg.num_iterations):
        optimizer.zero_grad(set_to_none=True)
        loss_sum, kl, clip = 0.0, 0.0, 0.0
        for i in range(0, B, mb):
            # DDP all-reduces in the last micro-batch's backward only (no_sync before it: accumulate locally).
            last = i + mb >= B
            with (
                contextlib.nullcontext()
                if last or not hasattr(scorer, "no_sync")
                else scorer.no_sync()
            ):
                logps = logps_of(policy, True, i)
                loss, st = grpo_loss(
                    logps,
                    None if old is None else old[i : i + mb],
                    None if ref is None else ref[i : i + mb],
                    advantages[i : i + mb],
                    mask[i : i + mb],
                    cfg.epsilon,
                    cfg.epsilon_high,
                    cfg.beta,
                    cfg.loss_type,
                    normalizer,
                )
                loss = loss / n_micro if cfg.loss_type == "bnpo" else loss
                # DDP AVERAGES the ranks' gradients; the denominators are already global, so x world gives their sum.
                (loss * ranks.world).backward()
            share = st["n_tokens"] / max(total_tokens, 1)  # token-weighted statistics
            loss_sum, clip, kl = (
                loss_sum + loss.item(),
                clip + st["clip_frac"] * share,
                kl + st["kl"] * share,
            )
            if (
                it == 0
            ):  # how far the sampler's distribution is from the one trained (before this update)
                gap = masked_mean(
                    (logps.detach() - gen.sampler_logprobs[i : i + mb, :C].to(device)).abs(),
                    mask[i : i + mb],
                )
                out["logp_mismatch"] += gap.item() * share
        loss_sum = ranks.all_sum(loss_sum)  # every rank holds the whole batch's gradient
        grad_norm = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm))
        finite = math.isfinite(loss_sum) and math.isfinite(grad_norm)
        if finite:
            optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=True)  # never apply a NaN/inf update
        out["finite"] &= finite
        out["loss"] += loss_sum / cfg.num_iterations
        out["clip_frac"] += ranks.all_sum(clip) / cfg.num_iterations
        out["grad_norm"] += grad_norm / cfg.num_iterations
        out["kl"] = (
            None if ref is None else (out["kl"] or 0.0) + ranks.all_sum(kl) / cfg.num_iterations
        )
    out["logp_mismatch"] = ranks.all_sum(out["logp_mismatch"])
    return out


# --- The loop -----------------------------------------------------------------------------------
def grpo_step(
    policy,
    tok,
    optimizer,
    prompts,
    meta,
    reward_fn,
    cfg: GRPOConfig,
    step: int,
    ref_model=None,
    sampling=None,
    ranks=OneProcess(),
    diagnose=None,
    scorer=None,
):
    """One GRPO step: sample G completions per prompt in ONE batched generate call (prompt-major:
    rows g*G .. g*G+G-1 answer prompt g), score them, update once. Returns (stats, gen, rewards).
    diagnose(meta, texts) -> {name: [0/1 per row]}: the reward-hack diagnostics, logged as hack_<name>
    beside the reward (not part of it), so a reward that rises by copying shows in the same line."""
    G, mine = cfg.num_generations, ranks.shard(len(prompts))  # this rank's share of the prompts
    meta = [m for m in meta[mine] for _ in range(G)]  # one per completion, as texts and rewards
    # Each row keeps the seed it has in a one-process run: row r of the global batch, seed (run, step, r).
    seeds = [derive_seed(cfg.seed, step, r) for r in range(mine.start * G, mine.stop * G)]
    policy.eval()
    if sampling is not None:
        sampling.refresh()  # the bf16 copy takes the last update
    with autocast(cfg, next(policy.parameters()).device):
        gen = models.generate(
            policy if sampling is None else sampling.model,
            tok,
            [p for p in prompts[mine] for _ in range(G)],
            cfg.max_new_tokens,
            cfg.temperature,
            cfg.top_p,
            seeds=seeds,
        )
    if sampling is not None:
        sampling.release()
    with torch.no_grad():  # a reward model must record no graph
        rewards, components = reward_fn(meta, gen.texts, gen)
    diagnostics = diagnose(meta, gen.texts) if diagnose is not None else {}
    rewards = ranks.gather(rewards)  # the whole batch, for the statistics
    components = {k: ranks.gather(v) for k, v in components.items()}
    diagnostics = {k: ranks.gather(v) for k, v in diagnostics.items()}
    advantages, astats = group_advantages(
        torch.tensor(rewards, dtype=torch.float32), G, cfg.scale_rewards
    )
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step - 1, cfg)
    policy.train()
    release_memory()  # what sampling and scoring freed, before the update's activations
    ustats = policy_update(
        policy,
        optimizer,
        gen,
        advantages[mine.start * G : mine.stop * G],
        cfg,
        ref_model,
        ranks,
        scorer,
    )
    policy.eval()  # callers sample next, and train mode would switch HF's KV cache off
    optimizer.zero_grad(
        set_to_none=True
    )  # the gradients' memory is free while the next batch is sampled
    release_memory()
    stats = {
        **astats,
        **{f"r_{k}": sum(v) / len(v) for k, v in components.items() if v},
        **{f"hack_{k}": sum(v) / len(v) for k, v in diagnostics.items() if v},
        **{k: ustats[k] for k in ("loss", "kl", "grad_norm", "logp_mismatch")},
        "skipped": not ustats["finite"],
        "clip_ratio/region_mean": ustats["clip_frac"],
        "learning_rate": lr_at(step - 1, cfg),
        "completions/mean_length": ranks.all_sum(float(gen.completion_mask.sum())) / len(rewards),
        "completions/clipped_ratio": ranks.all_sum(float(len(gen.finished) - sum(gen.finished)))
        / len(rewards),
        # the mean per-token entropy of the sampling distribution: falling fast = the policy collapsing
        "entropy": ranks.all_sum(float((gen.sampler_entropy * gen.completion_mask).sum()))
        / max(ranks.all_sum(float(gen.completion_mask.sum())), 1.0),
    }
    return stats, gen, rewards


def log_line(row: dict, steps: int) -> str:
    """One line per step: the reward (the curve to watch), KL, clipping, length and the rest."""
    opt = lambda k, d=".4f": "-" if row.get(k) is None else format(row[k], d)  # noqa: E731
    hacks = " ".join(
        f"{k[5:]} {v:.2f}"
        for k, v in row.items()
        if k.startswith("hack_") and k != "hack_words" and v
    )
    # Stage 1: the share of replies each hack diagnostic flags; stage 2: its reward's share of clean block turns.
    shown = (
        f"hacks [{hacks or 'none'}] "
        if any(k.startswith("hack_") for k in row)
        else f"clean {row['r_clean']:.2f} "
        if "r_clean" in row
        else ""
    )
    return (
        f"step {row['step']:4d}/{steps} reward {row['reward']:+.3f} ±{row['reward_std']:.3f} kl {opt('kl')} "
        f"clip {row['clip_ratio/region_mean']:.3f} len {row['completions/mean_length']:.1f} entropy "
        f"{row['entropy']:.2f} zero-std {row['frac_reward_zero_std']:.2f} gnorm "
        f"{row['grad_norm']:.2f} mismatch {opt('logp_mismatch')} {shown}"
        f"{'SKIPPED (non-finite) ' if row['skipped'] else ''}{row['seconds']:.1f}s"
    )


def train_grpo(
    policy,
    tok,
    sample_prompts,
    reward_fn,
    cfg: GRPOConfig,
    out: Path,
    ref_model=None,
    resume: bool = False,
    describe=None,
    diagnose=None,
    ranks=OneProcess(),
    log=print,
) -> list[dict]:
    """Train `policy` with GRPO; used by stage 1 (speakers) and stage 2 (director).

    sample_prompts(step) -> (prompts, meta): cfg.prompts_per_step chat prompts (deterministic in step) and per-prompt
    metadata; reward_fn(meta, texts, gen) -> (rewards, components): one reward per completion (prompt-major: meta holds
    each prompt's item G times, one per completion) and named lists, logged as r_<name>; diagnose: grpo_step's;
    describe(meta, texts, rewards) -> rows for the sample dumps.
    Writes out/metrics.jsonl (a line per step), out/samples/ and out/checkpoints/ (rank 0 only)."""
    if cfg.prompts_per_step % ranks.world:
        raise UserError(
            f"--prompts-per-step {cfg.prompts_per_step}: must be a multiple of the {ranks.world} processes"
        )
    ckpt_dir, metrics_path = out / "checkpoints", out / "metrics.jsonl"
    optimizer = models.adamw(policy, cfg.learning_rate, cfg.weight_decay)
    start = 0
    if resume:
        path, start = load_checkpoint(ckpt_dir, policy, optimizer)
        if ranks.is_main:  # drop the metric lines of steps after the checkpoint: they are redone
            write_jsonl(
                metrics_path,
                [r for r in read_jsonl(metrics_path) if r["step"] <= start]
                if metrics_path.exists()
                else [],
            )
        log(f"resumed from {path} at step {start}")
    elif checkpoints(ckpt_dir):
        raise UserError(
            f"{ckpt_dir} holds checkpoints of an earlier run; continue it with --resume, or use a new --run"
        )
    elif ranks.is_main and metrics_path.exists():
        metrics_path.unlink()
    scorer = ranks.wrap(
        LogProbs(policy)
    )  # torchrun: DDP, which also gives every rank rank 0's weights
    sampling = models.SamplingCopy(policy) if cfg.sample_bf16 else None
    rows, bad = [], 0
    for step in range(start + 1, cfg.max_steps + 1):
        t0 = time.time()
        prompts, meta = sample_prompts(step)
        stats, gen, rewards = grpo_step(
            policy,
            tok,
            optimizer,
            prompts,
            meta,
            reward_fn,
            cfg,
            step,
            ref_model,
            sampling,
            ranks,
            diagnose,
            scorer,
        )
        if stats["skipped"] is False and not all(
            torch.isfinite(p).all() for p in policy.parameters()
        ):
            raise UserError(
                f"training stopped: the weights became non-finite at step {step} (lower --lr); "
                f"the checkpoints in {ckpt_dir} are intact"
            )
        row = {"step": step, **stats, "seconds": time.time() - t0}
        bad = bad + 1 if row["skipped"] else 0
        rows.append(row)
        texts = (
            ranks.gather(gen.texts) if describe is not None and step % cfg.dump_every == 0 else None
        )
        if ranks.is_main:
            append_jsonl(metrics_path, row)
            log(log_line(row, cfg.max_steps))
            if (
                texts is not None
            ):  # describe, like reward_fn, gets each prompt's meta once per completion
                dump = describe(
                    [m for m in meta for _ in range(cfg.num_generations)], texts, rewards
                )
                write_jsonl(out / "samples" / f"step-{step:06d}.jsonl", dump)
        if (
            bad >= cfg.max_bad_steps
        ):  # skipped steps left the weights as they were: the last good state
            path = (
                save_checkpoint(ckpt_dir, step, policy, tok, optimizer)
                if ranks.is_main
                else ckpt_dir
            )
            raise UserError(
                f"training stopped: {bad} non-finite steps in a row at step {step} (lower --lr?); "
                f"the last good state is saved in {path}"
            )
        if ranks.is_main and (step % cfg.save_steps == 0 or step == cfg.max_steps):
            save_checkpoint(ckpt_dir, step, policy, tok, optimizer)
    ranks.barrier()  # the last checkpoint exists before anyone goes on
    return rows
