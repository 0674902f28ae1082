"""Servers under test as subprocesses: ports, process groups, logs and app keys.

Every server runs in its own process group with its output appended to a log file, and is always
stopped (SIGTERM to the group, SIGKILL after a grace period) when its ``spawned`` block exits,
so an engine's child processes never outlive a scenario.

On Linux this process becomes a "child subreaper" before it starts a server: a server's
grandchildren that lose their parent (vLLM's model worker outlives its engine-core process at
shutdown) are re-parented to us instead of init, and ``stop`` reaps them. Their CPU time then
counts as ours in ``os.times()``, which ``bench._report.foreign_cpu_share`` relies on: otherwise
the model's own compute would be counted as another process's load.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from bench._client import BenchError
from bench._report import REPO_ROOT

if TYPE_CHECKING:
    from gateway.config import Settings

__all__ = [
    "create_api_key",
    "free_port",
    "inherited_env",
    "run_served",
    "serve_command",
    "spawned",
    "stop",
    "tail",
]

T = TypeVar("T")


def free_port() -> int:
    """A port nobody listens on right now (the kernel's pick for 127.0.0.1:0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command() -> list[str]:
    """How to start airgate's CLI: the ``airgate`` script beside this Python, else ``-m``."""
    script = Path(sys.executable).with_name("airgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "gateway"]


def inherited_env(drop_prefix: str) -> dict[str, str]:
    """This process's environment without the variables named ``drop_prefix...``: airgate
    rejects unknown ``AIRGATE_*`` variables, and the benchmark's own must never reach it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(drop_prefix)}


_PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def _adopt_orphans() -> None:
    """Make this process the reaper of its descendants' orphans (Linux; a no-op elsewhere)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_group(pgid: int, grace: float) -> None:
    """Wait for the adopted members of process group ``pgid``; SIGKILL them after ``grace``."""
    deadline = time.monotonic() + grace
    killed = False
    while True:
        try:
            pid, _ = os.waitpid(-pgid, os.WNOHANG)
        except ChildProcessError:
            return  # no child of ours is left in the group
        if pid:
            continue
        if time.monotonic() > deadline:
            if killed:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            killed = True
            deadline = time.monotonic() + 10.0
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, SIGKILL after a grace period; then reap what is left
    of the group (orphans adopted by this process)."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    _reap_group(proc.pid, 20.0)


@contextlib.contextmanager
def spawned(
    command: Sequence[str], env: dict[str, str], log_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """A subprocess in its own process group, output to ``log_path``, always stopped on exit."""
    _adopt_orphans()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            list(command),
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop(proc)


def run_served(
    label: str,
    command: Sequence[str],
    env: dict[str, str],
    log_path: Path,
    drive: Callable[[subprocess.Popen[bytes]], Coroutine[Any, Any, T]],
    *,
    tail_lines: int = 15,
) -> T:
    """Start ``command`` (``spawned``, a header line in its log), run ``drive(proc)`` in a new
    event loop, stop it; a BenchError comes back naming ``label``, with the log's last lines."""
    with log_path.open("ab") as log:
        log.write(f"\n=== {label}: {shlex.join(command)}\n".encode())
    with spawned(command, env, log_path) as proc:
        try:
            return asyncio.run(drive(proc))
        except BenchError as exc:
            raise BenchError(
                f"{label}: {exc}\n--- last lines of {log_path} ---\n{tail(log_path, tail_lines)}"
            ) from exc


def _config_arg(server_args: Sequence[str]) -> str | None:
    """The ``--config``/``-c`` file among the extra ``airgate serve`` arguments, if any."""
    for i, arg in enumerate(server_args):
        if arg in ("--config", "-c") and i + 1 < len(server_args):
            return server_args[i + 1]
        if arg.startswith("--config="):
            return arg.partition("=")[2]
    return None


def _server_settings(
    data_dir: Path, env: Mapping[str, str], server_args: Sequence[str]
) -> Settings:
    """The settings as ``airgate serve`` will read them: its environment, the ``--config`` among
    ``server_args``, ``--data-dir``; BenchError when the server would refuse them."""
    # Imported here: worker processes that import the scenarios need no gateway.
    from gateway.config import ConfigError, load_settings

    try:
        return load_settings(
            _config_arg(server_args), environ=env, overrides={"data_dir": str(data_dir)}
        )
    except ConfigError as exc:
        raise BenchError(f"airgate would refuse its configuration: {exc}") from exc


def create_api_key(
    data_dir: Path, env: Mapping[str, str], server_args: Sequence[str], *, name: str
) -> str:
    """A new app key in the database the server is about to open (``_server_settings``)."""
    from gateway.access.keys import key_store

    settings = _server_settings(data_dir, env, server_args)

    async def create() -> str:
        async with key_store(settings) as store:
            key, _ = await store.create("app", name=name, created_by="bench")
            return key

    return asyncio.run(create())


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ('' when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
