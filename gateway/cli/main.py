"""The `airgate` command."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import env
from ..config import ConfigError, load_settings
from . import audit_log as _audit_log  # noqa: F401  (registers `audit verify|witness|init`)
from . import bundle_import as _bundle_import  # noqa: F401  (`bundle import|list|remove|renew`)
from .admin import audit_app, db_app, keys_app, policy_app
from .audit_segment import device_app  # also registers `audit import`
from .audit_signer import audit_signer_app
from .bundles import bundle_app, kms_app, signing_key_app
from .report import report_app
from .run import ls, ps, run
from .selftest import selftest
from .serving import ServerFailed, serve_foreground

__all__ = ["app", "main"]

app = typer.Typer(
    name="airgate",
    help="Air-gapped enterprise LLM gateway: an OpenAI-compatible API over in-process engines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


app.add_typer(bundle_app, name="bundle")
app.add_typer(signing_key_app, name="signing-key")
app.add_typer(kms_app, name="kms")
app.add_typer(keys_app, name="keys")
app.add_typer(policy_app, name="policy")
app.add_typer(audit_app, name="audit")
app.add_typer(audit_signer_app, name="audit-signer")
app.add_typer(db_app, name="db")
app.add_typer(device_app, name="device")
app.add_typer(report_app, name="report")
# clients of a running server (its Ollama API), as `ollama run | ls | ps`
app.command()(run)
app.command()(ls)
app.command()(ps)
# the installation's own check (gateway/selftest)
app.command()(selftest)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"airgate: {message}", err=True)
    return typer.Exit(code)


@app.command()
def serve(
    config: Annotated[
        Path | None, typer.Option("--config", "-c", help=f"airgate.toml (also ${env.CONFIG}).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[
        int | None, typer.Option(help="Port (default 8000; 0 picks a free one).")
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            help=f"Data directory (also ${env.DATA_DIR}; default under the user's data home).",
        ),
    ] = None,
    log_level: Annotated[str | None, typer.Option(help="debug, info, warning or error.")] = None,
    insecure_plaintext_model: Annotated[
        bool,
        typer.Option(
            "--insecure-plaintext-model",
            help="Also serve models given as plain files (`path`): unencrypted, unsigned weights.",
        ),
    ] = False,
) -> None:
    """Serve the OpenAI-compatible API.  With no configuration, serves Gemma 3 270M on llama.cpp."""
    try:
        settings = load_settings(
            config,
            overrides={
                "server.host": host,
                "server.port": port,
                "server.log_level": log_level,
                "data_dir": str(data_dir) if data_dir else None,
            },
        )
    except ConfigError as exc:
        raise _fail(f"configuration error: {exc}") from None
    try:
        serve_foreground(settings, allow_plaintext=insecure_plaintext_model)
    except ServerFailed as exc:
        raise _fail(str(exc), exc.code) from None


@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as v

    typer.echo(v("airgate"))


def main() -> None:
    app(prog_name="airgate")


if __name__ == "__main__":  # pragma: no cover
    main()
