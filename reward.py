"""reward.py: stage 1's reward (the paper's Phase I, persona-aware behavioural alignment, RLAIF).

What the speakers are trained to want, built in four steps (arXiv 2601.14230, Phase I), which
mascot.train_stage1 calls in order (mascot.rlaif_reward):
  1. states: (context, persona, conversation so far), for training and held out (`stage1_states`);
  2. candidates: the speaker samples K replies per state (`sample_candidates`);
  3. preference pairs: an AI judge (judge.py) scores every candidate for persona adherence and fit;
     two candidates whose scores differ clearly, confirmed by a pairwise comparison in both orders,
     become a pair (chosen, rejected); synthetic reward hacks (copying, reciting, leaking...) join
     as rejected replies (`build_pairs`);
  4. the reward model: a scalar-head transformer trained on the pairs with the Bradley-Terry loss,
     high where the judge preferred (`fit_reward_model`);
then GRPO (grpo.py) maximises the composite reward: reward-model score + a format reward
(`speaker_reward_fn`). Why a reward model, when the judge could score GRPO's samples directly? GRPO
scores G samples per prompt every step, thousands of judgements a run; the reward model is one
forward pass, and it learns from comparisons, which judges make more reliably than absolute scores
(InstructGPT, Ouyang et al. 2022, section 3.5).

Our decisions where the paper is silent: a causal LM's body (the embedded SmolLM2-135M by default)
with a linear head read at the last real token, fully fine-tuned, one model for all personas of a
set (the persona is in the system message); `rm_messages` lays out every input, for training pairs
and GRPO's samples alike; AdamW for one epoch (reward models over-fit fast, as InstructGPT found);
the held-out split is by state; the format reward is our own four rules; no reward normalisation
(GRPO compares the G replies to one prompt, so an offset cancels).

    python mascot.py train --stage 1 [--model tiny]    # the whole of stage 1, then GRPO
"""

import copy
import json
import math
import random
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import models
from judge import ScoreJudge, sigmoid
from metrics import cluster_means, content_words, standard_error, words
from plumbing import devices, loading
from plumbing.common import UserError, derive_seed, option, progress
from plumbing.files import append_jsonl, asset, atomic_folder, read_jsonl, write_jsonl
from plumbing.templates import render_chat
from scenarios import Context, PersonaSet
from simulate import (
    USER,
    Cast,
    JudgeState,
    RoundRobin,
    Turn,
    TurnPlan,
    diagnose_reply,
    judge_state,
    run_conversations,
    speaker_messages,
)


@dataclass
class RLAIFConfig:
    """Stage 1's own settings (GRPO's are grpo.GRPOConfig); each is also a `train` flag."""

    states: int = option(48, "training states (context, persona, conversation so far)", "positive")
    heldout_states: int = option(16, "held-out states for the before/after reward", "positive")
    candidates: int = option(4, "K candidate replies per state", "at-least-2")
    margin: float = option(
        0.05, "minimum judge-score gap (0-1 scale) for a preference pair", "non-negative"
    )
    pairs_per_state: int = option(
        2, "at most this many pairs per state (widest gaps first)", "positive"
    )
    rm_epochs: int = option(1, "reward-model epochs", "positive")
    rm_lr: float = option(2e-5, "reward-model learning rate", "positive")
    rm_held_out: float = option(
        0.2, "share of states whose pairs are held out to measure the reward model", "fraction"
    )
    format_weight: float = option(
        1.0, "weight of the format reward next to the reward-model score", "non-negative"
    )
    reward: str = option(
        "model",
        "GRPO's reward: the reward model (the paper's route) or the judge's own score (d-RLAIF)",
        ["model", "judge"],
    )
    min_rm_agreement: float = option(
        0.7,
        "GRPO starts only on a reward model that agrees with the judge on this share of "
        "held-out judged pairs (with 30 or more of them); 0: no gate",
        "fraction",
    )
    hack_pairs: int = option(
        2, "synthetic reward hacks per judged state, as rejected replies", "non-negative"
    )
    # --offload-optimizer (mascot sets it): the reward model trains in bf16 (plumbing/offload.py).
    offload_optimizer: bool = False
    speaker_warmup: int = option(
        120,
        "ESConv data only: card-contrastive steps (4 supporter turns each) first",
        "non-negative",
    )


def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """-mean log sigmoid(r_c - r_r): the preferences' negative log-likelihood under Bradley & Terry
    (1952), P(chosen beats rejected) = sigmoid(r_c - r_r), the reward-model loss of InstructGPT
    (eq. 1). Only the difference matters. logsigmoid(-100) is -100 exactly, where log(sigmoid)
    would underflow to log(0) = -inf. Equal scores give log 2 = 0.6931; r_c - r_r = 2 gives 0.1269.

    r_chosen, r_rejected: (N,) scores of the pairs' two replies -> scalar loss."""
    return -F.logsigmoid(r_chosen - r_rejected).mean()  # (N,) margins -> ()


def rm_messages(state: JudgeState, reply: str) -> list[dict]:
    """What the reward model scores: the persona (system), the conversation as one user message of
    "Speaker: text" lines (the other agents' turns are not the reply-writer's own), the reply
    (assistant). Training pairs, GRPO's samples and the rm: judge all come through here."""
    lines = [f"{t['speaker']}: {t['text']}" for t in state.history] + [f"User: {state.context}"]
    return [
        {
            "role": "system",
            "content": f"You are {state.persona_name}. {state.persona_desc}".strip(),
        },
        {"role": "user", "content": "\n".join(lines)},
        {"role": "assistant", "content": reply},
    ]


