"""plumbing/results.py: results.md, the evaluation's tables as markdown (skip on first reading).

evaluate.run hands over the finished results (the dict it also saves as results.json) and the
descriptions this file needs from the reading path: the metric columns (evaluate.all_metrics),
the rubric criteria (evaluate.rubric_criteria) and the reference system (evaluate.REFERENCE).
They come in as arguments, so plumbing/ never imports the reading path; nothing here decides a
number, it only lays the numbers out. extras/report.py turns the same markdown into HTML.

Also here: `json_safe` (NaN is not JSON), `cell` ("mean [lo, hi]") and `table` (a markdown
table), which the demo, the crisis guard and the human study reuse.
"""

import math
import shutil
from pathlib import Path

from plumbing import files
from plumbing.files import fingerprint, folder_stamp

# The columns of the per-slice tables: the overall rubric scores and the measures the paper's
# claims rest on (persona, redundancy, copying), so one table per slice stays readable.
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


def json_safe(value):
    """NaN is not JSON: null instead; tuples become lists (as they come back from JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def cell(s: dict | None, digits: int, status: str = "ok") -> str:
    """'mean [lo, hi]' ('(n=k)' when only k of the rows have a value), the reason a column has no
    number, '-' without a score, no interval for one value (one value has no spread)."""
    if status not in ("ok", "approximated"):
        return status
    if not s or s["mean"] is None:
        return "-"
    text = f"{s['mean']:.{digits}f}"
    if s["lo"] is not None:
        text += f" [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"
    if s.get("of") not in (None, s["n"]):
        text += f" (n={s['n']})"
    return text


def table(header: list[str], rows: list[list]) -> list[str]:
    """The lines of a markdown table, then a blank line; a '|' inside a cell is escaped."""
    lines = ["| " + " | ".join(header) + " |"]
    lines.append("|" + "|".join("--" for _ in header) + "|")
    for row in rows:
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |")
    return lines + [""]


def results_markdown(r: dict, metrics: list, criteria: dict, reference: str) -> str:
    """Protocol, systems, one table per metric group (skipped columns left out; n/a ones say why;
    * = approximated), paired changes against the reference ('!' = worse beyond the interval), who
    measured what, slices, crisis stops, pairwise, notes.

    metrics: evaluate.all_metrics() (key, title, group, digits, better), in table order;
    criteria: evaluate.rubric_criteria(); reference: the system the paired changes are against."""
    out = systems_section(r)
    out += metric_tables(r, metrics)
    out += change_table(r, metrics, reference)
    out += ["## Who measured each column, and did training use it", ""]
    out += table(
        ["columns", "evaluator", "used in training?"],
        [[e["columns"], e["evaluator"], e["used_in_training"]] for e in r["evaluators"]],
    )
    out += slice_tables(r, metrics)
    out += r.get("crisis_section", [])  # the guard's own table of its stops (extras/safety.py)
    out += ["## Pairwise preference", "", r["pairwise"]["line"], ""]
    out += ["## Notes", ""] + [f"- {n}" for n in notes(r, criteria)]
    return "\n".join(out) + "\n"


def systems_section(r: dict) -> list[str]:
    """The title, the protocol in one paragraph, and a line per system run or skipped."""
    out = ["# Evaluation", "", r["protocol"]["summary"], ""]
    out += [f"- **{n}**: {e['about']}" for n, e in r["systems"].items()]
    out += [f"- skipped **{n}**: {why}" for n, why in r["skipped"].items()]
    return out + [""]


def column_title(m, status: dict) -> str:
    """The column's title; '*' when a scoring judge's stand-in approximates the rubric."""
    if status[m.key] == "approximated":
        return m.title + "*"
    return m.title


def metric_tables(r: dict, metrics: list) -> list[str]:
    """One table per metric group; the first also names each system's speakers, director and judge."""
    status = r["status"]
    out = []
    for i, group in enumerate(dict.fromkeys(m.group for m in metrics)):
        cols = [m for m in metrics if m.group == group and not status[m.key].startswith("skipped")]
        if not cols:
            continue
        first = i == 0
        head = ["system", "speakers", "director", "judge", "n"] if first else ["system", "n"]
        rows = []
        for name, e in r["systems"].items():
            row = [name]
            if first:
                row += [e["speakers"], e["director"], e["judge"]]
            row.append(e["n"])
            for m in cols:
                row.append(
                    cell({**e["metrics"].get(m.key, {}), "of": e["n"]}, m.digits, status[m.key])
                )
            rows.append(row)
        out += [f"## {group}", ""]
        out += table(head + [column_title(m, status) for m in cols], rows)
    return out


