"""reward.py: the reward side of stage 1 (the paper's Phase I): what the speakers are trained to want.

Where it sits in MASCOT (arXiv 2601.14230, Phase I "persona-aware behavioural alignment", RLAIF):
  1. candidates: for each (context, persona) the base speaker policy samples several candidate
     replies (sampler.generate with different seeds);
  2. preference pairs: an AI judge (judge.py) scores every candidate for persona adherence and
     contextual appropriateness; two candidates of the same (context, persona) whose judge scores
     differ clearly become one pair (chosen = the better one, rejected = the worse one);
  3. reward model: a transformer with a scalar head, trained on those pairs with the
     Bradley-Terry loss, so that r(persona, conversation, reply) is high where the judge
     preferred the reply (`RewardModel`, `train_reward_model`);
  4. format reward: cheap rules that catch what a small speaker gets wrong most often: too short
     or rambling, "Anchor:" label prefixes, writing other people's lines, stopping mid-sentence
     (`format_reward`);
  5. GRPO (grpo.py) fine-tunes each speaker on the composite reward: reward-model score + format
     reward, with the speaker's persona in its system prompt.
The reward model and the format reward are plain functions of (context, reply) returning a number,
so the training loop and the evaluation call the same code; `judge.make_judge("rm:<folder>")`
also loads a saved reward model as a judge.

Why train a reward model at all, when the judge could score GRPO's samples directly? GRPO scores
G samples per prompt at every step, thousands of judgements per run; the reward model is one
forward pass of a small model, and it learns from comparisons, which judges make more reliably
than absolute scores (the reasoning of InstructGPT, Ouyang et al. 2022, section 3.5).

Our decisions where the paper is silent:
  - Architecture: a causal LM's transformer body (the embedded SmolLM2-135M by default; any HF
    causal LM folder works, and "tiny" for tests) with a linear head H -> 1 read at the last real
    token. One reward model serves all personas of a set: the persona is in the system message,
    so the score is conditional on it. The body is fully fine-tuned (the paper appears to use LoRA).
  - Input layout: `rm_messages` renders (persona, conversation, reply) as one chat; the same
    function builds training pairs and scores GRPO samples, so the two can never drift apart.
  - Training: AdamW, Bradley-Terry loss, a seeded held-out split whose accuracy (the fraction of
    pairs with r_chosen > r_rejected) is the number to watch: 0.5 is chance.
  - Format reward: our own four rules, each 0 or 1, averaged (see `format_reward`).
  - No reward normalisation after training: GRPO compares the G replies to the same prompt with
    each other (group advantages), so any constant offset of the reward cancels out.

The chapter ends with `build_reward_fn`, which runs steps 1-4 for a run folder (each step's output
is a file there, reused when present, so an interrupted stage 1 never samples or judges twice)
and returns the reward function that mascot.py hands to grpo.train_grpo.

How to run (the whole of stage 1: candidates, judge, pairs, reward model, then GRPO):
    python mascot.py train --stage 1                 # embedded SmolLM2-135M, offline judge
    python mascot.py train --stage 1 --model tiny    # seconds on a CPU: a smoke test of the plumbing
    python mascot.py train --help                    # every flag, with its default
"""

from __future__ import annotations

import json
import math
import random
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm
from transformers import AutoModel, AutoTokenizer

import grpo
import hacks
import models
import sampler
from data import (HERE, Context, PersonaSet, UserError, append_jsonl, atomic_folder, derive_seed, option, read_json,
                  read_jsonl, write_jsonl)
from metrics import standard_error
from simulate import (USER, Cast, JudgeState, RoundRobin, Turn, diagnose_reply, judge_state, run_conversations,
                      speaker_messages)

# The marker that tells a reward-model folder from any other folder (a speaker checkpoint, a typo).
CONFIG_FILE = "reward_config.json"
HEAD_FILE = "reward_head.safetensors"
FORMAT_TAG = "mascot-reward-model"


@dataclass
class RLAIFConfig:
    """Stage 1's own settings (GRPO's are grpo.GRPOConfig); each is also a `train` flag."""
    states: int = option(48, "training states (context, persona, conversation so far)", "positive")
    heldout_states: int = option(16, "held-out states for the before/after reward", "positive")
    candidates: int = option(4, "K candidate replies per state", "at-least-2")
    margin: float = option(0.05, "minimum judge-score gap (0-1 scale) for a preference pair", "non-negative")
    pairs_per_state: int = option(2, "at most this many pairs per state (widest gaps first)", "positive")
    # One epoch, as InstructGPT: on 204 ESConv pairs a second epoch took the held-out loss from
    # 0.33 to 1.01 and the held-out accuracy from 0.85 to 0.73 (docs/RESULTS.md).
    rm_epochs: int = option(1, "reward-model epochs", "positive")
    rm_lr: float = option(2e-5, "reward-model learning rate", "positive")
    rm_held_out: float = option(0.2, "share of pairs held out to measure the reward model", "fraction")
    format_weight: float = option(1.0, "weight of the format reward next to the reward-model score",
                                  "non-negative")
    hack_pairs: int = option(2, "synthetic reward hacks per judged state added to the reward model's "
                                "pairs as rejected replies (hacks.py); 0: none", "non-negative")


# ---------------------------------------------------------------------------------------------
# Core math: the Bradley-Terry loss
# ---------------------------------------------------------------------------------------------