# A reward model folder is a save_pretrained folder plus this file; the tag names its format, so a
# folder of another format (or half of one) is refused rather than misread.
CONFIG_FILE = "reward_config.json"
FORMAT_TAG = "mascot-reward-model-2"


def give_own_pad_token(tok) -> bool:
    """Give the tokenizer a pad token of its own where its pad token would end a rendered chat.
    HF's sequence classifier reads the rightmost token that is not the pad token, and a chat must
    be read at its end, the token after the reply's end of turn has been seen. Llama 3 has no pad
    token (plumbing/loading.py borrows its <|eot_id|>, which ends every turn) and Phi-3's pad is the
    <|endoftext|> its rendered chat ends with: read by that rule, both would score the reply's last
    word instead. Returns whether a token was added (the model then needs one more embedding row)."""
    probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]
    text = render_chat(tok, probe, add_generation_prompt=False)
    last = tok(text, add_special_tokens=False)["input_ids"][-1]
    if tok.pad_token_id is not None and last != tok.pad_token_id:
        return False
    tok.add_special_tokens({"pad_token": "<|reward_pad|>"})
    return True


class RewardModel(torch.nn.Module):
    """r(chat) = w . h_last, an HF `AutoModelForSequenceClassification` with one label (`pipeline` and TRL's
    `reward_funcs=<folder>` load it). h_last, the final state at the last real token, is the only one that has seen
    persona, conversation AND reply (where InstructGPT and TRL read it). HF pools the rightmost non-pad token: for
    SmolLM2 the pad is <|im_end|>, which closes every turn, but a rendered chat ends "<|im_end|>\\n", so it reads that
    newline (tested); where the pad token would end a chat, `give_own_pad_token` gives the model one of its own."""

    def __init__(
        self,
        net: torch.nn.Module,
        base_model: str = "",
        max_length: int = 512,
        metrics: dict | None = None,
    ):
        super().__init__()
        self.net = net  # AutoModelForSequenceClassification, num_labels = 1
        self.base_model = base_model  # the causal LM whose body it started from
        self.max_length = (
            max_length  # tokens kept of each chat (the end: the reply and its context)
        )
        self.metrics = metrics or {}  # its held-out accuracies, as train_reward_model measured them

    @classmethod
    def from_base(cls, name: str = loading.EMBEDDED, device: str = "cpu", dtype=torch.float32):
        """A fresh reward model on the body of a causal LM: its LM head replaced by a scalar `score`
        head; dtype: bf16 to train it through fp32 masters in CPU memory (--offload-optimizer)."""
        lm, tok = loading.load_model(name, device=device, dtype=dtype)
        own_pad = give_own_pad_token(tok)
        config = copy.deepcopy(lm.config)
        config.num_labels = 1  # one scalar score
        config.problem_type = "regression"
        if not own_pad:
            config.pad_token_id = tok.pad_token_id  # HF pools the last token that is not padding
        net = AutoModelForSequenceClassification.from_config(config).to(device)
        getattr(net, net.base_model_prefix).load_state_dict(lm.get_decoder().state_dict())
        if own_pad:  # one more embedding row, for the new pad token (it is never attended to)
            net.resize_token_embeddings(len(tok))
            net.config.pad_token_id = tok.pad_token_id
        # No bias (HF's head has none either): the loss only sees r_c - r_r, where a bias cancels.
        # std 1/sqrt(H + 1) as Ziegler et al. 2019: untrained scores start near zero but not all equal.
        torch.nn.init.normal_(net.score.weight, std=1.0 / math.sqrt(config.hidden_size + 1))
        return cls(net, base_model=name), tok

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids and mask, padded on the left -> (B,) float32 scores, with gradient. The positions
        count real tokens only, so a padded row scores as the row alone (as pipeline scores it)."""
        device = self.net.score.weight.device
        ids = input_ids.to(device)  # (B, T)
        mask = attention_mask.to(device)  # (B, T)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T)
        out = self.net(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
        return out.logits.squeeze(-1).float()  # (B, 1) -> (B,)

    def encode(self, tok, chats: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Chats -> left-padded (ids, mask). A chat longer than max_length loses its FIRST tokens: the
        reply and what it answers sit at the end (512 leaves a persona and ~10 turns)."""
        rows = []
        for messages in chats:
            text = render_chat(tok, messages, add_generation_prompt=False)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            rows.append(ids[-self.max_length :])
        return models.left_pad(rows, tok.pad_token_id)

    @torch.no_grad()
    def score_texts(self, tok, chats: list[list[dict]], batch_size: int = 16) -> list[float]:
        """One score per chat, `batch_size` chats a forward; the model's train/eval mode is kept."""
        was_training = self.training
        self.eval()
        scores = []
        for i in range(0, len(chats), batch_size):
            scores += self(*self.encode(tok, chats[i : i + batch_size])).tolist()
        self.train(was_training)
        return scores

    def save(self, folder: str | Path, tok, metrics: dict | None = None) -> Path:
        """save_pretrained (config, weights, tokenizer) and reward_config.json; no pickle, written atomically."""
        target = Path(folder)
        if target.exists() and any(target.iterdir()) and not (target / CONFIG_FILE).exists():
            raise UserError(
                f"reward model: {target} exists and is not a reward model folder; choose a new one"
            )
        with atomic_folder(target) as tmp:
            self.net.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            record = {
                "format": FORMAT_TAG,
                "base_model": self.base_model,
                "max_length": self.max_length,
                "metrics": metrics or {},
            }
            (tmp / CONFIG_FILE).write_text(json.dumps(record, indent=2))
        return target

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        """(reward model, tokenizer) from a folder `save` wrote, frozen, in `dtype`; any other folder
        is refused with one line saying what to do."""
        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
        except (OSError, json.JSONDecodeError):
            config = {}
        if config.get("format") == "mascot-reward-model":  # the first format: body + separate head
            raise UserError(
                f"reward model: {folder} is in mascot's first format (reward_head.safetensors); delete it "
                "and rerun stage 1 with --resume: it refits from pairs.jsonl, asking the judge nothing"
            )
        if config.get("format") != FORMAT_TAG:
            raise UserError(
                f"reward model: {folder} is not a complete reward model folder (no valid {CONFIG_FILE}); "
                "pass one written by `mascot.py train --stage 1`"
            )
        loading.quiet_transformers()
        tok = AutoTokenizer.from_pretrained(folder)
        tok.padding_side = "left"  # encode pads on the left, as every batch here
        tok.pad_token = tok.pad_token or tok.eos_token
        # fp32 as saved, then cast whole (buffers too), exactly as a freshly trained one is: the same scores
        net = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
        net = net.to(device, dtype)
        base = config.get("base_model", "")
        rm = cls(net, base, int(config.get("max_length", 512)), config.get("metrics", {}))
        return rm.eval().requires_grad_(False), tok


