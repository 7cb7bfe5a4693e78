"""evaluate.py: does the trained group talk better than the alternatives? Every number of the table.

Last in the pipeline (arXiv 2601.14230): several systems hold conversations on the same held-out
contexts with the same simulated users and seeds; every conversation is scored; the tables show
means with 95% bootstrap intervals per system and slice, and paired changes against round-robin.
The formulas are metrics.py's; this file decides what is measured on what, and by whom.

Systems (SYSTEMS): the paper's baselines, our reference points, the ablations MASCOT-P (base speakers)
and MASCOT-C (no director: random order), and MASCOT; a difference between two is the system's.

Measured (results.md says by whom, and whether training used it): judge rubrics (0-100; Overall = the mean of the
criteria, as the paper), persona identification by the FROZEN base model, redundancy (Self-BLEU, distinct-n, embedding
similarity, NLI rates), reward-hack rates and crisis stops. Simplified: our own rubrics (data/rubrics.json) on a 1-5
scale, agent criteria judged per agent turn; Self-BLEU at Texygen's BLEU-4; the human studies are extras/human.py.

    python mascot.py evaluate [--systems round-robin,mascot] [--profiles all --contexts 50]
"""

import math
import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from director import LLMDirector
from metrics import (
    HACKS,
    NLI_RELATIONS,
    bootstrap_ci,
    distinct_n,
    mean_or_none,
    mean_pairwise_similarity,
    nli_rates,
    rates,
    rescale_0_100,
    self_bleu,
    semantic_redundancy_rate,
    win_rate,
)
from plumbing import files, loading
from plumbing.common import UserError, option
from scenarios import PersonaSet
from simulate import (
    EXAMPLE_STYLES,
    SAFETY,
    USER,
    Cast,
    RandomOrder,
    RoundRobin,
    diagnose_reply,
    judge_state,
    render_history,
    role_setting,
    run_conversations,
)


@dataclass(frozen=True)
class System:
    name: str
    speakers: str  # "base" (--model) | "trained" (stage 1's) | "sft"
    order: str  # "round-robin" | "random" | "prompted-director" | "trained-director"
    style: str  # simulate.STYLES
    about: str
    pipeline: str = (
        ""  # "" (one call per turn) | "self-consistency" | "multiagentesc" (extras/baselines.py)
    )


SYSTEMS = (
    System(
        "zero-shot",
        "base",
        "round-robin",
        "zero-shot",
        "base model; its card and a plain request for a short reply",
    ),
    System(
        "zero-shot-cot",
        "base",
        "round-robin",
        "zero-shot-cot",
        "base model; one sentence of thinking, then the reply",
    ),
    System(
        "few-shot",
        "base",
        "round-robin",
        "few-shot",
        "base model; the card + worked examples (data/fewshot.json)",
    ),
    System(
        "few-shot-cot",
        "base",
        "round-robin",
        "few-shot-cot",
        "base model; the examples with their thinking",
    ),
    System(
        "self-consistency",
        "base",
        "round-robin",
        "zero-shot-cot",
        "base model; k zero-shot-CoT samples per turn, the one the others agree with most kept",
        "self-consistency",
    ),
    System(
        "sft",
        "sft",
        "round-robin",
        "persona",
        "the base model fine-tuned on ESConv supporter turns mapped to "
        "personas by strategy (python mascot.py sft)",
    ),
    System(
        "multiagentesc",
        "base",
        "round-robin",
        "persona",
        "base model; analysis -> strategy proposals -> one reply per strategy -> vote -> refine",
        "multiagentesc",
    ),
    System(
        "round-robin",
        "base",
        "round-robin",
        "persona",
        "base speakers, MASCOT's prompt, fixed roster order: where MASCOT starts from",
    ),
    System(
        "prompted-director",
        "base",
        "prompted-director",
        "persona",
        "the untrained LLM director + base speakers",
    ),
    System(
        "mascot-p",
        "base",
        "trained-director",
        "persona",
        "trained director + base speakers (ablation: no persona alignment)",
    ),
    System(
        "trained-speakers",
        "trained",
        "round-robin",
        "persona",
        "stage 1 alone: round-robin's order, trained speakers",
    ),
    System(
        "mascot-c",
        "trained",
        "random",
        "persona",
        "trained speakers in random order (ablation: no director)",
    ),
    System(
        "mascot", "trained", "trained-director", "persona", "trained director + trained speakers"
    ),
)
SYSTEM_NAMES, REFERENCE = tuple(s.name for s in SYSTEMS), "round-robin"


