"""One `airgate run` chat in memory: its model, options and messages, the `/` commands, and an
answer streamed to the terminal (a Ctrl-C stops it and the turn is not kept).  Nothing here is
written to disk."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TextIO

from .ollama_client import Client

__all__ = ["Session", "read_message"]

# `/set parameter NAME VALUE`: Ollama's options, parsed as Ollama's CLI parses them
_INTS = ("top_k", "num_predict", "seed", "num_ctx", "repeat_last_n", "mirostat", "min_keep")
_FLOATS = (
    "temperature",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "typical_p",
    "tfs_z",
)

HELP = """Available commands:
  /set parameter NAME VALUE   set an option (temperature, top_p, top_k, num_predict, seed,
                              stop, repeat_penalty, ...); /set parameter stop A B ... for stops
  /set system TEXT            set the system message
  /set verbose | quiet        show (or not) token counts and timings after each answer
  /show                       the parameters in force
  /clear                      forget the conversation
  /bye                        exit (also Ctrl-D)
  /? or /help                 this help

Use \"\"\" to begin and end a multi-line message.  Ctrl-C stops an answer.
"""


def _parse(name: str, values: list[str]) -> Any:
    if name == "stop":
        return values
    if len(values) != 1:
        raise ValueError(f"{name} takes one value")
    if name in _INTS:
        return int(values[0])
    if name in _FLOATS:
        return float(values[0])
    raise ValueError(f"unknown parameter {name!r}")


@contextlib.contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """Ctrl-C while an answer streams, never lost: the handler notes it, then raises
    KeyboardInterrupt as Python's own does.  The note matters because Python drops an exception
    raised while a finalizer runs (the garbage collector may run one at any allocation, and the
    signal's handler runs in whatever code is executing), so the stream checks it at each line."""
    seen = threading.Event()
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is signal.SIG_IGN:
        yield seen  # signals reach the main thread only; an ignored SIGINT stays ignored
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


@dataclass
class Session:
    """One chat: the model, its options and its messages, in memory."""

    client: Client
    model: str
    out: TextIO
    options: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, str]] = field(default_factory=list)
    system: str | None = None
    verbose: bool = False

    def ask(self, prompt: str) -> None:
        """Send `prompt` with the history; print the answer as it streams.  The turn joins
        the history only when the answer is whole."""
        turn = {"role": "user", "content": prompt}
        head = [{"role": "system", "content": self.system}] if self.system else []
        answer: list[str] = []
        history = [*head, *self.messages, turn]
        with _interrupts() as stopped, self.client.chat(self.model, history, self.options) as lines:
            for line in lines:
                if stopped.is_set():
                    raise KeyboardInterrupt
                piece = line.get("message", {}).get("content", "")
                if piece:
                    answer.append(piece)
                    self.out.write(piece)
                    self.out.flush()
                if line.get("done"):
                    self.out.write("\n")
                    if self.verbose:
                        _stats(line, sys.stderr)
        if stopped.is_set():  # an interrupt that came with the last line
            raise KeyboardInterrupt
        self.messages += [turn, {"role": "assistant", "content": "".join(answer)}]

    def command(self, text: str, echo: Callable[[str], None]) -> bool:
        """A `/` command; False to leave."""
        words = text.split()
        name, args = words[0], words[1:]
        if name == "/bye":
            return False
        if name in ("/?", "/help"):
            echo(HELP)
        elif name == "/clear":
            self.messages.clear()
            echo("Cleared session context")
        elif name == "/show":
            shown = [f"{k:<20}{v}" for k, v in self.options.items()]
            echo("Parameters in force:\n  " + "\n  ".join(shown) if shown else "No parameters set")
            if self.system:
                echo("System message set")
        elif name == "/set" and args[:1] == ["parameter"] and len(args) >= 3:
            try:
                self.options[args[1]] = _parse(args[1], args[2:])
            except ValueError as exc:
                echo(f"Couldn't set parameter: {exc}")
            else:
                echo(f"Set parameter '{args[1]}' to '{', '.join(args[2:])}'")
        elif name == "/set" and args[:1] == ["system"] and len(args) >= 2:
            self.system = text.split(None, 2)[2]
            echo("Set system message.")
        elif name == "/set" and args in (["verbose"], ["quiet"]):
            self.verbose = args == ["verbose"]
            echo(f"Set '{args[0]}' mode.")
        else:
            echo(f"Unknown command '{text.strip()}'. Type /? for help")
        return True


def _stats(line: dict[str, Any], to: TextIO) -> None:
    def seconds(ns: Any) -> str:
        return f"{(ns or 0) / 1e9:.6f}s"

    to.write(
        f"total duration:       {seconds(line.get('total_duration'))}\n"
        f"load duration:        {seconds(line.get('load_duration'))}\n"
        f"prompt eval count:    {line.get('prompt_eval_count', 0)} token(s)\n"
        f"prompt eval duration: {seconds(line.get('prompt_eval_duration'))}\n"
        f"eval count:           {line.get('eval_count', 0)} token(s)\n"
        f"eval duration:        {seconds(line.get('eval_duration'))}\n"
    )
    to.flush()


def read_message(first: str) -> str:
    """A message: one line, or from a line starting with \"\"\" to one ending with it."""
    if not first.startswith('"""'):
        return first
    text = first[3:]
    lines: list[str] = []
    while not text.endswith('"""'):
        lines.append(text)
        text = input("... ")
    lines.append(text[:-3])
    return "\n".join(lines).strip("\n")
