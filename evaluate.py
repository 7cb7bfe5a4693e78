"""evaluate.py: does the trained group talk better than the alternatives? Every number of the table.

Where this sits in MASCOT (arXiv 2601.14230): last. Phase I (persona-aligned speakers) and Phase II
(the trained director) produce a system; this module runs several systems on the same held-out
contexts and simulated users, scores the conversations they produce, and writes the tables.
The formulas themselves (Self-BLEU, distinct-n, NLI rates, bootstrap intervals, the sign test,
the rubric parser) are pure functions in metrics.py; this file decides what is measured on what.

Systems compared
----------------
The paper compares MASCOT with prompting baselines (zero-shot, zero-shot CoT, few-shot,
few-shot + CoT, self-consistency, SFT, MultiAgentESC) and two ablations: MASCOT-P (no persona
alignment: base speakers) and MASCOT-C (no director: random speaking order). SYSTEMS below lists
the ones this project builds. A system whose checkpoint is missing is skipped with a note, never
stood in for. The simulated user is the base model for every system, and conversation i of every
system has the same context, Big Five profile and sampling seeds, so differences come from the
system alone.

What we simplify relative to the paper
--------------------------------------
- The paper's judges are GPT-4o, Gemma-3-27B-IT and Phi-4; its rubric texts, score scale and NLI
  model are not published. We use whatever `--judge` names, our own rubrics (data/rubrics.json)
  on a 1-5 scale rescaled to 0-100, and whatever `AutoModelForSequenceClassification` NLI model
  `--nli-model` gives (labels read from its config).
- Agent-specific metrics are judged per agent turn and averaged over the conversation's agent
  turns; collective metrics once per conversation.
- The default offline judge is not an LLM and cannot read a rubric. It approximates two metrics
  (APPROXIMATIONS: persona consistency from its score, response relevance from its context
  feature), marked with * in the tables; every other rubric metric is shown as n/a.
- The paper crosses 50 contexts with 10 profiles (500 conversations). We take `--contexts`
  held-out contexts and assign `--profiles` round-robin (plan_conversations), which costs one
  conversation per context instead of ten.
- The Self-BLEU n-gram order is not published; we use Texygen's BLEU-4 setting (max_n=4).
- Pairwise preference comes from the judge, not from people (the paper asked humans).

How to run
----------
    python mascot.py evaluate --help                  # the flags, with defaults
    python mascot.py evaluate                         # every system with checkpoints, 8 contexts
    python mascot.py evaluate --profiles all --contexts 11 --systems round-robin,mascot
    python mascot.py evaluate --set meeting           # meeting contexts, sliced by domain
    python mascot.py evaluate --data path/to/esconv/train.jsonl    # ESConv: held-out transfer
    python mascot.py evaluate --judge hf:HuggingFaceTB/SmolLM2-1.7B-Instruct --nli-model <folder>

ESConv as transfer: the speakers and director were trained on the bundled (or ED) contexts, so
`--data <ESConv>` evaluates them on a dataset they never saw (its held-out split, as for any
other source). Output: a table per metric group on stdout, slice tables (support valence,
meeting domain, profile), the pairwise line, and RUN/eval/{results.md, results.json,
transcripts.jsonl}.
"""

import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

import data
import director as dr
import models
from data import UserError
from judge import make_judge
from metrics import (NLI_RELATIONS, bootstrap_ci, distinct_n, mean_pairwise_similarity, nli_label_index,
                     nli_rates, parse_ab, parse_rubric_score, rescale_0_100, self_bleu,
                     semantic_redundancy_rate, win_rate)
from simulate import SAFETY, USER, Cast, RandomOrder, RoundRobin, judge_state, run_conversations


# =====================================================================================
# Systems, conversations and the results tables (`python mascot.py evaluate`)
# =====================================================================================
# Everything below runs models. The protocol, in the order `run` follows it:
#   1. pick the held-out contexts and give each conversation a Big Five profile and a seed;
#   2. for each system, simulate all its conversations together (simulate.run_conversations),
#      with the SAME contexts, profiles and seeds as every other system;
#   3. score every conversation (judge rubrics, redundancy, crisis events), then report means
#      with bootstrap CIs over conversations, per system and per slice;
#   4. pairwise preference between two systems, conversation by conversation.


