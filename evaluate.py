"""evaluate.py: does the trained group talk better than the alternatives? Every number of the table.

Where it sits: last in MASCOT's pipeline (arXiv 2601.14230). Stage 1 aligned the speakers to
their personas, stage 2 trained the director; here several systems hold conversations on the same
held-out contexts with the same simulated users and the same seeds, every conversation is scored,
and the tables show means with 95% bootstrap intervals per system and per slice, and paired
changes against round-robin. The formulas are metrics.py's; this file decides what is measured,
on what, and by whom. Read it in order:

1. The systems (SYSTEMS): the paper's baselines, our reference points, its two ablations
   MASCOT-P (trained director, base speakers) and MASCOT-C (trained speakers, random order),
   and MASCOT. Most differ from round-robin or from a neighbour in one part (the speakers'
   weights, their prompt, or who picks the next speaker), so that difference is the part's.
2. What is measured, and by whom (all_metrics, metric_status, training_use): judge rubrics
   (0-100; Overall = the mean of the criteria, as the paper), persona identification by the
   FROZEN base model, redundancy (Self-BLEU, distinct-n, embedding similarity, NLI relation
   rates, as the paper), reward-hack rates and crisis stops. results.md says which evaluator
   measured each column and whether a stage of training used it: a score that training pushed
   up is weaker evidence than one it never saw.
3. How the conversations are scored (score_conversations and its steps).
4. Intervals and paired changes (summarise, paired_changes, pairwise's exact sign test).
5. Running the systems (choose_systems, plan_conversations, run_system, run).

Simplified relative to the paper: its rubrics are not published, so ours (data/rubrics.json) are
asked on a 1-5 scale and rescaled to 0-100, the agent criteria once per agent turn and averaged;
Self-BLEU is Texygen's BLEU-4; the NLI classifier is whatever --nli-model names; the human
studies are extras/human.py. results.md is laid out by plumbing/results.py.

    python mascot.py evaluate [--systems round-robin,mascot] [--profiles all --contexts 50]
"""

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
from plumbing import files, loading, results
from plumbing.common import UserError, option
from scenarios import Inputs, PersonaSet
from simulate import (
    EXAMPLE_STYLES,
    SAFETY,
    USER,
    Cast,
    RandomOrder,
    RoundRobin,
    TurnPlan,
    diagnose_reply,
    judge_state,
    render_history,
    role_setting,
    run_conversations,
)


# --- The systems ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class System:
    """One row of the tables: whose speakers, in which order, prompted how."""

    name: str
    speakers: str  # "base" (--model) | "trained" (stage 1's) | "sft"
    order: str  # "round-robin" | "random" | "prompted-director" | "trained-director"
    style: str  # the speakers' prompt, one of simulate.STYLES
    about: str  # one line for results.md
    # "": one model call per turn; "self-consistency" | "multiagentesc": a multi-call pipeline
    # of extras/baselines.py speaks instead.
    pipeline: str = ""


