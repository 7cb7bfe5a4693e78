"""extras/compare.py: two sets of speakers at the same held-out points, paired: what did training change?

A tool beside stage 1. `train --stage 1` on ESConv writes two sets of speakers: the warm start alone
(RUN/stage1/speakers_warm) and the warm start after GRPO (RUN/stage1/speakers). Whether GRPO added
anything is a paired question: the same conversation, the same persona, the same sampling seed, one
reply from each. For each of --contexts held-out dialogues of --data, one point is cut just after a
user turn (the real conversation so far, as stage 1's states are); every persona of the set replies
there from speakers A and from speakers B, --seeds times each, the same seeds on both sides. Every
reply is scored by what training did not optimise:
  persona function     the evaluator's classifier of ESConv's strategy labels (extras/strategies.py,
                       fitted on dialogues the judge never saw): 1 if the job it reads in the reply is
                       its persona's; also on the first 32 tokens, so length cannot help
  hack diagnostics     metrics.diagnose: copying, echoing, repeating, leaking the prompt, trivial
                       replies, word salad
  Self-BLEU            between the personas' replies at one point (high: the cards say the same)
  base-model NLL       nats per token of the reply under the frozen --model, given the same prompt
                       the speaker saw; the real supporter's next turn at the point is scored alike,
                       under the card whose strategies include its label, as a reference
  length               words per reply
and, marked as such, by the judge stage 1 trained on (its score of the reply, 0-1).
Each number is averaged per context first: a context's personas and seeds are not independent
evidence, so the context is the unit of every standard error and of the 95% bootstrap interval of
the paired change B - A. Per persona it shows persona function, the judge's score and length side
by side: where the judge rose and the evaluator did not, the reward's signal was lost on the way.
    python mascot.py compare-speakers --data esconv/train.jsonl --a RUN/stage1/speakers_warm \
        --b RUN/stage1/speakers --contexts 60 --seeds 4        (writes RUN/compare_speakers.json)
"""

import random
from pathlib import Path

import torch

import grpo
import models
from metrics import DIAGNOSTICS, bootstrap_ci, mean_or_none, self_bleu, standard_error
from plumbing import files, loading
from plumbing.cli import flag_type
from plumbing.common import UserError, derive_seed
from plumbing.devices import release_memory
from reward import State, shown
from simulate import USER, Turn

BATCH = 32  # prompts per generate call and per scoring pass
HACK_ROWS = [k for k in DIAGNOSTICS if k != "words"]  # the 0/1 flags of metrics.diagnose


# --- The points: one per held-out dialogue, every persona replying there --------------------------
def points(contexts: list, personas, seed: int) -> list[tuple[list[State], tuple]]:
    """Per context: the states of every persona at one cut just after a user turn that a supporter
    answered (the conversation so far, as stage 1's states), and (that supporter's real next turn, its
    strategy label)."""
    out = []
    for ctx in contexts:
        turns = [
            Turn(USER if t["speaker"] == "user" else "Supporter", t["text"]) for t in ctx.turns
        ]
        strategies = [t.get("strategy") for t in ctx.turns]
        answered = [
            k + 1
            for k in range(len(turns) - 1)
            if turns[k].speaker == USER and turns[k + 1].speaker != USER
        ]
        if not answered:
            continue
        cut = random.Random(derive_seed(seed, "compare", ctx.id)).choice(answered)
        states = [
            State(f"{ctx.id}-{p.name}", "heldout", ctx, p.name, turns[:cut])
            for p in personas.personas
        ]
        out.append((states, (turns[cut], strategies[cut])))
    return out


def sample(model, tok, states: list[State], personas, args, draw: int) -> list[str]:
    """One cleaned reply per state; the seed depends on the state and the draw, not on the model, so
    both sides of the comparison sample with the same randomness."""
    replies = []
    for start in range(0, len(states), BATCH):
        chunk = states[start : start + BATCH]
        seeds = [derive_seed(args.seed, draw, s.id) for s in chunk]
        chats = [s.prompt(personas) for s in chunk]
        texts = models.generate_texts(
            model, tok, chats, args.max_new_tokens, args.temperature, seeds=seeds
        )
        names = personas.names()
        replies += [models.clean_reply(t, s.persona, names) for s, t in zip(chunk, texts)]
    return replies


