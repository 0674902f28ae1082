"""The audit chain check (the verifier of `airgate audit verify`, over every chain and every
witness), and the selftest's own record in the log (an `admin.action`, as `airgate keys` and
`audit import` leave).

Verification trusts the pinned keys (`[audit] trusted_keys`, enrolled devices).  With none
pinned (a laptop's default) the checkpoints are checked against the audit signer's own key:
that proves the log is intact, not that nobody who can write the data directory rewrote it
and re-signed it; the detail says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime

from bundles.kms.signer import VerifyKey

from ..access.audit_log import audit_history, audit_witnesses, open_audit_writer, trusted_audit_keys
from ..access.audit_signer import open_audit_signer
from ..access.auth import KeyStore
from ..access.secrets import load_pepper
from ..audit import (
    AuditError,
    AuditEvent,
    AuditPrincipal,
    Checkpoint,
    DeviceKey,
    LogReport,
    new_event_id,
    verify_log,
)
from ..audit.witness import WitnessError, collect
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import MigrationError, ensure_schema
from .keys import database_missing
from .result import CheckResult, Finding, failed, passed, skipped

__all__ = ["check_audit_chain", "record_selftest"]


async def _verify(
    settings: Settings, keys: list[VerifyKey], witnessed: Sequence[tuple[str, list[Checkpoint]]]
) -> LogReport:
    url = database_url(settings.data_dir, settings.audit.database_url)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    try:
        return await verify_log(engine, keys, witnesses=witnessed)
    finally:
        await engine.dispose()


def _keys(settings: Settings) -> tuple[list[VerifyKey], str]:
    """The keys to trust, and how they were chosen (for the detail)."""
    keys = trusted_audit_keys(settings)
    if any(not isinstance(k, DeviceKey) for k in keys):
        return keys, "against the pinned keys"
    signer = open_audit_signer(settings, create_default=False)
    try:
        own = signer.verify_key
    finally:
        signer.close()
    return [*keys, own], (
        f"against the signer's own key {own.key_id}, which is not pinned: pin it in [audit] "
        "trusted_keys so that a re-signed log fails too"
    )


def check_audit_chain(settings: Settings) -> Finding:
    """Every chain, checkpoint and witness of the configured log verifies."""
    missing = database_missing(settings)
    if missing is not None:
        written = sorted(audit_history(settings))
        if written:
            return failed(
                f"the audit database {missing} is gone, but this data directory wrote chains "
                f"{', '.join(written)}: restore it from a backup, or declare the loss with "
                "`airgate audit init --new-epoch`"
            )
        return failed("there is no audit log yet: start `airgate serve` once")
    try:
        keys, how = _keys(settings)
        witnessed = collect(audit_witnesses(settings), None)
    except WitnessError as exc:
        return failed(f"a witness cannot be read: {exc}")
    except Exception as exc:  # a key that does not open or parse: the keys check says why
        return failed(f"no key to verify the checkpoints with ({type(exc).__name__}): see keys")
    try:
        report = asyncio.run(_verify(settings, keys, witnessed))
    except MigrationError as exc:
        return failed(f"the audit database cannot be read: {exc}")
    if not report.chains:
        return failed(
            "the audit log has no chain (nothing was ever signed): start `airgate serve` once"
        )
    bad = [c for c in report.chains if not c.ok]
    if bad:
        return failed(
            "; ".join(
                f"chain {c.log_id} FAILED verification at seq {c.first_bad_seq} ({c.reason}); "
                "`airgate audit verify` lists every finding"
                for c in bad
            )
        )
    rows = sum(c.rows for c in report.chains)
    checkpoints = sum(c.checkpoints_checked for c in report.chains)
    counted = ", ".join(
        _count(n, what)
        for n, what in ((len(report.chains), "chain"), (rows, "row"), (checkpoints, "checkpoint"))
    )
    return passed(f"{counted} and {_count(len(witnessed), 'witness')} verified {how}")


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "es" if what.endswith("s") else "s")


async def _append(settings: Settings, event: AuditEvent) -> None:
    url = database_url(settings.data_dir, settings.audit.database_url)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    store = KeyStore(engine, load_pepper(settings, create=False))
    try:
        async with open_audit_writer(settings, engine, store) as writer:
            await writer.append(event)
    finally:
        await store.aclose()
        await engine.dispose()


def record_selftest(settings: Settings, actor: str, results: Sequence[CheckResult]) -> Finding:
    """Append the selftest to the audit log as an `admin.action` by `actor` (the OS user):
    how many checks ran, failed and were skipped, and the first that failed."""
    if database_missing(settings) is not None:
        return skipped("not recorded: there is no audit log yet")
    failures = [r.name for r in results if r.status == "fail"]
    detail: dict[str, str | int] = {
        "checks": len(results),
        "failed": len(failures),
        "skipped": sum(r.status == "skip" for r in results),
    }
    if failures:
        detail["first_failed"] = failures[0]
    event = AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind="admin.action",
        outcome="failure" if failures else "success",
        principal=AuditPrincipal(subject=actor, method="cli"),
        action="selftest",
        detail=detail,
    )
    try:
        asyncio.run(_append(settings, event))
    except (AuditError, ConfigError) as exc:
        return failed(f"the selftest could not be recorded in the audit log: {exc}")
    return passed("the selftest was recorded in the audit log (admin.action selftest)")