# Every system of the tables, in table order. Most differ from round-robin or from a neighbour in
# one part (the speakers' weights, their prompt, or who picks the next speaker).
SYSTEMS = (
    # The paper's baselines: the base model prompted four ways (its card alone or with worked
    # examples, each with or without a sentence of thinking first), self-consistency, SFT on
    # human supporters, and MultiAgentESC, a prompting-only pipeline with fixed turns.
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
    # Our reference points: round-robin is MASCOT before any training (its prompt, base speakers,
    # a fixed order); the prompted director is stage 2's starting point; trained-speakers is
    # stage 1 alone. Without them a gain could not be assigned to a stage.
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
    # The paper's ablations: MASCOT-P drops stage 1 (base speakers under the trained director),
    # MASCOT-C drops stage 2 (trained speakers, a uniformly random next speaker); then MASCOT.
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
SYSTEM_NAMES = tuple(s.name for s in SYSTEMS)
# Every paired change is measured against round-robin: MASCOT's speakers before training, in a
# fixed order. Both stages start from it, so a change against it is what training added.
REFERENCE = "round-robin"


@dataclass
class EvalConfig:
    """The evaluation's settings; each is also an `evaluate` flag. The defaults fit a laptop: the
    paper's protocol is 50 contexts x the ten Big Five profiles (--contexts 50 --profiles all).
    How long a conversation is and its seed are the flags every command shares (Schedule)."""

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


# --- What is measured, and by whom ----------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """One column of results.md."""

    key: str  # the name in each conversation's metrics
    title: str
    group: str  # the table it is shown in
    digits: int = 3
    better: int = 0  # +1 higher is better, -1 lower is better, 0 neither (the paired-change table)


# The titles of metrics.HACKS, in its order.
HACK_TITLES = (
    "context copy",
    "persona-card copy",
    "history echo",
    "repeats itself",
    "meta/prompt leak",
    "empty or trivial",
    "word salad",
)


def rubric_criteria() -> dict[str, list[dict]]:
    """The judge's criteria: "agent" ones asked of every agent turn, "collective" ones of the whole
    conversation (the paper's two families; its texts are unpublished, so these are ours)."""
    return {kind: files.asset("rubrics.json")[kind] for kind in ("agent", "collective")}


def all_metrics() -> list[Metric]:
    """Every column, in table order."""
    crit = rubric_criteria()
    # The paper's judge rubrics, rescaled to 0-100, each family with its Overall (their mean).
    agent = "Agent-specific (judge rubric, 0-100)"
    out = [Metric(m["key"], m["title"], agent, 1) for m in crit["agent"]]
    out.append(Metric("agent_overall", "agent overall", agent, 1))
    collective = "Collective (judge rubric, 0-100)"
    out += [Metric(m["key"], m["title"], collective, 1) for m in crit["collective"]]
    out.append(Metric("collective_overall", "collective overall", collective, 1))
    # Ours, beside the paper's judges: measures no stage of training optimises. Our default judge
    # labelled stage 1's preference pairs, so a higher judge score may only mean the speakers
    # learned its blind spots. Persona identification asks which card makes a turn most likely
    # under the frozen base model (extras/evaluators.py); the log-ratio is its per-token log Bayes
    # factor "own card vs the others"; the first-32-token accuracy cannot be won by length.
    ind = "Persona identification by the frozen base model (independent of training)"
    out += [
        Metric("persona_id_accuracy", "persona ID accuracy", ind, better=1),
        Metric("persona_log_ratio", "persona log-ratio", ind, better=1),
        Metric("persona_id_equal", "persona ID accuracy, first 32 tokens", ind, better=1),
    ]
    # Persona function: does a turn use the ESConv strategies its card lists (Liu et al. 2021)?
    fn = (
        "Persona function: does the turn do its persona's job? "
        "(n-gram model of ESConv's human labels; independent)"
    )
    out += [
        Metric("persona_function", "persona function", fn, better=1),
        Metric("persona_function_equal", "persona function, first 32 tokens", fn, better=1),
    ]
    # The paper's redundancy between the agent turns of one conversation (Self-BLEU, NLI relation
    # rates), distinct-n (Li et al. 2016), and two of ours from sentence embeddings. Companions
    # that restate each other add nothing, so lower Self-BLEU and redundancy are better.
    red = "Redundancy over agent turns"
    out += [
        Metric("self_bleu", "Self-BLEU", red, better=-1),
        Metric("distinct_1", "distinct-1", red),
        Metric("distinct_2", "distinct-2", red),
        Metric("semantic_redundancy", "semantic redundancy", red, better=-1),
        Metric("mean_similarity", "mean similarity", red),
    ]
    out += [Metric(f"nli_{r}", f"NLI {r}", red) for r in NLI_RELATIONS]
    # Ours: what a policy that games its reward would do more of (copy the user or its own card,
    # echo another companion, leak its prompt, say nothing), and the crisis guard's stops.
    hk = "Reward-hack rates over agent turns, and crisis-guard stops"
    out += [Metric(k, t, hk, better=-1) for k, t in zip(HACKS, HACK_TITLES)]
    out.append(Metric("words", "reply length (words)", hk, 1))
    out.append(Metric("crisis_stop", "crisis stops", hk, better=-1))
    return out


@dataclass
class Evaluators:
    """Who measures. The judge may be the very model training was rewarded by; the others are
    chosen to stand apart from training. results.md's table of who measured what (training_use)
    says, column by column, whether a stage of training used the evaluator."""

    judge: object  # the rubric judge (judge.py, an LLM) or a scoring one (offline, reward.RMJudge)
    encoder: object  # loading.SentenceEncoder: semantic redundancy and mean similarity
    nli: tuple | None  # (model, tokenizer) of an MNLI-style classifier; None: NLI rates skipped
    identifier: object  # extras/evaluators.PersonaIdentifier on the frozen base model, or None
    function: object  # extras/strategies.FunctionEvaluator, or None (no card lists strategies)
    judge_spec: str  # this evaluation's --judge, as given
    trained_with: dict  # {stage: the --judge it trained with} (from the stages' config.json)


def metric_status(ev: Evaluators) -> dict[str, str]:
    """Per column: "ok", "approximated" (a scoring judge standing in for a rubric), or why it has no
    number; the tables show the reason instead of an empty column."""
    return {m.key: column_status(m, ev) for m in all_metrics()}


def column_status(m: Metric, ev: Evaluators) -> str:
    """One column's status: each family of columns needs its own evaluator."""
    if "rubric" in m.group:
        return rubric_status(m.key, ev.judge)
    if m.key.startswith("persona_function"):
        if ev.function is None:
            return "n/a (no card lists esconv_strategies)"
        return "ok"
    if m.key.startswith("persona_"):
        if ev.identifier is None:
            return "skipped (--no-persona-id)"
        return "ok"
    if m.key.startswith("nli_") and ev.nli is None:
        return "skipped (no --nli-model)"
    return "ok"


def rubric_status(key: str, judge) -> str:
    """An LLM judge reads every rubric. A scoring judge (offline, a reward model) reads none, but it
    stands in for two: its score of a turn for persona consistency, and, where it exposes its
    features, a turn's cosine with the user's message for response relevance."""
    if judge.can_generate:
        return "ok"
    if key == "persona_consistency":
        return "approximated"
    if key == "response_relevance" and hasattr(judge, "features_many"):
        return "approximated"
    kind = judge.name.split(":")[0]
    return f"n/a ({kind} judge)"


def training_use(
    spec: str, trained_with: dict, cfg: EvalConfig, function: bool = False
) -> list[dict]:
    """Each group of columns, its evaluator, and whether a stage of training used it. spec: this
    evaluation's --judge; trained_with: {stage: its --judge} (from the stages' config.json)."""
    rows = [("judge rubrics", f"judge {spec}", judge_use(spec, trained_with))]
    if cfg.persona_id:
        rows.append(
            (
                "persona identification",
                "frozen base model: which card makes each turn most likely",
                "no: neither a reward nor a judge of any stage (stage 1's KL term anchors the "
                "speakers to this model under their OWN card only)",
            )
        )
    if function:
        rows.append(
            (
                "persona function",
                "word n-gram model of ESConv's strategy labels (extras/strategies.py)",
                "no: neither a reward nor a judge; trained on other dialogues, another model "
                "family than the judge's classifier",
            )
        )
    rows.append(
        (
            "Self-BLEU, distinct-n",
            "n-gram counts (metrics.py)",
            "no; stage 2's non-redundancy term uses BLEU-2",
        )
    )
    rows.append(
        (
            "semantic redundancy, mean similarity",
            "the MiniLM sentence encoder",
            "partly: the same encoder feeds the offline judge and stage 2's non-redundancy term",
        )
    )
    if cfg.nli_model:
        rows.append(("NLI rates", f"NLI classifier {cfg.nli_model}", "no"))
    rows.append(
        (
            "hack rates",
            "lexical rules (metrics.diagnose)",
            "yes, indirectly: stage 1's reward model learns to reject synthetic hacks and the "
            "offline judge penalises them; stage 2's reward has a clean term",
        )
    )
    rows.append(("crisis stops", "the crisis guard (extras/safety.py)", "no"))
    return [dict(zip(("columns", "evaluator", "used_in_training"), r)) for r in rows]


def judge_use(spec: str, trained_with: dict) -> str:
    """Did training use this judge? In stage 1 it labelled the reward model's preference pairs, in
    stage 2 it gives the coherence reward; a reward model (rm:) is what stage 1's GRPO maximised."""
    if spec.startswith("rm:"):
        return "YES: a reward model is what stage 1's GRPO maximises"
    why = {1: "it labelled the reward model's preference pairs", 2: "its coherence reward"}
    uses = []
    for stage, judge in trained_with.items():
        if judge.split(" ")[0] == spec.strip():  # "offline (assumed: ...)" is the offline judge
            uses.append(f"stage {stage}'s --judge ({why[stage]})")
    if uses:
        return "YES: " + " and ".join(uses)
    return f"no (stage 1 used {trained_with[1]}, stage 2 {trained_with[2]})"


# --- Scoring conversations ------------------------------------------------------------------------
def is_agent(turn) -> bool:
    """A companion's turn: not the simulated user's, not the crisis guard's stop message."""
    return turn.speaker not in (USER, SAFETY)


def rubric_scores(conv, personas: PersonaSet, judge) -> tuple[dict, Counter]:
    """Every rubric metric of one conversation from an LLM judge, 0-100 (greedy, as the paper's
    temperature 0): one prompt per (agent turn, criterion) averaged over the turns, one per
    (conversation, criterion). An unreadable answer is counted and left out; a metric without a
    readable answer is None, and so is an Overall over an incomplete set of criteria."""
    crit = rubric_criteria()
    agent_idx = [i for i, t in enumerate(conv.turns) if is_agent(t)]
    asks = agent_asks(conv, personas, agent_idx, crit["agent"])
    if agent_idx:  # none when the guard stopped it before anyone spoke
        asks += collective_asks(conv, personas, crit["collective"])
    scores = {m["key"]: [] for m in crit["agent"] + crit["collective"]}
    unreadable = Counter()
    # One batch per conversation; the judge caches its answers (eval/judge_cache.jsonl), so a
    # rerun pays for nothing twice.
    answers = judge.rate_many([prompt for _, prompt in asks]) if asks else []
    for (key, _), score in zip(asks, answers):
        if score is None:
            unreadable[key] += 1
        else:
            scores[key].append(rescale_0_100(score, 1, 5))  # the paper reports 0-100
    means = {k: mean_or_none(v) for k, v in scores.items()}
    return with_overall(means), unreadable


def agent_asks(conv, personas: PersonaSet, agent_idx: list[int], criteria) -> list[tuple]:
    """(criterion key, prompt) for every agent criterion and agent turn: the judge sees the
    speaker's full card, the situation, every turn before this one, and the turn."""
    everything = len(conv.turns)  # the judge reads the whole conversation, not a recent window
    asks = []
    for m in criteria:
        for i in agent_idx:
            p = personas.find(conv.turns[i].speaker)
            prompt = files.prompt("eval_agent").format(
                name=p.name,
                role=p.role,
                description=p.description,
                situation=conv.context.situation,
                history=render_history(conv.turns[:i], everything),
                reply=conv.turns[i].text,
                title=m["title"],
                rubric=m["rubric"],
            )
            asks.append((m["key"], prompt))
    return asks


def collective_asks(conv, personas: PersonaSet, criteria) -> list[tuple]:
    """(criterion key, prompt) for every collective criterion: the roster and the transcript."""
    roster = "; ".join(f"{p.name} ({p.role})" for p in personas.personas)
    asks = []
    for m in criteria:
        prompt = files.prompt("eval_collective").format(
            roster=roster,
            situation=conv.context.situation,
            transcript=render_history(conv.turns, len(conv.turns)),
            title=m["title"],
            rubric=m["rubric"],
        )
        asks.append((m["key"], prompt))
    return asks


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
        if is_agent(t) and personas.find(t.speaker)
    ]
    return {k: rates(rows).get(k) for k in HACKS + ("words",)}


