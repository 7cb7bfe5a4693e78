"""mascot.py: the one entry point. Every stage of MASCOT is a subcommand.

    python mascot.py train --stage 1    Phase I: candidates -> AI judge -> preference pairs ->
                                        reward model (Bradley-Terry) -> GRPO on the speakers
    python mascot.py train --stage 2    Phase II: frozen speakers + simulated user; GRPO on the
                                        director over N-turn rollouts
    python mascot.py evaluate           compare systems on held-out contexts, with 95% CIs
    python mascot.py sft                the SFT baseline: the base model on ESConv supporter turns
    python mascot.py simulate           write conversations for contexts, a profile and a policy
    python mascot.py chat               talk to the group yourself
    python mascot.py report             one HTML page with the curves, tables and conversations
    python mascot.py judge-eval         measure a judge on labelled preference pairs
    python mascot.py judge-stress       best-of-N: does optimising the judge / reward model pick hacks?
    python mascot.py demo               all of the above on the embedded model, sized for a CPU
    python mascot.py COMMAND --help     every flag, with its default
    torchrun --nproc_per_node N -- mascot.py train ...   the same training, data-parallel (parallel.py)

Each command writes into a run folder (default runs/default):

    runs/default/stage1/  config.json states.jsonl candidates.jsonl judge_cache.jsonl pairs.jsonl
                          reward_model/ metrics.jsonl samples/ checkpoints/ speakers/ summary.json
    runs/default/stage2/  config.json decision_points.jsonl warm_start.json director_warm/
                          metrics.jsonl samples/ checkpoints/ director/ summary.json
    runs/default/sft/     config.json model/ summary.json
    runs/default/eval/    config.json transcripts.jsonl results.md results.json [human.md human.json]
                          (partial/ while it runs: each finished system, for a resumed evaluation)
    served_cache.jsonl    in a stage's or eval's folder when a role is served (--speakers openai:...)

This file only wires the stages together: read it top to bottom to see the whole pipeline, and
follow the calls into the module that does each part (the README's reading order). The settings
of the algorithms are declared once, next to the code that uses them (grpo.GRPOConfig,
reward.RLAIFConfig, director.DirectorConfig, director.RewardWeights); `add_options` turns each of
their fields into a flag. Bad input never shows a traceback: every user-facing problem raises
data.UserError, printed here as one line, and the process exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import NamedTuple

import chat
import corpora
import data
import director as dr
import evaluate
import grpo
import human
import judge_eval
import models
import parallel
import persona_id
import report
import reward
import sft
from data import Context, PersonaSet, Profile, UserError, flag_type
from judge import judge_from_flags
from metrics import paired_change
from simulate import Cast, assign_profiles, run_conversations, write_transcripts

ROOT = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# Flags (one configuration surface: each flag is declared once, here or as an `option` field)
# ----------------------------------------------------------------------------------------------

def add_options(group, cls, prefix: str = "") -> None:
    """One flag per `option` field of a settings dataclass: `--group-size` for group_size.

    The default, the help text and the valid range come from the field (data.option), so they
    are written once, beside the algorithm. A bool becomes a --x / --no-x pair.
    """
    for f in dataclasses.fields(cls):
        if "help" not in f.metadata:
            continue                                   # a fixed choice of the algorithm, not a flag
        name = "--" + prefix + f.name.replace("_", "-")
        dest = (prefix + f.name).replace("-", "_")
        check, default, help_text = f.metadata["check"], f.default, f.metadata["help"]
        if isinstance(default, bool):
            group.add_argument(name, dest=dest, action=argparse.BooleanOptionalAction, default=default,
                               help=help_text)
        elif isinstance(check, list):
            group.add_argument(name, dest=dest, choices=check, default=default, help=help_text)
        else:
            group.add_argument(name, dest=dest, type=flag_type(name, type(default), check), default=default,
                               help=help_text)


def options(cls, args, prefix: str = "", **given):
    """The settings dataclass `cls` filled from the parsed flags (plus `given` non-flag fields)."""
    values = {f.name: getattr(args, (prefix + f.name).replace("-", "_"))
              for f in dataclasses.fields(cls) if "help" in f.metadata}
    return cls(**values, **given)


def add_model_flags(p) -> None:
    """What every command that runs a model needs."""
    p.add_argument("--model", default=models.EMBEDDED,
                   help="base model: smollm2-135m (embedded), tiny (random, tests), a folder, or a hub id")
    p.add_argument("--personas", default=str(ROOT / "personas.json"), help="persona file")
    p.add_argument("--set", default="support", help="persona set in the persona file (support | meeting)")
    p.add_argument("--run", default="runs/default", help="run folder for every artifact")
    p.add_argument("--seed", type=int, default=0, help="one seed for everything (data split, sampling)")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--max-new-tokens", type=flag_type("--max-new-tokens", int, "positive"), default=48,
                   help="longest generated turn (speakers and simulated user), in tokens")


def add_data_flags(p) -> None:
    """Where the contexts and simulated users come from, and which contexts are held out."""
    p.add_argument("--data", default="bundled",
                   help="contexts: 'bundled' or a dataset file/folder (Empathetic Dialogues CSV/JSONL, "
                        "ESConv JSON/JSONL, QMSum folder; see corpora.py)")
    p.add_argument("--profiles-file", default=str(ROOT / "data" / "profiles.json"),
                   help="Big Five simulated-user profiles")
    p.add_argument("--held-out", type=flag_type("--held-out", float, "fraction"), default=0.25,
                   help="share of contexts kept for held-out evaluation (never trained on)")


def add_judge_flags(p) -> None:
    p.add_argument("--judge", default="offline",
                   help="offline (default) | hf:<model id or folder> | openai:<base url> | rm:<folder>")
    p.add_argument("--judge-model", default=None, help="model name for an openai: judge")
    p.add_argument("--judge-timeout", type=flag_type("--judge-timeout", float, "positive"), default=60.0,
                   help="openai: judge: seconds per request in total (connect, wait and reply), retried after")
    p.add_argument("--judge-retries", type=flag_type("--judge-retries", int, "non-negative"), default=5,
                   help="openai: judge: retries per request after HTTP 429/5xx, a refused connection or a "
                        "timeout (backoff doubles, at most 60 s, also for the server's Retry-After)")
    p.add_argument("--judge-concurrency", type=flag_type("--judge-concurrency", int, "positive"), default=8,
                   help="openai: judge: requests in flight at once (a batching server such as vLLM works on "
                        "them together); each judgement is cached as it arrives")


def add_trained_flags(p) -> None:
    """Which trained models a command uses; by default the run folder's, else the base model."""
    p.add_argument("--speakers", default=None,
                   help="speaker model (default: RUN/stage1/speakers if it exists, else --model), or "
                        "openai:<base url> for a served one")
    p.add_argument("--director", default=None,
                   help="director model (default: RUN/stage2/director if it exists, else --model), or "
                        "openai:<base url> for a served one")


