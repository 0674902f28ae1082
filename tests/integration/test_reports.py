"""Usage and cost reports (gateway/reports, `airgate report`) on real databases: SQLite (a file
in tmp) and PostgreSQL (a throwaway database per test on 127.0.0.1:5432).  Events are written
by the real AuditWriter, or by the real app serving the `openai` SDK on the echo engine; the
reports run in process and as the `airgate report` command, whose table, --json and --csv
must agree."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from databases import fresh_database
from litestar import Litestar
from litestar.testing import TestClient
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import LocalSigner
from gateway.app import create_app
from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, new_event_id
from gateway.config import load_settings
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade
from gateway.engines.runtime import build_registry
from gateway.reports import Period, deployment_usage, tco_report, usage_report

DAY1 = datetime(2026, 11, 29, tzinfo=UTC)
PERIOD = Period(DAY1, DAY1 + timedelta(days=2))
CONFIG = """
[cost]
api_price_per_million = 4.37

[[cost.deployments]]
deployment = "gpu-1"
hardware_per_month = 2182
operations_per_month = 650

[[cost.deployments]]
class = "edge"
hardware_per_hour = 0.05

[[models]]
id = "m1"
name = "gpu-1"
engine = "echo"
class = "gpu"

[[models]]
id = "m2"
name = "edge-1"
engine = "echo"
"""


def event(at: timedelta, kind: str, **fields: Any) -> AuditEvent:
    team = fields.pop("team", None)
    outcome = fields.pop("outcome", "success")
    return AuditEvent(
        event_id=new_event_id(),
        ts=DAY1 + at,
        kind=kind,  # type: ignore[arg-type]
        outcome=outcome,
        principal=AuditPrincipal(key_id="k1", team=team) if team else AuditPrincipal(),
        **fields,
    )


H = timedelta(hours=1)
D = timedelta(days=1)
EVENTS = [
    event(-H, "inference.completed", team="a", model="m1", deployment="gpu-1", prompt_tokens=999),
    event(H, "inference.admitted", team="a", model="m1", prompt_tokens=10),  # not a request
    event(
        H,
        "inference.completed",
        team="a",
        model="m1",
        deployment="gpu-1",
        prompt_tokens=10,
        completion_tokens=20,
    ),
    event(
        2 * H,
        "inference.failed",
        outcome="failure",
        team="a",
        model="m1",
        deployment="gpu-1",
        prompt_tokens=5,
        completion_tokens=0,
    ),
    event(3 * H, "embedding.completed", team="b", model="m2", deployment="edge-1", prompt_tokens=7),
    event(4 * H, "policy.denied", outcome="denied", team="b", model="m1"),
    event(5 * H, "rate.limited", outcome="denied", team="a", model="m1"),
    event(6 * H, "auth.failure", outcome="denied", count=3, client_address="10.0.0.9"),
    event(
        D + H,
        "inference.cancelled",
        outcome="cancelled",
        team="a",
        model="m1",
        deployment="gpu-1",
        prompt_tokens=4,
        completion_tokens=1,
    ),
    event(D + 2 * H, "auth.failure", outcome="denied", client_address="10.0.0.9"),
    event(D + 3 * H, "admin.action", action="keys.create"),  # neither request nor refusal
    event(
        2 * D, "inference.completed", team="a", model="m1", deployment="gpu-1", prompt_tokens=999
    ),  # the period's end is exclusive
]

#          day           team  model requests pt  ct  total denied limited auth
EXPECTED = [
    ("2026-11-29", None, None, 0, 0, 0, 0, 0, 0, 3),
    ("2026-11-29", "a", "m1", 2, 15, 20, 35, 0, 1, 0),
    ("2026-11-29", "b", "m1", 0, 0, 0, 0, 1, 0, 0),
    ("2026-11-29", "b", "m2", 1, 7, 0, 7, 0, 0, 0),
    ("2026-11-30", None, None, 0, 0, 0, 0, 0, 0, 1),
    ("2026-11-30", "a", "m1", 1, 4, 1, 5, 0, 0, 0),
]


@pytest.fixture(params=["sqlite", "postgresql"], scope="module")
async def db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    async with fresh_database(request.param, tmp_path_factory.mktemp("reports")) as url:
        await upgrade(url)
        engine = create_db_engine(url)
        try:
            signer = LocalSigner(Ed25519PrivateKey.generate())
            async with AuditWriter(engine, signer=signer, log_id="0123456789abcdef") as writer:
                for ev in EVENTS:
                    await writer.append(ev)
        finally:
            await engine.dispose()
        yield url


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_db_engine(db_url)
    yield eng
    await eng.dispose()


def as_tuples(rows: list[Any]) -> list[tuple[Any, ...]]:
    return [
        (
            r.day,
            r.team,
            r.model,
            r.requests,
            r.prompt_tokens,
            r.completion_tokens,
            r.tokens,
            r.policy_denied,
            r.rate_limited,
            r.auth_failures,
        )
        for r in rows
    ]


async def test_usage_per_day_team_and_model(engine: AsyncEngine) -> None:
    report = await usage_report(engine, PERIOD)
    assert as_tuples(report.rows) == EXPECTED
    assert report.days() == ["2026-11-29", "2026-11-30"]


async def test_filters_and_the_time_range(engine: AsyncEngine) -> None:
    team_a = await usage_report(engine, PERIOD, team="a")
    assert as_tuples(team_a.rows) == [r for r in EXPECTED if r[1] == "a"]
    m2 = await usage_report(engine, PERIOD, model="m2")
    assert as_tuples(m2.rows) == [r for r in EXPECTED if r[2] == "m2"]
    day2 = await usage_report(engine, Period(DAY1 + D, DAY1 + 2 * D))
    assert as_tuples(day2.rows) == [r for r in EXPECTED if r[0] == "2026-11-30"]
    late = await usage_report(engine, Period(DAY1 + 2 * D, DAY1 + 3 * D))
    assert [(r.day, r.prompt_tokens) for r in late.rows] == [("2026-12-01", 999)]
    assert (await usage_report(engine, PERIOD, team="nobody")).rows == []


async def test_tokens_per_deployment_and_the_tco_report(
    engine: AsyncEngine, tmp_path: Path
) -> None:
    used = await deployment_usage(engine, PERIOD)
    assert [(u.deployment, u.requests, u.prompt_tokens, u.completion_tokens) for u in used] == [
        ("edge-1", 1, 7, 0),
        ("gpu-1", 3, 19, 21),
    ]
    settings = settings_with_cost(tmp_path)
    lines = {
        line.deployment: line
        for line in tco_report(settings.cost, settings.models, used, PERIOD).lines
    }
    gpu, edge = lines["gpu-1"], lines["edge-1"]
    assert (gpu.tokens, gpu.priced_by, str(gpu.monthly_cost)) == (40, "deployment", "2832.00")
    assert gpu.break_even_tokens_per_month == 648_054_920
    assert gpu.tokens_per_month == round(40 * 730 / 48) == 608
    assert (edge.tokens, edge.priced_by, str(edge.monthly_cost)) == (7, "class", "36.50")
    assert edge.engine_class == "edge" and edge.tokens_per_month == 106


# -- the command -------------------------------------------------------------------------


def settings_with_cost(tmp_path: Path) -> Any:
    path = tmp_path / "airgate.toml"
    path.write_text(CONFIG)
    return load_settings(path, environ={}, overrides={"data_dir": str(tmp_path / "data")})


def airgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m gateway ARGS`, as an operator runs it: wide, uncoloured output."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    environ.update(COLUMNS="250", NO_COLOR="1", TERM="dumb")
    return subprocess.run(
        [sys.executable, "-m", "gateway", *map(str, args)],
        env=environ,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )


def ok(*args: str | Path) -> str:
    done = airgate(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def table_rows(text: str) -> list[list[str]]:
    """The body rows of a rich table (box-drawing separators), cells stripped."""
    return [
        [cell.strip() for cell in line.strip().strip("│┃").split("│" if "│" in line else "┃")]
        for line in text.splitlines()
        if line.strip().startswith(("│", "┃"))
    ]


def formats(*args: str | Path) -> tuple[dict[str, Any], list[dict[str, str]], list[list[str]]]:
    as_json = json.loads(ok(*args, "--json"))
    as_csv = list(csv.DictReader(io.StringIO(ok(*args, "--csv"))))
    table = table_rows(ok(*args))
    return as_json, as_csv, table


def shown(value: Any) -> str:
    """A value as the table prints it: integers with thousands separators, None as -."""
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def test_report_usage_table_json_and_csv_agree(db_url: str, tmp_path: Path) -> None:
    period = ("--since", "2026-11-29", "--until", "2026-12-01T00:00:00+00:00")
    common = ("--database", db_url, "--data-dir", tmp_path, *period)
    doc, rows, table = formats("report", "usage", *common)
    assert doc["start"].startswith("2026-11-29T00:00:00") and doc["team"] is None
    keys = list(rows[0])
    assert keys == [
        "day",
        "team",
        "model",
        "requests",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "policy_denied",
        "rate_limited",
        "auth_failures",
    ]
    fields = ("day", "team", "model", "requests", "prompt_tokens", "completion_tokens")
    as_json = [
        (
            *(r[k] for k in fields),
            r["prompt_tokens"] + r["completion_tokens"],
            r["policy_denied"],
            r["rate_limited"],
            r["auth_failures"],
        )
        for r in doc["rows"]
    ]
    assert as_json == EXPECTED
    assert [tuple(r.values()) for r in rows] == [
        tuple("" if v is None else str(v) for v in row) for row in EXPECTED
    ]
    assert table[0] == keys  # the header row
    assert table[1:] == [[shown(v) for v in row] for row in EXPECTED]
    team_b = json.loads(ok("report", "usage", *common, "--team", "b", "--json"))
    assert [r["model"] for r in team_b["rows"]] == ["m1", "m2"]


def test_report_tco_table_json_and_csv_agree(db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "airgate.toml"
    config.write_text(CONFIG)
    common = (
        "--config",
        config,
        "--database",
        db_url,
        "--data-dir",
        tmp_path,
        "--since",
        "2026-11-29",
        "--until",
        "2026-12-01",
    )
    doc, rows, table = formats("report", "tco", *common)
    assert doc["currency"] == "USD"
    gpu = next(line for line in doc["lines"] if line["deployment"] == "gpu-1")
    # decimals are exact JSON numbers, not strings
    assert (gpu["monthly_cost"], gpu["break_even_tokens_per_month"]) == (2832.0, 648_054_920)
    assert gpu["api_price_per_million"] == 4.37 and gpu["tokens"] == 40
    assert [r["deployment"] for r in rows] == ["edge-1", "gpu-1"]
    csv_gpu = rows[1]
    assert (csv_gpu["monthly_cost"], csv_gpu["break_even_tokens_per_month"]) == (
        "2832.00",
        "648054920",
    )
    assert csv_gpu["cost_per_million"] == str(gpu["cost_per_million"])
    # the table: one column per deployment, one row per figure
    assert table[0] == ["deployment", "edge-1", "gpu-1"]
    figures = {row[0]: row[1:] for row in table[1:]}
    assert list(figures) == list(rows[0])[1:]
    for name, (edge, gpu_cell) in figures.items():
        for cell, line in ((edge, rows[0]), (gpu_cell, rows[1])):
            assert cell.replace(",", "") == (line[name] or "-"), name
    assert figures["break_even_tokens_per_month"][1] == "648,054,920"
    assert figures["monthly_cost"][1] == "2,832.00"


def test_report_refuses_what_it_cannot_answer(tmp_path: Path) -> None:
    missing = tmp_path / "nothing-here" / "airgate.db"
    done = airgate("report", "usage", "--database", missing, "--data-dir", tmp_path)
    assert done.returncode == 2 and "no audit database" in done.stderr
    assert not missing.exists()  # not created empty by the attempt
    done = airgate("report", "usage", "--data-dir", tmp_path, "--since", "yesterday")
    assert done.returncode == 2 and "ISO 8601" in done.stderr
    done = airgate("report", "tco", "--data-dir", tmp_path, "--json", "--csv")
    assert done.returncode == 2 and "--json" in done.stderr
    done = airgate(
        "report", "usage", "--data-dir", tmp_path, "--since", "2026-12-02", "--until", "2026-12-01"
    )
    assert done.returncode == 2 and "before --until" in done.stderr
    empty = tmp_path / "empty.db"
    empty.touch()
    done = airgate("report", "usage", "--database", empty, "--data-dir", tmp_path)
    assert done.returncode == 2 and "airgate db upgrade" in done.stderr


# -- the real app --------------------------------------------------------------------------


@dataclass
class Served:
    config: Path
    data_dir: Path
    usages: list[Any]  # what each answer said it used
    pages: dict[tuple[str, str], httpx.Response]  # (who, path) -> the console's answer


def sign_in(browser: TestClient[Litestar], key: str) -> None:
    form = browser.get("/console/signin")
    token = re.search(r'name="csrf" value="([^"]*)"', form.text)
    assert token is not None
    done = browser.post(
        "/console/signin",
        data={"csrf": token.group(1), "credential": key},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text[:500]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The real app on the echo engines, called by the `openai` SDK as team `ops` (and once
    with a wrong key), then its usage and cost pages opened by an all-teams auditor and by
    `ops`'s own auditor; the app is stopped before the tests read its log."""
    root = tmp_path_factory.mktemp("reports-app")
    config = root / "airgate.toml"
    config.write_text(CONFIG)
    settings = load_settings(config, environ={}, overrides={"data_dir": str(root / "data")})
    app = create_app(settings, registry=build_registry(settings))
    usages: list[Any] = []
    pages: dict[tuple[str, str], httpx.Response] = {}
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security = app.state["security_holder"].get()

        def key(role: str, **fields: Any) -> str:
            text, _ = client.blocking_portal.call(lambda: security.keys.create(role, **fields))
            return str(text)

        sdk = openai.OpenAI(
            base_url="http://testserver/v1",
            api_key=key("app", team="ops"),
            http_client=client,
            max_retries=0,
        )
        for i in range(3):
            resp = sdk.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=5
            )
            usages.append(resp.usage)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(
                base_url="http://testserver/v1",
                api_key="ag_wrong",
                http_client=client,
                max_retries=0,
            ).models.list()
        for who, credential in (
            ("all", key("auditor")),  # no team: every team's events
            ("ops", key("auditor", team="ops")),
        ):
            browser = TestClient(app, base_url="http://testserver.local")
            browser.blocking_portal = client.blocking_portal
            sign_in(browser, credential)
            for path in ("/console/usage", "/console/tco", "/console/usage?since=tomorrow"):
                pages[(who, path)] = browser.get(path, follow_redirects=False)
    yield Served(config, root / "data", usages, pages)