def score_conversations(convs, personas: PersonaSet, ev: Evaluators) -> tuple[list, Counter]:
    """One record per conversation (what it was, its metrics), and the unreadable judge answers.
    `personas` are the full cards: the hack rates and the evaluator need them even when the
    speakers saw names only. A conversation without agent turns has None metrics (not "no
    repetition"). The judge and the evaluators see every conversation's turns in one batch."""
    # 1. What each conversation was, and what needs no model: crisis stop, hack rates.
    records = [conversation_record(i, c, personas) for i, c in enumerate(convs)]
    flat = agent_turns(convs)  # (conversation n, turn index k, turn), every conversation's
    # 2. The judge: an LLM judge answers every rubric; a scoring judge gives its stand-ins.
    unreadable = Counter()
    if ev.judge.can_generate:
        for r, c in zip(records, convs):
            values, bad = rubric_scores(c, personas, ev.judge)
            r["metrics"].update(values)
            unreadable += bad
    elif flat:
        add_judge_stand_ins(records, convs, flat, personas, ev.judge)
    # 3. The independent evaluators, over every agent turn at once.
    ids = persona_identification(ev.identifier, convs, flat)
    does = []
    if ev.function is not None and flat:
        does = ev.function.score([(t.speaker, t.text) for _, _, t in flat])
    # 4. Per conversation: the redundancy between its agent turns, and the evaluators' means.
    for r, c in zip(records, convs):
        texts = [t.text for t in c.turns if is_agent(t)]
        if not texts:
            continue  # no agent turn: these metrics are left out (None in the tables), not 0
        r["metrics"].update(redundancy(texts, ev.encoder, ev.nli))
        jobs = of_conversation(flat, does, r["index"])
        if jobs:
            r["metrics"].update(persona_function_means(jobs))
        mine = of_conversation(flat, ids, r["index"])
        if mine:
            r["metrics"].update(persona_id_means(mine))
    return records, unreadable


