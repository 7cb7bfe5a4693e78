"""extras/chat.py: talk to the companion group yourself in the terminal (`python mascot.py chat`), or let a simulated
user talk to it (`python mascot.py simulate`: JSON-lines conversations for contexts, a Big Five profile and a policy).

A tool beside the method. After training, this is where you meet the agents, playing the person. The crisis guard
(extras/safety.py) reads each message first: if it fires, the fixed crisis message is shown and NO companion answers.
Otherwise, `--agents-per-turn` times, the director (or a fixed --policy) picks who answers and how, and the reply
streams in as it is sampled. Speakers and director: the run's trained ones (RUN/stage1/speakers, RUN/stage2/director)
if any, else --model (prompted). Simplifications: the chat's situation is just "a live chat", and a crisis message
does not end it as it ends a simulated conversation: you may go on, and every later message is checked again. Inside:
/who /reset /save FILE /quit. Model text reaches the terminal without control sequences (`terminal_text`); a /save
file keeps it as said, escaped (`json_for_terminals`). `simulate` appends each batch of conversations as it finishes
and, run again with the same settings, simulates only what is missing (`simulate_into`).
    python mascot.py chat --set meeting --show-directives
    python mascot.py simulate --policy director --contexts 4 --profile all
"""

import functools
import hashlib
import json
import re
import sys
import tempfile
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import models
from director import LLMDirector
from extras.safety import default_guard
from plumbing import files, loading, runs
from plumbing.cli import flag_type
from plumbing.common import UserError
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

# What a terminal would act on instead of showing (ECMA-48): CSI sequences (ESC [ or the 8-bit
# CSI), the string controls OSC, DCS, SOS, PM and APC up to their terminator (BEL or ST) or to the
# end of the text (a terminal would swallow the rest too), any other ESC sequence, and every other
# C0 or C1 control and DEL; newline and tab are kept. A model's text can carry any of them: an OSC
# sets the window title or (OSC 52) writes the clipboard, a CSI clears the screen or moves the cursor.
_TERMINAL_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[\x30-\x3f]*[\x20-\x2f]*[\x40-\x7e]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[\x20-\x2f]*[\x30-\x7e]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def terminal_text(text: str) -> str:
    """`text` as the terminal may show it: every control sequence and control character removed,
    newlines and tabs kept. All model text the chat or simulate prints goes through here."""
    return _TERMINAL_CONTROL.sub("", text)


def json_for_terminals(value) -> str:
    """JSON as files.write_json lays it out, with every non-printable character escaped: json.dumps
    escapes C0 controls but writes C1 controls, DEL, bidi overrides and lone surrogates raw. The
    file reads back exactly (a saved transcript is the record of what the models said), and
    `cat FILE` cannot drive the terminal. A raw newline outside strings is the layout's own."""
    text = json.dumps(value, indent=2, ensure_ascii=False) + "\n"
    return "".join(ch if ch.isprintable() or ch == "\n" else json.dumps(ch)[1:-1] for ch in text)


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
        text = terminal_text(text)  # a sequence cut off so far is dropped whole until it ends
        text = text.rsplit(" ", 1)[0] if " " in text else ""  # hold back the last word
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.write(text[len(self.shown) :])
            self.shown = text

    def finish(self, final: str) -> None:
        """Write the rest of the cleaned reply, or all of it again if clean-up changed shown text."""
        final = terminal_text(final)
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
            say(terminal_text(line))
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
            files.write_text_atomic(path, json_for_terminals(conv.to_json()))
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
    p.add_argument(
        "--profile", default="average", help="Big Five profile id, several as 'a,b', or 'all'"
    )
    p.add_argument(
        "--out", default=None, help="transcript file (default RUN/simulate/<policy>.jsonl)"
    )
    p.add_argument(
        "--batch",
        type=flag_type("--batch", int, "positive"),
        default=16,
        help="conversations simulated together; each batch is added to --out as it finishes, and "
        "the same command again simulates only the batches not there yet",
    )
    args = p.parse_args(argv[1:])
    # An empty name is the working directory: .lock and simulate/ would land wherever you stand.
    for flag, value in (("--run", args.run), ("--out", args.out)):
        if value is not None and not value.strip():
            raise UserError(f"{flag} is empty: name a folder or file (see --help for the default)")
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


