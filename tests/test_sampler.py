"""models.generate, our sampler: equality with HF generate, seeding, stops, left padding, bf16 copy.

Most tests use the tiny random model (gibberish, but the same code paths in a fraction of a
second); the greedy-equality checks also run on the embedded SmolLM2 (a few seconds). No test
is timed: speed is measured by bench/generate_speed.py.

Greedy decoding picks the largest logit, and two runs that add the same numbers in another order
(another batch shape, another CPU's vector kernels) can disagree where the top two logits nearly
tie. So every greedy equality below first checks, with `clear_greedy`, that the prompts it uses
have no near-tie; sampled equalities draw one uniform number per token and flip only if it lands
within the (~1e-7) rounding of a CDF boundary.

Run: .venv/bin/python -m pytest -q tests/test_sampler.py
"""

import copy

import pytest
import torch

import grpo
import models

ANCHOR = [
    {"role": "system", "content": "You are Anchor, a warm listener."},
    {"role": "user", "content": "I failed my driving test today and I feel stupid."},
]
HI = [{"role": "user", "content": "Hi!"}]  # much shorter: left-padded in a batch
GUIDE = [
    {"role": "system", "content": "You are Guide, practical and brief."},
    {
        "role": "user",
        "content": "My flat is a mess and my parents visit on Sunday. Where do I start?",
    },
]
# GRPO's layout (each prompt G times in a row) plus a repeat that is not adjacent.
ROWS = [ANCHOR, ANCHOR, HI, HI, GUIDE, ANCHOR]


def real(gen, i):
    """Row i's real completion tokens (up to and including its stop token)."""
    return gen.completion_ids[i][gen.completion_mask[i].bool()].tolist()


def clear_greedy(model, gen) -> None:
    """Check that every greedy choice of `gen` won by a clear margin, so that no summation order
    can flip it. Each row alone and unpadded, teacher-forced on its own reply: at every step the
    top logit must beat the runner-up by 1e-3 of the largest |logit|. Rounding moves these logits
    far less: one fp32 dot product over the hidden size h errs by up to ~h * 2^-24 relative (576:
    3.4e-5), and AVX-512 against the plain kernels differ by ~3e-6 relative on SmolLM2."""
    for i in range(len(gen.texts)):
        ids = torch.cat([gen.prompt_ids[i][gen.prompt_mask[i].bool()], gen.completion_ids[i]])[None]
        P = int(gen.prompt_mask[i].sum())
        with torch.no_grad():
            logits = model(input_ids=ids).logits[
                0, P - 1 : P - 1 + int(gen.completion_mask[i].sum())
            ]  # (C, V)
        top2 = logits.topk(2, dim=-1).values  # (C, 2)
        margin = (top2[:, 0] - top2[:, 1]).min().item()
        assert margin > 1e-3 * logits.abs().max().item(), (
            f"row {i}: greedy near-tie ({margin:.1e}): use other prompts"
        )


def test_distinct_rows_by_hand():
    assert models.distinct_rows([[1, 2], [1, 2], [3], [3], [1, 2]]) == ([0, 2], [0, 0, 1, 1, 0])
    assert models.distinct_rows([[5]]) == ([0], [0])


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_greedy_equals_hf_generate_token_for_token(which, tiny, smol):
    model, tok = tiny if which == "tiny" else smol
    ours = models.generate(model, tok, ROWS, max_new_tokens=20)
    clear_greedy(model, ours)
    ids, mask = models.left_pad(models.chat_prompt_ids(tok, ROWS), tok.pad_token_id)
    hf = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=20,
        pad_token_id=tok.pad_token_id,
        eos_token_id=models.stop_token_ids(tok),
    )
    hf = hf[:, ids.shape[1] :]  # (B, C') HF pads finished rows
    for i in range(len(ROWS)):
        n = int(ours.completion_mask[i].sum())
        assert real(ours, i) == hf[i, :n].tolist(), f"row {i}"