def conversation_record(i: int, conv, personas: PersonaSet) -> dict:
    """What conversation i was (its slice fields) and the metrics known before any judge: whether
    the crisis guard stopped it, and its hack rates."""
    agent_count = sum(1 for t in conv.turns if is_agent(t))
    return {
        "index": i,
        "context_id": conv.context.id,
        "profile": conv.profile,
        "valence": conv.context.valence,  # Empathetic Dialogues' slices, as the paper
        "domain": conv.context.domain,  # QMSum's
        "agent_turns": agent_count,
        "metrics": {"crisis_stop": float(bool(conv.events)), **hack_rates(conv, personas)},
    }


def agent_turns(convs) -> list[tuple]:
    """Every agent turn of every conversation as (conversation n, turn index k, turn), in order,
    so one batched call scores them all."""
    flat = []
    for n, conv in enumerate(convs):
        for k, turn in enumerate(conv.turns):
            if is_agent(turn):
                flat.append((n, k, turn))
    return flat


def of_conversation(flat: list[tuple], values: list, n: int) -> list:
    """The values (one per entry of flat) that belong to conversation n's turns."""
    return [x for (m, _, _), x in zip(flat, values) if m == n]


def add_judge_stand_ins(records, convs, flat, personas: PersonaSet, judge) -> None:
    """A scoring judge (offline, a reward model) gives a number per agent turn, not rubric answers.
    Its mean over a conversation's agent turns is judge_score, and 100 x that stands in for persona
    consistency; where it exposes its features, 100 x the mean cosine of a turn with the user's
    latest message (clipped at 0) stands in for response relevance. results.md marks both with *."""
    states = []
    for n, k, t in flat:
        conv = convs[n]
        states.append(judge_state(personas.find(t.speaker), conv.turns[:k], conv.context.situation))
    texts = [t.text for _, _, t in flat]
    scores = judge.score_many(states, texts)
    context = None
    if hasattr(judge, "features_many"):
        context = [max(0.0, f["context"]) for f in judge.features_many(states, texts)]
    for r in records:
        mine = [j for j, (n, _, _) in enumerate(flat) if n == r["index"]]
        if not mine:
            continue
        metrics = r["metrics"]
        metrics["judge_score"] = sum(scores[j] for j in mine) / len(mine)
        metrics["persona_consistency"] = 100 * metrics["judge_score"]
        if context is not None:
            metrics["response_relevance"] = 100 * sum(context[j] for j in mine) / len(mine)


