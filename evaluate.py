"""evaluate.py: does the trained group talk better than the alternatives? Every number of the table.

Where this sits in MASCOT (arXiv 2601.14230): last. Phase I (persona-aligned speakers) and Phase II
(the trained director) produce a system; this module runs several systems on the same held-out
contexts and simulated users, scores the conversations they produce, and writes the tables.
The formulas themselves (Self-BLEU, distinct-n, NLI rates, bootstrap intervals, the sign test,
the rubric parser) are pure functions in metrics.py; this file decides what is measured on what.

Systems compared
----------------
Every baseline of the paper, its two ablations and MASCOT (SYSTEMS below, one line each in the
results): zero-shot, zero-shot CoT, few-shot, few-shot CoT, self-consistency, SFT, MultiAgentESC,
plus our round-robin and prompted-director reference points, MASCOT-P (no persona alignment: base
speakers), MASCOT-C (no director: random speaking order) and MASCOT. Every system gets the same
persona cards (`--role-setting full`; `name` cuts them to name and role for an ablation), the
same simulated user (the base model, or --user), and for conversation i the same context, Big Five profile
and sampling seeds, so differences come from the system alone. A system whose checkpoint is
missing is skipped, and the command that makes the checkpoint is printed; nothing stands in.

What is measured, and by whom
-----------------------------
Every column names its evaluator, and whether training used that evaluator (results.md, "Who
measured each column"): a number from the judge that labelled the reward model's pairs, or from
the reward model itself, can rise because the speakers learned to please it. So the tables hold:
  - judge rubrics (agent-specific and collective; Overall = the mean of the criteria, as in the
    paper). The default offline judge cannot read rubrics: it approximates two (marked *);
  - persona identification by the FROZEN base model (persona_id.py): an evaluator no stage of
    training used, validated on the labelled wrong-role pairs;
  - redundancy (Self-BLEU, distinct-n, embedding similarity, NLI rates);
  - reward-hack diagnostics (hacks.py: context / persona-card copying, echoing other companions,
    prompt leaks, empty replies, length) and crisis-guard stops, so hacking shows as numbers;
  - the paired change of the key columns against round-robin (where MASCOT starts from).
Pairwise preference is decided by the independent evaluator unless `--pairwise-by judge`.

What we simplify relative to the paper
--------------------------------------
- The paper's judges are GPT-4o, Gemma-3-27B-IT and Phi-4; its rubric texts, score scale and NLI
  model are not published. We use whatever `--judge` names, our own rubrics (data/rubrics.json)
  on a 1-5 scale rescaled to 0-100, and whatever `AutoModelForSequenceClassification` NLI model
  `--nli-model` gives (labels read from its config).
- Agent-specific metrics are judged per agent turn and averaged over the conversation's agent
  turns; collective metrics once per conversation.
- The Self-BLEU n-gram order is not published; we use Texygen's BLEU-4 setting (max_n=4).
- The human studies need people: `extras/annotate.py` collects their judgements and
  `evaluate --human FILE` tests them (human.py).

How to run
----------
    python mascot.py evaluate --help                  # the flags, with defaults
    python mascot.py evaluate                         # every system with checkpoints, 8 contexts
    python mascot.py evaluate --profiles all --contexts 50 --systems round-robin,mascot  # 50 x 10
    python mascot.py evaluate --set meeting           # meeting contexts, sliced by domain
    python mascot.py evaluate --data path/to/esconv/train.jsonl    # ESConv: held-out transfer
    python mascot.py evaluate --judge hf:HuggingFaceTB/SmolLM2-1.7B-Instruct --nli-model <folder>
    python mascot.py evaluate --systems sft,mascot --add  # add systems to the evaluation in RUN/eval
    python mascot.py evaluate --human RUN/human/annotations.jsonl  # the human studies' statistics

ESConv as transfer: the speakers and director were trained on the bundled (or ED) contexts, so
`--data <ESConv>` evaluates them on a dataset they never saw (its held-out split, as for any
other source). Output: a table per metric group on stdout, slice tables (support valence,
meeting domain, profile, Big Five trait), the pairwise line, and RUN/eval/{results.md,
results.json, transcripts.jsonl}.
"""

import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import baselines
import data
import director as dr
import hacks
import models
import persona_id
from data import UserError
from judge import judge_from_flags
from metrics import (NLI_RELATIONS, bootstrap_ci, distinct_n, mean_or_none, mean_pairwise_similarity,
                     nli_label_index, nli_rates, parse_ab, parse_rubric_score, rescale_0_100, self_bleu,
                     semantic_redundancy_rate, win_rate)
from results import (earlier_systems, folder_stamp, json_safe, result_notes, results_markdown, saved_system,
                     training_use)
from simulate import (EXAMPLE_STYLES, SAFETY, USER, Cast, RoundRobin, diagnose_reply,
                      judge_state, role_setting, run_conversations)


# =====================================================================================
# Systems, conversations and the results tables (`python mascot.py evaluate`)
# =====================================================================================
# Everything below runs models. The protocol, in the order `run` follows it:
#   1. pick the held-out contexts and cross each with every Big Five profile, with a seed each;
#   2. for each system, simulate all its conversations together (simulate.run_conversations),
#      with the SAME contexts, profiles and seeds as every other system;
#   3. score every conversation (judge rubrics, persona identification, redundancy, hack
#      diagnostics, crisis stops), then report means with bootstrap CIs over conversations, per
#      system and per slice, and paired changes against round-robin;
#   4. pairwise preference between two systems, conversation by conversation.


@dataclass(frozen=True)
class System:
    """One row of the results table: which speakers, which prompt, which speaking order."""
    name: str
    speakers: str     # "base" (the --model) | "trained" (RUN/stage1/speakers) | "sft" (RUN/sft/model)
    order: str        # "round-robin" | "prompted-director" | "trained-director"
    style: str        # speaker prompt style (simulate.STYLES)
    about: str        # one line for the system list in results.md
    pipeline: str = ""  # "" (one call per turn) | "self-consistency" | "multiagentesc" (baselines.py)


