"""`airgate selftest` as an operator runs it: a healthy installation passes every check, with
one real inference on Gemma (llama.cpp, loaded once, in the selftest's own process); then one
thing at a time is broken on a fresh copy and exactly that check fails, with exit code 1:
a group-writable data directory, an edited audit row, a bundle whose manifest no longer
matches its signature, a Redis nobody answers at.  Zero retention: the prompt the inference
check sends is in none of the output and no file of the data directory.

Each installation is a seeded data dir (the sealed default bundles, keys, a database of API
keys), made private as `serve` makes a data directory (0700), whose audit log has a signed
chain (one audited command, `keys list`), with the audit signer's key pinned.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from server_process import clean_env, seed_data_dir

from gateway.selftest import CHECKS, PROMPT

pytestmark = pytest.mark.e2e

REDIS_URL = "redis://127.0.0.1:6379/0"  # the test machines' Redis (as the replica tests use)
NAMES = [name for name, _ in CHECKS] + ["inference", "audit_record"]
NOT_CONFIGURED = {"postgresql", "kms", "otlp"}


def airgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGS` with no AIRGATE_* variable from this environment."""
    return subprocess.run(
        [sys.executable, "-m", "gateway", *map(str, args)],
        env=clean_env({"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"}),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )


class Install:
    """A data dir and its airgate.toml."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        self.root = root
        self.data = seed_data_dir(root / "data", model_dir)
        self.data.chmod(0o700)  # as `serve` creates it
        listed = airgate("keys", "list", "--data-dir", self.data)  # a signed chain in the log
        assert listed.returncode == 0, listed.stderr
        public = airgate("audit-signer", "public", "--data-dir", self.data)
        assert public.returncode == 0, public.stderr
        self.audit_key = public.stdout.split()[-1]
        assert self.audit_key.startswith("ed25519:")
        self.config = root / "airgate.toml"
        self.write_config()

    def write_config(self, more: str = "", redis_url: str = REDIS_URL) -> None:
        self.config.write_text(
            f'[limits]\nredis_url = "{redis_url}"\n\n'
            f'[audit]\ntrusted_keys = ["{self.audit_key}"]\n\n{more}'
        )

    def selftest(self, *more: str) -> subprocess.CompletedProcess[str]:
        return airgate("selftest", "--config", self.config, "--data-dir", self.data, *more)

    def report(self, *more: str) -> tuple[int, dict[str, Any]]:
        """(exit code, the --json report), checking the report's shape."""
        result = self.selftest("--json", *more)
        report = json.loads(result.stdout)
        assert [c["name"] for c in report["checks"]] == NAMES, result.stdout
        for check in report["checks"]:
            assert set(check) == {"name", "status", "detail", "duration_ms"}
            assert check["status"] in ("pass", "fail", "skip")
        assert report["ok"] is (result.returncode == 0)
        return result.returncode, report


