"""The paper's model families on mascot's paths: Qwen3, Llama 3, Gemma 2, Gemma 3 and Phi-3, each a
tiny random model of its own transformers class with its chat template and special tokens
(tests/families.py), built offline in the test. What must hold for every family:
  - the prompt: no thinking block left open, the system message folded where the template
    refuses one, a history that opens with the user where the template needs alternation;
  - the trainer's log-probs equal the sampler's (fp32, < 1e-4 nats a token) under every attention
    path the family offers, packed or not (Gemma's sliding window);
  - generation stops on the family's own end-of-turn tokens;
  - the reward model reads a chat at its end, after the reply's end of turn;
  - stage 1, stage 2 and evaluate run from the command line.

Run: .venv/bin/python -m pytest -q tests/test_families.py
"""

import families
import pytest
import torch

import grpo
import models
import reward
from plumbing.loading import load_model
from plumbing.templates import render_chat

SYSTEM = {"role": "system", "content": "You are Anchor, the emotional validator."}
USER = {"role": "user", "content": "I failed my driving test again."}
ASSISTANT = {"role": "assistant", "content": "That sounds so discouraging."}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{family: its model folder}, built once for the module (all five take ~2 s)."""
    root = tmp_path_factory.mktemp("families")
    return {f: families.build(f, root / f) for f in families.FAMILIES}


def attention_paths(family: str) -> list[str]:
    """The attention implementations transformers offers the family (Gemma 2's soft-capping
    rules out SDPA)."""
    return ["eager"] if family == "gemma2" else ["eager", "sdpa"]


# --- The prompt -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", families.FAMILIES)
def test_every_family_renders_a_speaker_prompt(built, family):
    _, tok = load_model(str(built[family]))
    text = render_chat(tok, [SYSTEM, USER])
    assert "emotional validator" in text and "driving test" in text  # nothing dropped
    if family == "qwen3":  # thinking off: the think block is written and closed for the model
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    if family == "gemma2":  # no system role: folded into the first user turn
        assert "<start_of_turn>system" not in text
        assert "<start_of_turn>user\nYou are Anchor" in text


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_a_history_opening_with_the_speakers_own_turn_still_renders(built, family):
    # simulate.transcript_messages' window can open with the agent's own turn; Gemma needs the user
    # first and alternation: the opening assistant turn gives way, neighbours of one role join.
    _, tok = load_model(str(built[family]))
    messages = [SYSTEM, ASSISTANT, USER, {"role": "user", "content": "And I cried."}]
    text = render_chat(tok, messages)
    assert "discouraging" not in text and "driving test again.\n\nAnd I cried." in text


def test_a_tokenizer_without_a_chat_template_is_one_line(built):
    from plumbing.common import UserError

    _, tok = load_model(str(built["llama3"]))
    tok.chat_template = None
    with pytest.raises(UserError, match="no chat template"):
        render_chat(tok, [USER])


# --- Stop tokens -------------------------------------------------------------------------------
@pytest.mark.parametrize("family", families.FAMILIES)
def test_generation_stops_on_the_familys_own_end_of_turn_tokens(built, family):
    model, tok = load_model(str(built[family]))
    stops = set(models.stop_token_ids(tok, model.generation_config))
    own = model.generation_config.eos_token_id
    assert set(own if isinstance(own, list) else [own]) <= stops
    if family == "llama3":  # Llama 3.1's three
        for marker in ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"):
            assert tok.convert_tokens_to_ids(marker) in stops


# --- The trainer's log-probs against the sampler's -----------------------------------------------
def mismatch(model, tok, chats, seeds) -> float:
    """The mean |trainer - sampler| log-prob per sampled token, as grpo.policy_update logs it."""
    gen = models.generate(model, tok, chats, 12, temperature=1.0, seeds=seeds)
    ids = torch.cat([gen.prompt_ids, gen.completion_ids], 1)
    attn = torch.cat([gen.prompt_mask, gen.completion_mask], 1)
    with torch.no_grad():
        ours = grpo.completion_logprobs(model, ids, attn, gen.prompt_ids.shape[1])
    gap = (ours - gen.sampler_logprobs).abs()  # (B, C)
    return grpo.masked_mean(gap, gen.completion_mask).item()


@pytest.mark.parametrize("family", families.FAMILIES)
def test_trainer_and_sampler_agree_in_every_family_and_attention_path(built, family, tmp_path):
    # Two prompts x three replies: GRPO's packed path (one sequence per prompt, our own mask). For
    # Gemma the built window is 16 tokens, shorter than a packed group: those run row by row; a
    # copy with a 4,096-token window runs packed.
    chats = [[SYSTEM, USER] for _ in range(3)] + [[USER] for _ in range(3)]
    folders = [built[family]]
    if family.startswith("gemma"):
        folders.append(families.build(family, tmp_path / "wide", sliding_window=4096))
    for folder in folders:
        for path in attention_paths(family):
            model, tok = load_model(str(folder))
            model.config._attn_implementation = path
            gap = mismatch(model, tok, chats, seeds=list(range(len(chats))))
            assert gap < 1e-4, (family, folder.name, path, gap)


def test_eager_attention_gets_a_mask_it_adds(built):
    # Eager attention ADDS the 4D mask to its scores: a boolean mask would mask nothing there.
    model, _ = load_model(str(built["llama3"]))
    model.config._attn_implementation = "eager"
    who = torch.tensor([[-2, -1, -1, 0, 0, 1, 1]])  # padding, prompt, two replies
    mask = grpo.packed_mask_for(model, who)
    assert mask.dtype == torch.float32 and mask.max() == 0 and mask.min() < -1e30
    model.config._attn_implementation = "sdpa"
    assert grpo.packed_mask_for(model, who).dtype == torch.bool


def test_a_model_whose_logits_we_cannot_reproduce_is_refused(built):
    from plumbing.common import UserError

    model, tok = load_model(str(built["gemma2"]))
    assert grpo.check_logprobs(model, tok) < 1e-4  # soft-capped logits, reproduced
    original = model.forward

    def scaled(*args, **kwargs):  # a forward that scales its logits, which we do not know
        out = original(*args, **kwargs)
        out.logits = out.logits * 2.0
        return out

    model.forward = scaled
    with pytest.raises(UserError, match="cannot train this architecture"):
        grpo.check_logprobs(model, tok)


# --- The reward model reads the end of the turn ------------------------------------------------
@pytest.mark.parametrize("family", families.FAMILIES)
def test_the_reward_model_reads_a_chat_after_the_replys_end_of_turn(built, family):
    rm, tok = reward.RewardModel.from_base(str(built[family]))
    chats = [[SYSTEM, USER, ASSISTANT], [USER, {"role": "assistant", "content": "Oh no."}]]
    ids, mask = rm.encode(tok, chats)  # left-padded (B, T)
    pad = rm.net.config.pad_token_id
    stops = set(models.stop_token_ids(tok))
    for row in ids.tolist():
        pooled = max(i for i, t in enumerate(row) if t != pad)  # HF's rule: the rightmost non-pad
        assert pooled == len(row) - 1  # the chat's own last token ...
        end_of_reply = max(i for i, t in enumerate(row) if t in stops)
        assert pooled >= end_of_reply  # ... at or after the reply's end-of-turn marker
    if family == "llama3":  # no pad token of its own: it gets one
        assert tok.pad_token == "<|reward_pad|>"


# --- The command line --------------------------------------------------------------------------
@pytest.mark.parametrize("family", families.FAMILIES)
def test_stage_1_stage_2_and_evaluate_run_in_every_family(built, family, tmp_path, monkeypatch):
    import mascot
    from conftest import ROOT

    monkeypatch.chdir(ROOT)
    common = ["--model", str(built[family]), "--run", str(tmp_path / "run"), "--quiet"]
    budget = [
        "--max-new-tokens",
        "6",
        "--steps",
        "1",
        "--prompts-per-step",
        "1",
        "--group-size",
        "2",
    ]
    stage1 = ["--states", "2", "--heldout-states", "1", "--candidates", "3", "--margin", "0"]
    stage2 = ["--decision-points", "2", "--heldout-points", "1", "--rollout-turns", "1"]
    stage2 += ["--director-warmup", "1", "--no-eval-prompted"]
    assert mascot.main(["train", "--stage", "1", *common, *budget, *stage1]) == 0
    assert mascot.main(["train", "--stage", "2", *common, *budget, *stage2]) == 0
    evaluation = ["--systems", "mascot", "--contexts", "1", "--turns", "1"]
    assert mascot.main(["evaluate", *common, *evaluation, "--no-persona-id"]) == 0
    assert (tmp_path / "run" / "eval" / "results.md").exists()
