"""mascot.py: the one entry point, and the two stages of MASCOT as short recipes. Read it top to
bottom for the whole pipeline (arXiv 2601.14230), then follow each step into the module that does it.

    python mascot.py train --stage 1    Phase I, persona alignment (RLAIF): (on ESConv, a warm start on
                                        human turns) -> states -> candidates -> AI judge -> preference
                                        pairs -> Bradley-Terry reward model -> GRPO on the speakers
    python mascot.py train --stage 2    Phase II, the director: frozen speakers + simulated user;
                                        warm start, then GRPO over N-turn rollouts
    python mascot.py evaluate           every system on held-out contexts, with 95% intervals
    python mascot.py demo               all of it, sized for a laptop CPU (extras/demo.py)
    python mascot.py COMMAND --help     every flag, with its default
`train_stage1` and `train_stage2` below are the paper's steps in order; `evaluate_cmd` is the
comparison. Tools beside the method live in extras/ (EXTRAS below); what the method needs but is
not the lesson (files, run folders, flags, model loading, devices, torchrun) is in plumbing/.

Each command writes into a run folder (default runs/default):
    stage1/  config.json states.jsonl candidates.jsonl judge_cache.jsonl pairs.jsonl reward_model/
             metrics.jsonl samples/ checkpoints/ speakers/ summary.json
             (on ESConv also speakers_warm/ speaker_warm_start.json)
    stage2/  config.json decision_points.jsonl warm_start.json director_warm/ metrics.jsonl
             samples/ checkpoints/ director/ summary.json
    eval/    config.json transcripts.jsonl results.md results.json (partial/ while it runs)
Every setting is declared once, beside the code that uses it (an `option` field of a settings
dataclass: grpo.GRPOConfig, reward.RLAIFConfig, director.DirectorConfig, evaluate.EvalConfig), and
becomes a flag here. Bad input (a UserError) and the machine's refusals (an OSError: a read-only
folder, a full disk) never show a traceback: main() prints one line, `error: ...`, and exits 2.
"""

import argparse
import contextlib
import errno
import importlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import director as dr
import evaluate
import grpo
import models
import reward
import scenarios
import warmstart
from judge import HFJudge, OfflineJudge
from metrics import paired_change
from plumbing import common, files, loading, results, runs, served
from plumbing.cli import Formatter, Parser, add_options, common_flags, flag_type, options
from plumbing.common import UserError
from plumbing.datasets import read_data
from plumbing.devices import check_device, frozen_dtype, release_memory
from plumbing.parallel import OneProcess, Ranks
from plumbing.runs import model_card, start_stage
from reward import RMJudge
from simulate import Cast

ROOT = Path(__file__).resolve().parent  # the repository: personas.json and data/ live here


def build_parser() -> argparse.ArgumentParser:
    """`train`, `evaluate`, and one subcommand per tool in extras/ (they parse their own flags)."""
    parser = Parser(
        prog="mascot.py",
        description="MASCOT, stage by stage (python mascot.py COMMAND --help)",
        formatter_class=Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train_flags(
        sub.add_parser(
            "train",
            help="train stage 1 (speakers) or stage 2 (director)",
            formatter_class=Formatter,
        )
    )
    evaluate_flags(
        sub.add_parser(
            "evaluate", help="compare systems on held-out contexts", formatter_class=Formatter
        )
    )
    for name, (module, about) in EXTRAS.items():
        tool = sub.add_parser(name, help=f"{about} (extras/{module}.py)", add_help=False)
        tool.add_argument("rest", nargs="...")  # everything after the name goes to the tool
    return parser


def train_flags(t) -> None:
    """`train`: the shared flags, then every field of the stages' settings dataclasses."""
    t.add_argument(
        "--stage", type=int, choices=[1, 2], required=True, help="1: the speakers; 2: the director"
    )
    common_flags(t)
    t.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint"
    )
    t.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="train every model (speakers, reward model, director, warm starts) in bf16, with "
        "fp32 master weights and AdamW state in CPU memory: 4 bytes a parameter on the GPU, not 16",
    )
    t.add_argument(
        "--dist-timeout",
        type=flag_type("--dist-timeout", float, "positive"),
        default=180.0,
        help="torchrun: minutes a rank waits for the others (rank 0 alone builds stage 1's inputs)",
    )
    add_options(t.add_argument_group("GRPO (grpo.GRPOConfig)"), grpo.GRPOConfig)
    add_options(t.add_argument_group("stage 1 (reward.RLAIFConfig)"), reward.RLAIFConfig)
    g = t.add_argument_group("stage 2 (director.DirectorConfig, director.RewardWeights)")
    add_options(g, dr.DirectorConfig)
    add_options(g, dr.RewardWeights, prefix="w-")  # --w-coherence, ...: the group reward's weights