def persona_identification(identifier, convs, flat) -> list[dict]:
    """The independent evaluator (extras/evaluators.py): per agent turn, (speaker, situation, the
    turns before it as (speaker, text), the turn) -> {"correct", "log_ratio", "correct_equal"}.
    It asks the frozen base model which card makes the turn most likely; no stage trained on it."""
    if identifier is None or not flat:
        return []
    items = []
    for n, k, t in flat:
        history = [(u.speaker, u.text) for u in convs[n].turns[:k]]
        items.append((t.speaker, convs[n].context.situation, history, t.text))
    return identifier.score(items)


def redundancy(texts: list[str], encoder, nli) -> dict:
    """The redundancy between one conversation's agent turns: the paper's Self-BLEU and NLI relation
    rates (entailment = restating or agreeing), distinct-n (Li et al. 2016), and two of ours from
    sentence embeddings (near-paraphrase rate, mean cosine). A pairwise one is None for one turn."""
    emb = encoder.embed(texts)  # (turns, D)
    values = {
        "self_bleu": self_bleu(texts),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "semantic_redundancy": semantic_redundancy_rate(emb),
        "mean_similarity": mean_pairwise_similarity(emb),
    }
    if nli is not None:
        relation_rates = nli_rates(texts, *nli) or dict.fromkeys(NLI_RELATIONS)
        values.update({f"nli_{k}": v for k, v in relation_rates.items()})
    return values


def persona_function_means(jobs: list[dict]) -> dict:
    """Does each turn do its persona's job (ESConv's strategies), averaged over the conversation."""
    return {
        f"persona_{k}": mean_or_none([x[k] for x in jobs]) for k in ("function", "function_equal")
    }


def persona_id_means(ids: list[dict]) -> dict:
    """The evaluator's per-turn answers averaged over the conversation; correct_equal reads only
    the first 32 tokens of a turn, so a longer turn cannot win on length alone."""
    return {
        "persona_id_accuracy": mean_or_none([x["correct"] for x in ids]),
        "persona_log_ratio": mean_or_none([x["log_ratio"] for x in ids]),
        "persona_id_equal": mean_or_none([x["correct_equal"] for x in ids]),
    }


# --- Intervals and paired changes ------------------------------------------------------------------
def summarise(values: list, seed: int) -> dict:
    """Mean and 95% bootstrap interval of the values that are there (None is no score, not 0)."""
    kept = [v for v in values if v is not None]
    mean, lo, hi = bootstrap_ci(kept, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "n": len(kept)}


def aggregate(records: list[dict], keys: list[str], seed: int) -> dict:
    """Each metric's summary over the conversations (the unit resampled: conversations are drawn
    independently, the turns of one are not)."""
    return {k: summarise([r["metrics"].get(k) for r in records], seed) for k in keys}


def paired_changes(entries: dict, keys: list[str], seed: int) -> dict:
    """System minus the reference, conversation by conversation (same context, profile and seeds),
    with a 95% bootstrap interval over the paired differences: pairing removes what the context
    and the user contribute, so the interval is usually narrower than two separate means'."""
    base = entries.get(REFERENCE, {}).get("conversations")
    if not base:
        return {}
    changes = {}
    for name, e in entries.items():
        if name != REFERENCE:
            changes[name] = {k: paired_difference(e["conversations"], base, k, seed) for k in keys}
    return changes


