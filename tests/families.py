"""tests/families.py: tiny random models of five model families, built offline (a test helper).

    FAMILIES                                  ("qwen3", "llama3", "gemma2", "gemma3", "phi3")
    build(family, folder, seed=0, **config)   -> folder: a loadable model folder
    render(family, messages, **kw)            -> the family's chat template applied to messages

mascot has only ever run on SmolLM2, but its users bring Qwen3, Llama 3, Gemma 2/3 and Phi-3. A
built folder is what `from_pretrained` would give for one of those, shrunk: the family's own
transformers class (2 layers, hidden 64, random seeded weights), and SmolLM2's tokenizer given the
family's special tokens, bos/eos/pad and chat template (tests/fixtures/chat_templates/, our own
text reproducing each published format; see the README there). Gibberish, but every place where
the families differ is real: the turn markers, whether the template writes a bos and the tokenizer
adds another, whether there is a pad token, the list of stop tokens, Gemma's soft-capping and
sliding window (16 tokens, so a short test already crosses it), Qwen3's think block, Phi-3's fused
projections. Each builds in well under a second, with no download.
"""

import dataclasses
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from tokenizers import AddedToken
from transformers import (
    AutoTokenizer,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from plumbing import loading

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Family:
    """What a family's tokenizer and config look like, by token text (ids come from the tokenizer)."""

    special: tuple[str, ...]  # added to SmolLM2's tokenizer as special tokens, in this order
    bos: str | None
    eos: str
    pad: str | None
    stops: tuple[str, ...]  # generation_config.json's eos_token_id list
    add_bos: bool  # the tokenizer itself prepends bos when encoding (add_special_tokens=True)
    config_class: type
    model_class: type
    config: dict = field(default_factory=dict)  # the family's own settings, over SHAPE
    rstrip: tuple[str, ...] = ()  # special tokens that swallow the whitespace after them


# The shape every family shares: small enough to build and run in well under a second.
SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention; Phi-3-mini has none (4 below)
    head_dim=16,
    max_position_embeddings=4096,
)
WINDOW = 16  # Gemma's sliding window: a 20-token test sequence already crosses it

