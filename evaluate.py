"""evaluate.py: does the trained group talk better than the alternatives? Every number of the table.

Last in the pipeline (arXiv 2601.14230): several systems hold conversations on the same held-out
contexts with the same simulated users and seeds; every conversation is scored; the tables show
means with 95% bootstrap intervals per system and slice, and paired changes against round-robin.
The formulas are metrics.py's; this file decides what is measured on what, and by whom.

Systems: the paper's prompting baselines (zero-shot, zero-shot CoT, few-shot, few-shot CoT), SFT,
its multi-call baselines (self-consistency, MultiAgentESC: extras/baselines.py), our round-robin
and prompted-director reference points, the ablations MASCOT-P (no persona alignment: base
speakers) and MASCOT-C (no director: random speaking order) and MASCOT. All get the same persona
cards, simulated user, contexts, Big Five profiles and seeds, so a difference is the system's.

Who measures what (results.md names every evaluator and whether training used it): judge rubrics
(0-100; Overall = the mean of the criteria, as the paper) need an LLM judge, and the offline judge
approximates two of them; persona identification by the FROZEN base model, which no stage trains
on; redundancy (Self-BLEU, distinct-n, embedding similarity, NLI rates); the reward-hack rates and
crisis stops, so that hacking shows as numbers. Simplified: our own rubrics (data/rubrics.json) on
a 1-5 scale; agent criteria judged per agent turn; Self-BLEU at Texygen's BLEU-4; the human studies
are extras/human.py.

    python mascot.py evaluate [--systems round-robin,mascot] [--profiles all --contexts 50]
"""

from __future__ import annotations

import math
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import data
import grpo
import models
from data import Persona, PersonaSet, UserError, option
from metrics import (NLI_RELATIONS, bootstrap_ci, distinct_n, mean_or_none, mean_pairwise_similarity, nli_rates,
                     parse_rubric_score, rates, rescale_0_100, self_bleu, semantic_redundancy_rate, win_rate)
from director import LLMDirector
from simulate import (EXAMPLE_STYLES, SAFETY, USER, Cast, RandomOrder, RoundRobin, diagnose_reply, judge_state,
                      role_setting, run_conversations)


@dataclass
class EvalConfig:
    """The evaluation's settings; each is also an `evaluate` flag."""
    systems: str = option("all", "comma-separated systems (SYSTEMS) or 'all': every system whose models exist")
    contexts: int = option(8, "held-out contexts, each crossed with every profile", "positive")
    profiles: str = option("average", "simulated-user profile ids (comma-separated), or 'all': the paper's ten "
                                      "one-trait Big Five profiles")
    role_setting: str = option("full", "what every system's speaker prompt shows of a persona: the full card, or "
                                       "name and role only (an ablation)", ["full", "name"])
    persona_id: bool = option(True, "score persona identification with the frozen base model (4 passes per turn)")
    nli_model: str = option("", "folder or hub id of an MNLI-style classifier for the NLI rates; none: skipped")
    pairwise: str = option("mascot,round-robin", "A,B: who wins conversation by conversation")
    pairwise_by: str = option("persona-id", "what decides the pairwise preference", ["persona-id", "judge"])
    sc_samples: int = option(5, "self-consistency: zero-shot-CoT samples per turn", "at-least-2")
    sc_pick: str = option("majority", "self-consistency: the sample the others agree with most, or the judge's "
                                      "best", ["majority", "judge"])


@dataclass(frozen=True)
class System:
    name: str
    speakers: str     # "base" (--model) | "trained" (stage 1's) | "sft"
    order: str        # "round-robin" | "random" | "prompted-director" | "trained-director"
    style: str        # simulate.STYLES
    about: str
    pipeline: str = ""   # "" (one call per turn) | "self-consistency" | "multiagentesc" (extras/baselines.py)


