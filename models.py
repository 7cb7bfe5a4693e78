"""models.py: the sampler GRPO learns from, used by every stage, and the sentence encoder.

    generate(model, tok, chats) -> Generation          batched sampling with a KV cache (below)
    generate_texts(...)         -> list[str]           the same for frozen roles (local or served)

    clean_reply(text, name, others)                    strip "Anchor:", stop at other speakers

Where it sits: GRPO (grpo.py) samples the rollouts of both stages, the speakers' replies and
the director's directives, with `generate` and trains on exactly the tokens it returns; every
frozen role of a conversation (simulate.py: speakers, simulated user) and a director under
evaluation speak through `generate_texts`. GRPO learns from what `generate` samples, so its
log-probabilities and the trainer's must agree (grpo.py logs the gap as `logp_mismatch`).

What it simplifies: a plain batched sampler on Hugging Face models (left padding, one prefill per
distinct prompt, a per-row KV cache), in place of the vLLM engine a large run would sample with;
the comment block above `generate` lists what it leaves out. Loading a model by name (the embedded
SmolLM2-135M, `tiny`, a folder, a hub id) is plumbing: plumbing/loading.py.

Nothing here runs by itself; its tests and its benchmark do:
    python -m pytest -q tests/test_sampler.py tests/test_models.py
    python bench/generate_speed.py --repeats 3
"""

import copy
import re
from dataclasses import dataclass
from typing import Callable

import torch

from plumbing.offload import OffloadedAdamW
from plumbing.templates import render_chat

# How simulate.speaker_messages labels another agent's turn in a speaker's prompt ...
OTHER_LABEL = "({}, another companion)"
# ... and the pattern that finds such a label in a reply (clean_reply, reward.py's checks).
OTHER_TURN = re.escape(OTHER_LABEL).replace(r"\{\}", r"[^()\n]{1,40}")


def adamw(model, lr: float, weight_decay: float):
    """Every training loop's AdamW, fused: one kernel updates each parameter in place, where the
    default (foreach) allocates temporaries as large as all the parameters together, which costs
    memory and time on a CPU. AdamW always updates fp32 weights: bf16's 8 significant bits would
    lose a small step. So a model trained in bf16 (--offload-optimizer loads it so) gets fp32
    master copies, and AdamW's state, in CPU memory (plumbing/offload.py)."""
    if any(p.dtype == torch.bfloat16 for p in model.parameters()):
        return OffloadedAdamW(model, lr, weight_decay)
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


def policy_dtype(offload: bool) -> torch.dtype:
    """The dtype a trained model is loaded in: fp32 (AdamW's small updates need its 24 bits), or
    bf16 under --offload-optimizer, whose fp32 master weights live in CPU memory instead."""
    return torch.bfloat16 if offload else torch.float32


def set_gradient_checkpointing(model, enabled: bool) -> None:
    """HF activation checkpointing: each layer keeps only its input in the forward pass and is run
    again in backward, so activation memory drops to one layer's for ~1/3 more compute."""
    if enabled != model.is_activation_checkpointing:
        if enabled:
            model.activation_checkpointing_enable(
                activation_checkpointing_kwargs={"use_reentrant": False}
            )
        else:
            model.activation_checkpointing_disable()


def clean_reply(text: str, own_name: str = "", other_names: list[str] = ()) -> str:
    """Small models often open with their own label ("Anchor: ...", "**Anchor**:", in the others'
    "(X, another companion):") and go on to write the next speaker's line ("... \\nUser: thanks!"):
    remove the first, cut at the second, and join the lines into one message."""
    # 1. An opening label: the speaker's own name, bold or quoted perhaps, then ':' or a dash; or
    #    the label the prompt gives the other companions' turns.
    own = ""
    if own_name:
        own = rf"[\*\"']*\s*{re.escape(own_name)}\s*[\*\"']*\s*[:\-–—]|"
    text = re.sub(rf"^\s*(?:{own}{OTHER_TURN}\s*:?)\s*", "", text, flags=re.IGNORECASE)
    # 2. Another speaker's line ("User:", "**Beacon**:", "(Beacon, another companion)"): cut there.
    speakers = [*other_names, "User", "Assistant", "You", "Me"]
    others = [n for n in speakers if n and n.lower() != own_name.lower()]
    names = "|".join(re.escape(n) for n in others)
    label = rf"[\*\"']*\s*({names})\s*[\*\"']*\s*:"
    cut = re.search(rf"(^|\n|\s)({label}|{OTHER_TURN})", text, flags=re.IGNORECASE)
    if cut:
        text = text[: cut.start()]
    return re.sub(r"\s+", " ", text).strip()


