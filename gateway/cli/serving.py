"""Starting a server: what `airgate serve` runs in the foreground, and what `airgate run` runs
in a thread of its own process when no server answers (`in_process`).

Both take the data directory's lock, refuse a log they cannot continue, make the first admin
key, check every bundle before the port is bound, and serve the same app: a request from `run`
is authenticated, policed and audited as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer

from ..config import ConfigError, Settings
from ..db.migrate import SchemaOutdated
from ..engines.registry import ModelRegistry
from .admin import os_user

__all__ = ["FIRST_KEY_FILE", "ServerFailed", "in_process", "lock_data_dir", "serve_foreground"]

FIRST_KEY_FILE = "initial-admin-key"
# how long `in_process` waits for the engines to load (the defaults take seconds; a large
# bundle decrypts at about 1 GB/s)
_READY_TIMEOUT_S = 600.0


class ServerFailed(Exception):
    """The server could not start: one line for the user, and the exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def lock_data_dir(data_dir: Path) -> int:
    """Hold an exclusive lock on the data dir for the life of the process (close the fd to
    let go)."""
    data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(data_dir / "airgate.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ServerFailed(
            f"data directory {data_dir} is in use by another airgate process; "
            "give each instance its own --data-dir",
            2,
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


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
        raise ServerFailed(f"the audit log cannot be continued: {exc}", 2) from None


def _server(settings: Settings, *, allow_plaintext: bool) -> tuple[Any, ModelRegistry]:
    """Everything up to a server ready to run (a `DrainingServer`), and its registry (whose
    engines load in the app's lifespan)."""
    import uvicorn

    from bundles import BundleError

    from ..access.keys import bootstrap_admin_key
    from ..app import create_app
    from ..audit import AuditError
    from ..engines.runtime import build_registry
    from ..http.drain import CLOSE_GRACE_S, Drain, DrainingServer
    from ..http.server_protocol import http_protocol

    _check_audit_log(settings)
    hand_over = functools.partial(_hand_over_first_key, Path(settings.data_dir))
    try:
        asyncio.run(bootstrap_admin_key(settings, os_user(), hand_over))
    except AuditError as exc:  # no key without its audit record
        raise ServerFailed(
            f"the first admin key cannot be audited, so none was made: {exc}", 2
        ) from None
    try:
        registry = build_registry(settings, allow_plaintext=allow_plaintext)
    except ConfigError as exc:
        raise ServerFailed(f"configuration error: {exc}", 2) from None
    except BundleError as exc:
        raise ServerFailed(f"cannot serve the configured bundles: {exc}") from None
    drain = Drain.of(settings.server)
    app_ = create_app(settings, registry=registry, drain=drain)
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
    return server, registry


def _guarded(settings: Settings, allow_plaintext: bool) -> tuple[Any, ModelRegistry]:
    try:
        return _server(settings, allow_plaintext=allow_plaintext)
    except ConfigError as exc:  # a secret the configuration names (the pepper), unusable
        raise ServerFailed(f"configuration error: {exc}", 2) from None
    except SchemaOutdated as exc:  # PostgreSQL is migrated only when asked to
        raise ServerFailed(
            f"{exc}; or let `airgate serve` migrate it: `[audit] migrate = true`", 2
        ) from None


def _prepare_process(settings: Settings) -> None:
    import resource

    from ..egress.startup import protect
    from ..telemetry.logs import configure_logging

    # A core dump of this process could hold prompts: never write one.
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    configure_logging(settings.server.log_level, settings.server.log_format)
    # before anything connects (the audit log's check) and before any engine starts: its
    # processes inherit the guard ([egress])
    protect(settings)


def serve_foreground(settings: Settings, *, allow_plaintext: bool) -> None:
    """`airgate serve`: serve until a signal drains the server."""
    lock = lock_data_dir(Path(settings.data_dir))
    try:
        _prepare_process(settings)
        if allow_plaintext:
            typer.secho(
                "WARNING: --insecure-plaintext-model: plain model files will be served; their "
                "weights are neither encrypted nor signed. Never use this in production.",
                fg=typer.colors.RED,
                bold=True,
                err=True,
            )
        server, registry = _guarded(settings, allow_plaintext)
        server.run()
        if registry.load_error is not None:
            raise ServerFailed(f"could not load the models: {registry.load_error}")
        if not server.started:
            raise ServerFailed("the server could not start (see the log above)")
    finally:
        os.close(lock)


@contextlib.contextmanager
def in_process(settings: Settings) -> Iterator[str]:
    """Serve `settings` from a thread of this process for the block; yields the base URL once
    the models are loaded.  The server listens on loopback only, on a port the OS picks."""
    lock = lock_data_dir(Path(settings.data_dir))
    try:
        _prepare_process(settings)
        server, registry = _guarded(settings, False)
        thread = threading.Thread(target=server.run, name="airgate-server", daemon=True)
        thread.start()
        try:
            yield _wait_ready(server, registry, thread)
        finally:
            server.should_exit = True
            thread.join()
    finally:
        os.close(lock)


def _wait_ready(server: Any, registry: ModelRegistry, thread: threading.Thread) -> str:
    """Poll (the server's thread sets plain attributes) until the engines are loaded."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while not (registry.ready and server.started):
        if registry.load_error is not None:
            raise ServerFailed(f"could not load the models: {registry.load_error}")
        if not thread.is_alive():
            raise ServerFailed("the server could not start (see the log above)")
        if time.monotonic() > deadline:
            raise ServerFailed("the models did not load in time")
        time.sleep(0.05)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return f"http://{host}:{port}"
