"""`airgate serve` as a real subprocess on a free port, on the real model (e2e helpers).

Waiting is always polling a condition against a deadline; the pause between polls is a bounded
wait on the server process itself, so a server that dies is noticed at once, not at the deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from gateway.access.keys import key_store
from gateway.config import load_settings

MODEL = "gemma-3-270m"
# The base model stops after a few tokens; banning <eos>, <end_of_turn> and </s> makes every
# greedy run go to max_tokens.
NO_END = {"1": -100, "106": -100, "212": -100}
SERVER_ENV = {"AIRGATE_ENGINE__SLOTS": "8", "AIRGATE_ENGINE__CONTEXT_LENGTH": "2048"}
READY_DEADLINE_S = 180.0
STOP_DEADLINE_S = 60.0
POLL_S = 0.05


def free_port() -> int:
    """A port nobody listens on right now (the kernel's pick for 127.0.0.1:0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any AIRGATE_* variable, plus `extra`."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    environ.update(extra or {})
    return environ


TEST_KEYS = "test-keys.json"  # role -> API key, written by the model_dir fixture


def seed_data_dir(target: Path, model_dir: Path) -> Path:
    """A fresh data dir holding the sealed default bundle, its keys, and a database with one
    API key per role (`test_keys(data_dir)` reads them).

    The bundle and key files are hard links (no 253 MB copy; 0600 modes kept); the database
    is copied, because each server writes its own audit log into it.
    """
    for sub in ("bundles", "keys"):
        for item in (model_dir / sub).rglob("*"):
            dest = target / item.relative_to(model_dir)
            if item.is_dir():
                dest.mkdir(parents=True, mode=0o700, exist_ok=True)
            else:
                dest.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
                dest.hardlink_to(item)
    for name in ("airgate.db", TEST_KEYS):
        if (model_dir / name).exists():
            shutil.copy2(model_dir / name, target / name)
    return target


def test_keys(data_dir: Path) -> dict[str, str]:
    """role -> API key of a seeded data dir ("app", "auditor", "admin")."""
    keys: dict[str, str] = json.loads((data_dir / TEST_KEYS).read_text())
    return keys


def auth(data_dir: Path, role: str = "app") -> dict[str, str]:
    """The Authorization header for a seeded data dir's key of `role`."""
    return {"Authorization": f"Bearer {test_keys(data_dir)[role]}"}


def add_test_keys(data_dir: Path, roles: tuple[str, ...] = ("app",)) -> dict[str, str]:
    """Create a key of each role in `data_dir`'s database (created and migrated first, as
    `serve` would) and record it in its `test-keys.json`, so that `auth(data_dir)` works for a
    server on a data dir that was not seeded.  Only for a data dir whose configuration leaves
    the database and the pepper at their defaults (in the data dir)."""

    async def create() -> dict[str, str]:
        settings = load_settings(None, environ={}, overrides={"data_dir": str(data_dir)})
        async with key_store(settings) as store:
            return {r: (await store.create(r, name=f"test-{r}"))[0] for r in roles}

    path = data_dir / TEST_KEYS
    keys = {**(test_keys(data_dir) if path.exists() else {}), **asyncio.run(create())}
    path.write_text(json.dumps(keys))
    return keys


EXIT_DEADLINE_S = 120.0  # a command that must exit on its own; past this it hangs


def run_cli(
    args: Sequence[str], env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command that must exit by itself; wide, plain (uncoloured) output."""
    environ = clean_env({"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1", **(env or {})})
    try:
        return subprocess.run(
            list(args),
            env=environ,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=EXIT_DEADLINE_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"{args} did not exit within {EXIT_DEADLINE_S}s (it should have)"
        ) from exc


def airgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGS`, which must exit by itself."""
    return run_cli([sys.executable, "-m", "gateway", *map(str, args)])


def ok(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`airgate(*args)`, which must succeed."""
    result = airgate(*args)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stderr}"
    return result


def serve_command(port: int, data_dir: Path, *more: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        *more,
    ]


class Server:
    """One `airgate serve` subprocess; stdout and stderr both go to `log_path`."""

    def __init__(
        self, process: subprocess.Popen[bytes], port: int, data_dir: Path, log_path: Path
    ) -> None:
        self.process = process
        self.port = port
        self.data_dir = data_dir
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"

    @classmethod
    def spawn(cls, data_dir: Path, log_path: Path, env: Mapping[str, str] | None = None) -> Server:
        """Start the process (not waiting for readiness)."""
        port = free_port()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                serve_command(port, data_dir),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=clean_env({**SERVER_ENV, **(env or {})}),
            )
        return cls(process, port, data_dir, log_path)

    def key(self, role: str = "app") -> str:
        """The API key of `role` in this server's data dir (seeded, or `add_test_keys`)."""
        return test_keys(self.data_dir)[role]

    def auth(self, role: str = "app") -> dict[str, str]:
        """The Authorization header of `key(role)`."""
        return {"Authorization": f"Bearer {self.key(role)}"}

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def log_records(self) -> list[dict[str, Any]]:
        """Every JSON line of the log (Python warnings printed at import are not JSON)."""
        records = []
        for line in self.log_text().splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records

    def request_records(self) -> list[dict[str, Any]]:
        return [r for r in self.log_records() if r.get("logger") == "airgate.request"]

    def pause(self) -> None:
        """Wait up to POLL_S for the process to exit; fail if it has."""
        try:
            code = self.process.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            return
        raise AssertionError(f"airgate exited with {code}; log tail:\n{self.log_text()[-4000:]}")

    def wait_until(
        self, condition: Callable[[], bool], what: str, deadline_s: float = 60.0
    ) -> None:
        """Poll `condition` until it holds; fail at the deadline or if the server exits."""
        end = time.monotonic() + deadline_s
        while not condition():
            if time.monotonic() > end:
                raise AssertionError(
                    f"{what}: not true within {deadline_s}s; log tail:\n{self.log_text()[-4000:]}"
                )
            self.pause()

    def ready_status(self) -> int | None:
        try:
            return httpx.get(f"{self.base_url}/ready", timeout=5).status_code
        except httpx.TransportError:
            return None  # not listening yet

    def wait_ready(self) -> None:
        self.wait_until(lambda: self.ready_status() == 200, "GET /ready == 200", READY_DEADLINE_S)

    def stop(self) -> int:
        """SIGTERM, wait for a graceful exit (kill past the deadline); the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise AssertionError(
                    f"airgate ignored SIGTERM for {STOP_DEADLINE_S}s; killed"
                ) from None
        return self.process.returncode


def start_server(data_dir: Path, log_path: Path, env: Mapping[str, str] | None = None) -> Server:
    server = Server.spawn(data_dir, log_path, env)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def stop_and_check(server: Server) -> None:
    """Stop the server; it must shut down gracefully (drained, lifespan shutdown ran, engines
    stopped) and exit 0."""
    code = server.stop()
    log = server.log_text()
    assert code == 0, f"airgate exited with {code} after SIGTERM:\n{log[-4000:]}"
    assert "Application shutdown complete" in log, log[-4000:]
