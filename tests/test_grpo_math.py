"""Tests of the GRPO core math in grpo.py: hand-computed numbers on tiny tensors, and a tiny random
Llama checked against the naive full-vocabulary log-softmax.

Run: .venv/bin/python -m pytest -q tests/test_grpo_math.py
"""

import math

import pytest
import torch
import torch.nn.functional as F

import grpo

# The hand-computed losses below sum at most 6 per-token terms (their sizes add up to ~7), whose
# inputs went through a log and an exp (a rounding each). A sum of n fp32 terms may be off by
# ~n * 2^-24 of the sum of their sizes, in an order that depends on the CPU's vector kernels:
# 6 * 2^-24 * 7 ~ 2.5e-6 at worst, so they are checked to 1e-5 (we see ~1e-7).
HAND_TOL = 1e-5


# ------------------------------------------------------------------------------------------
# group_advantages
# ------------------------------------------------------------------------------------------


def test_group_advantages_hand_example():
    # groups [1, 2] and [3, 4]: means 1.5 and 3.5, deviations -0.5, +0.5.
    # unbiased std of [1, 2] = sqrt((0.25 + 0.25) / (2 - 1)) = sqrt(0.5) = 0.707107
    # A = 0.5 / (0.707107 + 0.0001) = 0.707007 (the biased std 0.5 would give 0.9998 instead)
    adv, stats = grpo.group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), group_size=2)
    assert torch.allclose(adv, torch.tensor([-0.707007, 0.707007, -0.707007, 0.707007]), atol=1e-6)
    assert stats["frac_reward_zero_std"] == 0.0
    assert stats["reward"] == pytest.approx(2.5)
    # unbiased std of [1, 2, 3, 4] = sqrt((2.25 + 0.25 + 0.25 + 2.25) / 3) = sqrt(5/3) = 1.290994
    assert stats["reward_std"] == pytest.approx(1.290994, abs=1e-6)


def test_group_advantages_zero_variance_group_is_exactly_zero():
    # group 1 is all 0.9: in float32 its mean is 0.9 - 6e-8, so the plain formula would give
    # 6e-8 / (0 + 1e-4) = 6e-4, not 0. Advantages must be exactly 0.
    # group 2 = [0, 1, 2]: mean 1, unbiased std sqrt((1 + 0 + 1) / 2) = 1, A = +-1 / 1.0001
    rewards = torch.tensor([0.9, 0.9, 0.9, 0.0, 1.0, 2.0])
    adv, stats = grpo.group_advantages(rewards, group_size=3)
    assert not torch.isnan(adv).any()
    assert torch.equal(adv[:3], torch.zeros(3))
    assert torch.allclose(adv[3:], torch.tensor([-0.99990, 0.0, 0.99990]), atol=1e-5)
    assert stats["frac_reward_zero_std"] == 0.5  # 1 of 2 groups


def test_group_advantages_unscaled_dr_grpo():
    adv, _ = grpo.group_advantages(torch.tensor([1.0, 2.0, 3.0, 4.0]), group_size=2, scale="none")
    assert torch.allclose(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5]))


def test_batch_scaled_advantages_divide_by_the_batch_std():
    # rewards [1, 2, 3, 5]: group-centred [-0.5, 0.5, -1, 1]; the batch's unbiased std:
    # mean 2.75, squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75, / 3 -> sqrt 1.70783
    adv, _ = grpo.group_advantages(torch.tensor([1.0, 2.0, 3.0, 5.0]), group_size=2, scale="batch")
    expected = torch.tensor([-0.5, 0.5, -1.0, 1.0]) / (1.70783 + 1e-4)
    assert torch.allclose(adv, expected, atol=1e-4)


def test_group_advantages_bad_sizes_raise():
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.ones(5), group_size=2)  # 5 is not a multiple of 2
    with pytest.raises(ValueError):
        grpo.group_advantages(torch.ones(4), group_size=1)  # nothing to compare with


