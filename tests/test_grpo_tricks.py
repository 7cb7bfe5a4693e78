"""The speed and memory tricks of grpo.policy_update change nothing they should not.

Each trick is run against the plain computation on a tiny random Llama (2 layers, SmolLM2's
49k vocabulary) and a hand-made batch of 6 completions with ragged prompts and completions:

    gradient checkpointing      same loss and gradients: it only re-runs the forward pass
    micro-batching              same loss and gradients as one big batch (the global normaliser)
    log-prob chunk size         same log-probs and gradients (the chunks are independent rows)
    beta = 0 skips the reference        same loss as computing it, and the reference never runs
    num_iterations = 1 skips the old-policy pass    same loss and gradients as computing it
    shared prompts              same loss and gradients: each distinct prompt runs once, its replies packed after it
    bf16 autocast               close, within a bound derived from bf16's precision (see the test)
    rewards                     computed without autograd

"Same" means equal up to fp32 rounding: the tricks add the same numbers in another order (other
batch shapes, micro-batch partial sums), and so do different CPUs' vector kernels (AVX2, AVX-512).
A sum of n fp32 terms may be off by ~n * 2^-24 of the sum of their sizes; here the longest sums
run over the batch's B * (P + C) = 66 token positions (FP32_SUM below), of terms no larger than
the largest gradient entry (gradients) or ~1 (the loss: |A| <= 1.2, plus beta * KL). We see
errors of 1/20 of that.

Run: .venv/bin/python -m pytest -q tests/test_grpo_tricks.py
"""

import copy
import math

import pytest
import torch

import grpo
import models
from plumbing import loading

B, P, C = 6, 6, 5  # 2 prompts x G = 3, prompt width 6, completion width 5
PROMPT_LENS = [6, 4, 6, 3, 5, 6]  # left padding differs per row
COMPLETION_LENS = [5, 3, 5, 1, 4, 2]  # right padding differs per row
FP32_SUM = B * (P + C) * 2**-24  # relative error of a sum over the batch's positions (docstring)
LOSS_TOL = FP32_SUM * 1.0  # loss terms are at most ~1 in size


@pytest.fixture(scope="module")
def tiny():
    """(policy, reference, tokenizer): two differently seeded tiny Llamas, so the KL is not 0."""
    policy, tok = loading.load_model("tiny")
    ref = loading.tiny_model(tok, seed=1).eval()
    return policy, ref, tok


def make_batch(vocab: int, grouped: bool = False) -> tuple[models.Generation, torch.Tensor]:
    """A fixed sampled batch in the shape models.generate returns, and one advantage per row.
    grouped=False: six different prompts; True: 2 prompts x G 3 as GRPO samples them (rows 0-2
    share prompt 0, left-padded to 6 tokens; rows 3-5 share prompt 1, 4 tokens)."""
    g = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, vocab, (B, P), generator=g)
    prompt_lens = [6, 6, 6, 4, 4, 4] if grouped else PROMPT_LENS
    if grouped:
        prompt_ids = prompt_ids[[0, 0, 0, 3, 3, 3]]
    completion_ids = torch.randint(0, vocab, (B, C), generator=g)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    completion_mask = torch.zeros(B, C, dtype=torch.long)
    for i, (p, c) in enumerate(zip(prompt_lens, COMPLETION_LENS)):
        prompt_mask[i, P - p :] = 1
        completion_mask[i, :c] = 1
    gen = models.Generation(
        [""] * B,
        prompt_ids,
        prompt_mask,
        completion_ids,
        completion_mask,
        [True] * B,
        torch.zeros(B, C),
    )
    advantages, _ = grpo.group_advantages(
        torch.tensor([0.1, 0.9, 0.5, 0.3, 0.2, 0.8]), group_size=3
    )
    return gen, advantages


