"""models.py: loading (embedded cache, tiny, bad names), reply clean-up, the sentence encoder."""

import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import models
from plumbing import devices, loading
from plumbing.common import UserError

CHATS = [
    [
        {"role": "system", "content": "You are Anchor, a warm listener."},
        {"role": "user", "content": "I failed my driving test today and I feel stupid."},
    ],
    [{"role": "user", "content": "Hi!"}],
]


def test_embedded_model_loads_from_cache_and_speaks(smol):
    folder = loading.embedded_model_folder()
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    t0 = time.time()
    model, tok = loading.load_model("smollm2-135m")  # second load: from the safetensors cache
    elapsed = time.time() - t0
    assert "quantization_config" not in model.config.to_dict()
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    gen = models.generate(model, tok, CHATS[:1], max_new_tokens=20)
    assert len(gen.texts[0].split()) >= 3  # real words, not an empty string
    print(f"cached load took {elapsed:.2f} s")


def test_tiny_model_is_seeded_and_shares_the_tokenizer(tiny):
    model, tok = tiny
    again, _ = loading.load_model("tiny")
    for a, b in zip(model.parameters(), again.parameters()):
        assert torch.equal(a, b)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64
    assert "<|im_start|>" in tok.apply_chat_template(CHATS[1], tokenize=False)