# ------------------------------------------------------------------------------------------
# grpo_loss on a hand-made B=2, C=3 batch
# ------------------------------------------------------------------------------------------
# ratios r = exp(logp - old):     row 0: [1.5, 0.5, 1.1]       A = +2.0
#                                 row 1: [0.5, 1.5, 2.0(pad)]  A = -0.5, mask [1, 1, 0]
# clip range [0.8, 1.28]. Per-token loss = -min(r A, clip(r) A):
#   row 0 tok 0: min(3.0, 2.56) = 2.56   -> -2.56   clipped (r > 1.28 and A > 0)
#   row 0 tok 1: min(1.0, 1.6)  = 1.0    -> -1.0    not clipped (r < 0.8 but A > 0)
#   row 0 tok 2: r in range     = 2.2    -> -2.2
#   row 1 tok 0: min(-0.25, -0.4) = -0.4 ->  0.4    clipped (r < 0.8 and A < 0)
#   row 1 tok 1: min(-0.75, -0.64) = -0.75 -> 0.75  not clipped (r > 1.28 but A < 0)
# "grpo": row means -5.76/3 = -1.92 and 1.15/2 = 0.575 -> (-1.92 + 0.575) / 2 = -0.6725
# "dapo": (-5.76 + 1.15) / 5 real tokens = -0.922
# clip_frac = 2/5 = 0.4; ratio_mean = (1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 5 = 1.02
#
# KL: d = ref - logp = row 0: [0, ln2, -ln2], row 1: [ln2, 0, 5(pad)]; k3 = e^d - d - 1:
#   d = 0 -> 0;  d = ln2 -> 2 - 0.693147 - 1 = 0.306853;  d = -ln2 -> 0.5 + 0.693147 - 1 = 0.193147
#   kl mean over real tokens = (0.306853 + 0.193147 + 0.306853) / 5 = 0.161371
# beta = 0.1: "grpo": row 0 (-5.76 + 0.1*0.5)/3 = -1.903333, row 1 (1.15 + 0.0306853)/2 = 0.590343
#   -> loss -0.656495;  "dapo": (-4.61 + 0.1*0.806853) / 5 = -0.905863

LOGPS = [[-1.0, -2.0, -0.5], [-0.3, -1.5, -2.5]]
RATIOS = [[1.5, 0.5, 1.1], [0.5, 1.5, 2.0]]
KL_D = [[0.0, math.log(2), -math.log(2)], [math.log(2), 0.0, 5.0]]
ADV = [2.0, -0.5]
MASK = [[1, 1, 1], [1, 1, 0]]


def hand_batch():
    logps = torch.tensor(LOGPS, requires_grad=True)  # (2, 3)
    old = torch.tensor(LOGPS) - torch.log(torch.tensor(RATIOS))  # (2, 3) so exp(logp-old)=r
    ref = torch.tensor(LOGPS) + torch.tensor(KL_D)  # (2, 3)
    return logps, old, ref, torch.tensor(ADV), torch.tensor(MASK)


@pytest.mark.parametrize("loss_type, expected", [("grpo", -0.6725), ("dapo", -0.922)])
def test_grpo_loss_hand_clipping(loss_type, expected):
    logps, old, ref, adv, mask = hand_batch()
    loss, stats = grpo.grpo_loss(
        logps, old, None, adv, mask, grpo.LossSettings(loss_type=loss_type)
    )
    assert loss.item() == pytest.approx(expected, abs=HAND_TOL)
    assert stats["clip_frac"] == pytest.approx(0.4)
    assert stats["ratio_mean"] == pytest.approx(1.02, abs=HAND_TOL)
    assert stats["n_tokens"] == 5
    assert math.isnan(stats["kl"])  # no reference given


def test_grpo_loss_clipped_tokens_get_no_gradient():
    # "dapo", d loss / d logp = -A r / 5 on the unclipped branch, 0 where the clip is active:
    #   row 0: [0 (clipped), -2*0.5/5 = -0.2, -2*1.1/5 = -0.44]
    #   row 1: [0 (clipped), 0.5*1.5/5 = 0.15, 0 (padding)]
    logps, old, _, adv, mask = hand_batch()
    loss, _ = grpo.grpo_loss(logps, old, None, adv, mask, grpo.LossSettings(loss_type="dapo"))
    loss.backward()
    assert torch.allclose(
        logps.grad, torch.tensor([[0.0, -0.2, -0.44], [0.0, 0.15, 0.0]]), atol=1e-6
    )


@pytest.mark.parametrize("loss_type, expected", [("grpo", -0.656495), ("dapo", -0.905863)])
def test_grpo_loss_hand_kl(loss_type, expected):
    logps, old, ref, adv, mask = hand_batch()
    loss, stats = grpo.grpo_loss(
        logps, old, ref, adv, mask, grpo.LossSettings(beta=0.1, loss_type=loss_type)
    )
    assert loss.item() == pytest.approx(expected, abs=1e-5)
    assert stats["kl"] == pytest.approx(0.161371, abs=1e-5)