def evaluate_flags(e) -> None:
    """`evaluate`: the shared flags and evaluate.EvalConfig's."""
    common_flags(e)
    turns = flag_type("--turns", int, "positive")
    e.add_argument("--turns", type=turns, default=4, help="agent turns per conversation")
    add_options(e, evaluate.EvalConfig)
    e.add_argument("--sft", default=None, help="the SFT baseline (default: RUN/sft/model)")
    e.add_argument(
        "--human",
        default=None,
        help="human judgements (extras/human.py): their statistics; no model runs",
    )


# The tools in extras/: command -> (module, what it does). main() hands each its argv and this
# module (`cli`: common_flags, load_inputs, make_judge, load_role...), so extras never import the CLI.
EXTRAS = {
    "demo": ("demo", "the whole pipeline on the embedded model, sized for a CPU (make demo)"),
    "simulate": ("chat", "write conversations for contexts, a profile and a policy"),
    "chat": ("chat", "talk to the companion group in the terminal"),
    "report": ("report", "one self-contained HTML page of a run"),
    "sft": ("sft", "the SFT baseline: the base model fine-tuned on ESConv supporter turns"),
    "strategies": ("strategies", "fit the persona-function classifiers on ESConv's labels"),
    "judge-eval": ("judges", "a judge's accuracy on labelled pairs"),
    "judge-stress": ("judges", "best-of-N: does optimising a grader pick reward hacks?"),
    "director-headroom": ("director_headroom", "could any director beat the least-spoken rule?"),
    "compare-speakers": ("compare", "two sets of speakers at the same held-out points, paired"),
}


def extra(name: str):
    """extras/<name>.py, imported when its command runs (the core never imports extras)."""
    return importlib.import_module(f"extras.{name}")


def load_inputs(args, earlier: list[Path] = ()) -> scenarios.Inputs:
    """Personas, the train / held-out contexts and the profiles the flags name, all checked; the
    split must agree with the stages this command builds on (their config.json in `earlier`)."""
    return scenarios.make_inputs(
        scenarios.load_personas(args.personas, args.set),
        read_data(args.data, args.set),
        args.held_out,
        args.seed,
        scenarios.load_profiles(args.profiles_file),
        vars(args),
        earlier,
    )


def load_role(spec: str, role: str, args, cache: Path | None = None):
    """(model, tokenizer) of a frozen role: a local model (load_model), or `openai:<base url>`, a model
    served elsewhere (plumbing/served.py; tokenizer None), checked with one tiny request now."""
    if spec.startswith("openai:"):
        return served.served_role(spec, role, args, cache), None
    flag = "--model"  # the flag an error names: the one that gave this folder
    for name in (role, "sft"):
        if getattr(args, name, None) == spec:
            flag = f"--{name}"
    return loading.load_model(
        spec, device=args.device, dtype=frozen_dtype(args), frozen=True, flag=flag
    )


def make_judge(args, cache: Path | None, personas_path: str, encoder=None):
    """The AI feedback of stage 1 (and the coherence term of stage 2): the --judge, from its spec.
    The paper's judges are large LLMs; the offline default is a stand-in that runs on a laptop."""
    spec = args.judge.strip()
    kind, _, where = spec.partition(":")
    where = where.strip()
    if spec in ("offline", "offline-features"):
        # judge.OfflineJudge: cards that list ESConv strategies are judged by a classifier of those
        # human labels, the rest (and every card with offline-features) by embedding features.
        names = scenarios.persona_sets(personas_path)
        sets = [scenarios.load_personas(personas_path, s) for s in names]
        return OfflineJudge(sets, cache, encoder, classifier=spec == "offline")
    if kind == "hf" and where:  # a local chat LLM, read through its label probabilities
        return HFJudge(where, cache, device=args.device)
    if kind == "rm" and where:  # a trained reward model (stage 1's) as a judge
        return RMJudge(where, cache, device=args.device)
    if kind == "openai" and where:  # any OpenAI-compatible server (vLLM, llama.cpp)
        return served.judge(where, args, cache)
    raise UserError(
        f"--judge {spec!r}: use offline, offline-features, hf:<model or folder>, openai:<base url> or rm:<folder>"
    )


def speakers_of(args) -> str:
    """The speakers stage 2 and the evaluation use: --speakers, else stage 1's, else --model."""
    return args.speakers or loading.trained_or(Path(args.run) / "stage1" / "speakers", args.model)