SYSTEMS = (
    System("zero-shot", "base", "round-robin", "zero-shot", "base model; its card and a plain request for a short reply"),
    System("zero-shot-cot", "base", "round-robin", "zero-shot-cot", "base model; one sentence of thinking, then the reply"),
    System("few-shot", "base", "round-robin", "few-shot", "base model; the card + worked examples (data/fewshot.json)"),
    System("few-shot-cot", "base", "round-robin", "few-shot-cot", "base model; the examples with their thinking"),
    System("self-consistency", "base", "round-robin", "zero-shot-cot", "base model; k zero-shot-CoT samples per "
           "turn, the one the others agree with most kept", "self-consistency"),
    System("sft", "sft", "round-robin", "persona", "the base model fine-tuned on ESConv supporter turns mapped to "
           "personas by strategy (python mascot.py sft)"),
    System("multiagentesc", "base", "round-robin", "persona", "base model; analysis -> strategy proposals -> one "
           "reply per strategy -> vote -> refine", "multiagentesc"),
    System("round-robin", "base", "round-robin", "persona", "base speakers, MASCOT's prompt, fixed roster order: "
           "where MASCOT starts from"),
    System("prompted-director", "base", "prompted-director", "persona", "the untrained LLM director + base speakers"),
    System("mascot-p", "base", "trained-director", "persona", "trained director + base speakers (ablation: no "
           "persona alignment)"),
    System("mascot-c", "trained", "random", "persona", "trained speakers in random order (ablation: no director)"),
    System("mascot", "trained", "trained-director", "persona", "trained director + trained speakers"),
)
SYSTEM_NAMES, REFERENCE = tuple(s.name for s in SYSTEMS), "round-robin"


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    group: str           # the table it is shown in
    digits: int = 3
    better: int = 0      # +1 higher is better, -1 lower is better, 0 neither (the paired-change table)


def rubric_criteria() -> dict[str, list[dict]]:
    return {kind: data.asset("rubrics.json")[kind] for kind in ("agent", "collective")}


def all_metrics() -> list[Metric]:
    """Every column, in table order."""
    crit = rubric_criteria()
    out = [Metric(m["key"], m["title"], "Agent-specific (judge rubric, 0-100)", 1) for m in crit["agent"]]
    out += [Metric("agent_overall", "agent overall", "Agent-specific (judge rubric, 0-100)", 1)]
    out += [Metric(m["key"], m["title"], "Collective (judge rubric, 0-100)", 1) for m in crit["collective"]]
    out += [Metric("collective_overall", "collective overall", "Collective (judge rubric, 0-100)", 1)]
    ind = "Persona identification by the frozen base model (independent of training)"
    out += [Metric("persona_id", "persona ID", ind, better=1), Metric("persona_log_ratio", "log-ratio", ind, better=1),
            Metric("persona_id_32", f"persona ID, first {EQUAL_TOKENS} tokens", ind, better=1)]
    red = "Redundancy over agent turns"
    out += [Metric("self_bleu", "Self-BLEU", red, better=-1), Metric("distinct_1", "distinct-1", red),
            Metric("distinct_2", "distinct-2", red), Metric("semantic_redundancy", "semantic redundancy", red, better=-1),
            Metric("mean_similarity", "mean similarity", red)]
    out += [Metric(f"nli_{r}", f"NLI {r}", red) for r in NLI_RELATIONS]
    hk = "Reward-hack rates over agent turns, and crisis-guard stops"
    out += [Metric(k, k.replace("_", " "), hk, better=-1) for k in
            ("context_copy", "persona_copy", "history_echo", "self_repeat", "meta_leak", "trivial")]
    return out + [Metric("words", "words", hk, 1), Metric("crisis_stop", "crisis stops", hk, better=-1)]


