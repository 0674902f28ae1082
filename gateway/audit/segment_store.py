"""Segments and the database: the laptop reads one out of its chain, HQ stores one into the
device's chain (`segment.py` is the format and the checks).

Where a segment starts: after the batch checkpoint that signed row `from_seq - 1` (unique: a
batch checkpoint ends at the last row it adds; open, close and epoch checkpoints add none and
travel with the next segment).  Where it ends: at the chain's latest batch checkpoint.

HQ's continuity rule, against the device's chain as HQ stores it (head seq S): a segment must
start at S + 1 and continue exactly HQ's last row and checkpoint.  One starting later is a
`gap`; one whose rows HQ holds already is a `replay` (same rows) or a `fork` (other rows at
the same seq: the device's key signed two histories); one starting at S + 1 after another
history is a `fork`.  The import holds the chain's lease (`_lease.py`) and inserts every row
and checkpoint in one transaction, so a refusal stores nothing and two imports of one device
never interleave.
"""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import VerifyKey

from ._head import parse_frontier, read_head
from ._lease import ChainLease
from .chain import GENESIS
from .checkpoint import (
    Checkpoint,
    check_signature,
    checkpoint_from_row,
    checkpoint_hash,
    trusted_by_id,
)
from .errors import AuditCorrupt
from .merkle import CompactTree
from .schema import audit_checkpoints, audit_events
from .segment import SEGMENT_FORMAT, CheckedSegment, Segment, SegmentRefused, SegmentRow

__all__ = ["SegmentSourceError", "import_segment", "read_segment"]


class SegmentSourceError(Exception):
    """The chain cannot give a segment from where it was asked (the message says why)."""


async def read_segment(
    engine: AsyncEngine, log_id: str, device_id: str, from_seq: int, created_us: int
) -> Segment | None:
    """The unsigned segment of chain `log_id` from `from_seq` to its latest batch checkpoint;
    None when no row after `from_seq - 1` is signed yet."""
    if from_seq < 1:
        raise SegmentSourceError("--from-seq must be 1 or more")
    cps = audit_checkpoints.c
    async with engine.connect() as conn:
        cp_rows = (
            await conn.execute(
                select(audit_checkpoints).where(cps.log_id == log_id).order_by(cps.id)
            )
        ).all()
        checkpoints = [checkpoint_from_row(r) for r in cp_rows]
        batches = [cp for cp in checkpoints if cp.count > 0]
        end = batches[-1] if batches else None
        if end is None or end.size < from_seq:
            if from_seq > (end.size if end else 0) + 1:
                raise SegmentSourceError(
                    f"the chain ends at seq {end.size if end else 0}: --from-seq {from_seq} "
                    "is beyond it"
                )
            return None
        prev: Checkpoint | None = None
        frontier: list[str] = []
        if from_seq > 1:
            at = [i for i, cp in enumerate(checkpoints) if cp.count > 0 and cp.size == from_seq - 1]
            if not at:
                raise SegmentSourceError(
                    f"seq {from_seq - 1} is not the end of a signed batch: a segment starts "
                    "right after one (the laptop's last export ended at one)"
                )
            prev = checkpoints[at[0]]
            nodes = parse_frontier(str(cp_rows[at[0]].frontier))
            if CompactTree(prev.size, nodes).root().hex() != prev.root:
                raise AuditCorrupt("a stored checkpoint's tree does not match its signed root")
            frontier = [node.hex() for node in nodes]
        ev = audit_events.c
        prev_row_hash = GENESIS
        if from_seq > 1:
            found = await conn.execute(
                select(ev.row_hash).where(ev.log_id == log_id, ev.seq == from_seq - 1)
            )
            prev_row_hash = str(found.scalar() or "")
        rows = (
            await conn.execute(
                select(ev.seq, ev.ts_us, ev.body, ev.prev_hash, ev.row_hash)
                .where(ev.log_id == log_id, ev.seq >= from_seq, ev.seq <= end.size)
                .order_by(ev.seq)
            )
        ).all()
    after = prev.id if prev else 0
    return Segment(
        format=SEGMENT_FORMAT,
        device_id=device_id,
        log_id=log_id,
        alg="",
        key_id="",
        created_us=created_us,
        first_seq=from_seq,
        last_seq=end.size,
        prev_row_hash=prev_row_hash,
        prev_checkpoint=prev,
        frontier=frontier,
        rows=[
            SegmentRow(
                seq=int(r.seq),
                ts_us=int(r.ts_us),
                body=str(r.body),
                prev_hash=str(r.prev_hash),
                row_hash=str(r.row_hash),
            )
            for r in rows
        ],
        checkpoints=[cp for cp in checkpoints if after < cp.id <= end.id],
    )


async def _stored_hashes(engine: AsyncEngine, log_id: str, first: int, last: int) -> list[str]:
    ev = audit_events.c
    async with engine.connect() as conn:
        found = await conn.execute(
            select(ev.row_hash)
            .where(ev.log_id == log_id, ev.seq >= first, ev.seq <= last)
            .order_by(ev.seq)
        )
        return [str(h) for h in found.scalars()]


async def _check_continuity(
    engine: AsyncEngine, checked: CheckedSegment, keys: list[VerifyKey]
) -> None:
    segment = checked.segment
    head = await read_head(engine, segment.log_id)
    if (
        head.checkpoint is not None
        and check_signature(head.checkpoint, trusted_by_id(keys)) != "ok"
    ):
        raise SegmentRefused(
            "fork",
            f"chain {segment.log_id} at HQ is not signed by device {segment.device_id}'s key: "
            "it is another writer's chain",
        )
    expected, first, last = head.seq + 1, segment.first_seq, segment.last_seq
    if first > expected:
        raise SegmentRefused("gap", f"expected seq {expected}, segment starts at {first}")
    if first < expected:
        upto = min(last, head.seq)
        stored = await _stored_hashes(engine, segment.log_id, first, upto)
        mine = [row.row_hash for row in segment.rows[: upto - first + 1]]
        for seq, (held, given) in enumerate(zip(stored, mine, strict=False), start=first):
            if held != given:
                raise SegmentRefused(
                    "fork", f"seq {seq} differs from the row HQ imported at that seq"
                )
        raise SegmentRefused(
            "replay",
            f"seq {first}..{upto} already imported; expected seq {expected} "
            f"(export with --from-seq {expected})",
        )
    if segment.prev_row_hash != head.row_hash or checkpoint_hash(
        segment.prev_checkpoint
    ) != checkpoint_hash(head.checkpoint):
        raise SegmentRefused(
            "fork",
            f"the segment continues another history than the one HQ holds up to seq {head.seq}",
        )


async def import_segment(
    engine: AsyncEngine, checked: CheckedSegment, keys: list[VerifyKey]
) -> None:
    """Store a checked segment as its device's chain, if it continues what HQ holds of that
    chain (see the module).  Raises `SegmentRefused` (nothing stored), `AuditCorrupt` (the
    stored chain is broken: run `airgate audit verify`), `AuditChainBusy`."""
    segment = checked.segment
    lease = ChainLease(engine, segment.log_id)
    await lease.acquire()
    try:
        await _check_continuity(engine, checked, keys)
        try:
            async with engine.begin() as conn:
                await conn.execute(insert(audit_events), checked.rows)
                await conn.execute(insert(audit_checkpoints), checked.checkpoint_rows)
        except IntegrityError:
            raise SegmentRefused(
                "conflict",
                "HQ's database refused the rows (an event id is stored already, or another "
                "import of this device ran at the same time); nothing was stored",
            ) from None
    finally:
        await lease.release()
