"""The first admin key never reaches a log: a real `airgate serve` (echo engine) on a fresh data
dir, with stderr a pipe (systemd, Kubernetes: the journal, the pod log), a terminal (pty), or
given a key the operator made offline (`airgate keys new-secret`) as a mounted secret.  Each
way, the key works against /v1/models and its creation is audited as `airgate keys create`'s."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import sqlite3
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx
import pytest
from server_process import (
    SERVER_ENV,
    Server,
    clean_env,
    free_port,
    ok,
    serve_command,
    stop_and_check,
)

from gateway.access.auth import SCANNER_PATTERN, parse_api_key

pytestmark = pytest.mark.e2e

CONFIG = """
[[models]]
id = "echo"
engine = "echo"
"""
SECRET_CONFIG = (
    CONFIG
    + """
[auth]
initial_admin_key_file = "{secret}"
"""
)
WRITTEN = "first start: an admin API key was written to"


def _copy(source: BinaryIO | int, log_path: Path) -> None:
    """Copy the server's output to its log file as it comes (until the writer closes)."""
    with log_path.open("ab") as log:
        while True:
            try:
                data = source.read(65536) if not isinstance(source, int) else os.read(source, 65536)
            except OSError:  # a pty whose other side closed
                data = b""
            if not data:
                return
            log.write(data)
            log.flush()


@contextlib.contextmanager
def serving(root: Path, config: str, *, terminal: bool) -> Iterator[Server]:
    """`airgate serve` on `root/data`, its stdout and stderr a pipe or a pseudo-terminal,
    ready; stopped and checked on exit."""
    (root / "airgate.toml").write_text(config)
    log_path = root / "server.log"
    log_path.touch()
    port = free_port()
    command = serve_command(port, root / "data", "--config", str(root / "airgate.toml"))
    env = clean_env({**SERVER_ENV, "TERM": "dumb"})
    if terminal:
        main, side = pty.openpty()
        process = subprocess.Popen(
            command, stdout=side, stderr=side, stdin=subprocess.DEVNULL, env=env
        )
        os.close(side)
        source: BinaryIO | int = main
    else:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        assert process.stdout is not None
        source = process.stdout
    copier = threading.Thread(target=_copy, args=(source, log_path), daemon=True)
    copier.start()
    server = Server(process, port, root / "data", log_path)
    try:
        server.wait_ready()
        yield server
    finally:
        try:
            stop_and_check(server)
        finally:
            copier.join(timeout=60)
            if terminal:
                os.close(main)


def works(server: Server, key: str) -> bool:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{server.base_url}/v1/models", headers=headers, timeout=30).status_code == 200


def keys_created(data_dir: Path) -> list[dict[str, Any]]:
    """The audit log's `keys.create` events."""
    db = data_dir / "airgate.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        events = [json.loads(r[0]) for r in conn.execute("SELECT body FROM audit_events")]
    return [e for e in events if e.get("action") == "keys.create"]


def test_with_stderr_a_pipe_the_key_goes_to_a_0600_file_and_never_to_the_log(
    tmp_path: Path,
) -> None:
    written = tmp_path / "data" / "initial-admin-key"
    with serving(tmp_path, CONFIG, terminal=False) as server:
        assert written.stat().st_mode & 0o777 == 0o600
        key = written.read_text().strip()
        parse_api_key(key)
        assert works(server, key)
    log = server.log_text()
    assert re.findall(SCANNER_PATTERN, log) == [] and key not in log
    assert f"{WRITTEN} {written} (mode 0600)" in log
    (created,) = keys_created(tmp_path / "data")
    assert created["outcome"] == "success" and created["principal"]["method"] == "cli"
    assert created["detail"]["role"] == "admin"
    assert created["detail"]["target"] == parse_api_key(key)[0]

    written.unlink()  # as the operator is told to: a later start makes no other key
    (tmp_path / "server.log").unlink()
    with serving(tmp_path, CONFIG, terminal=False) as again:
        assert works(again, key)
    assert not written.exists() and WRITTEN not in again.log_text()


def test_on_a_terminal_the_key_is_printed_once_and_no_file_is_written(tmp_path: Path) -> None:
    with serving(tmp_path, CONFIG, terminal=True) as server:
        server.wait_until(lambda: "It is shown this once" in server.log_text(), "the key shown")
        (key,) = re.findall(SCANNER_PATTERN, server.log_text())
        assert works(server, key)
    assert not (tmp_path / "data" / "initial-admin-key").exists()
    assert len(keys_created(tmp_path / "data")) == 1


def test_a_key_made_offline_and_mounted_is_the_admin_key_and_nothing_is_shown(
    tmp_path: Path,
) -> None:
    key = ok("keys", "new-secret").stdout.strip()
    parse_api_key(key)  # well formed: the right shape and checksum
    secret = tmp_path / "secrets" / "admin-key"
    secret.parent.mkdir()
    secret.write_text(key + "\n")
    secret.chmod(0o600)
    config = SECRET_CONFIG.format(secret=secret)
    with serving(tmp_path, config, terminal=False) as server:
        assert works(server, key)
        assert not works(server, ok("keys", "new-secret").stdout.strip())  # only that one
    log = server.log_text()
    assert re.findall(SCANNER_PATTERN, log) == [] and WRITTEN not in log
    assert not (tmp_path / "data" / "initial-admin-key").exists()
    (created,) = keys_created(tmp_path / "data")
    assert created["detail"]["target"] == parse_api_key(key)[0]