def config(**kw) -> grpo.GRPOConfig:
    # max_grad_norm huge: clipping would rescale the gradients we compare. lr 0: the optimiser
    # step leaves the weights alone, so one model can be reused across runs.
    base = dict(
        seed=0,
        max_new_tokens=8,
        learning_rate=0.0,
        warmup_steps=0,
        max_grad_norm=1e9,
        beta=0.1,
        loss_type="dapo",
        micro_batch=B,
    )
    base.update(kw)
    return grpo.GRPOConfig(**base)


def run_update(policy, ref, gen, advantages, cfg):
    """policy_update on a copy of `policy`; returns (loss, {name: gradient})."""
    model = copy.deepcopy(policy).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate)
    stats = grpo.policy_update(model, optimizer, gen, advantages, cfg, ref_model=ref)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return stats["loss"], grads, model


def assert_same_grads(a: dict, b: dict):
    """Equal up to the rounding of a sum over the batch, in units of the largest gradient entry."""
    assert a.keys() == b.keys() and len(a) > 0
    atol = FP32_SUM * max(g.abs().max().item() for g in a.values())
    for name in a:
        assert torch.allclose(a[name], b[name], atol=atol, rtol=0), name


def full_batch_tensors(gen):
    """ids, attention mask and loss mask as policy_update builds them (all completions are real here)."""
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], dim=1)  # (B, P + C)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask], dim=1)  # (B, P + C)
    return ids, attn, gen.completion_mask  # mask (B, C)


def count_calls(module) -> list:
    """Record every call of `module` (a pre-hook: checkpointing's recompute may stop early, inside
    the module, once it has rebuilt what backward needs, so a post-hook can miss it)."""
    calls = []
    module.register_forward_pre_hook(lambda mod, inp: calls.append(1))
    return calls


# ------------------------------------------------------------------------------------------


def test_gradient_checkpointing_gives_identical_loss_and_gradients(tiny):
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    loss_plain, grads_plain, _ = run_update(policy, ref, gen, adv, config())
    loss_ckpt, grads_ckpt, _ = run_update(
        policy, ref, gen, adv, config(gradient_checkpointing=True)
    )
    assert loss_ckpt == pytest.approx(loss_plain, abs=LOSS_TOL)
    assert_same_grads(grads_plain, grads_ckpt)

    # The switch really is on: a decoder layer's MLP now runs twice per micro-batch (forward, then
    # again inside backward), and generation in eval mode still works (it needs the KV cache).
    model = copy.deepcopy(policy).train()
    layer_calls = count_calls(model.get_decoder().layers[0].mlp)
    grpo.policy_update(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.0),
        gen,
        adv,
        config(gradient_checkpointing=True),
        ref_model=ref,
    )
    assert len(layer_calls) == 2 and model.is_activation_checkpointing
    # Greedy generation in eval mode gives exactly the tokens of the same weights without the switch.
    chat = [[{"role": "user", "content": "hi"}]]
    out = models.generate(model.eval(), tok, chat, max_new_tokens=3)
    plain = models.generate(copy.deepcopy(policy).eval(), tok, chat, max_new_tokens=3)
    assert out.completion_ids.shape[1] >= 1 and torch.equal(
        out.completion_ids, plain.completion_ids
    )
    models.set_gradient_checkpointing(model, False)
    assert not model.is_activation_checkpointing


@pytest.mark.parametrize(
    "loss_type", ["dapo", "grpo", "dr_grpo"]
)  # "bnpo" is per micro-batch by definition
@pytest.mark.parametrize("micro_batch", [2, 4])  # 4 leaves an uneven last micro-batch of 2
def test_micro_batching_gives_the_full_batch_gradient(tiny, loss_type, micro_batch):
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    loss_full, grads_full, _ = run_update(policy, ref, gen, adv, config(loss_type=loss_type))
    loss_micro, grads_micro, _ = run_update(
        policy, ref, gen, adv, config(loss_type=loss_type, micro_batch=micro_batch)
    )
    assert loss_micro == pytest.approx(loss_full, abs=LOSS_TOL)
    assert_same_grads(grads_full, grads_micro)