@dataclass
class EvalConfig:
    """The evaluation's settings; each is also an `evaluate` flag."""

    systems: str = option(
        "all",
        "comma-separated systems of " + ", ".join(SYSTEM_NAMES) + "; 'all': every system "
        "whose models exist",
    )
    contexts: int = option(8, "held-out contexts, each crossed with every profile", "positive")
    profiles: str = option(
        "average", "profile ids (comma-separated), or 'all': the paper's ten Big Five users"
    )
    role_setting: str = option(
        "full",
        "the persona as every speaker prompt shows it: full card, or name and role",
        ["full", "name"],
    )
    persona_id: bool = option(
        True, "score persona identification with the frozen base model (4 passes per turn)"
    )
    nli_model: str = option(
        "", "folder or hub id of an MNLI-style classifier for the NLI rates; none: skipped"
    )
    pairwise: str = option("mascot,round-robin", "A,B: who wins conversation by conversation")
    pairwise_by: str = option(
        "persona-id", "what decides the pairwise preference", ["persona-id", "judge"]
    )
    sc_samples: int = option(5, "self-consistency: zero-shot-CoT samples per turn", "at-least-2")
    sc_pick: str = option(
        "majority",
        "self-consistency: the most agreed-with sample, or the judge's best",
        ["majority", "judge"],
    )


@dataclass(frozen=True)
class Metric:
    key: str
    title: str
    group: str  # the table it is shown in
    digits: int = 3
    better: int = 0  # +1 higher is better, -1 lower is better, 0 neither (the paired-change table)


def rubric_criteria() -> dict[str, list[dict]]:
    return {kind: files.asset("rubrics.json")[kind] for kind in ("agent", "collective")}


def all_metrics() -> list[Metric]:
    """Every column, in table order."""
    crit = rubric_criteria()
    out = [
        Metric(m["key"], m["title"], "Agent-specific (judge rubric, 0-100)", 1)
        for m in crit["agent"]
    ]
    out += [Metric("agent_overall", "agent overall", "Agent-specific (judge rubric, 0-100)", 1)]
    out += [
        Metric(m["key"], m["title"], "Collective (judge rubric, 0-100)", 1)
        for m in crit["collective"]
    ]
    out += [
        Metric("collective_overall", "collective overall", "Collective (judge rubric, 0-100)", 1)
    ]
    ind = "Persona identification by the frozen base model (independent of training)"
    out += [
        Metric("persona_id_accuracy", "persona ID accuracy", ind, better=1),
        Metric("persona_log_ratio", "persona log-ratio", ind, better=1),
        Metric("persona_id_equal", "persona ID accuracy, first 32 tokens", ind, better=1),
    ]
    fn = "Persona function: does the turn do its persona's job? (n-gram model of ESConv's human labels; independent)"
    out += [
        Metric("persona_function", "persona function", fn, better=1),
        Metric("persona_function_equal", "persona function, first 32 tokens", fn, better=1),
    ]
    red = "Redundancy over agent turns"
    out += [
        Metric("self_bleu", "Self-BLEU", red, better=-1),
        Metric("distinct_1", "distinct-1", red),
        Metric("distinct_2", "distinct-2", red),
        Metric("semantic_redundancy", "semantic redundancy", red, better=-1),
        Metric("mean_similarity", "mean similarity", red),
    ]
    out += [Metric(f"nli_{r}", f"NLI {r}", red) for r in NLI_RELATIONS]
    hk = "Reward-hack rates over agent turns, and crisis-guard stops"
    out += [
        Metric(k, t, hk, better=-1)
        for k, t in zip(
            HACKS,
            (
                "context copy",
                "persona-card copy",
                "history echo",
                "repeats itself",
                "meta/prompt leak",
                "empty or trivial",
            ),
        )
    ]
    return out + [
        Metric("words", "reply length (words)", hk, 1),
        Metric("crisis_stop", "crisis stops", hk, better=-1),
    ]


def metric_status(judge, nli: bool, identifier: bool, function: bool = False) -> dict[str, str]:
    """Per column: "ok", "approximated" (a scoring judge standing in for a rubric), or why it has no
    number; the tables show the reason instead of an empty column."""
    kind = judge.name.split(":")[0]
    status = {}
    for m in all_metrics():
        if "rubric" in m.group:
            status[m.key] = (
                "ok"
                if judge.can_generate
                else "approximated"
                if m.key == "persona_consistency"
                or (m.key == "response_relevance" and hasattr(judge, "features_many"))
                else f"n/a ({kind} judge)"
            )
        elif m.key.startswith("persona_function"):
            status[m.key] = "ok" if function else "n/a (no card lists esconv_strategies)"
        elif m.key.startswith("persona_"):
            status[m.key] = "ok" if identifier else "skipped (--no-persona-id)"
        else:
            status[m.key] = (
                "skipped (no --nli-model)" if m.key.startswith("nli_") and not nli else "ok"
            )
    return status


