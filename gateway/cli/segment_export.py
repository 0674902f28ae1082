"""`airgate audit export --segment FILE [--from-seq N]` (a laptop): the next signed segment of
this data directory's audit chain, for `airgate audit import` at HQ.

The segment runs from the row after the last export to the chain's latest signed batch, so it
ends on a checkpoint boundary.  Where the last export ended is kept in the data directory
(`audit-export.json`) only for convenience: HQ never relies on it.  Losing or editing it makes
the next export overlap, which HQ refuses as a replay naming the seq it expects, and
`--from-seq` starts there.  With no new signed row, nothing is written (exit 0).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import msgspec

from ..access.audit_log import audit_log_id
from ..access.audit_signer import open_audit_signer
from ..access.auth import KeyStore
from ..access.secrets import load_pepper
from ..audit import AuditCorrupt
from ..audit.segment import Segment, SegmentRefused, check_segment, encode_segment, sign_segment
from ..audit.segment_store import SegmentSourceError, read_segment
from ..config import ConfigError, Settings
from ..db import create_db_engine
from .common import err, fail, out

__all__ = ["DEVICE_FILE", "STATE_FILE", "export_segment", "write_private"]

STATE_FILE = "audit-export.json"  # {"log_id", "last_seq"}: where the last export ended
DEVICE_FILE = "device.json"  # the enrolment `airgate device enroll` made here


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole (a temporary file renamed over it), mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _device_id(settings: Settings) -> str:
    path = Path(settings.data_dir) / DEVICE_FILE
    try:
        device = json.loads(path.read_text(encoding="utf-8"))["device_id"]
    except (OSError, ValueError, KeyError, TypeError):
        raise fail(
            "this data directory is not enrolled: run `airgate device enroll` and give the "
            "request to HQ first",
            2,
        ) from None
    return str(device)


def _last_exported(settings: Settings, log_id: str) -> int:
    try:
        state = json.loads((Path(settings.data_dir) / STATE_FILE).read_text(encoding="utf-8"))
        return int(state["last_seq"]) if state.get("log_id") == log_id else 0
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 0


async def _read(settings: Settings, url: str, from_seq: int | None) -> tuple[Segment | None, int]:
    try:
        pepper = load_pepper(settings, create=False)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None
    engine = create_db_engine(url)
    keys = KeyStore(engine, pepper)
    try:
        log_id = audit_log_id(settings, keys)
        start = from_seq if from_seq is not None else _last_exported(settings, log_id) + 1
        device = _device_id(settings)
        segment = await read_segment(engine, log_id, device, start, time.time_ns() // 1000)
        return segment, start
    finally:
        await keys.aclose()
        await engine.dispose()


def export_segment(settings: Settings, url: str, path: Path, from_seq: int | None) -> None:
    """Write the next segment of this data directory's chain to `path` (see the module)."""
    try:
        segment, start = asyncio.run(_read(settings, url, from_seq))
    except SegmentSourceError as exc:
        raise fail(str(exc), 2) from None
    except AuditCorrupt as exc:
        raise fail(f"{exc}; run `airgate audit verify`") from None
    except (OSError, ConnectionError) as exc:
        raise fail(f"the database cannot be reached ({type(exc).__name__})") from None
    if segment is None:
        out.print(
            f"nothing new to export: no signed row after seq {start - 1}; no segment written",
            markup=False,
        )
        return
    signer = open_audit_signer(settings, create_default=False)
    try:
        signed = sign_segment(segment, signer)
        check_segment(signed, [signer.verify_key])  # what HQ will check, before it travels
    except SegmentRefused as exc:
        raise fail(
            f"the chain does not make a valid segment ({exc}); run `airgate audit verify`"
        ) from None
    finally:
        signer.close()
    write_private(path, encode_segment(signed) + b"\n")
    state = {"log_id": signed.log_id, "last_seq": signed.last_seq}
    write_private(Path(settings.data_dir) / STATE_FILE, msgspec.json.encode(state))
    err.print(
        f"wrote segment seq {signed.first_seq}..{signed.last_seq} of device {signed.device_id} "
        f"({len(signed.rows)} rows, {len(signed.checkpoints)} checkpoints) to {path}",
        markup=False,
    )