# --- The independent evaluator: which persona does the frozen base model think wrote this turn? --
# For an agent turn y of persona s after conversation c and every persona k of the set,
#     lp_k = log p_base(y | card_k, c)    (the frozen --model, teacher-forced)
#   persona ID   = 1 if argmax_k lp_k == s (chance 1 / #personas)
#   log-ratio    = (lp_s - log mean_{k != s} exp lp_k) / tokens(y): the log Bayes factor "own card vs
#                  the others" per token; fluency and length cancel out of it
#   persona ID, first 32 tokens: from the first EQUAL_TOKENS tokens only, so longer turns cannot
#                  gain by length (the summed log-probs grow with it)
# Independent of training: it is not the reward, not the judge that labelled the pairs, and reads
# no embedding; the one link is stage 1's KL term, which anchors the speakers to this model under
# their OWN card only. Persona names in the turn are masked, so a speaker cannot win by signing
# its turns; its blind spot, a reply that recites its own card, is what persona_copy counts.

ID_TURNS, EQUAL_TOKENS, NEUTRAL_NAME = 2, 32, "Alex"


class PersonaIdentifier:
    def __init__(self, model, tok, personas: PersonaSet):
        self.model, self.tok, self.personas = model, tok, personas

    def prompt_ids(self, p: Persona, situation: str, history: list[tuple[str, str]]) -> list[int]:
        card = f"You are {p.name}, the {p.role}. {p.description} Style: {p.style}"   # no example lines: copyable
        lines = "\n".join(f"{who}: {text}" for who, text in history[-ID_TURNS:])
        task = f"Situation: {situation}\n\nConversation so far:\n{lines}\n\nWrite {p.name}'s next message."
        return models.chat_prompt_ids(self.tok, [[{"role": "system", "content": card}, {"role": "user", "content": task}]])[0]

    @torch.no_grad()
    def score(self, items: list[tuple[str, str, list, str]]) -> list[dict]:
        """items: (speaker, situation, history [(speaker, text)], reply) -> {"id", "log_ratio",
        "id_32", "tokens"}; None values for a speaker outside the set."""
        names, cards = self.personas.names(), self.personas.personas
        masked = [re.sub(r"(?<!\w)(" + "|".join(map(re.escape, names)) + r")(?!\w)", NEUTRAL_NAME, r.strip())
                  for _, _, _, r in items]
        replies = [self.tok(m, add_special_tokens=False)["input_ids"] or [self.tok.eos_token_id] for m in masked]
        rows = sorted(((i, k, self.prompt_ids(c, it[1], it[2])) for i, it in enumerate(items) for k, c in enumerate(cards)),
                      key=lambda r: (len(r[2]), r[2]))             # similar lengths batch with little padding
        lp = [[0.0] * len(cards) for _ in items]
        first = [[0.0] * len(cards) for _ in items]
        for start in range(0, len(rows), 16):
            batch = rows[start:start + 16]
            logps, mask = grpo.target_logprobs(self.model, self.tok.pad_token_id, [(p, replies[i]) for i, _, p in batch])
            per_token = logps * mask                                             # (B, C) column t = token t
            for (i, k, _), s, f in zip(batch, per_token.sum(1).tolist(), per_token[:, :EQUAL_TOKENS].sum(1).tolist()):
                lp[i][k], first[i][k] = s, f
        out = []
        for (speaker, _, _, _), own, head, ids in zip(items, lp, first, replies):
            if speaker not in names or len(names) < 2:
                out.append({"id": None, "log_ratio": None, "id_32": None, "tokens": 0})
                continue
            s = names.index(speaker)
            others = [v for k, v in enumerate(own) if k != s]
            log_mean = max(others) + math.log(sum(math.exp(v - max(others)) for v in others) / len(others))
            best = lambda v: max(range(len(v)), key=v.__getitem__)       # noqa: E731
            out.append({"id": float(best(own) == s), "log_ratio": (own[s] - log_mean) / len(ids),
                        "id_32": float(best(head) == s) if len(ids) >= EQUAL_TOKENS else None, "tokens": len(ids)})
        return out


# --- Scoring conversations ------------------------------------------------------------------------

def transcript(turns) -> str:
    return "\n".join(f"{t.speaker}: {t.text}" for t in turns)


