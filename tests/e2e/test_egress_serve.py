"""The egress guard in a serving process, on PostgreSQL (127.0.0.1:5432) and Redis
(127.0.0.1:6379): both configured endpoints work under the guard, nothing is refused while
requests are served, and a connection elsewhere from the serving process is refused, counted
in `airgate_egress_denied_total` and audited as `egress.denied` with its destination.

No production path tries to leave on purpose, so the refusal is provoked from inside the
serving process: `airgate run`'s in-process server (`serving.in_process`, the same start-up as
`serve`: `protect(settings)` then the app) runs in a child Python that then connects to
192.0.2.1 (TEST-NET-1, never routed) itself, as a misbehaving library would.  The engine-core
child of a vLLM server is covered in test_vllm_serve.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import httpx
import pytest
import redis
from integration.databases import postgres_database  # tests/ is on sys.path
from server_process import EXIT_DEADLINE_S, clean_env, start_server, stop_and_check

from gateway.access.auth import KeyStore
from gateway.db import create_db_engine

pytestmark = pytest.mark.e2e

REDIS_URL = "redis://127.0.0.1:6379/0"
CONFIG = f"""
[audit]
database_url = "{{url}}"
migrate = true

[limits]
redis_url = "{REDIS_URL}"
fail_mode = "closed"                 # no Redis, no answer: the limiter must reach it

[auth]
public_metrics = true

[[models]]
id = "echo"
engine = "echo"
"""


@pytest.fixture
async def database() -> AsyncIterator[str]:
    async with postgres_database("airgate_egress") as url:
        yield url


def _denied(metrics: str, process: str) -> float:
    series = rf'^airgate_egress_denied_total\{{process="{process}"\}} (\S+)$'
    found = re.search(series, metrics, re.M)
    assert found, metrics
    return float(found.group(1))


async def _app_key(url: str, pepper: bytes) -> str:
    engine = create_db_engine(url)
    try:
        store = KeyStore(engine, pepper)
        key, _ = await store.create("app", name="egress-test")
        await store.aclose()
        return key
    finally:
        await engine.dispose()


async def _events(url: str, kind: str) -> list[dict[str, object]]:
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        rows = await conn.fetch("SELECT body FROM audit_events WHERE kind = $1", kind)
    finally:
        await conn.close()
    return [json.loads(r["body"]) for r in rows]


def test_configured_endpoints_work_under_the_guard(database: str, tmp_path: Path) -> None:
    redis.Redis.from_url(REDIS_URL, socket_timeout=5).ping()
    pepper = secrets.token_bytes(32)
    config = tmp_path / "airgate.toml"
    config.write_text(CONFIG.format(url=database))
    env = {"AIRGATE_CONFIG": str(config), "AIRGATE_PEPPER": pepper.hex()}
    server = start_server(tmp_path / "data", tmp_path / "serve.log", env)
    try:
        key = asyncio.run(_app_key(database, pepper))
        for _ in range(3):  # Redis (the limiter, fail_mode closed) and PostgreSQL (audit)
            resp = httpx.post(
                f"{server.base_url}/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}"},
                json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
                timeout=30,
            )
            assert resp.status_code == 200, resp.text
        metrics = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    finally:
        stop_and_check(server)
    assert re.search(r"^airgate_egress_guard 1\.0$", metrics, re.M), metrics
    assert _denied(metrics, "gateway") == 0.0  # nothing the gateway needs was refused
    assert _denied(metrics, "child") == 0.0
    assert len(asyncio.run(_events(database, "inference.completed"))) == 3
    assert "egress guard on: connections only to loopback, 127.0.0.1:6379, 127.0.0.1:5432" in (
        server.log_text()
    )


SCRIPT = """
import json, socket, sys, time
import httpx
from gateway.config import load_settings
from gateway.cli.serving import in_process
from gateway.egress import EgressDenied

settings = load_settings(sys.argv[1])
with in_process(settings) as url:
    try:
        socket.create_connection(("192.0.2.1", 9), timeout=30)
        refused = None
    except EgressDenied as exc:
        refused = str(exc)
    deadline = time.monotonic() + 30  # counted at once; polled only to read it over HTTP
    while True:
        metrics = httpx.get(url + "/metrics").text
        if 'airgate_egress_denied_total{process="gateway"} 1.0' in metrics:
            break
        assert time.monotonic() < deadline, metrics
        time.sleep(0.05)
print(json.dumps({"refused": refused, "metrics": metrics}))
"""


def test_a_refusal_in_the_serving_process_is_counted_and_audited(
    database: str, tmp_path: Path
) -> None:
    config = tmp_path / "airgate.toml"
    config.write_text(CONFIG.format(url=database))
    script = tmp_path / "serving.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run(
        [sys.executable, str(script), str(config)],
        env=clean_env({"AIRGATE_DATA_DIR": str(tmp_path / "data")}),
        capture_output=True,
        text=True,
        timeout=EXIT_DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["refused"] and "192.0.2.1:9" in out["refused"]
    assert _denied(out["metrics"], "gateway") == 1.0
    # audited before the log closed (the in-process server stopped when the block ended)
    events = asyncio.run(_events(database, "egress.denied"))
    assert [(e["outcome"], e["detail"]) for e in events] == [
        ("denied", {"host": "192.0.2.1", "port": 9, "process": "gateway"})
    ]
    assert "egress refused (gateway process): 192.0.2.1:9" in done.stderr
