"""mascot.py: the one entry point. Every stage of MASCOT is a subcommand; read this file top to
bottom for the whole pipeline, and follow the calls into the module that does each part.

    python mascot.py train --stage 1    Phase I: (on ESConv, a warm start on human turns) candidates -> AI judge ->
                                        preference pairs -> reward model (Bradley-Terry) -> GRPO on the speakers
    python mascot.py train --stage 2    Phase II: frozen speakers + simulated user; GRPO on the
                                        director over N-turn rollouts
    python mascot.py evaluate           every system on held-out contexts, with 95% intervals
    python mascot.py demo               all of it, sized for a laptop CPU (extras/demo.py)
    python mascot.py COMMAND --help     every flag, with its default
Tools beside the method live in extras/ (EXTRAS below); torchrun runs train on several processes.

Each command writes into a run folder (default runs/default):
    stage1/  config.json states.jsonl candidates.jsonl judge_cache.jsonl pairs.jsonl reward_model/
             metrics.jsonl samples/ checkpoints/ speakers/ summary.json (ESConv: speakers_warm/ speaker_warm_start.json)
    stage2/  config.json decision_points.jsonl warm_start.json director_warm/ metrics.jsonl
             samples/ checkpoints/ director/ summary.json
    eval/    config.json transcripts.jsonl results.md results.json (partial/ while it runs)
The algorithms' settings are declared once, beside the code that uses them (common.option); every
field becomes a flag here. Bad input (a common.UserError) and the machine's refusals (an OSError: a read-only
folder, a full disk) never show a traceback: main() prints one line, `error: ...`, and exits with status 2.
"""

import argparse
import contextlib
import errno
import importlib
import os
import sys
import time
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
from plumbing import common, files, loading, runs, served
from plumbing.cli import Formatter, Parser, add_options, common_flags, flag_type, options
from plumbing.common import UserError
from plumbing.datasets import read_data
from plumbing.devices import check_device, frozen_dtype, release_memory
from plumbing.parallel import OneProcess, Ranks
from plumbing.runs import folder_stamp, model_card, start_stage
from reward import RMJudge
from simulate import Cast