# --- The sampler ---------------------------------------------------------------------------------
# One call of `generate` turns B chat prompts into B replies, the way nanochat's Engine does it:
#   1. tokenise the prompts and LEFT-pad them to a common width P, so that every row's last prompt
#      token sits in the same column and the new tokens are appended in lock-step (prompt_batch);
#   2. prefill once per DISTINCT prompt: GRPO asks for G replies to each prompt, so 2 prompts x
#      G 4 need 2 prefills, not 8. A speaker prompt is a few hundred tokens, so the prefill is most
#      of the arithmetic (prefill);
#   3. give every row its own copy of its prompt's keys and values (the KV cache), still in
#      `prefill`: the copies then grow apart as each row appends its own tokens;
#   4. decode: one forward over the B newest tokens per step, each row sampling with its own
#      generator; a row that emits a stop token only pads from then on (decode, sample_step);
#   5. mask each row after its first stop and decode the texts (to_generation).
# Left out (vLLM has them): continuous batching, paged attention, speculative decoding, top-k.


@dataclass
class Generation:
    """Texts for people, tensors for GRPO: torch.cat([prompt_ids, completion_ids], 1) is exactly
    what the model saw. completion_mask is 1 up to and including each row's stop token (so the
    policy also learns WHEN to stop); sampler_logprobs are the sampler's own log-probs of its
    tokens (0 on padding), which GRPO compares with its recomputation (`logp_mismatch`)."""

    texts: list[str]
    prompt_ids: torch.Tensor  # (B, P) long, left-padded
    prompt_mask: torch.Tensor  # (B, P)
    completion_ids: torch.Tensor  # (B, C) long, right-padded
    completion_mask: torch.Tensor  # (B, C)
    finished: list[bool]  # did the row end with a stop token (not the length limit)?
    sampler_logprobs: torch.Tensor | None = None  # (B, C) float32
    # (B, C) float32: the entropy of each step's distribution, which GRPO logs as `entropy`
    sampler_entropy: torch.Tensor | None = None


@dataclass(frozen=True)
class DecodeOptions:
    """The two things only the tools beside the method ask of the sampler; training and the
    evaluation never set them, so they stay out of `generate`'s main arguments.

    min_new_tokens: the stop tokens are forbidden for the first steps. The benchmarks (bench/) fix
        every reply's length with it, as TRL's `min_new_tokens` does, so that both do equal work.
    on_token(tokens): called with the (B,) tokens of every step, as they are sampled; the chat
        (simulate.Cast.on_token) shows a reply while it is written."""

    min_new_tokens: int = 0
    on_token: Callable | None = None


@dataclass
class Sampling:
    """`generate`'s settings, resolved for one batch: what the decode loop (step 4) reads."""

    max_new_tokens: int
    temperature: float
    top_p: float
    generators: list[torch.Generator] | None  # one per row (row_generators); None: greedy
    stops: torch.Tensor  # (S,) the token ids that end a row (stop_token_ids)
    pad_id: int  # what a row writes once it has stopped
    options: DecodeOptions


# Every chat template's end-of-turn marker we know, beside the eos tokens a model names itself:
# ChatML (Qwen, SmolLM2) <|im_end|>; Llama 3 <|eot_id|>, and Llama 3.1's <|eom_id|> (the end of a
# tool-calling message) and <|end_of_text|>; Phi-3 <|end|>; Gemma <end_of_turn>; GPT-style <|endoftext|>.
END_OF_TURN_MARKERS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
)


