"""`airgate report usage | tco`: usage and cost from the audit log, as a table, JSON or CSV.

They read the database the server uses (like `airgate audit search`), with the same code as
the console.  Like `audit search` and `audit export`, a report run here is not itself an audit
event: the command reads the database directly with the operator's own database access, and
the console's report pages (over HTTP, by API key) are the audited path.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from ..audit.export import csv_safe
from ..db import create_db_engine
from ..reports import (
    Period,
    PeriodError,
    TcoReport,
    UsageReport,
    deployment_usage,
    tco_report,
    usage_report,
)
from ..reports.tables import Cell, encode_json, shown, tco_table, usage_table
from .admin import DatabaseOpt, _run, _url
from .common import ConfigOpt, DataDirOpt, fail, load_cli_settings, out

__all__ = ["report_app"]

report_app = typer.Typer(
    help="Usage and cost reports from the audit log: table, --json or --csv.",
    no_args_is_help=True,
)

DEFAULT_DAYS = 30
T = TypeVar("T")
SinceOpt = Annotated[
    str | None,
    typer.Option(
        help=f"From (ISO 8601 date or time, UTC if no zone; default {DEFAULT_DAYS} "
        "days before --until)."
    ),
]
UntilOpt = Annotated[str | None, typer.Option(help="Until, exclusive (default now).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document.")]
CsvOpt = Annotated[bool, typer.Option("--csv", help="CSV with a header row.")]


def _period(since: str | None, until: str | None) -> Period:
    try:
        return Period.parse(
            since, until, now=datetime.now(UTC), days=DEFAULT_DAYS, names=("--since", "--until")
        )
    except PeriodError as exc:
        raise fail(str(exc), 2) from None


def _read(url: str, query: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run `query` on the audit database at `url`; a missing database or log is an error that
    says what to do, never an empty report (nor a new, empty SQLite file)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        raise fail(
            f"no audit database at {parsed.database}: give --database, --config or --data-dir "
            "of the server whose log to report on",
            2,
        )

    async def run() -> T:
        engine = create_db_engine(url)
        try:
            return await query(engine)
        finally:
            await engine.dispose()

    try:
        return _run(run)
    except DBAPIError as exc:
        raise fail(
            f"the audit log cannot be read ({type(exc.orig).__name__}): is the database "
            "migrated (`airgate db upgrade`)?",
            2,
        ) from None


def _format(as_json: bool, as_csv: bool) -> str:
    if as_json and as_csv:
        raise fail("choose one of --json and --csv", 2)
    return "json" if as_json else "csv" if as_csv else "table"


def _emit(
    fmt: str,
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    report: UsageReport | TcoReport,
    *,
    transpose: bool = False,
) -> None:
    if fmt == "json":
        sys.stdout.buffer.write(encode_json(report) + b"\n")
        sys.stdout.flush()
        return
    if fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([csv_safe(v) for v in row] for row in rows)
        return
    if transpose:  # one column per deployment, one row per figure: reads on a terminal
        columns = [header[0], *(str(row[0]) for row in rows)]
        lines: list[Sequence[Cell]] = [
            [name, *(row[i] for row in rows)] for i, name in enumerate(header) if i
        ]
    else:
        columns, lines = list(header), list(rows)
    table = Table(title=escape(title))
    for i, name in enumerate(columns):
        numeric = any(isinstance(line[i], int | Decimal) for line in lines)
        table.add_column(escape(name), justify="right" if numeric else "left")
    for line in lines:
        table.add_row(*(escape(shown(v)) for v in line))
    # piped or redirected: as wide as the table, never cut to a guessed terminal width
    (out if out.is_terminal else Console(width=10_000)).print(table)


def _when(period: Period) -> str:
    start, end = (t.isoformat(timespec="seconds") for t in (period.start, period.end))
    return f"{start} .. {end}"


@report_app.command("usage")
def report_usage(
    since: SinceOpt = None,
    until: UntilOpt = None,
    team: Annotated[str | None, typer.Option(help="Only this team.")] = None,
    model: Annotated[str | None, typer.Option(help="Only this model id.")] = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Requests, tokens, denials, rate limits and auth failures per UTC day, team and model."""
    fmt = _format(as_json, as_csv)
    settings = load_cli_settings(config, data_dir)
    period = _period(since, until)

    report = _read(
        _url(settings, database),
        lambda engine: usage_report(engine, period, team=team, model=model),
    )
    header, rows = usage_table(report)
    _emit(fmt, f"Usage {_when(period)} (UTC days)", header, rows, report)


@report_app.command("tco")
def report_tco(
    since: SinceOpt = None,
    until: UntilOpt = None,
    as_json: JsonOpt = False,
    as_csv: CsvOpt = False,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Per deployment: measured tokens, monthly cost (the configuration's cost section), cost
    per 1M tokens, and the monthly volume at which self-hosting breaks even against the API."""
    fmt = _format(as_json, as_csv)
    settings = load_cli_settings(config, data_dir)
    period = _period(since, until)
    used = _read(_url(settings, database), lambda engine: deployment_usage(engine, period))
    report = tco_report(settings.cost, settings.models, used, period)
    header, rows = tco_table(report)
    title = f"TCO {_when(period)} ({report.currency}, 730-hour months)"
    _emit(fmt, title, header, rows, report, transpose=True)
