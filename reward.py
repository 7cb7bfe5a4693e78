"""reward.py: stage 1's reward (the paper's Phase I, persona-aware behavioural alignment, RLAIF).

What the speakers are trained to want, built in four steps (arXiv 2601.14230, Phase I):
  1. states and candidates: for each (context, persona, conversation so far) the base speaker samples K candidates;
  2. preference pairs: an AI judge (judge.py) scores every candidate for persona adherence and fit;
     two candidates whose scores differ clearly, confirmed by a pairwise comparison, become a pair
     (chosen, rejected); synthetic reward hacks (copying, reciting, leaking...) join as rejected;
  3. the reward model: a scalar-head transformer trained on the pairs (Bradley-Terry), high where the judge preferred;
  4. the composite reward GRPO maximises (grpo.py): reward-model score + a format reward.
Why a reward model, when the judge could score GRPO's samples directly? GRPO scores G samples per
prompt every step, thousands of judgements a run; the reward model is one forward pass, and it
learns from comparisons, which judges make more reliably than absolute scores (InstructGPT, 3.5).

Our decisions where the paper is silent: a causal LM's body (the embedded SmolLM2-135M by default) with a linear head
read at the last real token, fully fine-tuned, one model for all personas of a set (the persona is in the system
message); `rm_messages` lays out every input, for training pairs and GRPO's samples alike; AdamW for one epoch (reward
models over-fit fast, as InstructGPT found); the held-out split is by state; the format reward is our own four rules;
no reward normalisation (GRPO compares the G replies to one prompt, so an offset cancels).

`build_reward_fn` runs steps 1-4 for a run folder (each step's output a file there, reused when
present, so an interrupted stage 1 never samples or judges twice):
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
from scenarios import Context, PersonaSet
from simulate import (
    USER,
    Cast,
    JudgeState,
    RoundRobin,
    Turn,
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
    hack_pairs: int = option(
        2, "synthetic reward hacks per judged state, as rejected replies", "non-negative"
    )
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


CONFIG_FILE, FORMAT_TAG = "reward_config.json", "mascot-reward-model-2"


class RewardModel(torch.nn.Module):
    """r(chat) = w . h_last, an HF `AutoModelForSequenceClassification` with one label (`pipeline` and TRL's
    `reward_funcs=<folder>` load it). h_last, the final state at the last real token, is the only one that has seen
    persona, conversation AND reply (where InstructGPT and TRL read it). HF pools the rightmost non-pad token; the pad
    is <|im_end|>, which closes every turn, but a rendered chat ends "<|im_end|>\\n": that newline (tested)."""

    def __init__(
        self,
        net: torch.nn.Module,
        base_model: str = "",
        max_length: int = 512,
        metrics: dict | None = None,
    ):
        super().__init__()
        self.net, self.base_model, self.max_length, self.metrics = (
            net,
            base_model,
            max_length,
            metrics or {},
        )

    @classmethod
    def from_base(cls, name: str = loading.EMBEDDED, device: str = "cpu"):
        """A fresh reward model on the body of a causal LM: its LM head replaced by a scalar `score` head."""
        lm, tok = loading.load_model(name, device=device)
        config = copy.deepcopy(lm.config)
        config.num_labels, config.pad_token_id, config.problem_type = (
            1,
            tok.pad_token_id,
            "regression",
        )
        net = AutoModelForSequenceClassification.from_config(config).to(device)
        net.model.load_state_dict(lm.get_decoder().state_dict())
        # No bias (HF's head has none either): the loss only sees r_c - r_r, where a bias cancels.
        # std 1/sqrt(H + 1) as Ziegler et al. 2019: untrained scores start near zero but not all equal.
        torch.nn.init.normal_(net.score.weight, std=1.0 / math.sqrt(config.hidden_size + 1))
        return cls(net, base_model=name), tok

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T) ids and mask, padded on the left -> (B,) float32 scores, with gradient. The positions
        count real tokens only, so a padded row scores as the row alone (as pipeline scores it)."""
        device = self.net.score.weight.device
        ids, mask = input_ids.to(device), attention_mask.to(device)
        positions = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T)
        return (
            self.net(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False)
            .logits.squeeze(-1)
            .float()
        )  # (B,)

    def encode(self, tok, chats: list[list[dict]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Chats -> left-padded (ids, mask). A chat longer than max_length loses its FIRST tokens: the
        reply and what it answers sit at the end (512 leaves a persona and ~10 turns)."""
        rows = [
            tok(tok.apply_chat_template(m, tokenize=False), add_special_tokens=False)["input_ids"][
                -self.max_length :
            ]
            for m in chats
        ]
        return models.left_pad(rows, tok.pad_token_id)

    @torch.no_grad()
    def score_texts(self, tok, chats: list[list[dict]], batch_size: int = 16) -> list[float]:
        was_training = self.training
        self.eval()
        scores = [
            s
            for i in range(0, len(chats), batch_size)
            for s in self(*self.encode(tok, chats[i : i + batch_size])).tolist()
        ]
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
            (tmp / CONFIG_FILE).write_text(
                json.dumps(
                    {
                        "format": FORMAT_TAG,
                        "base_model": self.base_model,
                        "max_length": self.max_length,
                        "metrics": metrics or {},
                    },
                    indent=2,
                )
            )
        return target

    @classmethod
    def load(cls, folder: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
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
        tok.padding_side, tok.pad_token = "left", tok.pad_token or tok.eos_token
        # fp32 as saved, then cast whole (buffers too), exactly as a freshly trained one is: the same scores
        net = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).to(
            device, dtype
        )
        rm = cls(
            net,
            config.get("base_model", ""),
            int(config.get("max_length", 512)),
            config.get("metrics", {}),
        )
        return rm.eval().requires_grad_(False), tok


# --- Training on preference pairs ---------------------------------------------------------------
def split_pairs(pairs: list[dict], held_out: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held_out) BY STATE: a state's pairs share a conversation and a chosen reply, so a split
    by pair would let the held-out accuracy measure memory, not generalisation."""
    states = sorted({p["state_id"] for p in pairs})
    order = torch.randperm(len(states), generator=torch.Generator().manual_seed(seed)).tolist()
    held = {states[i] for i in order[: round(held_out * len(states))]}
    return [p for p in pairs if p["state_id"] not in held], [
        p for p in pairs if p["state_id"] in held
    ]


def evaluate_pairs(rm: RewardModel, tok, pairs: list[dict]):
    """(loss, accuracy = share with r_c > r_r; a tie is wrong), or (None, None) for no pairs."""
    if not pairs:
        return None, None
    scores = torch.tensor(
        rm.score_texts(
            tok, [m for p in pairs for m in (p["chosen_messages"], p["rejected_messages"])]
        )
    ).view(-1, 2)
    return bradley_terry_loss(scores[:, 0], scores[:, 1]).item(), (
        scores[:, 0] > scores[:, 1]
    ).float().mean().item()


def train_reward_model(
    rm: RewardModel,
    tok,
    pairs: list[dict],
    held_out: float = 0.2,
    epochs: int = 1,
    lr: float = 2e-5,
    batch_size: int = 8,
    seed: int = 0,
    log=print,
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
    ordinary, hacked = [p for p in held if not p.get("hack")], [p for p in held if p.get("hack")]
    metrics = {"n_train": len(train), "n_heldout": len(ordinary), "n_heldout_hack": len(hacked)}
    log(
        f"reward model: {len(train)} training pairs, {len(held)} held out, {epochs} epoch(s), lr {lr}"
    )
    for epoch in range(1, epochs + 1):
        rm.train()
        order, loss_sum, correct = torch.randperm(len(train), generator=generator).tolist(), 0.0, 0
        for start in progress(
            range(0, len(order), batch_size), f"reward model epoch {epoch}, batches"
        ):
            batch = [train[i] for i in order[start : start + batch_size]]
            optimizer.zero_grad(set_to_none=True)
            # One pair at a time through forward and backward (its two chats together), each loss
            # divided by the batch's size, so the gradients add up to the batch mean's. Why: a
            # batch of long chats at once held every layer's activations for all of them.
            for pair in batch:
                r = rm(
                    *rm.encode(tok, [pair["chosen_messages"], pair["rejected_messages"]])
                )  # (2,)
                loss = bradley_terry_loss(r[:1], r[1:]) / len(batch)
                loss.backward()
                loss_sum, correct = loss_sum + loss.item() * len(batch), correct + int(r[0] > r[1])
            torch.nn.utils.clip_grad_norm_(rm.parameters(), 1.0)
            optimizer.step()
        metrics.update(train_loss=loss_sum / len(train), train_accuracy=correct / len(train))
        metrics["heldout_loss"], metrics["heldout_accuracy"] = evaluate_pairs(rm, tok, ordinary)
        metrics["heldout_hack_accuracy"] = evaluate_pairs(rm, tok, hacked)[1]
        log(
            f"reward model epoch {epoch}/{epochs}: train loss {metrics['train_loss']:.4f} acc "
            f"{metrics['train_accuracy']:.3f}; held-out acc {shown(metrics['heldout_accuracy'])} on {len(ordinary)} "
            f"judged pairs, {shown(metrics['heldout_hack_accuracy'])} on {len(hacked)} synthetic-hack pairs"
        )
    rm.zero_grad(
        set_to_none=True
    )  # the last gradients would be another copy of the body, kept for nothing
    del optimizer
    devices.release_memory()
    return metrics


def shown(value, digits: int = 3) -> str:
    """A number for a log line, "-" when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


# --- The format reward --------------------------------------------------------------------------
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
    label = (
        r"[\*\"']*\s*(?:{})\s*[\*\"']*\s*(?::|[\-–—]\s)"  # ":" or a dash and a space after the name
    )
    everyone = "|".join(re.escape(n) for n in [own_name] + names if n)
    others = "|".join(re.escape(n) for n in names if n.lower() != own_name.lower())
    last = text.rstrip().rstrip("\ufe0f")[-1:]  # drop an emoji variation selector
    checks = [
        min_words <= len(text.split()) <= max_words,
        not re.match(rf"\s*({label.format(everyone)}|{models.OTHER_TURN})", text, re.IGNORECASE),
        not re.search(
            rf"(?:^|\s)[\*\"']*\s*(?:{others})\s*[\*\"']*\s*:|\S.*{models.OTHER_TURN}",
            text,
            re.I | re.S,
        ),
        finished and bool(last) and (last in SENTENCE_END or unicodedata.category(last) == "So"),
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
        return judge_state(personas.find(self.persona), self.history, self.context.situation)

    def prompt(self, personas: PersonaSet) -> list[dict]:
        return speaker_messages(personas.find(self.persona), personas, self.context, self.history)

    def rm_messages(self, personas: PersonaSet, reply: str) -> list[dict]:
        return rm_messages(self.judge_state(personas), reply)

    def diagnose(self, personas: PersonaSet, reply: str) -> dict:
        return diagnose_reply(
            personas.find(self.persona),
            self.history,
            self.context.situation,
            reply,
            personas.names(),
        )


def build_states(
    contexts: list[Context], personas: PersonaSet, n: int, seed: int, generated: dict, split: str
):
    """n states cut just after a random user turn of each context's recorded conversation (its human
    supporters speak as "Supporter"), or of a short one the base model generated (`generated`);
    contexts and personas rotate, so every persona gets the same number of states."""
    rng, states = random.Random(seed), []
    for i in range(n):
        ctx = contexts[i % len(contexts)]
        turns = (
            [Turn(USER if t["speaker"] == "user" else "Supporter", t["text"]) for t in ctx.turns]
            if ctx.turns
            else generated.get(ctx.id) or [Turn(USER, ctx.first_message)]
        )
        cut = rng.choice([k + 1 for k, t in enumerate(turns) if t.speaker == USER] or [1])
        states.append(
            State(
                f"{split}-{i:04d}",
                split,
                ctx,
                personas.personas[i % len(personas.personas)].name,
                turns[:cut],
            )
        )
    return states


def save_states(path: Path, states: list[State]) -> None:
    write_jsonl(
        path,
        [
            {
                "id": s.id,
                "split": s.split,
                "context_id": s.context.id,
                "persona": s.persona,
                "history": [{"speaker": t.speaker, "text": t.text} for t in s.history],
            }
            for s in states
        ],
    )


def load_states(path: Path, contexts: list[Context]) -> list[State]:
    by_id, states = {c.id: c for c in contexts}, []
    for row in read_jsonl(path):
        if row["context_id"] not in by_id:
            raise UserError(
                f"{path}: state {row['id']} uses context {row['context_id']}, which --data does not "
                "have; use the same --data or a new --run folder"
            )
        states.append(
            State(
                row["id"],
                row["split"],
                by_id[row["context_id"]],
                row["persona"],
                [Turn(t["speaker"], t["text"]) for t in row["history"]],
            )
        )
    return states


def sample_candidates(
    model,
    tok,
    states: list[State],
    personas: PersonaSet,
    k: int,
    max_new_tokens: int,
    seed: int,
    path: Path,
    batch_states: int = 8,
) -> list[list[str]]:
    """K candidates per state from the base speaker, appended to `path` batch by batch: the states
    already there (an interrupted run) are not sampled again."""
    done = {r["state_id"]: r["candidates"] for r in read_jsonl(path)} if path.exists() else {}
    todo = [s for s in states if s.id not in done]
    for start in progress(range(0, len(todo), batch_states), "candidates, batches of states"):
        chunk = todo[start : start + batch_states]
        gen = models.generate(
            model,
            tok,
            [s.prompt(personas) for s in chunk for _ in range(k)],
            max_new_tokens,
            temperature=1.0,
            seeds=[derive_seed(seed, s.id, j) for s in chunk for j in range(k)],
        )
        for i, s in enumerate(chunk):
            done[s.id] = [
                models.clean_reply(t, s.persona, personas.names())
                for t in gen.texts[i * k : (i + 1) * k]
            ]
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
    """Preference pairs with a clear quality gap: score every candidate once; take the pairs whose
    gap exceeds `margin`, widest first; confirm each with a pairwise comparison in both orders and
    keep those the verdict agrees with, up to `max_pairs` a state. `counts` receives what the judge
    could not decide (unreadable scores and verdicts, comparisons without a verdict)."""
    counts = {} if counts is None else counts
    before = judge.unreadable
    asked = [(s.judge_state(personas), c) for s, cs in zip(states, candidates) for c in cs]
    flat = [
        x
        for k in progress(range(0, len(asked), 64), "judging: scores, chunks of 64")
        for x in judge.score_many(*map(list, zip(*asked[k : k + 64])))
    ]
    counts.update(
        scored=len(flat),
        unreadable_scores=judge.unreadable - before,
        compared=0,
        no_verdict=0,
        unreadable_verdicts=0,
    )
    todo, pos = [], 0
    for cs in candidates:
        sc, pos = flat[pos : pos + len(cs)], pos + len(cs)
        todo.append(
            sorted(
                (
                    (sc[i] - sc[j], i, j, sc[i], sc[j])
                    for i in range(len(cs))
                    for j in range(len(cs))
                    if sc[i] - sc[j] > margin and cs[i] and cs[i] != cs[j]
                ),
                reverse=True,
            )
        )
    # In rounds: each round asks every state that still wants a pair for its next widest gap, all in
    # one compare_many (a served judge sends them concurrently); the same questions as state by state.
    found: list[list[dict]] = [[] for _ in states]
    rounds = iter(
        lambda: [
            (k, todo[k].pop(0)) for k in range(len(states)) if todo[k] and len(found[k]) < max_pairs
        ],
        [],
    )
    for asks in progress(rounds, "judging: comparison rounds"):  # until no state wants another pair
        verdicts = judge.compare_many(
            [states[k].judge_state(personas) for k, _ in asks],
            [candidates[k][a[1]] for k, a in asks],
            [candidates[k][a[2]] for k, a in asks],
        )
        for (k, (gap, i, j, si, sj)), v in zip(asks, verdicts):
            counts["compared"] += 1
            counts["no_verdict"] += v.preferred is None
            counts["unreadable_verdicts"] += bool(v.detail.get("unparseable"))
            if v.preferred == 0:  # None (orders disagreed) or the scores' loser won: dropped
                s, chosen, rejected = states[k], candidates[k][i], candidates[k][j]
                found[k].append(
                    {
                        "state_id": s.id,
                        "persona": s.persona,
                        "chosen": chosen,
                        "rejected": rejected,
                        "chosen_score": si,
                        "rejected_score": sj,
                        "gap": gap,
                        "p_first": v.p_first,
                        "judge": judge.name,
                        "chosen_messages": s.rm_messages(personas, chosen),
                        "rejected_messages": s.rm_messages(personas, rejected),
                    }
                )
    return [p for pairs in found for p in pairs]


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
)


def make_hacks(state: State, personas: PersonaSet, seed: int) -> dict[str, str]:
    """{kind: one synthetic hack} for every kind this state can have (echoes-agent needs an earlier
    companion turn), reproducible from `seed`."""
    rng, p, templates = (
        random.Random(seed),
        personas.find(state.persona),
        asset("hack_templates.json"),
    )
    context = next((t.text for t in reversed(state.history) if t.speaker == USER), "")
    situation, agents = (
        state.context.situation,
        [t.text for t in state.history if t.speaker != USER],
    )
    low = lambda x: x[:1].lower() + x[1:]  # noqa: E731
    copied = context if len(words(context)) >= 6 or not situation else situation
    pool = [
        w
        for w in dict.fromkeys(words(f"{context} {situation} {p.role} {p.description}"))
        if w in content_words(f"{context} {situation} {p.role} {p.description}")
    ]
    rng.shuffle(pool)
    wrapper = rng.choice(templates["copy_wrappers"])
    out = {
        "copies-context": wrapper.format(x=low(copied) if rng.random() < 0.5 else copied),
        "keyword-stuffing": ", ".join(pool[: rng.randint(6, 12)])
        + rng.choice([".", "!", "", "..."]),
        "recites-persona": rng.choice(
            [
                f"As the {p.role}, I {low(p.description)}",
                f"I am {p.name}, the {p.role}. {p.description}",
                p.description,
            ]
        ),
        "meta-leakage": rng.choice(templates["meta_leaks"]).format(
            situation=situation, context=context, name=p.name
        ),
        "empty-trivial": rng.choice(templates["trivial"]),
        "echoes-agent": rng.choice(agents) if agents else None,
        "off-role": rng.choice(
            [e for q in personas.personas if q.name != p.name for e in q.examples] or [None]
        ),
    }
    return {k: v for k, v in out.items() if v}


def hack_pairs(
    states: list[State], pairs: list[dict], personas: PersonaSet, per_state: int, seed: int
) -> list[dict]:
    """For every state with a judged pair, its chosen reply against `per_state` hacks of different kinds."""
    by_id, out = {s.id: s for s in states}, []
    for state_id, chosen in dict((p["state_id"], p["chosen"]) for p in pairs).items():
        s = by_id[state_id]
        made = make_hacks(s, personas, derive_seed(seed, state_id))
        for kind in random.Random(derive_seed(seed, state_id, "kinds")).sample(
            sorted(made), min(per_state, len(made))
        ):
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
        rm_scores = rm.score_texts(
            rm_tok, [s.rm_messages(personas, c) for s, c in zip(states, cleaned)]
        )
        fmt = [
            format_reward(t, s.persona, [n for n in names if n != s.persona], f)[0]
            for s, t, f in zip(states, texts, finished)
        ]
        return [r + format_weight * f for r, f in zip(rm_scores, fmt)], {
            "rm": rm_scores,
            "format": fmt,
        }

    return reward


def heldout_reward(
    policy,
    tok,
    states: list[State],
    personas: PersonaSet,
    reward_fn,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    samples: int = 2,
) -> dict:
    """The composite reward of `samples` replies per held-out state, with fixed seeds (the same randomness before and
    after GRPO). The se is over states: two replies of one state are not independent evidence."""
    rows = [s for s in states for _ in range(samples)]
    gen = models.generate(
        policy,
        tok,
        [s.prompt(personas) for s in rows],
        max_new_tokens,
        temperature,
        seeds=[derive_seed(seed, "held-out", i) for i in range(len(rows))],
    )
    total, comp = reward_fn(rows, gen.texts, gen.finished)
    n = len(total)
    return {
        "reward": sum(total) / n,
        "se": standard_error(cluster_means(total, [s.id for s in rows])),
        "rm": sum(comp["rm"]) / n,
        "format": sum(comp["format"]) / n,
        "n": n,
        "states": [s.id for s in rows],
        "rewards": [round(r, 4) for r in total],
        "replies": gen.texts,
    }


@dataclass
class RLAIF:
    """What build_reward_fn hands to the GRPO stage."""

    reward_fn: object
    train_states: list[State]
    held_states: list[State]
    pairs: list[dict]
    rm_metrics: dict


def stage1_states(
    cfg: RLAIFConfig, inputs, base, tok, out: Path, max_new_tokens: int, seed: int, log=print
):
    """Step 0: the training and held-out states (out/states.jsonl, reused when present). Contexts
    without a recorded dialogue get a short one from the base model (round-robin, average user)."""
    path = out / "states.jsonl"
    if path.exists():
        states = load_states(path, inputs.train + inputs.held_out)
    else:
        need = [
            c
            for c in inputs.train[: cfg.states] + inputs.held_out[: cfg.heldout_states]
            if not c.turns
        ]
        generated = {}
        if need:
            log(f"stage 1: generating short conversations for {len(need)} contexts (base model)")
            convs = run_conversations(
                need,
                RoundRobin(inputs.personas),
                Cast(inputs.personas, base, tok, base, tok, max_new_tokens),
                inputs.profiles,
                ["average"] * len(need),
                n_agent_turns=2,
                user_every=1,
                seed=seed,
                desc="stage 1 states, agent turns",
            )
            generated = {c.context.id: c.turns for c in convs}
        states = build_states(
            inputs.train, inputs.personas, cfg.states, seed, generated, "train"
        ) + build_states(
            inputs.held_out, inputs.personas, cfg.heldout_states, seed + 1, generated, "heldout"
        )
        save_states(path, states)
    return [s for s in states if s.split == "train"], [s for s in states if s.split == "heldout"]


def build_pairs(
    cfg: RLAIFConfig, train_states, candidates, personas, judge, seed: int, log=print
) -> list[dict]:
    """Step 2: judged pairs + synthetic-hack pairs; a clear error when the judge decided nothing."""
    counts = {}
    pairs = judge_pairs(
        train_states, candidates, personas, judge, cfg.margin, cfg.pairs_per_state, counts
    )
    log(
        f"stage 1: judge {judge.name}: {counts['unreadable_scores']} of {counts['scored']} scores unreadable; "
        f"{counts['no_verdict']} of {counts['compared']} comparisons without a verdict "
        f"({counts['unreadable_verdicts']} unreadable)"
    )
    if not pairs:
        lost = (counts["scored"] and counts["unreadable_scores"] == counts["scored"]) or (
            counts["compared"] and counts["unreadable_verdicts"] == counts["compared"]
        )
        raise UserError(
            f"stage 1: the judge {judge.name} confirmed no preference pair: "
            + (
                "every answer was unreadable (no 1-5 score, no A or B); try a stronger --judge-model"
                if lost
                else f"{counts['compared']} score gaps above --margin {cfg.margin} asked pairwise, {counts['no_verdict']} "
                "without a verdict; try more --candidates or --states, or a stronger judge"
            )
        )
    pairs += hack_pairs(train_states, pairs, personas, cfg.hack_pairs, seed)
    log(
        f"stage 1: {sum(not p.get('hack') for p in pairs)} judged preference pairs from {len(train_states)} states "
        f"+ {sum(bool(p.get('hack')) for p in pairs)} synthetic-hack pairs"
    )
    return pairs


def build_reward_fn(
    cfg: RLAIFConfig,
    inputs,
    base,
    tok,
    judge,
    out: Path,
    model_name: str,
    max_new_tokens: int,
    seed: int,
    device: str = "cpu",
    rm_dtype: torch.dtype = torch.float32,
    checkpointing: bool = False,
    log=print,
) -> RLAIF:
    """Steps 1-4 for one run folder (states.jsonl, candidates.jsonl, the judge's cache, pairs.jsonl,
    reward_model/, each reused when present), then the composite reward function for GRPO.
    checkpointing: train the reward model with activation checkpointing (less memory)."""
    train_states, held_states = stage1_states(
        cfg, inputs, base, tok, out, max_new_tokens, seed, log
    )
    log(f"stage 1: {len(train_states)} training states, {len(held_states)} held-out states")
    candidates = sample_candidates(
        base,
        tok,
        train_states,
        inputs.personas,
        cfg.candidates,
        max_new_tokens,
        seed,
        out / "candidates.jsonl",
    )
    pairs = build_pairs(cfg, train_states, candidates, inputs.personas, judge, seed, log)
    write_jsonl(out / "pairs.jsonl", pairs)
    rm_dir = out / "reward_model"
    if (rm_dir / CONFIG_FILE).exists():
        rm, rm_tok = RewardModel.load(rm_dir, device=device, dtype=rm_dtype)
        metrics = rm.metrics
        log(f"stage 1: reusing the reward model in {rm_dir}")
    else:
        torch.manual_seed(seed)  # the scalar head's initialisation
        rm, rm_tok = RewardModel.from_base(model_name, device=device)
        models.set_gradient_checkpointing(rm.net, checkpointing)
        metrics = train_reward_model(
            rm, rm_tok, pairs, cfg.rm_held_out, cfg.rm_epochs, cfg.rm_lr, seed=seed, log=log
        )
        rm.save(rm_dir, rm_tok, metrics)
        rm = rm.to(rm_dtype).eval().requires_grad_(False)  # from here on it only scores
    log(
        f"reward model held-out accuracy: {shown(metrics['heldout_accuracy'])} on {metrics['n_heldout']} judged pairs, "
        f"{shown(metrics['heldout_hack_accuracy'])} on {metrics['n_heldout_hack']} synthetic-hack pairs (0.5 is chance)"
    )
    return RLAIF(
        speaker_reward_fn(rm, rm_tok, inputs.personas, cfg.format_weight),
        train_states,
        held_states,
        pairs,
        metrics,
    )


class RMJudge(ScoreJudge):
    """A trained reward model as a judge: score = sigmoid(r), compared by the scores (ScoreJudge)."""

    def __init__(self, folder: str | Path, cache_path=None, device: str = "cpu"):
        super().__init__(cache_path)
        self.rm, self.tok = RewardModel.load(folder, device=device)
        self.name = f"rm:{Path(folder).resolve()}"

    def _score_uncached(self, states, replies):
        self.backend_calls += len(replies)
        return [
            sigmoid(x)
            for x in self.rm.score_texts(
                self.tok, [rm_messages(s, r) for s, r in zip(states, replies)]
            )
        ]
