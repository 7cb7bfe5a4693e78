"""extras/conversations.py: `python mascot.py simulate`: write conversations for contexts, a Big Five
profile and a turn-taking policy, as JSON lines a person (or extras/report.py) can read.

The conversation engine itself is simulate.py; this is the tool that runs it outside training and
evaluation, with the crisis guard on (people read these transcripts). Policies: round-robin,
random, least-spoken (simulate.py's fixed rules) or the LLM director (RUN/stage2/director when stage
2 has run, else --model prompted). `make_policy` is shared with extras/chat.py.

    python mascot.py simulate --policy director --contexts 4 --profile all
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))      # the project's modules, from the repo root
import data  # noqa: E402
import evaluate  # noqa: E402
import models  # noqa: E402
from data import PersonaSet, UserError, flag_type  # noqa: E402
from director import LLMDirector  # noqa: E402
from extras.safety import default_guard  # noqa: E402
from simulate import Cast, LeastSpoken, RandomOrder, RoundRobin, assign_profiles, run_conversations  # noqa: E402

POLICIES = ("round-robin", "random", "least-spoken", "director")


def make_policy(name: str, personas: PersonaSet, director=None, seed: int = 0):
    """A --policy value: round-robin | random | least-spoken | director ((model, tok) given)."""
    if name == "director":
        return LLMDirector(*director, personas)
    if name == "random":
        return RandomOrder(personas, seed)
    rules = {"round-robin": RoundRobin, "least-spoken": LeastSpoken}
    if name not in rules:
        raise UserError(f"--policy {name}: use {', '.join(POLICIES)}")
    return rules[name](personas)


def main(argv: list[str], cli) -> int:
    p = argparse.ArgumentParser(prog="mascot.py simulate", description=__doc__.split("\n")[0], formatter_class=cli.Formatter)
    cli.common_flags(p)
    p.add_argument("--turns", type=flag_type("--turns", int, "positive"), default=4, help="agent turns per conversation")
    p.add_argument("--contexts", type=flag_type("--contexts", int, "positive"), default=4, help="how many contexts")
    p.add_argument("--policy", default="round-robin", choices=POLICIES, help="who speaks next")
    p.add_argument("--profile", default="average", help="Big Five profile id, or 'all'")
    p.add_argument("--out", default=None, help="transcript file (default RUN/simulate/<policy>.jsonl)")
    args = p.parse_args(argv[1:])
    inputs = cli.load_inputs(args)
    cli.check_device(args)
    cache = Path(args.run) / "simulate" / "served_cache.jsonl"
    speaker = cli.load_role(cli.speakers_of(args), "speakers", args, cache)
    user = cli.load_role(args.user or args.model, "user", args, cache)
    director = cli.load_role(args.director or models.trained_or(Path(args.run) / "stage2" / "director", args.model),
                             "director", args, cache) if args.policy == "director" else None
    ids = list(inputs.profiles) if args.profile == "all" else evaluate.profile_ids(args.profile, inputs.profiles)
    contexts = (inputs.held_out + inputs.train)[:args.contexts]
    convs = run_conversations(contexts, make_policy(args.policy, inputs.personas, director, args.seed),
                              Cast(inputs.personas, *speaker, *user, args.max_new_tokens, guard=default_guard()),
                              inputs.profiles, assign_profiles(len(contexts), ids, args.seed), args.turns,
                              args.user_every, args.seed)
    path = Path(args.out) if args.out else Path(args.run) / "simulate" / f"{args.policy}.jsonl"
    data.write_jsonl(path, [c.to_json() for c in convs])
    for c in convs[:2]:
        print(f"--- {c.context.id} ({c.profile}, {c.policy})\n" + "\n".join(f"{t.speaker}: {t.text}" for t in c.turns))
    print(f"wrote {len(convs)} conversations to {path}")
    return 0