@pytest.mark.parametrize(
    "loss_type, expected_loss, expected_grad",
    [
        # "dapo": -(2*3 + (-0.5)*2) / 5 = -1.0; grad -A/5 = [-0.4]*3 and [0.1, 0.1, 0]
        ("dapo", -1.0, [[-0.4, -0.4, -0.4], [0.1, 0.1, 0.0]]),
        # "grpo": -(2 + (-0.5)) / 2 = -0.75; grad -A/(n_i * B) = -2/6 = -1/3 and 0.5/4 = 0.125
        ("grpo", -0.75, [[-1 / 3, -1 / 3, -1 / 3], [0.125, 0.125, 0.0]]),
        # "dr_grpo": -(2*3 + (-0.5)*2) / (B*C = 6) = -5/6; grad -A/6 = [-1/3]*3 and [1/12, 1/12, 0]
        ("dr_grpo", -5 / 6, [[-1 / 3, -1 / 3, -1 / 3], [1 / 12, 1 / 12, 0.0]]),
        # "bnpo": the token mean of this (micro-)batch: "dapo" when the batch is the whole step
        ("bnpo", -1.0, [[-0.4, -0.4, -0.4], [0.1, 0.1, 0.0]]),
    ],
)
def test_ratio_is_one_but_gradient_is_policy_gradient(loss_type, expected_loss, expected_grad):
    logps, _, _, adv, mask = hand_batch()
    loss, stats = grpo.grpo_loss(
        logps, None, None, adv, mask, grpo.LossSettings(loss_type=loss_type)
    )
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0
    assert loss.item() == pytest.approx(expected_loss, abs=HAND_TOL)
    loss.backward()
    assert torch.allclose(logps.grad, torch.tensor(expected_grad), atol=1e-6)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_masked_tokens_get_exactly_zero_gradient(loss_type):
    logps, old, ref, adv, mask = hand_batch()  # pad token: ratio 2, d = 5
    loss, _ = grpo.grpo_loss(
        logps, old, ref, adv, mask, grpo.LossSettings(beta=0.1, loss_type=loss_type)
    )
    loss.backward()
    assert logps.grad[1, 2].item() == 0.0
    assert (logps.grad[mask.bool()] != 0).any()


def test_grpo_loss_rejects_bad_arguments():
    logps, old, _, adv, mask = hand_batch()
    with pytest.raises(ValueError):
        grpo.grpo_loss(
            logps, old, None, adv, mask, grpo.LossSettings(beta=0.1)
        )  # KL without a reference
    with pytest.raises(ValueError):
        grpo.grpo_loss(logps, old, None, adv, mask, grpo.LossSettings(loss_type="ppo"))


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_gradient_accumulation_matches_full_batch(loss_type):
    g = torch.Generator().manual_seed(0)
    B, C = 4, 5
    base = -torch.rand(B, C, generator=g) * 3  # (4, 5) log-probs
    old = base + 0.3 * torch.randn(B, C, generator=g)  # ratios away from 1: clips bind
    ref = base + 0.3 * torch.randn(B, C, generator=g)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.2])
    # micro-batch 1 (rows 0-1) has 9 real tokens, micro-batch 2 (rows 2-3) only 3
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    knobs = grpo.LossSettings(beta=0.05, loss_type=loss_type)

    full = base.clone().requires_grad_(True)
    grpo.grpo_loss(full, old, ref, adv, mask, knobs)[0].backward()

    total = int(mask.sum()) if loss_type == "dapo" else B  # 12 tokens, or 4 sequences
    micro = base.clone().requires_grad_(True)
    naive = base.clone().requires_grad_(True)
    for rows in (slice(0, 2), slice(2, 4)):
        args = (old[rows], ref[rows], adv[rows], mask[rows])
        grpo.grpo_loss(micro[rows], *args, knobs, normalizer=total)[0].backward()
        # the naive way: each micro-batch averaged on its own, then averaged over 2 micro-batches
        (grpo.grpo_loss(naive[rows], *args, knobs)[0] / 2).backward()
    # Each token's gradient is computed on its own (the loss is a sum, so no sum is reordered by
    # the split): equal up to a rounding of values below 1.
    assert torch.allclose(micro.grad, full.grad, atol=1e-7)
    if loss_type == "dapo":  # 9 vs 3 tokens: per-micro-batch means weigh tokens unequally
        assert not torch.allclose(naive.grad, full.grad, atol=1e-4)


# ------------------------------------------------------------------------------------------
# completion_logprobs on a tiny random Llama
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=101,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


def left_padded_batch():
    """3 rows: prompts of 5, 3, 4 tokens left-padded to P=5; completions of 4, 3, 4 tokens
    right-padded to C=4. Returns input_ids (3, 9), attention_mask (3, 9), P."""
    g = torch.Generator().manual_seed(1)
    P, C = 5, 4
    prompt_lens, completion_lens = [5, 3, 4], [4, 3, 4]
    ids = torch.randint(1, 101, (3, P + C), generator=g)
    mask = torch.ones(3, P + C, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, completion_lens)):
        mask[i, : P - p] = 0  # left padding of the prompt
        mask[i, P + c :] = 0  # right padding of the reply
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask, P


