"""mascot.py: the one entry point. Every stage of MASCOT is a subcommand.

    python mascot.py train --stage 1    Phase I: candidates -> AI judge -> preference pairs ->
                                        reward model (Bradley-Terry) -> GRPO on the speakers
    python mascot.py train --stage 2    Phase II: frozen speakers + simulated user; GRPO on the
                                        director over N-turn rollouts
    python mascot.py simulate           write conversations for contexts, a profile and a policy
    python mascot.py judge-eval         measure a judge on labelled preference pairs
    python mascot.py --help             everything, with defaults

Each command writes into a run folder (default runs/default):

    runs/default/stage1/  states.jsonl candidates.jsonl judge_cache.jsonl pairs.jsonl
                          reward_model/ metrics.jsonl samples/ checkpoints/ speakers/ summary.json
    runs/default/stage2/  decision_points.jsonl metrics.jsonl samples/ checkpoints/ director/ summary.json

This file only wires the stages together: read it top to bottom to see the whole pipeline, and
follow the calls into the module that does each part (the README's reading order).
Bad input never shows a traceback: every user-facing problem raises data.UserError, printed here
as one line, and the process exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from data import fraction, positive_int

ROOT = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# Flags (one configuration surface: every default lives here, with its help text)
# ----------------------------------------------------------------------------------------------

def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m",
                   help="base model: smollm2-135m (embedded), tiny (random, tests), a folder, or a hub id")
    p.add_argument("--personas", default=str(ROOT / "personas.json"), help="persona file")
    p.add_argument("--set", default="support", help="persona set in the persona file (support | meeting)")
    p.add_argument("--data", default="bundled",
                   help="contexts: 'bundled' or a dataset file/folder (Empathetic Dialogues CSV/JSONL, "
                        "ESConv JSON/JSONL, QMSum folder)")
    p.add_argument("--profiles-file", default=str(ROOT / "data" / "profiles.json"),
                   help="Big Five simulated-user profiles")
    p.add_argument("--run", default="runs/default", help="run folder for every artifact")
    p.add_argument("--seed", type=int, default=0, help="one seed for everything (data split, sampling)")
    p.add_argument("--held-out", type=fraction("--held-out"), default=0.25,
                   help="share of contexts kept for held-out evaluation")
    p.add_argument("--device", default="cpu", help="cpu | cuda")
    p.add_argument("--max-new-tokens", type=positive_int("--max-new-tokens"), default=48,
                   help="longest generated turn, in tokens")
    p.add_argument("--judge", default="offline",
                   help="offline (default) | hf:<model id or folder> | openai:<base url> | rm:<folder>")
    p.add_argument("--judge-model", default=None, help="model name for an openai: judge")


def add_grpo(p: argparse.ArgumentParser, steps: int, lr: float, beta: float, prompts: int) -> None:
    g = p.add_argument_group("GRPO")
    g.add_argument("--steps", type=positive_int("--steps"), default=steps, help="optimiser steps")
    g.add_argument("--prompts-per-step", type=positive_int("--prompts-per-step"), default=prompts,
                   help="distinct prompts (states / decision points) per step")
    g.add_argument("--group-size", type=positive_int("--group-size", minimum=2), default=4, help="G samples per prompt (>= 2)")
    g.add_argument("--lr", type=float, default=lr, help="AdamW learning rate (full fine-tuning)")
    g.add_argument("--beta", type=float, default=beta, help="KL weight to the frozen reference (0 skips it)")
    g.add_argument("--eps-low", type=float, default=0.2, help="lower clip range")
    g.add_argument("--eps-high", type=float, default=0.28, help="upper clip range (DAPO clip-higher)")
    g.add_argument("--loss-type", choices=["dapo", "grpo"], default="dapo",
                   help="dapo: token mean over the step; grpo: per-sequence mean (DeepSeekMath)")
    g.add_argument("--no-scale-rewards", action="store_true", help="Dr. GRPO: do not divide by the group std")
    g.add_argument("--num-iterations", type=positive_int("--num-iterations"), default=1,
                   help="optimisation passes per sampled batch")
    g.add_argument("--micro-batch", type=positive_int("--micro-batch"), default=8,
                   help="completions per forward/backward (gradient accumulation)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature while training")
    g.add_argument("--save-every", type=positive_int("--save-every"), default=10, help="checkpoint every N steps")
    g.add_argument("--dump-every", type=positive_int("--dump-every"), default=5, help="dump samples every N steps")
    g.add_argument("--autocast-bf16", action="store_true",
                   help="bf16 autocast for forward passes (GPU); weights, gradients and AdamW stay fp32")
    g.add_argument("--gradient-checkpointing", action="store_true",
                   help="recompute activations in backward: much less memory, ~1/3 more compute")
    g.add_argument("--resume", action="store_true", help="continue from the newest complete checkpoint")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mascot.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train stage 1 (speakers) or stage 2 (director)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    t.add_argument("--stage", type=int, choices=[1, 2], required=True)
    add_common(t)
    add_grpo(t, steps=20, lr=5e-6, beta=0.02, prompts=4)
    s1 = t.add_argument_group("stage 1")
    s1.add_argument("--states", type=positive_int("--states"), default=48,
                    help="training states (context, persona, conversation so far)")
    s1.add_argument("--heldout-states", type=positive_int("--heldout-states"), default=16,
                    help="held-out states for the before/after reward")
    s1.add_argument("--candidates", type=positive_int("--candidates", minimum=2), default=4, help="K candidate replies per state")
    s1.add_argument("--margin", type=float, default=0.05,
                    help="minimum judge-score gap (0-1 scale) for a preference pair")
    s1.add_argument("--pairs-per-state", type=positive_int("--pairs-per-state"), default=2,
                    help="at most this many pairs per state (widest gaps first)")
    s1.add_argument("--rm-epochs", type=positive_int("--rm-epochs"), default=2, help="reward-model epochs")
    s1.add_argument("--rm-lr", type=float, default=2e-5, help="reward-model learning rate")
    s1.add_argument("--rm-held-out", type=fraction("--rm-held-out"), default=0.2,
                    help="share of pairs held out to measure the reward model")
    s1.add_argument("--format-weight", type=float, default=1.0,
                    help="weight of the format reward next to the reward-model score")
    s2 = t.add_argument_group("stage 2")
    s2.add_argument("--speakers", default=None,
                    help="speaker model folder (default: RUN/stage1/speakers if it exists, else --model)")
    s2.add_argument("--director-model", default=None, help="initial director (default: --model)")
    s2.add_argument("--director-warmup", type=positive_int("--director-warmup", 0), default=20,
                    help="supervised steps (4 examples each) teaching the director the three-line format "
                         "before GRPO, with random agents; 0 skips it (see director.py, section 5)")
    s2.add_argument("--warmup-lr", type=float, default=2e-5, help="learning rate of the format warm start")
    s2.add_argument("--rollout-turns", type=positive_int("--rollout-turns"), default=3,
                    help="N: agent turns rolled out after each sampled directive")
    s2.add_argument("--user-every", type=int, default=2,
                    help="the simulated user answers after every N agent turns")
    s2.add_argument("--decision-points", type=positive_int("--decision-points"), default=24,
                    help="training decision points (conversation prefixes) to sample from")
    s2.add_argument("--heldout-points", type=positive_int("--heldout-points"), default=8,
                    help="held-out decision points for the before/after group reward")
    for name, default in [("coherence", 1.0), ("nonredundancy", 1.0), ("contribution", 0.5),
                          ("balance", 0.5), ("format", 0.5)]:
        s2.add_argument(f"--w-{name}", type=float, default=default, help=f"group-reward weight of {name}")

    j = sub.add_parser("judge-eval", help="accuracy of a judge on labelled preference pairs",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    j.add_argument("--pairs", required=True, nargs="+", help="JSONL file(s) of labelled pairs")
    j.add_argument("--judge", default="offline", help="offline | hf:<id> | openai:<url> | rm:<folder>")
    j.add_argument("--judge-model", default=None, help="model name for an openai: judge")
    j.add_argument("--cache", default=None, help="judge cache file (JSONL); none by default")

    s = sub.add_parser("simulate", help="simulate conversations and write transcripts",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common(s)
    s.add_argument("--contexts", type=positive_int("--contexts"), default=4, help="how many contexts")
    s.add_argument("--policy", default="round-robin",
                   choices=["round-robin", "random", "least-spoken", "director"], help="speaker selection")
    s.add_argument("--director", default=None,
                   help="director model for --policy director (default: RUN/stage2/director, else --model)")
    s.add_argument("--speakers", default=None, help="speaker model (default: RUN/stage1/speakers, else --model)")
    s.add_argument("--profile", default="average", help="Big Five profile id, or 'all'")
    s.add_argument("--turns", type=positive_int("--turns"), default=6, help="agent turns per conversation")
    s.add_argument("--user-every", type=int, default=2, help="the user answers after every N agent turns")
    s.add_argument("--out", default=None, help="transcript file (default RUN/simulate/<policy>.jsonl)")
    import chat
    import evaluate
    e = sub.add_parser("evaluate", help="compare systems: rubric judges, redundancy, pairwise preference",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_common(e)
    evaluate.add_arguments(e)

    c = sub.add_parser("chat", help="talk to the companion group in the terminal",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    chat.add_arguments(c)

    r = sub.add_parser("report", help="write RUN/report.html: curves, tables, conversations",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--run", default="runs/default", help="run folder")

    d = sub.add_parser("demo", help="the whole pipeline on the embedded model with a CPU budget",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    d.add_argument("--run", default="runs/demo", help="run folder")
    d.add_argument("--model", default="smollm2-135m", help="base model")
    return parser


# ----------------------------------------------------------------------------------------------
# Shared set-up
# ----------------------------------------------------------------------------------------------

def log_config(args, folder: Path) -> None:
    """Write and print the resolved configuration once per run (STYLE: log it once)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items()}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    print("config: " + " ".join(f"{k}={v}" for k, v in config.items()), flush=True)


