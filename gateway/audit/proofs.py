"""Consistency proofs from the stored log: what `airgate audit witness` checks a new tree head
with, holding only the one it kept before (RFC 6962 §2.1.2)."""

from __future__ import annotations

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from .checkpoint import Checkpoint, checkpoint_from_row
from .errors import InvalidQuery
from .merkle import consistency_proof
from .schema import audit_checkpoints, audit_events

__all__ = ["ProvedCheckpoint", "latest_with_proof"]

_PAGE = 10_000


class ProvedCheckpoint(msgspec.Struct, frozen=True, kw_only=True):
    checkpoint: Checkpoint
    from_size: int | None  # the size the proof starts at (None: no proof asked)
    proof: list[str]  # hex nodes, RFC 6962 order


async def latest_with_proof(
    engine: AsyncEngine, log_id: str, from_size: int | None
) -> ProvedCheckpoint | None:
    """Chain `log_id`'s latest checkpoint and, for `0 < from_size <= its size`, the proof that
    the tree of `from_size` rows is a prefix of it.  None when the chain has no checkpoint."""
    cps, ev = audit_checkpoints.c, audit_events.c
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(audit_checkpoints)
                .where(cps.log_id == log_id)
                .order_by(cps.id.desc())
                .limit(1)
            )
        ).first()
        if row is None:
            return None
        latest = checkpoint_from_row(row)
        if not from_size:
            return ProvedCheckpoint(checkpoint=latest, from_size=None, proof=[])
        if from_size > latest.size:
            raise InvalidQuery("from_size is beyond the log's latest checkpoint")
        leaves: list[bytes] = []
        after = 0
        while after < latest.size:
            page = (
                await conn.execute(
                    select(ev.seq, ev.row_hash)
                    .where(ev.log_id == log_id, ev.seq > after, ev.seq <= latest.size)
                    .order_by(ev.seq)
                    .limit(_PAGE)
                )
            ).all()
            if not page:
                break
            leaves.extend(bytes.fromhex(str(r.row_hash)) for r in page)
            after = int(page[-1].seq)
    if len(leaves) != latest.size:
        raise InvalidQuery("the log has gaps: run verify")
    proof = consistency_proof(leaves, from_size)
    return ProvedCheckpoint(
        checkpoint=latest, from_size=from_size, proof=[node.hex() for node in proof]
    )
