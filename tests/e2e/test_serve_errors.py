"""`airgate serve` on a PostgreSQL database it may not migrate: one line that says what is wrong
and how to fix it, exit status 2, no traceback; and the fix it names works."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from integration.databases import postgres_database  # tests/ is on sys.path
from server_process import airgate, free_port, run_cli, serve_command

pytestmark = pytest.mark.e2e


@pytest.fixture
async def empty_postgres() -> AsyncIterator[str]:
    async with postgres_database("airgate_serve_empty") as url:
        yield url


def test_serve_on_an_unmigrated_postgres_says_how_to_fix_it(
    empty_postgres: str, tmp_path: Path
) -> None:
    config = tmp_path / "airgate.toml"
    config.write_text(f'[audit]\ndatabase_url = "{empty_postgres}"\n')
    data_dir = tmp_path / "data"
    result = run_cli(serve_command(free_port(), data_dir, "--config", str(config)))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    # what is said to the operator (the JSON log records around it are the log)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip() and not ln.startswith("{")]
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert line.startswith("airgate: ")
    assert "(empty)" in line  # what is wrong: the database has no schema yet
    assert "`airgate db upgrade`" in line and "`[audit] migrate = true`" in line
    assert "postgres@" not in line  # never the database URL

    # the fix the line names: the schema is then current, so `serve` gets past this check
    upgraded = airgate("db", "upgrade", "--config", config, "--data-dir", data_dir)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "database at revision" in upgraded.stdout