@dataclass(frozen=True)
class System:
    """One row of the results table: which speakers, which prompt, which speaking order."""
    name: str
    speakers: str     # "base" (the --model) | "trained" (RUN/stage1/speakers)
    order: str        # "round-robin" | "random" | "prompted-director" | "trained-director"
    style: str        # speaker prompt style (simulate.STYLES)
    about: str        # one line for the system list in results.md


SYSTEMS = (
    System("zero-shot", "base", "round-robin", "plain",
           "base model speaks each persona in turn from a plain prompt (name and role only)"),
    System("few-shot-cot", "base", "round-robin", "fewshot-cot",
           "base model, worked examples with one-sentence thinking (data/fewshot.json), reply kept"),
    System("round-robin", "base", "round-robin", "persona",
           "base speakers with the full persona card, fixed turn order (MultiAgentESC-style)"),
    System("prompted-director", "base", "prompted-director", "persona",
           "untrained LLM director (the base model) + base speakers"),
    System("mascot-p", "base", "trained-director", "persona",
           "trained director + base speakers (ablation: no persona alignment)"),
    System("mascot-c", "trained", "random", "persona",
           "trained speakers + random speaking order (ablation: no director)"),
    System("mascot", "trained", "trained-director", "persona",
           "trained director + trained speakers (the full system)"),
)
SYSTEM_NAMES = tuple(s.name for s in SYSTEMS)


@dataclass(frozen=True)
class Metric:
    """One column: a key in results.json, a title in the tables, and its rubric if judged."""
    key: str
    title: str
    rubric: str = ""   # what the judge is asked (rubric metrics only); our own text
    digits: int = 1    # decimals shown: 1 for 0-100 judge scores, 3 for rates in [0, 1]


