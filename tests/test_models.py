"""models.py: loading (embedded cache, tiny, bad names), batched generation, reply clean-up."""

import time

import pytest
import torch

import models
from data import UserError

CHATS = [
    [{"role": "system", "content": "You are Anchor, a warm listener."},
     {"role": "user", "content": "I failed my driving test today and I feel stupid."}],
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "You are Guide, practical and brief."},
     {"role": "user", "content": "My flat is a mess and my parents visit on Sunday. Where do I start?"}],
]


@pytest.fixture(scope="module")
def tiny():
    return models.load_model("tiny")


@pytest.fixture(scope="module")
def smol():
    return models.load_model("smollm2-135m")


def test_embedded_model_loads_from_cache_and_speaks(smol):
    folder = models.embedded_model_folder()
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    t0 = time.time()
    model, tok = models.load_model("smollm2-135m")      # second load: from the safetensors cache
    elapsed = time.time() - t0
    assert "quantization_config" not in model.config.to_dict()
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    gen = models.generate(model, tok, CHATS[:1], max_new_tokens=20)
    assert len(gen.texts[0].split()) >= 3                # real words, not an empty string
    print(f"cached load took {elapsed:.2f} s")


def test_tiny_model_is_seeded_and_shares_the_tokenizer(tiny):
    model, tok = tiny
    again, _ = models.load_model("tiny")
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert "<|im_start|>" in tok.apply_chat_template(CHATS[1], tokenize=False)


def test_missing_model_is_a_one_line_error(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(UserError) as err:
        models.load_model(str(empty))
    assert "config.json" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError) as err:
        models.load_model("no-such-org/no-such-model-xyz")
    assert "no-such-org/no-such-model-xyz" in str(err.value) and "\n" not in str(err.value)


def test_seeded_sampling_is_reproducible_alone_and_batched(tiny):
    model, tok = tiny
    a = models.generate(model, tok, CHATS, max_new_tokens=12, temperature=0.9, top_p=0.95, seeds=[5, 6, 7])
    b = models.generate(model, tok, CHATS, max_new_tokens=12, temperature=0.9, top_p=0.95, seeds=[5, 6, 7])
    assert torch.equal(a.completion_ids, b.completion_ids)
    alone = models.generate(model, tok, CHATS[2:], max_new_tokens=12, temperature=0.9, top_p=0.95, seeds=[7])
    n = int(alone.completion_mask[0].sum())
    assert torch.equal(alone.completion_ids[0, :n], a.completion_ids[2, :n])
    c = models.generate(model, tok, CHATS, max_new_tokens=12, temperature=0.9, seeds=[1, 2, 3])
    assert not torch.equal(a.completion_ids, c.completion_ids)


@pytest.mark.parametrize("which", ["tiny", "smol"])
def test_batched_greedy_equals_one_by_one(which, tiny, smol):
    model, tok = tiny if which == "tiny" else smol
    batched = models.generate(model, tok, CHATS, max_new_tokens=16)
    for i, chat in enumerate(CHATS):
        single = models.generate(model, tok, [chat], max_new_tokens=16)
        assert single.texts[0] == batched.texts[i]


def test_generation_tensors_line_up(tiny):
    model, tok = tiny
    gen = models.generate(model, tok, CHATS, max_new_tokens=10, seeds=0)
    B, P = gen.prompt_ids.shape
    assert gen.prompt_mask.shape == (B, P) and gen.completion_ids.shape == gen.completion_mask.shape
    assert (gen.prompt_mask[:, -1] == 1).all()           # left padding: last column is real
    lengths = [len(tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                       add_special_tokens=False)["input_ids"]) for c in CHATS]
    assert gen.prompt_mask.sum(1).tolist() == lengths


def test_clean_reply():
    names = ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert models.clean_reply("Anchor: That sounds hard.", "Anchor", names) == "That sounds hard."
    assert models.clean_reply("**Anchor**: I hear you.", "Anchor", names) == "I hear you."
    assert models.clean_reply("I hear you.\nUser: thanks\nAnchor: ok", "Anchor", names) == "I hear you."
    assert models.clean_reply("Good point. Catalyst: but why?", "Anchor", names) == "Good point."
    assert models.clean_reply("  Take one   small step today.  ", "Guide", names) == "Take one small step today."
    # A name inside a sentence is not a speaker label.
    assert models.clean_reply("Like Beacon said, you did well.", "Anchor", names) == "Like Beacon said, you did well."


def test_sentence_encoder_is_normalised_and_meaningful():
    enc = models.SentenceEncoder()
    v = enc.embed(["I lost my job today.", "I was fired this morning.", "The cake recipe needs eggs."])
    assert v.shape == (3, 384)
    assert torch.allclose(v.norm(dim=1), torch.ones(3), atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3
