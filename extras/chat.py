"""extras/chat.py: talk to the companion group yourself in the terminal (`python mascot.py chat`), or let a simulated
user talk to it (`python mascot.py simulate`: JSON-lines conversations for contexts, a Big Five profile and a policy).

A tool beside the method. After training, this is where you meet the agents, playing the person. The crisis guard
(extras/safety.py) reads each message first: if it fires, the fixed crisis message is shown and NO companion answers.
Otherwise, `--agents-per-turn` times, the director (or a fixed --policy) picks who answers and how, and the reply
streams in as it is sampled. Speakers and director: the run's trained ones (RUN/stage1/speakers, RUN/stage2/director)
if any, else --model (prompted). Simplifications: the chat's situation is just "a live chat", and a crisis message
does not end it as it ends a simulated conversation: you may go on, and every later message is checked again. Inside:
/who /reset /save FILE /quit.
    python mascot.py chat --set meeting --show-directives
    python mascot.py simulate --policy director --contexts 4 --profile all
"""

import functools
import sys
import tempfile
from collections import Counter
from pathlib import Path

import evaluate
import models
from director import LLMDirector
from extras.safety import default_guard
from plumbing import files, loading, runs
from plumbing.cli import flag_type
from plumbing.common import UserError
from plumbing.files import write_json
from scenarios import Context, PersonaSet, load_personas
from simulate import (
    SAFETY,
    Cast,
    LeastSpoken,
    RandomOrder,
    RoundRobin,
    TurnPlan,
    add_user_turn,
    agents_speak,
    assign_profiles,
    run_conversations,
    start_conversation,
)

COMMANDS = "/who  /reset  /save FILE  /quit   (Ctrl-D or Ctrl-C also leave)"
POLICIES = ("round-robin", "random", "least-spoken", "director")


def make_policy(name: str, personas: PersonaSet, director=None, seed: int = 0):
    """A --policy value: round-robin | random | least-spoken | director ((model, tok) given)."""
    if name == "director":
        return LLMDirector(*director, personas)
    if name == "random":
        return RandomOrder(personas, seed)
    if name == "round-robin":
        return RoundRobin(personas)
    if name == "least-spoken":
        return LeastSpoken(personas)
    raise UserError(f"--policy {name}: use {', '.join(POLICIES)}")


def parse_args(argv: list[str], cli):
    """`mascot.py chat`'s flags: the shared ones, then who answers and how many."""
    p = cli.Parser(
        prog="mascot.py chat",
        description="talk to the companion group in the terminal",
        formatter_class=cli.Formatter,
    )
    cli.common_flags(p)
    p.add_argument(
        "--policy",
        choices=["director", "round-robin", "random", "least-spoken"],
        default="director",
        help="who answers: the LLM director, or a fixed rule",
    )
    p.add_argument(
        "--show-directives",
        action="store_true",
        help="print the [Agent / Action / Tone] before each reply",
    )
    p.add_argument(
        "--agents-per-turn",
        type=flag_type("--agents-per-turn", int, "positive"),
        default=2,
        help="how many agents answer each of your messages",
    )
    return p.parse_args(argv)


def load_chat(args, cli, say):
    """Personas, the speakers' Cast (with the crisis guard), the turn-taking policy and the banner."""
    personas = load_personas(args.personas, args.set)
    cli.check_device(args)
    speakers = cli.speakers_of(args)
    say(f"loading speakers: {speakers}")
    speaker = cli.load_role(speakers, "speakers", args)  # a served one streams no tokens
    director = None
    director_name = args.policy
    if args.policy == "director":
        trained = Path(args.run) / "stage2" / "director"
        director_name = args.director or loading.trained_or(trained, args.model)
        if director_name == speakers and speaker[1] is not None:
            director = speaker  # one local model can play both parts
        else:
            say(f"loading director: {director_name}")
            director = cli.load_role(director_name, "director", args)
    # No simulated user: you are the user.
    cast = Cast(personas, *speaker, None, None, args.max_new_tokens, guard=default_guard())
    width = max(len(p.name) for p in personas.personas)
    order = f"director {director_name}" if args.policy == "director" else args.policy
    banner = "\n".join(
        [
            f"MASCOT group chat ({personas.name}): {personas.description}",
            f"speakers: {speakers}   turn-taking: {order}   {args.agents_per_turn} agent(s) answer each message",
            *[f"  {p.name:<{width}}  {p.role}" for p in personas.personas],
            f"commands: {COMMANDS}",
            "The companions are small language models: not people, not therapists, not a crisis service.",
        ]
    )
    return personas, cast, make_policy(args.policy, personas, director, args.seed), banner


