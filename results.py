"""results.py: how an evaluation's numbers are shown and kept: the tables of results.md, the notes
under them, the table of who measured each column and whether training used that evaluator, and
the results an evaluation reuses (`--add`; the systems an interrupted run had finished).

Where it sits in MASCOT: after evaluate.py. evaluate.py measures every conversation and
aggregates (means with bootstrap intervals per system and slice, paired changes); it hands this
file one results dict, which is also saved as results.json. Everything here reads only that dict
(the column titles and decimals travel inside it), so the tables can be rebuilt from the JSON:

    python results.py runs/default/eval/results.json       # prints results.md again

Nothing here computes a statistic; the formulas are in metrics.py, the choices in evaluate.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import data
from data import UserError
from simulate import Conversation

SHOWN = ("ok", "approximated")     # statuses with numbers; any other status is the reason there are none


def json_safe(value):
    """NaN is not JSON: write null instead (an empty CI, a win rate with no decided pair)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def format_cell(summary: dict, digits: int, n_rows: int) -> str:
    """'mean [lo, hi]', with '(n=k)' when only k of the row's n_rows conversations have a value
    (no agent turn, or no readable judge answer); or the reason there is no number."""
    if summary["status"] not in SHOWN:
        return summary["status"]
    if not summary["n"]:
        return "n/a (no score)"
    d = digits
    cell = f"{summary['mean']:.{d}f} [{summary['lo']:.{d}f}, {summary['hi']:.{d}f}]"
    return cell if summary["n"] == n_rows else f"{cell} (n={summary['n']})"


def markdown_table(header: list[str], rows: list[list[str]], n_left: int = 5) -> str:
    """A markdown table: the first n_left columns (names) aligned left, the numbers right."""
    lines = ["| " + " | ".join(header) + " |",
             "|" + "|".join(":--" if i < n_left else "--:" for i in range(len(header))) + "|"]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def column_title(m: dict, status: dict[str, str]) -> str:
    return m["title"] + ("*" if status[m["key"]] == "approximated" else "")


def results_markdown(results: dict) -> str:
    """The whole report: protocol, systems, the metric tables, paired changes, who measured each
    column, slice tables, pairwise, notes."""
    status, systems = results["status"], results["systems"]
    out = ["# Evaluation", "", results["protocol"]["summary"], ""]
    out += [f"- **{name}**: {e['about']}" for name, e in systems.items()] + [""]
    for i, group in enumerate(results["columns"]):
        shown = [m for m in group["metrics"] if not status[m["key"]].startswith("skipped")]
        if not shown:
            continue
        head = ["system", "speakers", "director", "judge", "n"] if i == 0 else ["system", "n"]
        header = head + [column_title(m, status) for m in shown]
        rows = []
        for name, e in systems.items():
            row = [name] + ([e["speakers"], e["director"], e["judge"]] if i == 0 else []) + [str(e["n"])]
            row += [format_cell(e["metrics"][m["key"]], m["digits"], e["n"]) for m in shown]
            if group["crisis"]:
                row.append(f"{e['crisis_conversations']} of {e['n']}, {e['crisis_turn_share']:.3f} of turns")
            rows.append(row)
        if group["crisis"]:
            header.append("stopped conversations, their share of turns")
        out += [f"## {group['title']}", "", markdown_table(header, rows, len(head)), ""]
    out += change_section(results)
    out += ["## Who measured each column, and did training use it", "",
            markdown_table(["columns", "evaluator", "used in training?"],
                           [[", ".join(r["columns"]), r["evaluator"], r["used_in_training"]]
                            for r in results["evaluators"]], 3), ""]
    titles = {m["key"]: m for g in results["columns"] for m in g["metrics"]}
    headline = [titles[k] for k in results["headline"] if status[k] in SHOWN]
    for field in results["slice_fields"]:
        rows = [[name, value, str(sl["n"])] + [format_cell(sl["metrics"][m["key"]], m["digits"], sl["n"]) for m in headline]
                for name, e in systems.items() for value, sl in e["slices"][field].items()]
        out += [f"## Per {field}", "", markdown_table(["system", field, "n"] + [column_title(m, status) for m in headline],
                                                      rows, 3), ""]
    out += crisis_section(systems)
    out += ["## Pairwise preference", "", results["pairwise"]["line"], ""]
    out += ["## Notes", ""] + [f"- {note}" for note in results["notes"]]
    return "\n".join(out) + "\n"


def crisis_section(systems: dict) -> list[str]:
    """Every message the crisis guard flagged, once, with the systems it stopped, so a reader can
    judge each stop: a real risk, or ordinary talk the guard misread (safety.py, docs/SAFETY.md).
    The opening message is the same in every system; later ones are the simulated user's."""
    seen: dict[tuple, dict] = {}
    for name, e in systems.items():
        for f in e.get("crisis_flags", []):
            row = seen.setdefault((f["context_id"], f["turn"], f["text"]), {**f, "systems": []})
            row["systems"].append(name)
    if not seen:
        return []
    rows = [[r["context_id"], str(r["turn"]), r["text"].replace("\n", " ")[:200],
             r["category"], "-" if r["score"] is None else f"{r['score']:+.2f}", ", ".join(r["systems"])]
            for r in seen.values()]
    return ["## Crisis-guard stops: every flagged message", "",
            "score = the probe's logit minus its threshold (> 0: the probe alone flags; a pattern category "
            "flags at any score; - : not read by the probe)", "",
            markdown_table(["context", "turn", "message", "category", "score", "stopped"], rows, 6), ""]


