"""What every `airgate` subcommand shares: the options naming the configuration, settings
loading, and the one way a command fails (a red line on stderr, an exit code)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..config import ConfigError, Settings, load_settings

__all__ = ["ConfigOpt", "DataDirOpt", "err", "fail", "load_cli_settings", "out"]

out = Console()
err = Console(stderr=True)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="airgate.toml (database, KMS, policy).")
]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Data directory.")]


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print `message` (ours, never client content) and return the exit to raise."""
    err.print(f"[bold red]airgate:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def load_cli_settings(config: Path | None, data_dir: Path | None) -> Settings:
    try:
        return load_settings(config, overrides={"data_dir": str(data_dir) if data_dir else None})
    except ConfigError as exc:
        raise fail(f"configuration error: {exc}", 2) from None