SYSTEMS = (
    System("zero-shot", "base", "round-robin", "zero-shot",
           "base model; each companion gets its card and the conversation and is asked for a short reply"),
    System("zero-shot-cot", "base", "round-robin", "zero-shot-cot",
           "base model; the card, then one sentence of thinking before the reply (only the reply is kept)"),
    System("few-shot", "base", "round-robin", "few-shot",
           "base model; the card + worked examples of companions replying (data/fewshot.json)"),
    System("few-shot-cot", "base", "round-robin", "few-shot-cot",
           "base model; the card + the same examples with their one-sentence thinking; think, then reply"),
    System("self-consistency", "base", "round-robin", "zero-shot-cot",
           "base model; k zero-shot-CoT samples per turn, the one the others agree with most is kept "
           "(--sc-samples, --sc-pick)", pipeline="self-consistency"),
    System("sft", "sft", "round-robin", "persona",
           "the base model fine-tuned on ESConv supporter turns mapped to personas by strategy "
           "(python mascot.py sft), MASCOT's speaker prompt"),
    System("multiagentesc", "base", "round-robin", "persona",
           "base model; per turn: analysis -> every companion proposes a strategy -> one reply per "
           "strategy -> vote -> refine (baselines.py)", pipeline="multiagentesc"),
    System("round-robin", "base", "round-robin", "persona",
           "base speakers with MASCOT's group-chat prompt, fixed roster order: where MASCOT starts from"),
    System("prompted-director", "base", "prompted-director", "persona",
           "untrained LLM director (the base model) + base speakers"),
    System("mascot-p", "base", "trained-director", "persona",
           "trained director + base speakers (ablation: no persona alignment)"),
    System("mascot-c", "trained", "round-robin", "persona",
           "trained speakers + round-robin's fixed order (ablation: no director; differs from "
           "round-robin only in the speakers' weights, so it is stage 1's own comparison)"),
    System("mascot", "trained", "trained-director", "persona",
           "trained director + trained speakers (the full system)"),
)
SYSTEM_NAMES = tuple(s.name for s in SYSTEMS)
REFERENCE = "round-robin"     # the paired-change table compares every system with this one


@dataclass(frozen=True)
class Metric:
    """One column: a key in results.json, a title in the tables, and its rubric if judged."""
    key: str
    title: str
    rubric: str = ""   # what the judge is asked (rubric metrics only); our own text
    digits: int = 1    # decimals shown: 1 for 0-100 judge scores, 3 for rates in [0, 1]


# The rubrics (our own text: the paper does not publish its rubrics) are in data/rubrics.json, so
# they can be read and edited as text. Each names what 1, 3 and 5 mean, because small judges score
# more consistently against anchored levels than against a bare scale. No judge is asked for an
# "overall" score: as in the paper, Overall is the mean of the criteria (`with_overall`).
AGENT_CRITERIA = tuple(Metric(**m) for m in data.asset("rubrics.json")["agent"])
COLLECTIVE_CRITERIA = tuple(Metric(**m) for m in data.asset("rubrics.json")["collective"])
AGENT_METRICS = AGENT_CRITERIA + (Metric("agent_overall", "agent overall (mean)"),)
COLLECTIVE_METRICS = COLLECTIVE_CRITERIA + (Metric("collective_overall", "collective overall (mean)"),)
OVERALL = {"agent_overall": AGENT_CRITERIA, "collective_overall": COLLECTIVE_CRITERIA}
RUBRIC_METRICS = AGENT_METRICS + COLLECTIVE_METRICS
INDEPENDENT_METRICS = (
    Metric("persona_id_accuracy", "persona ID accuracy", digits=3),
    Metric("persona_log_ratio", "persona log-ratio", digits=3),
    Metric("persona_id_equal", f"persona ID accuracy, first {persona_id.EQUAL_TOKENS} tokens", digits=3),
)
REDUNDANCY_METRICS = (
    Metric("self_bleu", "Self-BLEU", digits=3),
    Metric("distinct_1", "distinct-1", digits=3),
    Metric("distinct_2", "distinct-2", digits=3),
    Metric("semantic_redundancy", "semantic redundancy", digits=3),
    Metric("mean_similarity", "mean similarity", digits=3),
    Metric("nli_entailment", "NLI entailment", digits=3),
    Metric("nli_contradiction", "NLI contradiction", digits=3),
    Metric("nli_neutral", "NLI neutral", digits=3),
)
HACK_METRICS = (
    Metric("context_copy", "context copy", digits=3),
    Metric("persona_copy", "persona-card copy", digits=3),
    Metric("history_echo", "history echo", digits=3),
    Metric("self_repeat", "repeats itself", digits=3),
    Metric("meta_leak", "meta/prompt leak", digits=3),
    Metric("trivial", "empty or trivial", digits=3),
    Metric("words", "reply length (words)", digits=1),
    Metric("crisis_stop", "crisis stops", digits=3),
)
ALL_METRICS = RUBRIC_METRICS + INDEPENDENT_METRICS + REDUNDANCY_METRICS + HACK_METRICS
METRIC_GROUPS = (   # one table each in results.md
    ("Agent-specific (judge rubric, 0-100, mean over agent turns; overall = mean of the criteria)", AGENT_METRICS),
    ("Collective (judge rubric, 0-100, whole conversation; overall = mean of the criteria)", COLLECTIVE_METRICS),
    ("Persona consistency by an independent evaluator (the frozen base model; persona_id.py)", INDEPENDENT_METRICS),
    ("Redundancy over agent turns (automatic)", REDUNDANCY_METRICS),
    ("Reward-hack diagnostics (rates over agent turns) and crisis-guard stops", HACK_METRICS))
# The metrics the slice tables show (the full set per slice is in results.json).
HEADLINE = ("agent_overall", "collective_overall", "persona_consistency", "persona_id_accuracy",
            "persona_log_ratio", "persona_id_equal", "self_bleu", "distinct_2", "nli_entailment", "context_copy",
            "persona_copy")