def test_seeded_sampling_is_reproducible_and_row_independent(tiny):
    model, tok = tiny
    kw = dict(max_new_tokens=12, temperature=0.9, top_p=0.95)
    a = models.generate(model, tok, ROWS, seeds=[5, 6, 7, 8, 9, 10], **kw)
    b = models.generate(model, tok, ROWS, seeds=[5, 6, 7, 8, 9, 10], **kw)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.sampler_logprobs, b.sampler_logprobs)
    # An int seed means seed + i for row i.
    c = models.generate(model, tok, ROWS, seeds=5, **kw)
    assert torch.equal(a.completion_ids, c.completion_ids)
    # A row's tokens depend only on its prompt and seed: alone (no shared prefill, no padding)
    # it gives the same reply as inside the batch.
    for i, seed in [(1, 6), (3, 8), (5, 10)]:
        alone = models.generate(model, tok, [ROWS[i]], seeds=[seed], **kw)
        assert real(alone, 0) == real(a, i)
    # Rows that share a prompt but not a seed differ.
    assert real(a, 0) != real(a, 1)
    with pytest.raises(ValueError, match="seeds"):
        models.generate(model, tok, ROWS, seeds=[1, 2], **kw)


def test_on_token_sees_every_sampled_token_as_it_comes(tiny):
    # The chat streams replies through this callback: step t hands over the (B,) tokens of step t.
    model, tok = tiny
    seen = []
    gen = models.generate(
        model,
        tok,
        ROWS,
        max_new_tokens=10,
        temperature=0.9,
        seeds=3,
        options=models.DecodeOptions(on_token=lambda token: seen.append(token.clone())),
    )
    assert torch.equal(torch.stack(seen, 1), gen.completion_ids)


def force_stop(model, tok, rows, stop_id: int, at: dict[int, int]):
    """Make row r emit `stop_id` as its token number at[r] (0-based), whatever it samples."""
    calls = []
    _, prompt_of = models.distinct_rows(models.chat_prompt_ids(tok, rows))

    def hook(module, inputs, logits):
        step = len(calls)  # forward 0 = prefill -> token 0
        calls.append(1)
        for row, when in at.items():
            if when == step:
                # The prefill runs once per distinct prompt: its batch rows are prompts, not rows.
                r = prompt_of[row] if step == 0 else row
                logits[r, -1, :] = float("-inf")
                logits[r, -1, stop_id] = 0.0
        return logits

    return model.get_output_embeddings().register_forward_hook(hook)


def test_each_finished_row_stops_and_its_mask_ends_at_the_stop(tiny):
    model, tok = tiny
    stop = models.stop_token_ids(tok)[0]
    rows = [ANCHOR, ANCHOR, HI, GUIDE]  # the shared prompt is prefilled once
    handle = force_stop(model, tok, rows, stop, {0: 3, 2: 0, 3: 6})
    try:
        gen = models.generate(model, tok, rows, max_new_tokens=10, seeds=1)
    finally:
        handle.remove()
    assert gen.finished == [True, False, True, True]
    for row, when in {0: 3, 2: 0, 3: 6}.items():
        assert int(gen.completion_mask[row].sum()) == when + 1  # up to and including
        assert int(gen.completion_ids[row, when]) == stop
        assert (gen.completion_ids[row, when + 1 :] == tok.pad_token_id).all()  # pads after
        assert (gen.sampler_logprobs[row, when + 1 :] == 0).all()
    assert int(gen.completion_mask[1].sum()) == 10  # ran to the limit
    # Once every row has stopped, the loop ends: no column of pure padding is generated.
    handle = force_stop(model, tok, rows, stop, {0: 2, 1: 4, 2: 1, 3: 0})
    try:
        gen = models.generate(model, tok, rows, max_new_tokens=10, seeds=1)
    finally:
        handle.remove()
    assert gen.completion_ids.shape[1] == 5 and all(gen.finished)
    # DecodeOptions.min_new_tokens forbids the stop tokens early on.
    handle = force_stop(model, tok, rows[:1], stop, {0: 1})
    fixed = models.DecodeOptions(min_new_tokens=6)
    try:
        gen = models.generate(model, tok, rows[:1], max_new_tokens=6, seeds=1, options=fixed)
    finally:
        handle.remove()
    assert int(gen.completion_mask[0].sum()) == 6 and gen.completion_ids[0, 1] != stop


