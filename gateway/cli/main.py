"""The `airgate` command."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from .. import env
from ..config import ConfigError, Settings, load_settings
from ..db.migrate import SchemaOutdated
from . import audit_log as _audit_log  # noqa: F401  (registers `audit verify|witness|init`)
from .admin import audit_app, db_app, keys_app, os_user, policy_app
from .audit_signer import audit_signer_app
from .bundles import bundle_app, kms_app, signing_key_app
from .run import ls, ps, run

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
# clients of a running server (its Ollama API), as `ollama run | ls | ps`
app.command()(run)
app.command()(ls)
app.command()(ps)


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"airgate: {message}", err=True)
    return typer.Exit(code)


def _lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on the data dir for the life of the process."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / "airgate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _fail(
            f"data directory {data_dir} is in use by another airgate process; "
            "give each instance its own --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


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
    lock = _lock_data_dir(Path(settings.data_dir))
    try:
        _run(settings, allow_plaintext=insecure_plaintext_model)
    except ConfigError as exc:  # a secret the configuration names (the pepper), unusable
        raise _fail(f"configuration error: {exc}") from None
    except SchemaOutdated as exc:  # PostgreSQL is migrated only when asked to
        raise _fail(
            f"{exc}; or let `airgate serve` migrate it: `[audit] migrate = true`", code=2
        ) from None
    finally:
        os.close(lock)


def _run(settings: Settings, *, allow_plaintext: bool) -> None:
    import resource

    import uvicorn

    from bundles import BundleError

    from ..access.keys import bootstrap_admin_key
    from ..app import create_app
    from ..audit import AuditError
    from ..engines.runtime import build_registry
    from ..http.drain import CLOSE_GRACE_S, Drain, DrainingServer
    from ..telemetry.logs import configure_logging

    # A core dump of this process could hold prompts: never write one.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    configure_logging(settings.server.log_level)
    if allow_plaintext:
        typer.secho(
            "WARNING: --insecure-plaintext-model: plain model files will be served; their weights "
            "are neither encrypted nor signed. Never use this in production.",
            fg=typer.colors.RED,
            bold=True,
            err=True,
        )
    _check_audit_log(settings)
    hand_over = functools.partial(_hand_over_first_key, Path(settings.data_dir))
    try:
        asyncio.run(bootstrap_admin_key(settings, os_user(), hand_over))
    except AuditError as exc:  # no key without its audit record
        raise _fail(f"the first admin key cannot be audited, so none was made: {exc}") from None
    try:
        registry = build_registry(settings, allow_plaintext=allow_plaintext)
    except ConfigError as exc:
        raise _fail(f"configuration error: {exc}") from None
    except BundleError as exc:
        raise _fail(f"cannot serve the configured bundles: {exc}", code=1) from None
    drain = Drain.of(settings.server)
    app_ = create_app(settings, registry=registry, drain=drain)
    from ..http.server_protocol import http_protocol

    tls: dict[str, Any] = {}
    if (mtls := settings.auth.mtls) is not None:
        import ssl

        # client certificates are required and verified in the handshake; the protocol
        # passes the verified certificate to the app (the ASGI TLS extension)
        tls = {
            "ssl_certfile": mtls.cert_file,
            "ssl_keyfile": mtls.key_file,
            "ssl_ca_certs": mtls.ca_file,
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }
    server = DrainingServer(
        uvicorn.Config(
            app_,
            host=settings.server.host,
            port=settings.server.port,
            loop="uvloop",
            # httptools with caps on the request head's size, header count and time ([server])
            http=http_protocol(settings.server, tls=bool(tls)),
            **tls,
            lifespan="on",
            access_log=False,
            log_config=None,
            server_header=False,
            # X-Forwarded-* from a local client would otherwise rewrite the client address
            # (uvicorn trusts 127.0.0.1 by default); nothing here sits behind a proxy by default
            proxy_headers=False,
            # after the drain (SIGTERM: finish or cut what runs, see http/drain.py), for the
            # last bytes to reach clients
            timeout_graceful_shutdown=CLOSE_GRACE_S,
        ),
        drain,
    )
    registry.request_shutdown = lambda: setattr(server, "should_exit", True)
    server.run()
    if registry.load_error is not None:
        raise _fail(f"could not load the models: {registry.load_error}", code=1)
    if not server.started:
        raise _fail("the server could not start (see the log above)", code=1)


FIRST_KEY_FILE = "initial-admin-key"


def _hand_over_first_key(data_dir: Path, key: str) -> None:
    """Give the first admin key to the operator once, never to a log: on a terminal it is
    printed; otherwise stderr is a journal or a pod log, so it goes to a 0600 file in the data
    directory and the log says only where."""
    if sys.stderr.isatty():
        typer.secho(
            f"airgate: first start: an admin API key was created. It is shown this once:\n\n"
            f"    {key}\n\nKeep it safe; create app keys with it (POST /admin/keys) or "
            "with `airgate keys create`.",
            fg=typer.colors.YELLOW,
            err=True,
        )
        return
    path = data_dir / FIRST_KEY_FILE
    # one left by an earlier first start holds no active admin key (else none would be made
    # now); created anew, never opened as it is (it could be a link to elsewhere)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(key + "\n")
    logging.getLogger("airgate.keys").info(
        "first start: an admin API key was written to %s (mode 0600); read it, store it in "
        "your secret manager and delete the file",
        path,
    )


def _check_audit_log(settings: Settings) -> None:
    """Refuse to start over a lost, truncated, rolled-back or foreign audit log (exit 2)."""
    from ..access.audit_log import check_audit_log
    from ..audit import AuditChainBusy, AuditCorrupt

    try:
        asyncio.run(check_audit_log(settings))
    except (AuditCorrupt, AuditChainBusy) as exc:
        raise _fail(f"the audit log cannot be continued: {exc}", code=2) from None


@app.command()
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as v

    typer.echo(v("airgate"))


def main() -> None:
    app(prog_name="airgate")


if __name__ == "__main__":  # pragma: no cover
    main()