def naive_logprobs(model, ids, mask, P, position_ids="from_mask", temperature=1.0):
    """The textbook way: full logits (B, T, V), full log-softmax, gather."""
    if position_ids == "from_mask":
        position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits
    logp_all = F.log_softmax(logits[:, P - 1 : -1].float() / temperature, dim=-1)  # (B, C, V)
    return logp_all.gather(2, ids[:, P:, None]).squeeze(2)  # (B, C)


# Log-probs of ~-4.6 by two routes agree to fp32 rounding: the logits are 32-term dot products
# (32 * 2^-24 of |logit| ~ 1) and the normaliser a sum of V = 101 exponentials (101 * 2^-24):
# under 1e-5 even at worst, whatever order a CPU adds them in.
@pytest.mark.parametrize("chunk_size", [1, 5, 7, 512])
def test_completion_logprobs_match_naive(tiny_llama, chunk_size):
    ids, mask, P = left_padded_batch()
    with torch.no_grad():
        expected = naive_logprobs(tiny_llama, ids, mask, P)
        logps = grpo.completion_logprobs(tiny_llama, ids, mask, P, chunk_size=chunk_size)
    assert logps.shape == (3, 4)
    assert torch.allclose(logps, expected, atol=1e-5)


def test_completion_logprobs_temperature(tiny_llama):
    ids, mask, P = left_padded_batch()
    with torch.no_grad():
        expected = naive_logprobs(tiny_llama, ids, mask, P, temperature=0.7)
        logps = grpo.completion_logprobs(tiny_llama, ids, mask, P, chunk_size=4, temperature=0.7)
    assert torch.allclose(logps, expected, atol=1e-5)


def padded_and_alone(seed):
    """The same 3-token prompt + 4-token completion, once alone (1, 7) with P=3, and once
    left-padded by 3 in a batch (2, 10) with P=6 beside a row that has a 6-token prompt."""
    g = torch.Generator().manual_seed(seed)
    prompt, completion = (
        torch.randint(1, 101, (3,), generator=g),
        torch.randint(1, 101, (4,), generator=g),
    )
    other = torch.randint(1, 101, (10,), generator=g)
    alone = torch.cat([prompt, completion])[None]  # (1, 7)
    padded = torch.cat([torch.zeros(3, dtype=torch.long), prompt, completion])  # (10,)
    ids = torch.stack([padded, other])  # (2, 10)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    return alone, ids, mask


def test_left_padding_does_not_change_logprobs(tiny_llama):
    alone, ids, mask = padded_and_alone(seed=2)
    with torch.no_grad():
        reference = grpo.completion_logprobs(tiny_llama, alone, torch.ones_like(alone), 3)
        batched = grpo.completion_logprobs(tiny_llama, ids, mask, 6)
    assert torch.allclose(batched[0], reference[0], atol=1e-4)


def test_position_ids_matter_for_absolute_positions():
    # GPT-2 adds a learned embedding per absolute position: without mask-aware position ids the
    # padded row's real tokens would sit at positions 3.. instead of 0.. and change their logps.
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        vocab_size=101,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=1,
    )
    model = GPT2LMHeadModel(config).eval()
    alone, ids, mask = padded_and_alone(seed=2)
    with torch.no_grad():
        reference = grpo.completion_logprobs(model, alone, torch.ones_like(alone), 3)
        batched = grpo.completion_logprobs(model, ids, mask, 6)
        shifted = naive_logprobs(model, ids, mask, 6, position_ids=None)
    assert torch.allclose(batched[0], reference[0], atol=1e-4)
    assert not torch.allclose(shifted[0], reference[0], atol=1e-3)


def test_completion_logprobs_gradients_flow(tiny_llama):
    ids, mask, P = left_padded_batch()
    tiny_llama.zero_grad()
    logps = grpo.completion_logprobs(tiny_llama, ids, mask, P, chunk_size=5)
    assert logps.requires_grad
    (logps * mask[:, P:]).sum().backward()
    assert tiny_llama.lm_head.weight.grad.abs().sum() > 0
    assert tiny_llama.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
    assert tiny_llama.model.embed_tokens.weight.grad.abs().sum() > 0
    tiny_llama.zero_grad()


def test_completion_logprobs_rejects_empty_prompt(tiny_llama):
    ids, mask, _ = left_padded_batch()
    with pytest.raises(ValueError):
        grpo.completion_logprobs(tiny_llama, ids, mask, 0)