# --- Scoring conversations ------------------------------------------------------------------------
def rubric_scores(conv, personas: PersonaSet, judge) -> tuple[dict, Counter]:
    """Every rubric metric of one conversation from an LLM judge, 0-100 (greedy, as the paper's
    temperature 0): one prompt per (agent turn, criterion) averaged over the turns, one per
    (conversation, criterion). An unreadable answer is counted and left out; a metric without a
    readable answer is None, and so is an Overall over an incomplete set of criteria."""
    agent_idx = [i for i, t in enumerate(conv.turns) if t.speaker not in (USER, SAFETY)]
    crit, asks, everything = (
        rubric_criteria(),
        [],
        len(conv.turns),
    )  # the judge reads the whole conversation
    for m in crit["agent"]:
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            asks.append(
                (
                    m["key"],
                    files.prompt("eval_agent").format(
                        name=p.name,
                        role=p.role,
                        description=p.description,
                        situation=conv.context.situation,
                        history=render_history(conv.turns[:i], everything),
                        reply=conv.turns[i].text,
                        title=m["title"],
                        rubric=m["rubric"],
                    ),
                )
            )
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    for m in (
        crit["collective"] if agent_idx else []
    ):  # none when the guard stopped it before anyone spoke
        asks.append(
            (
                m["key"],
                files.prompt("eval_collective").format(
                    roster=roster,
                    situation=conv.context.situation,
                    transcript=render_history(conv.turns, everything),
                    title=m["title"],
                    rubric=m["rubric"],
                ),
            )
        )
    scores, unreadable = {m["key"]: [] for kind in crit.values() for m in kind}, Counter()
    for (key, _), score in zip(asks, judge.rate_many([a for _, a in asks]) if asks else []):
        if score is None:
            unreadable[key] += 1
        else:
            scores[key].append(rescale_0_100(score, 1, 5))
    return with_overall({k: mean_or_none(v) for k, v in scores.items()}), unreadable


def with_overall(values: dict) -> dict:
    """agent_overall and collective_overall: the mean of their criteria (0-100), as the paper."""
    for kind, crit in rubric_criteria().items():
        parts = [values.get(m["key"]) for m in crit]
        values[f"{kind}_overall"] = None if None in parts else sum(parts) / len(parts)
    return values


def hack_rates(conv, personas: PersonaSet) -> dict:
    """The hack diagnostics of a conversation's agent turns (rates, and the mean length in words),
    against each speaker's FULL card whatever --role-setting showed it; None without agent turns."""
    rows = [
        diagnose_reply(
            personas.find(t.speaker),
            conv.turns[:k],
            conv.context.situation,
            t.text,
            personas.names(),
        )
        for k, t in enumerate(conv.turns)
        if t.speaker not in (USER, SAFETY) and personas.find(t.speaker)
    ]
    return {k: rates(rows).get(k) for k in HACKS + ("words",)}