def load_inputs(args):
    """Personas, train/held-out contexts and profiles, all validated with one-line errors."""
    import data
    personas = data.load_personas(args.personas, args.set)
    contexts = data.load_contexts(args.data, persona_set=args.set)
    if len(contexts) < 2:
        raise data.UserError(f"--data {args.data}: only {len(contexts)} '{args.set}' context(s); need at least 2")
    train, held = data.split_contexts(contexts, args.held_out, seed=args.seed)
    if not held:
        held = train[-1:]
    profiles = {p.id: p for p in data.load_profiles(args.profiles_file)}
    return personas, train, held, profiles


def existing(folder: Path) -> str | None:
    return str(folder) if (folder / "config.json").exists() else None


def grpo_config(args):
    import grpo
    return grpo.GRPOConfig(
        steps=args.steps, prompts_per_step=args.prompts_per_step, group_size=args.group_size,
        lr=args.lr, beta=args.beta, eps_low=args.eps_low, eps_high=args.eps_high,
        loss_type=args.loss_type, scale_rewards=not args.no_scale_rewards,
        num_iterations=args.num_iterations, micro_batch=args.micro_batch,
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
        save_every=args.save_every, dump_every=args.dump_every,
        autocast_bf16=args.autocast_bf16, gradient_checkpointing=args.gradient_checkpointing)