def test_a_frozen_model_computes_the_same(smol):
    # frozen=True: no gradients, the same weights; so the same logits and the same greedy reply
    # (the same kernels on the same shapes in one process: equal bit for bit, whatever the CPU).
    model, tok = smol
    frozen, _ = loading.load_model("smollm2-135m", frozen=True)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert all(p.requires_grad for p in model.parameters())
    ids, mask = models.left_pad(models.chat_prompt_ids(tok, CHATS), tok.pad_token_id)
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask).logits
        b = frozen(input_ids=ids, attention_mask=mask).logits
    assert (a - b).abs().max().item() < 1e-3 * a.abs().max().item()
    assert (
        models.generate(frozen, tok, CHATS, max_new_tokens=20).texts
        == models.generate(model, tok, CHATS, max_new_tokens=20).texts
    )


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads Linux's /proc")
def test_a_frozen_model_lets_go_of_the_weight_file(smol):
    # The weights are read through the memory-mapped safetensors file; if the model's tensors
    # kept pointing into the mapping, all it read would stay resident on top of the model's own
    # copies, and the growth would pass the bound below.
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from plumbing import loading\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "before = rss(); loading.load_model('smollm2-135m', frozen=True); print((rss() - before) / 1e9)"
    )
    root = Path(__file__).resolve().parents[1]
    grown = float(
        subprocess.run(
            [sys.executable, "-c", script, str(root)], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    assert grown < 0.9


def test_missing_model_is_a_one_line_error(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(UserError) as err:
        loading.load_model(str(empty))
    assert "config.json" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError) as err:
        loading.load_model("no-such-org/no-such-model-xyz")
    assert "no-such-org/no-such-model-xyz" in str(err.value) and "\n" not in str(err.value)


def test_clean_reply():
    names = ["Anchor", "Catalyst", "Beacon", "Guide"]
    assert models.clean_reply("Anchor: That sounds hard.", "Anchor", names) == "That sounds hard."
    assert models.clean_reply("**Anchor**: I hear you.", "Anchor", names) == "I hear you."
    assert (
        models.clean_reply("I hear you.\nUser: thanks\nAnchor: ok", "Anchor", names)
        == "I hear you."
    )
    assert models.clean_reply("Good point. Catalyst: but why?", "Anchor", names) == "Good point."
    assert (
        models.clean_reply("  Take one   small step today.  ", "Guide", names)
        == "Take one small step today."
    )
    # The prompt's own label for another agent's turn, with any name (ESConv's "Supporter"): dropped at the
    # start, cut where the reply goes on to write that turn.
    assert (
        models.clean_reply(
            "(Supporter, another companion): I hear you.\n(Supporter, another companion): Yes.",
            "Anchor",
            names,
        )
        == "I hear you."
    )
    assert (
        models.clean_reply("So hard. (Beacon, another companion): You did well!", "Anchor", names)
        == "So hard."
    )
    # A name inside a sentence is not a speaker label.
    assert (
        models.clean_reply("Like Beacon said, you did well.", "Anchor", names)
        == "Like Beacon said, you did well."
    )


def test_sentence_encoder_is_normalised_and_meaningful():
    enc = loading.SentenceEncoder()
    v = enc.embed(
        ["I lost my job today.", "I was fired this morning.", "The cake recipe needs eggs."]
    )
    assert v.shape == (3, 384)
    # Unit length up to fp32 rounding: normalising and the norm here each sum 384 squares
    # (relative error up to ~384 * 2^-24 each, whatever order a CPU's kernels add them in).
    assert torch.allclose(v.norm(dim=1), torch.ones(3), atol=2 * 384 * 2**-24)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.3


def test_bf16_is_native_only_where_pytorch_dispatches_avx512_kernels(monkeypatch):
    # Under ATEN_CPU_CAPABILITY=default PyTorch's bf16 attention raises even on an AMX CPU
    # ("pack_vnni2 is only supported when avx512 is supported"): fp32 must be chosen there.
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert not devices.native_bf16("cpu")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert not devices.native_bf16("cpu")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert devices.native_bf16("cpu")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    assert not devices.native_bf16("cpu")  # AVX-512 without BF16 or AMX: bf16 is emulated


def test_a_hub_id_without_a_network_fails_at_once_from_the_cache_only(monkeypatch):
    """Offline, the hub's client retries a hub id for ~50 s; one refused connection sends the load to the
    local cache (local_files_only) and the error comes at once, naming the flag."""
    import socket

    from plumbing.common import UserError

    seen = []

    def unreachable(*a, **k):
        raise OSError("Network is unreachable")

    def from_pretrained(source, **kw):
        seen.append(kw.get("local_files_only"))
        raise OSError(f"{source} is not in the cache")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", from_pretrained)
    with pytest.raises(
        UserError, match="--speakers someone/no-such-model: not a local model folder"
    ):
        loading.load_model("someone/no-such-model", flag="--speakers")
    assert seen == [True]


class RunsCode:
    """A pickle that runs code when loaded: what weights_only refuses."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def broken_folder(tmp_path: Path, tiny, damage: str) -> Path:
    """A model folder written by save_pretrained, then damaged one way."""
    import json
    import pickle

    from plumbing import files

    folder = files.save_model(*tiny, tmp_path / damage)
    if damage == "shapes":  # a config that does not describe the weights beside it
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "intermediate_size": 96}))
    elif damage == "garbage":
        (folder / "model.safetensors").write_bytes(b"\xff" * 4096)
    else:  # pickled weights that would run code
        (folder / "model.safetensors").unlink()
        with open(folder / "pytorch_model.bin", "wb") as f:
            pickle.dump({"weight": RunsCode(tmp_path / "code-ran")}, f, protocol=2)
    return folder


@pytest.mark.parametrize(
    "damage, needle",
    [
        ("shapes", "its weights do not fit its config.json"),
        ("garbage", "is damaged (Error while deserializing header: header too large)"),
        ("pickle", "its pickled weights (pytorch_model.bin) are refused"),
    ],
)
def test_a_broken_model_folder_is_one_line_naming_flag_and_folder(
    tmp_path, tiny, damage, needle, capsys
):
    folder = broken_folder(tmp_path, tiny, damage)
    capsys.readouterr()
    with pytest.raises(UserError) as err:
        loading.load_model(str(folder), flag="--speakers")
    message = str(err.value)
    assert message.startswith(f"--speakers {folder}: ") and needle in message, message
    assert "\n" not in message and "weights_only` set to `False" not in message
    assert capsys.readouterr().err == ""  # not even torch's two-line warning about the pickle
    assert not (tmp_path / "code-ran").exists()


def test_an_unusable_cache_is_one_line_before_the_conversion(tmp_path, monkeypatch):
    """MASCOT_CACHE (or HOME, its default's root) where no folder can be made: one line naming
    MASCOT_CACHE at once, not an OSError after the ~20 s conversion."""

    def conversion(*args, **kwargs):
        raise AssertionError("the conversion began")

    monkeypatch.setattr(loading.AutoTokenizer, "from_pretrained", conversion)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    monkeypatch.setenv("MASCOT_CACHE", str(a_file / "cache"))
    with pytest.raises(UserError) as err:
        loading.load_model("smollm2-135m")
    assert str(err.value).startswith(f"MASCOT_CACHE {a_file / 'cache'}: cannot write there")
    monkeypatch.delenv("MASCOT_CACHE")
    monkeypatch.setenv("HOME", str(a_file))
    with pytest.raises(UserError) as err:
        loading.load_model("tiny")
    message = str(err.value)
    assert message.startswith("MASCOT_CACHE (unset: under HOME) ") and str(a_file) in message
    assert "\n" not in message
