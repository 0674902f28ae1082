"""The chain head: where the audit chain ends, and the batch that extends it.

`Head` is the chain as the database last confirmed it: the last seq and row hash, the last
checkpoint, and the row hashes after it (not yet covered by a signature).  `read_head` recovers
it from the tables; `extend` builds a batch (rows linked onto the head, a signed checkpoint each
time `every` rows are pending, so checkpoints cover exact ranges) and `checkpoint_tail` signs
what is pending.  Both are pure, with the clock reading and the key passed in: the writer
inserts what they return in one transaction and keeps the new head only after COMMIT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from .chain import GENESIS, link
from .checkpoint import Checkpoint, checkpoint_from_row, make_checkpoint
from .errors import AuditCorrupt
from .event import AuditEvent
from .schema import audit_checkpoints, audit_events

__all__ = ["Head", "checkpoint_tail", "extend", "read_head"]


class Head(msgspec.Struct, frozen=True, kw_only=True):
    """The chain as the database last confirmed it."""

    seq: int
    row_hash: str
    checkpoint: Checkpoint | None
    pending: tuple[str, ...]  # row hashes after the last checkpoint


async def read_head(engine: AsyncEngine) -> Head:
    """The head as stored.  Raises `AuditCorrupt` when the last checkpoint covers rows that are
    not there; driver errors propagate (the writer translates them)."""
    async with engine.connect() as conn:
        last = (
            await conn.execute(
                select(audit_events.c.seq, audit_events.c.row_hash)
                .order_by(audit_events.c.seq.desc())
                .limit(1)
            )
        ).first()
        cp_row = (
            await conn.execute(
                select(audit_checkpoints).order_by(audit_checkpoints.c.id.desc()).limit(1)
            )
        ).first()
        checkpoint = checkpoint_from_row(cp_row) if cp_row else None
        after = checkpoint.last_seq if checkpoint else 0
        pending = (
            await conn.execute(
                select(audit_events.c.row_hash)
                .where(audit_events.c.seq > after)
                .order_by(audit_events.c.seq)
            )
        ).scalars()
        pending_hashes = tuple(pending)
    seq, row_hash = (int(last.seq), str(last.row_hash)) if last else (0, GENESIS)
    if seq < after:
        raise AuditCorrupt(
            f"the last checkpoint covers seq {after} but the last row is {seq}; run verify"
        )
    return Head(seq=seq, row_hash=row_hash, checkpoint=checkpoint, pending=pending_hashes)


def extend(
    head: Head,
    events: Sequence[AuditEvent],
    *,
    every: int,
    ts_us: int,
    signing_key: Ed25519PrivateKey,
) -> tuple[list[dict[str, Any]], list[Checkpoint], Head]:
    """The rows for `events` after `head`, the checkpoints that fall due among them (one per
    `every` pending rows, stamped `ts_us`), and the head once they are committed."""
    seq, prev, checkpoint = head.seq, head.row_hash, head.checkpoint
    pending = list(head.pending)
    rows: list[dict[str, Any]] = []
    checkpoints: list[Checkpoint] = []
    for event in events:
        seq += 1
        row = link(prev, seq, event)
        prev = row["row_hash"]
        rows.append(row)
        pending.append(prev)
        if len(pending) == every:
            checkpoint = make_checkpoint(checkpoint, pending, ts_us=ts_us, signing_key=signing_key)
            checkpoints.append(checkpoint)
            pending = []
    new_head = Head(seq=seq, row_hash=prev, checkpoint=checkpoint, pending=tuple(pending))
    return rows, checkpoints, new_head


def checkpoint_tail(
    head: Head, *, ts_us: int, signing_key: Ed25519PrivateKey
) -> tuple[Checkpoint, Head]:
    """A checkpoint over the rows pending after `head`, and the head once it is committed."""
    checkpoint = make_checkpoint(
        head.checkpoint, head.pending, ts_us=ts_us, signing_key=signing_key
    )
    return checkpoint, msgspec.structs.replace(head, checkpoint=checkpoint, pending=())
