"""sampler.py: batched chat generation with a KV cache, the sampler every stage of MASCOT uses.

Stage 1 samples G candidate replies per prompt for GRPO, stage 2 rolls out directives with the
frozen speakers and the simulated user, the evaluation simulates whole conversations: every one
of them is a call of

    generate(model, tok, conversations, max_new_tokens, temperature, top_p, seeds) -> Generation

which returns the texts for people and the token tensors GRPO trains on (prompt and completion
ids and masks, the sampler's own log-probs). The frozen roles need only the texts and call
generate_texts, which also accepts a model served elsewhere (openai_client.ServedModel). SamplingCopy(policy) is a copy of the policy laid
out for faster sampling, refreshed after every optimiser step; the fp32 policy is the one trained.

Models come from models.load_model. Run on its own to check that the embedded model speaks:

    python sampler.py "I failed my driving test today."
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

import models
from openai_client import ServedModel


def stop_token_ids(tokenizer) -> list[int]:
    """Token ids that end a chat turn: eos plus the chat template's end-of-turn marker if any."""
    ids = {tokenizer.eos_token_id}
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None and tid >= 0:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


# ----------------------------------------------------------------------------------------------
# Batched generation: our sampler
# ----------------------------------------------------------------------------------------------
# The whole of sampling, as a chapter. One call of `generate` turns B chat prompts into B replies:
#
#   1. tokenise the prompts and LEFT-pad them to a common width P, so every row's last prompt
#      token sits in the same column and new tokens are appended in lock-step;
#   2. prefill: run the model once over each DISTINCT prompt. GRPO asks for G replies to the same
#      prompt (the candidates of a state are K replies to one prompt), so 2 prompts x G 4 need 2
#      prefills, not 8. At ~300-token prompts the prefill is most of the arithmetic (8 x 300
#      tokens took 4-5 s of a 10 s HF generate on the 2-core CPU), so this is the big saving;
#   3. copy each prompt's keys/values into the rows that sample from it, in a cache allocated
#      once for P + max_new_tokens positions (HF's DynamicCache instead re-allocates and copies
#      the whole cache with torch.cat at every step of every layer: ~13 % of a decode step);
#   4. decode: one forward over the B newest tokens per step, reading the cache; sample one token
#      per row with that row's own generator; a row that emits a stop token is finished and only
#      pads from then on; stop when every row is finished or after max_new_tokens. On the CPU
#      each layer's product with B rows is computed as W @ x^T (FewRowLinear), which reads the
#      weights faster than the default kernel at this shape.
#
# What it leaves out (nanochat's engine and vLLM have them): continuous batching (finished rows
# keep their slot until the batch ends), paged attention, speculative decoding, top-k. It is built
# on the HF model's own forward, so any HF causal LM with an ordinary attention cache works
# (Llama/SmolLM2, Qwen2, the tiny test model); `sampler="hf"` keeps HF's own cache and one
# prefill per row, the previous implementation, as the fallback and the reference in the tests.

@dataclass
class Generation:
    """What one call of `generate` returns: texts for people, tensors for GRPO.

    prompt_ids / prompt_mask are left padded to the longest prompt (width P);
    completion_ids / completion_mask are right padded to the longest completion (width C).
    completion_mask is 1 for every generated token up to and including the stop token, so the
    policy also learns WHEN to stop. torch.cat([prompt_ids, completion_ids], 1) is exactly the
    sequence the model saw.
    sampler_logprobs: log-prob of each sampled token under the model that sampled it, at the
    sampling temperature (before top-p), 0 on padding. GRPO compares it with its own fp32
    recomputation to show how far a bf16 sampling copy is from the policy. None only in a
    Generation built by hand (tests).
    """
    texts: list[str]                 # decoded completions, special tokens removed
    prompt_ids: torch.Tensor         # (B, P) long
    prompt_mask: torch.Tensor        # (B, P) long
    completion_ids: torch.Tensor     # (B, C) long
    completion_mask: torch.Tensor    # (B, C) long
    finished: list[bool]             # did the row end with a stop token (not the length limit)?
    sampler_logprobs: torch.Tensor | None = None   # (B, C) float32, or None