def stop_token_ids(tokenizer, generation_config=None) -> list[int]:
    """The tokens that end a reply: the tokenizer's eos, the eos list of the model's own generation
    config (Llama 3.1 names three), and the end-of-turn markers the vocabulary has."""
    ids = {tokenizer.eos_token_id}
    own = getattr(generation_config, "eos_token_id", None)
    if isinstance(own, int):
        ids.add(own)
    elif own is not None:
        ids.update(own)
    for marker in END_OF_TURN_MARKERS:
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def chat_prompt_ids(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    """Each conversation through the model's own chat template, ready for the assistant's turn."""
    rows = []
    for messages in conversations:
        # One rule for every model family (plumbing/templates.py): thinking off, the system message
        # folded where the template refuses one, alternation kept where it is required.
        text = render_chat(tokenizer, messages, add_generation_prompt=True)
        # The template already wrote the special tokens it wants (<|im_start|> ...): add no more.
        rows.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return rows


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, mask), both (B, P), padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
    return ids, mask


def distinct_rows(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """(first row of each distinct prompt, distinct index of every row):
    [a, a, b, b, a] -> ([0, 2], [0, 0, 1, 1, 0])."""
    first = []  # the first row of each distinct prompt
    index_of = {}  # prompt -> its distinct index
    for i, r in enumerate(rows):
        if tuple(r) not in index_of:
            index_of[tuple(r)] = len(first)
            first.append(i)
    return first, [index_of[tuple(r)] for r in rows]


def row_generators(seeds, B: int, device) -> list[torch.Generator] | None:
    """The seeding contract: None -> greedy; an int -> row i uses seed + i; a list -> one per row.
    Each row gets its OWN generator, so its tokens depend on its seed and prompt only, never on what
    else is in the batch, and a resumed run samples exactly what an uninterrupted one did."""
    if seeds is None:
        return None
    if isinstance(seeds, int):
        seeds = [seeds + i for i in range(B)]
    else:
        seeds = list(seeds)
    if len(seeds) != B:
        raise ValueError(f"generate: {len(seeds)} seeds for {B} rows")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generators) -> torch.Tensor:
    """One token per row from logits (B, V); greedy when generators is None."""
    if generators is None:
        return logits.argmax(dim=-1)  # (B,)
    probs = torch.softmax(logits.float() / max(temperature, 1e-5), dim=-1)  # (B, V)
    if top_p < 1.0:
        # Nucleus (Holtzman et al. 2020): the smallest set of tokens whose probability reaches
        # top_p (the top one always). Sorting the whole vocabulary every step is slow on a CPU and
        # the nucleus nearly always lies in the top 1024: sort those, and everything only when
        # they fall short of top_p (the same result either way).
        sorted_p, order = probs.topk(min(1024, probs.shape[-1]), dim=-1)  # (B, K) descending
        if bool((sorted_p.sum(-1) < top_p).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)  # (B, V)
        # Keep a token while the probability BEFORE it is still short of top_p.
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # (B, K)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)  # (B, V)
    # Inverse-CDF sampling with ONE uniform number per row from that row's generator (the same
    # distribution as torch.multinomial); float64 so that 49k fp32 terms do not blur rare tokens.
    cdf = probs.double().cumsum(dim=-1)  # (B, V)
    u = torch.stack(
        [torch.rand((), generator=g, dtype=torch.float64, device=probs.device) for g in generators]
    )  # (B,)
    # The first token whose cumulative probability passes u (scaled: the kept mass may be < 1).
    token = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)  # (B, 1)
    return token.squeeze(1).clamp(max=probs.shape[-1] - 1)  # (B,)