def rubric_scores(conv, personas: PersonaSet, judge, unreadable: dict) -> dict:
    """Every rubric metric of one conversation from an LLM judge, 0-100 (greedy, as the paper's
    temperature 0): one prompt per (agent turn, criterion) averaged over the turns, one per
    (conversation, criterion); Overall = the mean of the criteria. An unreadable answer is counted
    in `unreadable` and left out; a metric with no readable answer is None."""
    agent_idx = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    crit, asks = rubric_criteria(), []
    for m in crit["agent"]:
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            asks.append((m["key"], data.prompt("eval_agent").format(
                name=p.name, role=p.role, description=p.description, situation=conv.context.situation,
                history=transcript(conv.turns[:i]), reply=conv.turns[i].text, title=m["title"], rubric=m["rubric"])))
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for m in crit["collective"] if agent_idx else []:     # none when the guard stopped it before anyone spoke
        asks.append((m["key"], data.prompt("eval_collective").format(roster=roster, situation=conv.context.situation,
                                                                     transcript=transcript(conv.turns), title=m["title"],
                                                                     rubric=m["rubric"])))
    scores = {m["key"]: [] for kind in crit.values() for m in kind}
    for (key, _), answer in zip(asks, judge.complete_many([a for _, a in asks], 32) if asks else []):
        score = parse_rubric_score(answer)
        if score is None:
            unreadable[key] = unreadable.get(key, 0) + 1
        else:
            scores[key].append(rescale_0_100(score, 1, 5))
    values = {k: mean_or_none(v) for k, v in scores.items()}
    for kind in crit:
        parts = [values[m["key"]] for m in crit[kind]]
        values[f"{kind}_overall"] = None if None in parts else sum(parts) / len(parts)
    return values


def score_conversations(convs, personas: PersonaSet, judge, encoder, nli=None, identifier=None) -> tuple[list, dict]:
    """One record per conversation (what it was, its metrics), and the unreadable judge answers.
    `personas` are the full cards: the hack rates and the evaluator need them even when the
    speakers saw names only. A conversation without agent turns has None metrics (not "no repetition")."""
    records, unreadable = [], {}
    for i, c in enumerate(convs):
        agent = [(k, t) for k, t in enumerate(c.turns) if t.speaker not in (USER, SAFETY)]
        m = {"crisis_stop": float(bool(c.events))}
        texts = [t.text for _, t in agent]
        if judge.can_generate:
            m.update(rubric_scores(c, personas, judge, unreadable))
        elif agent:
            states = [judge_state(personas.find(t.speaker), c.turns[:k], c.context.situation) for k, t in agent]
            scores = judge.score_many(states, texts)
            m["judge_score"] = sum(scores) / len(scores)
            m["persona_consistency"] = 100 * m["judge_score"]
            if hasattr(judge, "features_many"):
                m["response_relevance"] = 100 * mean_or_none([max(0.0, f["context"]) for f in judge.features_many(states, texts)])
        if agent:
            emb = encoder.embed(texts)                                           # (turns, D)
            m.update(self_bleu=self_bleu(texts), distinct_1=distinct_n(texts, 1), distinct_2=distinct_n(texts, 2),
                     semantic_redundancy=semantic_redundancy_rate(emb), mean_similarity=mean_pairwise_similarity(emb))
            if nli is not None:
                m.update({f"nli_{r}": v for r, v in (nli_rates(texts, *nli) or dict.fromkeys(NLI_RELATIONS)).items()})
            m.update(rates([diagnose_reply(personas.find(t.speaker), c.turns[:k], c.context.situation, t.text,
                                           personas.names()) for k, t in agent if personas.find(t.speaker)]))
            if identifier is not None:
                ids = identifier.score([(t.speaker, c.context.situation, [(u.speaker, u.text) for u in c.turns[:k]],
                                         t.text) for k, t in agent])
                m.update(persona_id=mean_or_none([r["id"] for r in ids]),
                         persona_log_ratio=mean_or_none([r["log_ratio"] for r in ids]),
                         persona_id_32=mean_or_none([r["id_32"] for r in ids]))
        records.append({"index": i, "context_id": c.context.id, "profile": c.profile, "valence": c.context.valence,
                        "domain": c.context.domain, "agent_turns": len(agent), "metrics": m})
    return records, unreadable