# The paired-change table: (key, +1 if higher is better, -1 if lower is better, 0 if neither).
CHANGE_KEYS = (("persona_id_accuracy", 1), ("persona_log_ratio", 1), ("persona_id_equal", 1), ("self_bleu", -1),
               ("semantic_redundancy", -1), ("context_copy", -1), ("persona_copy", -1), ("history_echo", -1),
               ("self_repeat", -1), ("meta_leak", -1), ("trivial", -1), ("words", 0), ("crisis_stop", -1))
RUBRIC_LO, RUBRIC_HI = 1, 5
JUDGE_MAX_TOKENS = 32   # room for "Score: 4" and a few words a judge adds; cached, so cheap to re-run

# What a judge that cannot read rubrics (the offline judge, a reward model) stands in with.
# Only these two; every other rubric metric is reported as n/a rather than guessed.
APPROXIMATIONS = {
    "persona_consistency": "100 x the judge's score in [0, 1] of each agent turn given its persona "
                           "and the conversation before it, averaged over the conversation's agent turns",
    "response_relevance": "100 x max(0, cosine(agent turn, the user's latest message)), the offline "
                          "judge's context feature, averaged over agent turns",
}

# -------------------------------------------------------------------------------------
# Which conversations: held-out contexts x profiles, the same for every system
# -------------------------------------------------------------------------------------

def plan_conversations(contexts: list, n_contexts: int, profile_ids: list[str]) -> list[tuple]:
    """(context, profile id) of every conversation, identical for every system: each of the first
    n_contexts contexts with every profile, context by context. The paper crosses 50 contexts
    with 10 profiles: 500 conversations per system.

    Example: contexts c0, c1, profiles [p, q] -> (c0,p) (c0,q) (c1,p) (c1,q).
    """
    return [(c, p) for c in contexts[:n_contexts] for p in profile_ids]


def resolve_profiles(spec: str, profiles: dict) -> list[str]:
    """'all' -> the profiles with one trait set high or low (the paper's ten; our all-average
    profile is left out, name it to add it); 'a,b' -> those ids, checked."""
    if spec.strip() == "all":
        one_trait = [pid for pid, p in profiles.items() if profile_trait(p) not in ("average", "mixed")]
        return one_trait or list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in ids if p not in profiles]
    if not ids or unknown:
        raise UserError(f"--profiles {spec}: unknown profile id '{(unknown or [''])[0]}'; "
                        f"use 'all' or ids from the profiles file: {', '.join(profiles)}")
    return ids


def profile_trait(profile) -> str:
    """The Big Five trait a profile sets high or low ("openness"), "average" when none, "mixed" when several."""
    moved = [t for t, level in getattr(profile, "levels", {}).items() if level != "average"]
    return moved[0] if len(moved) == 1 else ("average" if not moved else "mixed")


def load_fewshot(persona_set: str) -> list[dict]:
    """The worked examples (with their 'thinking') of one persona set from data/fewshot.json."""
    examples = data.asset("fewshot.json").get(persona_set)
    fields = ("situation", "user", "persona", "thinking", "reply")
    if not isinstance(examples, list) or not examples or not all(
            isinstance(e, dict) and all(isinstance(e.get(k), str) for k in fields) for e in examples):
        raise UserError(f"data/fewshot.json: '{persona_set}' must be a list of examples with "
                        + ", ".join(fields))
    return examples


# -------------------------------------------------------------------------------------
# Per-conversation metrics
# -------------------------------------------------------------------------------------

class MemoEncoder:
    """A sentence encoder that embeds each distinct text once per run.

    The offline judge's scores, its features and the redundancy metrics all embed the same agent
    turns, persona descriptions and user messages; on a CPU the encoder is the slow part of
    scoring, so the vectors are kept (384 floats per text: a few MB for a whole evaluation).
    Same interface as models.SentenceEncoder: embed(texts) -> (N, D) unit vectors.
    """

    def __init__(self, encoder):
        self.encoder = encoder
        self.vectors: dict[str, torch.Tensor] = {}

    def embed(self, texts: list[str], batch_size: int = 64) -> torch.Tensor:
        todo = sorted({t for t in texts if t not in self.vectors}, key=len)  # similar lengths batch well
        if todo:
            self.vectors.update(zip(todo, self.encoder.embed(todo, batch_size)))
        if not texts:
            return self.encoder.embed([])                                    # (0, D)
        return torch.stack([self.vectors[t] for t in texts])                 # (N, D)


def agent_turn_states(conv, personas) -> list[tuple]:
    """(JudgeState, reply) for every agent turn: the view the stage-1 judge and the stage-2
    coherence reward have of a reply (simulate.judge_state), so all three judge alike."""
    return [(judge_state(personas.find(t.speaker), conv.turns[:i], conv.context.situation), t.text)
            for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]


def _lines(turns) -> str:
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns)


def rubric_scores(conv, personas, judge) -> tuple[dict, Counter]:
    """Every rubric metric of one conversation from an LLM judge, on 0-100.

    Agent-specific criteria: one prompt per (agent turn, criterion), the scores averaged over the
    conversation's agent turns. Collective criteria: one prompt per criterion on the whole
    transcript. The two Overall columns are the means of the criteria (with_overall).
    judge.complete_many decodes greedily (temperature 0, as in the paper). An answer that
    parse_rubric_score cannot read is counted in the returned Counter and left out of the mean;
    a metric with no readable answer at all is None for this conversation, and so is every
    metric of a conversation without agent turns (nothing of the system's to judge).

    Returns:
        ({metric key: score in [0, 100] or None}, Counter {metric key: unparseable answers}).
    """
    agent_idx = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    asks = []                           # (metric key, prompt), all sent in one judge.complete_many
    for m in AGENT_CRITERIA:
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            asks.append((m.key, data.prompt("eval_agent").format(
                name=p.name, role=p.role, description=p.description, situation=conv.context.situation,
                history=_lines(conv.turns[:i]), reply=conv.turns[i].text, title=m.title, rubric=m.rubric)))
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for m in COLLECTIVE_CRITERIA if agent_idx else []:    # none when the crisis guard stopped it first
        asks.append((m.key, data.prompt("eval_collective").format(
            roster=roster, situation=conv.context.situation, transcript=_lines(conv.turns), title=m.title,
            rubric=m.rubric)))
    answers = judge.complete_many([prompt for _, prompt in asks], max_new_tokens=JUDGE_MAX_TOKENS) if asks else []
    scores, unparseable = {m.key: [] for m in AGENT_CRITERIA + COLLECTIVE_CRITERIA}, Counter()
    for (key, _), answer in zip(asks, answers):
        score = parse_rubric_score(answer, RUBRIC_LO, RUBRIC_HI)
        if score is None:
            unparseable[key] += 1
        else:
            scores[key].append(rescale_0_100(score, RUBRIC_LO, RUBRIC_HI))
    values = {key: sum(s) / len(s) if s else None for key, s in scores.items()}
    return with_overall(values), unparseable