def change_section(results: dict) -> list[str]:
    """The paired-change table against the reference system; '!' marks a change whose whole
    interval lies on the bad side (a drop of the persona columns, a rise of copying, echoing...)."""
    changes, status = results["changes"], results["status"]
    keys = [(k, sign) for k, sign in results["change_keys"] if status[k] in SHOWN]
    if not changes or not keys:
        return []
    titles = {m["key"]: m["title"] for g in results["columns"] for m in g["metrics"]}
    rows = []
    for name, row in changes.items():
        cells = [name]
        for key, sign in keys:
            c, d = row[key], 1 if key == "words" else 3
            if not c["n"]:
                cells.append("n/a")
                continue
            worse = (sign > 0 and c["hi"] < 0) or (sign < 0 and c["lo"] > 0)
            cells.append(f"{c['mean']:+.{d}f} [{c['lo']:+.{d}f}, {c['hi']:+.{d}f}]" + (" !" if worse else ""))
        rows.append(cells)
    return [f"## Paired change against {results['reference']} (same contexts, profiles and seeds; 95% bootstrap "
            "over conversation pairs; ! = worse beyond the interval)", "",
            markdown_table(["system"] + [f"Δ {titles[k]}" for k, _ in keys], rows, 1), ""]


# ----------------------------------------------------------------------------------------------
# Who measured each column, and the notes under the tables
# ----------------------------------------------------------------------------------------------

def training_use(args, rubric_titles: list[str], independent_titles: list[str], hack_titles: list[str]) -> list[dict]:
    """For every group of columns: its evaluator, and whether a stage of training used it.

    The training judges are read from RUN/stage{1,2}/config.json (the --judge each stage ran
    with); a stage without a config is assumed to have used the default, 'offline'."""
    trained_with = {}
    for stage in (1, 2):
        config = Path(args.run) / f"stage{stage}" / "config.json"
        trained_with[stage] = (data.read_json(config).get("judge", "offline") if config.is_file()
                               else "offline (assumed: no config.json)")
    spec = args.judge.strip()
    uses = [f"stage {k}'s --judge" + (" (it labelled the reward model's preference pairs)" if k == 1
                                      else " (its coherence reward)")
            for k, j in trained_with.items() if j.split(" ")[0] == spec]
    if spec.startswith("rm:"):
        judge_use = "YES: a reward model is what stage 1's GRPO maximises"
    elif uses:
        judge_use = "YES: " + " and ".join(uses)
    else:
        judge_use = f"no (stage 1 used {trained_with[1]}, stage 2 {trained_with[2]})"
    rows = [{"columns": rubric_titles, "evaluator": f"judge {spec}", "used_in_training": judge_use}]
    if args.persona_id:
        rows.append({"columns": independent_titles,
                     "evaluator": f"frozen base model {args.model}: which persona card makes each turn most likely",
                     "used_in_training": "no: neither a reward nor a judge of any stage (with --beta > 0, stage 1's "
                                         "KL term anchors the speakers to this model under their OWN card only)"})
    rows += [{"columns": ["Self-BLEU", "distinct-1", "distinct-2"], "evaluator": "n-gram counts (metrics.py)",
              "used_in_training": "no; related: stage 2's non-redundancy term includes BLEU-2 overlap with earlier turns"},
             {"columns": ["semantic redundancy", "mean similarity"], "evaluator": "MiniLM sentence encoder",
              "used_in_training": "partly: the same encoder feeds the offline judge and stage 2's non-redundancy term"}]
    if args.nli_model:
        rows.append({"columns": ["NLI rates"], "evaluator": f"NLI classifier {args.nli_model}", "used_in_training": "no"})
    rows += [{"columns": hack_titles, "evaluator": "lexical rules (hacks.py)", "used_in_training": "stage 1: no (logged per step, never rewarded); stage 2: yes, the director's clean term"},
             {"columns": ["crisis stops"], "evaluator": "the crisis guard (safety.py)", "used_in_training": "no"},
             {"columns": ["pairwise preference"], "evaluator": "named in the pairwise line", "used_in_training":
              "no with --pairwise-by persona-id (the default); as the judge row with --pairwise-by judge"}]
    return rows