def prompt_batch(tokenizer, conversations, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1: the chats as left-padded (ids, mask), both (B, P), on the model's device."""
    ids, mask = left_pad(chat_prompt_ids(tokenizer, conversations), tokenizer.pad_token_id)
    return ids.to(device), mask.to(device)


def prefill(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor):
    """Steps 2 and 3: run each distinct prompt once, then give every row its own copy of its
    prompt's KV cache. Returns (cache, logits): the cache (B rows) and the (B, V) logits of the
    token that follows each prompt."""
    # Positions count real tokens only, as if unpadded: left padding must not shift RoPE.
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)  # (B, P)
    first_rows, prompt_of_row = distinct_rows(prompt_ids.tolist())
    first = torch.tensor(first_rows, device=prompt_ids.device)  # (U,) a row per distinct prompt
    index = torch.tensor(prompt_of_row, device=prompt_ids.device)  # (B,) each row's prompt
    # logits_to_keep=1: only the last position picks the next token; skip the (U, P, V) rest.
    out = model(
        input_ids=prompt_ids[first],
        attention_mask=prompt_mask[first],
        position_ids=positions[first],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = out.past_key_values
    cache.batch_select_indices(index)  # (U, ...) -> (B, ...): each row its prompt's copy
    logits = out.logits[index, -1, :]  # (B, V)
    return cache, logits


def sample_step(logits: torch.Tensor, done: torch.Tensor, t: int, sampling: Sampling):
    """One decode step's choice: (token, logp, entropy), each (B,). A finished row (done) writes
    padding, with log-prob and entropy 0, so that padding never counts in GRPO's sums."""
    if t < sampling.options.min_new_tokens:
        logits[:, sampling.stops] = float("-inf")  # no stop yet: DecodeOptions.min_new_tokens
    chosen = sample_next(logits, sampling.temperature, sampling.top_p, sampling.generators)
    token = torch.where(done, sampling.pad_id, chosen)  # (B,)
    # Log-probs at the sampling temperature, as GRPO recomputes them (grpo.completion_logprobs).
    logp_all = torch.log_softmax(logits.float() / max(sampling.temperature, 1e-5), -1)  # (B, V)
    logp = logp_all.gather(1, token[:, None])[:, 0].masked_fill(done, 0.0)  # (B,)
    entropy = torch.special.entr(logp_all.exp()).sum(-1)  # (B,) -sum p log p
    return token, logp, entropy.masked_fill(done, 0.0)


def decode(model, cache, logits: torch.Tensor, prompt_mask: torch.Tensor, sampling: Sampling):
    """Step 4: up to max_new_tokens steps, each a forward over only the B newest tokens. Returns
    the per-step lists (tokens, logps, entropies), each step's entry (B,); the loop ends early
    once every row has stopped."""
    B, P = prompt_mask.shape
    N = sampling.max_new_tokens
    # Every new token is real, so the attention mask grows by ones: step t reads columns :P + t + 1.
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(B, N)], dim=1)  # (B, P + N)
    next_pos = prompt_mask.sum(1, keepdim=True)  # (B, 1) each row's first new position
    done = torch.zeros(B, dtype=torch.bool, device=prompt_mask.device)  # (B,)
    tokens, logps, entropies = [], [], []
    for t in range(N):
        token, logp, entropy = sample_step(logits, done, t, sampling)
        tokens.append(token)
        logps.append(logp)
        entropies.append(entropy)
        if sampling.options.on_token is not None:
            sampling.options.on_token(token)
        done = done | torch.isin(token, sampling.stops)
        if t == N - 1 or bool(done.all()):
            break
        out = model(
            input_ids=token[:, None],
            attention_mask=mask[:, : P + t + 1],
            position_ids=next_pos + t,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )  # only the new token runs: the cache holds everything before it
        logits = out.logits[:, -1, :]  # (B, V)
    return tokens, logps, entropies


def to_generation(tokenizer, prompt_ids, prompt_mask, steps, stops: torch.Tensor) -> Generation:
    """Step 5: stack the decode loop's steps into (B, C) tensors, mask each row after its first
    stop token and decode the texts people read."""
    tokens, logps, entropies = steps
    B = prompt_ids.shape[0]
    if tokens:
        completion = torch.stack(tokens, 1)  # (B, C)
    else:
        completion = prompt_ids.new_zeros(B, 0)  # max_new_tokens = 0
    is_stop = torch.isin(completion, stops)  # (B, C)
    # 1 up to and including the first stop: no stop strictly before this column.
    stops_before = is_stop.long().cumsum(1) - is_stop.long()  # (B, C)
    completion_mask = (stops_before == 0).long()  # (B, C)
    texts = []
    for i in range(B):
        real = completion[i][completion_mask[i].bool()]
        texts.append(tokenizer.decode(real, skip_special_tokens=True).strip())
    return Generation(
        texts,
        prompt_ids.cpu(),
        prompt_mask.cpu(),
        completion.cpu(),
        completion_mask.cpu(),
        is_stop.any(1).tolist(),
        stacked(logps, B),
        stacked(entropies, B),
    )