# --- Stage 1: persona-aware behavioural alignment (RLAIF, then GRPO on the speakers) -------------------
def train_stage1(args, ranks=OneProcess()) -> dict:
    """Phase I of the paper (arXiv 2601.14230): persona-aware behavioural alignment, RLAIF.
    Steps 0-4 (rlaif_reward) turn the judge's preferences into a reward model; step 5 is GRPO.
    Each step's output is a file in RUN/stage1/, reused when present, so an interrupted run never
    samples or judges twice."""
    out = Path(args.run) / "stage1"
    inputs = load_inputs(args)
    start_stage(args, out, ranks, scenarios.contexts_path(args.data))
    # Under torchrun rank 0 builds steps 0-4 (each judgement paid once) while the others wait; then
    # they run the same steps, which only read what rank 0 wrote.
    if not ranks.is_main:
        ranks.barrier()
    rlaif = rlaif_reward(args, inputs, out)
    if ranks.is_main:
        ranks.barrier()
    # Step 5: GRPO on the speakers; reward = reward-model score + format_weight x format reward.
    cfg = grpo_settings(args, args.max_new_tokens)
    reference = rlaif.base if cfg.beta > 0 else None  # the KL anchor: the model GRPO starts from
    rlaif.base = None  # without a KL term the frozen copy's work is done
    release_memory()
    # fp32, or bf16 under --offload-optimizer (then before and after are checked in one precision).
    dtype = models.policy_dtype(args.offload_optimizer)
    policy, tok = loading.load_model(args.model, device=args.device, dtype=dtype)
    personas = inputs.personas
    check = SpeakerCheck(policy, tok, rlaif.held_states, personas, rlaif.reward_fn, cfg)
    before = check("before GRPO") if ranks.is_main else None
    task = speaker_task(rlaif.states, personas, rlaif.reward_fn, cfg)
    task.evaluate = lambda step: check(f"at step {step}")  # --eval-every: the held-out curve
    grpo.train_grpo(policy, tok, task, cfg, out, reference, args.resume, ranks)
    if not ranks.is_main:
        return {}
    after = check("after GRPO ")
    after["change"], after["change_se"] = paired_change(
        before["rewards"], after["rewards"], clusters=after["states"]
    )
    print(
        f"held-out change: {after['change']:+.3f} ± {reward.shown(after['change_se'])} (paired se over states)"
    )
    summary = {
        "pairs": len(rlaif.pairs),
        "reward_model": rlaif.rm_metrics,
        "heldout_before": before,
        "heldout_after": after,
        "judge": rlaif.judge,
        "model": args.model,
    }
    card_prompt = rlaif.states[0].prompt(personas)
    first_pair = rlaif.pairs[0] if rlaif.pairs else None
    summary["speakers"] = save_speakers(
        args, personas, (policy, tok), card_prompt, first_pair, summary
    )
    files.write_json(out / "summary.json", summary)
    print(f"stage 1 done: speakers saved to {summary['speakers']}")
    return summary


@dataclass
class Stage1Reward:
    """What steps 0-4 of Phase I hand to GRPO."""

    base: object  # the frozen speaker the candidates came from (GRPO's KL reference)
    states: list  # the training states (reward.State), GRPO's prompts
    held_states: list  # the held-out states, for the before/after check
    pairs: list  # the judged and synthetic-hack preference pairs
    reward_fn: object  # reward.speaker_reward_fn: reward-model score + format reward
    rm_metrics: dict  # the reward model's held-out accuracy on judged and hack pairs
    judge: str  # the judge's name, for the model cards


def rlaif_reward(args, inputs, out: Path) -> Stage1Reward:
    """Phase I, steps 0-4: from the speaker's own samples to a reward model of the judge's preferences."""
    cfg = options(reward.RLAIFConfig, args, offload_optimizer=args.offload_optimizer)
    personas = inputs.personas
    # Step 0 (ESConv only; our addition): the speakers' warm start, card against card. A card-blind
    # speaker cannot be rewarded into its role (warmstart.py); the rest of stage 1 starts from it.
    args.model = warmstart.speaker_warm_start(args, out, inputs)
    dtype = frozen_dtype(args)
    base, tok = loading.load_model(args.model, device=args.device, dtype=dtype, frozen=True)
    # The AI judge of step 3, built now: a served judge is checked (URL, key, model) before any work.
    judge = make_judge(args, out / "judge_cache.jsonl", args.personas)
    # Step 1: states, (context, persona, conversation so far), for training and held out.
    states, held = reward.stage1_states(cfg, inputs, base, tok, out, args.max_new_tokens, args.seed)
    if cfg.reward == "judge":  # d-RLAIF (Lee et al. 2023): the judge's own score is GRPO's reward
        scorer = make_judge(args, None, args.personas)  # GRPO's samples are not worth caching
        reward_fn = reward.judge_reward_fn(scorer, personas, cfg.format_weight)
        return Stage1Reward(base, states, held, [], reward_fn, {}, judge.name)
    # Step 2: K candidate replies per state from the speaker.
    path = out / "candidates.jsonl"
    candidates = reward.sample_candidates(
        base, tok, states, personas, cfg.candidates, args.max_new_tokens, args.seed, path
    )
    # Step 3: the AI judge; clear score gaps confirmed in both orders become preference pairs,
    # and synthetic reward hacks join as rejected replies.
    pairs = reward.build_pairs(cfg, states, candidates, personas, judge, args.seed)
    files.write_jsonl(out / "pairs.jsonl", pairs)
    # Step 4: a Bradley-Terry reward model on the pairs: r(persona, conversation, reply).
    rm, rm_tok, rm_metrics = reward.fit_reward_model(
        cfg,
        pairs,
        out / "reward_model",
        args.model,
        args.seed,
        args.device,
        dtype,
        args.gradient_checkpointing,
    )
    reward.check_agreement(cfg, rm_metrics)  # a reward model that does not carry the judge: stop
    reward_fn = reward.speaker_reward_fn(rm, rm_tok, personas, cfg.format_weight)
    return Stage1Reward(base, states, held, pairs, reward_fn, rm_metrics, judge.name)


