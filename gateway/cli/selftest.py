"""`airgate selftest`: check an installation and print a pass/fail report (exit 1 on any
failure).  The checks are `gateway.selftest`'s; this module only wires them to the command
line: the same configuration options as `serve`, and `serving.in_process` for the one real
inference."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Annotated

import typer

from ..config import Settings
from ..selftest import ServeFailed, encode_json, line, run_selftest, summary
from .admin import os_user
from .common import ConfigOpt, DataDirOpt, load_cli_settings
from .serving import ServerFailed, in_process

__all__ = ["selftest"]


@contextlib.contextmanager
def _serve(settings: Settings) -> Iterator[str]:
    try:
        with in_process(settings) as url:
            yield url
    except ServerFailed as exc:
        raise ServeFailed(str(exc)) from None


def selftest(
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the report as one JSON document.")
    ] = False,
    no_inference: Annotated[
        bool,
        typer.Option("--no-inference", help="Do not load the models for one real request."),
    ] = False,
) -> None:
    """Check the installation: the data directory, keys, bundles, the audit log, the egress
    guard, the configured services and one real inference.  Exit 1 if any check fails.  Run
    it with the server stopped (the inference serves the models in this process)."""
    settings = load_cli_settings(config, data_dir)
    results = run_selftest(
        settings,
        actor=os_user(),
        serve=None if no_inference else _serve,
        on_result=(lambda _: None) if as_json else (lambda r: typer.echo(line(r))),
    )
    if as_json:
        sys.stdout.buffer.write(encode_json(results) + b"\n")
        sys.stdout.flush()
    else:
        typer.echo(summary(results))
    if not all(r.ok for r in results):
        raise typer.Exit(1)
