"""chat.py: talk to the companion group yourself, in the terminal.

Where it sits in the MASCOT pipeline: after training, this is the place to meet the agents. You
play the person; the rest is the same machinery the simulations use (simulate.py, director.py):

    you type a message
      -> the crisis guard reads it first (safety.py, via simulate.add_user_turn); if it fires,
         the fixed crisis message is shown and NO companion answers that message
      -> otherwise, `--agents-per-turn` times: the director picks who answers and how
         (`policy.choose`), and that agent's reply is generated (`simulate.agents_speak`)

Models: the speakers come from RUN/stage1/speakers when stage 1 has run, else from --model (base
speakers); with --policy director the director comes from RUN/stage2/director when stage 2 has
run, else --model is prompted to direct. Both persona sets work (--set support | meeting).

Simplification vs the paper: the paper's users are simulated; here the user is you, and the chat
has no situation description beyond your own messages (the context's situation is "a live chat").
A crisis message does not end the chat the way it ends a simulated conversation: you may keep
talking, and every later message is checked again.

Commands inside the chat: /who (the agents and their roles), /reset (start over), /save FILE
(the transcript as JSON), /quit. Ctrl-D and Ctrl-C leave too.

Run:
    python mascot.py chat                          # embedded model, trained checkpoints if present
    python mascot.py chat --set meeting --show-directives
    python mascot.py chat --help                   # every flag
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import director as dr
import models
from data import Context, load_personas, write_json
from safety import crisis_check
from simulate import SAFETY, Cast, add_user_turn, agents_speak, start_conversation

CHAT_SITUATION = "a live chat"
COMMANDS = "/who  /reset  /save FILE  /quit   (Ctrl-D or Ctrl-C also leave)"


def load_chat(args, say):
    """Personas, the speaker Cast and the turn-taking policy, as the flags ask."""
    personas = load_personas(args.personas, args.set)
    run = Path(args.run)
    speakers = args.speakers or models.trained_or(run / "stage1" / "speakers", args.model)
    say(f"loading speakers: {speakers}")
    speaker_model, speaker_tok = models.load_role(speakers, "speakers", args)      # a served one streams no tokens
    director_model, director_name = None, args.policy
    if args.policy == "director":
        director_name = args.director or models.trained_or(run / "stage2" / "director", args.model)
        if director_name == speakers and speaker_tok is not None:   # one local model can play both parts
            director_model = (speaker_model, speaker_tok)
        else:
            say(f"loading director: {director_name}")
            director_model = models.load_role(director_name, "director", args)
    policy = dr.make_policy(args.policy, personas, director_model, args.seed)
    # No simulated user in a chat (you are the user), so the Cast has no user model.
    cast = Cast(personas, speaker_model, speaker_tok, None, None, args.max_new_tokens)
    return personas, cast, policy, speakers, director_name


def banner(personas, speakers: str, director_name: str, args) -> str:
    width = max(len(p.name) for p in personas.personas)
    lines = [f"MASCOT group chat ({personas.name}): {personas.description}",
             f"speakers: {speakers}   turn-taking: "
             + (f"director {director_name}" if args.policy == "director" else args.policy)
             + f"   {args.agents_per_turn} agent(s) answer each message"]
    lines += [f"  {p.name:<{width}}  {p.role}" for p in personas.personas]
    lines += [f"commands: {COMMANDS}",
              "The companions are small language models: not people, not therapists, not a crisis service."]
    return "\n".join(lines)


def who(personas, conv) -> str:
    counts = Counter(t.speaker for t in conv.agent_turns()) if conv else Counter()
    return "\n".join(f"{p.name} ({p.role}): {p.description}  [spoke {counts.get(p.name, 0)}x]"
                     for p in personas.personas)


def directive_line(d) -> str:
    text = f"[Agent: {d.agent} / Action: {d.action or '-'} / Tone: {d.tone or '-'}]"
    return text if d.valid else text + " (director's answer unparsable: least-spoken fallback)"


class StreamPrinter:
    """Shows one agent's reply while it is sampled (sampler.generate calls it after every token).

    The chat stores the CLEANED reply (models.clean_reply: its own label dropped, cut where it
    starts writing another speaker's line), so that is what is shown as it grows: after each
    token the partial text is cleaned, its last word held back (it may still become a label),
    and only what extends the text already shown is written. `finish` writes the rest; if the
    clean-up changed something already on screen, the whole reply is shown again, marked.
    """

    def __init__(self, tokenizer, speaker: str, names: list[str], write):
        self.tok, self.speaker, self.names, self.write = tokenizer, speaker, names, write
        self.ids: list[int] = []
        self.shown = ""

    def stable_text(self) -> str:
        text = models.clean_reply(self.tok.decode(self.ids, skip_special_tokens=True), self.speaker, self.names)
        return text.rsplit(" ", 1)[0] if " " in text else ""        # hold back the last word

    def __call__(self, token) -> None:                               # token: (B,); the chat's row is 0
        if not self.shown and not self.ids:
            self.write(f"{self.speaker}: ")
        self.ids.append(int(token[0]))
        text = self.stable_text()
        if text.startswith(self.shown) and len(text) > len(self.shown):
            self.write(text[len(self.shown):])
            self.shown = text

    def finish(self, final: str) -> None:
        if not self.ids:
            self.write(f"{self.speaker}: ")
        if final.startswith(self.shown):
            self.write(final[len(self.shown):] + "\n")
        else:
            self.write(f"\n{self.speaker} (cleaned up): {final}\n")


def respond(conv, policy, cast, args, say, write=None, status: bool = False) -> None:
    """Answer the person's latest message (already added, and checked by the crisis guard):
    the fixed crisis message if the guard fired, else `--agents-per-turn` directed agent replies.
    write: where to stream replies as they are sampled (None: print each reply when finished);
    status: show a "choosing who speaks" line while the director decides (terminals only)."""
    if conv.ended:                                # the guard fired: show the fixed message, nothing else
        say(f"{SAFETY}: {conv.turns[-1].text}")
        # In a simulation a crisis ends the conversation; here the person decides whether to go on,
        # and their next message is checked again like every other.
        conv.ended = False
        return
    for _ in range(args.agents_per_turn):
        if status:                                # on a terminal: say what is happening while the director decides
            write("(choosing who speaks next ...)")
        directive = policy.choose([conv])[0]
        if status:
            write("\r\033[K")                     # back to the line's start and clear it
        if args.show_directives:
            say(directive_line(directive))
        if write is None:                         # no streaming: the finished reply, one line
            agents_speak([conv], [directive], cast)
            say(f"{conv.turns[-1].speaker}: {conv.turns[-1].text}")
            continue
        speaker = (cast.personas.find(directive.agent) or cast.personas.personas[0]).name
        cast.on_token = StreamPrinter(cast.speaker_tok, speaker, cast.personas.names(), write)
        try:
            agents_speak([conv], [directive], cast)
        finally:
            printer, cast.on_token = cast.on_token, None
        printer.finish(conv.turns[-1].text)


def save(conv, target: str, say) -> None:
    if conv is None:
        say("nothing to save yet: type a message first")
        return
    path = Path(target).expanduser()
    try:
        write_json(path, conv.to_json())
    except OSError as err:
        say(f"could not write {path}: {err.strerror}; pick another file")
        return
    say(f"saved {len(conv.turns)} turns to {path}")


def read_line(stdin, stdout, interactive: bool) -> str | None:
    """The next line the person typed, without its newline; None at end of input (Ctrl-D)."""
    if interactive and stdin is sys.stdin and stdout is sys.stdout:
        try:
            return input("you> ")                 # input() gives line editing on a real terminal
        except EOFError:
            return None
    if interactive:
        stdout.write("you> ")
        stdout.flush()
    line = stdin.readline()
    return None if line == "" else line.rstrip("\r\n")


def run_chat(args, stdin=None, stdout=None) -> int:
    """The chat loop. Returns the exit status: 0 however the person leaves (/quit, Ctrl-D, Ctrl-C).
    stdin/stdout default to the process's own (looked up at call time, not at import).
    Bad flags or files raise data.UserError (mascot.py prints it as one line)."""
    stdin, stdout = stdin or sys.stdin, stdout or sys.stdout

    def say(text: str = "") -> None:
        print(text, file=stdout, flush=True)

    def write(text: str) -> None:                 # streaming: no newline of its own
        stdout.write(text)
        stdout.flush()

    interactive = stdin.isatty()
    try:
        personas, cast, policy, speakers, director_name = load_chat(args, say)
        # Load the guard's sentence encoder now, so the wait is here and not after your first message.
        crisis_check("hello")
        say(banner(personas, speakers, director_name, args))
        conv = None
        while True:
            line = read_line(stdin, stdout, interactive)
            if line is None:
                if interactive:
                    say()                         # end the prompt line before saying goodbye
                break
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                command, _, rest = line.partition(" ")
                if command == "/quit":
                    break
                if command == "/who":
                    say(who(personas, conv))
                elif command == "/reset":
                    conv = None
                    say("(conversation cleared: your next message starts a new one)")
                elif command == "/save" and rest.strip():
                    save(conv, rest.strip(), say)
                elif command == "/save":
                    say("usage: /save FILE   (writes the transcript as JSON)")
                else:
                    say(f"unknown command {command}; commands: {COMMANDS}")
                continue
            # Both paths run the crisis guard on the message (simulate.add_user_turn).
            if conv is None:
                # The chat's context is made from the first message, so the conversation opens
                # exactly like a simulated one.
                context = Context(id="chat", persona_set=personas.name, situation=CHAT_SITUATION,
                                  first_message=line, source="chat")
                conv = start_conversation(context, personas.name, "human", policy.name, args.seed)
            else:
                add_user_turn(conv, line)
            respond(conv, policy, cast, args, say, write, status=interactive and stdout.isatty())
    except KeyboardInterrupt:
        say()
    say("Goodbye.")
    return 0