def paired_difference(convs: list[dict], base: list[dict], key: str, seed: int) -> dict:
    """summarise() of convs[i] - base[i] for metric `key`, over the pairs where both have a value."""
    diffs = []
    for a, b in zip(convs, base):
        if a["metrics"].get(key) is not None and b["metrics"].get(key) is not None:
            diffs.append(a["metrics"][key] - b["metrics"][key])
    return summarise(diffs, seed)


def slice_fields(records: list[dict]) -> list[str]:
    """The paper's slices that vary here: ED valence, QMSum domain, the profile and its Big Five trait."""
    fields = ("valence", "domain", "profile", "trait")
    return [f for f in fields if len({r[f] for r in records}) > 1]


def slice_summaries(records: list[dict], fields: list[str], keys: list[str], seed: int) -> dict:
    """{field: {value: {"n", "metrics"}}}: aggregate() within each slice ("-" for no value)."""
    out = {}
    for f in fields:
        out[f] = {}
        for value in sorted({r[f] or "-" for r in records}):
            group = [r for r in records if (r[f] or "-") == value]
            out[f][value] = {"n": len(group), "metrics": aggregate(group, keys, seed)}
    return out


def pairwise(cfg: EvalConfig, entries: dict, identifier: bool = True) -> dict:
    """A vs B per conversation (same context, profile and seeds), with an exact two-sided sign test
    (the paper's test of its human preferences): the higher persona log-ratio wins (the
    independent evaluator), or with --pairwise-by judge (also without the evaluator) the judge's
    mean score of the agent turns, an LLM judge's agent overall; None or equal is a tie."""
    a, b = pairwise_systems(cfg.pairwise)
    by = cfg.pairwise_by if identifier else "judge"
    if a not in entries or b not in entries:
        line = f"pairwise {a} vs {b}: not run (both must run in this evaluation)"
        return {"a": a, "b": b, "line": line}
    keys = ("persona_log_ratio",) if by == "persona-id" else ("judge_score", "agent_overall")
    pairs = zip(entries[a]["conversations"], entries[b]["conversations"])
    outcomes = [preference(x, y, keys) for x, y in pairs]
    s = win_rate(outcomes)
    if by == "persona-id":
        how = (
            "the independent evaluator (the frozen base model's persona log-ratio), "
            "which training never used"
        )
    else:
        how = "the judge; see 'Who measured each column' for whether training used it"
    rate = "-" if s["win_rate"] is None else format(s["win_rate"], ".3f")
    line = (
        f"**{a} vs {b}**, {len(outcomes)} conversation pairs: {a} wins {s['wins']}, loses "
        f"{s['losses']}, ties {s['ties']}; win rate {rate} (ties left out); exact two-sided "
        f"binomial p = {s['p_value']:.4g}; decided by {how}."
    )
    return {"a": a, "b": b, "decided_by": by, "outcomes": outcomes, **s, "line": line}


def pairwise_systems(spec: str) -> tuple[str, str]:
    """--pairwise A,B checked: two different systems."""
    names = [s.strip() for s in spec.split(",")]
    if len(names) != 2 or names[0] == names[1] or any(n not in SYSTEM_NAMES for n in names):
        raise UserError(
            f"--pairwise {spec}: give two different systems as A,B from " + ", ".join(SYSTEM_NAMES)
        )
    return names[0], names[1]


def preference_score(record: dict, keys: tuple) -> float | None:
    """The first of `keys` this conversation has a value for, else None."""
    for k in keys:
        if record["metrics"].get(k) is not None:
            return record["metrics"][k]
    return None


def preference(x: dict, y: dict, keys: tuple) -> str:
    """Conversation x against its pair y: "A" when x scores higher, "B" when lower, else "tie"."""
    sx = preference_score(x, keys)
    sy = preference_score(y, keys)
    if sx is None or sy is None or sx == sy:
        return "tie"
    return "A" if sx > sy else "B"


# --- Running the systems -----------------------------------------------------------------------------
def choose_systems(
    spec: str, folders: dict[str, str], how: str = ""
) -> tuple[list[System], dict[str, str]]:
    """The systems to run, and {name: why skipped}: a system whose model folder is missing is skipped
    with the command that makes it (`how`: the flags to repeat, e.g. " --run R"); nothing stands in."""
    if spec.strip() == "all":
        names = list(SYSTEM_NAMES)
    else:
        names = [s.strip() for s in spec.split(",") if s.strip()]
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
    chosen = []
    skipped = {}
    for s in SYSTEMS:
        if s.name not in names:
            continue
        missing = [k for k in (s.speakers, s.order) if k in make and not model_exists(folders[k])]
        if missing:
            skipped[s.name] = f"no model at {folders[missing[0]]}; make it with: {make[missing[0]]}"
        else:
            chosen.append(s)
    return chosen, skipped