def test_the_apps_own_events_are_reported(served: Served) -> None:
    config, data_dir, usages = served.config, served.data_dir, served.usages
    today = datetime.now(UTC).date()
    since, until = str(today - timedelta(days=1)), str(today + timedelta(days=1))
    args = ("--config", config, "--data-dir", data_dir, "--since", since, "--until", until)
    doc = json.loads(ok("report", "usage", *args, "--json"))
    ops = [r for r in doc["rows"] if r["team"] == "ops"]
    assert [(r["model"], r["requests"]) for r in ops] == [("m1", 3)]
    assert ops[0]["prompt_tokens"] == sum(u.prompt_tokens for u in usages)
    assert ops[0]["completion_tokens"] == sum(u.completion_tokens for u in usages) > 0
    assert sum(r["auth_failures"] for r in doc["rows"] if r["team"] is None) >= 1
    tco = json.loads(ok("report", "tco", *args, "--json"))
    gpu = next(line for line in tco["lines"] if line["deployment"] == "gpu-1")
    assert gpu["requests"] == 3
    assert gpu["tokens"] == sum(u.total_tokens for u in usages)


# -- the console's pages ---------------------------------------------------------------------


def test_console_usage_and_tco_pages(served: Served) -> None:
    usage = served.pages[("all", "/console/usage")]
    assert usage.status_code == 200, usage.text[:500]
    assert usage.headers["content-security-policy"].startswith("default-src 'self'")
    assert usage.headers["x-frame-options"] == "DENY"
    html = usage.text
    assert html.count("<svg ") == 2 and "Requests per day" in html
    assert "<script>" not in html and " onload=" not in html and " style=" not in html
    assert ">ops<" in html and ">m1<" in html  # the table's team and model cells
    tco = served.pages[("all", "/console/tco")]
    assert tco.status_code == 200 and "648,054,920" in tco.text and ">gpu-1<" in tco.text
    bad = served.pages[("all", "/console/usage?since=tomorrow")]
    assert bad.status_code == 400
    alert = re.search(r'<ul class="alert" role="alert">(.*?)</ul>', bad.text, re.S)
    assert alert is not None and "From is not an ISO 8601 date" in alert.group(1)
    assert "tomorrow" not in alert.group(1)  # the message is ours; the field keeps what was typed


def test_a_team_auditor_sees_only_its_team_and_no_cost_report(served: Served) -> None:
    usage = served.pages[("ops", "/console/usage")]
    assert usage.status_code == 200
    assert 'name="team" value="ops" readonly' in usage.text
    assert served.pages[("ops", "/console/tco")].status_code == 403


def test_console_report_views_are_audited(served: Served) -> None:
    with contextlib.closing(sqlite3.connect(served.data_dir / "airgate.db")) as conn:
        bodies = [json.loads(b) for (b,) in conn.execute("SELECT body FROM audit_events")]
    views = [
        (b["action"], b["outcome"], b["http_status"], b["principal"].get("team"))
        for b in bodies
        if b["kind"] == "audit.access"
        and b.get("action", "").startswith("console.")
        and b.get("detail", {}).get("via") == "console"
        and b["action"] in ("console.usage", "console.tco")
    ]
    assert sorted(views, key=str) == sorted(
        [
            ("console.usage", "success", 200, None),
            ("console.tco", "success", 200, None),
            ("console.usage", "failure", 400, None),
            ("console.usage", "success", 200, "ops"),
            ("console.tco", "denied", 403, "ops"),
            ("console.usage", "failure", 400, "ops"),
        ],
        key=str,
    )