def add_served_flags(p, user: bool = True, director: bool = True) -> None:
    """Frozen roles served by an OpenAI-compatible server (openai_client.ServedModel): the
    speakers, the simulated user and (evaluate, simulate, chat) the director."""
    g = p.add_argument_group("served models (--speakers / --user / --director openai:<base url>)")
    g.add_argument("--speakers-model", default=None, help="the served model's name for --speakers openai:...")
    if user:
        g.add_argument("--user", default=None,
                       help="simulated-user model (default: --model): a folder, a hub id, or openai:<base url>")
        g.add_argument("--user-model", default=None, help="the served model's name for --user openai:...")
    if director:
        g.add_argument("--director-model", default=None, help="the served model's name for --director openai:...")
    g.add_argument("--served-timeout", type=flag_type("--served-timeout", float, "positive"), default=120.0,
                   help="seconds per request in total (connect, wait and reply), retried after")
    g.add_argument("--served-retries", type=flag_type("--served-retries", int, "non-negative"), default=5,
                   help="retries per request after HTTP 429/5xx, a refused connection or a timeout")
    g.add_argument("--served-concurrency", type=flag_type("--served-concurrency", int, "positive"), default=8,
                   help="requests in flight at once; each reply is cached (RUN/.../served_cache.jsonl) as it arrives")