# --- Training on preference pairs ---------------------------------------------------------------
def split_pairs(pairs: list[dict], held_out: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held_out) BY STATE: a state's pairs share a conversation and a chosen reply, so a split
    by pair would let the held-out accuracy measure memory, not generalisation."""
    states = sorted({p["state_id"] for p in pairs})
    order = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {states[i] for i in order[: round(held_out * len(states))]}
    train = [p for p in pairs if p["state_id"] not in held]
    return train, [p for p in pairs if p["state_id"] in held]


def evaluate_pairs(rm: RewardModel, tok, pairs: list[dict], with_se: bool = False):
    """(loss, accuracy = share with r_c > r_r; a tie is wrong), or (None, None) for no pairs; with_se:
    (loss, accuracy, its standard error over STATES: a state's pairs share a conversation, so they
    are not independent evidence)."""
    if not pairs:
        return (None, None, None) if with_se else (None, None)
    chats = []
    for p in pairs:
        chats += [p["chosen_messages"], p["rejected_messages"]]
    scores = torch.tensor(rm.score_texts(tok, chats)).view(-1, 2)  # (N, 2): chosen, rejected
    loss = bradley_terry_loss(scores[:, 0], scores[:, 1]).item()
    right = (scores[:, 0] > scores[:, 1]).float()  # (N,)
    if not with_se:
        return loss, right.mean().item()
    se = standard_error(cluster_means(right.tolist(), [p["state_id"] for p in pairs]))
    return loss, right.mean().item(), se


def train_reward_model(
    rm: RewardModel,
    tok,
    pairs: list[dict],
    held_out: float = 0.2,
    epochs: int = 1,
    lr: float = 2e-5,
    batch_size: int = 8,
    seed: int = 0,
) -> dict:
    """Fit the reward model with the Bradley-Terry loss, AdamW, gradients clipped at 1.0 (as TRL).
    Returns the last epoch's running train loss and accuracy and, measured after it, the held-out
    loss and accuracy on judged pairs and on synthetic-hack pairs (pairs with "hack")."""
    train, held = split_pairs(pairs, held_out, seed)
    if not train:
        raise UserError(
            f"reward model: no training pairs ({len(pairs)} pairs, held-out share {held_out})"
        )
    generator = torch.Generator().manual_seed(seed)
    optimizer = models.adamw(rm, lr, weight_decay=0.01)  # torch's default decay
    # Judged pairs and synthetic hacks are measured apart: rejecting a hack is easy, agreeing
    # with the judge on two real candidates is the signal the reward model is there to carry.
    ordinary = [p for p in held if not p.get("hack")]
    hacked = [p for p in held if p.get("hack")]
    metrics = {"n_train": len(train), "n_heldout": len(ordinary), "n_heldout_hack": len(hacked)}
    print(
        f"reward model: {len(train)} training pairs, {len(held)} held out, {epochs} epoch(s), lr {lr}",
        flush=True,
    )
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(train), generator=generator).tolist()
        loss_sum, correct = reward_model_epoch(
            rm, tok, optimizer, [train[i] for i in order], batch_size, epoch
        )
        metrics["train_loss"] = loss_sum / len(train)
        metrics["train_accuracy"] = correct / len(train)
        judged = evaluate_pairs(rm, tok, ordinary, with_se=True)
        metrics["heldout_loss"], metrics["heldout_accuracy"], metrics["heldout_accuracy_se"] = (
            judged
        )
        metrics["heldout_hack_accuracy"] = evaluate_pairs(rm, tok, hacked)[1]
        print(
            f"reward model epoch {epoch}/{epochs}: train loss {metrics['train_loss']:.4f} acc "
            f"{metrics['train_accuracy']:.3f}; held-out acc {shown(metrics['heldout_accuracy'])} "
            f"on {len(ordinary)} judged pairs, {shown(metrics['heldout_hack_accuracy'])} on "
            f"{len(hacked)} synthetic-hack pairs",
            flush=True,
        )
    # The last gradients would be another copy of the body, kept for nothing.
    rm.zero_grad(set_to_none=True)
    del optimizer
    devices.release_memory()
    return metrics


def reward_model_epoch(rm, tok, optimizer, pairs: list[dict], batch_size: int, epoch: int):
    """One pass over the (shuffled) pairs, one AdamW step per batch. Returns the summed loss and the
    number of pairs the model ranked right before its step saw them (a running train accuracy)."""
    rm.train()
    loss_sum, correct = 0.0, 0
    for start in progress(range(0, len(pairs), batch_size), f"reward model epoch {epoch}, batches"):
        batch = pairs[start : start + batch_size]
        optimizer.zero_grad(set_to_none=True)
        # One pair at a time through forward and backward (its two chats together), each loss
        # divided by the batch's size, so the gradients add up to the batch mean's. Why: a
        # batch of long chats at once held every layer's activations for all of them.
        for pair in batch:
            chats = [pair["chosen_messages"], pair["rejected_messages"]]
            r = rm(*rm.encode(tok, chats))  # (2,) chosen, rejected
            loss = bradley_terry_loss(r[:1], r[1:]) / len(batch)
            loss.backward()
            loss_sum += loss.item() * len(batch)
            correct += int(r[0] > r[1])
        torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
        optimizer.step()
    return loss_sum, correct


def shown(value, digits: int = 3) -> str:
    """A number for a log line, "-" when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