def grpo_settings(args, max_new_tokens: int) -> grpo.GRPOConfig:
    """GRPO's flags, the run's seed and the longest completion; sampling from a bf16 copy where
    --dtype makes the frozen models bf16 (the policy itself always trains in fp32)."""
    bf16 = frozen_dtype(args) == torch.bfloat16
    return options(
        grpo.GRPOConfig, args, seed=args.seed, max_new_tokens=max_new_tokens, sample_bf16=bf16
    )


def speaker_task(states, personas, reward_fn, cfg) -> grpo.Task:
    """Stage 1 as a GRPO task: each step's prompts are the speaker prompts of cfg.prompts_per_step
    training states (persona card and conversation so far); a completion is that persona's reply."""

    def prompts(step: int):
        chosen = grpo.sample_batch(states, cfg, step)  # the same states at the same step on resume
        return [s.prompt(personas) for s in chosen], chosen

    def rewards(chosen, texts, gen):
        # gen.finished: did the reply end with a stop token? The format reward asks that it did.
        return reward_fn(chosen, texts, gen.finished)

    def describe(chosen, texts, values):
        return [{"state": s.id, "reply": t, "reward": r} for s, t, r in zip(chosen, texts, values)]

    def diagnose(chosen, texts):
        # The hack diagnostics of every sampled reply (metrics.diagnose), logged beside the reward.
        rows = [
            s.diagnose(personas, models.clean_reply(t, s.persona, personas.names()))
            for s, t in zip(chosen, texts)
        ]
        return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}

    return grpo.Task(prompts, rewards, describe, diagnose)


class SpeakerCheck:
    """The held-out check of stage 1: the composite reward of the speakers' replies to the held-out
    states, with the same seeds before and after GRPO, so the two can be paired state by state."""

    def __init__(self, policy, tok, states, personas, reward_fn, cfg):
        self.policy, self.tok, self.states = policy, tok, states
        self.personas, self.reward_fn, self.cfg = personas, reward_fn, cfg

    def __call__(self, when: str) -> dict:
        r = reward.heldout_reward(
            self.policy, self.tok, self.states, self.personas, self.reward_fn, self.cfg
        )
        source = "rm" if "rm" in r else "judge"  # the reward model's score, or the judge's
        print(
            f"held-out mean reward {when}: {r['reward']:.3f} ± {reward.shown(r['se'])} (se over "
            f"{len(self.states)} states; {source} {r[source]:.3f}, format {r['format']:.3f}; "
            f"{r['n']} replies)"
        )
        return r


def save_speakers(args, personas, trained: tuple, prompt: list, pair: dict, summary: dict) -> str:
    """The trained speakers (RUN/stage1/speakers) and the reward model, each with a model card
    (the command, key metrics, one training prompt: what it takes to reproduce or reuse them)."""
    policy, tok = trained
    out = Path(args.run) / "stage1"
    before, after = summary["heldout_before"]["reward"], summary["heldout_after"]["reward"]
    metrics = {
        "judge": summary["judge"],
        "held-out reward before / after GRPO": f"{before:.3f} / {after:.3f}",
    }
    if pair:  # the paper's route: a reward model between the judge and GRPO (not --reward judge)
        rm_card = {}
        for key, value in summary["reward_model"].items():
            rm_card[key] = value if isinstance(value, int) else reward.shown(value)
        messages = pair["chosen_messages"]
        card = model_card("reward model", args.model, args.argv, personas, messages, rm_card)
        (out / "reward_model" / "README.md").write_text(card)
        metrics["reward model held-out accuracy"] = rm_card["heldout_accuracy"]
    card = model_card("speakers (stage 1)", args.model, args.argv, personas, prompt, metrics)
    return str(files.save_model(policy, tok, out / "speakers", card))


