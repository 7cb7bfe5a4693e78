"""sft.py: supervised fine-tuning, the plain maximum-likelihood step the project needs twice.

Where it sits in MASCOT: not a stage of the paper's method, but two parts use it:
  - the director's format warm start (director.py, section 5): a few steps on well-formed
    `Agent / Action / Tone` directives, so that GRPO has directives to compare at all;
  - the SFT baseline of the evaluation (the paper compares MASCOT with an SFT model): the base
    model fine-tuned on what human supporters wrote. ESConv's supporter turns carry one of eight
    strategy labels; STRATEGY_PERSONA maps six of them to the support persona whose job that
    strategy is (a question is Catalyst's, a suggestion Guide's...), and each such turn becomes one
    example: MASCOT's speaker prompt for that persona and the dialogue so far -> the supporter's
    words. `python mascot.py sft` trains it (train split only) and reports the held-out loss.
The loss is the mean negative log-likelihood of the target tokens given the prompt, over every
target token of the batch; the prompt tokens are context only. Full fine-tuning with AdamW, like
the GRPO that follows, and log-probs through grpo.completion_logprobs, so that the prompt never
gets logits and the (B, T, V) tensor is never built.

Run: python mascot.py sft --data path/to/esconv/train.jsonl     # the SFT baseline -> RUN/sft/model
     python mascot.py train --stage 2 --director-warmup N            # the director's warm start
"""

from __future__ import annotations

import torch

import grpo
import models
from simulate import USER, Turn, speaker_messages

# ESConv supporter strategy -> the support persona whose role it is (personas.json, set "support").
# "Self-disclosure" and "Others" fit none of the four roles: those turns stay in the history as
# context ("Companion: ...") but are never targets.
STRATEGY_PERSONA = {"Reflection of feelings": "Anchor", "Restatement or Paraphrasing": "Anchor",
                    "Question": "Catalyst", "Affirmation and Reassurance": "Beacon",
                    "Providing Suggestions": "Guide", "Information": "Guide"}


def completion_text(tok, messages: list[dict], target: str) -> tuple[str, str]:
    """(prompt text, completion text) with the chat template's own end-of-turn after the target.

    Rendering the conversation with and without the assistant turn and taking the difference
    gives exactly the tokens the model must learn to write, end-of-turn marker included, for
    any chat template (a plain `target + eos` would be wrong for templates that add more)."""
    prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": target}], tokenize=False)
    if full.startswith(prompt):
        return prompt, full[len(prompt):].rstrip("\n")
    return prompt, target + (tok.eos_token or "")


def supervised_finetune(model, tok, examples: list[tuple[list[dict], str]], steps: int,
                          batch_size: int = 8, lr: float = 2e-5, log=print) -> list[float]:
    """Maximum likelihood of each target given its prompt, `steps` AdamW steps of `batch_size`
    examples (cycling). Returns the per-step loss (mean negative log-probability per target
    token), which should fall. Full fine-tuning, like the GRPO that follows."""
    if steps <= 0 or not examples:
        return []
    rows = []
    for messages, target in examples:
        prompt, completion = completion_text(tok, messages, target)
        rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                     tok(completion, add_special_tokens=False)["input_ids"]))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        batch = [rows[(step * batch_size + j) % len(rows)] for j in range(batch_size)]
        p_ids, p_mask = models.left_pad([p for p, _ in batch], tok.pad_token_id)      # (B, P)
        width = max(len(c) for _, c in batch)
        c_ids = torch.full((len(batch), width), tok.pad_token_id, dtype=torch.long)   # (B, C), right-padded
        c_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, c) in enumerate(batch):
            c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[r, :len(c)] = 1
        dev = next(model.parameters()).device
        logps = grpo.completion_logprobs(model, torch.cat([p_ids, c_ids], 1).to(dev),
                                         torch.cat([p_mask, c_mask], 1).to(dev), p_ids.shape[1])  # (B, C)
        mask = c_mask.to(dev).float()
        loss = -(logps * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        log(f"warm start {step + 1}/{steps}: loss {loss.item():.3f}")
    model.eval()
    return losses


def supporter_examples(contexts, personas) -> list[tuple[list[dict], str]]:
    """(speaker prompt, supporter's words) for every strategy-labelled supporter turn of the
    contexts' recorded dialogues whose strategy maps to a persona (STRATEGY_PERSONA).

    The prompt is exactly what the speaker sees in a conversation (simulate.speaker_messages, the
    "persona" style): its card, the situation and the dialogue so far, in which earlier supporter
    turns are labelled with their persona (or "Companion") and seeker turns with "User"."""
    examples = []
    for ctx in contexts:
        turns = []
        for t in ctx.turns:
            if t["speaker"] == "user":
                turns.append(Turn(USER, t["text"]))
                continue
            persona = personas.find(STRATEGY_PERSONA.get(t.get("strategy", ""), "")) if t.get("strategy") else None
            if persona is not None and turns:
                examples.append((speaker_messages(persona, personas, ctx, turns), t["text"]))
            turns.append(Turn(persona.name if persona else "Companion", t["text"]))
    return examples


@torch.no_grad()
def mean_nll(model, tok, examples: list[tuple[list[dict], str]], batch_size: int = 8) -> float:
    """Mean negative log-likelihood per target token over the examples (no update): the number
    the SFT command prints before and after training, on held-out dialogues."""
    total, count = 0.0, 0
    dev = next(model.parameters()).device
    for start in range(0, len(examples), batch_size):
        rows = []
        for messages, target in examples[start:start + batch_size]:
            prompt, completion = completion_text(tok, messages, target)
            rows.append((tok(prompt, add_special_tokens=False)["input_ids"],
                         tok(completion, add_special_tokens=False)["input_ids"]))
        p_ids, p_mask = models.left_pad([p for p, _ in rows], tok.pad_token_id)         # (B, P)
        width = max(len(c) for _, c in rows)
        c_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)      # (B, C)
        c_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, (_, c) in enumerate(rows):
            c_ids[r, :len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[r, :len(c)] = 1
        logps = grpo.completion_logprobs(model, torch.cat([p_ids, c_ids], 1).to(dev),
                                         torch.cat([p_mask, c_mask], 1).to(dev), p_ids.shape[1])  # (B, C)
        total -= (logps.cpu() * c_mask).sum().item()
        count += int(c_mask.sum())
    return total / max(count, 1)
