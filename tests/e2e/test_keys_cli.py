"""`airgate keys create|list|revoke` as a subprocess, on SQLite and on PostgreSQL: each operation,
refused ones included, appends an `admin.action` event to the audit log (principal method
`cli`, subject the OS user, percent-encoded where it is not printable ASCII), through the audit
writer on the same database; auditor keys are made scoped or global and listed with their
scope."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import pytest
from integration.databases import postgres_database  # tests/ is on sys.path
from server_process import run_cli

pytestmark = pytest.mark.e2e

USER = "jöhn doe"  # not printable ASCII: the audit subject must encode it
SUBJECT = "j%C3%B6hn%20doe"


class Cli:
    """`airgate keys ...` on one configuration; the audit events it left, in seq order."""

    def __init__(self, root: Path, url: str | None) -> None:
        self.data_dir = root / "data"
        self.url = url
        self.args = ["--data-dir", str(self.data_dir)]
        if url is not None:
            config = root / "airgate.toml"
            config.write_text(f'[audit]\ndatabase_url = "{url}"\nmigrate = true\n')
            self.args += ["--config", str(config)]

    def __call__(self, *args: str) -> Any:
        command = [sys.executable, "-m", "gateway", "keys", *args, *self.args]
        return run_cli(command, {"LOGNAME": USER, "USER": USER})

    def events(self) -> list[dict[str, Any]]:
        if self.url is None:
            with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
                rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
            return [json.loads(r[0]) for r in rows]

        async def read(url: str) -> list[Any]:
            conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
            try:
                return list(await conn.fetch("SELECT body FROM audit_events ORDER BY seq"))
            finally:
                await conn.close()

        return [json.loads(r["body"]) for r in asyncio.run(read(self.url))]

    def admin_actions(self) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["kind"] == "admin.action"]


@pytest.fixture(params=["sqlite", "postgresql"])
async def cli(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Cli]:
    if request.param == "sqlite":
        yield Cli(tmp_path, None)
        return
    async with postgres_database("airgate_keys_cli") as url:
        yield Cli(tmp_path, url)


def test_key_operations_are_audited_as_the_os_user(cli: Cli) -> None:
    created = cli("create", "--role", "auditor", "--team", "payments", "--name", "officer")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    key_id = key.split("_")[1]
    assert key not in cli("list").stdout + created.stderr

    refused = cli("create", "--role", "auditor")  # neither --team nor --all-teams
    assert refused.returncode == 2
    assert "--all-teams" in refused.stderr or "all_teams" in refused.stderr
    hq = cli("create", "--role", "auditor", "--all-teams")
    assert hq.returncode == 0, hq.stderr
    hq_id = hq.stdout.strip().split("_")[1]

    revoked = cli("revoke", key_id)
    assert revoked.returncode == 0, revoked.stderr
    unknown = cli("revoke", "AAAAAAAAAAAA")
    assert unknown.returncode == 1

    actions = cli.admin_actions()
    assert [(e["action"], e["outcome"]) for e in actions] == [
        ("keys.create", "success"),
        ("keys.list", "success"),
        ("keys.create", "failure"),
        ("keys.create", "success"),
        ("keys.revoke", "success"),
        ("keys.revoke", "failure"),
    ]
    for event in actions:
        assert event["principal"] == {"subject": SUBJECT, "method": "cli"}
    assert actions[0]["detail"] == {"target": key_id, "role": "auditor", "audit_scope": "team"}
    assert actions[2]["error_class"] == "missing_scope"
    assert actions[3]["detail"]["audit_scope"] == "all_teams"
    assert actions[3]["detail"]["target"] == hq_id
    assert actions[4]["detail"] == {"target": key_id}
    assert (actions[5]["error_class"], actions[5].get("detail")) == ("not_found", None)


def test_keys_list_shows_the_audit_scope(cli: Cli) -> None:
    for args in (
        ("--role", "auditor", "--team", "payments"),
        ("--role", "auditor", "--all-teams"),
        ("--role", "app", "--team", "payments"),
    ):
        assert cli("create", *args).returncode == 0
    listed = cli("list", "--json")
    assert listed.returncode == 0, listed.stderr
    scopes = [
        (r["role"], r["team"], r["audit_scope"])
        for r in map(json.loads, listed.stdout.splitlines())
    ]
    assert scopes == [
        ("auditor", "payments", "team"),
        ("auditor", None, "all_teams"),
        ("app", "payments", None),
    ]
    table = cli("list").stdout
    assert "audit scope" in table and "all teams" in table and "its team" in table
