"""`sheepop chat RUN_DIR`: talk to a chat model, one turn after the other.

The conversation so far is the prompt of each answer, rendered by the run's chat template
(sheepop.tokenizers.chat_format: sheepop's own for a run made by `sheepop finetune`, the model's
own for an imported model such as SmolLM2): the system message, the earlier turns, the new user
message, then the generation prompt; the answer streams until the model writes the end of its turn
(sheepop's <|end|>, SmolLM2's <|im_end|>: `turn_end`), which is not shown. When the prompt would
leave the answer less than `reserve` tokens of context, the oldest turns are dropped (never the
system message), and stay dropped.

Two ways to drive it:
- a terminal: prompts, notes and the banner on stderr, the answer streamed on stdout. Ctrl-C
  stops the answer being written (it stays in the conversation as far as it got); at the
  prompt, Ctrl-C twice in a row, Ctrl-D or /quit leaves.
- a pipe (stdin not a terminal): each input line is one user turn (or a command); stdout holds
  exactly one line per answer, with backslashes written \\\\ and line breaks \\n (the same escapes
  are read in input lines), and nothing else, so a script can pair its lines with the answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

from sheepop.cli.common import (
    HelpFormatter,
    add_best_option,
    add_compile_option,
    add_constraint_flags,
    add_dtype_option,
    add_sampling_flags,
    add_speculate_flag,
    add_threads_option,
    constraint_spec,
    flag_values,
    model_dir,
    run_config,
    with_fresh_seed,
)
from sheepop.cli.steer import add_steer_flag, steering_of
from sheepop.config.model_size import param_count
from sheepop.config.schema import INFERENCE_ENGINES, SampleConfig
from sheepop.errors import UserError
from sheepop.train import signals

COMMANDS = "/reset (forget the conversation), /system TEXT (set the system message), /quit"
NO_TEMPLATE = ("this run's tokenizer has no chat template: fine-tune it with sheepop finetune "
               "first")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "chat", help="talk to a fine-tuned or imported chat model",
        description="Talk to a model fine-tuned on conversations (sheepop finetune), or an "
                    "imported chat model through its own chat template. Each "
                    "answer is streamed as it is written and ends at the end-of-turn token; "
                    "the conversation stays in the context, the oldest turns dropped when the "
                    "prompt would leave the answer fewer than min(--max-new-tokens, context/4) "
                    f"tokens (never the system message). Commands: {COMMANDS}. From a "
                    "pipe, each input line is a user turn and stdout holds exactly one line per "
                    "answer (line breaks written \\n, backslashes \\\\); prompts and notes go "
                    "to stderr. Sampling settings: the run's [sample] section, then the flags.",
        formatter_class=HelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run directory made by `sheepop "
                   "finetune`, or any run whose tokenizer has a chat template (an imported "
                   "chat model's own)")
    p.add_argument("--system", default="", metavar="TEXT",
                   help="the system message that opens the conversation (empty: none)")
    add_sampling_flags(p, seed_note="; answer n draws with seed + n")
    add_speculate_flag(p)
    add_constraint_flags(p)
    add_steer_flag(p)
    p.add_argument("--engine", choices=INFERENCE_ENGINES, default="auto",
                   help="the engine that runs the model; auto: numpy on the CPU (it starts "
                        "without importing torch), torch on a GPU")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    add_dtype_option(p)
    add_compile_option(p)
    p.add_argument("--show-prompt", action="store_true",
                   help="before each answer, write on stderr the prompt the model reads "
                        "(escaped, on one line) and its number of tokens")
    p.add_argument("--speed", action="store_true",
                   help="after each answer, write on stderr its speed: the prompt's tokens "
                        "and tokens/s, the time to first token, the tokens generated and "
                        "tokens/s (as `ollama run --verbose`; `generate` always writes it)")
    add_best_option(p)
    add_threads_option(p)
    p.set_defaults(func=run)


def escape(text: str) -> str:
    """One line of output: backslash -> \\\\, line feed -> \\n, carriage return -> \\r."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def unescape(line: str) -> str:
    """The inverse of `escape` for an input line (any other backslash stays as it is)."""
    out, i = [], 0
    while i < len(line):
        pair = line[i:i + 2]
        if pair in ("\\\\", "\\n", "\\r"):
            out.append({"\\\\": "\\", "\\n": "\n", "\\r": "\r"}[pair])
            i += 2
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