def chat_prompt_ids(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    """Render each conversation through the model's own chat template and tokenise it."""
    out = []
    for messages in conversations:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into (ids, mask), both (B, P)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r):] = 1
    return ids, mask


def distinct_rows(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """Which rows share a prompt: (first row of each distinct prompt, distinct index of every row).

    Example: prompts [a, a, b, b, a] -> ([0, 2], [0, 0, 1, 1, 0]). Rows need not be adjacent.
    """
    first, index_of = [], {}
    for i, r in enumerate(rows):
        if tuple(r) not in index_of:
            index_of[tuple(r)] = len(first)
            first.append(i)
    return first, [index_of[tuple(r)] for r in rows]


def row_generators(seeds: list[int] | int | None, B: int, device) -> list[torch.Generator] | None:
    """The seeding contract: None -> greedy (no generators); an int -> row i uses seed + i;
    a list -> one seed per row. Each row gets its OWN torch.Generator, so a row's tokens depend
    only on its seed and its prompt, never on what else is in the batch."""
    if seeds is None:
        return None
    seed_list = [seeds + i for i in range(B)] if isinstance(seeds, int) else list(seeds)
    if len(seed_list) != B:
        raise ValueError(f"generate: {len(seed_list)} seeds for {B} rows")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seed_list]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generators: list[torch.Generator] | None) -> torch.Tensor:
    """Pick one token per row from logits (B, V): greedy when generators is None.

    Each row samples with ITS OWN torch.Generator, so row i's tokens depend only on row i's seed
    and not on what else is in the batch: the same seed gives the same reply alone or batched,
    and a GRPO group can share seeds across rows so that only the prompt differs.
    """
    if generators is None:
        return logits.argmax(dim=-1)                                       # (B,)
    probs = torch.softmax(logits.float() / max(temperature, 1e-5), dim=-1)  # (B, V)
    if top_p < 1.0:
        # Nucleus sampling: keep the smallest set of tokens whose probability sums to >= top_p.
        # Sorting all 49k probabilities costs ~40 ms a step at B = 8, and the nucleus nearly always
        # lies within the top 1024: sort those (topk), and everything only when they fall short.
        sorted_p, order = probs.topk(min(1024, probs.shape[-1]), dim=-1)   # (B, K) descending
        if bool((sorted_p.sum(-1) < top_p).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)          # (B, V)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p                      # (B, K), top token kept
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p * keep)  # (B, V)
    # Inverse-CDF sampling: one u ~ U[0, 1) per row, from that row's own generator; the token is
    # the first whose cumulative probability exceeds u * total (total < 1 after top-p: no need to
    # renormalise). Same distribution as torch.multinomial, with ONE random number per row: the
    # Gumbel-max / exponential race draws one per vocabulary entry, 49k, ~14 ms per step at B = 8.
    # float64 cumsum: over 49k terms fp32 rounding would shift the boundaries of rare tokens.
    cdf = probs.double().cumsum(dim=-1)                                    # (B, V)
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64, device=probs.device)
                     for g in generators])                                 # (B,)
    picks = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)  # (B, 1)
    return picks.squeeze(1).clamp(max=probs.shape[-1] - 1)                 # (B,)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(token) under softmax(logits / temperature), in fp32: the same quantity (and the same
    temperature convention) as grpo.completion_logprobs, so the two can be compared."""
    logp = torch.log_softmax(logits.float() / max(temperature, 1e-5), dim=-1)  # (B, V)
    return logp.gather(1, tokens[:, None]).squeeze(1)                      # (B,)


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, in a buffer allocated ONCE for all P + N positions.

    HF's DynamicLayer appends each step's keys with torch.cat, which allocates a new tensor
    and copies the whole cache, every layer, every step. Here a step writes its new column in
    place and hands attention a view of the filled part, (B, H, length, D): same values, no
    copies. Mask sizes and sequence length are DynamicLayer's own, read off that view.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int):
        super().__init__()
        B, H, P, D = keys.shape                                        # P positions filled
        self.key_buffer = keys.new_empty(B, H, capacity, D)            # (B, H, P + N, D)
        self.value_buffer = values.new_empty(B, H, capacity, values.shape[-1])
        self.length = 0
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self.update(keys, values)

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]                                       # new positions
        self.key_buffer[:, :, self.length:self.length + n] = key_states
        self.value_buffer[:, :, self.length:self.length + n] = value_states
        self.length += n
        self.keys = self.key_buffer[:, :, :self.length]                # (B, H, length, D) view
        self.values = self.value_buffer[:, :, :self.length]
        return self.keys, self.values


class FewRowLinear(torch.overrides.TorchFunctionMode):
    """While active, every linear layer applied to a few rows on the CPU is computed as W @ x^T.

    A decode step multiplies B = 8 rows by every weight matrix once, so its time is spent reading
    weights from memory. PyTorch's CPU kernel for F.linear, x @ W^T with W stored (out, in), reads
    them slowly at that shape and does not split SmolLM2's 49k x 576 LM head across threads;
    the same product written W @ x^T does both (2 cores, weights not in cache: 0.84 -> 0.37 ms
    for a 1536 x 576 MLP matrix, 37 -> 17 ms for the LM head; from ~290 rows on, the two are level).
    Same fp32 products in another summation order: logits move in the last bits. A mode, not a
    change of the model: the trained policy's layers and its training pass stay as they are.
    """
    MAX_ROWS = 64                        # measured faster for 2-64 rows, level at 1 and at ~290

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, weight = args[0], args[1]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            rows = x.numel() // max(x.shape[-1], 1)
            if x.device.type == "cpu" and x.dim() >= 2 and rows <= self.MAX_ROWS:
                # Both row-major, as the kernel reads them fastest (a transposed input: 1.5x slower).
                out = torch.mm(weight, x.reshape(rows, -1).contiguous().T).T.contiguous()  # (rows, out)
                out = out if bias is None else out + bias
                return out.reshape(*x.shape[:-1], weight.shape[0])          # (..., out)
        return func(*args, **kwargs)


def prefill(model, prompt_ids, prompt_mask, max_new_tokens: int, shared: bool):
    """Run the prompts through the model; return (last-position logits (B, V), cache of B rows).

    shared=True (our sampler): one forward per DISTINCT prompt, then each row gets its own copy of
    its prompt's keys/values (index_select along the batch), in GrowingLayer buffers with room
    for max_new_tokens more: every row decodes its own continuation into its own slots.
    shared=False (sampler="hf"): one forward over all B rows into HF's own DynamicCache.
    """
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)                 # (B, P) real tokens only
    # logits_to_keep=1: only the last position's logits pick the next token; the other P - 1
    # positions would cost a (B, P, V) tensor (V = 49k) for nothing.
    if not shared:
        out = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                    use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :], out.past_key_values                   # (B, V), DynamicCache
    first, index = (torch.tensor(x, device=prompt_ids.device) for x in distinct_rows(prompt_ids.tolist()))
    out = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first],    # (U, P) U prompts
                position_ids=positions[first], use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        capacity = prompt_ids.shape[1] + max_new_tokens
        cache = Cache(layers=[GrowingLayer(layer.keys.index_select(0, index),      # (B, H, P, D)
                                           layer.values.index_select(0, index), capacity)
                              for layer in cache.layers])
    else:
        # Sliding-window or other special layers (e.g. Mistral, Gemma): keep HF's own cache
        # classes, which know their masks, and only give every row its copy.
        cache.batch_select_indices(index)
    return out.logits[index, -1, :], cache                                 # (B, V), B-row cache


def completion_tensors(completion: torch.Tensor, stops: torch.Tensor):
    """(completion_mask, finished) from the generated ids (B, C): real tokens are everything up to
    and including the first stop token of each row."""
    is_stop = torch.isin(completion, stops)                                # (B, C)
    after_stop = (is_stop.long().cumsum(1) - is_stop.long()) > 0           # strictly after
    return (~after_stop).long(), is_stop.any(dim=1).tolist()               # (B, C), [B]


@torch.no_grad()
def generate(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int = 64,
             temperature: float = 1.0, top_p: float = 1.0, seeds: list[int] | int | None = None,
             *, sampler: str = "ours", min_new_tokens: int = 0, compile_decode: bool = False,
             on_token=None) -> Generation:
    """Generate one reply per conversation, all rows in one batch with a KV cache.

    Args:
        conversations: chat messages per row, [{"role": "system"|"user"|"assistant", "content"}].
            Identical conversations (GRPO's G samples of a prompt) share one prefill.
        max_new_tokens: hard limit on reply length (rows stop earlier at their end-of-turn token).
        temperature, top_p: sampling controls (ignored when seeds is None).
        seeds: None -> greedy decoding; an int -> row i uses seed + i; a list -> one seed per row.
        sampler: "ours" (shared prefill, preallocated cache; the default) or "hf" (HF's own
            DynamicCache, one prefill per row: the previous implementation, the fallback).
        min_new_tokens: stop tokens are forbidden for the first min_new_tokens steps (as HF's
            MinNewTokensLogitsProcessor); the benchmarks use it to fix the reply length.
        compile_decode: run the one-token decode step through torch.compile (off by default; a
            GPU option: it compiles for minutes and each new cache length may recompile).
        on_token: called after every step with the (B,) tokens just sampled (pad for finished
            rows): the chat shows a reply while it is being written.
    Returns:
        Generation with texts, the padded prompt/completion tensors GRPO needs, and the
        sampler's own log-probs of its tokens.
    """
    if sampler not in ("ours", "hf"):
        raise ValueError(f"generate: sampler must be 'ours' or 'hf', got {sampler!r}")
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id
    stops = torch.tensor(stop_token_ids(tokenizer), device=device)
    prompt_ids, prompt_mask = left_pad(chat_prompt_ids(tokenizer, conversations), pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    (B, P), N = prompt_ids.shape, max_new_tokens
    generators = row_generators(seeds, B, device)
    step = torch.compile(model, dynamic=True) if compile_decode else model

    # Our sampler computes the few-row products of the decode steps as W @ x^T (FewRowLinear).
    # The mode is entered around each model forward only: every torch call made inside it pays a
    # Python call, and sampling a token or a streaming callback gains nothing from it.
    fast = sampler == "ours" and not compile_decode and device.type == "cpu"
    layout = FewRowLinear if fast else contextlib.nullcontext

    with layout():
        logits, cache = prefill(model, prompt_ids, prompt_mask, N, shared=(sampler == "ours"))
    # The attention mask for every position there will ever be, written once: the prompt's own
    # mask, then ones for the new tokens. Step t reads the first P + t columns.
    mask = torch.cat([prompt_mask, prompt_mask.new_ones(B, N)], dim=1)     # (B, P + N)
    # Positions count only real tokens, so a left-padded row sees the positions it would unpadded.
    next_pos = prompt_mask.sum(1, keepdim=True)                            # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps = [], []
    for t in range(N):
        if t < min_new_tokens:
            logits[:, stops] = float("-inf")
        token = sample_next(logits, temperature, top_p, generators)        # (B,)
        token = torch.where(done, pad_id, token)                           # finished rows pad
        logps.append(token_logprobs(logits, token, temperature).masked_fill(done, 0.0))
        tokens.append(token)
        if on_token is not None:
            on_token(token)
        done = done | torch.isin(token, stops)
        if t == N - 1 or bool(done.all()):
            break
        # Feed only the new token; the cache holds everything before it.
        with layout():
            out = step(input_ids=token[:, None], attention_mask=mask[:, :P + t + 1], position_ids=next_pos + t,
                       past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :]                                      # (B, V)

    completion = torch.stack(tokens, 1) if tokens else prompt_ids.new_zeros(B, 0)   # (B, C)
    completion_mask, finished = completion_tensors(completion, stops)
    texts = [tokenizer.decode(completion[i][completion_mask[i].bool()], skip_special_tokens=True).strip()
             for i in range(B)]
    sampler_logprobs = torch.stack(logps, 1) if logps else torch.zeros(B, 0)  # (B, C)
    return Generation(texts, prompt_ids.cpu(), prompt_mask.cpu(), completion.cpu(),
                      completion_mask.cpu(), finished, sampler_logprobs.cpu())


def generate_texts(model, tokenizer, conversations: list[list[dict]], max_new_tokens: int = 64,
                   temperature: float = 1.0, top_p: float = 1.0, seeds: list[int] | int | None = None,
                   on_token=None) -> list[str]:
    """Only the reply texts, from a local model (`generate`) or a served one (ServedModel, whose
    tokenizer is None). Every frozen role goes through here (speakers, simulated user, a director
    under evaluation), so each can be an `openai:` endpoint; GRPO needs the tensors and calls
    `generate`. A served reply arrives whole, so `on_token` is not called for it."""
    if isinstance(model, ServedModel):
        return model.generate_texts(conversations, max_new_tokens, temperature, top_p, seeds)
    return generate(model, tokenizer, conversations, max_new_tokens, temperature, top_p, seeds,
                    on_token=on_token).texts


class SamplingCopy:
    """A copy of the policy that only samples, laid out for speed; the fp32 policy is the one trained.

    Two layouts, one idea (a decode step reads every weight to make one token per row, so how the
    weights are stored sets its speed):
      dtype=torch.float32 (CPU): the same fp32 weights, every Linear packed for oneDNN
          (models.PackedLinear). Numerically the policy, up to summation order.
      dtype=torch.bfloat16: half the bytes per weight. Fast on a GPU and on CPUs with native bf16
          dot products (AVX512-BF16, AMX); on an AVX2-only CPU such as our 2-core EPYC, bf16
          matmuls are emulated and ~4x SLOWER than fp32 (bench/generate_speed.py), so CPU runs
          keep fp32. Only parameters are cast: buffers such as RoPE's inverse frequencies stay
          fp32 (a bf16 inv_freq would put position 300 off by up to ~0.6 radians).
    Training always uses the fp32 policy (bf16's 8 significant bits would lose the small AdamW
    updates, see grpo.autocast); what the copy changes is the sampling distribution, slightly,
    and grpo logs it as logp_mismatch = mean |logp_sampler - logp_trainer| per token.

    Usage: copy = SamplingCopy(policy); after every optimiser step (grpo_step does it right before
    sampling) copy.refresh(); then generate(copy.model, ...).
    """

    def __init__(self, policy, dtype: torch.dtype = torch.float32):
        self.policy, self.dtype = policy, dtype
        self.model = copy.deepcopy(policy).eval()
        device = next(policy.parameters()).device
        self.packed = dtype == torch.float32 and device.type == "cpu"
        if self.packed:
            models.pack_linears(self.model)
        for p in self.model.parameters():                    # embeddings and norms (and all, bf16)
            p.requires_grad_(False)
            p.grad = None
            p.data = p.data.to(dtype)

    @torch.no_grad()
    def refresh(self) -> None:
        """Take the policy's current weights: copy_ each parameter, re-pack each PackedLinear."""
        theirs = dict(self.policy.named_parameters())        # a tied weight is listed once
        for name, mine in self.model.named_parameters():
            mine.copy_(theirs[name])
        for name, module in self.model.named_modules():
            if isinstance(module, models.PackedLinear):
                module.pack(self.policy.get_submodule(name))


if __name__ == "__main__":
    message = " ".join(sys.argv[1:]) or "I failed my driving test today and feel stupid."
    t0 = time.time()
    model, tok = models.load_model(models.EMBEDDED)
    print(f"loaded {models.EMBEDDED} in {time.time() - t0:.1f} s")
    chat = [{"role": "system", "content": "You are a warm, brief listener."},
            {"role": "user", "content": message}]
    print(generate(model, tok, [chat], max_new_tokens=60).texts[0])
