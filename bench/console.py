"""The compliance console on a large audit log: events pages and verification, 1M events in
PostgreSQL (issue 18: the first events page within 300 ms of server time, a filtered page within
500 ms; verification of the whole log streams its progress and completes).

A throwaway PostgreSQL database (127.0.0.1:5432, trust auth) is migrated and filled with a
valid, signed log (`bench.console_fill`: 3 chains, 30 days, a realistic mix), then the real app
(`create_app`, the echo engine, `[audit]` on that database with the fill's key pinned) serves
the console in process through Litestar's TestClient, signed in as an auditor.  Server time is
the time to the complete response (body read) on that in-process transport: the handler, its
queries, the template and the strict audit record each page view leaves; no network.  Each page
is fetched once to warm up, then `--runs` times; the median and the range are reported.  The
same queries are EXPLAINed (ANALYZE) and their plans summarised.  Verification is the
Integrity page's POST, streamed: its progress lines are counted as they arrive.

    python -m bench.console [--events N] [--runs R] [--quick] [--check] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from bench._report import (
    collect_environment,
    markdown_table,
    publish,
    redacted_argv,
    say,
)
from bench.console_fill import CHAINS, Fill, fill
from bench.console_plans import Page, explain, pages

NAME = "console"
FIRST_PAGE_MS = 300.0
FILTERED_MS = 500.0
_DISTRIBUTIONS = ("airgate", "litestar", "sqlalchemy", "asyncpg", "jinja2")


def _settings(data_dir: Path, url: str, key_file: Path) -> Any:
    from bundles.kms.signer import LocalSigner
    from gateway.config import load_settings

    signer = LocalSigner.from_file(key_file, create=True)
    return load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(data_dir),
            "audit.database_url": url.replace("+asyncpg", ""),
            "audit.signer.key_ref": str(key_file),
            "audit.trusted_keys": [signer.verify_key.text],
        },
    )


def _timed(call: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    call()  # warm: the first request compiles the query and loads the template
    times, last = [], None
    for _ in range(runs):
        started = time.perf_counter()
        last = call()
        times.append((time.perf_counter() - started) * 1000)
    return times, last


def _measure(url: str, data_dir: Path, key_file: Path, shape_pages: list[Page], runs: int):  # type: ignore[no-untyped-def]
    """Each page `runs` times through the app, then one streamed verification."""
    from litestar.testing import TestClient

    from backends.echo import EchoEngine
    from gateway.app import create_app
    from gateway.engines.registry import ModelRegistry, ServedModel

    app = create_app(
        _settings(data_dir, url, key_file),
        registry=ModelRegistry([ServedModel("echo", EchoEngine(context_length=512))]),
    )
    results: dict[str, list[float]] = {}
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:
            pass
        security = app.state["security_holder"].get()
        key, _ = client.blocking_portal.call(security.keys.create, "auditor")
        form = client.get("/console/signin")
        csrf = re.search(r'name="csrf" value="([^"]*)"', form.text)
        assert csrf is not None
        resp = client.post(
            "/console/signin",
            data={"csrf": csrf.group(1), "credential": key},
            follow_redirects=False,
        )
        if resp.status_code != 303:
            raise RuntimeError(f"sign-in failed: {resp.status_code}")
        for page in shape_pages:

            def get(path: str = page.path) -> Any:
                r = client.get(path)
                if r.status_code != 200:
                    raise RuntimeError(f"{path}: {r.status_code}")
                return r

            results[page.label], _ = _timed(get, runs)
        integrity = client.get("/console/integrity")
        token = re.search(r'name="csrf" value="([^"]*)"', integrity.text)
        assert token is not None
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
        body = urlencode({"csrf": token.group(1)}).encode()
        started = time.perf_counter()
        parts = client.blocking_portal.call(_post, app, "/console/integrity", body, cookie)
        verify_s = parts[-1][0] - started
        lines = sum(text.count("data-progress") for _, text in parts)
        first_at = next((at - started for at, text in parts if "data-progress" in text), None)
        if "The log is intact" not in "".join(text for _, text in parts):
            raise RuntimeError("verification did not report the log intact")
    return results, verify_s, lines, first_at


async def _post(app: Any, path: str, body: bytes, cookie: str) -> list[tuple[float, str]]:
    """A form POST straight to the ASGI app: each part of the body with when it was sent
    (the TestClient would hand the streamed page over only once complete)."""
    parts: list[tuple[float, str]] = []
    received, complete = False, asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await complete.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            parts.append((time.perf_counter(), message["body"].decode()))
            if not message.get("more_body"):
                complete.set()

    headers = [
        (b"host", b"testserver.local"),
        (b"content-type", b"application/x-www-form-urlencoded"),
        (b"content-length", str(len(body)).encode()),
        (b"cookie", cookie.encode()),
    ]
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers, "client": ("127.0.0.1", 40000),
        "server": ("testserver.local", 80),
    }  # fmt: skip
    await app(scope, receive, send)
    return parts


def render(
    command: str, made: Fill, runs: int, results: dict[str, list[float]], verify: tuple[Any, ...],
    plans: dict[str, str],
) -> str:  # fmt: skip
    env = collect_environment(command, _DISTRIBUTIONS)
    verify_s, lines, first_at = verify
    rows = []
    for label, times in results.items():
        target = FIRST_PAGE_MS if label.startswith("first page") else FILTERED_MS
        median = statistics.median(times)
        rows.append(
            (
                label,
                f"{median:.1f}",
                f"{min(times):.1f}–{max(times):.1f}",
                f"{target:.0f}",
                "yes" if median <= target else "**no**",
                plans.get(label, ""),
            )
        )
    table = markdown_table(
        ("Page", "Median ms", "Range ms", "Target ms", "Met", "Plan (EXPLAIN ANALYZE)"), rows
    )
    return "\n".join(
        [
            "## Compliance console on a 1M-event log (PostgreSQL)",
            "",
            env.markdown(),
            f"- Log: {made.rows:,} events in {len(CHAINS)} chains over 30 days, "
            f"{made.checkpoints:,} signed checkpoints (`bench.console_fill`); built in "
            f"{made.build_s:.0f} s (events, hashes, signatures; a process per chain) and loaded "
            f"in {made.load_s:.0f} s (COPY, index rebuild, ANALYZE).",
            "- Server time: the real app in process (Litestar TestClient), signed in as an "
            "auditor; the complete response, including the `audit.access` event each view "
            f"writes (strict: a signed group commit). {runs} runs after a warm-up; median "
            "and range.",
            "",
            table,
            "",
            f"- Verification of the whole log (Integrity page, streamed): **{verify_s:.1f} s** "
            f"for {made.rows:,} rows ({made.rows / verify_s:,.0f} rows/s), "
            f"{lines} progress updates, the first after {first_at or 0:.2f} s.",
        ]
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.console", description="console pages and verification on 1M events"
    )
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5, help="timed fetches per page (default 5)")
    parser.add_argument("--quick", action="store_true", help="30,000 events, 3 runs; print only")
    parser.add_argument("--check", action="store_true", help="build the settings only; no database")
    parser.add_argument("--output", type=Path, help="default BENCHMARKS.md (--quick: print only)")
    return parser


async def _run(events: int, runs: int, command: str) -> str:
    from bench.audit_throughput import _database
    from gateway.db.migrate import upgrade

    end = datetime.now(UTC).replace(microsecond=0)
    with tempfile.TemporaryDirectory(prefix="airgate-bench-console-") as tmp:
        key_file = Path(tmp) / "audit-signing.key"
        _settings(Path(tmp) / "data", "postgresql://x/y", key_file)  # creates the key
        async with _database("postgresql") as url:
            await upgrade(url)
            say(f"bench: console: filling {events:,} events")
            made = await fill(url.replace("+asyncpg", ""), key_file.read_bytes(), events, end)
            say(f"bench: console: filled in {made.build_s + made.load_s:.0f} s")
            wanted = await pages(url.replace("+asyncpg", ""), made.shape)
            plans = await explain(url.replace("+asyncpg", ""), wanted)
            results, verify_s, lines, first_at = await asyncio.to_thread(
                _measure, url, Path(tmp) / "data", key_file, wanted, runs
            )
    return render(command, made, runs, results, (verify_s, lines, first_at), plans)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="airgate-bench-console-") as tmp:
            _settings(Path(tmp) / "data", "postgresql://postgres@127.0.0.1/x", Path(tmp) / "k")
        print(f"{NAME}: settings build; {args.events:,} events would be filled")
        return 0
    events = 30_000 if args.quick else args.events
    runs = 3 if args.quick else args.runs
    if events < 1000 or runs < 1:
        print("bench.console: --events must be at least 1000 and --runs positive", file=sys.stderr)
        return 2
    command = shlex.join(["python", "-m", "bench.console", *redacted_argv(argv)])
    body = asyncio.run(_run(events, runs, command))
    publish("bench.console", NAME, body, args.output, full=not args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