class StreamPrinter:
    """Shows one agent's reply token by token as it is sampled. The chat stores the CLEANED reply, so after each token
    the partial text is cleaned (models.clean_reply), its last word held back (it may still become a label), and only
    new text is written; `finish` writes the rest, or the whole reply again, marked, if clean-up changed shown text."""

    def __init__(self, tokenizer, speaker: str, names: list[str], write):
        self.tok = tokenizer
        self.speaker = speaker
        self.names = names  # every persona's name: clean_reply cuts a reply where another begins
        self.write = write
        self.ids = []  # the reply's tokens so far
        self.shown = ""  # the text written so far
        write(f"{speaker}: ")

    def __call__(self, token) -> None:  # token: (B,); the chat's row is 0
        self.ids.append(int(token[0]))
        text = models.clean_reply(
            self.tok.decode(self.ids, skip_special_tokens=True), self.speaker, self.names
        )
        text = text.rsplit(" ", 1)[0] if " " in text else ""  # hold back the last word
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.write(text[len(self.shown) :])
            self.shown = text

    def finish(self, final: str) -> None:
        """Write the rest of the cleaned reply, or all of it again if clean-up changed shown text."""
        if final.startswith(self.shown):
            self.write(final[len(self.shown) :] + "\n")
        else:
            self.write(f"\n{self.speaker} (cleaned up): {final}\n")


def respond(conv, policy, cast, args, say, write, status: bool = False) -> None:
    """Answer the person's latest message: the fixed crisis message if the guard fired, else `--agents-per-turn`
    directed replies, streamed. status: a "choosing who speaks" line while the director decides (terminals only)."""
    if conv.ended:
        say(f"{SAFETY}: {conv.turns[-1].text}")
        conv.ended = False  # unlike a simulation, the person decides whether to go on
        return
    for _ in range(args.agents_per_turn):
        if status:
            write("(choosing who speaks next ...)")
        d = policy.choose([conv])[0]
        if status:
            write("\r\033[K")  # back to the line's start and clear it
        if args.show_directives:
            line = f"[Agent: {d.agent} / Action: {d.action or '-'} / Tone: {d.tone or '-'}]"
            if not d.valid:
                line += " (director's answer unparsable: least-spoken fallback)"
            say(line)
        speaker = (cast.personas.find(d.agent) or cast.personas.personas[0]).name
        printer = StreamPrinter(cast.speaker_tok, speaker, cast.personas.names(), write)
        cast.on_token = printer
        try:
            agents_speak(
                [conv], [d], cast
            )  # a served speaker calls no on_token: finish shows it all
        finally:
            cast.on_token = None
        printer.finish(conv.turns[-1].text)


def read_line(interactive: bool) -> str | None:
    """The next line the person typed, without its newline; None at end of input (Ctrl-D)."""
    if interactive:
        try:
            return input("you> ")  # input() gives line editing on a real terminal
        except EOFError:
            print()  # end the prompt line before saying goodbye
            return None
    line = sys.stdin.readline()
    return None if line == "" else line.rstrip("\r\n")


def run_command(line: str, conv, personas, say):
    """/who, /reset, /save FILE or an unknown command; returns the conversation (None after /reset)."""
    command, _, target = line.partition(" ")
    if command == "/who":
        counts = Counter(t.speaker for t in conv.agent_turns()) if conv else Counter()
        say(
            "\n".join(
                f"{p.name} ({p.role}): {p.description}  [spoke {counts[p.name]}x]"
                for p in personas.personas
            )
        )
    elif command == "/reset":
        say("(conversation cleared: your next message starts a new one)")
        return None
    elif command == "/save" and target.strip() and conv is not None:
        path = Path(target.strip()).expanduser()
        try:
            write_json(path, conv.to_json())
            say(f"saved {len(conv.turns)} turns to {path}")
        except OSError as err:
            say(f"could not write {path}: {err.strerror}; pick another file")
    elif command == "/save" and target.strip():
        say("nothing to save yet: type a message first")
    elif command == "/save":
        say("usage: /save FILE   (writes the transcript as JSON)")
    else:
        say(f"unknown command {command}; commands: {COMMANDS}")
    return conv


