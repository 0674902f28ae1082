"""The audit log's way home: `airgate device enroll` on a laptop, `airgate audit import` at HQ
(`airgate audit export --segment` is `segment_export.py`).

- `device enroll` writes the request HQ pins in `[audit] devices`: the device id, the laptop's
  chain and its audit signer's public key (no secret).  It also keeps the request in the data
  directory, so `audit export --segment` knows the device id.
- `audit import FILE` checks a segment against the enrolled key of the device it names, then
  against what HQ holds of that device's chain (`audit.segment_store`), and stores it in one
  transaction: any refusal exits 1 with one line naming the problem, and nothing is stored.
  An accepted import is itself audited on HQ's own chain (`admin.action`, `audit.import`,
  device id and seq range), as `airgate keys create` audits itself.
"""

from __future__ import annotations

import asyncio
import re
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from ..access.audit_log import audit_log_id, open_audit_writer
from ..access.audit_signer import open_audit_signer
from ..access.auth import KeyStore
from ..access.secrets import load_pepper
from ..audit import (
    AuditChainBusy,
    AuditCorrupt,
    AuditError,
    AuditEvent,
    AuditPrincipal,
    new_event_id,
)
from ..audit.devices import (
    DEVICE_ID,
    ENROLMENT_FORMAT,
    DeviceKey,
    Enrolment,
    EnrolmentError,
    encode_enrolment,
    read_enrolments,
)
from ..audit.segment import CheckedSegment, SegmentRefused, check_segment, decode_segment
from ..audit.segment_store import import_segment
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from .admin import audit_app, os_user
from .common import ConfigOpt, DataDirOpt, err, fail, load_cli_settings, out
from .segment_export import DEVICE_FILE, write_private

__all__ = ["device_app"]

device_app = typer.Typer(
    help="This laptop as a device of HQ: enroll (its audit log travels home).",
    no_args_is_help=True,
)
_DEVICE_ID = re.compile(DEVICE_ID)


class _Unaudited(Exception):
    """The segment was stored, but HQ's own chain could not record the import."""


def _keys(settings: Settings, engine: AsyncEngine) -> KeyStore:
    try:
        return KeyStore(engine, load_pepper(settings))
    except ConfigError as exc:
        raise fail(f"configuration error: {exc}", 2) from None


@device_app.command("enroll")
def device_enroll(
    device_id: Annotated[
        str | None, typer.Option(help="This device's name at HQ (default: the host name).")
    ] = None,
    out_file: Annotated[
        Path | None, typer.Option("--out", help="Write the request here (default: stdout).")
    ] = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Write this laptop's enrolment request, which HQ pins in its configuration (`devices`
    of the audit section); it holds no secret."""
    settings = load_cli_settings(config, data_dir)
    name = device_id if device_id is not None else socket.gethostname().split(".")[0]
    if _DEVICE_ID.match(name) is None:
        raise fail(
            "the device id must be 1 to 64 of A-Z a-z 0-9 . _ - starting with a letter or "
            "digit: give one with --device-id",
            2,
        )
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
    engine = create_db_engine(database_url(settings.data_dir, settings.audit.database_url))
    keys = _keys(settings, engine)  # the pepper is made here if this is a first start
    try:
        log_id = audit_log_id(settings, keys)
    finally:
        asyncio.run(_close(keys, engine))
    signer = open_audit_signer(settings)
    try:
        key = signer.verify_key
    finally:
        signer.close()
    enrolment = Enrolment(
        format=ENROLMENT_FORMAT,
        device_id=name,
        log_id=log_id,
        key_id=key.key_id,
        public_key=key.text,
        created=datetime.now(UTC).replace(microsecond=0),
    )
    data = encode_enrolment(enrolment) + b"\n"
    write_private(Path(settings.data_dir) / DEVICE_FILE, data)
    if out_file is None:
        typer.echo(data.decode("utf-8"), nl=False)
    else:
        write_private(out_file, data)
        err.print(f"wrote the enrolment request of device {name} to {out_file}", markup=False)


async def _close(keys: KeyStore, engine: AsyncEngine) -> None:
    await keys.aclose()
    await engine.dispose()


def _device_keys(settings: Settings, device_id: str, log_id: str) -> list[DeviceKey]:
    """The enrolled keys of the segment's device; refuses an unknown device or chain."""
    try:
        enrolled = read_enrolments(settings.audit.devices)
    except EnrolmentError as exc:
        raise fail(f"configuration error: {exc}", 2) from None
    if _DEVICE_ID.match(device_id) is None:
        raise fail("unknown device: the segment's device id is not one HQ could enrol")
    mine = [(e, k) for e, k in enrolled if e.device_id == device_id]
    if not mine:
        raise fail(f"unknown device: {device_id} is not enrolled ([audit] devices)")
    if mine[0][0].log_id != log_id:
        raise fail(f"unknown device: the segment's chain is not device {device_id}'s enrolled one")
    return [DeviceKey(k, e.device_id, e.log_id) for e, k in mine]


