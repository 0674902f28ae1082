"""What ``--check`` verifies of a scenario's set-up, without starting a server or a peer.

A scenario's ``check(args)`` builds what its run builds (configuration and policy files, keys
and databases in a fresh data dir, command lines, request bodies) under ``args.cache_dir``, a
temporary directory then, and validates it with these:

- ``airgate_args``: an ``airgate ...`` command line, parsed by airgate's own CLI (its typer app)
  without running it: a renamed option or command fails here;
- ``policy_dir``: a policy directory, linted and loaded as ``airgate policy check`` does;
- ``importable``: modules (and names in them) a scenario imports only in its servers or worker
  processes;
- ``tools``: the external programs a run needs, reported and never required (a check also runs
  where the peers and tools are not installed; it never installs them).

Each returns a line for the scenario's summary, or raises BenchError.
"""

from __future__ import annotations

import importlib
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._client import BenchError
from bench._serve import serve_command

__all__ = ["airgate_args", "importable", "policy_dir", "shown", "tools"]


def shown(command: Sequence[str]) -> str:
    """A command line as the summary shows it."""
    return f"`{shlex.join(command)}`"


def airgate_args(command: Sequence[str]) -> str:
    """Parse ``command`` (``serve_command()`` and its arguments) as ``airgate`` would, stopping
    before the command runs; returns the command's name (``serve``, ``bundle create``)."""
    import typer
    import typer.main

    from gateway.cli.main import app

    # Typer's click (its own copy from typer 0.2x on, else click itself): its usage errors
    # derive from the ClickException above BadParameter.
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")
    prefix = serve_command()
    if list(command[: len(prefix)]) != prefix:
        raise BenchError(f"{shown(command)} does not start airgate's CLI ({shown(prefix)})")
    args = list(command[len(prefix) :])
    cmd: Any = typer.main.get_command(app)
    parent = typer.Context(cmd, info_name="airgate")
    path: list[str] = []
    while hasattr(cmd, "list_commands"):  # a group: the next word names its subcommand
        name = args.pop(0) if args else ""
        sub = cmd.get_command(parent, name)
        if sub is None:
            raise BenchError(f"airgate has no command {' '.join([*path, name])!r}")
        path.append(name)
        if hasattr(sub, "list_commands"):
            parent = typer.Context(sub, info_name=name, parent=parent)
        cmd = sub
    given = shlex.join(args)  # parsing consumes the list
    try:
        cmd.make_context(path[-1], args, parent=parent)
    except usage_error as exc:
        raise BenchError(
            f"`airgate {' '.join(path)}` refuses `{given}`: {exc.format_message()}"
        ) from exc
    return " ".join(path)


def policy_dir(path: Path) -> str:
    """The policy version of the documents under ``path``; BenchError on any error or warning
    ``airgate policy check`` would print."""
    from policies import PolicyError, lint, load_policy_dir

    findings = lint(path)
    if findings:
        raise BenchError(f"policy {path}: " + "; ".join(findings))
    try:
        return load_policy_dir(path).version
    except PolicyError as exc:
        raise BenchError(f"policy {path}: {exc}") from exc


def importable(names: Sequence[str]) -> str:
    """Import each of ``names`` now (``module``, or ``module:attribute``: that name must be in
    it); BenchError naming the first that fails."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            imported = importlib.import_module(module)
        except ImportError as exc:
            raise BenchError(f"cannot import {module}: {exc}") from exc
        if attribute and not hasattr(imported, attribute):
            raise BenchError(f"{module} has no {attribute}")
    return f"imported {', '.join(names)}"


def tools(names: Sequence[str], hint: str) -> str:
    """Where each program is on PATH, or that it is missing (``hint``: how a run gets it)."""
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, where in found.items() if where is None]
    parts = [f"{name} {where}" for name, where in found.items() if where is not None]
    if missing:
        parts.append(f"not found: {', '.join(missing)} ({hint})")
    return "tools: " + "; ".join(parts)