@pytest.mark.parametrize("seeds", [None, [3]])
def test_left_padding_does_not_change_a_row(tiny, seeds):
    model, tok = tiny
    alone = models.generate(model, tok, [HI], max_new_tokens=12, seeds=seeds)
    if seeds is None:
        clear_greedy(model, alone)
    # In this batch HI is left-padded by ~30 tokens; its positions and mask must hide that.
    padded = models.generate(
        model, tok, [GUIDE, HI], max_new_tokens=12, seeds=None if seeds is None else [99, 3]
    )
    assert padded.prompt_mask[1].sum() < padded.prompt_mask.shape[1]
    assert real(alone, 0) == real(padded, 1)
    # Log-probs near -ln(49152) = -10.8; padding changes the shapes and so the summation order
    # (~1e-7 relative on this model): 1e-4 leaves room for a thousand times that.
    assert torch.allclose(
        alone.sampler_logprobs[0],
        padded.sampler_logprobs[1, : alone.sampler_logprobs.shape[1]],
        atol=1e-4,
    )


def test_sampler_logprobs_match_the_trainer_in_fp32(tiny):
    model, tok = tiny
    gen = models.generate(model, tok, ROWS, max_new_tokens=8, temperature=0.7, seeds=0)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    with torch.no_grad():
        trainer = grpo.completion_logprobs(
            model, ids, attn, gen.prompt_ids.shape[1], temperature=0.7
        )
    m = gen.completion_mask.bool()
    # The same numbers by two routes (a KV-cache decode, one full forward): equal up to fp32
    # summation order, ~1e-6 on log-probs of ~-10; 1e-4 is far above that, far below a real gap.
    assert (trainer[m] - gen.sampler_logprobs[m]).abs().max() < 1e-4


def test_sampling_copies_follow_the_policy_after_refresh(tiny):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]  # its weights are changed below
    low = models.SamplingCopy(model)
    assert all(p.dtype == torch.bfloat16 for p in low.model.parameters())
    assert all(b.dtype == torch.float32 for b in low.model.buffers())  # RoPE inv_freq
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the policy is untouched
    first = next(model.parameters())
    with torch.no_grad():
        first.add_(1.0)  # embeddings = tied LM head
        low.refresh()
        assert torch.equal(next(low.model.parameters()), first.to(torch.bfloat16))
        first.sub_(1.0)
        low.release()  # while the policy trains: no weights held
        assert all(p.numel() == 0 for p in low.model.parameters())
        low.refresh()
    gen = models.generate(low.model, tok, ROWS, max_new_tokens=8, seeds=0)
    assert gen.sampler_logprobs.dtype == torch.float32 and len(gen.texts) == len(ROWS)


def test_sampler_entropy_is_that_of_the_trainers_distribution(tiny):
    # GRPO's logged `entropy`: -sum p log p of each step's distribution at the sampling temperature, by hand from
    # one full forward's logits at the positions that predicted the completion.
    model, tok = tiny
    gen = models.generate(model, tok, ROWS, max_new_tokens=6, temperature=0.7, seeds=0)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    P, C = gen.prompt_ids.shape[1], gen.completion_ids.shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(1) - 1).clamp(min=0)
        ).logits
    logp = torch.log_softmax(logits[:, P - 1 : P + C - 1].float() / 0.7, -1)  # (B, C, V)
    by_hand = -(logp.exp() * logp).sum(-1)  # (B, C)
    m = gen.completion_mask.bool()
    assert (
        gen.sampler_entropy.shape == gen.completion_ids.shape
        and (gen.sampler_entropy[~m] == 0).all()
    )
    assert (by_hand[m] - gen.sampler_entropy[m]).abs().max() < 1e-3 and (by_hand[m] > 0).all()