def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the preferences under the Bradley-Terry model.

    Bradley & Terry (1952) model a comparison as P(chosen beats rejected) = sigmoid(r_c - r_r):
    only the DIFFERENCE of the two scores matters. Maximising that likelihood over the pairs is
    the reward-model loss of InstructGPT (Ouyang et al. 2022, eq. 1):
        loss = -mean log sigmoid(r_c - r_r)
    F.logsigmoid computes log sigmoid(x) = -log(1 + exp(-x)) without forming sigmoid(x) first:
    for x = -100, sigmoid(x) underflows to 0 in float32 and log(0) = -inf, while logsigmoid
    returns -100 exactly.

    Example: equal scores give sigmoid(0) = 1/2, so the loss is log 2 = 0.6931 whatever the scores
    are (a reward model that cannot tell the replies apart). r_c - r_r = 2 gives
    -log sigmoid(2) = log(1 + e^-2) = 0.1269.

    Args:
        r_chosen: (N,) scores of the preferred replies.
        r_rejected: (N,) scores of the other reply of each pair.
    Returns:
        scalar tensor: the loss averaged over the N pairs.
    """
    margin = r_chosen - r_rejected                                 # (N,) > 0 = ranked correctly
    return -F.logsigmoid(margin).mean()                            # scalar


# ---------------------------------------------------------------------------------------------
# What the reward model reads
# ---------------------------------------------------------------------------------------------

def rm_messages(state: JudgeState, reply: str) -> list[dict]:
    """The chat the reward model scores: the persona, the conversation so far, and the reply.

    system:    "You are Anchor. <role>: <what Anchor does and never does>"
    user:      one "Speaker: text" line per earlier turn, then "User: <latest user message>"
    assistant: the reply being judged
    The whole conversation goes into ONE user message, because the other agents' turns are not
    the reply-writer's own (they are not "assistant" turns) and the labels keep who-said-what.
    Training pairs, GRPO samples and the rm: judge all come through here: one source of truth
    for the layout, and the same JudgeState the AI judge saw (simulate.judge_state).
    """
    lines = [f"{turn['speaker']}: {turn['text']}" for turn in state.history]
    lines.append(f"User: {state.context}")
    return [{"role": "system", "content": f"You are {state.persona_name}. {state.persona_desc}".strip()},
            {"role": "user", "content": "\n".join(lines)},
            {"role": "assistant", "content": reply}]


# ---------------------------------------------------------------------------------------------
# The reward model
# ---------------------------------------------------------------------------------------------

def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Column of the last real (mask = 1) token of each row, for left OR right padding.

    arange(T) * mask is 0 on padding and the column number on real tokens, so its argmax is the
    last real column: T - 1 for every left-padded row, the row's length - 1 when right-padded.
    We cannot find padding from the token ids instead: SmolLM2's pad token is <|im_end|>, the
    same token that closes every chat turn.

    Args:
        attention_mask: (B, T) 1 for real tokens, 0 for padding.
    Returns:
        (B,) long column indices.
    """
    T = attention_mask.shape[1]
    columns = torch.arange(T, device=attention_mask.device)        # (T,)
    return (columns * attention_mask.long()).argmax(dim=1)         # (B,)


def common_prefix(rows: list[list[int]]) -> int:
    """Length of the longest prefix that every token list shares."""
    n = min(len(r) for r in rows)
    for i in range(n):
        if any(r[i] != rows[0][i] for r in rows[1:]):
            return i
    return n