# --- Stage 2: collaborative dialogue optimisation (GRPO on the director) --------------------------------
def train_stage2(args, ranks=OneProcess()) -> dict:
    """Phase II of the paper: collaborative dialogue optimisation, GRPO on the director with the
    speakers and the simulated user frozen. Held-out decision points are scored before and after,
    beside the least-spoken rule, with the same seeds, so every comparison is paired."""
    run, out = Path(args.run), Path(args.run) / "stage2"
    inputs = load_inputs(args, earlier=[run / "stage1" / "config.json"])
    if (args.director or "").startswith("openai:"):
        raise UserError(
            f"--director {args.director}: the director trained here must be local (GRPO needs its weights)"
        )
    start_stage(args, out, ranks, scenarios.contexts_path(args.data))
    dcfg = options(dr.DirectorConfig, args)
    # Step 1: freeze the speakers (stage 1's) and a simulated user; load the director GRPO trains.
    cast = frozen_cast(args, inputs, out)
    start_from = args.director or args.model
    dtype = models.policy_dtype(args.offload_optimizer)  # bf16 with fp32 masters in CPU memory
    policy, tok = loading.load_model(start_from, device=args.device, dtype=dtype)
    models.set_gradient_checkpointing(
        policy, args.gradient_checkpointing
    )  # the warm start's passes too
    encoder = loading.SentenceEncoder(args.device)  # the judge's and the non-redundancy term's
    # Step 2: decision points, conversation prefixes at different positions, made once by the frozen cast.
    train_points, held_points = decision_points(args, dcfg, inputs, cast, ranks.is_main)
    # Step 3: rollouts. A sampled directive is followed N turns (the director itself, greedy, directs
    # turns 2..N) and the block is scored by the group reward (director.block_reward).
    esconv = esconv_dialogues(dcfg, args.set)
    rollout = make_rollout(args, dcfg, inputs, cast, encoder, esconv)
    director = rollout.follow = dr.LLMDirector(policy, tok, inputs.personas)
    check = DirectorCheck(rollout, held_points, out, args.seed)
    before = rule = warm = None
    if ranks.is_main:
        if dcfg.eval_prompted:
            before = check(
                "prompted",
                director,
                f"before training (the initial director {start_from}, prompted)",
            )
        rule = check("least-spoken", dr.LeastSpoken(inputs.personas), "of the least-spoken rule")
        # Step 4 (our addition): the director's warm start, its format and, with ESConv, what real
        # supporters did next; GRPO can only reinforce what the policy already samples.
        targets = warm_start_targets(dcfg, inputs, train_points, esconv, args)
        warm = warmstart.warm_start(
            dcfg, out, policy, tok, inputs.personas, targets, check, args.resume
        )
    ranks.barrier()  # GRPO starts every rank from rank 0's warm-started weights
    # Step 5: GRPO on the director, the group reward of each sampled directive's block as its reward.
    gcfg = grpo_settings(args, dr.DIRECTIVE_MAX_TOKENS)
    reference = director_reference(args, gcfg, dcfg, out, start_from)
    task = director_task(train_points, inputs.personas, rollout, gcfg)
    grpo.train_grpo(policy, tok, task, gcfg, out, reference, args.resume, ranks)
    if not ranks.is_main:
        return {}
    after = check("trained", director, "after training")
    compared = {"least-spoken": rule, "prompted": before, "warm-start": warm and warm["heldout"]}
    summary = stage2_summary(args, rollout, {"after": after, **compared}, warm)
    card_prompt = dr.director_messages(inputs.personas, train_points[0])
    summary["director"] = save_director(args, inputs.personas, (policy, tok), card_prompt, summary)
    files.write_json(out / "summary.json", summary)
    print(f"stage 2 done: director saved to {summary['director']}")
    return summary


def frozen_cast(args, inputs, out: Path) -> Cast:
    """Stage 2's frozen roles: the speakers (stage 1's, unless --speakers) and the simulated user
    (--user, else --model), each a local model or a served one (openai:)."""
    speakers = speakers_of(args)
    user_spec = args.user or args.model
    print(
        f"stage 2: speakers {speakers} and simulated user {user_spec}, frozen; director from {args.director or args.model}"
    )
    cache = out / "served_cache.jsonl"  # every served reply, paid once
    speaker = load_role(speakers, "speakers", args, cache)
    user = speaker  # one local model can play both
    if user_spec != speakers or speaker[1] is None:
        user = load_role(user_spec, "user", args, cache)
    return Cast(inputs.personas, *speaker, *user, args.max_new_tokens)