def change_cell(c: dict, m) -> str:
    """A paired change, with '!' when it is worse than the reference beyond its interval."""
    worse = False
    if c["lo"] is not None:
        worse = c["hi"] < 0 if m.better > 0 else c["lo"] > 0
    if worse:
        return cell(c, 3) + " !"
    return cell(c, 3)


def change_table(r: dict, metrics: list, reference: str) -> list[str]:
    """Each system minus the reference, over the columns with a direction (evaluate.paired_changes)."""
    cols = [m for m in metrics if any(m.key in c for c in r["changes"].values())]
    if not cols:
        return []
    rows = [[n] + [change_cell(c[m.key], m) for m in cols] for n, c in r["changes"].items()]
    return [
        f"## Paired change against {reference} (same contexts, profiles and seeds; 95% bootstrap "
        "over conversation pairs; ! = worse beyond the interval)",
        "",
    ] + table(["system"] + [f"Δ {m.title}" for m in cols], rows)


def slice_tables(r: dict, metrics: list) -> list[str]:
    """One table per slice field (valence, domain, profile, trait) over the HEADLINE columns."""
    status = r["status"]
    head = [m for m in metrics if m.key in HEADLINE and status[m.key] in ("ok", "approximated")]
    out = []
    for field in r["slice_fields"]:
        rows = []
        for name, e in r["systems"].items():
            for value, s in e["slices"][field].items():
                row = [name, value, s["n"]]
                row += [cell({**s["metrics"][m.key], "of": s["n"]}, m.digits) for m in head]
                rows.append(row)
        out += [f"## Per {field}", ""]
        out += table(["system", field, "n"] + [column_title(m, status) for m in head], rows)
    return out


def notes(r: dict, criteria: dict) -> list[str]:
    """How to read the tables; criteria: evaluate.rubric_criteria() (to count the questions asked)."""
    judge = r["judge"]
    systems = r["systems"]
    out = [
        "[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples); '-' = "
        "no score (no agent turn, or fewer than two turns for a redundancy metric); one value has "
        "no interval; (n=k): only k rows have a value"
    ]
    if any(v == "approximated" for v in r["status"].values()):
        out.append(
            f"* approximated: the {judge.split(':')[0]} judge cannot read rubrics, so persona "
            "consistency = 100 x its mean score of the agent turns and response relevance = 100 x "
            "the mean cosine of a turn with the user's latest message; every other rubric column, "
            "and so Overall, needs an LLM judge (--judge hf:<model or folder> or openai:<base url>)"
        )
    else:
        unreadable = sum(sum(e["unreadable"].values()) for e in systems.values())
        out.append(
            f"unparseable judge answers: {unreadable} of {questions_asked(systems, criteria)}, "
            "left out of the means"
        )
    if r["status"].get("nli_entailment", "").startswith("skipped"):
        out.append(
            "NLI relation rates skipped: no --nli-model given (any MNLI-style classifier folder)"
        )
    for n, e in systems.items():
        invalid, total = e["directives"]
        if total:
            out.append(
                f"{n}: {invalid} of {total} directives unparseable (the least-spoken agent spoke)"
            )
    return out


def questions_asked(systems: dict, criteria: dict) -> int:
    """The rubric questions put to an LLM judge: every agent criterion of every agent turn, and
    every collective criterion of every conversation with an agent turn."""
    asked = 0
    for e in systems.values():
        for c in e["conversations"]:
            asked += c["agent_turns"] * len(criteria["agent"])
            asked += (c["agent_turns"] > 0) * len(criteria["collective"])
    return asked


# --- Saved systems: an interrupted evaluation keeps what finished -----------------------------
# evaluate.run_or_resume saves each finished system in RUN/eval/partial/NAME.json beside what its
# numbers depend on: the protocol every system shares, and of the protocol's "own" part (a trained
# model's stamp, a pipeline's settings, keyed by what a system is made of) only its own, so a
# changed flag that no system's numbers depend on, or another system's model, keeps it.