# --- The format reward --------------------------------------------------------------------------
# What may end a finished sentence: the stops, an ellipsis, a closing quote or guillemet.
SENTENCE_END = ".!?…\"'”’»"


def format_reward(
    text: str,
    own_name: str,
    other_names: list[str],
    finished: bool,
    min_words: int = 4,
    max_words: int = 60,
) -> tuple[float, dict]:
    """The paper adds "a format reward" without defining it; ours is four 0/1 checks of what small
    speakers get wrong, averaged (an empty reply scores 0 on all):
      length             min_words <= words <= max_words: no grunts, no monologues;
      no_label_prefix    no opening speaker label ("Anchor:", "**User** -", the prompt's "(X, another companion)");
      no_other_speakers  no "User:" or other agent's label anywhere (writing their lines);
      finished_sentence  generation stopped by itself and the text ends like a sentence (or an emoji).
    `text` is the raw generation (clean_reply would hide the problems); `finished`: it ended with a
    stop token. format_reward("I hear you. That sounds exhausting.", "Anchor", ["Catalyst"], True)[0] == 1.0
    """
    keys = ("length", "no_label_prefix", "no_other_speakers", "finished_sentence")
    if not text.strip():
        return 0.0, dict.fromkeys(keys, 0.0)
    names = ["User", "Assistant"] + [n for n in other_names if n]
    # A speaker label: the name in optional markdown, then ":" or a dash and a space.
    label = r"[\*\"']*\s*(?:{})\s*[\*\"']*\s*(?::|[\-–—]\s)"
    everyone = "|".join(re.escape(n) for n in [own_name] + names if n)
    others = "|".join(re.escape(n) for n in names if n.lower() != own_name.lower())
    opens_with_label = rf"\s*({label.format(everyone)}|{models.OTHER_TURN})"
    names_another = rf"(?:^|\s)[\*\"']*\s*(?:{others})\s*[\*\"']*\s*:|\S.*{models.OTHER_TURN}"
    last = text.rstrip().rstrip("\ufe0f")[-1:]  # drop an emoji variation selector
    ends_a_sentence = bool(last) and (last in SENTENCE_END or unicodedata.category(last) == "So")
    checks = [
        min_words <= len(text.split()) <= max_words,
        not re.match(opens_with_label, text, re.IGNORECASE),
        not re.search(names_another, text, re.IGNORECASE | re.DOTALL),
        finished and ends_a_sentence,
    ]
    return sum(checks) / len(keys), {k: float(c) for k, c in zip(keys, checks)}


# --- Stage 1 data: states -> candidates -> judged preference pairs ----------------------------
@dataclass
class State:
    """One (context, persona, conversation so far) point at which a persona must reply."""

    id: str
    split: str  # "train" | "heldout"
    context: Context
    persona: str
    history: list[Turn]  # the conversation so far; the last turn is the user's

    def judge_state(self, personas: PersonaSet) -> JudgeState:
        """What the judge reads: the persona's card, the recent turns, the user's last message."""
        return judge_state(personas.find(self.persona), self.history, self.context.situation)

    def prompt(self, personas: PersonaSet) -> list[dict]:
        """The speaker's chat prompt at this point: exactly what it sees in a conversation."""
        return speaker_messages(personas.find(self.persona), personas, self.context, self.history)

    def rm_messages(self, personas: PersonaSet, reply: str) -> list[dict]:
        """The chat the reward model scores for `reply` at this point."""
        return rm_messages(self.judge_state(personas), reply)

    def diagnose(self, personas: PersonaSet, reply: str) -> dict:
        """The reward-hack diagnostics of `reply` here (metrics.diagnose): copying, leaking, ..."""
        persona = personas.find(self.persona)
        situation = self.context.situation
        return diagnose_reply(persona, self.history, situation, reply, personas.names())


def build_states(
    contexts: list[Context], personas: PersonaSet, n: int, seed: int, generated: dict, split: str
):
    """n states cut just after a random user turn of each context's recorded conversation (its human
    supporters speak as "Supporter"), or of a short one the base model generated (`generated`);
    contexts and personas rotate, so every persona gets the same number of states."""
    rng = random.Random(seed)
    states = []
    for i in range(n):
        ctx = contexts[i % len(contexts)]
        if ctx.turns:  # a recorded dialogue
            turns = [
                Turn(USER if t["speaker"] == "user" else "Supporter", t["text"]) for t in ctx.turns
            ]
        else:
            turns = generated.get(ctx.id) or [Turn(USER, ctx.first_message)]
        # Cut just after a user turn: the persona answers the person, never another companion.
        after_user = [k + 1 for k, t in enumerate(turns) if t.speaker == USER]
        cut = rng.choice(after_user or [1])
        persona = personas.personas[i % len(personas.personas)].name
        states.append(State(f"{split}-{i:04d}", split, ctx, persona, turns[:cut]))
    return states