def decision_points(args, dcfg, inputs, cast, write: bool) -> tuple[list, list]:
    """(training points, held-out points), each a conversation prefix cut at a different position, so
    openings and mid-conversation choices are both learnt; written to RUN/stage2/decision_points.jsonl."""
    profiles, every = inputs.profiles, args.user_every
    train = dr.build_decision_points(
        inputs.train, dcfg.decision_points, cast, profiles, every, args.seed
    )
    held = dr.build_decision_points(
        inputs.held_out, dcfg.heldout_points, cast, profiles, every, args.seed + 1
    )
    if write:
        rows = [{"split": "train", **p.to_json()} for p in train]
        rows += [{"split": "heldout", **p.to_json()} for p in held]
        files.write_jsonl(Path(args.run) / "stage2" / "decision_points.jsonl", rows)
    return train, held


def esconv_dialogues(dcfg, set_name: str) -> list | None:
    """ESConv's dialogues when --director-warmup-data names them: the warm start's targets, and the
    grounded terms of the group reward (director.Grounding); None without."""
    if not dcfg.director_warmup_data:
        return None
    splits = read_data(dcfg.director_warmup_data, set_name)
    return [c for part in splits.values() for c in part]


def make_rollout(args, dcfg, inputs, cast, encoder, esconv) -> dr.Rollout:
    """What scores a directive: roll the conversation forward N agent turns with the frozen cast,
    then the group reward of the block (director.block_reward), weighted by the --w-* flags."""
    judge = make_judge(
        args, Path(args.run) / "stage2" / "judge_cache.jsonl", args.personas, encoder
    )
    weights = options(dr.RewardWeights, args, prefix="w-")
    rollout = dr.Rollout(
        cast,
        inputs.profiles,
        inputs.personas,
        encoder,
        judge,
        weights,
        dcfg.rollout_turns,
        args.user_every,
    )
    if esconv:  # ESConv also grounds the group reward: plausible and compliant (our addition)
        rollout.grounding = dr.Grounding(esconv, inputs.personas, encoder, args.held_out, args.seed)
    return rollout


class DirectorCheck:
    """The held-out check of stage 2: a director (or a rule) directs every turn of a block from each
    held-out decision point, with the same seeds for all, so per-point rewards can be paired."""

    def __init__(self, rollout, points, out: Path, seed: int):
        self.rollout, self.points, self.out, self.seed = rollout, points, out, seed

    def __call__(self, label: str, who, when: str) -> dict:
        r = self.rollout.evaluate(who, self.points, self.seed)
        files.write_jsonl(self.out / f"heldout_{label}.jsonl", r.pop("rollouts"))
        print(f"held-out mean group reward {when}: {dr.describe_heldout(r)}", flush=True)
        return r


def warm_start_targets(dcfg, inputs, train_points, esconv, args) -> tuple:
    """(examples, where they came from, a held-out agreement check or None) for the director's warm
    start: what ESConv's supporters did next, or, without ESConv, random agents in the right format."""
    n = dcfg.director_warmup * 4  # four examples a step
    if esconv:
        return warmstart.warm_start_examples(
            esconv, inputs.personas, n, args.held_out, args.seed, dcfg.warmup_balanced
        )
    examples = warmstart.format_examples(inputs.personas, train_points, n, args.seed)
    return examples, "format warm start: random agents", None


def director_reference(args, gcfg, dcfg, out: Path, start_from: str):
    """The KL anchor (frozen), or None without a KL term: the director GRPO starts from, so the
    warm-started one when the warm start ran."""
    if gcfg.beta <= 0:
        return None
    folder = str(out / "director_warm") if dcfg.director_warmup else start_from
    return loading.load_model(folder, device=args.device, dtype=frozen_dtype(args), frozen=True)[0]


def director_task(points, personas, rollout, cfg) -> grpo.Task:
    """Stage 2 as a GRPO task: each step's prompts ask the director for a directive at
    cfg.prompts_per_step decision points; a completion's reward is its block's group reward."""

    def prompts(step: int):
        chosen = grpo.sample_batch(points, cfg, step)
        return [dr.director_messages(personas, c) for c in chosen], chosen

    def rewards(chosen, texts, gen):
        return rollout.score_directives(chosen, texts)

    def describe(chosen, texts, values):
        return [
            {"context": p.context.id, "directive": t, "reward": r}
            for p, t, r in zip(chosen, texts, values)
        ]

    return grpo.Task(prompts, rewards, describe)


def stage2_summary(args, rollout, heldout: dict, warm) -> dict:
    """summary.json of stage 2, after printing the trained director's paired change against each
    of the others on the held-out points (heldout: "after" and the others, None where not run)."""
    after = heldout["after"]
    vs = {}
    for name, other in heldout.items():
        if name != "after" and other:
            vs[name] = dr.compare(after, other)
            print(
                f"held-out group reward, trained - {name}: {vs[name]['change']:+.3f} ± "
                f"{reward.shown(vs[name]['se'])} (paired se, {vs[name]['n']} points)"
            )
    return {
        "heldout_before": heldout["prompted"],
        "heldout_least_spoken": heldout["least-spoken"],
        "warm_start": warm,
        "heldout_after": after,
        "paired_vs": vs,
        "speakers": speakers_of(args),
        "judge": rollout.judge.name,
        "model": args.model,
        "invalid_directives": rollout.invalid,
        "directives": rollout.total,
        "unreadable_judgements": rollout.counts["unreadable"],
    }


