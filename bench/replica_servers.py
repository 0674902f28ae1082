"""Several ``airgate serve`` replicas behind a real HAProxy, as a scaled-out deployment runs them.

Shared by every replica: one database (``[audit] database_url``: the API keys and the strict
audit log; PostgreSQL, or empty for SQLite in the data dir when there is only one replica), one
Redis (``[limits] redis_url``), one pepper (``[auth] pepper_file``: 32 random bytes, 0600, so a
key hashes alike everywhere), one policy directory. Each replica's own: a data dir, a port, an
audit chain (``[audit] chain``, named after the replica, where this airgate has the setting) and
the key that signs its checkpoints (``<data_dir>/keys/audit-signing.key``, made before the first
start); every replica's public key is pinned in every replica's ``[audit] trusted_keys``.

HAProxy in front of them: ``bench/haproxy.py``.

Waiting is polling a condition against a deadline; the pause between polls is a bounded wait on
the processes concerned, so one that dies is reported at once, with its log's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

from bench._client import BenchError
from bench._report import REPO_ROOT
from bench._serve import free_port, inherited_env, serve_command, stop, tail

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "PG_ADMIN",
    "POLL_S",
    "Replica",
    "Shared",
    "Watched",
    "chains_supported",
    "create_keys",
    "migrate",
    "postgres_database",
    "prepare_replicas",
    "wait_for",
    "write_pepper",
]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
READY_DEADLINE_S = 120.0
POLL_S = 0.05


def chains_supported() -> bool:
    """Whether this airgate has ``[audit] chain`` (one audit chain per writer)."""
    from gateway.config import AuditSettings

    return "chain" in AuditSettings.__struct_fields__


@dataclass(frozen=True, slots=True)
class Shared:
    """What every replica of one deployment shares."""

    database_url: str  # "": SQLite in each data dir (one replica only)
    redis_url: str
    pepper_file: Path
    policy_dir: Path


def write_pepper(path: Path) -> Path:
    """A new deployment pepper: 32 random bytes in a 0600 file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_bytes(32))
    return path