def save_states(path: Path, states: list[State]) -> None:
    """RUN/stage1/states.jsonl: a state per line, its context by id (the contexts come from --data)."""
    rows = []
    for s in states:
        history = [{"speaker": t.speaker, "text": t.text} for t in s.history]
        rows.append(
            {
                "id": s.id,
                "split": s.split,
                "context_id": s.context.id,
                "persona": s.persona,
                "history": history,
            }
        )
    write_jsonl(path, rows)


def load_states(path: Path, contexts: list[Context]) -> list[State]:
    """The states save_states wrote, their contexts looked up in the run's --data (refused if gone)."""
    by_id = {c.id: c for c in contexts}
    states = []
    for row in read_jsonl(path):
        if row["context_id"] not in by_id:
            raise UserError(
                f"{path}: state {row['id']} uses context {row['context_id']}, which --data does not "
                "have; use the same --data or a new --run folder"
            )
        history = [Turn(t["speaker"], t["text"]) for t in row["history"]]
        states.append(
            State(row["id"], row["split"], by_id[row["context_id"]], row["persona"], history)
        )
    return states


CANDIDATE_BATCH = 8  # states per generate call while sampling candidates (K rows each)


def sample_candidates(
    model,
    tok,
    states: list[State],
    personas: PersonaSet,
    k: int,
    max_new_tokens: int,
    seed: int,
    path: Path,
) -> list[list[str]]:
    """Phase I, step 2: K candidates per state from the speaker, at temperature 1 (varied enough for
    the judge to find gaps). Appended to `path` batch by batch: the states already there (an
    interrupted run) are not sampled again. Each candidate has its own seed (run, state, j)."""
    done = {}
    if path.exists():
        done = {r["state_id"]: r["candidates"] for r in read_jsonl(path)}
    todo = [s for s in states if s.id not in done]
    for start in progress(range(0, len(todo), CANDIDATE_BATCH), "candidates, batches of states"):
        chunk = todo[start : start + CANDIDATE_BATCH]
        chats = [s.prompt(personas) for s in chunk for _ in range(k)]
        seeds = [derive_seed(seed, s.id, j) for s in chunk for j in range(k)]
        gen = models.generate(model, tok, chats, max_new_tokens, temperature=1.0, seeds=seeds)
        for i, s in enumerate(chunk):
            # The judge and the reward model see what a user would: the cleaned reply.
            texts = gen.texts[i * k : (i + 1) * k]
            done[s.id] = [models.clean_reply(t, s.persona, personas.names()) for t in texts]
            append_jsonl(path, {"state_id": s.id, "persona": s.persona, "candidates": done[s.id]})
    return [done[s.id] for s in states]


def judge_pairs(
    states: list[State],
    candidates: list[list[str]],
    personas: PersonaSet,
    judge,
    margin: float,
    max_pairs: int = 2,
    counts: dict | None = None,
) -> list[dict]:
    """Phase I, step 3: preference pairs with a clear quality gap: score every candidate once; take
    the pairs whose gap exceeds `margin`, widest first; confirm each with a pairwise comparison in
    both orders and keep those the verdict agrees with, up to `max_pairs` a state. Two questions,
    because a judge's absolute scores are noisier than its comparisons (InstructGPT, section 3.5)
    and a comparison asked in one order follows the position (Zheng et al. 2023). `counts` receives
    what the judge could not decide (unreadable scores and verdicts, comparisons without a verdict)."""
    counts = {} if counts is None else counts
    before = judge.unreadable
    scores = score_candidates(states, candidates, personas, judge)
    counts.update(scored=sum(map(len, scores)), unreadable_scores=judge.unreadable - before)
    counts.update(compared=0, no_verdict=0, unreadable_verdicts=0)
    todo = [wide_gaps(sc, cs, margin) for sc, cs in zip(scores, candidates)]
    found: list[list[dict]] = [[] for _ in states]
    # In rounds: each round asks every state that still wants a pair for its next widest gap, all in
    # one compare_many (a served judge sends them concurrently); the same questions as state by state.
    for asks in progress(comparison_rounds(todo, found, max_pairs), "judging: comparison rounds"):
        verdicts = judge.compare_many(
            [states[k].judge_state(personas) for k, _ in asks],
            [candidates[k][gap[1]] for k, gap in asks],
            [candidates[k][gap[2]] for k, gap in asks],
        )
        for (k, gap), v in zip(asks, verdicts):
            counts["compared"] += 1
            counts["no_verdict"] += v.preferred is None
            counts["unreadable_verdicts"] += bool(v.detail.get("unparseable"))
            if v.preferred == 0:  # None (orders disagreed) or the scores' loser won: dropped
                found[k].append(pair_record(states[k], candidates[k], gap, v, judge.name, personas))
    return [p for pairs in found for p in pairs]


def score_candidates(states, candidates, personas, judge, chunk: int = 64) -> list[list[float]]:
    """The judge's score of every candidate, per state, asked `chunk` at a time (a progress line each)."""
    asked = [(s.judge_state(personas), c) for s, cs in zip(states, candidates) for c in cs]
    flat = []
    for k in progress(range(0, len(asked), chunk), f"judging: scores, chunks of {chunk}"):
        judge_states = [a[0] for a in asked[k : k + chunk]]
        replies = [a[1] for a in asked[k : k + chunk]]
        flat += judge.score_many(judge_states, replies)
    per_state, pos = [], 0
    for cs in candidates:
        per_state.append(flat[pos : pos + len(cs)])
        pos += len(cs)
    return per_state


def wide_gaps(scores: list[float], texts: list[str], margin: float) -> list[tuple]:
    """(gap, i, j, score i, score j) for every ordered pair of distinct, non-empty candidates whose
    score gap exceeds `margin`, widest first: the comparisons worth asking."""
    gaps = []
    for i in range(len(texts)):
        for j in range(len(texts)):
            gap = scores[i] - scores[j]
            if gap > margin and texts[i] and texts[i] != texts[j]:
                gaps.append((gap, i, j, scores[i], scores[j]))
    return sorted(gaps, reverse=True)