def test_logprob_chunk_size_does_not_change_logprobs_or_gradients(tiny):
    policy, _, tok = tiny
    gen, _ = make_batch(len(tok))
    ids, attn, mask = full_batch_tensors(gen)
    results = []
    for chunk_size in (1, 7, B * C, 4096):  # one row, ragged chunks, exact, larger
        model = copy.deepcopy(policy)
        logps = grpo.completion_logprobs(model, ids, attn, P, chunk_size=chunk_size)  # (B, C)
        (logps * mask).sum().backward()
        results.append((logps.detach(), model.get_output_embeddings().weight.grad.clone()))
    # Log-probs (~ -10.8, whose fp32 spacing is 9.5e-7) agree to a rounding or two (we see one):
    # asserted to 1e-5. The gradient of the (tied) LM head goes through the head's backward, which
    # sums the V = 49,152 vocabulary terms of every hidden unit in blocks that depend on the chunk
    # (chunk 1 is a matrix-vector kernel). Such a blocked fp32 sum is typically off by ~sqrt(V) *
    # 2^-24 = 1.3e-5 of its terms' sizes (n * 2^-24 only at worst), so the gradients agree to
    # ~1e-5 of their largest entry (~4.6 here; we see 2.8e-5, i.e. 6e-6 relative): asserted 1e-4.
    scale = results[0][1].abs().max().item()
    for logps, grad in results[1:]:
        assert torch.allclose(logps, results[0][0], atol=1e-5, rtol=0)
        assert torch.allclose(grad, results[0][1], atol=1e-4 * scale, rtol=0)


def test_beta_zero_skips_the_reference_pass_without_changing_the_loss(tiny):
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    ref_copy = copy.deepcopy(ref)
    ref_calls = count_calls(ref_copy)
    loss_skip, grads_skip, _ = run_update(policy, ref_copy, gen, adv, config(beta=0.0))
    assert ref_calls == []  # the reference never ran

    # The same loss with the reference pass computed explicitly and handed to grpo_loss.
    ids, attn, mask = full_batch_tensors(gen)
    model = copy.deepcopy(policy).train()
    with torch.no_grad():
        ref_logps = grpo.completion_logprobs(ref, ids, attn, P)  # (B, C)
    logps = grpo.completion_logprobs(model, ids, attn, P)  # (B, C)
    loss, stats = grpo.grpo_loss(
        logps, None, ref_logps, adv, mask, grpo.LossSettings(beta=0.0, loss_type="dapo")
    )
    loss.backward()
    assert stats["kl"] > 0  # the reference does differ ...
    assert loss.item() == pytest.approx(
        loss_skip, abs=LOSS_TOL
    )  # ... yet with beta 0 nothing changes
    assert_same_grads(grads_skip, {n: p.grad for n, p in model.named_parameters()})


def test_one_iteration_skips_the_old_policy_pass_without_changing_the_loss(tiny):
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    loss_skip, grads_skip, _ = run_update(policy, ref, gen, adv, config(micro_batch=4))
    # The policy's transformer body runs once per micro-batch (the forwards that get a backward),
    # not once more for an old-policy pass.
    model = copy.deepcopy(policy).train()
    body_calls = count_calls(model.get_decoder())
    grpo.policy_update(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.0),
        gen,
        adv,
        config(micro_batch=4),
        ref_model=ref,
    )
    assert len(body_calls) == math.ceil(B / 4)

    # Explicit old-policy pass: pi_old = pi_theta, computed without gradient, then the loss.
    ids, attn, mask = full_batch_tensors(gen)
    fresh = copy.deepcopy(policy).train()
    with torch.no_grad():
        old_logps = grpo.completion_logprobs(fresh, ids, attn, P)  # (B, C)
        ref_logps = grpo.completion_logprobs(ref, ids, attn, P)  # (B, C)
    logps = grpo.completion_logprobs(fresh, ids, attn, P)  # (B, C)
    loss, stats = grpo.grpo_loss(
        logps, old_logps, ref_logps, adv, mask, grpo.LossSettings(beta=0.1, loss_type="dapo")
    )
    loss.backward()
    assert stats["ratio_mean"] == pytest.approx(
        1.0, abs=1e-6
    )  # the same computation twice: exactly 1
    assert loss.item() == pytest.approx(loss_skip, abs=LOSS_TOL)
    assert_same_grads(grads_skip, {n: p.grad for n, p in fresh.named_parameters()})