@pytest.mark.parametrize("sampling_copy", ["none", "bf16"])
def test_grpo_step_logs_the_sampler_trainer_logprob_gap(tiny, sampling_copy):
    model, tok = tiny
    policy = copy.deepcopy(model)
    cfg = grpo.GRPOConfig(
        seed=0,
        prompts_per_step=2,
        num_generations=3,
        max_new_tokens=8,
        learning_rate=0.0,
        warmup_steps=0,
        beta=0.0,
        sample_bf16=sampling_copy == "bf16",
    )
    sampling = models.SamplingCopy(policy) if cfg.sample_bf16 else None
    optimizer = torch.optim.AdamW(policy.parameters(), lr=0.0)

    def reward_fn(meta, texts, gen):
        rewards = [float(len(t) % 3) for t in texts]
        return rewards, {"len3": rewards}

    learner = grpo.Learner(policy, tok, optimizer, sampling=sampling)
    task = grpo.Task(prompts=None, reward=reward_fn)
    stats, gen, _ = grpo.grpo_step(learner, task, [ANCHOR, HI], [0, 1], cfg, 1)
    assert stats["entropy"] > 0 and 0 <= stats["completions/clipped_ratio"] <= 1
    if sampling_copy != "bf16":
        assert stats["logp_mismatch"] < 1e-4  # fp32: the policy's own numbers
    else:
        assert 1e-4 < stats["logp_mismatch"] < 0.5  # bf16 rounding, visible but small


def test_seeded_sampling_is_reproducible_alone_and_batched(tiny):
    model, tok = tiny
    a = models.generate(
        model,
        tok,
        [ANCHOR, HI, GUIDE],
        max_new_tokens=12,
        temperature=0.9,
        top_p=0.95,
        seeds=[5, 6, 7],
    )
    b = models.generate(
        model,
        tok,
        [ANCHOR, HI, GUIDE],
        max_new_tokens=12,
        temperature=0.9,
        top_p=0.95,
        seeds=[5, 6, 7],
    )
    assert torch.equal(a.completion_ids, b.completion_ids)
    alone = models.generate(
        model, tok, [GUIDE], max_new_tokens=12, temperature=0.9, top_p=0.95, seeds=[7]
    )
    n = int(alone.completion_mask[0].sum())
    assert torch.equal(alone.completion_ids[0, :n], a.completion_ids[2, :n])
    c = models.generate(
        model, tok, [ANCHOR, HI, GUIDE], max_new_tokens=12, temperature=0.9, seeds=[1, 2, 3]
    )
    assert not torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_batched_greedy_equals_one_by_one(which, tiny, smol):
    model, tok = tiny if which == "tiny" else smol
    batched = models.generate(model, tok, [ANCHOR, HI, GUIDE], max_new_tokens=16)
    clear_greedy(model, batched)
    for i, chat in enumerate([ANCHOR, HI, GUIDE]):
        single = models.generate(model, tok, [chat], max_new_tokens=16)
        assert single.texts[0] == batched.texts[i]


def test_generation_tensors_line_up(tiny):
    model, tok = tiny
    gen = models.generate(model, tok, [ANCHOR, HI, GUIDE], max_new_tokens=10, seeds=0)
    B, P = gen.prompt_ids.shape
    assert gen.prompt_mask.shape == (B, P) and gen.completion_ids.shape == gen.completion_mask.shape
    assert (gen.prompt_mask[:, -1] == 1).all()  # left padding: last column is real
    lengths = [
        len(
            tok(
                tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )["input_ids"]
        )
        for c in [ANCHOR, HI, GUIDE]
    ]
    assert gen.prompt_mask.sum(1).tolist() == lengths