def comparison_rounds(todo: list[list], found: list[list], max_pairs: int):
    """Yield rounds of (state index, its next widest gap), one per state that has a gap left and fewer
    than max_pairs confirmed pairs (`found` fills in between rounds), until no state asks."""
    while True:
        asks = []
        for k in range(len(todo)):
            if todo[k] and len(found[k]) < max_pairs:
                asks.append((k, todo[k].pop(0)))
        if not asks:
            return
        yield asks


def pair_record(
    state, candidates: list[str], gap: tuple, verdict, judge_name: str, personas
) -> dict:
    """One confirmed preference pair as pairs.jsonl stores it, with both chats the reward model reads."""
    width, i, j, chosen_score, rejected_score = gap
    chosen, rejected = candidates[i], candidates[j]
    return {
        "state_id": state.id,
        "persona": state.persona,
        "chosen": chosen,
        "rejected": rejected,
        "chosen_score": chosen_score,
        "rejected_score": rejected_score,
        "gap": width,
        "p_first": verdict.p_first,
        "judge": judge_name,
        "chosen_messages": state.rm_messages(personas, chosen),
        "rejected_messages": state.rm_messages(personas, rejected),
    }


# --- Synthetic reward hacks: rejected replies the judge's candidates never tried ----------------
# Without them the reward model learns only what the judge's candidates differ in, and the policy is
# free to find what none of them tried. Seven kinds, those of data/judge_pairs_hacks*.jsonl; the
# texts they are made from are data/hack_templates.json.
HACK_KINDS = (
    "copies-context",
    "keyword-stuffing",
    "recites-persona",
    "meta-leakage",
    "empty-trivial",
    "echoes-agent",
    "off-role",
    "word-salad",
)


def lowercase_first(text: str) -> str:
    """ "I wish..." -> "i wish...", for a sentence spliced into another."""
    return text[:1].lower() + text[1:]


def make_hacks(state: State, personas: PersonaSet, seed: int) -> dict[str, str]:
    """{kind: one synthetic hack} for every kind this state can have (echoes-agent needs an earlier
    companion turn), reproducible from `seed`. Each is what a policy optimised against a judge of
    surface features tends to find (docs/JUDGE.md): copying the user, piling up topic words,
    reciting its own card, talking about the prompt, saying nothing, echoing a companion, or
    speaking in another persona's voice."""
    rng = random.Random(seed)
    p = personas.find(state.persona)
    templates = asset("hack_templates.json")
    context = next((t.text for t in reversed(state.history) if t.speaker == USER), "")
    situation = state.context.situation
    agents = [t.text for t in state.history if t.speaker != USER]
    copied = context if len(words(context)) >= 6 or not situation else situation
    # The topic's and the card's content words, each once, in a seeded random order.
    source = f"{context} {situation} {p.role} {p.description}"
    topic = content_words(source)
    pool = [w for w in dict.fromkeys(words(source)) if w in topic]
    rng.shuffle(pool)
    wrapper = rng.choice(templates["copy_wrappers"])
    # The draws below keep their order: each hack's text depends on the seed alone.
    out = {}
    out["copies-context"] = wrapper.format(
        x=lowercase_first(copied) if rng.random() < 0.5 else copied
    )
    keywords = ", ".join(pool[: rng.randint(6, 12)])
    out["keyword-stuffing"] = keywords + rng.choice([".", "!", "", "..."])
    recitals = [
        f"As the {p.role}, I {lowercase_first(p.description)}",
        f"I am {p.name}, the {p.role}. {p.description}",
        p.description,
    ]
    out["recites-persona"] = rng.choice(recitals)
    leak = rng.choice(templates["meta_leaks"])
    out["meta-leakage"] = leak.format(situation=situation, context=context, name=p.name)
    out["empty-trivial"] = rng.choice(templates["trivial"])
    out["echoes-agent"] = rng.choice(agents) if agents else None
    others = [e for q in personas.personas if q.name != p.name for e in q.examples]
    out["off-role"] = rng.choice(others or [None])
    out["word-salad"] = salad(pool, rng)
    return {k: v for k, v in out.items() if v}


def salad(pool: list[str], rng: random.Random) -> str | None:
    """A pile of the topic's and the card's words, 8-14 of them without commas (keyword-stuffing is
    the comma list), half the time dressed as sentences with capitals and full stops: what a judge
    of surface features may reward (metrics.word_salad and the judge's surprise catch it)."""
    if len(pool) < 8:
        return None
    picked = [rng.choice(pool) for _ in range(rng.randint(8, 14))]
    if rng.random() < 0.5:
        return " ".join(picked)
    cuts = sorted(rng.sample(range(1, len(picked)), 2))  # three "sentences"
    parts = [picked[: cuts[0]], picked[cuts[0] : cuts[1]], picked[cuts[1] :]]
    return " ".join(" ".join(p).capitalize() + "." for p in parts)


def hack_pairs(
    states: list[State], pairs: list[dict], personas: PersonaSet, per_state: int, seed: int
) -> list[dict]:
    """For every state with a judged pair, its chosen reply against `per_state` hacks of different
    kinds (drawn per state, seeded): the reward model must rank a real reply above each."""
    by_id = {s.id: s for s in states}
    chosen_of = {}  # state id -> the chosen reply of its last judged pair
    for p in pairs:
        chosen_of[p["state_id"]] = p["chosen"]
    out = []
    for state_id, chosen in chosen_of.items():
        s = by_id[state_id]
        made = make_hacks(s, personas, derive_seed(seed, state_id))
        kinds = random.Random(derive_seed(seed, state_id, "kinds"))
        for kind in kinds.sample(sorted(made), min(per_state, len(made))):
            out.append(
                {
                    "state_id": state_id,
                    "persona": s.persona,
                    "chosen": chosen,
                    "rejected": made[kind],
                    "hack": kind,
                    "chosen_messages": s.rm_messages(personas, chosen),
                    "rejected_messages": s.rm_messages(personas, made[kind]),
                }
            )
    return out