def save_director(args, personas, trained: tuple, prompt: list, summary: dict) -> str:
    """The trained director (RUN/stage2/director) with its model card."""
    policy, tok = trained
    out = Path(args.run) / "stage2"
    metrics = {"judge": summary["judge"], "speakers": summary["speakers"]}
    shown = {"trained": "heldout_after", "least-spoken rule": "heldout_least_spoken"}
    for label, key in shown.items():
        if summary[key]:
            metrics[f"held-out group reward, {label}"] = f"{summary[key]['reward']:.3f}"
    if summary["warm_start"] and summary["warm_start"]["heldout"]:
        metrics["held-out group reward, warm start"] = (
            f"{summary['warm_start']['heldout']['reward']:.3f}"
        )
    base = args.director or args.model  # where GRPO (and the warm start) began
    card = model_card("director (stage 2)", base, args.argv, personas, prompt, metrics)
    return str(files.save_model(policy, tok, out / "director", card))


# --- evaluate, simulate -------------------------------------------------------------------------------
def evaluate_cmd(args) -> dict:
    """`python mascot.py evaluate`: every chosen system holds the same held-out conversations and
    evaluate.py scores them (with --human FILE: a human study's statistics, extras/human.py).
    The steps: inputs, systems, roles, judges and evaluators, the run, the tables printed."""
    run = Path(args.run)
    out = run / "eval"
    if args.human:
        return extra("human").run(args)
    cfg = options(evaluate.EvalConfig, args)
    # Inputs: held-out contexts and users, split as the stages this evaluation builds on split them.
    stages = [run / f for f in ("stage1/config.json", "stage2/config.json", "sft/config.json")]
    inputs = load_inputs(args, earlier=stages)
    check_device(args)
    # Systems: those whose models exist; the others are named with the command that makes them.
    folders = eval_folders(args)
    systems, skipped = eval_systems(args, cfg, folders)
    evaluate.pairwise(cfg, {})  # a bad --pairwise fails now, not after the work
    runs.save_config(vars(args), out)
    # Roles: the frozen base model, the simulated user, and each trained model a system needs.
    roles = eval_roles(args, systems, folders, out / "served_cache.jsonl")
    # Judges and evaluators: who measures which column.
    evaluators = eval_evaluators(args, cfg, inputs, roles["base"])
    # Every system meets the same conversations: each context with every profile, the same seeds.
    ids = evaluate.profile_ids(cfg.profiles, inputs.profiles)
    plan = evaluate.plan_conversations(inputs.held_out, cfg.contexts, ids)
    setup = evaluate.Setup(
        inputs=inputs,
        contexts=[c for c, _ in plan],
        profiles=[p for _, p in plan],
        schedule=evaluate.Schedule(args.turns, args.user_every, args.max_new_tokens, args.seed),
        roles=roles,
        names={"base": args.model, **folders},
        fewshot=few_shot_examples(args, systems),
        evaluators=evaluators,
        guard=extra("safety").default_guard(),  # people read these transcripts
        pipelines=baseline_pipelines(cfg, evaluators.judge),
    )
    data_file = scenarios.contexts_path(args.data)
    protocol = results.evaluation_protocol(args, cfg, inputs, setup, folders, data_file)
    t0 = time.time()
    evaluation = evaluate.run(cfg, setup, systems, skipped, out, protocol)
    print((out / "results.md").read_text(encoding="utf-8"))
    print(
        f"evaluation: {time.time() - t0:.0f} s; wrote {out}/results.md, results.json, transcripts.jsonl"
    )
    return evaluation


def eval_folders(args) -> dict[str, str]:
    """Where the trained models of the systems live: stage 1's speakers, the SFT baseline's model,
    stage 2's director (each may be given by its own flag)."""
    run = Path(args.run)
    return {
        "trained": speakers_of(args),
        "sft": args.sft or str(run / "sft" / "model"),
        "trained-director": args.director or str(run / "stage2" / "director"),
    }


def eval_systems(args, cfg, folders: dict[str, str]) -> tuple[list, dict]:
    """evaluate.choose_systems, each skipped system printed; no system left to run is a UserError."""
    how = f" --run {args.run}"  # the flags the command that makes a missing model must repeat
    if args.model != loading.EMBEDDED:
        how += f" --model {args.model}"
    systems, skipped = evaluate.choose_systems(cfg.systems, folders, how)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if not systems:
        raise UserError(
            f"--systems {cfg.systems}: none of these systems can run; "
            + "; ".join(skipped.values())
        )
    return systems, skipped