class Chat:
    """The conversation with one model, and the answer to each new user message."""

    def __init__(self, model: Any, sample: SampleConfig, system: str, show_prompt: bool,
                 note: TextIO, show_speed: bool = False, constraint: Any = None):
        from sheepop.tokenizers.chat_format import turn_end
        self.model, self.sample, self.show_prompt, self.note = model, sample, show_prompt, note
        self.show_speed = show_speed
        self.constraint = constraint  # every answer's shape (sheepop.generation.constraint)
        self.after_answer: list[str] = []  # notes for after the answer's line (Ctrl-C, speed)
        self.tokenizer = model.tokenizer
        self.system = system
        self.messages: list[dict[str, str]] = []
        self.answers = 0
        # Any other special token also ends the answer (an undertrained model may write one).
        end = turn_end(self.tokenizer)
        self.end_id, self.stops = end.eos_id, end.stops
        block = model.config.model.block_size
        self.limit = block - min(sample.max_new_tokens, block // 4)

    def conversation(self) -> list[dict[str, str]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.messages

    def reset(self) -> None:
        self.messages = []

    def prompt(self, user: str) -> list[int]:
        """The prompt ids for the answer to `user`, oldest turns dropped to fit."""
        from sheepop.tokenizers.chat_format import fit_context
        self.messages.append({"role": "user", "content": user})
        try:
            ids, dropped = fit_context(self.tokenizer, self.conversation(), self.limit)
        except UserError:
            self.messages.pop()
            raise
        if dropped:
            del self.messages[:dropped]
            self.say(f"dropped the oldest {dropped} message{'s' if dropped > 1 else ''} "
                      f"to stay within the context")
        if self.show_prompt:
            text = self.tokenizer.decode(ids)
            self.say(f"prompt ({len(ids)} tokens): {escape(text)}")
        return ids

    def answer(self, user: str, write) -> str:
        """Stream the answer to `user` through `write(piece)`; Ctrl-C stops it early. The
        answer (as far as it got) joins the conversation; what is to be said about it waits in
        `after_answer` until its line has ended (`turn`)."""
        from sheepop.generation.speed import Stopwatch
        from sheepop.generation.text_stream import stream_text
        from sheepop.tokenizers import IncrementalDecoder
        ids = self.prompt(user)
        stopwatch = Stopwatch(len(ids))
        cfg = dataclasses.replace(self.sample, seed=self.sample.seed + self.answers)
        self.answers += 1
        pieces: list[str] = []
        try:
            shape = None if self.constraint is None else self.constraint.start({self.end_id})
            for piece in stream_text(self.model.lm, ids, cfg, IncrementalDecoder(self.tokenizer),
                                     stop=self.stops, eos_id=self.end_id, stopwatch=stopwatch,
                                     constraint=shape):
                pieces.append(piece)
                write(piece)
        except KeyboardInterrupt as e:
            if signals.heard(e) != signal.SIGINT:
                raise  # SIGTERM, SIGHUP: leave (sheepop.cli.main)
            self.after_answer.append("(answer stopped)")
        if self.show_speed:
            self.after_answer.append(f"speed: {stopwatch.speed().line()}")
        text = "".join(pieces)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def say(self, text: str) -> None:
        print(f"sheepop: {text}", file=self.note, flush=True)


def command(chat: Chat, line: str) -> bool | None:
    """Run `line` if it is a command: True to go on, False to leave; None: not a command."""
    word, _, rest = line.strip().partition(" ")
    if word == "/quit":
        return False
    if word == "/reset":
        chat.reset()
        chat.say("conversation forgotten")
        return True
    if word == "/system":
        chat.system = rest.strip()
        chat.say(f"system message {'set' if chat.system else 'removed'}")
        return True
    if word.startswith("/") and word[1:].isalpha() and not rest:
        chat.say(f"unknown command {word} (commands: {COMMANDS})")
        return True
    return None


def turn(chat: Chat, line: str, out: TextIO, shown: Callable[[str], str] = str) -> bool:
    """One line of the user's: nothing when blank, a command, or a message whose answer streams
    to `out` (each piece through `shown`) and ends its line. False: the user leaves."""
    if not line.strip():
        return True
    done = command(chat, line)
    if done is not None:
        return done
    from sheepop.generation.sample import NonFiniteLogits
    try:
        chat.answer(line, lambda piece: (out.write(shown(piece)), out.flush()))
    except NonFiniteLogits:  # weights that overflow: no answer will ever come (exit 2)
        raise
    except UserError as e:  # a message too long, or holding a special token
        chat.say(f"error: {e}")
    out.write("\n")  # the answer's line ends before any note about it (one terminal: both)
    out.flush()
    for note in chat.after_answer:
        chat.say(note)
    chat.after_answer = []
    return True


def piped(chat: Chat, stdin: TextIO, out: TextIO) -> None:
    """One user turn per input line, one output line per answer."""
    for raw in stdin:
        if not turn(chat, unescape(raw.rstrip("\r\n")), out, escape):
            return


def interactive(chat: Chat, stdin: TextIO, out: TextIO, note: TextIO) -> None:
    """Prompts on `note`, answers streamed on `out`; Ctrl-C twice at the prompt leaves."""
    interrupted = False
    while True:
        note.write("you> ")
        note.flush()
        try:
            line = stdin.readline()
        except KeyboardInterrupt as e:
            if signals.heard(e) != signal.SIGINT or interrupted:
                note.write("\n")
                return
            interrupted = True
            note.write("\n(Ctrl-C again, Ctrl-D or /quit to leave)\n")
            continue
        interrupted = False
        if not line:  # end of input (Ctrl-D)
            note.write("\n")
            return
        if not turn(chat, line.rstrip("\r\n"), out):
            return


def run(args: argparse.Namespace) -> int:
    from sheepop.generation.constraint import compile_constraint
    from sheepop.inference.load import load
    from sheepop.tokenizers.chat_format import can_chat, require_chat_tokens
    sample = run_config(args.run_dir, [], None, flag_values(args), only=("sample",)
                        ).validate().sample
    spec = constraint_spec(args)  # (a bad schema file is refused before the model loads)
    model = load(model_dir(args), args.engine, args.device, args.dtype, args.compile)
    if not can_chat(model.tokenizer):
        if model.tokenizer.chat_template is not None:
            require_chat_tokens(model.tokenizer, "this run's tokenizer")
        raise UserError(NO_TEMPLATE)
    model.lm.steer(steering_of(args, model))
    m = model.config.model
    note = sys.stderr
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 become U+FFFD, not a crash
        sys.stdin.reconfigure(errors="replace")
    chat = Chat(model, sample, args.system, args.show_prompt, note, args.speed,
                compile_constraint(spec, model.tokenizer))
    tty = sys.stdin.isatty()
    print(f"sheepop: chat with {args.run_dir} ({param_count(m):,} parameters, context "
          f"{m.block_size}, {model.engine} engine)" + (f"; {COMMANDS}" if tty else ""),
          file=note, flush=True)
    chat.sample = with_fresh_seed(sample)  # (its line comes after the banner)
    if tty:
        interactive(chat, sys.stdin, sys.stdout, note)
    else:
        piped(chat, sys.stdin, sys.stdout)
    return 0