def select_profiles(spec: str, profiles: dict, profiles_file: str) -> list[str]:
    """--profile: 'all' (every profile), one id or 'a,b'. An id that 'all' or a comma would shadow
    can never be selected, so it is refused rather than silently unreachable."""
    for pid in profiles:
        if pid.strip() in ("", "all") or "," in pid or pid != pid.strip():
            raise UserError(
                f"{profiles_file}: profile id {pid!r} cannot be chosen with --profile ('all' and "
                "',' have their own meaning there, and spaces around an id are dropped); rename it"
            )
    if spec.strip() == "all":
        return list(profiles)
    ids = [x.strip() for x in spec.split(",") if x.strip()]
    if not ids or any(x not in profiles for x in ids):
        raise UserError(
            f"--profile {spec}: use 'all' or ids from {profiles_file}: {', '.join(profiles)}"
        )
    return ids


def digest(value) -> str:
    """sha256 of a value's canonical JSON: a setting compared by its contents, not its file name."""
    canonical = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def simulate_settings(args, inputs, roles: dict, contexts: list, assigned: list[str]) -> dict:
    """Everything the conversations depend on, keyed by the flag that sets it, so that a resume
    under other settings is refused by name (--batch too: see `batches`). Left out: where the
    output goes, --device, the --served-* flags and --quiet. A role is its name and its files'
    stamp: retrained speakers are other speakers."""
    settings = {
        "--seed": args.seed,
        "--batch": args.batch,
        "--turns": args.turns,
        "--user-every": args.user_every,
        "--max-new-tokens": args.max_new_tokens,
        "--policy": args.policy,
        "--profile": args.profile,
        "--contexts": args.contexts,
        "--set": args.set,
        "--data": args.data,
        "--held-out": args.held_out,
        "--dtype": args.dtype,
        "--personas (contents)": digest(asdict(inputs.personas)),
        "--data (the contexts' contents)": digest([asdict(c) for c in contexts]),
        "--profiles-file (contents)": digest([asdict(inputs.profiles[x]) for x in assigned]),
    }
    for role, name in roles.items():
        settings[f"--{role}"] = name
        settings[f"--{role}-model"] = getattr(args, f"{role}_model", None)
        settings[f"--{role} (its files)"] = digest(files.folder_stamp(name))
    return settings


def settings_path(path: Path) -> Path:
    """Where the settings of the conversations in `path` are kept, beside it."""
    return path.with_name(path.name + ".settings.json")


def finished_conversations(path: Path, settings: dict) -> list[dict]:
    """The conversations `path` already holds, if they were simulated under `settings`; a
    UserError naming the first setting that differs (or the missing settings file) otherwise."""
    rows = files.read_jsonl(path) if path.is_file() else []
    if not rows:
        return []
    side = settings_path(path)
    saved = files.read_json(side) if side.is_file() else None
    if not isinstance(saved, dict):
        raise UserError(
            f"--out {path}: holds {len(rows)} conversations but no settings file {side.name} "
            "(an older simulate or another command wrote it); pass another --out or delete it"
        )
    for key in dict.fromkeys([*settings, *saved]):
        old, new = saved.get(key), settings.get(key)
        if old != new:
            if all(isinstance(v, (int, float, str, type(None))) for v in (old, new)) and not (
                str(old).startswith("sha256:")
            ):
                change = f"{key} was {old!r}, now {new!r}"
            else:
                change = f"{key} differs"
            raise UserError(
                f"--out {path}: its {len(rows)} conversations were simulated under other "
                f"settings ({change}); run with the same settings to go on, or pass another "
                "--out, or delete it"
            )
    return rows