async def _import(settings: Settings, checked: CheckedSegment, keys: list[DeviceKey]) -> None:
    url = database_url(settings.data_dir, settings.audit.database_url)
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True, mode=0o700)  # noqa: ASYNC240
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    store = _keys(settings, engine)
    segment = checked.segment
    try:
        if audit_log_id(settings, store) == segment.log_id:
            raise SegmentRefused(
                "fork", f"device {segment.device_id}'s chain is this gateway's own chain"
            )
        await import_segment(engine, checked, list(keys))
        try:
            await _record(settings, engine, store, checked)
        except AuditError as exc:
            raise _Unaudited(str(exc)) from None
    finally:
        await store.aclose()
        await engine.dispose()


async def _record(
    settings: Settings, engine: AsyncEngine, store: KeyStore, checked: CheckedSegment
) -> None:
    """The import, on HQ's own chain (metadata only: the device, its chain, the seq range)."""
    segment = checked.segment
    async with open_audit_writer(settings, engine, store) as writer:
        await writer.append(
            AuditEvent(
                event_id=new_event_id(),
                ts=datetime.now(UTC),
                kind="admin.action",
                outcome="success",
                principal=AuditPrincipal(subject=os_user(), method="cli"),
                action="audit.import",
                detail={
                    "device": segment.device_id,
                    "chain": segment.log_id,
                    "first_seq": segment.first_seq,
                    "last_seq": segment.last_seq,
                },
            )
        )


@audit_app.command("import")
def audit_import(
    segment_file: Annotated[Path, typer.Argument(help="A segment from a laptop.")],
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Verify a laptop's segment against its enrolled key and store it as that device's chain;
    exit 1 (nothing stored) on any problem."""
    settings = load_cli_settings(config, data_dir)
    try:
        data = segment_file.read_bytes()
    except OSError as exc:
        raise fail(f"the segment cannot be read ({type(exc).__name__})", 2) from None
    try:
        segment = decode_segment(data)
        keys = _device_keys(settings, segment.device_id, segment.log_id)
        checked = check_segment(segment, keys)
        asyncio.run(_import(settings, checked, keys))
    except SegmentRefused as exc:
        raise fail(f"segment refused, nothing stored: {exc}") from None
    except (AuditCorrupt, AuditChainBusy) as exc:
        raise fail(f"segment not imported: {exc}", 2) from None
    except _Unaudited as exc:
        raise fail(f"the segment was stored, but its import could not be audited: {exc}") from None
    except (OSError, ConnectionError) as exc:
        raise fail(f"the database cannot be reached ({type(exc).__name__})") from None
    out.print(
        f"imported seq {segment.first_seq}..{segment.last_seq} of device {segment.device_id} "
        f"(chain {segment.log_id}, {len(segment.rows)} rows)",
        markup=False,
    )