def summarise(values: list, seed: int) -> dict:
    """Mean and 95% bootstrap interval of the values that are there (None is no score, not 0)."""
    kept = [v for v in values if v is not None]
    mean, lo, hi = bootstrap_ci(kept, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(kept)}


def aggregate(records: list[dict], keys: list[str], seed: int) -> dict:
    return {k: summarise([r["metrics"].get(k) for r in records], seed) for k in keys}


def paired_changes(entries: dict, keys: list[str], seed: int) -> dict:
    """System minus the reference, conversation by conversation (same context, profile and seeds),
    with a 95% bootstrap interval over the paired differences."""
    base = entries.get(REFERENCE, {}).get("conversations")
    return {name: {k: summarise([a["metrics"][k] - b["metrics"][k] for a, b in zip(e["conversations"], base)
                                 if a["metrics"].get(k) is not None and b["metrics"].get(k) is not None], seed)
                   for k in keys} for name, e in entries.items() if base and name != REFERENCE}


# --- Running the systems -----------------------------------------------------------------------------

def choose_systems(spec: str, folders: dict[str, str]) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped}: a system whose model folder is missing is
    skipped with the command that makes it; nothing stands in for it."""
    names = list(SYSTEM_NAMES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in SYSTEM_NAMES]
    if not names or unknown:
        raise UserError(f"--systems {spec}: unknown system '{(unknown or [''])[0]}'; use 'all' or some of "
                        + ", ".join(SYSTEM_NAMES))
    make = {"trained": "python mascot.py train --stage 1", "trained-director": "python mascot.py train --stage 2",
            "sft": "python mascot.py sft --data <an ESConv file>"}
    chosen, skipped = [], {}
    for s in (s for s in SYSTEMS if s.name in names):
        missing = [k for k in (s.speakers, s.order) if k in make and not models.trained_or(folders[k], "")
                   and not folders[k].startswith("openai:")]
        if missing:
            skipped[s.name] = f"no model at {folders[missing[0]]}; make it with: {make[missing[0]]}"
        else:
            chosen.append(s)
    return chosen, skipped


def profile_ids(spec: str, profiles: dict) -> list[str]:
    """'all' -> the profiles with one trait set high or low (the paper's ten); 'a,b' -> those, checked."""
    if spec.strip() == "all":
        return [pid for pid, p in profiles.items() if p.trait() not in ("average", "mixed")] or list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    if not ids or any(p not in profiles for p in ids):
        raise UserError(f"--profiles {spec}: use 'all' or ids from the profiles file: {', '.join(profiles)}")
    return ids


@dataclass
class Setup:
    """What every system of one evaluation shares."""
    contexts: list               # conversation i's context ...
    profiles: list[str]          # ... and its simulated user's profile
    roles: dict                  # "base" | "trained" | "sft" | "trained-director" | "user" -> (model, tok)
    fewshot: list
    encoder: object
    judge: object
    nli: tuple | None
    identifier: object
    guard: object                # the crisis guard (extras/safety.py), or None
    pipelines: dict              # pipeline name -> speak(convs, directives, cast) (extras/baselines.py)


def run_system(system: System, setup: Setup, inputs, cfg: EvalConfig, max_new_tokens: int, turns: int,
               user_every: int, seed: int, keys: list[str]) -> tuple[list, dict]:
    """Simulate one system's conversations (all advanced together) and score them."""
    t0 = time.time()
    (sm, st), (um, ut) = setup.roles[system.speakers], setup.roles["user"]
    cast = Cast(role_setting(inputs.personas, cfg.role_setting), sm, st, um, ut, max_new_tokens, style=system.style,
                examples=setup.fewshot if system.style in EXAMPLE_STYLES else [], guard=setup.guard)
    policy = {"round-robin": lambda: RoundRobin(inputs.personas), "random": lambda: RandomOrder(inputs.personas, seed),
              "prompted-director": lambda: LLMDirector(*setup.roles["base"], inputs.personas, "prompted-director"),
              "trained-director": lambda: LLMDirector(*setup.roles["trained-director"], inputs.personas)}[system.order]()
    speak = setup.pipelines[system.pipeline](system) if system.pipeline else None
    convs = run_conversations(setup.contexts, policy, cast, inputs.profiles, setup.profiles, turns, user_every, seed,
                              **({"speak": speak} if speak else {}))
    t1 = time.time()
    records, unreadable = score_conversations(convs, inputs.personas, setup.judge, setup.encoder, setup.nli, setup.identifier)
    for r in records:
        r["trait"] = inputs.profiles[r["profile"]].trait()
    print(f"{system.name}: {len(convs)} conversations simulated in {t1 - t0:.0f} s, scored in {time.time() - t1:.0f} s",
          flush=True)
    entry = {"about": system.about, "speakers": f"{system.speakers}, {system.style} prompt", "order": system.order,
             "n": len(convs), "metrics": aggregate(records, keys, seed), "unreadable": unreadable,
             "crisis_flags": [{"context_id": c.context.id, **e} for c in convs for e in c.events],
             "directives": [getattr(policy, "invalid", 0), getattr(policy, "total", 0)], "conversations": records}
    return convs, entry


def run(cfg: EvalConfig, setup: Setup, inputs, out: Path, systems: list[System], skipped: dict, protocol: dict,
        max_new_tokens: int, turns: int, user_every: int, seed: int) -> dict:
    """Run every system, score, write RUN/eval/{transcripts.jsonl, results.json, results.md}. Each
    finished system is saved at once (RUN/eval/partial/), so the same command after an interruption
    redoes only the unfinished ones (`protocol` holds everything their numbers depend on)."""
    keys = [m.key for m in all_metrics()] + ["judge_score"]
    entries, rows = {}, []
    for system in systems:
        part = out / "partial" / f"{system.name}.json"
        saved = data.read_json(part) if part.is_file() else {}
        if saved.get("protocol") == protocol:
            entries[system.name], sys_rows = saved["entry"], saved["rows"]
            print(f"{system.name}: kept from the interrupted evaluation ({part})", flush=True)
        else:
            convs, entries[system.name] = run_system(system, setup, inputs, cfg, max_new_tokens, turns, user_every, seed, keys)
            sys_rows = [{"system": system.name, **c.to_json()} for c in convs]
            data.write_json(part, json_safe({"protocol": protocol, "entry": entries[system.name], "rows": sys_rows}))
        rows += sys_rows
    for e in entries.values():
        e["slices"] = {f: {v: {"n": len(g), "metrics": aggregate(g, keys, seed)} for v in sorted({r[f] or "-" for r in e["conversations"]})
                           for g in [[r for r in e["conversations"] if (r[f] or "-") == v]]}
                       for f in slice_fields(e["conversations"])}
    results = {"protocol": protocol, "judge": setup.judge.name, "systems": entries, "skipped": skipped,
               "changes": paired_changes(entries, [m.key for m in all_metrics() if m.better], seed),
               "pairwise": pairwise(cfg, entries)}
    data.write_jsonl(out / "transcripts.jsonl", rows)
    data.write_json(out / "results.json", json_safe(results))
    data.write_text_atomic(out / "results.md", results_markdown(results))
    shutil.rmtree(out / "partial", ignore_errors=True)
    return results


def slice_fields(records: list[dict]) -> list[str]:
    """The paper's slices that vary here: ED valence, QMSum domain, the profile and its Big Five trait."""
    return [f for f in ("valence", "domain", "profile", "trait") if len({r[f] for r in records}) > 1]


def pairwise(cfg: EvalConfig, entries: dict) -> dict:
    """A vs B per conversation (same context, profile and seeds): the higher persona log-ratio wins
    (the independent evaluator), or with --pairwise-by judge the higher judge score (the rubric
    overall for an LLM judge); None or equal is a tie. An exact sign test over the decided pairs."""
    names = [s.strip() for s in cfg.pairwise.split(",")]
    if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
        raise UserError(f"--pairwise {cfg.pairwise}: give two different systems as A,B from " + ", ".join(SYSTEM_NAMES))
    if any(n not in entries for n in names):
        return {"line": f"pairwise {' vs '.join(names)}: not run (both systems must be evaluated)"}
    key = "persona_log_ratio" if cfg.pairwise_by == "persona-id" else "judge_score"
    get = lambda r: r["metrics"].get(key, r["metrics"].get("agent_overall"))    # noqa: E731
    outcomes = ["tie" if get(a) is None or get(b) is None or get(a) == get(b) else "A" if get(a) > get(b) else "B"
                for a, b in zip(entries[names[0]]["conversations"], entries[names[1]]["conversations"])]
    s = win_rate(outcomes)
    rate = "-" if s["win_rate"] is None else f"{s['win_rate']:.3f}"
    return {**s, "line": f"{names[0]} vs {names[1]} over {len(outcomes)} conversation pairs, decided by "
                         f"{'the independent evaluator (persona log-ratio)' if key != 'judge_score' else 'the judge'}: "
                         f"wins {s['wins']}, losses {s['losses']}, ties {s['ties']}; win rate {rate} (ties left out); "
                         f"exact two-sided sign test p = {s['p_value']:.3g}"}


def json_safe(value):
    """NaN is not JSON: null instead."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return [json_safe(v) for v in value] if isinstance(value, (list, tuple)) else value


# --- results.md ------------------------------------------------------------------------------------

def cell(s: dict | None, digits: int) -> str:
    """'mean [lo, hi]'; '-' without a score; no interval for one value (n = 1 has no spread)."""
    if not s or s["mean"] is None:
        return "-"
    return f"{s['mean']:.{digits}f}" + (f" [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]" if s["lo"] is not None else " (n=1)")


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("--" for _ in header) + "|"] + \
           ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows] + [""]


def results_markdown(r: dict) -> str:
    """Protocol, systems, one table per metric group (columns without a number left out), paired
    changes against round-robin ('!' = worse beyond the interval), slices, pairwise, notes."""
    metrics, systems = all_metrics(), r["systems"]
    out = ["# Evaluation", "", r["protocol"]["summary"], ""] + [f"- **{n}**: {e['about']}" for n, e in systems.items()]
    out += [f"- skipped **{n}**: {why}" for n, why in r["skipped"].items()] + [""]
    for group in dict.fromkeys(m.group for m in metrics):
        cols = [m for m in metrics if m.group == group and any(e["metrics"][m.key]["n"] for e in systems.values())]
        if cols:
            out += [f"## {group}", ""] + table(["system", "n"] + [m.title for m in cols],
                                               [[n, e["n"]] + [cell(e["metrics"][m.key], m.digits) for m in cols]
                                                for n, e in systems.items()])
    cols = [m for m in metrics if any(r["changes"].get(n, {}).get(m.key, {}).get("n") for n in systems)]
    if cols:
        def change(s, m):
            worse = s["lo"] is not None and (m.better * s["hi"] < 0 if m.better > 0 else m.better * s["lo"] < 0)
            return "-" if s["mean"] is None else f"{s['mean']:+.3f}" + (
                f" [{s['lo']:+.3f}, {s['hi']:+.3f}]" if s["lo"] is not None else "") + (" !" if worse else "")
        out += [f"## Paired change against {REFERENCE} (same contexts, profiles and seeds)", ""] + table(
            ["system"] + [f"Δ {m.title}" for m in cols], [[n] + [change(c[m.key], m) for m in cols] for n, c in r["changes"].items()])
    head = [m for m in metrics if m.key in HEADLINE and any(e["metrics"][m.key]["n"] for e in systems.values())]
    for field in dict.fromkeys(f for e in systems.values() for f in e["slices"]):
        out += [f"## Per {field}", ""] + table(["system", field, "n"] + [m.title for m in head],
                                               [[n, v, s["n"]] + [cell(s["metrics"][m.key], m.digits) for m in head]
                                                for n, e in systems.items() for v, s in e["slices"].get(field, {}).items()])
    flags = [f for e in systems.values() for f in e["crisis_flags"]]
    out += ["## Pairwise preference", "", r["pairwise"]["line"], "", "## Notes", ""] + [f"- {n}" for n in notes(r, flags)]
    return "\n".join(out) + "\n"


HEADLINE = ("agent_overall", "collective_overall", "persona_consistency", "persona_id", "persona_id_32",
            "self_bleu", "distinct_2", "context_copy", "persona_copy", "history_echo")


def notes(r: dict, flags: list[dict]) -> list[str]:
    """How to read the tables, and who measured each column."""
    judge, systems = r["judge"], r["systems"]
    out = [f"[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples); '-' = no score "
           f"(n/a for this judge, no agent turn, or fewer than two turns for a redundancy metric); '(n=1)': one "
           f"value, no interval. Judge: {judge}."]
    if judge.startswith("offline"):
        out.append("the offline judge cannot read rubrics: persona consistency = 100 x its mean score of the agent "
                   "turns; response relevance = 100 x the mean cosine of a turn with the user's latest message; "
                   "every other rubric column needs an LLM judge (--judge hf:<model> or openai:<url>)")
    bad = {n: sum(e["unreadable"].values()) for n, e in systems.items() if e["unreadable"]}
    if bad:
        out.append("unreadable rubric answers, left out of the means: " + ", ".join(f"{n} {k}" for n, k in bad.items()))
    out.append("who measured what: the rubric columns are the judge's, and a judge that labelled stage 1's pairs "
               "(its --judge) or scored stage 2's coherence is not independent of training; persona identification is "
               "the frozen base model's, which no stage optimises (stage 1's KL term anchors the speakers to it under "
               "their own card only); redundancy is n-gram counts and the MiniLM encoder (which also feeds the offline "
               "judge and stage 2's non-redundancy term); the hack rates are metrics.py's lexical rules, which are NOT "
               "independent of training: stage 1's reward model learns to reject synthetic hacks, the offline judge "
               "penalises them, and stage 2's reward has a clean term")
    out += [f"{n}: {e['directives'][0]} of {e['directives'][1]} directives unparseable (the least-spoken agent spoke)"
            for n, e in systems.items() if e["directives"][1]]
    out += [f"crisis guard stopped {f['context_id']} at turn {f['turn']} ({f['category']}): {f['text'][:120]!r}"
            for f in {(f["context_id"], f["turn"]): f for f in flags}.values()]
    return out


def verdict(r: dict) -> list[str]:
    """A short summary for a terminal: a few columns, groups with n >= 2 only, and one plain line
    saying whether any change against round-robin lies beyond its 95% interval."""
    cols = [m for m in all_metrics() if m.key in ("persona_id", "persona_consistency", "self_bleu", "context_copy")]
    lines = ["system          n   " + "  ".join(f"{m.title:>22}" for m in cols)]
    for n, e in r["systems"].items():
        if e["n"] >= 2:
            lines.append(f"{n:<15} {e['n']:>2}   " + "  ".join(f"{cell(e['metrics'][m.key], 3):>22}" for m in cols))
    beyond = [f"{n} {m.key} {c[m.key]['mean']:+.3f}" for n, c in r["changes"].items() for m in all_metrics()
              if m.better and c[m.key]["lo"] is not None and (c[m.key]["lo"] > 0 or c[m.key]["hi"] < 0)]
    lines.append("verdict: " + ("changes beyond the 95% interval against round-robin: " + "; ".join(beyond) if beyond
                                else "no change against round-robin is beyond its 95% interval at this size: "
                                     "what differs here is noise"))
    return lines
