"""N `airgate serve` replicas behind a real HAProxy, for e2e tests (echo engine).

One throwaway PostgreSQL database (API keys and the strict audit log), the shared Redis, one
pepper file, one policy directory; each replica its own data dir, audit chain ("r1", "r2", ...)
and signing key, every public key pinned in every replica.  The processes, the configuration
and the waits are `bench/replica_servers.py`'s (the `replicas` benchmark runs the same
deployment); this module adds the test's lifecycle: everything up and UP in HAProxy on entry;
`stop_replicas` (SIGTERM: each replica writes its closing checkpoint) before a test reads the
log; everything torn down and the database dropped on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.haproxy import HAProxy
from bench.replica_servers import (
    Replica,
    Shared,
    create_keys,
    migrate,
    postgres_database,
    prepare_replicas,
    write_pepper,
)

__all__ = ["REDIS_URL", "Cluster", "cluster"]

REDIS_URL = "redis://127.0.0.1:6379/0"
STOP_DEADLINE_S = 60.0


@dataclass
class Cluster:
    """The running deployment: replicas by name, HAProxy in front, the API keys made."""

    replicas: dict[str, Replica]
    haproxy: HAProxy
    shared: Shared
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.haproxy.url

    def auth(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[key]}"}

    def start(self, name: str) -> None:
        """Start a replica (same data dir, chain and port as before) and wait until it is
        ready and HAProxy counts it UP."""
        replica = self.replicas[name]
        replica.start()
        replica.wait_ready()
        self.haproxy.wait_status(name, "UP")

    def restart(self, name: str) -> int | None:
        """SIGTERM the replica if it runs (its exit status, else None), then `start` it."""
        replica = self.replicas[name]
        code = replica.terminate(STOP_DEADLINE_S) if replica.running else None
        self.start(name)
        return code

    def kill(self, name: str) -> int:
        """SIGKILL (a crash); its exit status."""
        return self.replicas[name].kill()

    def terminate(self, name: str) -> int:
        """SIGTERM (a graceful drain); its exit status once it has exited."""
        return self.replicas[name].terminate(STOP_DEADLINE_S)

    def stop_replicas(self) -> dict[str, int | None]:
        """SIGTERM every running replica, wait for each; name -> exit status."""
        codes: dict[str, int | None] = {}
        for name, replica in self.replicas.items():
            codes[name] = replica.terminate(STOP_DEADLINE_S) if replica.running else None
        return codes

    def database_rows(self, sql: str) -> list[Any]:
        """The first column of every row `sql` returns from the shared database."""

        async def fetch() -> list[Any]:
            conn = await asyncpg.connect(self.shared.database_url)
            try:
                return [row[0] for row in await conn.fetch(sql)]
            finally:
                await conn.close()

        return asyncio.run(fetch())

    def airgate(self, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        """`python -m gateway ARGS` with replica `name`'s configuration and data dir."""
        replica = self.replicas[name]
        config = ["--config", str(replica.config), "--data-dir", str(replica.data_dir)]
        command = [sys.executable, "-m", "gateway", *args, *config]
        return subprocess.run(
            command,
            env=replica.environment(),
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=300,
            check=False,
        )


@contextlib.contextmanager
def cluster(
    root: Path, n: int, policy: str, keys: Mapping[str, tuple[str, str | None]]
) -> Iterator[Cluster]:
    """`n` replicas ("r1".."rN") behind HAProxy, ready and UP; `policy` is the one policy
    document (TOML); `keys`: name -> (role, team) of the API keys to make."""
    policy_dir = root / "policy"
    policy_dir.mkdir(parents=True)
    (policy_dir / "policy.toml").write_text(policy)
    with postgres_database(prefix="airgate_e2e_replicas") as database_url:
        migrate(database_url)
        shared = Shared(database_url, REDIS_URL, write_pepper(root / "pepper"), policy_dir)
        replicas = prepare_replicas(root, [f"r{i + 1}" for i in range(n)], shared)
        made = create_keys(replicas[0], keys)
        haproxy = HAProxy(root / "haproxy", replicas)
        try:
            for replica in replicas:
                replica.start()
            for replica in replicas:
                replica.wait_ready()
            haproxy.start()
            haproxy.wait_serving()
            yield Cluster({r.name: r for r in replicas}, haproxy, shared, made)
        finally:
            for replica in replicas:
                replica.stop()
            haproxy.stop()