def role_names(args, cli) -> dict[str, str]:
    """{role: the model that plays it} for simulate: the speakers, the simulated user and, under
    --policy director, the director (each a folder, a model name or openai:<base url>)."""
    names = {"speakers": cli.speakers_of(args), "user": args.user or args.model}
    if args.policy == "director":
        trained = Path(args.run) / "stage2" / "director"
        names["director"] = args.director or loading.trained_or(trained, args.model)
    return names


def batches(todo: list[int], size: int, n: int) -> list[range]:
    """The batches of `size` (the last may be shorter) out of conversations 0..n-1 that hold a
    conversation still to do. Fixed ranges [k*size, (k+1)*size), always run whole: a local model's
    numbers depend on what else is in its batch (padding changes the arithmetic), so a resumed run
    writes exactly what an uninterrupted one does only if every batch is the same batch. Each
    range [a, b) starts at seed + a: run_conversations gives conversation i the seed seed + i."""
    starts = sorted({i // size * size for i in todo})
    return [range(a, min(a + size, n)) for a in starts]


def simulate_into(path: Path, inputs, args, cli) -> int:
    """Simulate the conversations not yet in `path` (all of them in a new file), appending each
    batch as it finishes, then print the first two. Settings are checked before any model loads;
    every role is loaded (and a served one preflighted) even when nothing is left to do."""
    ids = select_profiles(args.profile, inputs.profiles, args.profiles_file)
    contexts = (inputs.held_out + inputs.train)[: args.contexts]
    assigned = assign_profiles(len(contexts), ids, args.seed)
    names = role_names(args, cli)
    settings = simulate_settings(args, inputs, names, contexts, assigned)
    rows = finished_conversations(path, settings)
    cache = Path(args.run) / "simulate" / "served_cache.jsonl"
    roles = {role: cli.load_role(name, role, args, cache) for role, name in names.items()}
    if not rows:  # a new file: its settings first, so every line added to it is covered
        files.write_json(settings_path(path), settings)
        files.write_text_atomic(path, "")
    plan = [(c.id, pid, args.seed + i) for i, (c, pid) in enumerate(zip(contexts, assigned))]
    done = {(r.get("context_id"), r.get("profile"), r.get("seed")): r for r in rows}
    todo = [i for i, key in enumerate(plan) if key not in done]
    policy = make_policy(args.policy, inputs.personas, roles.get("director"), args.seed)
    cast = Cast(
        inputs.personas,
        *roles["speakers"],
        *roles["user"],
        args.max_new_tokens,
        guard=default_guard(),
    )
    left = batches(todo, args.batch, len(plan))
    for run in left:
        convs = run_conversations(
            contexts[run.start : run.stop],
            policy,
            cast,
            inputs.profiles,
            assigned[run.start : run.stop],
            TurnPlan(args.turns, args.user_every),
            args.seed + run.start,
            desc="simulate, agent turns",
        )
        for key, c in zip(plan[run.start : run.stop], convs):
            done[key] = c.to_json()
            files.append_jsonl(path, done[key])  # flushed and fsynced: kept if we stop next
    ordered = [done[key] for key in plan]
    if ordered != files.read_jsonl(path):  # resumed out of order: the file in the plan's order
        files.write_jsonl(path, ordered)
    show_simulated(ordered, path, len(plan) - sum(len(run) for run in left))
    return 0


def show_simulated(rows: list[dict], path: Path, kept: int) -> None:
    """Print the first two conversations (model text made safe for the terminal) and a summary."""
    for r in rows[:2]:
        print(
            f"--- {r['context_id']} ({r['profile']}, {r['policy']})\n"
            + "\n".join(terminal_text(f"{t['speaker']}: {t['text']}") for t in r["turns"])
        )
    earlier = f" ({kept} of them from an earlier run)" if kept else ""
    print(f"wrote {len(rows)} conversations to {path}{earlier}")


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