def with_overall(values: dict) -> dict:
    """Add agent_overall and collective_overall: the mean of their criteria (0-100), as the paper
    computes Overall; None when any criterion has no score for this conversation."""
    for key, criteria in OVERALL.items():
        scores = [values.get(m.key) for m in criteria]
        values[key] = None if any(v is None for v in scores) else sum(scores) / len(scores)
    return values


def approximate_scores(convs, personas, judge) -> list[dict]:
    """What a judge that cannot read rubrics can still say, per conversation (APPROXIMATIONS).

    One batched judge.score_many over the agent turns of all conversations. Returns per
    conversation {"judge_score": mean score in [0, 1] (also used for pairwise preference),
    "persona_consistency": 0-100, and "response_relevance": 0-100 when the judge exposes its
    features (OfflineJudge.features_many)}; values are None for a conversation without agent turns.
    """
    rows = [agent_turn_states(c, personas) for c in convs]
    flat = [r for conv_rows in rows for r in conv_rows]
    states, replies = [s for s, _ in flat], [r for _, r in flat]
    scores = judge.score_many(states, replies) if flat else []
    relevance = None
    if flat and hasattr(judge, "features_many"):
        relevance = [max(0.0, f["context"]) for f in judge.features_many(states, replies)]
    out, start = [], 0
    for conv_rows in rows:
        end = start + len(conv_rows)
        s = scores[start:end]
        mean = sum(s) / len(s) if s else None
        rec = {"judge_score": mean, "persona_consistency": None if mean is None else rescale_0_100(mean, 0, 1)}
        if relevance is not None:
            r = relevance[start:end]
            rec["response_relevance"] = rescale_0_100(sum(r) / len(r), 0, 1) if r else None
        out.append(rec)
        start = end
    return out


def redundancy_scores(convs, encoder, nli=None) -> list[dict]:
    """The automatic metrics over each conversation's agent turns (one encoder call in all).

    nli: None, or (model, tokenizer) of an NLI classifier for the entailment / contradiction /
    neutral rates. mean_similarity and the NLI rates are None for fewer than two agent turns
    (no pair: no evidence either way), and every metric is None for a conversation without agent
    turns (the crisis guard stopped it at the opening): "no repetition" would flatter the system.
    """
    texts = [[t.text for t in c.agent_turns()] for c in convs]
    vectors = encoder.embed([t for ts in texts for t in ts])             # (sum of turns, D)
    out, start = [], 0
    for ts in texts:
        emb = vectors[start:start + len(ts)]                             # (n_turns, D)
        start += len(ts)
        if not ts:
            out.append({m.key: None for m in REDUNDANCY_METRICS if nli is not None or not m.key.startswith("nli_")})
            continue
        sim = mean_pairwise_similarity(emb) if len(ts) >= 2 else float("nan")
        rec = {"self_bleu": self_bleu(ts), "distinct_1": distinct_n(ts, 1), "distinct_2": distinct_n(ts, 2),
               "semantic_redundancy": semantic_redundancy_rate(emb),
               "mean_similarity": None if math.isnan(sim) else sim}
        if nli is not None:
            rates = nli_rates(ts, *nli)
            for relation in NLI_RELATIONS:
                rec[f"nli_{relation}"] = rates[relation] if rates["pairs"] else None
        out.append(rec)
    return out


def hack_scores(conv, personas) -> dict:
    """The reward-hack diagnostics of one conversation: each rate over its agent turns, and the
    mean reply length in words; None for a conversation without agent turns.

    The same per-reply definition stage 1 logs for every sampled reply
    (simulate.diagnose_reply -> hacks.diagnose), judged against the speaker's FULL card,
    whatever --role-setting showed the speaker."""
    names, rows = personas.names(), []
    for i, t in enumerate(conv.turns):
        if t.speaker in (USER, SAFETY) or personas.find(t.speaker) is None:
            continue
        rows.append(diagnose_reply(personas.find(t.speaker), conv.turns[:i], conv.context.situation,
                                   t.text, names))
    rates = hacks.rates(rows)
    return {m.key: rates.get(m.key) for m in HACK_METRICS if m.key in hacks.DIAGNOSTICS}


def persona_id_scores(convs, identifier) -> list[dict]:
    """Per conversation, the independent evaluator's numbers over its agent turns (persona_id.py):
    the share of turns whose own card is the base model's best guess, the mean per-token log-ratio
    own card vs the others, and the share again from each turn's first EQUAL_TOKENS tokens (turns
    at least that long; a system whose replies grow cannot gain on it by length alone). None
    without such turns."""
    items, owner = [], []
    for n, c in enumerate(convs):
        for i, t in enumerate(c.turns):
            if t.speaker not in (USER, SAFETY):
                items.append(persona_id.Item(t.speaker, c.context.situation,
                                             [(u.speaker, u.text) for u in c.turns[:i]], t.text))
                owner.append(n)
    scores = identifier.score(items) if items else []
    out = []
    for n in range(len(convs)):
        mine = [s for s, o in zip(scores, owner) if o == n]
        out.append({"persona_id_accuracy": mean_or_none([r["correct"] for r in mine]),
                    "persona_log_ratio": mean_or_none([r["log_ratio"] for r in mine]),
                    "persona_id_equal": mean_or_none([r["correct_equal"] for r in mine])})
    return out