def model_exists(folder: str) -> bool:
    """A trained model saved there, or a served one (openai:), which is checked when loaded."""
    return bool(loading.trained_or(folder, "")) or folder.startswith("openai:")


def plan_conversations(contexts: list, n: int, profile_ids: list[str]) -> list[tuple]:
    """(context, profile) of every conversation, the same for every system: each of the first n
    contexts with every profile (the paper: 50 x 10 = 500). c0, c1 x p, q -> (c0,p) (c0,q) (c1,p) (c1,q)."""
    return [(c, p) for c in contexts[:n] for p in profile_ids]


def profile_ids(spec: str, profiles: dict) -> list[str]:
    """'all' -> the profiles with one trait set high or low (the paper's ten); 'a,b' -> those, checked."""
    if spec.strip() == "all":
        one_trait = [pid for pid, p in profiles.items() if p.trait() not in ("average", "mixed")]
        return one_trait or list(profiles)
    ids = [p.strip() for p in spec.split(",") if p.strip()]
    if not ids or any(p not in profiles for p in ids):
        raise UserError(
            f"--profiles {spec}: use 'all' or ids from the profiles file: {', '.join(profiles)}"
        )
    return ids


@dataclass(frozen=True)
class Schedule:
    """How every conversation runs, the same for every system (the flags of the same names)."""

    turns: int  # agent turns per conversation
    user_every: int  # the simulated user speaks after every this many agent turns
    max_new_tokens: int  # per reply
    seed: int  # conversation i gets seed + i, in every system (simulate.run_conversations)


@dataclass
class Setup:
    """What every system of one evaluation shares: the conversations, the models, the evaluators."""

    inputs: Inputs  # the persona cards and the user profiles (mascot.load_inputs)
    contexts: list  # conversation i's context ...
    profiles: list[str]  # ... and its simulated user's profile (plan_conversations)
    schedule: Schedule
    roles: dict  # "base" | "trained" | "sft" | "trained-director" | "user" -> (model, tok)
    names: dict  # the same keys -> what the model is (a folder, a name), for the tables
    fewshot: list  # data/fewshot.json's examples for the few-shot styles
    evaluators: Evaluators
    guard: object  # the crisis guard (extras/safety.py), or None
    pipelines: dict  # pipeline name -> speak(convs, directives, cast) (extras/baselines.py)


def speaking_order(system: System, setup: Setup):
    """Who speaks next: the fixed roster order, a random agent (MASCOT-C), or a director, untrained
    (prompted with the same directive format) or trained in stage 2."""
    personas = setup.inputs.personas
    if system.order == "round-robin":
        return RoundRobin(personas)
    if system.order == "random":
        return RandomOrder(personas, setup.schedule.seed)
    if system.order == "prompted-director":
        model, tok = setup.roles["base"]
        return LLMDirector(model, tok, personas, "prompted-director")
    if system.order == "trained-director":
        model, tok = setup.roles["trained-director"]
        return LLMDirector(model, tok, personas)
    raise ValueError(f"unknown speaking order {system.order}")


def director_label(system: System, setup: Setup) -> str:
    """The director column of results.md: the order, or the director's model."""
    if system.order == "prompted-director":
        return f"prompted: {setup.names['base']}"
    if system.order == "trained-director":
        return f"trained: {setup.names.get('trained-director')}"
    if system.order == "random":
        return "random order"
    return system.order


def simulate_system(system: System, setup: Setup, cfg: EvalConfig) -> tuple[list, object]:
    """The system's conversations, all advanced together, and the policy that ordered them. Every
    system meets the same contexts, users and seeds (setup), so only the system differs."""
    schedule = setup.schedule
    speaker_model, speaker_tok = setup.roles[system.speakers]
    user_model, user_tok = setup.roles["user"]
    examples = setup.fewshot if system.style in EXAMPLE_STYLES else []
    cast = Cast(
        role_setting(setup.inputs.personas, cfg.role_setting),
        speaker_model,
        speaker_tok,
        user_model,
        user_tok,
        schedule.max_new_tokens,
        style=system.style,
        examples=examples,
        guard=setup.guard,
    )
    if system.pipeline:  # a multi-call baseline speaks instead of one call per turn
        cast.speak = setup.pipelines[system.pipeline](system)
    policy = speaking_order(system, setup)
    convs = run_conversations(
        setup.contexts,
        policy,
        cast,
        setup.inputs.profiles,
        setup.profiles,
        TurnPlan(schedule.turns, schedule.user_every),
        schedule.seed,
        desc=f"{system.name}, agent turns",
    )
    return convs, policy


def crisis_flags(convs) -> list[dict]:
    """Every message the crisis guard flagged, with its conversation's context."""
    flags = []
    for c in convs:
        for e in c.events:
            flags.append({"context_id": c.context.id, **e})
    return flags


