"""The checkpoints the console shows: the one covering an event, and a chain's latest.

Read straight from `audit_checkpoints` (both use its (log_id, last_seq) index).  What is shown
is what the table holds; whether a checkpoint is genuine is the verifier's answer, which the
integrity page gives (a signature is only as good as the pinned key it is checked against).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ..audit.checkpoint import Checkpoint, checkpoint_from_row
from ..audit.schema import audit_checkpoints

__all__ = ["covering", "latest"]

_c = audit_checkpoints.c
_COLUMNS = (
    _c.id,
    _c.log_id,
    _c.epoch,
    _c.kind,
    _c.first_seq,
    _c.last_seq,
    _c.count,
    _c.merkle_root,
    _c.prev_hash,
    _c.ts_us,
    _c.alg,
    _c.key_id,
    _c.signature,
)


async def covering(engine: AsyncEngine, chain: str, seq: int) -> Checkpoint | None:
    """The first checkpoint of `chain` whose tree holds row `seq` (size >= seq), or None: the
    row is not signed yet (or its checkpoint is gone, which verification reports)."""
    query = (
        select(*_COLUMNS)
        .where(_c.log_id == chain, _c.last_seq >= seq)
        .order_by(_c.last_seq, _c.id)
        .limit(1)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    return checkpoint_from_row(row) if row is not None else None


async def latest(engine: AsyncEngine, chain: str, limit: int = 10) -> list[Checkpoint]:
    """`chain`'s latest `limit` checkpoints, newest first."""
    query = select(*_COLUMNS).where(_c.log_id == chain).order_by(_c.id.desc()).limit(limit)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [checkpoint_from_row(row) for row in rows]