def score_conversations(convs, personas, judge, encoder, nli=None, identifier=None) -> tuple[list[dict], Counter]:
    """One record per conversation: what it was (context, profile, slices), its metrics, its
    crisis events; plus the count of unparseable judge answers (LLM judges only).
    `personas` holds the full cards (the hack diagnostics and persona identification need them
    even when the speakers saw only names); identifier: a persona_id.PersonaIdentifier or None."""
    records = [{"index": i, "context_id": c.context.id, "profile": c.profile,
                "valence": c.context.valence, "domain": c.context.domain, "metrics": {},
                "crisis_events": sum(e.get("type") == "crisis" for e in c.events),
                "agent_turns": len(c.agent_turns()), "turns": len(c.turns)} for i, c in enumerate(convs)]
    unparseable = Counter()
    if judge.can_generate:
        for rec, conv in zip(records, convs):
            values, bad = rubric_scores(conv, personas, judge)
            rec["metrics"].update(values)
            unparseable += bad
    else:
        for rec, approx in zip(records, approximate_scores(convs, personas, judge)):
            rec["judge_score"] = approx.pop("judge_score")    # kept for the pairwise comparison
            rec["metrics"].update(approx)
    if identifier is not None:
        for rec, values in zip(records, persona_id_scores(convs, identifier)):
            rec["metrics"].update(values)
    for rec, values in zip(records, redundancy_scores(convs, encoder, nli)):
        rec["metrics"].update(values)
    for rec, conv in zip(records, convs):
        rec["metrics"].update(hack_scores(conv, personas))
        rec["metrics"]["crisis_stop"] = float(rec["crisis_events"] > 0)
    return records, unparseable


# -------------------------------------------------------------------------------------
# Pairwise preference
# -------------------------------------------------------------------------------------

def pairwise_outcomes(convs_a: list, convs_b: list, judge, personas,
                      scores_a: list | None = None, scores_b: list | None = None) -> tuple[list[str], int]:
    """Which system's conversation is better, conversation index by conversation index.

    With scores (scores_a / scores_b: one number or None per conversation, from the independent
    evaluator or a judge that cannot generate): the higher score wins; None or equal is a tie.
    The rule does not look at an order, so it is symmetric by construction.
    Otherwise an LLM judge: data/prompts/eval_pairwise.txt twice, with A shown first and then B
    shown first; the outcome counts only when both orders pick the same system, otherwise it is a
    tie (the judge followed the position, not the content; Zheng et al. 2023). An unreadable
    answer also gives a tie and is counted.

    Returns:
        (outcomes "A" | "B" | "tie" per conversation, number of unreadable judge answers).
    """
    if scores_a is not None:
        return ["tie" if sa is None or sb is None or sa == sb else "A" if sa > sb else "B"
                for sa, sb in zip(scores_a, scores_b)], 0
    outcomes, unreadable = [], 0
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    prompts = [data.prompt("eval_pairwise").format(roster=roster, situation=a.context.situation, a=x, b=y)
               for a, b in zip(convs_a, convs_b)
               for x, y in ((_lines(a.turns), _lines(b.turns)), (_lines(b.turns), _lines(a.turns)))]
    picks = [parse_ab(answer) for answer in judge.complete_many(prompts, max_new_tokens=8)] if prompts else []
    for first, second in zip(picks[0::2], picks[1::2]):
        unreadable += (first is None) + (second is None)
        pick_first = {0: "A", 1: "B"}.get(first)        # A was shown first
        pick_second = {0: "B", 1: "A"}.get(second)      # B was shown first
        outcomes.append(pick_first if pick_first is not None and pick_first == pick_second else "tie")
    return outcomes, unreadable


# -------------------------------------------------------------------------------------
# Aggregation: means with bootstrap CIs, per system and per slice
# -------------------------------------------------------------------------------------

OK, APPROXIMATED = "ok", "approximated"


def metric_status(judge, nli_given: bool, identifier_given: bool = True) -> dict[str, str]:
    """For every metric: "ok", "approximated", or the reason it has no number (shown in tables)."""
    status = {}
    kind = judge.name.split(":")[0]
    for m in RUBRIC_METRICS:
        if judge.can_generate:
            status[m.key] = OK
        elif m.key == "persona_consistency" or (m.key == "response_relevance" and hasattr(judge, "features_many")):
            status[m.key] = APPROXIMATED
        else:
            status[m.key] = f"n/a ({kind} judge)"
    for m in INDEPENDENT_METRICS:
        status[m.key] = OK if identifier_given else "skipped (--no-persona-id)"
    for m in REDUNDANCY_METRICS:
        status[m.key] = OK if nli_given or not m.key.startswith("nli_") else "skipped (no --nli-model)"
    for m in HACK_METRICS:
        status[m.key] = OK
    return status


def summarise(values: list, seed: int) -> dict:
    """Mean and 95% bootstrap CI of the per-conversation values; None (no score) is left out."""
    kept = [v for v in values if v is not None]
    mean, lo, hi = bootstrap_ci(kept, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(kept)}


def aggregate(records: list[dict], status: dict[str, str], seed: int) -> dict:
    """{metric key: summary + status} over the conversation records of one system (or slice)."""
    out = {}
    for m in ALL_METRICS:
        if status[m.key] in (OK, APPROXIMATED):
            out[m.key] = {**summarise([r["metrics"].get(m.key) for r in records], seed),
                          "status": status[m.key]}
        else:
            out[m.key] = {"status": status[m.key]}
    return out


def slice_fields(persona_set: str, records: list[dict]) -> list[str]:
    """Which slices to report: valence (support), domain (meeting), and with several profiles the
    profile and its Big Five trait (high and low together)."""
    fields = []
    if persona_set == "support" and any(r["valence"] for r in records):
        fields.append("valence")
    if persona_set == "meeting" and any(r["domain"] for r in records):
        fields.append("domain")
    if len({r["profile"] for r in records}) > 1:
        fields += ["profile", "trait"]
    return fields