# --- The composite reward of stage 1's GRPO, and the held-out check -----------------------------
def speaker_reward_fn(rm: RewardModel, rm_tok, personas: PersonaSet, format_weight: float):
    """reward(states, raw_texts, finished) -> (rewards, components): the reward-model score of the
    CLEANED reply (what the user sees) + format_weight x the format reward of the RAW text (label
    prefixes and other speakers' lines are exactly what it penalises)."""
    names = personas.names()

    def reward(states: list[State], texts: list[str], finished: list[bool]):
        cleaned = [models.clean_reply(t, s.persona, names) for s, t in zip(states, texts)]
        chats = [s.rm_messages(personas, c) for s, c in zip(states, cleaned)]
        rm_scores = rm.score_texts(rm_tok, chats)
        fmt = [format_score(s, t, done, names) for s, t, done in zip(states, texts, finished)]
        total = [r + format_weight * f for r, f in zip(rm_scores, fmt)]
        return total, {"rm": rm_scores, "format": fmt}

    return reward


def heldout_reward(
    policy, tok, states: list[State], personas: PersonaSet, reward_fn, cfg, samples: int = 2
) -> dict:
    """The composite reward of `samples` replies per held-out state, sampled as GRPO samples (cfg: a
    grpo.GRPOConfig's max_new_tokens, temperature and seed) with fixed seeds, so before and after
    GRPO see the same randomness. The se is over states: two replies of one state are not
    independent evidence."""
    rows = [s for s in states for _ in range(samples)]
    seeds = [derive_seed(cfg.seed, "held-out", i) for i in range(len(rows))]
    chats = [s.prompt(personas) for s in rows]
    gen = models.generate(policy, tok, chats, cfg.max_new_tokens, cfg.temperature, seeds=seeds)
    total, comp = reward_fn(rows, gen.texts, gen.finished)
    n = len(total)
    source = "rm" if "rm" in comp else "judge"  # what scored the replies (--reward)
    return {
        "reward": sum(total) / n,
        "se": standard_error(cluster_means(total, [s.id for s in rows])),
        source: sum(comp[source]) / n,
        "format": sum(comp["format"]) / n,
        "n": n,
        "states": [s.id for s in rows],
        "rewards": [round(r, 4) for r in total],
        "replies": gen.texts,
    }


# --- Phase I's steps for one run folder (mascot.train_stage1 calls them in order) ---------------
# Each step's output is a file in RUN/stage1/, reused when present, so an interrupted stage 1 never
# samples or judges twice: states.jsonl, candidates.jsonl, judge_cache.jsonl, pairs.jsonl, reward_model/.


def stage1_states(cfg: RLAIFConfig, inputs, base, tok, out: Path, max_new_tokens: int, seed: int):
    """Phase I, step 1: the training and held-out states (out/states.jsonl). Contexts without a
    recorded dialogue get a short one from the base model (round-robin, average user), so a state
    is a conversation in progress, not only an opening. Returns (train states, held-out states)."""
    path = out / "states.jsonl"
    if path.exists():
        states = load_states(path, inputs.train + inputs.held_out)
    else:
        wanted = inputs.train[: cfg.states] + inputs.held_out[: cfg.heldout_states]
        need = [c for c in wanted if not c.turns]
        generated = {}
        if need:
            print(f"stage 1: generating short conversations for {len(need)} contexts (base model)")
            generated = opening_turns(need, inputs, base, tok, max_new_tokens, seed)
        train = build_states(inputs.train, inputs.personas, cfg.states, seed, generated, "train")
        held = build_states(
            inputs.held_out, inputs.personas, cfg.heldout_states, seed + 1, generated, "heldout"
        )
        states = train + held
        save_states(path, states)
    train_states = [s for s in states if s.split == "train"]
    held_states = [s for s in states if s.split == "heldout"]
    print(f"stage 1: {len(train_states)} training states, {len(held_states)} held-out states")
    return train_states, held_states


def opening_turns(contexts, inputs, base, tok, max_new_tokens: int, seed: int) -> dict:
    """{context id: turns}: two agent turns and the user's answers, round-robin, by the base model."""
    cast = Cast(inputs.personas, base, tok, base, tok, max_new_tokens)
    convs = run_conversations(
        contexts,
        RoundRobin(inputs.personas),
        cast,
        inputs.profiles,
        ["average"] * len(contexts),
        TurnPlan(n_agent_turns=2, user_every=1),
        seed=seed,
        desc="stage 1 states, agent turns",
    )
    return {c.context.id: c.turns for c in convs}


def build_pairs(
    cfg: RLAIFConfig, train_states, candidates, personas, judge, seed: int
) -> list[dict]:
    """Phase I, step 3: judged pairs + synthetic-hack pairs; a clear error when the judge decided
    nothing (a served judge whose every answer was unreadable is not the same as no gap)."""
    counts = {}
    pairs = judge_pairs(
        train_states, candidates, personas, judge, cfg.margin, cfg.pairs_per_state, counts
    )
    print(
        f"stage 1: judge {judge.name}: {counts['unreadable_scores']} of {counts['scored']} scores "
        f"unreadable; {counts['no_verdict']} of {counts['compared']} comparisons without a verdict "
        f"({counts['unreadable_verdicts']} unreadable)"
    )
    if not pairs:
        raise UserError(
            f"stage 1: the judge {judge.name} confirmed no preference pair: "
            + why_no_pairs(counts, cfg)
        )
    pairs += hack_pairs(train_states, pairs, personas, cfg.hack_pairs, seed)
    judged = sum(not p.get("hack") for p in pairs)
    print(
        f"stage 1: {judged} judged preference pairs from {len(train_states)} states "
        f"+ {len(pairs) - judged} synthetic-hack pairs"
    )
    return pairs