def simulate(argv: list[str], cli) -> int:
    """`mascot.py simulate`: the conversation engine outside training and evaluation, guard on (people read these)."""
    p = cli.Parser(
        prog="mascot.py simulate",
        formatter_class=cli.Formatter,
        description="write conversations for contexts, a profile and a policy",
    )
    cli.common_flags(p)
    p.add_argument(
        "--turns",
        type=flag_type("--turns", int, "positive"),
        default=4,
        help="agent turns per conversation",
    )
    p.add_argument(
        "--contexts",
        type=flag_type("--contexts", int, "positive"),
        default=4,
        help="how many contexts",
    )
    p.add_argument("--policy", default="round-robin", choices=POLICIES, help="who speaks next")
    p.add_argument("--profile", default="average", help="Big Five profile id, or 'all'")
    p.add_argument(
        "--out", default=None, help="transcript file (default RUN/simulate/<policy>.jsonl)"
    )
    args = p.parse_args(argv[1:])
    inputs = cli.load_inputs(args)
    cli.check_device(args)
    path = Path(args.out) if args.out else Path(args.run) / "simulate" / f"{args.policy}.jsonl"
    with runs.run_lock(args.run):  # not while train or evaluate writes the run
        try:  # a folder we cannot write fails now, not after the work
            path.parent.mkdir(parents=True, exist_ok=True)
            tempfile.TemporaryFile(dir=path.parent).close()
        except OSError as err:
            raise UserError(
                f"--out {path}: cannot write in {path.parent} ({err.strerror})"
            ) from None
        return simulate_into(path, inputs, args, cli)


def simulate_into(path: Path, inputs, args, cli) -> int:
    """Simulate the conversations, write them to `path`, print the first two."""
    cache = Path(args.run) / "simulate" / "served_cache.jsonl"
    speaker = cli.load_role(cli.speakers_of(args), "speakers", args, cache)
    user = cli.load_role(args.user or args.model, "user", args, cache)
    director = None
    if args.policy == "director":
        trained = Path(args.run) / "stage2" / "director"
        name = args.director or loading.trained_or(trained, args.model)
        director = cli.load_role(name, "director", args, cache)
    if args.profile == "all":
        ids = list(inputs.profiles)
    else:
        ids = evaluate.profile_ids(args.profile, inputs.profiles)
    contexts = (inputs.held_out + inputs.train)[: args.contexts]
    convs = run_conversations(
        contexts,
        make_policy(args.policy, inputs.personas, director, args.seed),
        Cast(inputs.personas, *speaker, *user, args.max_new_tokens, guard=default_guard()),
        inputs.profiles,
        assign_profiles(len(contexts), ids, args.seed),
        TurnPlan(args.turns, args.user_every),
        args.seed,
        desc="simulate, agent turns",
    )
    files.write_jsonl(path, [c.to_json() for c in convs])
    for c in convs[:2]:
        print(
            f"--- {c.context.id} ({c.profile}, {c.policy})\n"
            + "\n".join(f"{t.speaker}: {t.text}" for t in c.turns)
        )
    print(f"wrote {len(convs)} conversations to {path}")
    return 0


def main(argv: list[str], cli) -> int:
    """`mascot.py chat|simulate ...`: returns 0 however the person leaves; bad flags or files raise common.UserError."""
    if argv[0] == "simulate":
        return simulate(argv, cli)
    args = parse_args(argv[1:], cli)
    say = functools.partial(print, flush=True)
    write = functools.partial(print, end="", flush=True)  # streaming: no newline of its own
    interactive = sys.stdin.isatty()
    try:
        personas, cast, policy, banner = load_chat(args, cli, say)
        cast.guard.check("hello")  # load the guard's encoder now, not after your first message
        say(banner)
        conv = None
        while (line := read_line(interactive)) is not None:
            line = line.strip()
            if line.partition(" ")[0] == "/quit":
                break
            if line.startswith("/"):
                conv = run_command(line, conv, personas, say)
            elif line:
                conv = add_message(conv, line, personas, policy, cast, args.seed)
                status = interactive and sys.stdout.isatty()
                respond(conv, policy, cast, args, say, write, status=status)
    except KeyboardInterrupt:
        say()
    say("Goodbye.")
    return 0


def add_message(conv, line: str, personas, policy, cast, seed: int):
    """The person's message: the first opens the conversation exactly as a simulated one opens,
    the next ones are added to it; the guard reads each. Returns the conversation."""
    if conv is not None:
        add_user_turn(conv, line, cast.guard)
        return conv
    context = Context(
        id="chat",
        persona_set=personas.name,
        situation="a live chat",
        first_message=line,
        source="chat",
    )
    return start_conversation(context, personas.name, "human", policy.name, seed, cast.guard)