def slices(records: list[dict], fields: list[str], status: dict[str, str], seed: int) -> dict:
    """{field: {value: {"n", "metrics"}}}: aggregate() within each valence / domain / profile."""
    out = {}
    for field in fields:
        out[field] = {}
        for value in sorted({r[field] or "-" for r in records}):
            group = [r for r in records if (r[field] or "-") == value]
            out[field][value] = {"n": len(group), "metrics": aggregate(group, status, seed)}
    return out


def paired_changes(entries: dict, reference: str, seed: int) -> dict:
    """{system: {key: summary}}: system minus `reference`, conversation by conversation (the same
    context, profile and seeds), with a 95% bootstrap interval over the paired differences. A
    change whose interval excludes 0 is more than the noise of these conversations."""
    if reference not in entries:
        return {}
    base = entries[reference]["conversations"]
    out = {}
    for name, e in entries.items():
        if name == reference:
            continue
        out[name] = {}
        for key, _ in CHANGE_KEYS:
            diffs = [a["metrics"].get(key) - b["metrics"].get(key) for a, b in zip(e["conversations"], base)
                     if a["metrics"].get(key) is not None and b["metrics"].get(key) is not None]
            out[name][key] = summarise(diffs, seed)
    return out


# -------------------------------------------------------------------------------------
# The run
# -------------------------------------------------------------------------------------

def choose_systems(spec: str, args) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped, with the command that makes what is missing}."""
    names = list(SYSTEM_NAMES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEM_NAMES]
    if not names or unknown:
        raise UserError(f"--systems {spec}: unknown system '{(unknown or [''])[0]}'; "
                        f"use 'all' or a comma-separated subset of {', '.join(SYSTEM_NAMES)}")
    run = f" --run {args.run}" + (f" --model {args.model}" if args.model != models.EMBEDDED else "")
    data_flag = args.data if args.data != "bundled" else "<ESConv.json or an ESConv .jsonl>"
    missing = {"trained": (speakers_folder(args), args.speakers, f"python mascot.py train --stage 1{run}"),
               "trained-director": (director_folder(args), args.director, f"python mascot.py train --stage 2{run}"),
               "sft": (sft_folder(args), args.sft, f"python mascot.py sft{run} --data {data_flag}")}
    chosen, skipped = [], {}
    for system in SYSTEMS:
        if system.name not in names:
            continue
        for need in (system.speakers, system.order):
            if need in missing and missing[need][1] is None and not (Path(missing[need][0]) / "config.json").exists():
                folder, _, command = missing[need]
                skipped[system.name] = f"no model at {folder}; make it with: {command}"
                break
        else:
            chosen.append(system)
    return chosen, skipped


def load_nli(name: str, device: str):
    """(model, tokenizer) of an MNLI-style classifier, checked for the three labels up front."""
    try:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSequenceClassification.from_pretrained(name).to(device).eval()
        nli_label_index(model.config.id2label, name)
    except (OSError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise UserError(f"--nli-model {name}: cannot use it ({first}); pass a local folder of an "
                        "MNLI-style sequence classifier") from None
    return model, tok


@dataclass
class Setup:
    """What every system of one evaluation shares: the conversations to have, the frozen models,
    the judge and the metric switches."""
    contexts: list               # conversation i's context ...
    profiles: list[str]          # ... and its simulated user's Big Five profile id
    base: tuple                  # (model, tokenizer) of --model: base speakers, prompted director, evaluator
    user: tuple                  # (model, tokenizer): the simulated user of every system (--user, else base)
    models: dict                 # "trained" | "sft" | "trained-director" -> (model, tokenizer) when needed
    fewshot: list[dict]
    encoder: object
    judge: object
    nli: tuple | None
    identifier: object           # persona_id.PersonaIdentifier, or None with --no-persona-id
    status: dict[str, str]       # metric key -> "ok" | "approximated" | why it has no number


def prepare(args, inputs, systems: list[System], out: Path, notes: list[str]) -> Setup:
    """The conversations every system gets (same contexts, profiles and seeds), and the models."""
    profile_ids = resolve_profiles(args.profiles, inputs.profiles)
    plan = plan_conversations(inputs.held_out, args.contexts, profile_ids)
    if args.contexts > len(inputs.held_out):
        notes.append(f"asked for {args.contexts} contexts, the held-out split has {len(inputs.held_out)}: "
                     "all are used")
    encoder = MemoEncoder(models.SentenceEncoder(device=args.device))
    offline = args.judge.strip() == "offline"
    judge = judge_from_flags(args, None if offline else out / "judge_cache.jsonl",
                             **({"encoder": encoder} if offline else {}))
    nli = load_nli(args.nli_model, args.device) if args.nli_model else None
    need = {s.speakers for s in systems} | {s.order for s in systems}
    folders = {"trained": speakers_folder(args), "sft": sft_folder(args), "trained-director": director_folder(args)}
    base = models.load_model(args.model, device=args.device, frozen=True)
    # Served roles (openai:<base url>) keep their replies in RUN/eval/served_cache.jsonl.
    roles = {"trained": "speakers", "trained-director": "director"}
    loaded = {k: models.load_role(f, roles[k], args, out / "served_cache.jsonl") if k in roles
              else models.load_model(f, device=args.device, frozen=True) for k, f in folders.items() if k in need}
    user = models.load_role(args.user, "user", args, out / "served_cache.jsonl") if args.user else base
    return Setup(contexts=[c for c, _ in plan], profiles=[p for _, p in plan], base=base, user=user, models=loaded,
                 fewshot=load_fewshot(args.set) if any(s.style in EXAMPLE_STYLES for s in systems) else [],
                 encoder=encoder, judge=judge, nli=nli,
                 identifier=persona_id.PersonaIdentifier(*base, inputs.personas, args.model) if args.persona_id else None,
                 status=metric_status(judge, nli is not None, args.persona_id))


def run_system(system: System, setup: Setup, inputs, args) -> tuple[list, dict]:
    """Simulate one system's conversations (all advanced together) and score them."""
    t0 = time.time()
    speaker_model, speaker_tok = setup.models.get(system.speakers, setup.base)
    shown = role_setting(inputs.personas, args.role_setting)        # what the speakers' prompts hold
    cast = Cast(shown, speaker_model, speaker_tok, setup.user[0], setup.user[1], args.max_new_tokens,
                style=system.style, examples=setup.fewshot if system.style in EXAMPLE_STYLES else [])
    if system.order == "round-robin":
        policy = RoundRobin(inputs.personas)
    else:
        model, tok = setup.base if system.order == "prompted-director" else setup.models["trained-director"]
        policy = dr.LLMDirector(model, tok, inputs.personas, name=system.order)
    pipeline = None
    if system.pipeline == "self-consistency":
        pipeline = baselines.SelfConsistency(args.sc_samples, args.sc_pick, setup.judge, system.style)
    elif system.pipeline == "multiagentesc":
        pipeline = baselines.MultiAgentESC()
    if pipeline is None:
        convs = run_conversations(setup.contexts, policy, cast, inputs.profiles, setup.profiles, args.turns,
                                  args.user_every, args.seed)
    else:
        convs = baselines.run_conversations(setup.contexts, policy, pipeline, cast, inputs.profiles, setup.profiles,
                                            args.turns, args.user_every, args.seed)
    t1 = time.time()
    records, unparseable = score_conversations(convs, inputs.personas, setup.judge, setup.encoder, setup.nli,
                                               setup.identifier)
    for rec in records:
        rec["trait"] = profile_trait(inputs.profiles.get(rec["profile"]))
    t2 = time.time()
    print(f"{system.name}: {len(convs)} conversations simulated in {t1 - t0:.1f} s, "
          f"scored in {t2 - t1:.1f} s", flush=True)
    where = {"trained": speakers_folder(args), "sft": sft_folder(args)}.get(system.speakers, args.model)
    about = system.about + (f"; picked by {args.sc_pick}" + (f" ({setup.judge.name})" if args.sc_pick == "judge" else "")
                            if system.pipeline == "self-consistency" else "")
    stopped = [r for r in records if r["crisis_events"]]
    entry = {"about": about, "speakers": f"{system.speakers}: {where}, {system.style} prompt, "
                                         f"{args.role_setting} role setting",
             "director": {"round-robin": "round-robin",
                          "prompted-director": f"prompted: {args.model}",
                          "trained-director": f"trained: {director_folder(args)}"}[system.order],
             "judge": setup.judge.name, "n": len(convs), "seconds_simulate": round(t1 - t0, 1),
             "seconds_metrics": round(t2 - t1, 1), "metrics": aggregate(records, setup.status, args.seed),
             "unparseable": dict(unparseable),
             "crisis_events": sum(r["crisis_events"] for r in records), "crisis_conversations": len(stopped),
             "crisis_turn_share": sum(r["turns"] for r in stopped) / max(1, sum(r["turns"] for r in records)),
             "crisis_flags": [{"context_id": c.context.id, "profile": c.profile, "turn": e["turn"],
                               "text": e.get("text", ""), "category": e.get("category", ""), "score": e.get("score")}
                              for c in convs for e in c.events if e.get("type") == "crisis"],
             "conversations": records}
    if isinstance(policy, dr.LLMDirector):
        entry["invalid_directives"], entry["directives"] = policy.invalid, policy.total
    if isinstance(pipeline, baselines.MultiAgentESC):
        entry["pipeline_unparseable"], entry["pipeline_asked"] = dict(pipeline.unparseable), dict(pipeline.asked)
    return convs, entry