ROOT = Path(__file__).resolve().parent


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="mascot.py",
        description="MASCOT, stage by stage (python mascot.py COMMAND --help)",
        formatter_class=Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser(
        "train", help="train stage 1 (speakers) or stage 2 (director)", formatter_class=Formatter
    )
    t.add_argument(
        "--stage", type=int, choices=[1, 2], required=True, help="1: the speakers; 2: the director"
    )
    common_flags(t)
    t.add_argument(
        "--resume", action="store_true", help="continue from the newest complete checkpoint"
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
    add_options(g, dr.RewardWeights, prefix="w-")
    e = sub.add_parser(
        "evaluate", help="compare systems on held-out contexts", formatter_class=Formatter
    )
    common_flags(e)
    e.add_argument(
        "--turns",
        type=flag_type("--turns", int, "positive"),
        default=4,
        help="agent turns per conversation",
    )
    add_options(e, evaluate.EvalConfig)
    e.add_argument("--sft", default=None, help="the SFT baseline (default: RUN/sft/model)")
    e.add_argument(
        "--human",
        default=None,
        help="human judgements (extras/human.py): their statistics; no model runs",
    )
    for name, (
        module,
        about,
    ) in EXTRAS.items():  # tools beside the method: extras/ parses their own flags
        sub.add_parser(name, help=f"{about} (extras/{module}.py)", add_help=False).add_argument(
            "rest", nargs="..."
        )
    return parser


# The tools in extras/: command -> (module, what it does). main() hands each its argv and this
# module (`cli`: common_flags, load_inputs, make_judge, load_role...), so extras never import the CLI.
EXTRAS = {
    "demo": ("demo", "the whole pipeline on the embedded model, sized for a CPU (make demo)"),
    "simulate": ("chat", "write conversations for contexts, a profile and a policy"),
    "chat": ("chat", "talk to the companion group in the terminal"),
    "report": ("report", "one self-contained HTML page of a run"),
    "sft": ("sft", "the SFT baseline: the base model fine-tuned on ESConv supporter turns"),
    "strategies": (
        "strategies",
        "fit the persona-function classifiers on ESConv's strategy labels",
    ),
    "judge-eval": ("judges", "a judge's accuracy on labelled pairs"),
    "judge-stress": ("judges", "best-of-N: does optimising a grader pick reward hacks?"),
    "director-headroom": (
        "director_headroom",
        "could any director beat the least-spoken rule under stage 2's reward?",
    ),
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
    return loading.load_model(
        spec,
        device=args.device,
        dtype=frozen_dtype(args),
        frozen=True,
        flag=f"--{role}" if getattr(args, role, None) == spec else "--model",
    )


def make_judge(args, cache: Path | None, personas_path: str, encoder=None):
    """The --judge: offline or hf: (judge.py), rm: (reward.py), openai: (plumbing/served.py)."""
    spec = args.judge.strip()
    kind, _, where = spec.partition(":")
    if spec in (
        "offline",
        "offline-features",
    ):  # offline: cards listing ESConv strategies are judged by them
        sets = [
            scenarios.load_personas(personas_path, s) for s in scenarios.persona_sets(personas_path)
        ]
        return OfflineJudge(sets, cache, encoder, classifier=spec == "offline")
    if kind == "hf" and where:  # a local chat LLM, read through its label probabilities
        return HFJudge(where.strip(), cache, device=args.device)
    if kind == "rm" and where:  # a trained reward model (stage 1's) as a judge
        return RMJudge(where.strip(), cache, device=args.device)
    if kind == "openai" and where:  # any OpenAI-compatible server (vLLM, llama.cpp)
        return served.judge(where.strip(), args, cache)
    raise UserError(
        f"--judge {spec!r}: use offline, offline-features, hf:<model or folder>, openai:<base url> or rm:<folder>"
    )


def speakers_of(args) -> str:
    return args.speakers or loading.trained_or(Path(args.run) / "stage1" / "speakers", args.model)


# --- Stage 1: persona-aware behavioural alignment (RLAIF, then GRPO on the speakers) -------------------
def train_stage1(args, ranks=OneProcess()) -> dict:
    out = Path(args.run) / "stage1"
    inputs = load_inputs(args)
    start_stage(args, out, ranks, scenarios.contexts_path(args.data))
    # Step 0 on ESConv, the speakers' warm start (extras/sft.py); steps 1-4 of Phase I (reward.py): states -> candidates
    # -> judge -> pairs -> reward model. Under torchrun rank 0 does them (each judgement paid once), the others wait.
    if not ranks.is_main:
        ranks.barrier()
    args.model = warmstart.speaker_warm_start(args, out, inputs)
    dtype = frozen_dtype(args)
    base, tok = loading.load_model(
        args.model, device=args.device, dtype=dtype, frozen=True
    )  # samples; the reference
    judge = make_judge(args, out / "judge_cache.jsonl", args.personas)
    rlaif = reward.build_reward_fn(
        options(reward.RLAIFConfig, args),
        inputs,
        base,
        tok,
        judge,
        out,
        args.model,
        args.max_new_tokens,
        args.seed,
        args.device,
        dtype,
        args.gradient_checkpointing,
    )
    if ranks.is_main:
        ranks.barrier()
    # Step 5: GRPO on the speakers; reward = reward-model score + format_weight x format reward.
    cfg = options(
        grpo.GRPOConfig,
        args,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        sample_bf16=dtype == torch.bfloat16,
    )
    ref, base = (
        base if cfg.beta > 0 else None,
        None,
    )  # without a KL term the base model's work is done
    release_memory()
    policy, _ = loading.load_model(args.model, device=args.device)
    personas = inputs.personas

    def held_out(when: str) -> dict:
        r = reward.heldout_reward(
            policy,
            tok,
            rlaif.held_states,
            personas,
            rlaif.reward_fn,
            cfg.max_new_tokens,
            cfg.temperature,
            cfg.seed,
        )
        print(
            f"held-out mean reward {when}: {r['reward']:.3f} ± {reward.shown(r['se'])} (se over "
            f"{len(rlaif.held_states)} states; rm {r['rm']:.3f}, format {r['format']:.3f}; {r['n']} replies)"
        )
        return r

    before = held_out("before GRPO") if ranks.is_main else None

    def prompts(step: int):  # the step's states, and each one's chat prompt
        chosen = grpo.sample_batch(rlaif.train_states, cfg, step)
        return [s.prompt(personas) for s in chosen], chosen

    # GRPO hands each callback the states one per reply (prompt-major: G replies per state).
    grpo.train_grpo(
        policy,
        tok,
        prompts,
        lambda states, texts, gen: rlaif.reward_fn(states, texts, gen.finished),
        cfg,
        out,
        ref_model=ref,
        resume=args.resume,
        ranks=ranks,
        describe=lambda states, texts, rewards: [
            {"state": s.id, "reply": t, "reward": r} for s, t, r in zip(states, texts, rewards)
        ],
        diagnose=lambda states, texts: diagnostics(states, texts, personas),
    )
    if not ranks.is_main:
        return {}
    after = held_out("after GRPO ")
    after["change"], after["change_se"] = paired_change(
        before["rewards"], after["rewards"], clusters=after["states"]
    )
    print(
        f"held-out change: {after['change']:+.3f} ± {reward.shown(after['change_se'])} (paired se over states)"
    )
    rm_card = {
        k: v if isinstance(v, int) else reward.shown(v) for k, v in rlaif.rm_metrics.items()
    }  # model cards
    (out / "reward_model" / "README.md").write_text(
        model_card(
            "reward model",
            args.model,
            args.argv,
            personas,
            rlaif.pairs[0]["chosen_messages"],
            rm_card,
        )
    )
    card = model_card(
        "speakers (stage 1)",
        args.model,
        args.argv,
        personas,
        rlaif.train_states[0].prompt(personas),
        {
            "judge": judge.name,
            "held-out reward before / after GRPO": f"{before['reward']:.3f} / {after['reward']:.3f}",
            "reward model held-out accuracy": rm_card["heldout_accuracy"],
        },
    )
    summary = {
        "pairs": len(rlaif.pairs),
        "reward_model": rlaif.rm_metrics,
        "heldout_before": before,
        "heldout_after": after,
        "judge": judge.name,
        "model": args.model,
        "speakers": str(files.save_model(policy, tok, out / "speakers", card)),
    }
    files.write_json(out / "summary.json", summary)
    print(f"stage 1 done: speakers saved to {summary['speakers']}")
    return summary


def diagnostics(states, texts: list[str], personas) -> dict[str, list[float]]:
    """The hack diagnostics of every sampled reply (metrics.diagnose), for the step's log line."""
    rows = [
        s.diagnose(personas, models.clean_reply(t, s.persona, personas.names()))
        for s, t in zip(states, texts)
    ]
    return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


# --- Stage 2: collaborative dialogue optimisation (GRPO on the director) --------------------------------
def train_stage2(args, ranks=OneProcess()) -> dict:
    run, out = Path(args.run), Path(args.run) / "stage2"
    inputs = load_inputs(args, earlier=[run / "stage1" / "config.json"])
    if (args.director or "").startswith("openai:"):
        raise UserError(
            f"--director {args.director}: the director trained here must be local (GRPO needs its weights)"
        )
    start_stage(args, out, ranks, scenarios.contexts_path(args.data))
    speakers, start_from = speakers_of(args), args.director or args.model
    print(
        f"stage 2: speakers {speakers} and simulated user {args.user or args.model}, frozen; director from {start_from}"
    )
    cache = out / "served_cache.jsonl"
    speaker = load_role(speakers, "speakers", args, cache)
    user = (
        speaker
        if (args.user or args.model) == speakers and speaker[1] is not None
        else load_role(args.user or args.model, "user", args, cache)
    )
    policy, tok = loading.load_model(start_from, device=args.device)
    models.set_gradient_checkpointing(
        policy, args.gradient_checkpointing
    )  # the warm start's passes too
    encoder = models.SentenceEncoder(args.device)
    cast = Cast(inputs.personas, *speaker, *user, args.max_new_tokens)
    dcfg = options(dr.DirectorConfig, args)
    # Decision points: conversation prefixes at different positions, generated once by the frozen cast.
    train_points = dr.build_decision_points(
        inputs.train, dcfg.decision_points, cast, inputs.profiles, args.user_every, args.seed
    )
    held_points = dr.build_decision_points(
        inputs.held_out, dcfg.heldout_points, cast, inputs.profiles, args.user_every, args.seed + 1
    )
    if ranks.is_main:
        files.write_jsonl(
            out / "decision_points.jsonl",
            [
                {"split": s, **p.to_json()}
                for s, pts in (("train", train_points), ("heldout", held_points))
                for p in pts
            ],
        )
    rollout = dr.Rollout(
        cast,
        inputs.profiles,
        inputs.personas,
        encoder,
        make_judge(args, out / "judge_cache.jsonl", args.personas, encoder),
        options(dr.RewardWeights, args, prefix="w-"),
        dcfg.rollout_turns,
        args.user_every,
    )
    director = rollout.follow = dr.LLMDirector(
        policy, tok, inputs.personas
    )  # turns 2..N: the director itself, greedy
    esconv = (
        [c for part in read_data(dcfg.director_warmup_data, args.set).values() for c in part]
        if dcfg.director_warmup_data
        else None
    )  # ESConv also grounds the group reward (director.block_reward)
    rollout.grounding = esconv and dr.Grounding(
        esconv, inputs.personas, encoder, args.held_out, args.seed
    )

    def held_out(label: str, who, when: str) -> dict:
        r = rollout.evaluate(who, held_points, args.seed)
        files.write_jsonl(out / f"heldout_{label}.jsonl", r.pop("rollouts"))
        print(f"held-out mean group reward {when}: {dr.describe_heldout(r)}", flush=True)
        return r

    main = ranks.is_main
    before = (
        held_out(
            "prompted", director, f"before training (the initial director {start_from}, prompted)"
        )
        if dcfg.eval_prompted and main
        else None
    )
    rule = (
        held_out("least-spoken", dr.LeastSpoken(inputs.personas), "of the least-spoken rule")
        if main
        else None
    )
    n = (
        dcfg.director_warmup * 4
    )  # the warm start's examples: what ESConv's supporters did, or random agents
    examples = (
        warmstart.warm_start_examples(
            esconv, inputs.personas, n, args.held_out, args.seed, dcfg.warmup_balanced
        )
        if esconv
        else (
            warmstart.format_examples(inputs.personas, train_points, n, args.seed),
            "format warm start: random agents",
            None,
        )
    )
    warm = (
        warmstart.warm_start(
            dcfg, out, policy, tok, inputs.personas, *examples, held_out, args.resume
        )
        if main
        else None
    )
    ranks.barrier()  # GRPO starts every rank from rank 0's warm-started weights
    cfg = options(
        grpo.GRPOConfig,
        args,
        seed=args.seed,
        max_new_tokens=dr.DIRECTIVE_MAX_TOKENS,
        sample_bf16=frozen_dtype(args) == torch.bfloat16,
    )
    # The KL anchor is the director GRPO starts from: the warm-started one when the warm start ran.
    ref = (
        loading.load_model(
            str(out / "director_warm") if dcfg.director_warmup else start_from,
            device=args.device,
            dtype=frozen_dtype(args),
            frozen=True,
        )[0]
        if cfg.beta > 0
        else None
    )

    def prompts(step: int):  # the step's decision points, and the director's prompt for each
        chosen = grpo.sample_batch(train_points, cfg, step)
        return [dr.director_messages(inputs.personas, c) for c in chosen], chosen

    grpo.train_grpo(
        policy,
        tok,
        prompts,
        lambda points, texts, gen: rollout.score_directives(points, texts),
        cfg,
        out,
        ref_model=ref,
        resume=args.resume,
        ranks=ranks,
        describe=lambda points, texts, rewards: [
            {"context": p.context.id, "directive": t, "reward": r}
            for p, t, r in zip(points, texts, rewards)
        ],
    )
    if not main:
        return {}
    after = held_out("trained", director, "after training")
    vs = {
        name: dr.compare(after, r)
        for name, r in (
            ("least-spoken", rule),
            ("prompted", before),
            ("warm-start", warm and warm["heldout"]),
        )
        if r
    }
    for name, c in vs.items():
        print(
            f"held-out group reward, trained - {name}: {c['change']:+.3f} ± {reward.shown(c['se'])} "
            f"(paired se, {c['n']} points)"
        )
    card = model_card(
        "director (stage 2)",
        start_from,
        args.argv,
        inputs.personas,
        dr.director_messages(inputs.personas, train_points[0]),
        {
            "judge": rollout.judge.name,
            "speakers": speakers,
            **{
                f"held-out group reward, {k}": f"{r['reward']:.3f}"
                for k, r in (
                    ("trained", after),
                    ("least-spoken rule", rule),
                    ("warm start", warm and warm["heldout"]),
                )
                if r
            },
        },
    )
    summary = {
        "heldout_before": before,
        "heldout_least_spoken": rule,
        "warm_start": warm,
        "heldout_after": after,
        "paired_vs": vs,
        "speakers": speakers,
        "judge": rollout.judge.name,
        "model": args.model,
        "director": str(files.save_model(policy, tok, out / "director", card)),
        "invalid_directives": rollout.invalid,
        "directives": rollout.total,
        "unreadable_judgements": rollout.counts["unreadable"],
    }
    files.write_json(out / "summary.json", summary)
    print(f"stage 2 done: director saved to {summary['director']}")
    return summary


# --- evaluate, simulate -------------------------------------------------------------------------------
def evaluate_cmd(args) -> dict:
    run, out = Path(args.run), Path(args.run) / "eval"
    if args.human:
        return extra("human").run(args)
    cfg = options(evaluate.EvalConfig, args)
    inputs = load_inputs(
        args,
        earlier=[run / f for f in ("stage1/config.json", "stage2/config.json", "sft/config.json")],
    )
    check_device(args)
    folders = {
        "trained": speakers_of(args),
        "sft": args.sft or str(run / "sft" / "model"),
        "trained-director": args.director or str(run / "stage2" / "director"),
    }
    how = f" --run {args.run}" + (
        f" --model {args.model}" if args.model != loading.EMBEDDED else ""
    )
    systems, skipped = evaluate.choose_systems(cfg.systems, folders, how)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    if not systems:
        raise UserError(
            f"--systems {cfg.systems}: none of these systems can run; "
            + "; ".join(skipped.values())
        )
    evaluate.pairwise(cfg, {})  # a bad --pairwise fails now, not after the work
    runs.save_config(vars(args), out)
    cache = out / "served_cache.jsonl"
    base = loading.load_model(args.model, device=args.device, dtype=frozen_dtype(args), frozen=True)
    roles, names = (
        {"base": base, "user": load_role(args.user, "user", args, cache) if args.user else base},
        {"base": args.model, **folders},
    )
    for kind in {s.speakers for s in systems} | {s.order for s in systems}:
        if kind in folders:
            roles[kind] = load_role(
                folders[kind], "director" if kind == "trained-director" else "speakers", args, cache
            )
    encoder = models.SentenceEncoder(args.device)
    judge = make_judge(
        args, None if args.judge == "offline" else out / "judge_cache.jsonl", args.personas, encoder
    )
    nli = loading.load_nli(cfg.nli_model, args.device) if cfg.nli_model else None
    plan = evaluate.plan_conversations(
        inputs.held_out, cfg.contexts, evaluate.profile_ids(cfg.profiles, inputs.profiles)
    )
    fewshot = (
        files.asset("fewshot.json").get(args.set, [])
        if any(s.style.startswith("few") for s in systems)
        else []
    )
    pipelines = {
        "self-consistency": lambda s: extra("baselines").SelfConsistency(
            cfg.sc_samples, cfg.sc_pick, judge, s.style
        ),
        "multiagentesc": lambda s: extra("baselines").MultiAgentESC(),
    }
    setup = evaluate.Setup(
        [c for c, _ in plan],
        [p for _, p in plan],
        roles,
        names,
        fewshot,
        encoder,
        judge,
        nli,
        extra("evaluators").PersonaIdentifier(*base, inputs.personas) if cfg.persona_id else None,
        extra("strategies").FunctionEvaluator(base[1], inputs.personas)
        if any(p.esconv_strategies for p in inputs.personas.personas)
        else None,
        extra("safety").default_guard(),
        pipelines,
    )  # people read these transcripts
    profiles = list(dict.fromkeys(setup.profiles))
    protocol = {
        "summary": f"{len(plan)} conversations per system: {len({c.id for c, _ in plan})} held-out '{args.set}' "
        f"contexts of `{args.data}` x {len(profiles)} profile(s) ({', '.join(profiles)}); {inputs.split}; "
        f"seed {args.seed}; {args.turns} agent turns, the user every {args.user_every}; "
        f"{cfg.role_setting} persona cards; simulated user {args.user or args.model}; every system sees "
        "the same contexts, profiles and seeds.",
        "contexts": [c.id for c in setup.contexts],
        "profiles": setup.profiles,
        "judge": judge.name,
        "config": {
            k: v
            for k, v in vars(args).items()
            if k not in ("systems", "run", "pairwise", "pairwise_by")
        },
        "models": {k: folder_stamp(f) for k, f in folders.items()},
    }
    trained_with = {
        k: files.read_json(c).get("judge", "offline")
        if c.is_file()
        else "offline (assumed: no config.json)"
        for k, c in ((k, run / f"stage{k}" / "config.json") for k in (1, 2))
    }
    t0 = time.time()
    results = evaluate.run(
        cfg,
        setup,
        inputs,
        out,
        systems,
        skipped,
        protocol,
        args.max_new_tokens,
        args.turns,
        args.user_every,
        args.seed,
        args.judge,
        trained_with,
    )
    print((out / "results.md").read_text(encoding="utf-8"))
    print(
        f"evaluation: {time.time() - t0:.0f} s; wrote {out}/results.md, results.json, transcripts.jsonl"
    )
    return results


# --- main -------------------------------------------------------------------------------------------
def main(argv=None) -> int:
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
        with (
            runs.run_lock(args.run)
            if os.environ.get("RANK", "0") == "0"
            else contextlib.nullcontext()
        ):
            if args.command == "train":
                # One process, or the torchrun processes (extras/multigpu.py) when WORLD_SIZE > 1.
                ranks = Ranks(args) if int(os.environ.get("WORLD_SIZE", "1")) > 1 else OneProcess()
                (train_stage1 if args.stage == 1 else train_stage2)(args, ranks)
            else:
                evaluate_cmd(args)
    except (
        UserError,
        OSError,
        KeyboardInterrupt,
    ) as err:  # OSError: the environment (read-only, a full disk)
        again = "run the same command" + (
            " with --resume" if argv[:1] == ["train"] else " (it picks up what is done)"
        )
        if isinstance(err, KeyboardInterrupt):
            print(
                f"interrupted: checkpoints and the judge cache are on disk; {again}",
                file=sys.stderr,
            )
            return 130
        if isinstance(
            err, OSError
        ):  # every file is written whole (a temporary name, renamed), so resuming is exact
            err = f"{err.filename or 'a file'}: {err.strerror or err}" + (
                f"; free space, {again}" if err.errno == errno.ENOSPC else ""
            )
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