def score_conversations(
    convs, personas: PersonaSet, judge, encoder, nli=None, identifier=None, function=None
) -> tuple[list, Counter]:
    """One record per conversation (what it was, its metrics), and the unreadable judge answers.
    `personas` are the full cards: the hack rates and the evaluator need them even when the
    speakers saw names only. A conversation without agent turns has None metrics (not "no
    repetition"). The judge and the evaluator see every conversation's turns in one batch."""
    agent = [
        [(k, t) for k, t in enumerate(c.turns) if t.speaker not in (USER, SAFETY)] for c in convs
    ]
    flat = [(n, k, t) for n, turns in enumerate(agent) for k, t in turns]
    records = [
        {
            "index": i,
            "context_id": c.context.id,
            "profile": c.profile,
            "valence": c.context.valence,
            "domain": c.context.domain,
            "agent_turns": len(agent[i]),
            "metrics": {"crisis_stop": float(bool(c.events)), **hack_rates(c, personas)},
        }
        for i, c in enumerate(convs)
    ]
    unreadable = Counter()
    if judge.can_generate:
        for r, c in zip(records, convs):
            values, bad = rubric_scores(c, personas, judge)
            r["metrics"].update(values)
            unreadable += bad
    elif flat:
        states = [
            judge_state(personas.find(t.speaker), convs[n].turns[:k], convs[n].context.situation)
            for n, k, t in flat
        ]
        texts = [t.text for _, _, t in flat]
        scores = judge.score_many(states, texts)
        context = (
            [max(0.0, f["context"]) for f in judge.features_many(states, texts)]
            if hasattr(judge, "features_many")
            else None
        )
        for r in records:
            mine = [j for j, (n, _, _) in enumerate(flat) if n == r["index"]]
            if mine:
                r["metrics"]["judge_score"] = sum(scores[j] for j in mine) / len(mine)
                r["metrics"]["persona_consistency"] = 100 * r["metrics"]["judge_score"]
                if context is not None:
                    r["metrics"]["response_relevance"] = (
                        100 * sum(context[j] for j in mine) / len(mine)
                    )
    # The independent evaluator (extras/evaluators.py): per agent turn (speaker, situation, the turns
    # before it as (speaker, text), the turn) -> {"correct", "log_ratio", "correct_equal"}.
    ids = (
        identifier.score(
            [
                (
                    t.speaker,
                    convs[n].context.situation,
                    [(u.speaker, u.text) for u in convs[n].turns[:k]],
                    t.text,
                )
                for n, k, t in flat
            ]
        )
        if identifier is not None and flat
        else []
    )
    does = (
        function.score([(t.speaker, t.text) for _, _, t in flat])
        if function is not None and flat
        else []
    )
    for r, c, turns in zip(records, convs, agent):
        if not turns:
            continue
        texts, mine = (
            [t.text for _, t in turns],
            [x for (n, _, _), x in zip(flat, ids) if n == r["index"]],
        )
        emb = encoder.embed(texts)  # (turns, D)
        r["metrics"].update(
            self_bleu=self_bleu(texts),
            distinct_1=distinct_n(texts, 1),
            distinct_2=distinct_n(texts, 2),
            semantic_redundancy=semantic_redundancy_rate(emb),
            mean_similarity=mean_pairwise_similarity(emb),
        )
        if nli is not None:
            r["metrics"].update(
                {
                    f"nli_{k}": v
                    for k, v in (nli_rates(texts, *nli) or dict.fromkeys(NLI_RELATIONS)).items()
                }
            )
        jobs = [x for (n, _, _), x in zip(flat, does) if n == r["index"]]
        r["metrics"].update(
            {
                f"persona_{k}": mean_or_none([x[k] for x in jobs])
                for k in ("function", "function_equal")
            }
            if jobs
            else {}
        )
        if mine:
            r["metrics"].update(
                persona_id_accuracy=mean_or_none([x["correct"] for x in mine]),
                persona_log_ratio=mean_or_none([x["log_ratio"] for x in mine]),
                persona_id_equal=mean_or_none([x["correct_equal"] for x in mine]),
            )
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
    return {
        name: {
            k: summarise(
                [
                    a["metrics"][k] - b["metrics"][k]
                    for a, b in zip(e["conversations"], base)
                    if a["metrics"].get(k) is not None and b["metrics"].get(k) is not None
                ],
                seed,
            )
            for k in keys
        }
        for name, e in entries.items()
        if base and name != REFERENCE
    }