def speakers_folder(args) -> str:
    return args.speakers or str(Path(args.run) / "stage1" / "speakers")


def director_folder(args) -> str:
    return args.director or str(Path(args.run) / "stage2" / "director")


def sft_folder(args) -> str:
    return args.sft or str(Path(args.run) / "sft" / "model")


def resume_key(system: System, protocol: dict, setup: Setup, args) -> dict:
    """Everything a system's numbers depend on: a saved result with the same key is the result
    this run would compute (every system's seeds are its own)."""
    folders = {"trained": speakers_folder(args), "sft": sft_folder(args), "trained-director": director_folder(args)}
    used = [folders[k] for k in (system.speakers, system.order) if k in folders]
    served = [args.speakers_model, args.user, args.user_model, args.director_model]     # openai: roles
    return json_safe({"protocol": protocol, "judge": setup.judge.name, "status": setup.status, "served": served,
                      "sc": [args.sc_samples, args.sc_pick], "models": {f: folder_stamp(f) for f in used}})


def run(args, inputs) -> dict:
    """`python mascot.py evaluate`: run the systems, score them, print and write the tables.

    `inputs` is mascot.Inputs (personas, held-out contexts, profiles). Writes
    RUN/eval/{transcripts.jsonl, results.json, results.md} and returns the results dict.
    """
    t_start = time.time()
    out = Path(args.run) / "eval"
    notes = []
    systems, skipped = choose_systems(args.systems, args)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
        notes.append(f"skipped **{name}**: {why}")
    if not systems:
        raise UserError(f"--systems {args.systems}: none of these systems can run; "
                        + "; ".join(f"{n}: {w}" for n, w in skipped.items()))
    setup = prepare(args, inputs, systems, out, notes)
    protocol = {"contexts": [c.id for c in setup.contexts], "profiles": setup.profiles, "turns": args.turns,
                "user_every": args.user_every, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                "model": args.model, "user": args.user or args.model, "data": args.data, "set": args.set,
                "split": inputs.split, "role_setting": args.role_setting}
    entries, rows = earlier_systems(out, protocol, setup.judge.name, setup.status, [s.name for s in systems]) if args.add else ({}, [])
    convs_by_system = {}
    for system in systems:
        # Each finished system is saved at once (RUN/eval/partial/), so an interrupted evaluation
        # run again with the same flags redoes only the systems it had not finished.
        key = resume_key(system, protocol, setup, args)
        done = saved_system(out, system.name, key, setup.contexts)
        if done:
            convs_by_system[system.name], entries[system.name], system_rows = done
            print(f"{system.name}: kept from the interrupted evaluation ({out / 'partial'})", flush=True)
        else:
            convs_by_system[system.name], entries[system.name] = run_system(system, setup, inputs, args)
            system_rows = [{"system": system.name, "index": i, **c.to_json()}
                           for i, c in enumerate(convs_by_system[system.name])]
            data.write_json(out / "partial" / f"{system.name}.json",
                            json_safe({"key": key, "entry": entries[system.name], "rows": system_rows}))
        rows += system_rows
    entries = {n: entries[n] for n in SYSTEM_NAMES if n in entries}          # table order
    data.write_jsonl(out / "transcripts.jsonl", rows)
    fields = slice_fields(args.set, next(iter(entries.values()))["conversations"])
    for entry in entries.values():
        entry["slices"] = slices(entry["conversations"], fields, setup.status, args.seed)
    pairwise = run_pairwise(args, convs_by_system, entries, setup.judge, inputs.personas, setup.status)

    notes += result_notes(entries, setup.judge, setup.status, setup.nli is not None, args.seed,
                          (len(AGENT_CRITERIA), len(COLLECTIVE_CRITERIA)),
                          {m.title: APPROXIMATIONS[m.key] for m in RUBRIC_METRICS if setup.status[m.key] == APPROXIMATED})
    total = time.time() - t_start
    spent = {k: sum(e[f"seconds_{k}"] for e in entries.values()) for k in ("simulate", "metrics")}
    notes.append(f"time: {total:.0f} s in all ({spent['simulate']:.0f} s simulating, {spent['metrics']:.0f} s "
                 f"scoring, the rest loading models and judging pairs) on {args.device}")
    n_ctx = len({c.id for c in setup.contexts})
    profiles = list(dict.fromkeys(setup.profiles))
    summary = (f"{len(setup.contexts)} conversations per system: {n_ctx} held-out '{args.set}' contexts from "
               f"`{args.data}` x {len(profiles)} simulated-user profile(s) ({', '.join(profiles)}); seed {args.seed}, "
               f"{inputs.split}; simulated user: {args.user or args.model}; {args.turns} agent turns, user every {args.user_every}; "
               f"{args.role_setting} persona cards in every system; every system sees the same contexts, profiles "
               "and sampling seeds.")
    results = {"protocol": {"summary": summary, **protocol},
               "judge": setup.judge.name, "status": setup.status,
               "approximations": {k: APPROXIMATIONS[k] for k, v in setup.status.items() if v == APPROXIMATED},
               "evaluators": training_use(args, [m.title for m in RUBRIC_METRICS if setup.status[m.key] in (OK, APPROXIMATED)],
                                          [m.title for m in INDEPENDENT_METRICS], [m.title for m in HACK_METRICS[:-1]]),
               "columns": [{"title": title, "crisis": group is HACK_METRICS,
                            "metrics": [{"key": m.key, "title": m.title, "digits": m.digits} for m in group]}
                           for title, group in METRIC_GROUPS],
               "headline": HEADLINE, "systems": entries, "skipped": skipped, "reference": REFERENCE,
               "change_keys": CHANGE_KEYS, "changes": paired_changes(entries, REFERENCE, args.seed),
               "slice_fields": fields, "pairwise": pairwise, "notes": notes, "seconds": round(total, 1)}
    text = results_markdown(results)
    data.write_text_atomic(out / "results.md", text)
    data.write_json(out / "results.json", json_safe(results))
    shutil.rmtree(out / "partial", ignore_errors=True)          # results.json now holds every system
    print(text, flush=True)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'transcripts.jsonl'}", flush=True)
    return results