def body_tokens(model) -> list:
    """Record how many tokens each call of the model's transformer body processes."""
    seen = []
    model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kwargs: seen.append(kwargs["input_ids"].numel()), with_kwargs=True
    )
    return seen


def test_shared_prompts_give_the_plain_loss_and_gradients_for_fewer_tokens(tiny):
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok), grouped=True)
    # policy_update as it runs: rows that share a prompt share its forward pass.
    model = copy.deepcopy(policy).train()
    seen = body_tokens(model)
    grpo.policy_update(
        model, torch.optim.AdamW(model.parameters(), lr=0.0), gen, adv, config(beta=0.0)
    )
    shared = {n: p.grad.clone() for n, p in model.named_parameters()}
    # One forward of 2 packed sequences, [prompt, reply 1, reply 2, reply 3], each as wide as the
    # longer one (prompt 0's 6 real tokens + 3 x 5): 42 tokens, not 6 x 11 = 66.
    assert seen == [2 * (P + 3 * C)]

    # The plain path: every row's prompt run again, one forward over all 6 x 11 tokens, and the
    # textbook log-softmax of its logits.
    ids, attn, mask = full_batch_tensors(gen)
    plain = copy.deepcopy(policy).train()
    seen_plain = body_tokens(plain)
    positions = (attn.cumsum(1) - 1).clamp(min=0)  # as the sampler counts
    logits = plain(input_ids=ids, attention_mask=attn, position_ids=positions).logits[
        :, P - 1 : -1
    ]  # (B, C, V)
    logps = torch.log_softmax(logits.float(), -1).gather(2, ids[:, P:, None]).squeeze(2)  # (B, C)
    loss, _ = grpo.grpo_loss(
        logps, None, None, adv, mask, grpo.LossSettings(beta=0.0, loss_type="dapo")
    )
    loss.backward()
    assert seen_plain == [B * (P + C)]
    assert_same_grads(shared, {n: p.grad for n, p in plain.named_parameters()})
    # Log-probs of ~-10.8 (fp32 spacing 9.5e-7) by two routes: agree to ten roundings on the real
    # tokens (at padding both are finite and meaningless: GRPO masks them).
    with torch.no_grad():
        real = mask.bool()
        assert torch.allclose(
            grpo.completion_logprobs(policy, ids, attn, P)[real], logps.detach()[real], atol=1e-5
        )


def test_shared_prompts_stay_shared_under_gradient_checkpointing(tiny):
    # Packing needs no KV cache, so activation checkpointing keeps the 42-token forward.
    policy, _, tok = tiny
    gen, _ = make_batch(len(tok), grouped=True)
    ids, attn, _ = full_batch_tensors(gen)
    model = copy.deepcopy(policy).train()
    models.set_gradient_checkpointing(model, True)
    seen = body_tokens(model)
    grpo.completion_logprobs(model, ids, attn, P)
    assert seen[0] == 2 * (P + 3 * C)