# The rubrics (our own text: the paper does not publish its rubrics) are in data/rubrics.json, so
# they can be read and edited as text. Each names what 1, 3 and 5 mean, because small judges score
# more consistently against anchored levels than against a bare scale.
AGENT_METRICS = tuple(Metric(**m) for m in data.asset("rubrics.json")["agent"])
COLLECTIVE_METRICS = tuple(Metric(**m) for m in data.asset("rubrics.json")["collective"])
RUBRIC_METRICS = AGENT_METRICS + COLLECTIVE_METRICS
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
ALL_METRICS = RUBRIC_METRICS + REDUNDANCY_METRICS
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
    """(context, profile id) of every conversation, identical for every system.

    The first n_contexts contexts are used; profiles are assigned round-robin (conversation i
    gets profile i mod P). With several profiles the number of conversations is rounded UP to a
    multiple of P, the contexts cycling, so each profile gets the same number of conversations
    (the paper crosses every context with every profile: 50 x 10; that is P times the cost).

    Example: 3 contexts c0..c2, profiles [p, q] -> (c0,p) (c1,q) (c2,p) (c0,q).
    """
    n_ctx = min(n_contexts, len(contexts))
    P = len(profile_ids)
    total = -(-n_ctx // P) * P                     # ceil(n_ctx / P) * P
    return [(contexts[i % n_ctx], profile_ids[i % P]) for i in range(total)]


def resolve_profiles(spec: str, profiles: dict) -> list[str]:
    """'all' -> every profile id in file order; 'a,b' -> those ids, checked."""
    if spec.strip() == "all":
        return list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    unknown = [p for p in ids if p not in profiles]
    if not ids or unknown:
        raise UserError(f"--profiles {spec}: unknown profile id '{(unknown or [''])[0]}'; "
                        f"use 'all' or ids from the profiles file: {', '.join(profiles)}")
    return ids


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

    Agent-specific metrics: one prompt per (agent turn, metric), the scores averaged over the
    conversation's agent turns. Collective metrics: one prompt per metric on the whole transcript.
    judge.complete decodes greedily (temperature 0, as in the paper). An answer that
    parse_rubric_score cannot read is counted in the returned Counter and left out of the mean;
    a metric with no readable answer at all is None for this conversation, and so is every
    metric of a conversation without agent turns (nothing of the system's to judge).

    Returns:
        ({metric key: score in [0, 100] or None}, Counter {metric key: unparseable answers}).
    """
    values, unparseable = {}, Counter()
    agent_idx = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    for m in AGENT_METRICS:
        scores = []
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            prompt = data.prompt("eval_agent").format(name=p.name, role=p.role, description=p.description,
                                         situation=conv.context.situation,
                                         history=_lines(conv.turns[:i]), reply=conv.turns[i].text,
                                         title=m.title, rubric=m.rubric)
            score = parse_rubric_score(judge.complete(prompt, max_new_tokens=JUDGE_MAX_TOKENS),
                                       RUBRIC_LO, RUBRIC_HI)
            if score is None:
                unparseable[m.key] += 1
            else:
                scores.append(rescale_0_100(score, RUBRIC_LO, RUBRIC_HI))
        values[m.key] = sum(scores) / len(scores) if scores else None
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for m in COLLECTIVE_METRICS:
        if not agent_idx:               # stopped by the crisis guard before any agent spoke
            values[m.key] = None
            continue
        prompt = data.prompt("eval_collective").format(roster=roster, situation=conv.context.situation,
                                          transcript=_lines(conv.turns), title=m.title, rubric=m.rubric)
        score = parse_rubric_score(judge.complete(prompt, max_new_tokens=JUDGE_MAX_TOKENS),
                                   RUBRIC_LO, RUBRIC_HI)
        if score is None:
            unparseable[m.key] += 1
        values[m.key] = None if score is None else rescale_0_100(score, RUBRIC_LO, RUBRIC_HI)
    return values, unparseable


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


def score_conversations(convs, personas, judge, encoder, nli=None) -> tuple[list[dict], Counter]:
    """One record per conversation: what it was (context, profile, slices), its metrics, its
    crisis events; plus the count of unparseable judge answers (LLM judges only)."""
    records = [{"index": i, "context_id": c.context.id, "profile": c.profile,
                "valence": c.context.valence, "domain": c.context.domain, "metrics": {},
                "crisis_events": sum(e.get("type") == "crisis" for e in c.events),
                "agent_turns": len(c.agent_turns())} for i, c in enumerate(convs)]
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
    for rec, values in zip(records, redundancy_scores(convs, encoder, nli)):
        rec["metrics"].update(values)
    return records, unparseable


# -------------------------------------------------------------------------------------
# Pairwise preference
# -------------------------------------------------------------------------------------

def pairwise_outcomes(convs_a: list, convs_b: list, judge, personas,
                      scores_a: list | None = None, scores_b: list | None = None) -> tuple[list[str], int]:
    """Which system's conversation is better, conversation index by conversation index.

    LLM judge (judge.can_generate): PAIRWISE_PROMPT twice, with A shown first and then B shown
    first; the outcome counts only when both orders pick the same system, otherwise it is a tie
    (the judge followed the position, not the content; Zheng et al. 2023). An unreadable answer
    also gives a tie and is counted.
    Any other judge (offline, reward model): compare the mean judge score of each conversation's
    agent turns (scores_a / scores_b, from approximate_scores); the rule does not look at an
    order, so it is symmetric by construction; equal means are a tie.

    Returns:
        (outcomes "A" | "B" | "tie" per conversation, number of unreadable judge answers).
    """
    outcomes, unreadable = [], 0
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for i, (a, b) in enumerate(zip(convs_a, convs_b)):
        if not judge.can_generate:
            sa, sb = scores_a[i], scores_b[i]
            if sa is None or sb is None or sa == sb:
                outcomes.append("tie")
            else:
                outcomes.append("A" if sa > sb else "B")
            continue
        text_a, text_b = _lines(a.turns), _lines(b.turns)
        first = parse_ab(judge.complete(data.prompt("eval_pairwise").format(roster=roster, situation=a.context.situation,
                                                               a=text_a, b=text_b), max_new_tokens=8))
        second = parse_ab(judge.complete(data.prompt("eval_pairwise").format(roster=roster, situation=a.context.situation,
                                                                a=text_b, b=text_a), max_new_tokens=8))
        unreadable += (first is None) + (second is None)
        pick_first = {0: "A", 1: "B"}.get(first)        # A was shown first
        pick_second = {0: "B", 1: "A"}.get(second)      # B was shown first
        outcomes.append(pick_first if pick_first is not None and pick_first == pick_second else "tie")
    return outcomes, unreadable


# -------------------------------------------------------------------------------------
# Aggregation: means with bootstrap CIs, per system and per slice
# -------------------------------------------------------------------------------------

OK, APPROXIMATED = "ok", "approximated"


def metric_status(judge, nli_given: bool) -> dict[str, str]:
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
    for m in REDUNDANCY_METRICS:
        status[m.key] = OK if nli_given or not m.key.startswith("nli_") else "skipped (no --nli-model)"
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
    """Which slices to report: valence (support), domain (meeting), profile (several profiles)."""
    fields = []
    if persona_set == "support" and any(r["valence"] for r in records):
        fields.append("valence")
    if persona_set == "meeting" and any(r["domain"] for r in records):
        fields.append("domain")
    if len({r["profile"] for r in records}) > 1:
        fields.append("profile")
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


# -------------------------------------------------------------------------------------
# Tables (markdown: printed, and written to RUN/eval/results.md)
# -------------------------------------------------------------------------------------

def format_cell(summary: dict, digits: int, n_rows: int) -> str:
    """'mean [lo, hi]', with '(n=k)' when only k of the row's n_rows conversations have a value
    (no agent turn, or no readable judge answer); or the reason there is no number."""
    if summary["status"] not in (OK, APPROXIMATED):
        return summary["status"]
    if summary["n"] == 0:
        return "n/a (no score)"
    d = digits
    cell = f"{summary['mean']:.{d}f} [{summary['lo']:.{d}f}, {summary['hi']:.{d}f}]"
    return cell if summary["n"] == n_rows else f"{cell} (n={summary['n']})"


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(":--" if i < 5 else "--:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def column_title(m: Metric, status: dict[str, str]) -> str:
    return m.title + ("*" if status[m.key] == APPROXIMATED else "")


def system_columns(entry: dict) -> list[str]:
    return [entry["speakers"], entry["director"], entry["judge"]]


def results_markdown(results: dict) -> str:
    """The whole report: protocol line, three metric tables, slice tables, pairwise, notes."""
    status = results["status"]
    systems = results["systems"]
    head = ["system", "speakers", "director", "judge", "n"]
    out = ["# Evaluation", "", results["protocol"]["summary"], ""]
    out += [f"- **{name}**: {e['about']}" for name, e in systems.items()] + [""]
    groups = [("Agent-specific (judge rubric, 0-100, mean over agent turns)", AGENT_METRICS),
              ("Collective (judge rubric, 0-100, whole conversation)", COLLECTIVE_METRICS),
              ("Redundancy over agent turns (automatic) and crisis events", REDUNDANCY_METRICS)]
    for title, metrics in groups:
        shown = [m for m in metrics if not status[m.key].startswith("skipped")]
        header = head + [column_title(m, status) for m in shown]
        if metrics is REDUNDANCY_METRICS:
            header.append("crisis events")
        rows = []
        for name, e in systems.items():
            row = [name] + system_columns(e) + [str(e["n"])]
            row += [format_cell(e["metrics"][m.key], m.digits, e["n"]) for m in shown]
            if metrics is REDUNDANCY_METRICS:
                row.append(str(e["crisis_events"]))
            rows.append(row)
        out += [f"## {title}", "", markdown_table(header, rows), ""]
    headline = [m for m in ALL_METRICS if m.key in HEADLINE and status[m.key] in (OK, APPROXIMATED)]
    for field in results["slice_fields"]:
        rows = []
        for name, e in systems.items():
            for value, sl in e["slices"][field].items():
                rows.append([name] + system_columns(e) + [value, str(sl["n"])]
                            + [format_cell(sl["metrics"][m.key], m.digits, sl["n"]) for m in headline])
        header = head[:4] + [field, "n"] + [column_title(m, status) for m in headline]
        out += [f"## Per {field}", "", markdown_table(header, rows), ""]
    out += ["## Pairwise preference", "", results["pairwise"]["line"], ""]
    out += ["## Notes", ""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(out) + "\n"


# The metrics the slice tables show (the full set per slice is in results.json).
HEADLINE = ("agent_overall", "collective_overall", "persona_consistency", "response_relevance",
            "self_bleu", "distinct_2", "semantic_redundancy", "nli_entailment")


def _json_safe(value):
    """NaN is not JSON: write null instead (an empty CI, a win rate with no decided pair)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


# -------------------------------------------------------------------------------------
# The run
# -------------------------------------------------------------------------------------

def choose_systems(spec: str, has_speakers: bool, has_director: bool,
                   speakers_dir: str, director_dir: str) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped} for those whose checkpoints are missing."""
    names = list(SYSTEM_NAMES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEM_NAMES]
    if not names or unknown:
        raise UserError(f"--systems {spec}: unknown system '{(unknown or [''])[0]}'; "
                        f"use 'all' or a comma-separated subset of {', '.join(SYSTEM_NAMES)}")
    chosen, skipped = [], {}
    for system in SYSTEMS:
        if system.name not in names:
            continue
        if system.speakers == "trained" and not has_speakers:
            skipped[system.name] = (f"no trained speakers at {speakers_dir} "
                                    "(run: python mascot.py train --stage 1, or pass --speakers)")
        elif system.order == "trained-director" and not has_director:
            skipped[system.name] = (f"no trained director at {director_dir} "
                                    "(run: python mascot.py train --stage 2, or pass --director)")
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


def result_notes(entries: dict, judge, status: dict[str, str], nli_given: bool, seed: int) -> list[str]:
    """The notes under the tables: what is approximated or missing, and how to read the numbers."""
    notes = []
    if judge.can_generate:
        convs = [r for e in entries.values() for r in e["conversations"]]
        asked = (sum(r["agent_turns"] for r in convs) * len(AGENT_METRICS)
                 + sum(r["agent_turns"] > 0 for r in convs) * len(COLLECTIVE_METRICS))
        bad = sum(sum(e["unparseable"].values()) for e in entries.values())
        notes.append(f"unparseable judge answers: {bad} of {asked}, left out of the means "
                     "(per system and metric in results.json)")
    else:
        approx = [m for m in RUBRIC_METRICS if status[m.key] == APPROXIMATED]
        notes.append(f"* approximated: the {judge.name.split(':')[0]} judge ({judge.name}) cannot read rubrics, so "
                     + "; ".join(f"{m.title} = {APPROXIMATIONS[m.key]}" for m in approx)
                     + ". Every other rubric metric is n/a: it needs an LLM judge "
                       "(--judge hf:<model or folder> or openai:<base url>).")
    silent = {n: sum(r["agent_turns"] == 0 for r in e["conversations"]) for n, e in entries.items()}
    if any(silent.values()):
        notes.append("conversations the crisis guard stopped before any agent spoke count in n and in "
                     "crisis events but have no agent-turn metrics: "
                     + ", ".join(f"{n} {k}" for n, k in silent.items()))
    if not nli_given:
        notes.append("NLI relation rates skipped: no --nli-model given (any MNLI-style classifier folder)")
    for name, e in entries.items():
        if "directives" in e:
            notes.append(f"{name}: {e['invalid_directives']} of {e['directives']} directives unparseable "
                         "(the least-spoken agent spoke instead)")
    notes.append("lower Self-BLEU, semantic redundancy (share of agent-turn pairs with cosine >= 0.8), "
                 "mean similarity and NLI entailment = less repetition; higher distinct-n = more varied wording")
    notes.append(f"[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples, seed {seed})")
    return notes


@dataclass
class Setup:
    """What every system of one evaluation shares: the conversations to have, the frozen models,
    the judge and the metric switches."""
    contexts: list               # conversation i's context ...
    profiles: list[str]          # ... and its simulated user's Big Five profile id
    base: tuple                  # (model, tokenizer): the simulated user of every system, base speakers
    trained_speakers: tuple | None
    trained_director: tuple | None
    fewshot: list[dict]
    encoder: object
    judge: object
    nli: tuple | None
    status: dict[str, str]       # metric key -> "ok" | "approximated" | why it has no number


def prepare(args, inputs, systems: list[System], out: Path, notes: list[str]) -> Setup:
    """The conversations every system gets (same contexts, profiles and seeds), and the models."""
    profile_ids = resolve_profiles(args.profiles, inputs.profiles)
    plan = plan_conversations(inputs.held_out, args.contexts, profile_ids)
    if args.contexts > len(inputs.held_out):
        notes.append(f"asked for {args.contexts} contexts, the held-out split has {len(inputs.held_out)}: "
                     "all are used")
    if len(plan) > min(args.contexts, len(inputs.held_out)):
        notes.append(f"{len(plan)} conversations (contexts cycle) so each of the {len(profile_ids)} "
                     "profiles gets the same number")
    encoder = MemoEncoder(models.SentenceEncoder(device=args.device))
    offline = args.judge.strip() == "offline"
    judge = make_judge(args.judge, cache_path=None if offline else out / "judge_cache.jsonl",
                       model_name=args.judge_model, **({"encoder": encoder} if offline else {}))
    nli = load_nli(args.nli_model, args.device) if args.nli_model else None
    need = {s.speakers for s in systems} | {s.order for s in systems} | {s.style for s in systems}
    return Setup(contexts=[c for c, _ in plan], profiles=[p for _, p in plan],
                 base=models.load_model(args.model, device=args.device),
                 trained_speakers=(models.load_model(speakers_folder(args), device=args.device)
                                   if "trained" in need else None),
                 trained_director=(models.load_model(director_folder(args), device=args.device)
                                   if "trained-director" in need else None),
                 fewshot=load_fewshot(args.set) if "fewshot-cot" in need else [],
                 encoder=encoder, judge=judge, nli=nli, status=metric_status(judge, nli is not None))


def run_system(system: System, setup: Setup, inputs, args) -> tuple[list, dict]:
    """Simulate one system's conversations (all advanced together) and score them."""
    t0 = time.time()
    speaker_model, speaker_tok = setup.trained_speakers if system.speakers == "trained" else setup.base
    cast = Cast(inputs.personas, speaker_model, speaker_tok, setup.base[0], setup.base[1], args.max_new_tokens,
                style=system.style, examples=setup.fewshot if system.style == "fewshot-cot" else [])
    if system.order == "round-robin":
        policy = RoundRobin(inputs.personas)
    elif system.order == "random":
        policy = RandomOrder(inputs.personas, args.seed)
    else:
        model, tok = setup.base if system.order == "prompted-director" else setup.trained_director
        policy = dr.LLMDirector(model, tok, inputs.personas, name=system.order)
    convs = run_conversations(setup.contexts, policy, cast, inputs.profiles, setup.profiles, args.turns,
                              args.user_every, args.seed)
    t1 = time.time()
    records, unparseable = score_conversations(convs, inputs.personas, setup.judge, setup.encoder, setup.nli)
    t2 = time.time()
    print(f"{system.name}: {len(convs)} conversations simulated in {t1 - t0:.1f} s, "
          f"scored in {t2 - t1:.1f} s", flush=True)
    where = speakers_folder(args) if system.speakers == "trained" else args.model
    entry = {"about": system.about, "speakers": f"{system.speakers}: {where}, {system.style} prompt",
             "director": {"round-robin": "round-robin", "random": "random order",
                          "prompted-director": f"prompted: {args.model}",
                          "trained-director": f"trained: {director_folder(args)}"}[system.order],
             "judge": setup.judge.name, "n": len(convs), "seconds_simulate": round(t1 - t0, 1),
             "seconds_metrics": round(t2 - t1, 1), "metrics": aggregate(records, setup.status, args.seed),
             "unparseable": dict(unparseable),
             "crisis_events": sum(r["crisis_events"] for r in records),
             "crisis_conversations": sum(r["crisis_events"] > 0 for r in records),
             "conversations": records}
    if isinstance(policy, dr.LLMDirector):
        entry["invalid_directives"], entry["directives"] = policy.invalid, policy.total
    return convs, entry


def speakers_folder(args) -> str:
    return args.speakers or str(Path(args.run) / "stage1" / "speakers")


def director_folder(args) -> str:
    return args.director or str(Path(args.run) / "stage2" / "director")


def run(args, inputs) -> dict:
    """`python mascot.py evaluate`: run the systems, score them, print and write the tables.

    `inputs` is mascot.Inputs (personas, held-out contexts, profiles). Writes
    RUN/eval/{transcripts.jsonl, results.json, results.md} and returns the results dict.
    """
    t_start = time.time()
    out = Path(args.run) / "eval"
    notes = []
    has_speakers = args.speakers is not None or (Path(speakers_folder(args)) / "config.json").exists()
    has_director = args.director is not None or (Path(director_folder(args)) / "config.json").exists()
    systems, skipped = choose_systems(args.systems, has_speakers, has_director,
                                      speakers_folder(args), director_folder(args))
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", flush=True)
        notes.append(f"skipped **{name}**: {why}")
    if not systems:
        raise UserError(f"--systems {args.systems}: none of these systems can run; "
                        + "; ".join(f"{n}: {w}" for n, w in skipped.items()))
    setup = prepare(args, inputs, systems, out, notes)

    entries, convs_by_system = {}, {}
    for system in systems:
        convs_by_system[system.name], entries[system.name] = run_system(system, setup, inputs, args)
    data.write_jsonl(out / "transcripts.jsonl", [{"system": name, "index": i, **c.to_json()}
                                                 for name, convs in convs_by_system.items()
                                                 for i, c in enumerate(convs)])
    fields = slice_fields(args.set, entries[systems[0].name]["conversations"])
    for entry in entries.values():
        entry["slices"] = slices(entry["conversations"], fields, setup.status, args.seed)
    pairwise = run_pairwise(args.pairwise, convs_by_system, entries, setup.judge, inputs.personas)

    notes += result_notes(entries, setup.judge, setup.status, setup.nli is not None, args.seed)
    total = time.time() - t_start
    spent = {k: sum(e[f"seconds_{k}"] for e in entries.values()) for k in ("simulate", "metrics")}
    notes.append(f"time: {total:.0f} s in all ({spent['simulate']:.0f} s simulating, {spent['metrics']:.0f} s "
                 f"scoring, the rest loading models and judging pairs) on {args.device}")
    summary = (f"{len(setup.contexts)} conversations per system on {len({c.id for c in setup.contexts})} held-out "
               f"'{args.set}' contexts from `{args.data}` (seed {args.seed}, held-out fraction {args.held_out}); "
               f"simulated user: {args.model} with profile(s) {', '.join(dict.fromkeys(setup.profiles))}; "
               f"{args.turns} agent turns, user every {args.user_every}; every system sees the same contexts, "
               "profiles and sampling seeds.")
    results = {"protocol": {"summary": summary, "contexts": [c.id for c in setup.contexts],
                            "profiles": setup.profiles, "turns": args.turns, "user_every": args.user_every,
                            "seed": args.seed, "model": args.model, "data": args.data, "set": args.set},
               "judge": setup.judge.name, "status": setup.status,
               "approximations": {k: APPROXIMATIONS[k] for k, v in setup.status.items() if v == APPROXIMATED},
               "systems": entries, "skipped": skipped, "slice_fields": fields, "pairwise": pairwise,
               "notes": notes, "seconds": round(total, 1)}
    text = results_markdown(results)
    data.write_text_atomic(out / "results.md", text)
    data.write_json(out / "results.json", _json_safe(results))
    print(text, flush=True)
    print(f"wrote {out / 'results.md'}, {out / 'results.json'} and {out / 'transcripts.jsonl'}", flush=True)
    return results


def run_pairwise(spec: str | None, convs_by_system: dict, entries: dict, judge, personas) -> dict:
    """Pairwise preference of system A over system B (--pairwise A,B; default mascot,round-robin)."""
    if spec:
        names = [s.strip() for s in spec.split(",")]
        if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
            raise UserError(f"--pairwise {spec}: give two different systems as A,B, from "
                            + ", ".join(SYSTEM_NAMES))
    else:
        names = ["mascot", "round-robin"]
    a, b = names
    missing = [n for n in names if n not in convs_by_system]
    if missing:
        return {"a": a, "b": b, "line": f"pairwise {a} vs {b}: not run ({', '.join(missing)} did not run)"}
    scores = {n: [r.get("judge_score") for r in entries[n]["conversations"]] for n in names}
    outcomes, unreadable = pairwise_outcomes(convs_by_system[a], convs_by_system[b], judge, personas,
                                             scores[a], scores[b])
    stats = win_rate(outcomes)
    how = ("asked in both presentation orders, a win only when both agree" if judge.can_generate
           else "the conversation whose agent turns have the higher mean judge score wins; order plays no part")
    rate = "n/a, every pair tied" if math.isnan(stats["win_rate"]) else f"{stats['win_rate']:.3f}"
    line = (f"**{a} vs {b}**, {len(outcomes)} conversation pairs: {a} wins {stats['wins']}, loses "
            f"{stats['losses']}, ties {stats['ties']}; win rate {rate} (ties left out); exact two-sided "
            f"binomial p = {stats['p_value']:.4g}. Judge {judge.name}: {how}.")
    if unreadable:
        line += f" {unreadable} unreadable judge answers made ties."
    return {"a": a, "b": b, "outcomes": outcomes, **stats, "unreadable": unreadable, "line": line}