def run_pairwise(args, convs_by_system: dict, entries: dict, judge, personas, status: dict) -> dict:
    """Pairwise preference of system A over system B (--pairwise A,B; default mascot,round-robin),
    decided by the independent evaluator (--pairwise-by persona-id, default) or the judge."""
    spec = args.pairwise
    if spec:
        names = [s.strip() for s in spec.split(",")]
        if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
            raise UserError(f"--pairwise {spec}: give two different systems as A,B, from "
                            + ", ".join(SYSTEM_NAMES))
    else:
        names = ["mascot", "round-robin"]
    a, b = names
    by = args.pairwise_by if status["persona_log_ratio"] == OK else "judge"
    missing = [n for n in names if n not in (entries if by == "persona-id" else convs_by_system)]
    if missing:
        return {"a": a, "b": b, "line": f"pairwise {a} vs {b}: not run ({', '.join(missing)} did not run in this "
                                        "evaluation" + (", or was kept by --add" if by == "judge" else "") + ")"}
    if by == "persona-id":
        scores = {n: [r["metrics"].get("persona_log_ratio") for r in entries[n]["conversations"]] for n in names}
        how = ("decided by the independent evaluator (frozen base model, persona_id.py): the conversation whose "
               "agent turns have the higher mean persona log-ratio wins. Training never used this evaluator")
    elif judge.can_generate:
        scores = {a: None, b: None}
        how = (f"decided by the judge {judge.name}, asked in both presentation orders, a win only when both agree. "
               "Check 'Who measured each column' for whether training used this judge")
    else:
        scores = {n: [r.get("judge_score") for r in entries[n]["conversations"]] for n in names}
        how = (f"decided by the judge {judge.name}: the conversation whose agent turns have the higher mean judge "
               "score wins. Check 'Who measured each column' for whether training used this judge")
    outcomes, unreadable = pairwise_outcomes(convs_by_system.get(a), convs_by_system.get(b), judge, personas,
                                             scores[a], scores[b])
    stats = win_rate(outcomes)
    rate = "n/a, every pair tied" if math.isnan(stats["win_rate"]) else f"{stats['win_rate']:.3f}"
    line = (f"**{a} vs {b}**, {len(outcomes)} conversation pairs: {a} wins {stats['wins']}, loses "
            f"{stats['losses']}, ties {stats['ties']}; win rate {rate} (ties left out); exact two-sided "
            f"binomial p = {stats['p_value']:.4g}. {how}.")
    if unreadable:
        line += f" {unreadable} unreadable judge answers made ties."
    return {"a": a, "b": b, "decided_by": by, "outcomes": outcomes, **stats, "unreadable": unreadable, "line": line}