def eval_roles(args, systems: list, folders: dict[str, str], cache: Path) -> dict:
    """(model, tokenizer) per role: "base" (--model, frozen), "user" (--user, else the base model),
    and the trained speakers, SFT model or director of the systems that run."""
    base = loading.load_model(args.model, device=args.device, dtype=frozen_dtype(args), frozen=True)
    roles = {"base": base}
    if args.user:
        roles["user"] = load_role(args.user, "user", args, cache)
    else:
        roles["user"] = base
    for kind in {s.speakers for s in systems} | {s.order for s in systems}:
        if kind in folders:
            role = "director" if kind == "trained-director" else "speakers"
            roles[kind] = load_role(folders[kind], role, args, cache)
    return roles


def eval_evaluators(args, cfg, inputs, base) -> evaluate.Evaluators:
    """The judge (--judge) and the evaluators beside it: the sentence encoder, the NLI classifier
    (--nli-model), and two that read the frozen base model `base`: the persona identifier
    (extras/evaluators.py) and, when a card lists ESConv strategies, the persona-function model."""
    out = Path(args.run) / "eval"
    encoder = loading.SentenceEncoder(args.device)
    cache = None if args.judge == "offline" else out / "judge_cache.jsonl"
    judge = make_judge(args, cache, args.personas, encoder)
    nli = None
    if cfg.nli_model:
        nli = loading.load_nli(cfg.nli_model, args.device)
    identifier = None
    if cfg.persona_id:
        identifier = extra("evaluators").PersonaIdentifier(*base, inputs.personas)
    function = None
    if any(p.esconv_strategies for p in inputs.personas.personas):
        function = extra("strategies").FunctionEvaluator(base[1], inputs.personas)
    trained_with = results.training_judges(Path(args.run))
    return evaluate.Evaluators(judge, encoder, nli, identifier, function, args.judge, trained_with)


def few_shot_examples(args, systems: list) -> list:
    """data/fewshot.json's worked examples for --set, read only when a few-shot system runs."""
    if any(s.style.startswith("few") for s in systems):
        return files.asset("fewshot.json").get(args.set, [])
    return []


def baseline_pipelines(cfg, judge) -> dict:
    """The multi-call baselines (extras/baselines.py, imported only when one runs): pipeline name ->
    a function of the system that returns its speak()."""
    return {
        "self-consistency": lambda s: extra("baselines").SelfConsistency(
            cfg.sc_samples, cfg.sc_pick, judge, s.style
        ),
        "multiagentesc": lambda s: extra("baselines").MultiAgentESC(),
    }


# --- main -------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    """Run one command; returns the exit status (0 done, 2 a one-line error, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else argv
    sys.stdout.reconfigure(line_buffering=True)  # one line per step shows as it happens
    common.QUIET = "--quiet" in argv  # every command's progress (common.progress)
    try:
        if argv[:1] and argv[0] in EXTRAS:  # a tool in extras/: its own parser and code
            return extra(EXTRAS[argv[0]][0]).main(argv, sys.modules[__name__]) or 0
        args = build_parser().parse_args(
            argv, argparse.Namespace(argv=argv)
        )  # argv: for the model cards
        # One command at a time in a run folder (torchrun: rank 0 holds the lock for all its processes).
        lock = contextlib.nullcontext()
        if os.environ.get("RANK", "0") == "0":
            lock = runs.run_lock(args.run)
        with lock:
            if args.command == "evaluate":
                evaluate_cmd(args)
            else:
                # One process, or the torchrun processes (plumbing/parallel.py) when WORLD_SIZE > 1.
                ranks = Ranks(args) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else OneProcess()
                stage = train_stage1 if args.stage == 1 else train_stage2
                stage(args, ranks)
    except (
        UserError,
        OSError,
        KeyboardInterrupt,
    ) as err:  # OSError: a read-only folder, a full disk
        return report_error(err, argv)
    return 0


def report_error(err: BaseException, argv: list[str]) -> int:
    """The one line a failed command prints (never a traceback), and its exit status. Every file is
    written whole (a temporary name, renamed), so running the same command again is exact."""
    again = "run the same command"
    again += " with --resume" if argv[:1] == ["train"] else " (it picks up what is done)"
    if isinstance(err, KeyboardInterrupt):
        print(f"interrupted: checkpoints and the judge cache are on disk; {again}", file=sys.stderr)
        return 130
    message = str(err)
    if isinstance(err, OSError):
        message = f"{err.filename or 'a file'}: {err.strerror or err}"
        if err.errno == errno.ENOSPC:
            message += f"; free space, {again}"
    print(f"error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
