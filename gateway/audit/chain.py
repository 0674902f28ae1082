"""The hash chain: how one stored row is bound to its content and to the row before it.

    canonical(row) = seq (8 bytes, big-endian) || ts_us (8 bytes, big-endian, signed) || body
    row_hash       = SHA-256(prev_hash || canonical(row))          (hashes as 32 raw bytes)

`body` is the canonical JSON of the event (`encode_event`), last so the encoding needs no
length prefix; the first row's `prev_hash` is 32 zero bytes.  Stored hashes are lowercase hex.

The columns the compliance filters use (kind, key id, team, model, deployment, outcome, HTTP
status, ts) are
copies of values inside the body, so the chain covers them through the body; `verify` checks that
each copy still equals the body, otherwise an edited `key_id` column could hide a row from a
search without touching any hash.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from .event import AuditEvent, encode_event, ts_us

__all__ = ["GENESIS", "canonical", "columns", "link", "row_hash"]

GENESIS = "0" * 64
_HEADER = struct.Struct(">Qq")


def canonical(seq: int, ts: int, body: bytes) -> bytes:
    """The bytes a row hash covers after `prev_hash` (`ts` in microseconds)."""
    return _HEADER.pack(seq, ts) + body


def row_hash(prev_hash: str, seq: int, ts: int, body: bytes) -> str:
    """SHA-256(prev_hash || canonical(row)) in hex; `prev_hash` in hex."""
    h = hashlib.sha256(bytes.fromhex(prev_hash))
    h.update(canonical(seq, ts, body))
    return h.hexdigest()


def columns(event: AuditEvent) -> dict[str, Any]:
    """The indexed columns of `event`'s row: copies of what the body says."""
    principal = event.principal
    return {
        "event_id": event.event_id,
        "ts_us": ts_us(event.ts),
        "kind": event.kind,
        "key_id": principal.key_id if principal else None,
        "team": principal.team if principal else None,
        "model": event.model,
        "outcome": event.outcome,
        "http_status": event.http_status,
        "deployment": event.deployment,
    }


def link(prev_hash: str, seq: int, event: AuditEvent, *, log_id: str) -> dict[str, Any]:
    """Every column of the row that stores `event` at `seq` of chain `log_id`, after a row
    hashed `prev_hash`.  The chain is not hashed into the row: the signed checkpoints name it."""
    body = encode_event(event)
    row = columns(event)
    row["log_id"] = log_id
    row["seq"] = seq
    row["body"] = body.decode("utf-8")
    row["prev_hash"] = prev_hash
    row["row_hash"] = row_hash(prev_hash, seq, row["ts_us"], body)
    return row