def run_system(system: System, setup: Setup, cfg: EvalConfig, keys: list[str]) -> tuple[list, dict]:
    """Simulate one system's conversations and score them: (the conversations, its results entry)."""
    t0 = time.time()
    convs, policy = simulate_system(system, setup, cfg)
    t1 = time.time()
    records, unreadable = score_conversations(convs, setup.inputs.personas, setup.evaluators)
    for r in records:
        r["trait"] = setup.inputs.profiles[r["profile"]].trait()  # the Big Five slice
    simulated = t1 - t0
    scored = time.time() - t1
    print(
        f"{system.name}: {len(convs)} conversations simulated in {simulated:.0f} s, "
        f"scored in {scored:.0f} s",
        flush=True,
    )
    speakers = setup.names[system.speakers]
    entry = {
        "about": system.about,
        "speakers": f"{system.speakers}: {speakers}, {system.style} prompt",
        "director": director_label(system, setup),
        "judge": setup.evaluators.judge.name,
        "n": len(convs),
        "seconds": round(time.time() - t0, 1),
        "metrics": aggregate(records, keys, setup.schedule.seed),
        "unreadable": dict(unreadable),
        "crisis_flags": crisis_flags(convs),
        # (unparseable, all) directives: a director's malformed output is counted, not hidden
        "directives": [getattr(policy, "invalid", 0), getattr(policy, "total", 0)],
        "conversations": records,
    }
    return convs, entry


def run_or_resume(
    systems: list[System], setup: Setup, cfg: EvalConfig, keys: list[str], out: Path, protocol: dict
) -> tuple[dict, list]:
    """{name: results entry} of every system, and the transcript rows. Each finished system is saved
    at once (out/partial/NAME.json) with what ITS numbers depend on (plumbing/results.py); a later
    run with the same keeps it, so an interrupted evaluation redoes only the unfinished systems."""
    entries = {}
    rows = []
    for system in systems:
        parts = (system.speakers, system.order, system.pipeline)  # what the system is made of
        saved = results.saved_system(out / "partial", system.name, parts, protocol)
        if saved:
            entries[system.name] = saved["entry"]
            sys_rows = saved["rows"]
            print(f"{system.name}: kept from the interrupted evaluation", flush=True)
        else:
            convs, entries[system.name] = run_system(system, setup, cfg, keys)
            sys_rows = [
                {"system": system.name, "index": i, **c.to_json()} for i, c in enumerate(convs)
            ]
            saved = {"entry": entries[system.name], "rows": sys_rows}
            results.save_system(out / "partial", system.name, parts, protocol, saved)
        rows += sys_rows
    return entries, rows


def run(
    cfg: EvalConfig, setup: Setup, systems: list[System], skipped: dict, out: Path, protocol: dict
) -> dict:
    """Run every system, score, write out/{transcripts.jsonl, results.json, results.md}.
    skipped: {system: why} (choose_systems); protocol: everything the numbers depend on (the
    summary line of results.md, the contexts, profiles, flags and model stamps)."""
    seed = setup.schedule.seed
    ev = setup.evaluators
    status = metric_status(ev)
    # The columns with a number, and a scoring judge's own mean (what --pairwise-by judge reads).
    keys = [k for k, v in status.items() if v in ("ok", "approximated")] + ["judge_score"]
    entries, rows = run_or_resume(systems, setup, cfg, keys, out, protocol)
    # The slices that vary over all systems' conversations, so every system has the same tables.
    all_records = []
    for e in entries.values():
        all_records += e["conversations"]
    fields = slice_fields(all_records)
    for e in entries.values():
        e["slices"] = slice_summaries(e["conversations"], fields, keys, seed)
    # Paired changes for the columns with a better direction, measured as asked: a stand-in's
    # change (approximated) would read as the rubric's.
    directed = [m.key for m in all_metrics() if m.better and status[m.key] == "ok"]
    evaluation = {
        "protocol": protocol,
        "judge": ev.judge.name,
        "status": status,
        "systems": entries,
        "skipped": skipped,
        "slice_fields": fields,
        "evaluators": training_use(ev.judge_spec, ev.trained_with, cfg, ev.function is not None),
        "changes": paired_changes(entries, directed, seed),
        "pairwise": pairwise(cfg, entries, ev.identifier is not None),
        "crisis_section": setup.guard.stops_section(entries) if setup.guard is not None else [],
    }
    markdown = results.results_markdown(evaluation, all_metrics(), rubric_criteria(), REFERENCE)
    files.write_jsonl(out / "transcripts.jsonl", rows)
    files.write_json(out / "results.json", results.json_safe(evaluation))
    files.write_text_atomic(out / "results.md", markdown)
    every = {s.name: (s.speakers, s.order, s.pipeline) for s in SYSTEMS}
    results.tidy_partials(out / "partial", entries, every, protocol)
    return evaluation
