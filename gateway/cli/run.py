"""`airgate run MODEL`, `airgate ls`, `airgate ps`: Ollama's terminal commands, as clients of
a running `airgate serve` (its Ollama API), so each request is authenticated, policed and
audited like any other.  When no server answers at the default address, `run` starts one in its
own process (`serving.in_process`: the same app, on a loopback port the OS picks, for the
command's life), trusting the local user as `[auth] local_trust` does.

The conversation lives in this process's memory only: nothing is written to disk, and no
readline history file is read or written (readline keeps its line history in memory).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import env
from ..config import ConfigError, load_settings
from .chat_session import Session, read_message
from .common import ConfigOpt, DataDirOpt, fail, load_cli_settings
from .ollama_client import Client, ClientError, NotRunning, ServerError
from .serving import ServerFailed, in_process

__all__ = ["ls", "ps", "run"]

HostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        envvar=env.HOST,
        help=f"The airgate server (also ${env.HOST}; default: the address the local "
        "configuration serves on, http://127.0.0.1:8000 unless it says otherwise).",
        show_envvar=False,
    ),
]


def _client(host: str) -> Client:
    return Client(host, os.environ.get(env.API_KEY, ""))


def _local_address(config: Path | None, data_dir: Path | None) -> str:
    """Where the local configuration's server listens (`[server] host` and `port`)."""
    server = load_cli_settings(config, data_dir).server
    host = "127.0.0.1" if server.host in ("", "0.0.0.0", "::") else server.host
    return f"http://{f'[{host}]' if ':' in host else host}:{server.port}"


def _repl(session: Session) -> None:
    with contextlib.suppress(ImportError):  # a Python built without it: plain input()
        import readline  # noqa: F401  (line editing; its history stays in memory, no file)
    typer.echo("Send a message (/? for help)")
    while True:
        try:
            line = input(">>> ")
            if not line.strip():
                continue
            message = read_message(line)
        except EOFError:  # Ctrl-D
            typer.echo()
            return
        except KeyboardInterrupt:
            typer.echo("\nUse Ctrl + d or /bye to exit.")
            continue
        if message.startswith("/") and not line.startswith('"""'):
            if not session.command(message, typer.echo):
                return
            continue
        try:
            session.ask(message)
        except KeyboardInterrupt:  # the stream is closed: the server aborts the answer
            typer.echo()
        except ServerError as exc:
            typer.echo(f"Error: {exc}", err=True)
        typer.echo()


def _chat(client: Client, model: str, words: str, interactive: bool) -> None:
    session = Session(client, model, sys.stdout)
    if words:
        session.ask(words)
    elif interactive:
        _repl(session)
    else:
        raise fail("no prompt: give one as an argument or on stdin", 2)


def _answers(client: Client) -> bool:
    """Whether a server answers at the client's address (its public /health)."""
    try:
        client.get("/health")
    except NotRunning:
        return False
    except ClientError:
        return True  # something answers there: let the chat say what is wrong
    return True


@contextlib.contextmanager
def _own_server(address: str, config: Path | None, data_dir: Path | None) -> Iterator[Client]:
    """A server in this process for the command's life, and a client of it without a key:
    the same configuration and data directory as `serve`, on a loopback port the OS picks."""
    try:
        settings = load_settings(
            config,
            overrides={
                "data_dir": str(data_dir) if data_dir else None,
                "server.host": "127.0.0.1",
                "server.port": 0,
                "server.log_level": "warning",
                "auth.local_trust": True,
            },
        )
    except ConfigError as exc:
        raise fail(f"configuration error: {exc}", 2) from None
    typer.echo(
        f"airgate: no server at {address}; loading the models in this process "
        f"(data directory {settings.data_dir})",
        err=True,
    )
    try:
        with in_process(settings) as url:
            client = Client(url, os.environ.get(env.API_KEY, ""))
            try:
                yield client
            finally:
                client.close()
    except ServerFailed as exc:
        raise fail(str(exc), exc.code) from None


def run(
    model: Annotated[str, typer.Argument(help="The model (see `airgate ls`).")],
    prompt: Annotated[
        list[str] | None, typer.Argument(help="A prompt: answer it and exit.")
    ] = None,
    host: HostOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Chat with a model in the terminal, or answer one prompt (an argument, or stdin).

    Talks to the `airgate serve` at --host with the API key in $AIRGATE_API_KEY.  Without
    --host: to the server of the local configuration (--config, --data-dir: as for `serve`),
    and when none runs there, loads the models in this process for as long as the command runs
    (the local user trusted as with `auth.local_trust`).  The conversation is kept in memory
    only.
    """
    words = " ".join(prompt or [])
    interactive = sys.stdin.isatty()
    if not interactive:
        words = " ".join(p for p in (sys.stdin.read().strip(), words) if p)
    local = host is None
    address = _local_address(config, data_dir) if host is None else host
    client = _client(address)
    try:
        if local and not _answers(client):
            with _own_server(address, config, data_dir) as own:
                _chat(own, model, words, interactive)
        else:
            _chat(client, model, words, interactive)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except ClientError as exc:
        raise fail(str(exc)) from None
    finally:
        client.close()


def _ago(when: str, now: datetime) -> str:
    try:
        then = datetime.fromisoformat(when.replace("Z", "+00:00"))
    except ValueError:
        return when
    seconds = int((now - then).total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if count > 1 else ''} ago"
    return "Less than a minute ago"


def _table(rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        typer.echo("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _listing(host: str | None, path: str) -> list[dict[str, Any]]:
    client = _client(_local_address(None, None) if host is None else host)
    try:
        models: list[dict[str, Any]] = client.get(path).get("models", [])
    except ClientError as exc:
        raise fail(str(exc)) from None
    finally:
        client.close()
    return models


def _id(model: dict[str, Any]) -> str:
    """The signed bundle's digest, shortened as Ollama shortens its ids; none: `-`."""
    return str(model.get("digest") or "-")[:12]


def _size(model: dict[str, Any]) -> str:
    """Bytes in decimal units, as Ollama prints them (291 MB); unknown: `-`."""
    size = model.get("size")
    if not isinstance(size, int):
        return "-"
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}" if size < 10 * scale else f"{size // scale} {unit}"
    return f"{size} B"


def _processor(model: dict[str, Any]) -> str:
    """Where the weights are, from `size_vram` against `size`; unknown: `-`."""
    size, vram = model.get("size"), model.get("size_vram")
    if not isinstance(size, int) or not isinstance(vram, int) or size <= 0:
        return "-"
    gpu = round(100 * vram / size)
    if gpu == 0:
        return "100% CPU"
    return "100% GPU" if gpu == 100 else f"{100 - gpu}%/{gpu}% CPU/GPU"


def ls(host: HostOpt = None) -> None:
    """List the models the server offers you (GET /api/tags)."""
    now = datetime.now(UTC)
    rows = [["NAME", "ID", "SIZE", "MODIFIED"]]
    for m in _listing(host, "/api/tags"):
        rows.append([m["name"], _id(m), _size(m), _ago(m.get("modified_at", ""), now)])
    _table(rows)


def ps(host: HostOpt = None) -> None:
    """List the models loaded now (GET /api/ps); they stay loaded while the server runs."""
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "UNTIL"]]
    for m in _listing(host, "/api/ps"):
        rows.append([m["name"], _id(m), _size(m), _processor(m), "Forever"])
    _table(rows)
