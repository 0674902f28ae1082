"""`airgate keys|policy|audit|db ...`: the operator's and the compliance officer's commands.

They work offline on the same database the server uses (the data dir's SQLite file, or
`[audit] database_url`), with the same code as the HTTP API.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import signal
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import msgspec
import typer
from rich.markup import escape
from rich.table import Table

from policies import PolicyError, lint, load_default_policy, load_policy_dir

from ..access.auth import generate_api_key
from ..access.keys import KeyRefused, key_admin
from ..audit import AuditChainBusy, AuditError, AuditFilter, export, search
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import current_revision, head_revision, offline_sql, upgrade
from .common import ConfigOpt, DataDirOpt, err, fail, load_cli_settings, out
from .segment_export import export_segment

__all__ = ["audit_app", "db_app", "keys_app", "os_user", "policy_app"]

keys_app = typer.Typer(
    help="API keys: create, list, revoke; new-secret (offline).", no_args_is_help=True
)
policy_app = typer.Typer(help="Policy documents: check, reload.", no_args_is_help=True)
audit_app = typer.Typer(help="The audit log: search, export, verify.", no_args_is_help=True)
db_app = typer.Typer(help="The audit/keys database schema.", no_args_is_help=True)

T = TypeVar("T")


def _run(coro: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(coro())  # type: ignore[arg-type]
    except (OSError, ConnectionError) as exc:
        raise fail(f"the database cannot be reached ({type(exc).__name__})") from None
    except ConfigError as exc:  # e.g. a configured pepper file that is missing
        raise fail(f"configuration error: {exc}", 2) from None
    except AuditChainBusy as exc:
        raise fail(str(exc), 2) from None


def _url(settings: Settings, database: str | None = None) -> str:
    """`--database` (a SQLite file or a database URL), else the configured/data-dir one."""
    if database:
        if "://" not in database:
            return f"sqlite+aiosqlite:///{Path(database).resolve()}"
        return database_url(settings.data_dir, database)
    return database_url(settings.data_dir, settings.audit.database_url)


DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database", help="An audit database file or URL (default: the data dir's)."),
]


# --- keys ---------------------------------------------------------------------------------


def os_user() -> str:
    """Who runs this command, for the audit log: the OS user name, percent-encoded where it is
    not printable ASCII (an audit subject has no spaces or control characters)."""
    try:
        name = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name in the environment or passwd
        name = ""
    return urllib.parse.quote(name, safe=_SUBJECT_SAFE)[:256] or "unknown"


_SUBJECT_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def _key_op(run: Callable[[], Awaitable[T]]) -> T:
    """Run an audited key operation; a refusal or an audit failure ends the command."""
    try:
        return _run(run)
    except KeyRefused as exc:
        raise fail(str(exc), 2) from None
    except AuditError as exc:
        raise fail(f"the audit log cannot record this, so it was not done: {exc}") from None


@keys_app.command("create")
def keys_create(
    role: Annotated[str, typer.Option(help="app, auditor or admin.")],
    team: Annotated[str | None, typer.Option(help="Team the key acts for.")] = None,
    all_teams: Annotated[
        bool,
        typer.Option("--all-teams", help="An auditor of every team's events (else give --team)."),
    ] = False,
    name: Annotated[str | None, typer.Option(help="A label for the key.")] = None,
    expires_days: Annotated[int | None, typer.Option(help="Expires after N days.")] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create an API key and print it (this once: only an HMAC of its secret is kept).  An
    auditor key reads one team's audit events (--team) or every team's (--all-teams)."""
    settings = load_cli_settings(config, data_dir)
    expires = datetime.now(UTC) + timedelta(days=expires_days) if expires_days else None

    async def create() -> tuple[str, Any]:
        async with key_admin(settings, os_user()) as keys:
            return await keys.create(
                role, team=team, name=name, expires_at=expires, all_teams=all_teams
            )

    key, record = _key_op(create)
    err.print(f"created key {record.key_id} (role {role}); it is shown this once:", markup=False)
    typer.echo(key)