def statuses(report: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


def detail(report: dict[str, Any], name: str) -> str:
    return next(str(c["detail"]) for c in report["checks"] if c["name"] == name)


def failing(report: dict[str, Any]) -> set[str]:
    return {name for name, status in statuses(report).items() if status == "fail"}


@pytest.fixture
def install(tmp_path: Path, model_dir: Path) -> Install:
    return Install(tmp_path, model_dir)


def test_a_healthy_installation_passes_with_one_real_inference(install: Install) -> None:
    result = install.selftest("--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is True
    expected = {n: "skip" if n in NOT_CONFIGURED else "pass" for n in NAMES}
    assert statuses(report) == expected, result.stdout
    assert "against the pinned keys" in detail(report, "audit_chain")
    # the inference really ran: tokens generated, and the server audited the request
    generated = re.search(r"gemma-3-270m: (\d+) tokens generated", detail(report, "inference"))
    assert generated is not None and int(generated[1]) > 0, detail(report, "inference")
    with contextlib.closing(sqlite3.connect(install.data / "airgate.db")) as conn:
        bodies = [json.loads(b) for (b,) in conn.execute("SELECT body FROM audit_events")]
    completed = [b for b in bodies if b["kind"] == "inference.completed"]
    assert [b["completion_tokens"] for b in completed] == [int(generated[1])]
    (recorded,) = [b for b in bodies if b.get("action") == "selftest"]
    assert recorded["outcome"] == "success"
    assert recorded["detail"] == {"checks": len(NAMES) - 1, "failed": 0, "skipped": 3}
    # zero retention: the prompt is nowhere (the answer is never shown: only counts are)
    for sink in (result.stdout, result.stderr):
        assert PROMPT not in sink
    for path in (p for p in install.data.rglob("*") if p.is_file()):
        assert PROMPT.encode() not in path.read_bytes(), path
    # and the log the selftest left verifies (the next selftest would check it the same way)
    again = install.selftest("--json", "--no-inference")
    assert again.returncode == 0, again.stdout


def test_a_group_writable_data_dir_fails_the_data_dir_check(install: Install) -> None:
    install.data.chmod(0o770)
    code, report = install.report("--no-inference")
    assert code == 1
    assert failing(report) == {"data_dir"}
    assert f"{install.data} is writable by group (mode 0770): chmod 700 it" in detail(
        report, "data_dir"
    )
    assert statuses(report)["inference"] == "skip"
    assert "skipped by request" in detail(report, "inference")


def _tamper(db: Path, seq: int) -> None:
    """Rewrite one row's body behind the gateway's back, as someone holding the file could."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TRIGGER IF EXISTS audit_events_no_update")
        (body,) = conn.execute("SELECT body FROM audit_events WHERE seq = ?", (seq,)).fetchone()
        event = json.loads(body)
        event["detail"] = {**event.get("detail", {}), "count": 999}
        forged = json.dumps(event, separators=(",", ":"), sort_keys=True)
        conn.execute("UPDATE audit_events SET body = ? WHERE seq = ?", (forged, seq))


def test_an_edited_audit_row_fails_the_audit_chain_check(install: Install) -> None:
    _tamper(install.data / "airgate.db", 1)
    code, report = install.report("--no-inference")
    assert code == 1
    assert failing(report) == {"audit_chain"}
    assert "FAILED verification at seq 1 (row_hash_mismatch)" in detail(report, "audit_chain")


def test_a_bundle_that_does_not_match_its_signature_fails_the_bundles_check(
    install: Install,
) -> None:
    original = install.data / "bundles" / "gemma-3-270m.bundle"
    copy = install.root / "gemma-copy.bundle"
    for item in sorted(original.rglob("*")):
        target = copy / item.relative_to(original)
        if item.is_dir():
            target.mkdir(parents=True)
        elif item.name.startswith("manifest."):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(item, target)
        else:
            target.hardlink_to(item)  # the 253 MB payload, not copied
    manifest = bytearray((copy / "manifest.json").read_bytes())
    at = manifest.index(b"gemma")
    manifest[at] ^= 0x20  # one letter's case: "Gemma", still valid JSON
    (copy / "manifest.json").write_bytes(bytes(manifest))
    install.write_config(f'[[models]]\nid = "gemma-3-270m"\nbundle = "{copy}"\n')
    code, report = install.report("--no-inference")
    assert code == 1
    assert failing(report) == {"bundles"}
    assert f"bundle {copy}: the manifest signature is invalid" in detail(report, "bundles")


def test_an_unreachable_redis_fails_the_redis_check(install: Install) -> None:
    install.write_config(redis_url="redis://:secret-password@127.0.0.1:1/0")
    code, report = install.report("--no-inference")
    assert code == 1
    assert failing(report) == {"redis"}
    assert "Redis at 127.0.0.1:1 does not answer" in detail(report, "redis")
    # the table: one line per check, and the verdict
    table = install.selftest("--no-inference")
    assert table.returncode == 1
    lines = table.stdout.splitlines()
    assert [line.split()[:2] for line in lines[: len(NAMES)]] == [
        ["FAIL" if n == "redis" else "SKIP" if n in NOT_CONFIGURED | {"inference"} else "PASS", n]
        for n in NAMES
    ]
    assert lines[len(NAMES)].startswith("selftest FAILED: ")
    assert "secret-password" not in table.stdout + table.stderr


def test_a_disabled_egress_guard_fails_the_egress_check(install: Install) -> None:
    install.write_config("[egress]\nenabled = false\n")
    code, report = install.report("--no-inference")
    assert code == 1
    assert failing(report) == {"egress"}
    assert "the egress guard is off ([egress] enabled = false)" in detail(report, "egress")