# ----------------------------------------------------------------------------------------------
# Stage 1: persona-aware behavioural alignment
# ----------------------------------------------------------------------------------------------

def train_stage1(args) -> dict:
    import grpo
    import models
    import reward
    from judge import make_judge
    from simulate import Cast, run_conversations

    out = Path(args.run) / "stage1"
    log_config(args, out)
    personas, train_ctx, held_ctx, profiles = load_inputs(args)
    base, tok = models.load_model(args.model, device=args.device)

    # 1. States: (context, persona, conversation so far). Contexts without a recorded dialogue
    #    get a short conversation from the base model (round-robin speakers, average user).
    states_path = out / "states.jsonl"
    if states_path.exists():
        states = reward.load_states(states_path, train_ctx + held_ctx)
    else:
        # Only the contexts the states will use (states cycle through the context lists).
        used = train_ctx[:args.states] + held_ctx[:args.heldout_states]
        need = [c for c in used if not c.turns]
        generated = {}
        if need:
            print(f"stage 1: generating short conversations for {len(need)} contexts (base model)", flush=True)
            cast = Cast(personas, base, tok, base, tok, args.max_new_tokens)
            from director import RoundRobin
            convs = run_conversations(need, RoundRobin(personas), cast, profiles, ["average"] * len(need),
                                      n_agent_turns=2, user_every=1, seed=args.seed)
            generated = {c.context.id: c.turns for c in convs}
        states = (reward.build_states(train_ctx, personas, args.states, args.seed, generated, "train")
                  + reward.build_states(held_ctx, personas, args.heldout_states, args.seed + 1, generated, "heldout"))
        reward.save_states(states_path, states)
    train_states = [s for s in states if s.split == "train"]
    held_states = [s for s in states if s.split == "heldout"]
    print(f"stage 1: {len(train_states)} training states, {len(held_states)} held-out states", flush=True)

    # 2. Candidates: K replies per training state from the base speaker policy.
    cand_path = out / "candidates.jsonl"
    candidates = reward.sample_candidates(base, tok, train_states, personas, args.candidates,
                                          args.max_new_tokens, args.seed, cand_path)

    # 3. Judge -> preference pairs (cached: a re-run pays for no judgement twice).
    pairs_path = out / "pairs.jsonl"
    judge = make_judge(args.judge, cache_path=out / "judge_cache.jsonl", model_name=args.judge_model)
    pairs = reward.judge_pairs(train_states, candidates, personas, judge, args.margin, args.pairs_per_state)
    reward.write_jsonl(pairs_path, pairs)
    print(f"stage 1: {len(pairs)} preference pairs from {len(train_states)} states "
          f"(judge {judge.name}, margin {args.margin})", flush=True)

    # 4. Reward model (Bradley-Terry) on the pairs; held-out accuracy printed.
    rm_dir = out / "reward_model"
    if (rm_dir / reward.CONFIG_FILE).exists():
        rm, rm_tok = reward.RewardModel.load(rm_dir, device=args.device)
        rm_metrics = json.loads((rm_dir / reward.CONFIG_FILE).read_text())["metrics"]
        print(f"stage 1: reusing the reward model in {rm_dir}", flush=True)
    else:
        torch_seed(args.seed)
        rm, rm_tok = reward.RewardModel.from_base(args.model, device=args.device)
        rm_metrics = reward.train_reward_model(rm, rm_tok, pairs, args.rm_held_out, args.rm_epochs,
                                               args.rm_lr, seed=args.seed)
        rm.save(rm_dir, rm_tok, rm_metrics)
    acc = rm_metrics.get("heldout_accuracy")
    print(f"reward model held-out accuracy: {'n/a (no held-out pairs)' if acc is None else f'{acc:.3f}'} "
          f"on {rm_metrics.get('n_heldout')} pairs", flush=True)

    # 5. GRPO on the speakers: reward = reward-model score + format_weight * format reward.
    policy, _ = models.load_model(args.model, device=args.device)
    ref = base if args.beta > 0 else None
    reward_fn = reward.speaker_reward_fn(rm, rm_tok, personas, args.format_weight)
    before = reward.heldout_reward(policy, tok, held_states, personas, reward_fn, args)
    print(f"held-out mean reward before GRPO: {before['reward']:.3f} ± {before['se']:.3f} (se) "
          f"(rm {before['rm']:.3f}, format {before['format']:.3f}; {before['n']} replies)", flush=True)

    def sample_prompts(step):
        rng = random.Random(args.seed * 1_000_003 + step)
        chosen = rng.sample(train_states, min(args.prompts_per_step, len(train_states)))
        return [s.prompt(personas) for s in chosen], chosen

    def describe(meta, texts, rewards):
        G = args.group_size
        return [{"state": meta[i // G].id, "persona": meta[i // G].persona, "reply": t, "reward": r}
                for i, (t, r) in enumerate(zip(texts, rewards))]

    grpo.train_grpo(policy, tok, sample_prompts, lambda meta, texts, gen: reward_fn(
        [m for m in meta for _ in range(args.group_size)], texts, gen.finished),
        grpo_config(args), out, ref_model=ref, resume=args.resume, describe=describe)
    after = reward.heldout_reward(policy, tok, held_states, personas, reward_fn, args)
    print(f"held-out mean reward after GRPO:  {after['reward']:.3f} ± {after['se']:.3f} (se) "
          f"(rm {after['rm']:.3f}, format {after['format']:.3f}; {after['n']} replies)", flush=True)
    change, change_se = reward.paired_change(before["rewards"], after["rewards"])
    after["change"], after["change_se"] = change, change_se
    print(f"held-out change: {change:+.3f} ± {change_se:.3f} (paired se; same states and seeds)", flush=True)
    speakers = out / "speakers"
    policy.save_pretrained(speakers)
    tok.save_pretrained(speakers)
    summary = {"pairs": len(pairs), "reward_model": rm_metrics, "heldout_before": before,
               "heldout_after": after, "judge": judge.name, "model": args.model, "speakers": str(speakers)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"stage 1 done: speakers saved to {speakers}", flush=True)
    return summary


def torch_seed(seed: int) -> None:
    import torch
    torch.manual_seed(seed)
    random.seed(seed)


# ----------------------------------------------------------------------------------------------
# Stage 2: collaborative dialogue optimisation (the director)
# ----------------------------------------------------------------------------------------------

def resolve_speakers(args) -> str:
    if args.speakers:
        return args.speakers
    return existing(Path(args.run) / "stage1" / "speakers") or args.model


def train_stage2(args) -> dict:
    import director as dr
    import grpo
    import models
    from judge import make_judge

    out = Path(args.run) / "stage2"
    log_config(args, out)
    personas, train_ctx, held_ctx, profiles = load_inputs(args)
    speakers_name = resolve_speakers(args)
    print(f"stage 2: speakers from {speakers_name} (frozen), simulated user {args.model} (frozen)", flush=True)
    speaker_model, speaker_tok = models.load_model(speakers_name, device=args.device)
    user_model, user_tok = ((speaker_model, speaker_tok) if speakers_name == args.model
                            else models.load_model(args.model, device=args.device))
    director_name = args.director_model or args.model
    policy, tok = models.load_model(director_name, device=args.device)
    encoder = models.SentenceEncoder(device=args.device)
    judge = make_judge(args.judge, cache_path=out / "judge_cache.jsonl", model_name=args.judge_model)
    from simulate import Cast
    cast = Cast(personas, speaker_model, speaker_tok, user_model, user_tok, args.max_new_tokens)
    weights = dr.RewardWeights(args.w_coherence, args.w_nonredundancy, args.w_contribution,
                               args.w_balance, args.w_format)
    profile_ids = sorted(profiles)
    train_points = dr.build_decision_points(train_ctx, args.decision_points, cast, profiles, profile_ids,
                                            args.user_every, args.seed)
    held_points = dr.build_decision_points(held_ctx, args.heldout_points, cast, profiles, profile_ids,
                                           args.user_every, args.seed + 1)
    dr.save_decision_points(out / "decision_points.jsonl", train_points, held_points)
    rollout = dr.Rollout(cast, profiles, personas, encoder, judge, weights, args.rollout_turns, args.user_every)

    director = dr.LLMDirector(policy, tok, personas, max_new_tokens=40)
    before = rollout.evaluate(director, held_points)
    print(f"held-out mean group reward before: {before['reward']:.3f}  agent choices: {before['choices']}"
          f"  unparseable: {before['invalid']}/{before['n']}", flush=True)
    warm = warm_start_director(args, out, policy, tok, personas, train_points, rollout, director, held_points)
    # The KL anchor is the director GRPO starts from: the warm-started one when the warm start ran.
    ref = (models.load_model(str(out / "director_warm") if warm else director_name, device=args.device)[0]
           if args.beta > 0 else None)

    def sample_prompts(step):
        rng = random.Random(args.seed * 1_000_003 + step)
        chosen = rng.sample(train_points, min(args.prompts_per_step, len(train_points)))
        return [dr.director_messages(personas, c) for c in chosen], chosen

    def reward_fn(meta, texts, gen):
        return rollout.score_directives(meta, texts, args.group_size)

    def describe(meta, texts, rewards):
        G = args.group_size
        return [{"context": meta[i // G].context.id, "directive": t, "reward": r}
                for i, (t, r) in enumerate(zip(texts, rewards))]

    grpo.train_grpo(policy, tok, sample_prompts, reward_fn, grpo_config(args), out, ref_model=ref,
                    resume=args.resume, describe=describe)
    after = rollout.evaluate(director, held_points)
    print(f"held-out mean group reward after:  {after['reward']:.3f}  agent choices: {after['choices']}", flush=True)
    folder = out / "director"
    policy.save_pretrained(folder)
    tok.save_pretrained(folder)
    summary = {"heldout_before": before, "warm_start": warm, "heldout_after": after, "speakers": speakers_name,
               "judge": judge.name, "model": args.model, "director": str(folder),
               "invalid_directives": rollout.invalid, "directives": rollout.total}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"stage 2 done: director saved to {folder}", flush=True)
    return summary


def warm_start_director(args, out: Path, policy, tok, personas, train_points, rollout, director,
                        held_points) -> dict | None:
    """The supervised format warm start of the director (director.py, section 5), run once.

    Its result (losses, held-out group reward) goes to warm_start.json and the weights to
    stage2/director_warm; a resumed run that already has GRPO checkpoints skips it, because
    those checkpoints were trained from the warm-started weights."""
    import director as dr
    import grpo
    path = out / "warm_start.json"
    if args.director_warmup == 0:
        return None
    if args.resume and grpo.latest_checkpoint(out / "checkpoints") and path.exists():
        return json.loads(path.read_text(encoding="utf-8"))
    examples = dr.format_examples(personas, train_points, args.director_warmup * 4, args.seed)
    t0 = time.time()
    losses = dr.supervised_warm_start(policy, tok, examples, args.director_warmup, batch_size=4,
                                      lr=args.warmup_lr, log=lambda s: print(s, flush=True))
    seconds = time.time() - t0
    held = rollout.evaluate(director, held_points)
    print(f"held-out mean group reward after the format warm start: {held['reward']:.3f}  agent choices: "
          f"{held['choices']}  unparseable: {held['invalid']}/{held['n']}", flush=True)
    policy.save_pretrained(out / "director_warm")
    tok.save_pretrained(out / "director_warm")
    warm = {"steps": args.director_warmup, "lr": args.warmup_lr, "losses": losses,
            "seconds": round(seconds, 1), "heldout": held}
    path.write_text(json.dumps(warm, indent=2) + "\n", encoding="utf-8")
    return warm


# ----------------------------------------------------------------------------------------------
# judge-eval and simulate
# ----------------------------------------------------------------------------------------------

def judge_eval(args) -> None:
    import judge as J
    judge = J.make_judge(args.judge, cache_path=args.cache, model_name=args.judge_model)
    pairs = [p for path in args.pairs for p in J.load_pairs(path)]
    t0 = time.time()
    result = J.evaluate_pairs(judge, pairs)
    print(J.format_eval_report(result))
    print(f"({len(pairs)} pairs, judge {judge.name}, {time.time() - t0:.1f} s)")


def simulate_cmd(args) -> None:
    import data
    import director as dr
    import models
    from simulate import Cast, assign_profiles, run_conversations, write_transcripts

    personas, train_ctx, held_ctx, profiles = load_inputs(args)
    contexts = (held_ctx + train_ctx)[:args.contexts]
    ids = sorted(profiles) if args.profile == "all" else [p.id for p in data.load_profiles(
        args.profiles_file, [args.profile])]
    speakers_name = resolve_speakers(args)
    speaker_model, speaker_tok = models.load_model(speakers_name, device=args.device)
    user = ((speaker_model, speaker_tok) if speakers_name == args.model
            else models.load_model(args.model, device=args.device))
    director = None
    if args.policy == "director":
        name = args.director or existing(Path(args.run) / "stage2" / "director") or args.model
        director = models.load_model(name, device=args.device)
    policy = dr.make_policy(args.policy, personas, director, args.seed)
    cast = Cast(personas, speaker_model, speaker_tok, user[0], user[1], args.max_new_tokens)
    convs = run_conversations(contexts, policy, cast, profiles, assign_profiles(len(contexts), ids, args.seed),
                              args.turns, args.user_every, args.seed)
    out = Path(args.out) if args.out else Path(args.run) / "simulate" / f"{args.policy}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_transcripts(out, convs)
    for c in convs[:2]:
        print(f"--- {c.context.id} ({c.profile}, {c.policy})")
        for t in c.turns:
            print(f"{t.speaker}: {t.text}")
    print(f"wrote {len(convs)} conversations to {out}")


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
# (without them it writes no parseable directive and GRPO gets no signal; director.py, section 5).
DEMO_STAGE2 = ["--decision-points", "6", "--heldout-points", "4", "--steps", "3", "--prompts-per-step", "2",
               "--group-size", "4", "--rollout-turns", "2", "--max-new-tokens", "32", "--lr", "1e-5",
               "--beta", "0", "--director-warmup", "8", "--warmup-lr", "1e-4", "--save-every", "3",
               "--dump-every", "3"]
# The prompted-director and few-shot-CoT baselines are left out of the demo to save ~2 minutes;
# `python mascot.py evaluate --run runs/demo` runs every system.
DEMO_EVAL = ["--contexts", "4", "--turns", "4", "--max-new-tokens", "32",
             "--systems", "zero-shot,round-robin,mascot-p,mascot-c,mascot"]


def demo(args) -> None:
    """Stage 1, stage 2, evaluation and the report, each skipped when already complete, each
    resumed from its newest checkpoint when interrupted (re-run `make demo` to continue)."""
    import grpo
    import report
    run = Path(args.run)
    common = ["--model", args.model, "--run", str(run)]
    t0 = time.time()
    for stage, budget in ((1, DEMO_STAGE1), (2, DEMO_STAGE2)):
        folder = run / f"stage{stage}"
        if (folder / "summary.json").exists():
            print(f"demo: stage {stage} already done in {folder}")
            continue
        resume = ["--resume"] if grpo.latest_checkpoint(folder / "checkpoints") else []
        print(f"\n=== demo: stage {stage} ({time.time() - t0:.0f} s so far) ===", flush=True)
        sub = build_parser().parse_args(["train", "--stage", str(stage), *common, *budget, *resume])
        (train_stage1 if stage == 1 else train_stage2)(sub)
    print(f"\n=== demo: evaluation ({time.time() - t0:.0f} s so far) ===", flush=True)
    import evaluate
    results = evaluate.run(build_parser().parse_args(["evaluate", *common, *DEMO_EVAL]))
    path = report.build_report(run)
    print_side_by_side(run / "eval" / "transcripts.jsonl")
    print(f"\ndemo finished in {time.time() - t0:.0f} s; results in {run}/eval/results.md, report: {path}")
    return results


def print_side_by_side(transcripts: Path, width: int = 60) -> None:
    """One conversation before (base speakers, round-robin) and after training (mascot, else an
    ablation), same context, printed in two columns."""
    import textwrap
    if not transcripts.exists():
        return
    rows = [json.loads(l) for l in transcripts.read_text(encoding="utf-8").splitlines() if l.strip()]
    by_system: dict[str, list[dict]] = {}
    for r in rows:
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
    from data import UserError
    try:
        if args.command == "train":
            (train_stage1 if args.stage == 1 else train_stage2)(args)
        elif args.command == "judge-eval":
            judge_eval(args)
        elif args.command == "simulate":
            simulate_cmd(args)
        elif args.command == "evaluate":
            import evaluate
            evaluate.run(args)
        elif args.command == "chat":
            import chat
            return chat.run_chat(args)
        elif args.command == "report":
            import report
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