def result_notes(entries: dict, judge, status: dict[str, str], nli_given: bool, seed: int,
                 questions: tuple[int, int], approximated: dict[str, str]) -> list[str]:
    """The notes under the tables: what is approximated or missing, and how to read the numbers.
    questions: (rubric questions per agent turn, per conversation); approximated: {title: how}."""
    notes = []
    if judge.can_generate:
        convs = [r for e in entries.values() for r in e["conversations"]]
        asked = (sum(r["agent_turns"] for r in convs) * questions[0]
                 + sum(r["agent_turns"] > 0 for r in convs) * questions[1])
        bad = sum(sum(e["unparseable"].values()) for e in entries.values())
        notes.append(f"unparseable judge answers: {bad} of {asked}, left out of the means "
                     "(per system and metric in results.json)")
    else:
        notes.append(f"* approximated: the {judge.name.split(':')[0]} judge ({judge.name}) cannot read rubrics, so "
                     + "; ".join(f"{title} = {how}" for title, how in approximated.items())
                     + ". Every other rubric metric, and so Overall, is n/a: it needs an LLM judge "
                       "(--judge hf:<model or folder> or openai:<base url>).")
    silent = {n: sum(r["agent_turns"] == 0 for r in e["conversations"]) for n, e in entries.items()}
    if any(silent.values()):
        notes.append("conversations the crisis guard stopped before any agent spoke count in n and in "
                     "crisis stops but have no agent-turn metrics: "
                     + ", ".join(f"{n} {k}" for n, k in silent.items()))
    if not nli_given:
        notes.append("NLI relation rates skipped: no --nli-model given (any MNLI-style classifier folder)")
    for name, e in entries.items():
        if "directives" in e:
            notes.append(f"{name}: {e['invalid_directives']} of {e['directives']} directives unparseable "
                         "(the least-spoken agent spoke instead)")
        if "pipeline_unparseable" in e:
            notes.append(f"{name}: unparseable " + ", ".join(f"{k}s {v} of {e['pipeline_asked'][k]}"
                                                             for k, v in e["pipeline_unparseable"].items())
                         + " (a proposal left out; a vote not counted)")
    if status.get("persona_id_accuracy") in SHOWN:
        notes.append("persona ID accuracy: share of agent turns whose own card gives the frozen base model the "
                     "highest likelihood (chance = 1 / number of personas); persona log-ratio: log p(turn | own "
                     "card) minus the log of the mean p(turn | other card), per token (> 0: more typical of its own "
                     "persona); persona ID accuracy, first N tokens: the accuracy again from every agent turn's first N "
                     "tokens only (shorter turns left out), so longer replies cannot gain it by length. Its validity on "
                     "labelled pairs: README")
    notes.append("lower Self-BLEU, semantic redundancy (share of agent-turn pairs with cosine >= 0.8), "
                 "mean similarity and NLI entailment = less repetition; higher distinct-n = more varied wording")
    notes.append("hack rates: share of agent turns that repeat 6+ words in a row of the situation or a user "
                 "message (context copy), of the speaker's own persona card (persona-card copy), of an earlier "
                 "companion turn, its own or another's (history echo); that say the same 6 words or sentence twice "
                 "(repeats itself); that hold prompt text or a speaker label (meta/prompt "
                 "leak); with under 3 words (empty or trivial). Crisis stops: share of conversations the guard "
                 "ended; their share of turns: turns of stopped conversations / all turns")
    notes.append(f"[lo, hi] = 95% percentile bootstrap interval over conversations (1000 resamples, seed {seed})")
    return notes


# ----------------------------------------------------------------------------------------------
# Results kept from an earlier evaluation: --add, and an interrupted run's finished systems
# ----------------------------------------------------------------------------------------------

def earlier_systems(out: Path, protocol: dict, judge_name: str, status: dict,
                    redo: list[str]) -> tuple[dict, list]:
    """--add: the systems of the evaluation already in RUN/eval that this run does not redo, with
    their transcript rows. Only when it was made with the same protocol, judge and metric switches,
    so its numbers are the ones this run would compute (every system's seeds are its own)."""
    if not (out / "results.json").is_file():
        return {}, []
    old = data.read_json(out / "results.json")
    if ({k: old["protocol"].get(k) for k in protocol} != json_safe(protocol) or old.get("judge") != judge_name
            or old.get("status") != status):
        raise UserError(f"--add: {out / 'results.json'} was made with other contexts, profiles, turns, seed, "
                        "model, data, judge or metric flags; repeat those flags, or run without --add")
    keep = {n: e for n, e in old["systems"].items() if n not in redo}
    return keep, [r for r in data.read_jsonl(out / "transcripts.jsonl") if r["system"] in keep]


def folder_stamp(folder: str) -> list:
    """(name, size, modification time) of every file in a model folder: what changes when the
    model is trained again, so a saved system result is never reused for other weights."""
    path = Path(folder)
    if not path.is_dir():
        return [folder]                      # a model name (the base model): the name is the identity
    return sorted([str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns]
                  for f in path.rglob("*") if f.is_file())


def saved_system(out: Path, name: str, key: dict, contexts: list):
    """(conversations, entry, transcript rows) of a system an interrupted run finished with the
    same key, else None."""
    path = out / "partial" / f"{name}.json"
    if not path.is_file():
        return None
    saved = data.read_json(path)
    if saved.get("key") != key:
        return None
    convs = [Conversation.from_json(row, context) for row, context in zip(saved["rows"], contexts)]
    return convs, saved["entry"], saved["rows"]


if __name__ == "__main__":
    print(results_markdown(data.read_json(sys.argv[1] if len(sys.argv) > 1 else "runs/default/eval/results.json")),
          end="")
