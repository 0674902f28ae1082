"""The chain head: where the audit log ends, and the batch that extends it.

`Head` is the writer's chain as the database last confirmed it: the last seq and row hash, the last
checkpoint (a signed tree head) and the tree's right edge (`CompactTree`).  `read_head`
recovers it from the tables (the last checkpoint's stored frontier, checked against its signed
root, so a restart never re-reads the log) and refuses a log whose rows do not end exactly at
its last checkpoint: the writer commits rows and their checkpoint in one transaction, so a row
after the last checkpoint was not written by a writer, and signing over it would launder it.

`extend` builds a batch: rows linked onto the head, and an unsigned checkpoint after every
`every` rows and at the batch's end; `seal` makes the one checkpoint of an open, close or epoch
marker.  Both are pure; the writer signs, inserts in one transaction, and keeps the new head
only after COMMIT.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from .chain import GENESIS, link
from .checkpoint import Checkpoint, CheckpointKind, checkpoint_from_row, unsigned_checkpoint
from .errors import AuditCorrupt
from .event import AuditEvent
from .merkle import CompactTree
from .schema import audit_checkpoints, audit_events

__all__ = ["Head", "Signing", "extend", "parse_frontier", "read_head", "seal"]


class Signing(msgspec.Struct, frozen=True, kw_only=True):
    """Who signs this writer's checkpoints, and for which log."""

    log_id: str
    alg: str
    key_id: str


class Head(msgspec.Struct, frozen=True, kw_only=True):
    """The log as the database last confirmed it (always ending at a checkpoint, or empty)."""

    seq: int
    row_hash: str
    checkpoint: Checkpoint | None
    tree: CompactTree

    @property
    def epoch(self) -> int:
        return self.checkpoint.epoch if self.checkpoint else 1


def parse_frontier(text: str) -> list[bytes]:
    """A checkpoint row's stored frontier (hex, 64 digits a node); ValueError if malformed."""
    if len(text) % 64:
        raise ValueError("frontier")
    return [bytes.fromhex(text[i : i + 64]) for i in range(0, len(text), 64)]


async def read_head(engine: AsyncEngine, log_id: str) -> Head:
    """The head of chain `log_id` as stored.  Raises `AuditCorrupt` (with a message for the
    operator) when its rows do not end at its last checkpoint; driver errors propagate."""
    events, checkpoints = audit_events.c, audit_checkpoints.c
    async with engine.connect() as conn:
        cp_row = (
            await conn.execute(
                select(audit_checkpoints)
                .where(checkpoints.log_id == log_id)
                .order_by(checkpoints.id.desc())
                .limit(1)
            )
        ).first()
        last = (
            await conn.execute(
                select(events.seq, events.row_hash)
                .where(events.log_id == log_id)
                .order_by(events.seq.desc())
                .limit(1)
            )
        ).first()
        rows = (
            await conn.execute(
                select(func.count()).select_from(audit_events).where(events.log_id == log_id)
            )
        ).scalar()
    seq, row_hash = (int(last.seq), str(last.row_hash)) if last else (0, GENESIS)
    if cp_row is None:
        if seq:
            raise AuditCorrupt(
                f"the audit log has {seq} rows and no signed checkpoint: it was not written by "
                "airgate's writer; run `airgate audit verify`"
            )
        return Head(seq=0, row_hash=GENESIS, checkpoint=None, tree=CompactTree())
    checkpoint = checkpoint_from_row(cp_row)
    if seq != checkpoint.size or int(rows or 0) != seq:
        raise AuditCorrupt(
            f"the audit log ends at seq {seq} with {rows} rows but its last signed checkpoint "
            f"covers {checkpoint.size}: rows were removed or added outside airgate; run "
            "`airgate audit verify`"
        )
    try:
        tree = CompactTree(checkpoint.size, parse_frontier(str(cp_row.frontier)))
    except ValueError:
        tree = None
    if tree is None or tree.root().hex() != checkpoint.root:
        raise AuditCorrupt(
            "the last checkpoint's stored tree does not match its signed root; "
            "run `airgate audit verify`"
        )
    return Head(seq=seq, row_hash=row_hash, checkpoint=checkpoint, tree=tree)


def extend(
    head: Head,
    events: Sequence[AuditEvent],
    *,
    every: int,
    ts_us: int,
    signing: Signing,
) -> tuple[list[dict[str, Any]], list[tuple[Checkpoint, tuple[bytes, ...]]], Head]:
    """The rows for `events` after `head`, the unsigned checkpoints among them (with the tree's
    frontier at each), and the head once they are signed and committed (its checkpoint is the
    unsigned last one: the writer replaces it with the signed one)."""
    seq, prev, checkpoint = head.seq, head.row_hash, head.checkpoint
    tree = head.tree.copy()
    rows: list[dict[str, Any]] = []
    checkpoints: list[tuple[Checkpoint, tuple[bytes, ...]]] = []
    since = 0
    for i, event in enumerate(events):
        seq += 1
        row = link(prev, seq, event, log_id=signing.log_id)
        prev = row["row_hash"]
        rows.append(row)
        tree.append(bytes.fromhex(prev))
        since += 1
        if since == every or i == len(events) - 1:
            checkpoint = _next(checkpoint, head.epoch, "batch", tree, ts_us, signing)
            checkpoints.append((checkpoint, tree.stack))
            since = 0
    return rows, checkpoints, Head(seq=seq, row_hash=prev, checkpoint=checkpoint, tree=tree)


def seal(
    head: Head, kind: CheckpointKind, *, ts_us: int, signing: Signing, epoch: int | None = None
) -> Checkpoint:
    """The unsigned open/close/epoch checkpoint at the head's size."""
    return _next(head.checkpoint, epoch or head.epoch, kind, head.tree, ts_us, signing)


def _next(
    prev: Checkpoint | None,
    epoch: int,
    kind: CheckpointKind,
    tree: CompactTree,
    ts_us: int,
    signing: Signing,
) -> Checkpoint:
    return unsigned_checkpoint(
        prev,
        log_id=signing.log_id,
        epoch=epoch,
        kind=kind,
        size=tree.size,
        root=tree.root(),
        ts_us=ts_us,
        alg=signing.alg,
        key_id=signing.key_id,
    )