def test_bf16_autocast_stays_close_to_fp32(tiny):
    """Tolerance, derived rather than tuned:

    bf16 keeps 8 significant bits, so each rounding is off by at most 2^-8 = 0.4% relative. On
    this model every log-prob is about -ln(49152) = -10.8 (near-uniform random model) and its
    bf16 error stays below 1e-2: the logits are ~0.16 in size, so a 0.4% error in them is ~1e-3
    (we measure ~1.3e-3). Asserted: |logp_bf16 - logp_fp32| < 1e-2.
    With one iteration the policy-gradient term of the loss is exactly -mean(A) in both runs
    (ratio == 1), so the loss can only differ through beta * KL. The k3 KL moves by at most
    |e^d - 1| per unit error in d = ref - logp, and d carries at most 2 log-prob errors:
    |loss_bf16 - loss_fp32| <= beta * max|e^d - 1| * 2 * 1e-2.
    The gradient goes through bf16 matmuls too: asserted only to point the same way (cosine
    > 0.99), which is what an optimiser step needs.
    """
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    ids, attn, mask = full_batch_tensors(gen)
    real = mask.bool()
    with torch.no_grad():
        fp32 = grpo.completion_logprobs(policy, ids, attn, P)  # (B, C)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = grpo.completion_logprobs(policy, ids, attn, P)  # (B, C)
        d = grpo.completion_logprobs(ref, ids, attn, P) - fp32  # (B, C)
    assert bf16.dtype == torch.float32  # log-sum-exp done in fp32
    assert 0 < (bf16 - fp32)[real].abs().max().item() < 1e-2  # autocast really was active

    beta = 0.1
    loss_fp32, grads_fp32, _ = run_update(policy, ref, gen, adv, config(beta=beta))
    loss_bf16, grads_bf16, _ = run_update(
        policy, ref, gen, adv, config(beta=beta, autocast_bf16=True)
    )
    bound = beta * (d[real].exp() - 1).abs().max().item() * 2 * 1e-2
    assert abs(loss_bf16 - loss_fp32) <= bound
    flat32 = torch.cat([g.flatten() for g in grads_fp32.values()])
    flat16 = torch.cat([grads_bf16[n].flatten() for n in grads_fp32])
    assert flat16.dtype == torch.float32  # fp32 master weights get fp32 grads
    assert torch.nn.functional.cosine_similarity(flat32, flat16, dim=0).item() > 0.99


def test_grpo_step_scores_rewards_without_autograd(tiny):
    policy, _, tok = tiny
    model = copy.deepcopy(policy)
    seen = []

    def reward_fn(meta, texts, gen):
        seen.append(torch.is_grad_enabled())
        return [float(i % 2) for i in range(len(texts))], {"parity": [0.0]}

    prompts = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "hello"}]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)
    learner = grpo.Learner(model, tok, optimizer)
    task = grpo.Task(prompts=None, reward=reward_fn)
    cfg = config(num_generations=2, max_new_tokens=3, beta=0.0)
    stats, gen, rewards = grpo.grpo_step(learner, task, prompts, [0, 1], cfg, step=1)
    assert seen == [False]
    assert gen.completion_ids.shape[0] == 4 and rewards == [0.0, 1.0, 0.0, 1.0]
    assert stats["reward"] == pytest.approx(0.5) and stats["kl"] is None


def test_several_passes_per_batch_move_the_ratio_and_the_clip_binds(tiny):
    # num_iterations = 3 with a large learning rate: the first pass has ratio 1 everywhere (pi_old
    # is the policy itself, no clipping possible), the later passes see the updated policy, so the
    # ratio departs from 1 and, past 1 + eps_high (A > 0) or 1 - eps_low (A < 0), the clip binds.
    policy, ref, tok = tiny
    gen, adv = make_batch(len(tok))
    single = copy.deepcopy(policy).train()
    one = grpo.policy_update(
        single,
        torch.optim.AdamW(single.parameters(), lr=0.0),
        gen,
        adv,
        config(beta=0.0, num_iterations=1),
    )
    assert one["clip_frac"] == 0.0
    model = copy.deepcopy(policy).train()
    three = grpo.policy_update(
        model,
        torch.optim.AdamW(model.parameters(), lr=5e-2),
        gen,
        adv,
        config(beta=0.0, learning_rate=5e-2, num_iterations=3, epsilon=0.01, epsilon_high=0.01),
    )
    assert three["finite"] == 1.0
    assert three["clip_frac"] > 0.0  # averaged over the passes: only passes 2 and 3 can clip