@torch.no_grad()
def nll_per_token(model, tok, prompts: list[list[dict]], replies: list[str]) -> list[float | None]:
    """-log p(reply | prompt) / tokens under a frozen model (None for an empty reply)."""
    rows = []
    for messages, reply in zip(prompts, replies):
        ids = tok(reply.strip(), add_special_tokens=False)["input_ids"]
        rows.append((models.chat_prompt_ids(tok, [messages])[0], ids))
    out: list[float | None] = [None] * len(rows)
    order = sorted((i for i, r in enumerate(rows) if r[1]), key=lambda i: len(rows[i][0]))
    for start in range(0, len(order), BATCH // 2):
        batch = order[start : start + BATCH // 2]
        logps, mask = grpo.target_logprobs(model, tok.pad_token_id, [rows[i] for i in batch])
        per_row = (logps * mask).sum(1) / mask.sum(1)  # (B,) mean log-prob per token
        for i, v in zip(batch, per_row.tolist()):
            out[i] = -v
    return out


# --- Scores of one side's replies ---------------------------------------------------------------------
def score_side(replies, states, personas, scorers: dict) -> list[dict]:
    """Per reply: persona function (full, first 32 tokens), the hack flags, words, base NLL, the
    judge's score. `states` and `replies` are aligned."""
    function = scorers["function"].score([(s.persona, r) for s, r in zip(states, replies)])
    nll = nll_per_token(
        scorers["base"][0], scorers["base"][1], [s.prompt(personas) for s in states], replies
    )
    judged = scorers["judge"].score_many([s.judge_state(personas) for s in states], replies)
    rows = []
    for s, r, f, n, j in zip(states, replies, function, nll, judged):
        row = {"persona": s.persona, **f, **s.diagnose(personas, r), "nll": n, "judge": j}
        rows.append(row)
    return rows


def per_context(rows: list[dict], replies: list[str], key: str) -> list:
    """One value per context: the mean of `key` over its personas and draws; Self-BLEU is computed
    between the personas' replies of each (context, draw) first."""
    groups: dict[tuple, list] = {}
    for r, text in zip(rows, replies):
        groups.setdefault((r["context"], r["draw"]), []).append((r, text))
    per: dict[int, list] = {}
    for (context, _), block in sorted(groups.items()):
        if key == "self_bleu":
            value = self_bleu([text for _, text in block])
        else:
            value = mean_or_none([r[key] for r, _ in block])
        per.setdefault(context, []).append(value)
    return [mean_or_none(v) for _, v in sorted(per.items())]


def paired(a: list, b: list, seed: int) -> dict:
    """Means of A and B, and B - A over the contexts both have: mean, se, 95% bootstrap interval."""
    both = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    diff = [y - x for x, y in both]
    mean, low, high = bootstrap_ci(diff, seed=seed)
    return {
        "a": mean_or_none([x for x, _ in both]),
        "b": mean_or_none([y for _, y in both]),
        "change": mean,
        "se": standard_error(diff),
        "ci": [low, high],
        "n": len(both),
    }


ROWS = [
    ("function", "persona function (independent)"),
    ("function_equal", "the same, first 32 tokens"),
    *[(k, f"{k.replace('_', ' ')}") for k in HACK_ROWS],
    ("self_bleu", "Self-BLEU across the personas"),
    ("nll", "base-model NLL, nats/token"),
    ("words", "reply length (words)"),
    ("judge", "the judge's score (trained on)"),
]


def compare(a_rows, b_rows, a_replies, b_replies, seed: int) -> dict:
    """Every row of ROWS, A against B, paired by context."""
    table = {}
    for key, _ in ROWS:
        a = per_context(a_rows, a_replies, key)
        b = per_context(b_rows, b_replies, key)
        table[key] = paired(a, b, seed)
    return table


# Per persona: the evaluator's function, the judge's score (what the reward model learnt) and the
# length. Side by side they show where a reward's signal is lost: the judge up, the evaluator not.
PERSONA_ROWS = [
    ("function", "persona function, per persona:"),
    ("judge", "the judge's score, per persona:"),
    ("words", "reply length (words), per persona:"),
]


def by_persona(
    a_rows, b_rows, a_replies, b_replies, names: list[str], seed: int, key: str = "function"
) -> dict:
    """`key` (a row's field) of each persona's replies, A against B, paired by context."""
    out = {}
    for k, name in enumerate(names):
        a = [(r, t) for r, t in zip(a_rows, a_replies) if r["persona"] == name]
        b = [(r, t) for r, t in zip(b_rows, b_replies) if r["persona"] == name]
        a_values = per_context([r for r, _ in a], [t for _, t in a], key)
        b_values = per_context([r for r, _ in b], [t for _, t in b], key)
        out[name] = paired(a_values, b_values, seed + k)
    return out


# --- The command ---------------------------------------------------------------------------------------
def parse_args(argv: list[str], cli):
    p = cli.Parser(
        prog="mascot.py compare-speakers",
        description=__doc__.split("\n")[0],
        formatter_class=cli.Formatter,
    )
    cli.common_flags(p)
    p.add_argument("--a", required=True, help="speakers A (a model folder): the reference side")
    p.add_argument("--b", required=True, help="speakers B (a model folder): the side measured")
    p.add_argument(
        "--contexts",
        type=flag_type("--contexts", int, "positive"),
        default=60,
        help="held-out dialogues, one point each, every persona replying",
    )
    p.add_argument(
        "--seeds",
        type=flag_type("--seeds", int, "positive"),
        default=4,
        help="sampling draws per side at every point (the same seeds on both sides)",
    )
    p.add_argument(
        "--temperature",
        type=flag_type("--temperature", float, "positive"),
        default=0.8,
        help="the speakers' sampling temperature (the evaluation's)",
    )
    p.add_argument(
        "--show",
        type=flag_type("--show", int, "non-negative"),
        default=3,
        help="samples shown per persona",
    )
    p.add_argument(
        "--out", default=None, help="the JSON written (default: RUN/compare_speakers.json)"
    )
    return p.parse_args(argv)


def scorers(args, cli, inputs) -> dict:
    """The frozen base model (NLL), the evaluator's function classifier and the offline judge."""
    base = cli.load_role(args.model, "model", args)
    function = cli.extra("strategies").FunctionEvaluator(base[1], inputs.personas)
    judge = cli.make_judge(args, None, args.personas)
    return {"base": base, "function": function, "judge": judge}


def side(speakers: tuple, flag: str, args, inputs, grid: list[tuple]) -> list[str]:
    """Every reply of one side's (model, tokenizer), in the order of `grid` ((draw, context index,
    state) rows)."""
    replies = []
    for draw in range(args.seeds):
        states = [s for d, _, s in grid if d == draw]
        replies += sample(*speakers, states, inputs.personas, args, draw)
        print(f"{flag}: draw {draw + 1} of {args.seeds} sampled", flush=True)
    return replies


def main(argv: list[str], cli) -> int:
    """`mascot.py compare-speakers ...` (argv[0] is the command; cli is mascot.py)."""
    args = parse_args(argv[1:], cli)
    cli.check_device(args)
    inputs = cli.load_inputs(args)
    personas = inputs.personas
    if not all(p.esconv_strategies for p in personas.personas):
        raise UserError(
            f"--set {args.set}: every card must list esconv_strategies (the evaluator's labels)"
        )
    recorded = [c for c in inputs.held_out if c.turns]
    todo = points(recorded, personas, args.seed)[: args.contexts]
    if not todo:
        raise UserError(f"--data {args.data}: no held-out dialogue with a recorded supporter turn")
    # Draw-major: every draw samples all the points in one pass of batches.
    grid = [
        (d, c, s) for d in range(args.seeds) for c, (states, _) in enumerate(todo) for s in states
    ]
    # Both sides are loaded before any work, so a bad folder stops the command at once.
    speakers = {
        name: loading.load_model(folder, device=args.device, frozen=True, flag=f"--{name}")
        for name, folder in (("a", args.a), ("b", args.b))
    }
    replies = {name: side(m, f"--{name}", args, inputs, grid) for name, m in speakers.items()}
    del speakers
    release_memory()
    score = scorers(args, cli, inputs)
    states = [s for _, _, s in grid]
    rows = {}
    for name, texts in replies.items():
        rows[name] = score_side(texts, states, personas, score)
        for r, (d, c, _) in zip(rows[name], grid):
            r["draw"], r["context"] = d, c
    result = {
        "a": args.a,
        "b": args.b,
        "contexts": len(todo),
        "seeds": args.seeds,
        "temperature": args.temperature,
        "max_new_tokens": args.max_new_tokens,
        "table": compare(rows["a"], rows["b"], replies["a"], replies["b"], args.seed),
        "per_persona": {
            key: by_persona(
                rows["a"], rows["b"], replies["a"], replies["b"], personas.names(), args.seed, key
            )
            for key, _ in PERSONA_ROWS
        },
        "real_supporters_nll": real_nll(todo, personas, score),
        "samples": samples(grid, replies),
    }
    out = Path(args.out or Path(args.run) / "compare_speakers.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    files.write_json(out, result)
    print(report(result, personas.names(), args.show))
    print(f"written: {out}")
    return 0


def real_nll(todo, personas, score) -> dict:
    """The base-model NLL of the real supporters' next turns, each under the card whose strategies
    include its label (turns whose label no card lists are left out): the human reference."""
    prompts, replies = [], []
    for states, (turn, strategy) in todo:
        owner = [s for s in states if strategy in personas.find(s.persona).esconv_strategies]
        if owner:
            prompts.append(owner[0].prompt(personas))
            replies.append(turn.text)
    values = [v for v in nll_per_token(*score["base"], prompts, replies) if v is not None]
    return {"mean": mean_or_none(values), "se": standard_error(values), "n": len(values)}


def samples(grid: list[tuple], replies: dict) -> list[dict]:
    """Every reply, A beside B, with the user's message it answers: for reading."""
    rows = []
    for (draw, _, s), a, b in zip(grid, replies["a"], replies["b"]):
        row = {"context": s.context.id, "persona": s.persona, "draw": draw}
        rows.append({**row, "user": s.history[-1].text, "a": a, "b": b})
    return rows


def cell(v, digits: int = 3) -> str:
    """A number as the table shows it; - for none."""
    return "-" if v is None else f"{v:.{digits}f}"


def table_line(title: str, r: dict) -> str:
    """One row: A, B, B - A, its se and 95% interval."""
    low, high = r["ci"]
    return (
        f"{title:34} {cell(r['a']):>7} {cell(r['b']):>7} {cell(r['change']):>8} "
        f"{shown(r['se']):>6}  [{cell(low)}, {cell(high)}]"
    )


def report(result: dict, names: list[str], show: int) -> str:
    """What the command prints: the table; per persona the function, the judge's score and the
    length; the human reference; the first `show` points of each persona, A above B."""
    lines = [
        f"{result['contexts']} held-out contexts x {len(names)} personas x {result['seeds']} "
        f"draws, T {result['temperature']}, {result['max_new_tokens']} tokens; A = {result['a']}, "
        f"B = {result['b']}; B - A paired by context",
        f"{'':34} {'A':>7} {'B':>7} {'B - A':>8} {'se':>6}  95% interval",
    ]
    lines += [table_line(title, result["table"][key]) for key, title in ROWS]
    for key, title in PERSONA_ROWS:
        lines.append(title)
        lines += [table_line(f"  {name}", result["per_persona"][key][name]) for name in names]
    real = result["real_supporters_nll"]
    lines.append(
        f"real supporters' next turns, base-model NLL: {cell(real['mean'])} ± "
        f"{shown(real['se'])} ({real['n']} turns)"
    )
    for name in names:
        mine = [r for r in result["samples"] if r["persona"] == name and r["draw"] == 0][:show]
        for r in mine:
            lines += [
                f"[{name}, {r['context']}] user: {r['user']}",
                f"  A: {r['a']}",
                f"  B: {r['b']}",
            ]
    return "\n".join(lines)