# --- Running the systems -----------------------------------------------------------------------------
def choose_systems(
    spec: str, folders: dict[str, str], how: str = ""
) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped}: a system whose model folder is missing is skipped
    with the command that makes it (`how`: the flags to repeat, e.g. " --run R"); nothing stands in."""
    names = (
        list(SYSTEM_NAMES)
        if spec.strip() == "all"
        else [s.strip() for s in spec.split(",") if s.strip()]
    )
    unknown = [n for n in names if n not in SYSTEM_NAMES]
    if not names or unknown:
        raise UserError(
            f"--systems {spec}: unknown system '{(unknown or [''])[0]}'; use 'all' or some of "
            + ", ".join(SYSTEM_NAMES)
        )
    make = {
        "trained": f"python mascot.py train --stage 1{how}",
        "trained-director": f"python mascot.py train --stage 2{how}",
        "sft": f"python mascot.py sft{how} --data <ESConv.json or an ESConv .jsonl>",
    }
    chosen, skipped = [], {}
    for s in (s for s in SYSTEMS if s.name in names):
        missing = [
            k
            for k in (s.speakers, s.order)
            if k in make
            and not loading.trained_or(folders[k], "")
            and not folders[k].startswith("openai:")
        ]
        if missing:
            skipped[s.name] = f"no model at {folders[missing[0]]}; make it with: {make[missing[0]]}"
        else:
            chosen.append(s)
    return chosen, skipped


def plan_conversations(contexts: list, n: int, profile_ids: list[str]) -> list[tuple]:
    """(context, profile) of every conversation, the same for every system: each of the first n
    contexts with every profile (the paper: 50 x 10 = 500). c0, c1 x p, q -> (c0,p) (c0,q) (c1,p) (c1,q)."""
    return [(c, p) for c in contexts[:n] for p in profile_ids]


def profile_ids(spec: str, profiles: dict) -> list[str]:
    """'all' -> the profiles with one trait set high or low (the paper's ten); 'a,b' -> those, checked."""
    if spec.strip() == "all":
        return [
            pid for pid, p in profiles.items() if p.trait() not in ("average", "mixed")
        ] or list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    if not ids or any(p not in profiles for p in ids):
        raise UserError(
            f"--profiles {spec}: use 'all' or ids from the profiles file: {', '.join(profiles)}"
        )
    return ids


@dataclass
class Setup:
    """What every system of one evaluation shares."""

    contexts: list  # conversation i's context ...
    profiles: list[str]  # ... and its simulated user's profile
    roles: dict  # "base" | "trained" | "sft" | "trained-director" | "user" -> (model, tok)
    names: dict  # the same keys -> what the model is (a folder, a name), for the tables
    fewshot: list
    encoder: object
    judge: object
    nli: tuple | None
    identifier: object
    function: object  # the persona-function evaluator (extras/strategies.py), or None
    guard: object  # the crisis guard (extras/safety.py), or None
    pipelines: dict  # pipeline name -> speak(convs, directives, cast) (extras/baselines.py)


def run_system(
    system: System,
    setup: Setup,
    inputs,
    cfg: EvalConfig,
    max_new_tokens: int,
    turns: int,
    user_every: int,
    seed: int,
    keys: list[str],
) -> tuple[list, dict]:
    """Simulate one system's conversations (all advanced together) and score them."""
    t0 = time.time()
    (sm, st), (um, ut) = setup.roles[system.speakers], setup.roles["user"]
    cast = Cast(
        role_setting(inputs.personas, cfg.role_setting),
        sm,
        st,
        um,
        ut,
        max_new_tokens,
        style=system.style,
        examples=setup.fewshot if system.style in EXAMPLE_STYLES else [],
        guard=setup.guard,
    )
    policy = {
        "round-robin": lambda: RoundRobin(inputs.personas),
        "random": lambda: RandomOrder(inputs.personas, seed),
        "prompted-director": lambda: LLMDirector(
            *setup.roles["base"], inputs.personas, "prompted-director"
        ),
        "trained-director": lambda: LLMDirector(*setup.roles["trained-director"], inputs.personas),
    }[system.order]()
    speak = setup.pipelines[system.pipeline](system) if system.pipeline else None
    convs = run_conversations(
        setup.contexts,
        policy,
        cast,
        inputs.profiles,
        setup.profiles,
        turns,
        user_every,
        seed,
        **({"speak": speak} if speak else {}),
        desc=f"{system.name}, agent turns",
    )
    t1 = time.time()
    records, unreadable = score_conversations(
        convs,
        inputs.personas,
        setup.judge,
        setup.encoder,
        setup.nli,
        setup.identifier,
        setup.function,
    )
    for r in records:
        r["trait"] = inputs.profiles[r["profile"]].trait()
    print(
        f"{system.name}: {len(convs)} conversations simulated in {t1 - t0:.0f} s, scored in {time.time() - t1:.0f} s",
        flush=True,
    )
    director = {
        "round-robin": "round-robin",
        "random": "random order",
        "prompted-director": f"prompted: {setup.names['base']}",
        "trained-director": f"trained: {setup.names.get('trained-director')}",
    }[system.order]
    entry = {
        "about": system.about,
        "speakers": f"{system.speakers}: {setup.names[system.speakers]}, {system.style} prompt",
        "director": director,
        "judge": setup.judge.name,
        "n": len(convs),
        "seconds": round(time.time() - t0, 1),
        "metrics": aggregate(records, keys, seed),
        "unreadable": dict(unreadable),
        "crisis_flags": [{"context_id": c.context.id, **e} for c in convs for e in c.events],
        "directives": [getattr(policy, "invalid", 0), getattr(policy, "total", 0)],
        "conversations": records,
    }
    return convs, entry


def run(
    cfg: EvalConfig,
    setup: Setup,
    inputs,
    out: Path,
    systems: list[System],
    skipped: dict,
    protocol: dict,
    max_new_tokens: int,
    turns: int,
    user_every: int,
    seed: int,
    judge_spec: str,
    trained_with: dict,
) -> dict:
    """Run every system, score, write RUN/eval/{transcripts.jsonl, results.json, results.md}. Each
    finished system is saved at once (RUN/eval/partial/), so the same command after an interruption
    redoes only the unfinished ones (`protocol` holds everything their numbers depend on).
    judge_spec, trained_with: this --judge and each training stage's, for the table of who measured what."""
    status = metric_status(
        setup.judge, setup.nli is not None, setup.identifier is not None, setup.function is not None
    )
    keys = [k for k, v in status.items() if v in ("ok", "approximated")] + ["judge_score"]
    entries, rows = {}, []
    for system in systems:
        part = out / "partial" / f"{system.name}.json"
        saved = files.read_json(part) if part.is_file() else {}
        if saved.get("protocol") == json_safe(protocol):
            entries[system.name], sys_rows = saved["entry"], saved["rows"]
            print(f"{system.name}: kept from the interrupted evaluation ({part})", flush=True)
        else:
            convs, entries[system.name] = run_system(
                system, setup, inputs, cfg, max_new_tokens, turns, user_every, seed, keys
            )
            sys_rows = [
                {"system": system.name, "index": i, **c.to_json()} for i, c in enumerate(convs)
            ]
            files.write_json(
                part,
                json_safe({"protocol": protocol, "entry": entries[system.name], "rows": sys_rows}),
            )
        rows += sys_rows
    fields = slice_fields([r for e in entries.values() for r in e["conversations"]])
    for e in entries.values():
        e["slices"] = {
            f: {
                v: {"n": len(g), "metrics": aggregate(g, keys, seed)}
                for v in sorted({r[f] or "-" for r in e["conversations"]})
                for g in [[r for r in e["conversations"] if (r[f] or "-") == v]]
            }
            for f in fields
        }
    results = {
        "protocol": protocol,
        "judge": setup.judge.name,
        "status": status,
        "systems": entries,
        "skipped": skipped,
        "slice_fields": fields,
        "evaluators": training_use(judge_spec, trained_with, cfg, setup.function is not None),
        "changes": paired_changes(
            entries, [m.key for m in all_metrics() if m.better and status[m.key] == "ok"], seed
        ),
        "pairwise": pairwise(cfg, entries, setup.identifier is not None),
        "crisis_section": setup.guard.stops_section(entries) if setup.guard is not None else [],
    }
    files.write_jsonl(out / "transcripts.jsonl", rows)
    files.write_json(out / "results.json", json_safe(results))
    files.write_text_atomic(out / "results.md", results_markdown(results))
    shutil.rmtree(out / "partial", ignore_errors=True)
    return results


def slice_fields(records: list[dict]) -> list[str]:
    """The paper's slices that vary here: ED valence, QMSum domain, the profile and its Big Five trait."""
    return [
        f for f in ("valence", "domain", "profile", "trait") if len({r[f] for r in records}) > 1
    ]


def pairwise(cfg: EvalConfig, entries: dict, identifier: bool = True) -> dict:
    """A vs B per conversation (same context, profile and seeds), with an exact two-sided sign test: the higher
    persona log-ratio wins (the independent evaluator), or with --pairwise-by judge (also without the evaluator) the
    judge's mean score of the agent turns, an LLM judge's agent overall; None or equal is a tie."""
    names = [s.strip() for s in cfg.pairwise.split(",")]
    if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
        raise UserError(
            f"--pairwise {cfg.pairwise}: give two different systems as A,B from "
            + ", ".join(SYSTEM_NAMES)
        )
    (a, b), by = names, cfg.pairwise_by if identifier else "judge"
    if a not in entries or b not in entries:
        return {
            "a": a,
            "b": b,
            "line": f"pairwise {a} vs {b}: not run (both must run in this evaluation)",
        }
    keys = ("persona_log_ratio",) if by == "persona-id" else ("judge_score", "agent_overall")
    get = lambda r: next((r["metrics"][k] for k in keys if r["metrics"].get(k) is not None), None)  # noqa: E731
    outcomes = [
        "tie" if None in (get(x), get(y)) or get(x) == get(y) else "A" if get(x) > get(y) else "B"
        for x, y in zip(entries[a]["conversations"], entries[b]["conversations"])
    ]
    s = win_rate(outcomes)
    how = (
        "the independent evaluator (the frozen base model's persona log-ratio), which training never used"
        if by == "persona-id"
        else "the judge; see 'Who measured each column' for whether training used it"
    )
    return {
        "a": a,
        "b": b,
        "decided_by": by,
        "outcomes": outcomes,
        **s,
        "line": f"**{a} vs {b}**, {len(outcomes)} conversation pairs: {a} wins {s['wins']}, loses {s['losses']}, "
        f"ties {s['ties']}; win rate {'-' if s['win_rate'] is None else format(s['win_rate'], '.3f')} (ties "
        f"left out); exact two-sided binomial p = {s['p_value']:.4g}; decided by {how}.",
    }


def training_use(
    spec: str, trained_with: dict, cfg: EvalConfig, function: bool = False
) -> list[dict]:
    """Each group of columns, its evaluator, and whether a stage of training used it. spec: this
    evaluation's --judge; trained_with: {stage: its --judge} (from the stages' config.json)."""
    why = {1: "it labelled the reward model's preference pairs", 2: "its coherence reward"}
    uses = [
        f"stage {k}'s --judge ({why[k]})"
        for k, j in trained_with.items()
        if j.split(" ")[0] == spec.strip()
    ]
    rows = [
        (
            "judge rubrics",
            f"judge {spec}",
            "YES: a reward model is what stage 1's GRPO maximises"
            if spec.startswith("rm:")
            else "YES: " + " and ".join(uses)
            if uses
            else f"no (stage 1 used {trained_with[1]}, stage 2 {trained_with[2]})",
        )
    ]
    if cfg.persona_id:
        rows.append(
            (
                "persona identification",
                "frozen base model: which card makes each turn most likely",
                "no: neither "
                "a reward nor a judge of any stage (stage 1's KL term anchors the speakers to this model under their "
                "OWN card only)",
            )
        )
    rows += [
        (
            "persona function",
            "word n-gram model of ESConv's strategy labels (extras/strategies.py)",
            "no: neither a "
            "reward nor a judge; trained on other dialogues, another model family than the judge's classifier",
        )
    ] * function
    rows += [
        (
            "Self-BLEU, distinct-n",
            "n-gram counts (metrics.py)",
            "no; stage 2's non-redundancy term uses BLEU-2",
        ),
        (
            "semantic redundancy, mean similarity",
            "the MiniLM sentence encoder",
            "partly: the same encoder feeds the offline judge and stage 2's non-redundancy term",
        ),
    ]
    rows += [("NLI rates", f"NLI classifier {cfg.nli_model}", "no")] if cfg.nli_model else []
    rows += [
        (
            "hack rates",
            "lexical rules (metrics.diagnose)",
            "yes, indirectly: stage 1's reward model learns to reject "
            "synthetic hacks and the offline judge penalises them; stage 2's reward has a clean term",
        ),
        ("crisis stops", "the crisis guard (extras/safety.py)", "no"),
    ]
    return [dict(zip(("columns", "evaluator", "used_in_training"), r)) for r in rows]


def json_safe(value):
    """NaN is not JSON: null instead; tuples become lists (as they come back from JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    return [json_safe(v) for v in value] if isinstance(value, (list, tuple)) else value


# --- results.md ------------------------------------------------------------------------------------
def cell(s: dict | None, digits: int, status: str = "ok") -> str:
    """'mean [lo, hi]' ('(n=k)' when only k of the rows have a value), the reason a column has no
    number, '-' without a score, no interval for one value (one value has no spread)."""
    if status not in ("ok", "approximated"):
        return status
    if not s or s["mean"] is None:
        return "-"
    text = f"{s['mean']:.{digits}f}" + (
        f" [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]" if s["lo"] is not None else ""
    )
    return text + (f" (n={s['n']})" if s.get("of") not in (None, s["n"]) else "")


def table(header: list[str], rows: list[list]) -> list[str]:
    return (
        ["| " + " | ".join(header) + " |", "|" + "|".join("--" for _ in header) + "|"]
        + ["| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |" for r in rows]
        + [""]
    )


HEADLINE = (
    "agent_overall",
    "collective_overall",
    "persona_consistency",
    "persona_id_accuracy",
    "persona_id_equal",
    "persona_function",
    "persona_function_equal",
    "self_bleu",
    "distinct_2",
    "context_copy",
    "persona_copy",
    "history_echo",
)


def results_markdown(r: dict) -> str:
    """Protocol, systems, one table per metric group (skipped columns left out; n/a ones say why;
    * = approximated), paired changes against round-robin ('!' = worse beyond the interval), who
    measured what, slices, crisis stops, pairwise, notes."""
    metrics, systems, status = all_metrics(), r["systems"], r["status"]
    title = lambda m: m.title + ("*" if status[m.key] == "approximated" else "")  # noqa: E731
    out = ["# Evaluation", "", r["protocol"]["summary"], ""] + [
        f"- **{n}**: {e['about']}" for n, e in systems.items()
    ]
    out += [f"- skipped **{n}**: {why}" for n, why in r["skipped"].items()] + [""]
    for i, group in enumerate(dict.fromkeys(m.group for m in metrics)):
        cols = [m for m in metrics if m.group == group and not status[m.key].startswith("skipped")]
        head = ["system", "speakers", "director", "judge", "n"] if i == 0 else ["system", "n"]
        if cols:
            out += [f"## {group}", ""] + table(
                head + [title(m) for m in cols],
                [
                    [n]
                    + ([e["speakers"], e["director"], e["judge"]] if i == 0 else [])
                    + [e["n"]]
                    + [
                        cell({**e["metrics"].get(m.key, {}), "of": e["n"]}, m.digits, status[m.key])
                        for m in cols
                    ]
                    for n, e in systems.items()
                ],
            )
    cols = [m for m in metrics if any(m.key in c for c in r["changes"].values())]
    if cols:

        def change(c, m):
            worse = c["lo"] is not None and (c["hi"] < 0 if m.better > 0 else c["lo"] > 0)
            return cell(c, 3) + (" !" if worse else "")

        out += [
            f"## Paired change against {REFERENCE} (same contexts, profiles and seeds; 95% bootstrap over "
            "conversation pairs; ! = worse beyond the interval)",
            "",
        ] + table(
            ["system"] + [f"Δ {m.title}" for m in cols],
            [[n] + [change(c[m.key], m) for m in cols] for n, c in r["changes"].items()],
        )
    out += ["## Who measured each column, and did training use it", ""] + table(
        ["columns", "evaluator", "used in training?"],
        [[e["columns"], e["evaluator"], e["used_in_training"]] for e in r["evaluators"]],
    )
    head = [m for m in metrics if m.key in HEADLINE and status[m.key] in ("ok", "approximated")]
    for field in r["slice_fields"]:
        out += [f"## Per {field}", ""] + table(
            ["system", field, "n"] + [title(m) for m in head],
            [
                [n, v, s["n"]]
                + [cell({**s["metrics"][m.key], "of": s["n"]}, m.digits) for m in head]
                for n, e in systems.items()
                for v, s in e["slices"][field].items()
            ],
        )
    out += r.get("crisis_section", [])  # the guard's own table of its stops (extras/safety.py)
    out += ["## Pairwise preference", "", r["pairwise"]["line"], "", "## Notes", ""] + [
        f"- {n}" for n in notes(r)
    ]
    return "\n".join(out) + "\n"


def notes(r: dict) -> list[str]:
    """How to read the tables."""
    judge, systems = r["judge"], r["systems"]
    out = [
        "[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples); '-' = no score (no agent "
        "turn, or fewer than two turns for a redundancy metric); one value has no interval; (n=k): only k rows have a value"
    ]
    if any(v == "approximated" for v in r["status"].values()):
        out.append(
            f"* approximated: the {judge.split(':')[0]} judge cannot read rubrics, so persona consistency = 100 x "
            "its mean score of the agent turns and response relevance = 100 x the mean cosine of a turn with the "
            "user's latest message; every other rubric column, and so Overall, needs an LLM judge "
            "(--judge hf:<model or folder> or openai:<base url>)"
        )
    else:
        crit = rubric_criteria()
        asked = sum(
            c["agent_turns"] * len(crit["agent"]) + (c["agent_turns"] > 0) * len(crit["collective"])
            for e in systems.values()
            for c in e["conversations"]
        )
        out.append(
            f"unparseable judge answers: {sum(sum(e['unreadable'].values()) for e in systems.values())} of {asked}, "
            "left out of the means"
        )
    if r["status"].get("nli_entailment", "").startswith("skipped"):
        out.append(
            "NLI relation rates skipped: no --nli-model given (any MNLI-style classifier folder)"
        )
    out += [
        f"{n}: {e['directives'][0]} of {e['directives'][1]} directives unparseable (the least-spoken agent spoke)"
        for n, e in systems.items()
        if e["directives"][1]
    ]
    return out