@contextlib.contextmanager
def postgres_database(admin_url: str = PG_ADMIN, prefix: str = "airgate_replicas") -> Iterator[str]:
    """A new, empty PostgreSQL database (``postgresql://...``), dropped afterwards."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    from gateway.db import create_db_engine, database_url

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        engine = create_db_engine(database_url("", admin_url), isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                await conn.execute(text(sql))
        finally:
            await engine.dispose()

    try:
        asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    except (OSError, SQLAlchemyError) as exc:
        raise BenchError(f"PostgreSQL at {admin_url}: {exc}") from exc
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def migrate(database_url: str) -> None:
    """Bring a shared database to airgate's schema once, before any replica starts (the
    replicas run with ``[audit] migrate = false``, as a DBA-migrated production does)."""
    from gateway.db import database_url as sqlalchemy_url
    from gateway.db.migrate import upgrade

    asyncio.run(upgrade(sqlalchemy_url("", database_url)))


def _toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


class Replica:
    """One ``airgate serve`` of the deployment: its files, its process while it runs."""

    def __init__(self, name: str, work: Path, shared: Shared, cpus: str = "") -> None:
        self.name = name
        self.shared = shared
        self.cpus = cpus  # ``taskset -c`` list; "" runs unpinned
        root = work / name
        self.data_dir = root / "data"
        self.config = root / "airgate.toml"
        self.log_path = root / "serve.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def write_config(self, trusted_keys: Sequence[str]) -> None:
        shared = self.shared
        audit = [
            "[audit]",
            "strict = true",
            f"database_url = {json.dumps(shared.database_url)}",
            f"trusted_keys = {_toml_list(trusted_keys)}",
        ]
        if chains_supported():
            audit.append(f"chain = {json.dumps(self.name)}")
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            f"[auth]\npepper_file = {json.dumps(str(shared.pepper_file))}\n\n"
            f"[policy]\npath = {json.dumps(str(shared.policy_dir))}\n\n"
            f'[limits]\nredis_url = {json.dumps(shared.redis_url)}\nfail_mode = "open"\n\n'
            + "\n".join(audit)
            + '\n\n[[models]]\nid = "echo"\nengine = "echo"\n'
        )

    def settings(self) -> Settings:
        """The settings this replica's ``serve`` reads (its file, its data dir, no env)."""
        from gateway.config import load_settings

        return load_settings(self.config, environ={}, overrides={"data_dir": str(self.data_dir)})

    def environment(self) -> dict[str, str]:
        """This process's environment without AIRGATE_* (airgate refuses unknown ones, and
        none may change the configuration)."""
        return inherited_env("AIRGATE_")

    def command(self) -> list[str]:
        pin = ["taskset", "-c", self.cpus] if self.cpus else []
        return [*pin, *serve_command(), "serve", "--config", str(self.config),
                "--port", str(self.port), "--data-dir", str(self.data_dir)]  # fmt: skip

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the process (its own process group, output appended to its log)."""
        if self.running:
            raise BenchError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            log.write(f"\n=== {self.name}: start at {time.time():.3f}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                env=self.environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def ready_status(self) -> int | None:
        """``GET /ready`` straight to the replica; None when nothing answers."""
        try:
            return httpx.get(f"{self.url}/ready", timeout=2.0).status_code
        except httpx.TransportError:
            return None

    def died(self) -> str | None:
        """Why waiting on this replica is pointless (it exited), else None."""
        if self.process is None:
            return f"{self.name} was never started"
        code = self.process.poll()
        if code is None:
            return None
        return f"{self.name} exited with {code}; log tail:\n{tail(self.log_path, 30)}"

    def pause(self) -> None:
        """Wait up to POLL_S for the process to exit (so an exit is noticed at once)."""
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=POLL_S)

    def wait_ready(self, deadline_s: float = READY_DEADLINE_S) -> None:
        wait_for(lambda: self.ready_status() == 200, f"{self.name}: GET /ready == 200",
                 deadline_s, [self])  # fmt: skip

    def signal(self, sig: signal.Signals) -> None:
        if self.process is None or self.process.poll() is not None:
            raise BenchError(f"{self.name} is not running")
        self.process.send_signal(sig)

    def kill(self) -> int:
        """SIGKILL, as a crash; the exit status."""
        self.signal(signal.SIGKILL)
        assert self.process is not None
        return self.process.wait()

    def terminate(self, deadline_s: float = 60.0) -> int:
        """SIGTERM (a graceful drain) and wait for the exit; its status (0: drained)."""
        self.signal(signal.SIGTERM)
        assert self.process is not None
        try:
            return self.process.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{self.name} ignored SIGTERM for {deadline_s:.0f} s") from None

    def stop(self) -> None:
        """Teardown: SIGTERM the group, SIGKILL after a grace period, reap."""
        if self.process is not None and self.process.poll() is None:
            stop(self.process)


class Watched(Protocol):
    """A process a wait watches: why it is gone (None while it runs), a short wait on it."""

    def died(self) -> str | None: ...

    def pause(self) -> None: ...


def wait_for(
    condition: Callable[[], bool],
    what: str,
    deadline_s: float,
    watched: Sequence[Watched],
) -> None:
    """Poll ``condition`` until it holds; BenchError at the deadline or when a watched process
    exits (its log tail in the message)."""
    end = time.monotonic() + deadline_s
    while not condition():
        for proc in watched:
            reason = proc.died()
            if reason is not None:
                raise BenchError(f"{what}: {reason}")
        if time.monotonic() > end:
            raise BenchError(f"{what}: not true within {deadline_s:.0f} s")
        if watched:
            watched[0].pause()
        else:
            time.sleep(POLL_S)


def prepare_replicas(
    work: Path, names: Sequence[str], shared: Shared, cpus: Sequence[str] = ()
) -> list[Replica]:
    """The replicas' data dirs, each one's audit signing key, and their configurations, every
    public key pinned in every one (nothing started)."""
    from gateway.access.audit_signer import create_audit_signing_key

    replicas = [
        Replica(name, work, shared, cpus[i] if i < len(cpus) else "")
        for i, name in enumerate(names)
    ]
    public: list[str] = []
    for replica in replicas:
        replica.write_config([])  # to read the signer's settings; rewritten below
        public.append(create_audit_signing_key(replica.settings()))
    for replica in replicas:
        replica.write_config(public)
    return replicas


def create_keys(replica: Replica, wanted: Mapping[str, tuple[str, str | None]]) -> dict[str, str]:
    """API keys in the replica's (shared) database: name -> (role, team) in, name -> key out."""
    from gateway.access.keys import key_store

    async def create() -> dict[str, str]:
        async with key_store(replica.settings()) as store:
            made: dict[str, str] = {}
            for name, (role, team) in wanted.items():
                made[name] = (await store.create(role, team, name, created_by="bench"))[0]
            return made

    return asyncio.run(create())