@keys_app.command("new-secret")
def keys_new_secret() -> None:
    """Print a fresh, well-formed API key and store it nowhere: for `[auth]
    initial_admin_key_file`, which the first `serve` registers as the admin key.  Needs no
    configuration and no database; pipe it straight into your secret manager."""
    typer.echo(generate_api_key())


_SCOPES = {"all_teams": "all teams", "team": "its team"}


@keys_app.command("list")
def keys_list(
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines.")] = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Every key's metadata and audit scope (never a secret)."""
    settings = load_cli_settings(config, data_dir)

    async def listing() -> list[Any]:
        async with key_admin(settings, os_user()) as keys:
            return await keys.list()

    records = _key_op(listing)
    if as_json:
        for record in records:
            typer.echo(msgspec.json.encode(record).decode())
        return
    table = Table(
        "key id",
        "role",
        "team",
        "audit scope",
        "name",
        "created",
        "expires",
        "revoked",
        "last used",
    )
    for r in records:
        table.add_row(
            *(
                escape(str(v)) if v is not None else "-"
                for v in (
                    r.key_id,
                    r.role,
                    r.team,
                    _SCOPES.get(r.audit_scope) if r.audit_scope else None,
                    r.name,
                    r.created_at,
                    r.expires_at,
                    r.revoked_at,
                    r.last_used_at,
                )
            )
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id (the part after ag_).")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Revoke a key; a running server refuses it from its next request."""
    settings = load_cli_settings(config, data_dir)

    async def revoke() -> bool:
        async with key_admin(settings, os_user()) as keys:
            return await keys.revoke(key_id)

    if not _key_op(revoke):
        raise fail("no such active key")
    out.print(f"revoked {key_id}", markup=False)


# --- policy -------------------------------------------------------------------------------


@policy_app.command("check")
def policy_check(
    path: Annotated[Path | None, typer.Argument(help="Policy directory or file.")] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Lint policy documents; exit 1 on any error or warning."""
    target = path
    if target is None:
        settings = load_cli_settings(config, data_dir)
        if not settings.policy.path:
            version = load_default_policy().version
            out.print(f"the shipped default policy (version {version}) is in force", markup=False)
            return
        target = Path(settings.policy.path)
    findings = lint(target)
    for finding in findings:
        err.print(finding, markup=False)
    if findings:
        raise typer.Exit(1)
    out.print(f"ok: {target} (version {load_policy_dir(target).version})", markup=False)


@policy_app.command("reload")
def policy_reload(config: ConfigOpt = None, data_dir: DataDirOpt = None) -> None:
    """Ask the running server of this data dir to reload its policy (SIGHUP).  A broken
    document is refused there and the policy in force stays."""
    settings = load_cli_settings(config, data_dir)
    if settings.policy.path:
        try:
            load_policy_dir(settings.policy.path)
        except PolicyError as exc:
            raise fail(f"not reloading: {exc}") from None
    lock = Path(settings.data_dir) / "airgate.lock"
    try:
        pid = int(lock.read_text().split()[0])
        os.kill(pid, signal.SIGHUP)
    except (OSError, ValueError, IndexError):
        raise fail(f"no airgate server is running on {settings.data_dir}") from None
    out.print(f"asked server {pid} to reload its policy", markup=False)


# --- audit --------------------------------------------------------------------------------


def _filter(
    start: str | None,
    end: str | None,
    key_id: str | None,
    team: str | None,
    model: str | None,
    kind: str | None,
    outcome: str | None,
) -> AuditFilter:
    try:
        return msgspec.convert(
            {
                "start": start,
                "end": end,
                "key_id": key_id,
                "team": team,
                "model": model,
                "kind": kind,
                "outcome": outcome,
            },
            AuditFilter,
        )
    except msgspec.ValidationError as exc:
        raise fail(f"bad filter: {exc}", 2) from None


StartOpt = Annotated[str | None, typer.Option(help="From (ISO 8601).")]
EndOpt = Annotated[str | None, typer.Option(help="Until (ISO 8601).")]
KeyOpt = Annotated[str | None, typer.Option("--key-id", help="Caller's key id.")]
TeamOpt = Annotated[str | None, typer.Option(help="Team.")]
ModelOpt = Annotated[str | None, typer.Option(help="Model id.")]
KindOpt = Annotated[str | None, typer.Option(help="Event kind, e.g. inference.completed.")]
OutcomeOpt = Annotated[str | None, typer.Option(help="success, failure, denied, cancelled.")]


@audit_app.command("search")
def audit_search(
    start: StartOpt = None,
    end: EndOpt = None,
    key_id: KeyOpt = None,
    team: TeamOpt = None,
    model: ModelOpt = None,
    kind: KindOpt = None,
    outcome: OutcomeOpt = None,
    limit: Annotated[int, typer.Option(help="At most this many events.")] = 100,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Matching events as JSON lines, oldest first."""
    settings = load_cli_settings(config, data_dir)
    flt = _filter(start, end, key_id, team, model, kind, outcome)

    async def run() -> list[Any]:
        engine = create_db_engine(_url(settings, database))
        try:
            found: list[Any] = []
            cursor = None
            while len(found) < limit:
                page, cursor = await search(
                    engine,
                    **msgspec.structs.asdict(flt),
                    cursor=cursor,
                    limit=min(1000, limit - len(found)),
                )
                found += page
                if cursor is None:
                    break
            return found
        finally:
            await engine.dispose()

    for record in _run(run):
        typer.echo(msgspec.json.encode(record).decode())


@audit_app.command("export")
def audit_export(
    format: Annotated[str, typer.Option(help="jsonl, csv or ocsf.")] = "jsonl",
    output: Annotated[Path | None, typer.Option(help="File to write (default stdout).")] = None,
    start: StartOpt = None,
    end: EndOpt = None,
    key_id: KeyOpt = None,
    team: TeamOpt = None,
    model: ModelOpt = None,
    kind: KindOpt = None,
    outcome: OutcomeOpt = None,
    segment: Annotated[
        Path | None,
        typer.Option(help="Write this laptop's next signed segment here, for `audit import`."),
    ] = None,
    from_seq: Annotated[
        int | None, typer.Option(help="With --segment: start here, not after the last export.")
    ] = None,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Export events (CSV is spreadsheet-formula safe; OCSF is API Activity, class 6003), or
    with --segment this laptop's chain since the last export (see `audit import`)."""
    if from_seq is not None and segment is None:
        raise fail("--from-seq goes with --segment", 2)
    if segment is not None:
        settings = load_cli_settings(config, data_dir)
        export_segment(settings, _url(settings, database), segment, from_seq)
        return
    if format not in ("jsonl", "csv", "ocsf"):
        raise fail("--format must be jsonl, csv or ocsf", 2)
    fmt: Literal["jsonl", "csv", "ocsf"] = format  # type: ignore[assignment]
    settings = load_cli_settings(config, data_dir)
    flt = _filter(start, end, key_id, team, model, kind, outcome)

    async def run() -> int:
        engine = create_db_engine(_url(settings, database))
        sink = output.open("wb") if output else sys.stdout.buffer
        written = 0
        try:
            async for chunk in export(engine, fmt, flt):
                sink.write(chunk)
                written += len(chunk)
        finally:
            if output:
                sink.close()
            else:
                sink.flush()
            await engine.dispose()
        return written

    written = _run(run)
    if output:
        err.print(f"wrote {written:,} bytes to {output}", markup=False)


# --- db -----------------------------------------------------------------------------------


@db_app.command("upgrade")
def db_upgrade(
    sql: Annotated[bool, typer.Option("--sql", help="Print the SQL instead (for a DBA).")] = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Migrate the database to this airgate's schema."""
    settings = load_cli_settings(config, data_dir)
    url = _url(settings)
    if sql:
        typer.echo(offline_sql(url))
        return

    async def run() -> str | None:
        await upgrade(url)
        return await current_revision(url)

    out.print(f"database at revision {_run(run)} (head {head_revision()})", markup=False)