class RewardModel(torch.nn.Module):
    """A transformer body plus a linear head: r(chat) = w . h_last, one number per chat.

    h_last is the final hidden state at the last real token. In a causal transformer that is the
    only position that has attended to the whole input (persona, conversation AND reply), which is
    why reward models read it there (InstructGPT; TRL's RewardTrainer does the same).
    """

    def __init__(self, backbone: torch.nn.Module, base_model: str = "", max_length: int = 512):
        """
        Args:
            backbone: a transformer body WITHOUT its LM head (e.g. `LlamaModel`): called with
                (input_ids, attention_mask, position_ids) it returns last_hidden_state (B, T, H).
            base_model: the name it came from ("smollm2-135m", "tiny", a folder), for the record.
            max_length: longest input in tokens; longer chats lose their OLDEST tokens (`encode`).
        """
        super().__init__()
        self.backbone = backbone
        self.base_model = base_model
        self.max_length = max_length
        hidden = backbone.config.hidden_size
        # No bias: the Bradley-Terry loss only sees r_c - r_r, in which a bias cancels, so a bias
        # would never receive a gradient. Small init as in Ziegler et al. 2019 (lm-human-preferences:
        # std 1 / sqrt(H + 1)), so the untrained scores start near zero but not all equal.
        self.head = torch.nn.Linear(hidden, 1, bias=False)
        torch.nn.init.normal_(self.head.weight, std=1.0 / math.sqrt(hidden + 1))
        self.head.to(device=next(backbone.parameters()).device)

    @classmethod
    def from_base(cls, name: str = models.EMBEDDED, device: str = "cpu", max_length: int = 512):
        """A fresh reward model on the body of a causal LM: (rm, tokenizer).

        `get_decoder()` is the LM without its LM head (`.model` for Llama/SmolLM2/Qwen): the head
        that predicts the next token is replaced by our scalar head.
        """
        lm, tokenizer = models.load_model(name, device=device)
        return cls(lm.get_decoder(), base_model=name, max_length=max_length), tokenizer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Scores of a padded batch.

        Args:
            input_ids: (B, T) token ids, padded on either side.
            attention_mask: (B, T) 1 for real tokens, 0 for padding.
        Returns:
            (B,) float32 scores, with gradient.
        """
        device = self.head.weight.device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        # Positions count real tokens only, so a left-padded row gets the same positions (and the
        # same score) as the row alone; grpo.completion_logprobs explains why this matters.
        position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)       # (B, T)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids, use_cache=False).last_hidden_state  # (B, T, H)
        rows = torch.arange(hidden.shape[0], device=device)                          # (B,)
        h_last = hidden[rows, last_token_index(attention_mask)]                      # (B, H)
        return self.head(h_last.to(self.head.weight.dtype)).squeeze(-1).float()      # (B,)

    def encode(self, tokenizer, messages_list: list[list[dict]], max_length: int | None = None):
        """Render chats with the tokenizer's chat template and tokenise them into a padded batch.

        Truncation is from the LEFT: a chat longer than max_length tokens loses its first tokens.
        The reply and the message it answers sit at the end and are what the score is about;
        the oldest history matters least. The price: a very long chat also loses the system
        prompt with the persona, so keep max_length above your longest persona + recent turns
        (persona ~80 tokens, a turn ~40: 512 leaves room for ~10 turns).

        Args:
            messages_list: chats from `rm_messages`.
            max_length: token limit per chat (default: the model's own `max_length`).
        Returns:
            input_ids, attention_mask: (B, T) long tensors, left-padded (sampler.left_pad).
        """
        return sampler.left_pad(self.token_rows(tokenizer, messages_list, max_length), tokenizer.pad_token_id)

    def token_rows(self, tokenizer, messages_list: list[list[dict]], max_length: int | None = None) -> list[list[int]]:
        """The chats as token lists, unpadded, each truncated from the left as `encode` explains."""
        limit = max_length or self.max_length
        rows = []
        for messages in messages_list:
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            rows.append(ids[-limit:])                              # keep the LAST `limit` tokens
        return rows

    def score_shared(self, rows: list[list[int]]) -> torch.Tensor:
        """Scores (B,) of chats that begin alike, with gradient; their common first tokens run once.

        A preference pair is two replies to one conversation: ~220 shared tokens of persona and
        history, then ~50 of reply each. The body runs the shared part once and then only the
        rows' own tokens against its keys and values (grpo.shared_prefix_forward, as for GRPO's
        shared prompts): the same scores and gradients as `forward` up to float summation order
        (tests/test_reward.py), for ~1.7x fewer tokens per pair.
        rows: B >= 1 token lists (token_rows); the shared part is their longest common prefix,
        short of every row's last token (a row needs one token of its own).
        """
        device = self.head.weight.device
        P = min(common_prefix(rows), min(len(r) for r in rows) - 1)
        if P < 1:                                                  # nothing shared: the plain path
            ids, mask = sampler.left_pad(rows, 0)
            return self(ids, mask)
        B, width = len(rows), max(len(r) for r in rows) - P
        own = torch.zeros((B, width), dtype=torch.long, device=device)               # (B, S), right-padded
        own_mask = torch.zeros((B, width), dtype=torch.long, device=device)
        for b, r in enumerate(rows):
            own[b, :len(r) - P] = torch.tensor(r[P:], device=device)
            own_mask[b, :len(r) - P] = 1
        # Padding sits after each row's last real token, which (causal attention) never sees it.
        _, hidden = grpo.shared_prefix_forward(
            self.backbone, torch.tensor([rows[0][:P]], device=device), torch.ones((1, P), dtype=torch.long, device=device),
            torch.arange(P, device=device)[None], torch.zeros(B, dtype=torch.long, device=device),
            own, own_mask, (P + torch.arange(width, device=device)).expand(B, width))          # (B, S, H)
        h_last = hidden[torch.arange(B, device=device), own_mask.sum(1) - 1]           # (B, H)
        return self.head(h_last.to(self.head.weight.dtype)).squeeze(-1).float()      # (B,)

    @torch.no_grad()
    def score_texts(self, tokenizer, messages_list: list[list[dict]], batch_size: int = 16) -> list[float]:
        """Scores of many chats, without gradient (for GRPO and evaluation).

        Chats that differ only in the reply (GRPO's G samples of one state, best-of-N's
        candidates) are scored together, up to batch_size at a time, with their conversation run
        once (score_shared); the others batch_size at a time through `forward`.
        """
        was_training = self.training
        self.eval()
        scores = [0.0] * len(messages_list)
        groups: dict[str, list[int]] = {}                          # the chat without its reply -> rows
        for i, messages in enumerate(messages_list):
            groups.setdefault(repr(messages[:-1]), []).append(i)
        alone = [g[0] for g in groups.values() if len(g) == 1]
        batches = [g[k:k + batch_size] for g in groups.values() if len(g) > 1 for k in range(0, len(g), batch_size)]
        for batch in batches:
            rows = self.token_rows(tokenizer, [messages_list[i] for i in batch])
            for i, v in zip(batch, self.score_shared(rows).tolist()):
                scores[i] = v
        for start in range(0, len(alone), batch_size):
            batch = alone[start:start + batch_size]
            ids, mask = self.encode(tokenizer, [messages_list[i] for i in batch])
            for i, v in zip(batch, self(ids, mask).tolist()):
                scores[i] = v
        self.train(was_training)
        return scores

    def save(self, folder: str | Path, tokenizer, metrics: dict | None = None) -> Path:
        """Write the reward model to `folder`: loadable by `RewardModel.load`, no pickle anywhere.

        Contents: the body (config.json + model.safetensors, via save_pretrained), the head
        (reward_head.safetensors), the tokenizer, and reward_config.json (base model, hidden
        size, max_length, training metrics). Everything is written to "<folder>.tmp" first and
        renamed at the end, so an interrupted save never leaves a half-written reward model.
        """
        target = Path(folder)
        if target.exists() and any(target.iterdir()) and not (target / CONFIG_FILE).exists():
            # Replacing a folder deletes it: only ever do that to an older reward model.
            raise UserError(f"reward model: {target} exists and is not a reward model folder; "
                            "choose a new or empty folder to save into")
        with atomic_folder(target) as tmp:
            self.backbone.save_pretrained(tmp)                     # always safetensors in transformers 5
            save_file({"weight": self.head.weight.detach().float().cpu().contiguous()}, str(tmp / HEAD_FILE))
            tokenizer.save_pretrained(tmp)
            config = {"format": FORMAT_TAG, "base_model": self.base_model,
                      "hidden_size": self.head.in_features, "max_length": self.max_length,
                      "metrics": metrics or {}}
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return target

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu"):
        """Load a folder written by `save`: (rm in eval mode, tokenizer with left padding)."""
        folder = Path(folder)
        config_path = folder / CONFIG_FILE
        if not config_path.is_file():
            raise UserError(f"reward model: {folder} has no {CONFIG_FILE}, so it is not a reward "
                            "model; pass a folder written by `mascot.py train --stage 1`")
        try:
            config = json.loads(config_path.read_text())
        except json.JSONDecodeError as err:
            raise UserError(f"reward model: {config_path} is not valid JSON ({err}); "
                            "train and save the reward model again") from None
        if config.get("format") != FORMAT_TAG or not (folder / HEAD_FILE).is_file():
            raise UserError(f"reward model: {folder} is not a complete reward model ({CONFIG_FILE} "
                            f"without format '{FORMAT_TAG}' or no {HEAD_FILE}); save it again")
        models.quiet_transformers()
        backbone = AutoModel.from_pretrained(folder).to(device)
        rm = cls(backbone, base_model=config.get("base_model", ""),
                 max_length=int(config.get("max_length", 512)))
        rm.head.load_state_dict(load_file(str(folder / HEAD_FILE), device=str(device)))
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return rm.eval(), tokenizer


# ---------------------------------------------------------------------------------------------
# Training on preference pairs
# ---------------------------------------------------------------------------------------------

def split_pairs(pairs: list[dict], held_out_fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """Seeded split into (train, held_out) BY STATE: round(fraction * states) states are held out
    with all their pairs. Splitting pairs at random would put pairs of the same conversation on
    both sides (one state gives up to --pairs-per-state pairs plus its hack pairs, sharing the
    chosen reply), and the held-out accuracy would measure memory, not generalisation."""
    if not 0.0 <= held_out_fraction < 1.0:
        raise UserError(f"reward model: held-out fraction must be in [0, 1), got {held_out_fraction}")
    states = sorted({p["state_id"] for p in pairs})
    order = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed)).tolist()
    held_states = {states[i] for i in order[:round(held_out_fraction * len(states))]}
    return ([p for p in pairs if p["state_id"] not in held_states],
            [p for p in pairs if p["state_id"] in held_states])


@torch.no_grad()
def pair_scores(rm: RewardModel, tokenizer, pairs: list[dict]):
    """(r_chosen, r_rejected), both (N,): the reward model's scores of each pair's two chats. The
    two differ only in the reply, so score_texts runs their shared conversation once."""
    chats = [m for p in pairs for m in (p["chosen_messages"], p["rejected_messages"])]
    scores = torch.tensor(rm.score_texts(tokenizer, chats)).view(-1, 2)                          # (N, 2)
    return scores[:, 0], scores[:, 1]


def evaluate_pairs(rm: RewardModel, tokenizer, pairs: list[dict]):
    """(loss, accuracy) of the reward model on pairs; accuracy = fraction with r_c > r_r.

    A tie counts as wrong: a model that gives every reply the same score is at accuracy 0, not 0.5.
    Returns (None, None) for no pairs: there is nothing to measure, and no number is invented.
    """
    if not pairs:
        return None, None
    r_c, r_r = pair_scores(rm, tokenizer, pairs)                            # (N,), (N,)
    return bradley_terry_loss(r_c, r_r).item(), (r_c > r_r).float().mean().item()


def train_reward_model(rm: RewardModel, tokenizer, pairs: list[dict], held_out_fraction: float = 0.2,
                       epochs: int = 1, lr: float = 2e-5, batch_size: int = 8, seed: int = 0,
                       log=print) -> dict:
    """Fit the reward model to preference pairs with the Bradley-Terry loss.

    Args:
        rm, tokenizer: e.g. from `RewardModel.from_base`; rm is trained in place.
        pairs: dicts with at least "chosen_messages" and "rejected_messages" (chats built by
            `rm_messages` for the same persona and conversation).
        held_out_fraction: share of pairs kept out of training to measure generalisation.
        epochs: passes over the training pairs (reward models over-fit quickly: InstructGPT
            trains for a single epoch, and so do we by default; see RLAIFConfig.rm_epochs).
        lr: AdamW learning rate (2e-5 is a usual full fine-tuning rate for a ~100M body).
        batch_size: pairs per optimiser step (each pair runs its two chats in one forward pass).
        seed: seeds the split and the order of the pairs in every epoch.
        log: where the one line per epoch goes.
    Returns:
        {"train_loss", "train_accuracy": running means over the LAST epoch (the model changes
         during the epoch, as usual for training metrics), "heldout_loss", "heldout_accuracy": on
         the held-out judged pairs, "heldout_hack_accuracy": on the held-out synthetic-hack pairs
         (pairs with "hack" set), both measured after the last epoch (None without such pairs),
         "n_train", "n_heldout", "n_heldout_hack"}
    """
    train, held = split_pairs(pairs, held_out_fraction, seed)
    if not train:
        raise UserError(f"reward model: no training pairs ({len(pairs)} pairs, held-out fraction "
                        f"{held_out_fraction}); build more preference pairs first")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in rm.parameters() if p.requires_grad], lr=lr)
    log(f"reward model: {len(train)} training pairs, {len(held)} held out, {epochs} epochs, "
        f"lr {lr}, batch {batch_size}")
    metrics = {"train_loss": None, "train_accuracy": None, "heldout_loss": None,
               "heldout_accuracy": None, "heldout_hack_accuracy": None, "n_train": len(train),
               "n_heldout": sum(not p.get("hack") for p in held), "n_heldout_hack": sum(bool(p.get("hack")) for p in held)}
    for epoch in range(1, epochs + 1):
        rm.train()
        order = torch.randperm(len(train), generator=generator).tolist()
        loss_sum, correct = 0.0, 0
        for start in range(0, len(order), batch_size):
            batch = [train[i] for i in order[start:start + batch_size]]
            n = len(batch)
            optimizer.zero_grad(set_to_none=True)
            # One pair at a time through forward and backward, its chosen and rejected chats in
            # one forward pass; the gradients add up to the batch's, since each pair's loss is
            # divided by the batch's n (the batch mean). Why: 2 x batch_size chats of up to
            # max_length tokens at once held every layer's activations for all of them (12 GB
            # on the embedded model; docs/PERFORMANCE.md); one pair holds those of two chats.
            for pair in batch:
                # The two chats share persona and history: run that part once (score_shared).
                r_c, r_r = rm.score_shared(rm.token_rows(tokenizer, [pair["chosen_messages"],
                                                                    pair["rejected_messages"]]))  # scalars
                loss = bradley_terry_loss(r_c[None], r_r[None]) / n   # this pair's share of the mean
                loss.backward()
                loss_sum += loss.item() * n                        # undo the mean: sum over pairs
                correct += int(r_c > r_r)
            # Clip the global gradient norm at 1.0 (as TRL's trainers do by default): one pair
            # with a huge margin error must not throw the body's weights far off.
            torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
            optimizer.step()
        metrics["train_loss"] = loss_sum / len(train)
        metrics["train_accuracy"] = correct / len(train)
        ordinary = [p for p in held if not p.get("hack")]
        metrics["heldout_loss"], metrics["heldout_accuracy"] = evaluate_pairs(rm, tokenizer, ordinary)
        metrics["heldout_hack_accuracy"] = evaluate_pairs(rm, tokenizer, [p for p in held if p.get("hack")])[1]
        held_text = ("no held-out pairs" if not held else
                     f"held-out loss {metrics['heldout_loss']:.4f} acc {metrics['heldout_accuracy']:.3f}"
                     if ordinary else "no ordinary held-out pairs")
        log(f"reward model epoch {epoch}/{epochs}: train loss {metrics['train_loss']:.4f} "
            f"acc {metrics['train_accuracy']:.3f} | {held_text}")
    # The last step's gradients would otherwise stay attached to the parameters: another full copy
    # of the body's weights (540 MB for SmolLM2-135M) held through the whole GRPO run.
    rm.zero_grad(set_to_none=True)
    rm.eval()
    return metrics


# ---------------------------------------------------------------------------------------------
# The format reward
# ---------------------------------------------------------------------------------------------

# Characters a finished sentence may end with (after trailing spaces): sentence punctuation and
# closing quotes. Emoji are recognised separately (unicode category "So", symbol-other).
SENTENCE_END = ".!?…\"'”’»"


def format_reward(text: str, own_name: str, other_names: list[str], finished: bool,
                  min_words: int = 4, max_words: int = 60) -> tuple[float, dict]:
    """The format part of stage 1's composite reward: four yes/no checks, averaged.

    The paper adds "a format reward" to the reward-model score without defining it; ours checks
    the failures small speakers actually show:
      length             min_words <= words <= max_words: no one-word grunts, no monologues.
      no_label_prefix    the reply does not open with a speaker label ("Anchor:", "**User** -"):
                         the turn's speaker is already known, a label is noise.
      no_other_speakers  no "User:" or other-agent label anywhere: the speaker must not write
                         the next person's lines (models.clean_reply would cut them off anyway,
                         but the policy should learn not to produce them).
      finished_sentence  generation stopped by itself (not at the token limit) AND the text ends
                         like a sentence: . ! ? … a closing quote, or an emoji.
    Each component is 1.0 or 0.0; the reward is their mean, in [0, 1]. An empty reply scores 0
    on every component: there is no format to reward.

    Example: format_reward("I hear you. That sounds exhausting.", "Anchor", ["Catalyst"], True)
    -> (1.0, {"length": 1.0, "no_label_prefix": 1.0, "no_other_speakers": 1.0,
              "finished_sentence": 1.0})

    Args:
        text: the reply as generated (before models.clean_reply, which would hide the problems).
        own_name: this speaker's name; other_names: the other agents' names ("User" and
            "Assistant" are always treated as other speakers).
        finished: whether generation ended with a stop token (Generation.finished).
    Returns:
        (reward, components)
    """
    names = ["User", "Assistant"] + [n for n in other_names if n]
    if not text.strip():
        return 0.0, {"length": 0.0, "no_label_prefix": 0.0, "no_other_speakers": 0.0,
                     "finished_sentence": 0.0}
    # A label: optional markdown/quote marks, the name, optional marks, then ":" or a dash with a
    # space after it ("Anchor - I hear you", but not "User-friendly").
    label = r"[\*\"']*\s*(?:{names})\s*[\*\"']*\s*(?::|[\-–—]\s)"
    any_name = "|".join(re.escape(n) for n in [own_name] + names if n)
    others = "|".join(re.escape(n) for n in names if n.lower() != own_name.lower())
    n_words = len(text.split())
    stripped = text.rstrip().rstrip("\ufe0f")                      # drop an emoji variation selector
    last = stripped[-1] if stripped else ""                        # "" for a lone variation selector
    components = {
        "length": float(min_words <= n_words <= max_words),
        "no_label_prefix": float(not re.match(r"\s*" + label.format(names=any_name), text, re.IGNORECASE)),
        # Only ":" counts mid-text ("Catalyst - as in ..." is prose); at the start or after a
        # line break or space, a name followed by ":" is someone else's line.
        "no_other_speakers": float(not re.search(rf"(?:^|\s)[\*\"']*\s*(?:{others})\s*[\*\"']*\s*:",
                                                 text, re.IGNORECASE)),
        "finished_sentence": float(finished and bool(last) and (last in SENTENCE_END
                                                                or unicodedata.category(last) == "So")),
    }
    return sum(components.values()) / len(components), components


# ---------------------------------------------------------------------------------------------
# Stage 1 data: states -> candidates -> judged preference pairs
# ---------------------------------------------------------------------------------------------

@dataclass
class State:
    """One (context, persona, conversation-so-far) point at which a persona must reply."""
    id: str
    split: str                   # "train" | "heldout"
    context: Context
    persona: str                 # persona name
    history: list[Turn]          # the conversation so far; the last turn is the user's

    def judge_state(self, personas: PersonaSet) -> JudgeState:
        return judge_state(personas.find(self.persona), self.history, self.context.situation)

    def prompt(self, personas: PersonaSet) -> list[dict]:
        return speaker_messages(personas.find(self.persona), personas, self.context, self.history)

    def rm_messages(self, personas: PersonaSet, reply: str) -> list[dict]:
        return rm_messages(self.judge_state(personas), reply)

    def diagnose(self, personas: PersonaSet, reply: str) -> dict:
        return diagnose_reply(personas.find(self.persona), self.history, self.context.situation, reply,
                              personas.names())

    def hack_source(self, personas: PersonaSet) -> hacks.HackSource:
        """What hacks.make_hacks needs to fake a hacked reply for this state."""
        p = personas.find(self.persona)
        last_user = next((t.text for t in reversed(self.history) if t.speaker == USER), "")
        return hacks.HackSource(p.name, p.role, p.description, self.context.situation, last_user,
                                [t.text for t in self.history if t.speaker != USER],
                                [e for q in personas.personas if q.name != p.name for e in q.examples])


def build_states(contexts: list[Context], personas: PersonaSet, n_states: int, seed: int,
                 generated: dict[str, list[Turn]], split: str) -> list[State]:
    """Sample (context, persona, history) states, including later turns, not only openings.

    Where the dataset recorded the conversation (ESConv, QMSum, the ED CSV) a state cuts it just
    after a random user turn; its human supporters appear as 'Supporter'. Otherwise `generated`
    holds a short conversation produced by the base model, cut the same way. Personas rotate so
    every persona gets the same number of states.
    """
    rng = random.Random(seed)
    states = []
    for i in range(n_states):
        ctx = contexts[i % len(contexts)]
        if ctx.turns:
            turns = [Turn(USER if t["speaker"] == "user" else "Supporter", t["text"]) for t in ctx.turns]
        else:
            turns = generated.get(ctx.id) or [Turn(USER, ctx.first_message)]
        user_ends = [k + 1 for k, t in enumerate(turns) if t.speaker == USER]
        cut = rng.choice(user_ends) if user_ends else 1
        persona = personas.personas[i % len(personas.personas)].name
        states.append(State(f"{split}-{i:04d}", split, ctx, persona, turns[:cut]))
    return states


def save_states(path: Path, states: list[State]) -> None:
    write_jsonl(path, [{"id": s.id, "split": s.split, "context_id": s.context.id, "persona": s.persona,
                        "history": [{"speaker": t.speaker, "text": t.text} for t in s.history]}
                       for s in states])


def load_states(path: Path, contexts: list[Context]) -> list[State]:
    """Reload states written by `save_states` (a resumed run keeps exactly the same states)."""
    by_id = {c.id: c for c in contexts}
    states = []
    for row in read_jsonl(path):
        if row["context_id"] not in by_id:
            raise UserError(f"{path}: state {row['id']} uses context {row['context_id']}, which the "
                            "current --data does not have; use the same --data or a new --run folder")
        states.append(State(row["id"], row["split"], by_id[row["context_id"]], row["persona"],
                            [Turn(t["speaker"], t["text"]) for t in row["history"]]))
    return states


def sample_candidates(model, tokenizer, states: list[State], personas: PersonaSet, k: int,
                      max_new_tokens: int, seed: int, path: Path, batch_states: int = 8) -> list[list[str]]:
    """K candidate replies per state from the speaker policy, appended to `path` batch by batch.

    States already in `path` (from an interrupted run) are not sampled again.
    """
    done = {r["state_id"]: r["candidates"] for r in read_jsonl(path)} if path.exists() else {}
    todo = [s for s in states if s.id not in done]
    names = personas.names()
    for start in tqdm(range(0, len(todo), batch_states), desc="candidates", disable=not todo):
        chunk = todo[start:start + batch_states]
        prompts = [s.prompt(personas) for s in chunk for _ in range(k)]
        seeds = [derive_seed(seed, s.id, j) for s in chunk for j in range(k)]
        gen = sampler.generate(model, tokenizer, prompts, max_new_tokens, temperature=1.0, seeds=seeds)
        for i, s in enumerate(chunk):
            texts = [models.clean_reply(t, s.persona, names) for t in gen.texts[i * k:(i + 1) * k]]
            done[s.id] = texts
            append_jsonl(path, {"state_id": s.id, "persona": s.persona, "candidates": texts})
    return [done[s.id] for s in states]


def judge_pairs(states: list[State], candidates: list[list[str]], personas: PersonaSet, judge,
                margin: float, max_pairs_per_state: int = 2, counts: dict | None = None) -> list[dict]:
    """Turn K judged candidates per state into preference pairs with a clear quality gap.

    1. score every candidate once (pointwise judge score in [0, 1]);
    2. consider pairs whose score gap exceeds `margin`, widest gap first;
    3. confirm each with a pairwise comparison in BOTH orders (Judge.compare_many) and drop pairs
       whose verdict flips with order (position bias) or disagrees with the scores; stop at
       `max_pairs_per_state` confirmed pairs per state.
    Every judgement goes through the judge's on-disk cache, so re-running never pays twice.
    `counts`, when given, receives what the judge could not decide: {"scored", "unreadable_scores"
    (an LLM judge's answers without a readable 1-5; such a score is a neutral 0.5), "compared",
    "no_verdict" (the two orders disagreed or an answer was unreadable), "unreadable_verdicts"}.
    """
    counts = {} if counts is None else counts
    flat_states = [s.judge_state(personas) for s, cands in zip(states, candidates) for _ in cands]
    unreadable_before = getattr(judge, "unparseable", 0)      # only LLM judges can be unreadable
    flat_scores = judge.score_many(flat_states, [c for cands in candidates for c in cands])
    counts.update(scored=len(flat_scores), unreadable_scores=getattr(judge, "unparseable", 0) - unreadable_before,
                  compared=0, no_verdict=0, unreadable_verdicts=0)
    # The gaps to confirm, per state, widest first.
    todo, pos = [], 0
    for cands in candidates:
        scores = flat_scores[pos:pos + len(cands)]
        pos += len(cands)
        todo.append(sorted(((scores[i] - scores[j], i, j, scores[i], scores[j])
                            for i in range(len(cands)) for j in range(len(cands))
                            if scores[i] - scores[j] > margin and cands[i] and cands[i] != cands[j]), reverse=True))
    # Confirm them in rounds: each round asks every state that still wants a pair for its next
    # widest gap, all in one compare_many (an openai: judge sends those requests concurrently).
    # The questions asked, and so the pairs, are those of going through the states one by one.
    found: list[list[dict]] = [[] for _ in states]
    while True:
        asks = [(k, todo[k].pop(0)) for k in range(len(states)) if todo[k] and len(found[k]) < max_pairs_per_state]
        if not asks:
            break
        verdicts = judge.compare_many([states[k].judge_state(personas) for k, _ in asks],
                                      [candidates[k][i] for k, (_, i, _, _, _) in asks],
                                      [candidates[k][j] for k, (_, _, j, _, _) in asks])
        for (k, (gap, i, j, score_i, score_j)), verdict in zip(asks, verdicts):
            counts["compared"] += 1
            counts["no_verdict"] += verdict.preferred is None
            counts["unreadable_verdicts"] += bool(verdict.detail.get("unparseable"))
            if verdict.preferred != 0:          # None (order flip) or the scores' loser won
                continue
            state, chosen, rejected = states[k], candidates[k][i], candidates[k][j]
            found[k].append({"state_id": state.id, "persona": state.persona,
                             "chosen": chosen, "rejected": rejected,
                             "chosen_score": score_i, "rejected_score": score_j, "gap": gap,
                             "p_first": verdict.p_first, "judge": judge.name,
                             "chosen_messages": state.rm_messages(personas, chosen),
                             "rejected_messages": state.rm_messages(personas, rejected)})
    return [pair for pairs in found for pair in pairs]

def all_unreadable(counts: dict) -> bool:
    """Did the judge fail to answer readably every time (judge_pairs' counts)? Then no pair can
    come out, and the reason is the judge, not the margin or the candidates."""
    scores_lost = counts["scored"] > 0 and counts["unreadable_scores"] == counts["scored"]
    verdicts_lost = counts["compared"] > 0 and counts["unreadable_verdicts"] == counts["compared"]
    return scores_lost or verdicts_lost


def hack_pairs(states: list[State], pairs: list[dict], personas: PersonaSet, per_state: int,
               seed: int) -> list[dict]:
    """Preference pairs that teach the reward model to reject reward hacks.

    For every state with a judged pair, the judge's preferred reply is paired with `per_state`
    synthetic hacks of different kinds (hacks.make_hacks: copying the user, reciting the persona,
    leaking the prompt, ...) as the rejected reply. Without them the reward model only learns what
    the judge's candidates differ in, and the policy is free to find what none of them tried.
    """
    by_id = {s.id: s for s in states}
    out = []
    for state_id, chosen in dict((p["state_id"], p["chosen"]) for p in pairs).items():
        state = by_id[state_id]
        made = hacks.make_hacks(state.hack_source(personas), derive_seed(seed, state_id))
        kinds = random.Random(derive_seed(seed, state_id, "kinds")).sample(sorted(made), min(per_state, len(made)))
        for kind in kinds:
            out.append({"state_id": state_id, "persona": state.persona, "chosen": chosen,
                        "rejected": made[kind], "hack": kind,
                        "chosen_messages": state.rm_messages(personas, chosen),
                        "rejected_messages": state.rm_messages(personas, made[kind])})
    return out


def labelled_hack_accuracy(rm: RewardModel, tokenizer, path: Path) -> dict:
    """The reward model on hand-written hack pairs (data/judge_pairs_hacks.jsonl): accuracy
    overall and per kind, so its resistance to hacks is reported next to its held-out accuracy."""
    rows = read_jsonl(path)
    pairs = [{"kind": r["failure"],
              "chosen_messages": rm_messages(JudgeState.from_pair(r), r["better"]),
              "rejected_messages": rm_messages(JudgeState.from_pair(r), r["worse"])} for r in rows]
    r_c, r_r = pair_scores(rm, tokenizer, pairs)                          # (N,), (N,)
    right = (r_c > r_r).float()                                            # (N,) a tie is wrong
    result = {"accuracy": right.mean().item(), "n": len(pairs), "per_kind": {}}
    for kind in sorted({p["kind"] for p in pairs}):
        of_kind = torch.tensor([p["kind"] == kind for p in pairs])           # (N,) bool
        result["per_kind"][kind] = right[of_kind].mean().item()
    return result


# ---------------------------------------------------------------------------------------------
# The composite reward of stage 1's GRPO: reward-model score + format reward
# ---------------------------------------------------------------------------------------------

def speaker_reward_fn(rm: RewardModel, rm_tokenizer, personas: PersonaSet, format_weight: float):
    """Build reward(states, raw_texts, finished) -> (rewards, components).

    The reward model scores the CLEANED reply (what the user would see); the format reward reads
    the RAW text, since label prefixes and other speakers' lines are exactly what it penalises.
    The components also carry the hack diagnostics of every cleaned reply (hacks.py): they are not
    part of the reward, but grpo.py logs every component's mean per step (`r_diag_context_copy`
    ...), so a rising reward that comes from copying shows up in the same metrics.jsonl line.
    """
    names = personas.names()

    def reward(states: list[State], texts: list[str], finished: list[bool]):
        cleaned = [models.clean_reply(t, s.persona, names) for s, t in zip(states, texts)]
        rm_scores = rm.score_texts(rm_tokenizer, [s.rm_messages(personas, c) for s, c in zip(states, cleaned)])
        fmt = [format_reward(t, s.persona, [n for n in names if n != s.persona], f)[0]
               for s, t, f in zip(states, texts, finished)]
        total = [r + format_weight * f for r, f in zip(rm_scores, fmt)]
        diagnosed = [s.diagnose(personas, c) for s, c in zip(states, cleaned)]
        diags = {f"diag_{k}": [d[k] for d in diagnosed] for k in hacks.DIAGNOSTICS}
        return total, {"rm": rm_scores, "format": fmt, **diags}

    return reward


def heldout_reward(policy, tokenizer, states: list[State], personas: PersonaSet, reward_fn,
                   max_new_tokens: int, temperature: float, seed: int, samples: int = 2) -> dict:
    """Mean composite reward of `samples` sampled replies per held-out state (fixed seeds, so the
    before/after numbers of one run see the same randomness)."""
    rows = [s for s in states for _ in range(samples)]
    gen = sampler.generate(policy, tokenizer, [s.prompt(personas) for s in rows], max_new_tokens,
                          temperature, seeds=[derive_seed(seed, "held-out", i) for i in range(len(rows))])
    total, comp = reward_fn(rows, gen.texts, gen.finished)
    n = len(total)
    return {"reward": sum(total) / n, "se": standard_error(total), "rm": sum(comp["rm"]) / n,
            "format": sum(comp["format"]) / n, "n": n, "rewards": [round(r, 4) for r in total],
            **{k: sum(v) / n for k, v in comp.items() if k.startswith("diag_")},
            "example": {"state": rows[0].id, "persona": rows[0].persona, "reply": gen.texts[0]}}


# ---------------------------------------------------------------------------------------------
# Steps 1-4 for one run folder: states -> candidates -> judged pairs -> reward model -> reward fn
# ---------------------------------------------------------------------------------------------

@dataclass
class RLAIF:
    """What `build_reward_fn` hands to the GRPO stage."""
    reward_fn: object            # reward(states, raw_texts, finished) -> (rewards, components)
    train_states: list[State]
    held_states: list[State]
    pairs: list[dict]
    rm_metrics: dict


def build_reward_fn(cfg: RLAIFConfig, inputs, base, tok, judge, out: Path, model_name: str,
                    max_new_tokens: int, seed: int, device: str = "cpu", log=print) -> RLAIF:
    """The RLAIF chapter for one run folder, every step's output a file in `out`, reused when present.

    1. states: (context, persona, conversation so far) at later turns as well as openings;
       contexts without a recorded dialogue get a short one from the base model (round-robin
       speakers, the average simulated user);
    2. candidates: K replies per training state from the base speaker;
    3. the judge scores them and confirms the clear gaps pairwise -> preference pairs;
    4. a Bradley-Terry reward model on the pairs (its held-out accuracy is the number to watch);
    then the composite reward function: reward-model score + format_weight * format reward.
    `inputs` is mascot.Inputs (personas, train / held-out contexts, profiles).
    """
    personas = inputs.personas
    states_path = out / "states.jsonl"
    if states_path.exists():
        states = load_states(states_path, inputs.train + inputs.held_out)
    else:
        used = inputs.train[:cfg.states] + inputs.held_out[:cfg.heldout_states]   # states cycle through these
        need = [c for c in used if not c.turns]
        generated = {}
        if need:
            log(f"stage 1: generating short conversations for {len(need)} contexts (base model)")
            cast = Cast(personas, base, tok, base, tok, max_new_tokens)
            convs = run_conversations(need, RoundRobin(personas), cast, inputs.profiles, ["average"] * len(need),
                                      n_agent_turns=2, user_every=1, seed=seed)
            generated = {c.context.id: c.turns for c in convs}
        states = (build_states(inputs.train, personas, cfg.states, seed, generated, "train")
                  + build_states(inputs.held_out, personas, cfg.heldout_states, seed + 1, generated, "heldout"))
        save_states(states_path, states)
    train_states = [s for s in states if s.split == "train"]
    held_states = [s for s in states if s.split == "heldout"]
    log(f"stage 1: {len(train_states)} training states, {len(held_states)} held-out states")

    candidates = sample_candidates(base, tok, train_states, personas, cfg.candidates, max_new_tokens, seed,
                                   out / "candidates.jsonl")
    counts = {}
    pairs = judge_pairs(train_states, candidates, personas, judge, cfg.margin, cfg.pairs_per_state, counts)
    log(f"stage 1: judge {judge.name}: {counts['unreadable_scores']} of {counts['scored']} scores unreadable; "
        f"{counts['no_verdict']} of {counts['compared']} comparisons without a verdict "
        f"({counts['unreadable_verdicts']} unreadable)")
    if not pairs and all_unreadable(counts):
        raise UserError(f"stage 1: no preference pairs, because every answer of the judge {judge.name} was "
                        "unreadable (no 1-5 score, no A or B; see data/prompts/judge_*.txt); try a stronger "
                        "--judge-model or check the server's chat template")
    if not pairs:
        # Readable but undecided: equal scores everywhere (no gap above --margin), or verdicts that
        # flip with the order of the replies (position bias). A judge like that cannot teach anything.
        raise UserError(f"stage 1: the judge {judge.name} confirmed no preference pair: "
                        f"{counts['compared']} score gaps above --margin {cfg.margin} were asked pairwise, "
                        f"{counts['no_verdict']} without a verdict (the two orders disagreed or were unreadable); "
                        "a stronger --judge-model, more --candidates or --states may give it pairs to confirm")
    pairs += hack_pairs(train_states, pairs, personas, cfg.hack_pairs, seed)
    write_jsonl(out / "pairs.jsonl", pairs)
    n_hack = sum(bool(p.get("hack")) for p in pairs)
    log(f"stage 1: {len(pairs) - n_hack} judged preference pairs from {len(train_states)} states "
        f"(judge {judge.name}, margin {cfg.margin}) + {n_hack} synthetic-hack pairs")

    rm_dir = out / "reward_model"
    if (rm_dir / CONFIG_FILE).exists():
        rm, rm_tok = RewardModel.load(rm_dir, device=device)
        rm_metrics = read_json(rm_dir / CONFIG_FILE)["metrics"]
        log(f"stage 1: reusing the reward model in {rm_dir}")
    else:
        torch.manual_seed(seed)                     # the scalar head's initialisation
        rm, rm_tok = RewardModel.from_base(model_name, device=device)
        rm_metrics = train_reward_model(rm, rm_tok, pairs, cfg.rm_held_out, cfg.rm_epochs, cfg.rm_lr,
                                        seed=seed, log=log)
        rm_metrics["labelled_hacks"] = labelled_hack_accuracy(rm, rm_tok, HERE / "data" / "judge_pairs_hacks.jsonl")
        rm.save(rm_dir, rm_tok, rm_metrics)
    if "labelled_hacks" not in rm_metrics:            # a reward model saved before this report existed
        rm_metrics["labelled_hacks"] = labelled_hack_accuracy(rm, rm_tok, HERE / "data" / "judge_pairs_hacks.jsonl")

    def shown(value):
        return "n/a" if value is None else f"{value:.3f}"
    log(f"reward model held-out accuracy: {shown(rm_metrics.get('heldout_accuracy'))} on "
        f"{rm_metrics.get('n_heldout')} judged pairs, {shown(rm_metrics.get('heldout_hack_accuracy'))} on "
        f"{rm_metrics.get('n_heldout_hack')} synthetic-hack pairs of held-out states, "
        f"{shown(rm_metrics['labelled_hacks']['accuracy'])} on {rm_metrics['labelled_hacks']['n']} "
        "hand-written hack pairs")
    return RLAIF(speaker_reward_fn(rm, rm_tok, personas, cfg.format_weight), train_states, held_states,
                 pairs, rm_metrics)