def stacked(steps: list[torch.Tensor], B: int) -> torch.Tensor:
    """The per-step (B,) values as one (B, C) float32 tensor on the CPU; (B, 0) for no step."""
    if not steps:
        return torch.zeros(B, 0)
    return torch.stack(steps, 1).cpu()


@torch.no_grad()
def generate(
    model,
    tokenizer,
    conversations: list[list[dict]],
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds=None,
    options: DecodeOptions = DecodeOptions(),
) -> Generation:
    """One reply per conversation, all rows in one batch (the steps above).

    Args:
        conversations: B chats (lists of {"role", "content"}), each ready for the assistant's turn.
        max_new_tokens: the most tokens a reply may have; a row also ends at its first stop token.
        temperature, top_p: the sampling distribution (softmax(logits / T), then the nucleus).
        seeds: None -> greedy; an int or a list (row_generators).
        options: what only the tools ask for (DecodeOptions: a fixed length, streaming).
    Returns a Generation: texts, and the tensors GRPO trains on."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = prompt_batch(tokenizer, conversations, device)  # (B, P) each
    sampling = Sampling(
        max_new_tokens,
        temperature,
        top_p,
        row_generators(seeds, prompt_ids.shape[0], device),
        torch.tensor(stop_token_ids(tokenizer, model.generation_config), device=device),
        tokenizer.pad_token_id,
        options,
    )
    cache, logits = prefill(model, prompt_ids, prompt_mask)
    steps = decode(model, cache, logits, prompt_mask, sampling)
    return to_generation(tokenizer, prompt_ids, prompt_mask, steps, sampling.stops)


def generate_texts(
    model,
    tokenizer,
    conversations,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds=None,
    on_token=None,
) -> list[str]:
    """Only the texts: every frozen role (speakers, simulated user, a director under evaluation)
    generates through here. A served model (plumbing/served.py) is any object with its own
    generate_texts, so each role can also be an `openai:` endpoint; it streams nothing, so
    on_token (DecodeOptions) is for local models only."""
    if hasattr(model, "generate_texts"):
        return model.generate_texts(conversations, max_new_tokens, temperature, top_p, seeds)
    options = DecodeOptions(on_token=on_token)
    gen = generate(
        model, tokenizer, conversations, max_new_tokens, temperature, top_p, seeds, options
    )
    return gen.texts


class SamplingCopy:
    """A bf16 copy of the policy that only samples; the fp32 policy is the one trained (bf16's 8
    significant bits would lose AdamW's small updates). Where bf16 is native
    (plumbing/devices.native_bf16) a decode step, which reads every weight to make one token per
    row, reads half the bytes and runs faster. The price is a slightly different sampling
    distribution, which GRPO logs as `logp_mismatch` (mean |logp_sampler - logp_trainer| per
    token). Buffers such as RoPE's frequencies stay fp32.

    Usage: copy = SamplingCopy(policy); copy.refresh() before sampling; generate(copy.model, ...);
    copy.release() while the policy trains, so the copy's memory is free for the update."""

    def __init__(self, policy):
        self.policy = policy
        self.model = copy.deepcopy(policy).eval().requires_grad_(False)
        self.release()  # no weights held until the first refresh

    @torch.no_grad()
    def refresh(self) -> None:
        """The policy's current weights, rounded to bf16."""
        theirs = dict(self.policy.named_parameters())
        for name, mine in self.model.named_parameters():
            mine.data = theirs[name].detach().to(torch.bfloat16)

    def release(self) -> None:
        """Drop the bf16 weights (empty tensors): their memory is the update's while it trains."""
        for p in self.model.parameters():
            p.data = torch.empty(0, dtype=torch.bfloat16)