# Each family as its published instruct checkpoint has it: Qwen3 (0.6B), Llama 3.1 8B Instruct,
# Gemma 2 2B IT, Gemma 3 1B IT, Phi-3-mini-4k-instruct.
SPECS = {
    "qwen3": Family(
        special=("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|endoftext|>"),
        bos=None,  # Qwen3 has no bos token at all
        eos="<|im_end|>",
        pad="<|endoftext|>",
        stops=("<|im_end|>", "<|endoftext|>"),
        add_bos=False,
        config_class=Qwen3Config,
        model_class=Qwen3ForCausalLM,  # q_norm/k_norm on every layer: always on in Qwen3
        config=dict(tie_word_embeddings=True, rope_parameters=dict(rope_theta=1_000_000.0)),
    ),
    "llama3": Family(
        special=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
        ),
        bos="<|begin_of_text|>",
        eos="<|eot_id|>",
        pad=None,  # Llama 3 ships no pad token
        stops=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
        add_bos=True,  # and the template writes one too: encode a render and you get two
        config_class=LlamaConfig,
        model_class=LlamaForCausalLM,
        config=dict(
            rms_norm_eps=1e-5,
            # Llama 3.1's frequency-dependent RoPE scaling (factor 8), scaled down with the context:
            # 3.1 stretches 8192 positions to 131072; here 512 to 4096 (transformers warns unless
            # the original length is below max_position_embeddings).
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=500_000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=512,
            ),
        ),
    ),
    "gemma2": Family(
        special=("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        stops=("<eos>", "<end_of_turn>"),
        add_bos=True,
        config_class=Gemma2Config,
        model_class=Gemma2ForCausalLM,
        # Soft-capping (attention 50, final logits 30) stays at the config's defaults; layer 0 is
        # sliding, layer 1 global (the default alternation); queries scaled by head_dim as in 2B.
        config=dict(sliding_window=WINDOW, query_pre_attn_scalar=16),
    ),
    "gemma3": Family(
        special=("<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"),
        bos="<bos>",
        eos="<eos>",
        pad="<pad>",
        stops=("<eos>", "<end_of_turn>"),
        add_bos=True,
        config_class=Gemma3TextConfig,  # the text-only config (model_type "gemma3_text")
        model_class=Gemma3ForCausalLM,
        # The default pattern (5 sliding : 1 global) would make both layers sliding: say it.
        config=dict(
            sliding_window=WINDOW,
            query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
    "phi3": Family(
        special=("<s>", "<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        bos="<s>",
        eos="<|endoftext|>",
        pad="<|endoftext|>",
        stops=("<|endoftext|>", "<|assistant|>", "<|end|>"),
        add_bos=False,  # Phi-3-mini's tokenizer_config.json has add_bos_token: false
        config_class=Phi3Config,  # no head_dim field: hidden_size / num_attention_heads (16)
        model_class=Phi3ForCausalLM,  # fused qkv_proj and gate_up_proj
        config=dict(num_key_value_heads=4, rms_norm_eps=1e-5),
        # As in Phi-3-mini: the role tags and <|end|> eat the newline after them when encoding.
        rstrip=("<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
    ),
}
FAMILIES = tuple(SPECS)


def spec(family: str) -> Family:
    """The Family of a name in FAMILIES; any other name is a KeyError that lists them."""
    if family not in SPECS:
        raise KeyError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    return SPECS[family]


# --- The tokenizer: SmolLM2's vocabulary, the family's special tokens and template ---------------
@cache
def _smollm2_tokenizer_folder() -> Path:
    """The embedded SmolLM2 folder (its tokenizer files are all we read from it)."""
    return loading.embedded_model_folder()


def tokenizer(family: str):
    """A fresh SmolLM2 tokenizer dressed as the family's: its special tokens appended to the vocab
    (a token SmolLM2 already has, like <|im_end|>, keeps its id), its bos/eos/pad, whether encoding
    prepends bos, and its chat template."""
    fam = spec(family)
    tok = AutoTokenizer.from_pretrained(_smollm2_tokenizer_folder())
    extra = [
        AddedToken(text, special=True, normalized=False, rstrip=text in fam.rstrip)
        for text in fam.special
    ]
    # replace_extra_special_tokens: SmolLM2's own extras (<|im_start|>, ...) stay in the vocab but
    # are no longer listed as the tokenizer's extra special tokens.
    tok.add_special_tokens({"extra_special_tokens": extra}, replace_extra_special_tokens=True)
    tok.bos_token, tok.eos_token, tok.pad_token = fam.bos, fam.eos, fam.pad
    tok.unk_token = None  # byte-level BPE never needs one; SmolLM2's was <|endoftext|>
    # Rewrites the post-processor ("[bos] $A" or "$A"), which tokenizer.json keeps. transformers 5
    # neither saves nor reads add_bos_token beside a tokenizer.json, so a loaded tokenizer reads
    # tok.add_bos_token == False even where encoding adds bos (as real Llama 3 and Gemma do).
    tok.add_bos_token = fam.add_bos
    tok.chat_template = (TEMPLATES / f"{family}.jinja").read_text(encoding="utf-8")
    return tok


# --- The model -----------------------------------------------------------------------------
def model_config(family: str, tok, **overrides):
    """The family's config class at the shared tiny SHAPE, its token ids taken from `tok`. An
    override that is not a field of the config class is a TypeError: transformers would keep it
    as a stray attribute that nothing reads, so a misspelt field would pass unnoticed."""
    fam = spec(family)
    fields = {f.name for f in dataclasses.fields(fam.config_class)}
    if unknown := sorted(set(overrides) - fields):
        raise TypeError(f"{fam.config_class.__name__} has no field {', '.join(unknown)}")
    # SHAPE's fields the class lacks are left out: Phi3Config has no head_dim (it derives it).
    settings = {k: v for k, v in {**SHAPE, **fam.config}.items() if k in fields} | overrides
    return fam.config_class(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **settings,
    )


def generation_config(family: str, tok) -> GenerationConfig:
    """generation_config.json as the family ships it: bos, pad, and the list of stop tokens."""
    stops = [tok.convert_tokens_to_ids(text) for text in spec(family).stops]
    return GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=stops, pad_token_id=tok.pad_token_id
    )


def build(family: str, folder, seed: int = 0, **config_overrides) -> Path:
    """Write a tiny random model of `family` into `folder` (created if missing): config.json,
    model.safetensors, generation_config.json and the tokenizer files, loadable with
    AutoTokenizer/AutoModelForCausalLM and loading.load_model(str(folder)). config_overrides
    replace config fields (e.g. sliding_window=8, tie_word_embeddings=False)."""
    folder = Path(folder)
    tok = tokenizer(family)
    config = model_config(family, tok, **config_overrides)
    with torch.random.fork_rng():  # building a model never disturbs the caller's RNG
        torch.manual_seed(seed)
        model = spec(family).model_class(config)
    model.generation_config = generation_config(family, tok)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


# --- Quick looks ---------------------------------------------------------------------------
@cache
def _saved_tokenizer(family: str):
    """The family's tokenizer as a built folder holds it: saved, then loaded back."""
    with TemporaryDirectory() as tmp:
        tokenizer(family).save_pretrained(tmp)
        return AutoTokenizer.from_pretrained(tmp)


def render(family: str, messages: list[dict], **kw) -> str:
    """The family's chat template applied to `messages` (text, not ids), through the tokenizer
    as saved; kw go to apply_chat_template (add_generation_prompt=True, enable_thinking=False)."""
    kw.setdefault("tokenize", False)
    return _saved_tokenizer(family).apply_chat_template(messages, **kw)