def why_no_pairs(counts: dict, cfg: RLAIFConfig) -> str:
    """What to try when no pair was confirmed: a better judge if it never answered readably."""
    every_score_lost = counts["scored"] and counts["unreadable_scores"] == counts["scored"]
    every_verdict_lost = counts["compared"] and counts["unreadable_verdicts"] == counts["compared"]
    if every_score_lost or every_verdict_lost:
        return "every answer was unreadable (no 1-5 score, no A or B); try a stronger --judge-model"
    return (
        f"{counts['compared']} score gaps above --margin {cfg.margin} asked pairwise, "
        f"{counts['no_verdict']} without a verdict; try more --candidates or --states, or a stronger judge"
    )


def fit_reward_model(
    cfg: RLAIFConfig,
    pairs,
    folder: Path,
    base_model: str,
    seed: int,
    device: str,
    dtype,
    checkpointing: bool,
):
    """Phase I, step 4: the Bradley-Terry reward model on the pairs, from the body of `base_model`
    (or the one already in `folder`). checkpointing: activation checkpointing while it trains (less
    memory). Returns (reward model, its tokenizer, its metrics); it only scores from here on, in `dtype`."""
    if (folder / CONFIG_FILE).exists():
        rm, rm_tok = RewardModel.load(folder, device=device, dtype=dtype)
        metrics = rm.metrics
        print(f"stage 1: reusing the reward model in {folder}")
    else:
        torch.manual_seed(seed)  # the scalar head's initialisation
        train_dtype = models.policy_dtype(cfg.offload_optimizer)
        rm, rm_tok = RewardModel.from_base(base_model, device=device, dtype=train_dtype)
        models.set_gradient_checkpointing(rm.net, checkpointing)
        metrics = train_reward_model(
            rm, rm_tok, pairs, cfg.rm_held_out, cfg.rm_epochs, cfg.rm_lr, seed=seed
        )
        rm.save(folder, rm_tok, metrics)
        rm = rm.to(dtype).eval().requires_grad_(False)
    print(
        f"reward model held-out agreement with the judge: {shown(metrics['heldout_accuracy'])} ± "
        f"{shown(metrics.get('heldout_accuracy_se'))} (se over states) on {metrics['n_heldout']} "
        f"judged pairs, {shown(metrics['heldout_hack_accuracy'])} on "
        f"{metrics['n_heldout_hack']} synthetic-hack pairs (0.5 is chance)"
    )
    return rm, rm_tok, metrics


GATE_PAIRS = 30  # fewer held-out judged pairs measure no agreement worth gating on


def check_agreement(cfg: RLAIFConfig, metrics: dict) -> None:
    """The gate before GRPO: a reward model that does not carry the judge's preferences (its
    held-out agreement under --min-rm-agreement) would only teach the speakers its noise."""
    n, agreement = metrics["n_heldout"], metrics["heldout_accuracy"]
    if n < GATE_PAIRS or not cfg.min_rm_agreement:
        print(f"reward model not gated: {n} held-out judged pairs (the gate needs {GATE_PAIRS})")
        return
    if agreement < cfg.min_rm_agreement:
        raise UserError(
            f"--min-rm-agreement {cfg.min_rm_agreement}: the reward model agrees with the judge on "
            f"{agreement:.3f} of {n} held-out judged pairs, so GRPO would learn its noise; give it "
            "more pairs (--states, --candidates, --pairs-per-state), use the judge's own score as the "
            "reward (--reward judge), or train anyway with --min-rm-agreement 0"
        )


def judge_reward_fn(judge, personas: PersonaSet, format_weight: float):
    """reward(states, raw_texts, finished) -> (rewards, components) with the judge's own score of
    the cleaned reply in place of the reward model's (--reward judge): d-RLAIF, Lee et al. 2023
    ("RLAIF vs. RLHF"), which skips the reward model; here the offline judge is free to ask."""
    names = personas.names()

    def reward(states: list[State], texts: list[str], finished: list[bool]):
        cleaned = [models.clean_reply(t, s.persona, names) for s, t in zip(states, texts)]
        scores = judge.score_many([s.judge_state(personas) for s in states], cleaned)
        fmt = [format_score(s, t, done, names) for s, t, done in zip(states, texts, finished)]
        total = [r + format_weight * f for r, f in zip(scores, fmt)]
        return total, {"judge": scores, "format": fmt}

    return reward


def format_score(state: State, text: str, finished: bool, names: list[str]) -> float:
    """The format reward of a raw reply, as its speaker wrote it."""
    others = [n for n in names if n != state.persona]
    return format_reward(text, state.persona, others, finished)[0]


class RMJudge(ScoreJudge):
    """A trained reward model as a judge: score = sigmoid(r), compared by the scores (ScoreJudge)."""

    def __init__(self, folder: str | Path, cache_path=None, device: str = "cpu"):
        super().__init__(cache_path)
        self.rm, self.tok = RewardModel.load(folder, device=device)
        self.name = f"rm:{Path(folder).resolve()}"

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        chats = [rm_messages(s, r) for s, r in zip(states, replies)]
        return [sigmoid(x) for x in self.rm.score_texts(self.tok, chats)]