def evaluation_protocol(args, cfg, inputs, setup, folders: dict[str, str], data_file) -> dict:
    """Everything the numbers depend on: results.md's opening summary, the conversations, the
    judge, the flags, the input files (data_file: the contexts --data names) and the models' stamps. A system saved by an interrupted
    evaluation is reused only where what ITS numbers depend on is the same (system_protocol), so
    the flags that choose what to run, compare or print are left out."""
    profiles = list(dict.fromkeys(setup.profiles))
    contexts = len({c.id for c in setup.contexts})
    summary = (
        f"{len(setup.contexts)} conversations per system: {contexts} held-out '{args.set}' "
        f"contexts of `{args.data}` x {len(profiles)} profile(s) ({', '.join(profiles)}); "
        f"{inputs.split}; seed {args.seed}; {args.turns} agent turns, the user every "
        f"{args.user_every}; {cfg.role_setting} persona cards; simulated user "
        f"{args.user or args.model}; every system sees the same contexts, profiles and seeds."
    )
    # What one kind of system alone depends on, by System.speakers, .order or .pipeline (evaluate.
    # system_protocol): a trained model by its stamp, not its path, a pipeline by its settings.
    own = {
        "trained": [folder_stamp(folders["trained"]), args.speakers_model],
        "sft": [folder_stamp(folders["sft"])],
        "trained-director": [folder_stamp(folders["trained-director"]), args.director_model],
        "self-consistency": [cfg.sc_samples, cfg.sc_pick],
    }
    # What no system's numbers depend on: what runs or is compared, where and how it is reported,
    # how long a served request may wait; and the flags `own` holds.
    left_out = (
        "systems run pairwise pairwise_by quiet argv human served_timeout served_retries "
        "served_concurrency sft speakers director speakers_model director_model sc_samples sc_pick"
    ).split()
    data = fingerprint(data_file, args.personas, args.profiles_file)
    return {
        "summary": summary,
        "contexts": [c.id for c in setup.contexts],
        "profiles": setup.profiles,
        "judge": setup.evaluators.judge.name,
        "config": {k: v for k, v in vars(args).items() if k not in left_out},
        # The files of the contexts, cards and users (by content); the base and user models.
        "inputs": [data, folder_stamp(args.model), folder_stamp(args.user or args.model)],
        "own": own,
    }


def training_judges(run: Path) -> dict[int, str]:
    """{stage: the --judge it trained with}, from the stages' config.json: results.md says whether
    training used this evaluation's judge (a score training pushed up is weaker evidence)."""
    judges = {}
    for stage in (1, 2):
        config = run / f"stage{stage}" / "config.json"
        if config.is_file():
            judges[stage] = files.read_json(config).get("judge", "offline")
        else:
            judges[stage] = "offline (assumed: no config.json)"
    return judges


def system_protocol(parts: tuple, protocol: dict) -> dict:
    """What one system's numbers depend on; parts: what it is made of (its speakers, order and
    pipeline, evaluate.System)."""
    own = {k: v for k, v in protocol.get("own", {}).items() if k in parts}
    return json_safe({**protocol, "own": own})


def saved_system(folder: Path, name: str, parts: tuple, protocol: dict) -> dict | None:
    """The system as saved in folder, if saved under its system_protocol."""
    part = folder / f"{name}.json"
    saved = files.read_json(part) if part.is_file() else {}
    ok = isinstance(saved, dict) and saved.get("protocol") == system_protocol(parts, protocol)
    return saved if ok else None


def save_system(folder: Path, name: str, parts: tuple, protocol: dict, saved: dict) -> None:
    """A finished system's entry and rows, under its system_protocol (written atomically)."""
    record = {"protocol": system_protocol(parts, protocol), **saved}
    files.write_json(folder / f"{name}.json", json_safe(record))


def tidy_partials(folder: Path, entries: dict, every: dict, protocol: dict) -> None:
    """Once results.json is written: a saved system this evaluation did not include (another
    --systems) that a later one could reuse stays in partial/; the rest (in the results, or saved
    under another protocol) goes, and partial/ with it when nothing stays. every: {name: parts}."""
    keep = set()
    for name, parts in every.items():
        if name not in entries and saved_system(folder, name, parts, protocol):
            keep.add(name)
    for part in folder.glob("*.json"):
        if part.stem not in keep:
            part.unlink()
    if keep:
        print(f"kept in {folder} for an evaluation that runs them: {', '.join(sorted(keep))}")
    else:
        shutil.rmtree(folder, ignore_errors=True)