def add_conversation_flags(p, turns: bool = True) -> None:
    if turns:
        p.add_argument("--turns", type=flag_type("--turns", int, "positive"), default=4,
                       help="agent turns per conversation")
    p.add_argument("--user-every", type=flag_type("--user-every", int, "non-negative"), default=2,
                   help="the simulated user answers after every N agent turns (0: never)")


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    parser = argparse.ArgumentParser(prog="mascot.py", description=__doc__.split("\n")[0],
                                     formatter_class=formatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train stage 1 (speakers) or stage 2 (director)", formatter_class=formatter)
    t.add_argument("--stage", type=int, choices=[1, 2], required=True)
    add_model_flags(t)
    add_data_flags(t)
    add_judge_flags(t)
    g = t.add_argument_group("GRPO (grpo.GRPOConfig)")
    add_options(g, grpo.GRPOConfig)
    g.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")
    add_options(t.add_argument_group("stage 1 (reward.RLAIFConfig)"), reward.RLAIFConfig)
    s2 = t.add_argument_group("stage 2 (director.DirectorConfig, director.RewardWeights)")
    add_options(s2, dr.DirectorConfig)
    add_options(s2, dr.RewardWeights, prefix="w-")
    add_conversation_flags(s2, turns=False)
    s2.add_argument("--speakers", default=None,
                    help="frozen speaker model (default: RUN/stage1/speakers if it exists, else --model), or "
                         "openai:<base url> for a served one")
    s2.add_argument("--director-model", default=None, help="initial director, trained here (default: --model)")
    add_served_flags(t, director=False)

    j = sub.add_parser("judge-eval", help="accuracy of a judge on labelled preference pairs",
                       formatter_class=formatter)
    j.add_argument("--pairs", required=True, nargs="+", help="JSONL file(s) of labelled pairs (data/README.md)")
    add_judge_flags(j)
    j.add_argument("--cache", default=None, help="judge cache file (JSONL); none by default")

    st = sub.add_parser("judge-stress", help="best-of-N: does picking the top reply by the judge (and the "
                        "reward model) pick reward hacks?", formatter_class=formatter)
    add_model_flags(st)
    add_data_flags(st)
    add_judge_flags(st)
    st.add_argument("--speakers", default=None, help="the policy to sample from (default: --model)")
    st.add_argument("--rm", default=None,
                    help="reward model folder to test too (default: RUN/stage1/reward_model if it exists)")
    st.add_argument("--n", type=flag_type("--n", int, "at-least-2"), default=16, help="candidates per state")
    st.add_argument("--states", type=flag_type("--states", int, "positive"), default=16,
                    help="held-out states (context, persona, conversation so far)")
    st.add_argument("--temperature", type=flag_type("--temperature", float, "positive"), default=1.0,
                    help="sampling temperature of the candidates")
    st.add_argument("--persona-id", action=argparse.BooleanOptionalAction, default=True,
                    help="also score every candidate with the independent evaluator (persona_id.py, the "
                         "frozen --model): does a grader's pick stay in role more often than chance?")

    s = sub.add_parser("simulate", help="simulate conversations and write transcripts", formatter_class=formatter)
    add_model_flags(s)
    add_data_flags(s)
    add_trained_flags(s)
    add_served_flags(s)
    add_conversation_flags(s)
    s.add_argument("--contexts", type=flag_type("--contexts", int, "positive"), default=4, help="how many contexts")
    s.add_argument("--policy", default="round-robin", choices=["round-robin", "random", "least-spoken", "director"],
                   help="speaker selection")
    s.add_argument("--profile", default="average", help="Big Five profile id, or 'all'")
    s.add_argument("--out", default=None, help="transcript file (default RUN/simulate/<policy>.jsonl)")

    e = sub.add_parser("evaluate", help="compare systems: rubric judges, redundancy, pairwise preference",
                       formatter_class=formatter)
    add_model_flags(e)
    add_data_flags(e)
    add_judge_flags(e)
    add_trained_flags(e)
    add_served_flags(e)
    add_conversation_flags(e)
    g = e.add_argument_group("evaluate")
    g.add_argument("--systems", default="all",
                   help="comma-separated subset of " + ", ".join(evaluate.SYSTEM_NAMES)
                        + "; 'all' = every system whose checkpoints exist")
    g.add_argument("--contexts", type=flag_type("--contexts", int, "positive"), default=8,
                   help="held-out contexts to evaluate on (8 keeps a CPU run to minutes)")
    g.add_argument("--profiles", default="average",
                   help="simulated-user profile ids (comma-separated), or 'all' = the 10 one-trait Big Five "
                        "profiles; every context is crossed with every profile (the paper: 50 x 10)")
    g.add_argument("--role-setting", default="full", choices=["full", "name"],
                   help="what every system's speaker prompt shows of each persona: the full card, or only "
                        "name and role (an ablation)")
    g.add_argument("--sft", default=None, help="SFT baseline model (default: RUN/sft/model; python mascot.py sft)")
    g.add_argument("--sc-samples", type=flag_type("--sc-samples", int, "at-least-2"), default=5,
                   help="self-consistency: zero-shot-CoT samples per turn")
    g.add_argument("--sc-pick", default="majority", choices=["majority", "judge"],
                   help="self-consistency: keep the sample the others agree with most, or the judge's best")
    g.add_argument("--persona-id", action=argparse.BooleanOptionalAction, default=True,
                   help="score persona consistency with the frozen base model (persona_id.py; 4 forward "
                        "passes per agent turn)")
    g.add_argument("--nli-model", default=None,
                   help="folder or hub id of an MNLI-style sequence classifier for the NLI redundancy "
                        "rates; skipped when not given")
    g.add_argument("--pairwise", default=None,
                   help="A,B: compare system A with system B per conversation "
                        "(default mascot,round-robin when both ran)")
    g.add_argument("--pairwise-by", default="persona-id", choices=["persona-id", "judge"],
                   help="who decides the pairwise preference: the independent evaluator or --judge")
    g.add_argument("--add", action="store_true",
                   help="keep the systems already in RUN/eval (same contexts, profiles, seeds, judge and flags) "
                        "and add or redo only --systems")
    g.add_argument("--human", default=None,
                   help="JSONL of human judgements (extras/annotate.py): print the sign test, Mann-Whitney U "
                        "and kappa, write RUN/eval/human.{md,json}; no model is run")

    f = sub.add_parser("sft", help="the SFT baseline: fine-tune the base model on ESConv supporter turns",
                       formatter_class=formatter)
    add_model_flags(f)
    add_data_flags(f)
    f.add_argument("--steps", type=flag_type("--steps", int, "positive"), default=40, help="AdamW steps")
    f.add_argument("--batch-size", type=flag_type("--batch-size", int, "positive"), default=4,
                   help="examples per step")
    f.add_argument("--lr", type=flag_type("--lr", float, "positive"), default=3e-5, help="learning rate")
    f.add_argument("--heldout-examples", type=flag_type("--heldout-examples", int, "positive"), default=32,
                   help="supporter turns of held-out dialogues whose loss is printed before and after")

    c = sub.add_parser("chat", help="talk to the companion group in the terminal", formatter_class=formatter)
    add_model_flags(c)
    add_trained_flags(c)
    add_served_flags(c, user=False)
    c.add_argument("--policy", choices=["director", "round-robin", "random", "least-spoken"], default="director",
                   help="who answers: the LLM director, or a fixed rule")
    c.add_argument("--show-directives", action="store_true",
                   help="print the director's [Agent / Action / Tone] before each reply")
    c.add_argument("--agents-per-turn", type=flag_type("--agents-per-turn", int, "positive"), default=2,
                   help="how many agents answer each of your messages")

    r = sub.add_parser("report", help="write RUN/report.html: curves, tables, conversations",
                       formatter_class=formatter)
    r.add_argument("--run", default="runs/default", help="run folder")

    d = sub.add_parser("demo", help="the whole pipeline on the embedded model with a CPU budget",
                       formatter_class=formatter)
    d.add_argument("--run", default="runs/demo", help="run folder")
    d.add_argument("--model", default=models.EMBEDDED, help="base model")
    return parser


# ----------------------------------------------------------------------------------------------
# Shared set-up: one run's inputs
# ----------------------------------------------------------------------------------------------

class Inputs(NamedTuple):
    personas: PersonaSet
    train: list[Context]          # contexts training may use
    held_out: list[Context]       # contexts only the before/after checks and evaluation see
    profiles: dict[str, Profile]  # Big Five profile id -> profile
    split: str = ""               # how train and held_out were chosen, for the results


def load_inputs(args, earlier: list[Path] = ()) -> Inputs:
    """Personas, the train / held-out contexts and the profiles the flags name, all checked.

    `earlier`: config.json files of the stages this command builds on; their split must match
    (data.check_split), so that no context one stage trained on is held out by the next.
    """
    data.check_split(args, earlier)
    personas = data.load_personas(args.personas, args.set)
    # A dataset folder with official splits: train on train, evaluate on test (else valid); see corpora.py.
    splits = corpora.load_splits(args.data, persona_set=args.set)
    if "train" in splits and len(splits) > 1:
        held_name = "test" if "test" in splits else "valid"
        train, held = splits["train"], splits[held_name]
        split = f"official splits: training uses 'train' ({len(train)}), evaluation '{held_name}' ({len(held)})"
    else:
        contexts = ([c for part in splits.values() for c in part] if splits
                    else corpora.load_contexts(args.data, persona_set=args.set))
        if len(contexts) < 2:
            raise UserError(f"--data {args.data}: only {len(contexts)} '{args.set}' context(s); need at least 2")
        train, held = data.split_contexts(contexts, args.held_out, seed=args.seed)
        if not held:
            raise UserError(f"--held-out {args.held_out}: no context of the {len(contexts)} in --data is held "
                            "out; raise --held-out (the default is 0.25)")
        split = f"random split, held-out fraction {args.held_out}" + (
            f" (the folder holds only the '{next(iter(splits))}' split)" if splits else "")
    profiles = {p.id: p for p in data.load_profiles(args.profiles_file)}
    return Inputs(personas, train, held, profiles, split)


def load_speakers_and_user(args, speakers_name: str, cache: Path) -> tuple[tuple, tuple]:
    """The frozen speakers and simulated user, each (model, tokenizer). One local model plays both
    parts when they are the same; a served role (openai:) has its own model name, so is its own."""
    speakers = models.load_role(speakers_name, "speakers", args, cache)
    user_name = args.user or args.model
    if user_name == speakers_name and speakers[1] is not None:
        return speakers, speakers
    return speakers, models.load_role(user_name, "user", args, cache)


def save_model(model, tok, folder: Path) -> Path:
    with data.atomic_folder(folder) as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return folder


# ----------------------------------------------------------------------------------------------
# train: one stage, in one process or under torchrun (parallel.py)
# ----------------------------------------------------------------------------------------------

def train(args) -> dict:
    """`mascot.py train --stage 1|2`. Under `torchrun --nproc_per_node N` every process runs this;
    they split each GRPO batch (parallel.py) and rank 0 alone prints, writes and checks."""
    args.device = parallel.init(args.device)
    try:
        parallel.check_share(args.prompts_per_step)     # before stage 1's candidates and judge
        if not parallel.is_main():
            sys.stdout = open(os.devnull, "w")       # one log, rank 0's; errors still reach stderr
        return (train_stage1 if args.stage == 1 else train_stage2)(args)
    finally:
        parallel.close()


# ----------------------------------------------------------------------------------------------
# Stage 1: persona-aware behavioural alignment (RLAIF, then GRPO on the speakers)
# ----------------------------------------------------------------------------------------------

def train_stage1(args) -> dict:
    out = Path(args.run) / "stage1"
    main = parallel.is_main()
    inputs = load_inputs(args)
    if args.resume and grpo.latest_checkpoint(out / "checkpoints") is None:
        # Say so before the reward model and the held-out replies, not after them (stage 2 too).
        raise UserError(f"--resume: no GRPO checkpoint in {out / 'checkpoints'} yet; run without --resume "
                        "(the states, candidates, judgements and a finished reward model are reused either way)")
    if main:
        data.save_config(args, out)
    base, tok = models.load_model(args.model, device=args.device, frozen=True)   # samples, and is the reference
    judge = judge_from_flags(args, out / "judge_cache.jsonl")

    # Steps 1-4 of the paper's Phase I: states -> candidates -> judge -> pairs -> reward model.
    # Under torchrun rank 0 does them (judge calls are paid once); the others then read its files.
    if not main:
        parallel.barrier()
    rlaif = reward.build_reward_fn(options(reward.RLAIFConfig, args), inputs, base, tok, judge, out,
                                   args.model, args.max_new_tokens, args.seed, args.device)
    if main:
        parallel.barrier()

    # Step 5: GRPO on the speakers, reward = reward-model score + format_weight * format reward.
    cfg = options(grpo.GRPOConfig, args, seed=args.seed, max_new_tokens=args.max_new_tokens)
    policy, _ = models.load_model(args.model, device=args.device)

    def held_out_check(when: str) -> dict:
        result = reward.heldout_reward(policy, tok, rlaif.held_states, inputs.personas, rlaif.reward_fn,
                                       cfg.max_new_tokens, cfg.temperature, cfg.seed)
        print(f"held-out mean reward {when}: {result['reward']:.3f} ± {result['se']:.3f} (se) "
              f"(rm {result['rm']:.3f}, format {result['format']:.3f}; {result['n']} replies)")
        return result

    def sample_prompts(step):
        chosen = grpo.sample_batch(rlaif.train_states, cfg, step)
        return [s.prompt(inputs.personas) for s in chosen], chosen

    def reward_fn(meta, texts, gen):
        return rlaif.reward_fn([m for m in meta for _ in range(cfg.group_size)], texts, gen.finished)

    def describe(meta, texts, rewards):
        return [{"state": meta[i // cfg.group_size].id, "persona": meta[i // cfg.group_size].persona,
                 "reply": t, "reward": r} for i, (t, r) in enumerate(zip(texts, rewards))]

    before = held_out_check("before GRPO") if main else None
    grpo.train_grpo(policy, tok, sample_prompts, reward_fn, cfg, out, ref_model=base if cfg.beta > 0 else None,
                    resume=args.resume, describe=describe)
    if not main:
        return {}
    after = held_out_check("after GRPO ")
    after["change"], after["change_se"] = paired_change(before["rewards"], after["rewards"])
    print(f"held-out change: {after['change']:+.3f} ± {after['change_se']:.3f} (paired se; same states and seeds)")
    speakers = save_model(policy, tok, out / "speakers")
    summary = {"pairs": len(rlaif.pairs), "reward_model": rlaif.rm_metrics, "heldout_before": before,
               "heldout_after": after, "judge": judge.name, "model": args.model, "speakers": str(speakers)}
    data.write_json(out / "summary.json", summary)
    print(f"stage 1 done: speakers saved to {speakers}")
    return summary


# ----------------------------------------------------------------------------------------------
# Stage 2: collaborative dialogue optimisation (GRPO on the director)
# ----------------------------------------------------------------------------------------------

def train_stage2(args) -> dict:
    run = Path(args.run)
    out = run / "stage2"
    inputs = load_inputs(args, earlier=[run / "stage1" / "config.json"])
    if args.resume and grpo.latest_checkpoint(out / "checkpoints") is None:
        # Say so before minutes of decision points and held-out rollouts, not after them.
        raise UserError(f"--resume: no complete checkpoint in {out / 'checkpoints'}; run without --resume")
    main = parallel.is_main()                  # under torchrun: rank 0 writes and runs the held-out checks
    if main:
        data.save_config(args, out)
    speakers_name = args.speakers or models.trained_or(run / "stage1" / "speakers", args.model)
    print(f"stage 2: speakers from {speakers_name} (frozen), simulated user {args.user or args.model} (frozen)")
    (speaker_model, speaker_tok), (user_model, user_tok) = load_speakers_and_user(args, speakers_name,
                                                                                  out / "served_cache.jsonl")
    director_name = args.director_model or args.model
    policy, tok = models.load_model(director_name, device=args.device)
    judge = judge_from_flags(args, out / "judge_cache.jsonl")
    cast = Cast(inputs.personas, speaker_model, speaker_tok, user_model, user_tok, args.max_new_tokens)

    # Decision points: conversation prefixes at different positions, generated once by the frozen cast.
    dcfg = options(dr.DirectorConfig, args)
    ids = sorted(inputs.profiles)
    train_points = dr.build_decision_points(inputs.train, dcfg.decision_points, cast, inputs.profiles, ids,
                                            args.user_every, args.seed)
    held_points = dr.build_decision_points(inputs.held_out, dcfg.heldout_points, cast, inputs.profiles, ids,
                                           args.user_every, args.seed + 1)
    if main:
        dr.save_decision_points(out / "decision_points.jsonl", train_points, held_points)
    rollout = dr.Rollout(cast, inputs.profiles, inputs.personas, models.SentenceEncoder(device=args.device),
                         judge, options(dr.RewardWeights, args, prefix="w-"), dcfg.rollout_turns, args.user_every)

    director = dr.LLMDirector(policy, tok, inputs.personas)
    rollout.follow = director          # turns 2..N of every training rollout: the director itself, greedy

    def heldout(label: str, policy_, when: str) -> dict:
        """Evaluate on the held-out points; the rollouts go to heldout_<label>.jsonl, not the summary."""
        result = rollout.evaluate(policy_, held_points, args.seed)
        data.write_jsonl(out / f"heldout_{label}.jsonl", result.pop("rollouts"))
        print(f"held-out mean group reward {when}: {dr.describe_heldout(result)}")
        return result

    # "prompted": the initial director (--director-model, else --model) before any training; with
    # --director-warmup 0 and a director trained elsewhere, that is the director GRPO starts from.
    before = (heldout("prompted", director, f"before training (the initial director {director_name}, prompted)")
              if dcfg.eval_prompted and main else None)
    heuristic = heldout("least-spoken", dr.LeastSpoken(inputs.personas), "of the least-spoken rule") if main else None
    # The warm start's targets: ESConv's strategies (training split only) or random agents.
    n_examples = dcfg.director_warmup * 4
    if dcfg.director_warmup_data:
        esconv = corpora.load_contexts(dcfg.director_warmup_data, persona_set=args.set)
        esconv_train, _ = data.split_contexts(esconv, args.held_out, seed=args.seed)
        examples = sft.esconv_examples(esconv_train, inputs.personas, n_examples, args.seed,
                                       repeats=dcfg.warmup_repeats)
        source = (f"ESConv strategy warm start: {len(esconv_train)} training dialogues of "
                  f"{dcfg.director_warmup_data}"
                  f"{'' if dcfg.warmup_repeats else ', turns that repeat the last companion left out'}")
    else:
        examples = sft.format_examples(inputs.personas, train_points, n_examples, args.seed)
        source = "format warm start: random agents"
    # Under torchrun rank 0 warm-starts; GRPO then starts every rank from rank 0's weights.
    warm = sft.warm_start(dcfg, out, policy, tok, inputs.personas, examples, source, held_points, rollout,
                         args.seed, args.resume) if main else None
    parallel.barrier()
    # The KL anchor is the director GRPO starts from: the warm-started one when the warm start ran.
    cfg = options(grpo.GRPOConfig, args, seed=args.seed, max_new_tokens=dr.DIRECTIVE_MAX_TOKENS)
    ref = (models.load_model(str(out / "director_warm") if dcfg.director_warmup else director_name,
                             device=args.device, frozen=True)[0] if cfg.beta > 0 else None)

    def sample_prompts(step):
        chosen = grpo.sample_batch(train_points, cfg, step)
        return [dr.director_messages(inputs.personas, c) for c in chosen], chosen

    def reward_fn(meta, texts, gen):
        return rollout.score_directives(meta, texts, cfg.group_size)

    def describe(meta, texts, rewards):
        return [{"context": meta[i // cfg.group_size].context.id, "directive": t, "reward": r}
                for i, (t, r) in enumerate(zip(texts, rewards))]

    grpo.train_grpo(policy, tok, sample_prompts, reward_fn, cfg, out, ref_model=ref, resume=args.resume,
                    describe=describe)
    if not main:
        return {}
    after = heldout("trained", director, "after training")
    # Paired changes on the same points and seeds: trained vs warm start, trained vs least-spoken.
    vs = {"least-spoken": dr.compare(after, heuristic)}
    if before:
        vs["prompted"] = dr.compare(after, before)
    if warm:
        vs["warm-start"] = dr.compare(after, warm["heldout"])
    for name, c in vs.items():
        print(f"held-out group reward, trained - {name}: {c['change']:+.3f} ± {c['se']:.3f} (paired se, "
              f"{c['n']} points)")
    folder = save_model(policy, tok, out / "director")
    summary = {"heldout_before": before, "heldout_least_spoken": heuristic, "warm_start": warm,
               "heldout_after": after, "paired_vs": vs, "speakers": speakers_name,
               "judge": judge.name, "model": args.model, "director": str(folder),
               "invalid_directives": rollout.invalid, "directives": rollout.total}
    data.write_json(out / "summary.json", summary)
    print(f"stage 2 done: director saved to {folder}")
    return summary


# ----------------------------------------------------------------------------------------------
# judge-eval, simulate, evaluate
# ----------------------------------------------------------------------------------------------

def judge_eval_cmd(args) -> None:
    judge = judge_from_flags(args, args.cache)
    pairs = [p for path in args.pairs for p in judge_eval.load_pairs(path)]
    t0 = time.time()
    result = judge_eval.evaluate_pairs(judge, pairs)
    print(judge_eval.format_eval_report(result))
    print(f"({result['n']} pairs, {result['no_verdict']} without a verdict, {result['unreadable']} of them "
          f"unreadable; judge {judge.name}, {time.time() - t0:.1f} s)")


def judge_stress(args) -> dict:
    """Best-of-N against the judge and the reward model on held-out states (judge_eval.best_of_n)."""
    run = Path(args.run)
    inputs = load_inputs(args, earlier=[run / "stage1" / "config.json"])
    policy, tok = models.load_model(args.speakers or args.model, device=args.device)
    states = reward.build_states(inputs.held_out, inputs.personas, args.states, args.seed + 1, {}, "heldout")
    judge = judge_from_flags(args, None)
    scorers = {"judge": lambda rows, replies: judge.score_many([s.judge_state(inputs.personas) for s in rows],
                                                               replies)}
    rm_folder = args.rm or models.trained_or(run / "stage1" / "reward_model", "")
    if rm_folder:
        rm, rm_tok = reward.RewardModel.load(rm_folder, device=args.device)
        scorers["rm"] = lambda rows, replies: rm.score_texts(rm_tok, [s.rm_messages(inputs.personas, r)
                                                                      for s, r in zip(rows, replies)])
    identifier = None
    if args.persona_id:       # the frozen base model, even when --speakers names a trained policy
        base = (policy, tok) if not args.speakers else models.load_model(args.model, device=args.device, frozen=True)
        identifier = persona_id.PersonaIdentifier(*base, inputs.personas, args.model)
    features = None
    if hasattr(judge, "features_many"):       # the offline judge: which of its features agree with the evaluator
        features = lambda rows, replies: judge.features_many([s.judge_state(inputs.personas) for s in rows],  # noqa: E731
                                                             replies)
    result = judge_eval.best_of_n(policy, tok, states, inputs.personas, scorers, args.n, args.max_new_tokens,
                                  args.temperature, args.seed, identifier, features)
    result.update({"judge": judge.name, "rm": rm_folder or None, "policy": args.speakers or args.model})
    print(judge_eval.format_best_of_n(result))
    data.write_json(run / "stress" / "results.json", result)
    print(f"judge {judge.name}; reward model {rm_folder or 'none'}; wrote {run / 'stress' / 'results.json'}")
    return result


def simulate_cmd(args) -> None:
    run = Path(args.run)
    inputs = load_inputs(args)
    contexts = (inputs.held_out + inputs.train)[:args.contexts]
    ids = sorted(inputs.profiles) if args.profile == "all" else [
        p.id for p in data.load_profiles(args.profiles_file, [args.profile])]
    speakers_name = args.speakers or models.trained_or(run / "stage1" / "speakers", args.model)
    cache = run / "simulate" / "served_cache.jsonl"
    (speaker_model, speaker_tok), user = load_speakers_and_user(args, speakers_name, cache)
    director = None
    if args.policy == "director":
        name = args.director or models.trained_or(run / "stage2" / "director", args.model)
        director = models.load_role(name, "director", args, cache)
    policy = dr.make_policy(args.policy, inputs.personas, director, args.seed)
    cast = Cast(inputs.personas, speaker_model, speaker_tok, user[0], user[1], args.max_new_tokens)
    convs = run_conversations(contexts, policy, cast, inputs.profiles, assign_profiles(len(contexts), ids, args.seed),
                              args.turns, args.user_every, args.seed)
    out = Path(args.out) if args.out else run / "simulate" / f"{args.policy}.jsonl"
    write_transcripts(out, convs)
    for c in convs[:2]:
        print(f"--- {c.context.id} ({c.profile}, {c.policy})")
        for t in c.turns:
            print(f"{t.speaker}: {t.text}")
    print(f"wrote {len(convs)} conversations to {out}")


def evaluate_cmd(args) -> dict:
    run = Path(args.run)
    if args.human:
        return human.run(args)
    inputs = load_inputs(args, earlier=[run / f for f in ("stage1/config.json", "stage2/config.json", "sft/config.json")])
    data.save_config(args, run / "eval")
    return evaluate.run(args, inputs)


def sft_cmd(args) -> dict:
    """The SFT baseline (sft.py): the base model fine-tuned on the training split's strategy-labelled
    supporter turns, saved to RUN/sft/model; the held-out loss is printed before and after."""
    out = Path(args.run) / "sft"
    inputs = load_inputs(args)
    data.save_config(args, out)
    train = sft.supporter_examples(inputs.train, inputs.personas)
    held = sft.supporter_examples(inputs.held_out, inputs.personas)[:args.heldout_examples]
    if not train:
        raise UserError(f"--data {args.data}: no strategy-labelled supporter turns in the training split; the "
                        "SFT baseline learns from ESConv (ESConv.json or an ESConv .jsonl)")
    random.Random(args.seed).shuffle(train)
    print(f"sft: {len(train)} supporter turns from {len(inputs.train)} training dialogues ({inputs.split}); "
          f"{len(held)} held-out turns")
    model, tok = models.load_model(args.model, device=args.device)
    before = sft.mean_nll(model, tok, held) if held else float("nan")
    print(f"held-out loss before: {before:.3f} nats per token")
    losses = sft.supervised_finetune(model, tok, train, args.steps, args.batch_size, args.lr,
                                     log=lambda line: print(line.replace("warm start", "sft step")),
                                     micro_batch=1)
    after = sft.mean_nll(model, tok, held) if held else float("nan")
    print(f"held-out loss after:  {after:.3f} nats per token")
    folder = save_model(model, tok, out / "model")
    summary = {"train_examples": len(train), "heldout_examples": len(held), "heldout_loss_before": before,
               "heldout_loss_after": after, "losses": losses, "model": args.model, "sft": str(folder)}
    data.write_json(out / "summary.json", summary)
    print(f"sft done: model saved to {folder}")
    return summary


# ----------------------------------------------------------------------------------------------
# demo: every stage on the embedded model, sized for a 2-core CPU (make demo)
# ----------------------------------------------------------------------------------------------

# The budget flags of `make demo`. They are small on purpose: the point is to see every stage
# run and print real numbers in minutes on a laptop. For a real run on a GPU, drop them (the
# defaults of `train --help` are larger) and raise --steps, --states and --decision-points.
DEMO_STAGE1 = ["--states", "10", "--heldout-states", "4", "--candidates", "4", "--steps", "4",
               "--prompts-per-step", "2", "--group-size", "4", "--max-new-tokens", "32", "--lr", "1e-5",
               "--rm-epochs", "1", "--save-every", "2", "--dump-every", "2"]
# Stage 2 starts with 8 supervised steps that teach the 135M director the three-line format
# (without them it writes no parseable directive and GRPO gets no signal; sft.py).
DEMO_STAGE2 = ["--decision-points", "6", "--heldout-points", "4", "--steps", "3", "--prompts-per-step", "2",
               "--group-size", "4", "--rollout-turns", "2", "--max-new-tokens", "32", "--lr", "1e-5",
               "--beta", "0", "--director-warmup", "8", "--warmup-lr", "1e-4", "--save-every", "3",
               "--dump-every", "3"]
# The prompted-director and few-shot-CoT baselines are left out of the demo to save ~2 minutes;
# `python mascot.py evaluate --run runs/demo` runs every system.
DEMO_EVAL = ["--contexts", "4", "--turns", "4", "--max-new-tokens", "32",
             "--systems", "zero-shot,round-robin,mascot-p,mascot-c,mascot"]


def demo(args) -> dict:
    """Stage 1, stage 2, evaluation and the report, each skipped when already complete, each
    resumed from its newest checkpoint when interrupted (re-run `make demo` to continue)."""
    run = Path(args.run)
    common = ["--model", args.model, "--run", str(run)]
    t0 = time.time()

    def so_far() -> str:
        return f"{time.time() - t0:.0f} s so far, peak memory {data.peak_rss_gb():.1f} GB"
    for stage, budget in ((1, DEMO_STAGE1), (2, DEMO_STAGE2)):
        folder = run / f"stage{stage}"
        if (folder / "summary.json").exists():
            print(f"demo: stage {stage} already done in {folder}")
            continue
        resume = ["--resume"] if grpo.latest_checkpoint(folder / "checkpoints") else []
        print(f"\n=== demo: stage {stage} ({so_far()}) ===")
        sub = build_parser().parse_args(["train", "--stage", str(stage), *common, *budget, *resume])
        (train_stage1 if stage == 1 else train_stage2)(sub)
        drop_resume_checkpoints(folder)
    print(f"\n=== demo: evaluation ({so_far()}) ===")
    results = evaluate_cmd(build_parser().parse_args(["evaluate", *common, *DEMO_EVAL]))
    path = report.build_report(run)
    print_side_by_side(run / "eval" / "transcripts.jsonl")
    print(f"\ndemo finished ({so_far()}); results in {run}/eval/results.md, report: {path}")
    return results


def drop_resume_checkpoints(folder: Path) -> None:
    """Remove a finished stage's GRPO checkpoints (the demo only). They exist to resume an
    interrupted stage; once summary.json and the final model are written nothing reads them, and
    with AdamW's two moments each holds 3x the model (~1.6 GB for SmolLM2-135M, two kept per
    stage). `train` keeps them, so a finished run can still be inspected step by step."""
    checkpoints = folder / "checkpoints"
    if (folder / "summary.json").exists() and checkpoints.is_dir():
        size = sum(f.stat().st_size for f in checkpoints.rglob("*") if f.is_file())
        shutil.rmtree(checkpoints)
        print(f"demo: {folder.name} finished; its resume checkpoints removed ({size / 1e9:.1f} GB)")


def print_side_by_side(transcripts: Path, width: int = 60) -> None:
    """One conversation before (base speakers, round-robin) and after training (mascot, else an
    ablation), same context, printed in two columns."""
    if not transcripts.exists():
        return
    by_system: dict[str, list[dict]] = {}
    for r in data.read_jsonl(transcripts):
        by_system.setdefault(r.get("system", ""), []).append(r)
    before = by_system.get("round-robin") or next(iter(by_system.values()), [])
    after_name = next((n for n in ("mascot", "mascot-c", "mascot-p") if n in by_system), None)
    if not before or not after_name:
        return
    a = before[0]
    b = next((r for r in by_system[after_name] if r["context_id"] == a["context_id"]), by_system[after_name][0])

    def lines(conv):
        out = []
        for t in conv["turns"]:
            out += textwrap.wrap(f"{t['speaker']}: {t['text']}", width) + [""]
        return out

    left, right = lines(a), lines(b)
    print(f"\n{'before: round-robin, base speakers':<{width}} | after: {after_name}")
    print("-" * width + "-+-" + "-" * width)
    for i in range(max(len(left), len(right))):
        print(f"{(left[i] if i < len(left) else ''):<{width}} | {right[i] if i < len(right) else ''}")


# ----------------------------------------------------------------------------------------------
# main
# ----------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)       # one line per step shows up as it happens
    if os.environ.get("MASCOT_LOW_MEMORY") == "1":
        data.return_freed_memory()                    # a lower peak for ~20 % slower sampling
    try:
        if args.command == "train":
            train(args)
        elif args.command == "judge-eval":
            judge_eval_cmd(args)
        elif args.command == "judge-stress":
            judge_stress(args)
        elif args.command == "simulate":
            simulate_cmd(args)
        elif args.command == "evaluate":
            evaluate_cmd(args)
        elif args.command == "sft":
            sft_cmd(args)
        elif args.command == "chat":
            return chat.run_chat(args)
        elif args.command == "report":
            print(f"report written to {report.build_report(Path(args.run))}")
        elif args.command == "demo":
            demo(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: checkpoints and the judge cache are on disk; re-run with --resume to continue",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
