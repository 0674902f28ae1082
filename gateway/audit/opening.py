"""Before a writer appends to its chain: is this the chain the witnesses saw last?

At start the head read from the database is held against the latest checkpoint each witness
kept for this log.  The log must be at least as long, in the same epoch or a later one, and the
checkpoint the witness holds must be in the database, byte for byte (its signed tree head then
vouches for every row up to its size; `verify` proves the rows).  Anything else refuses the
start with a message that says what was found and what to do:

- the database is empty, but a witness (or the data directory's existing keys) says a log
  existed: a reset;
- the log is shorter than a witnessed size, or its checkpoint at the witnessed id differs:
  truncation or rollback (a restart after `kill -9` never trips this: rows and their checkpoint
  commit together, and a witness only ever receives committed checkpoints);
- a witness holds a later epoch than the database: the database was restored from a backup.

Refusing, rather than quietly beginning a new epoch, is the choice: a new epoch is an explicit
act (`airgate audit init --new-epoch`), signed, stored as the first checkpoint and event of the
new epoch and published to every witness, so the loss stays evident to every verifier.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from ._head import Head, Signing
from .checkpoint import Checkpoint, checkpoint_from_row
from .errors import AuditCorrupt
from .schema import audit_checkpoints
from .witness import Witness, WitnessError

__all__ = ["check_opening", "witnessed"]

_FIX = (
    "restore the database (and run `airgate audit verify`), or start a new epoch that every "
    "verifier will see: `airgate audit init --new-epoch`"
)


async def witnessed(witnesses: Sequence[Witness], log_id: str) -> list[tuple[str, Checkpoint]]:
    """The latest checkpoint each readable witness holds for `log_id` (name, checkpoint).
    Raises `AuditCorrupt` when a witness cannot be read: an unproven start is refused."""
    found: list[tuple[str, Checkpoint]] = []
    for witness in witnesses:
        try:
            latest = await asyncio.to_thread(witness.latest, log_id)
        except WitnessError as exc:
            raise AuditCorrupt(f"{exc}: the log cannot be checked against it") from None
        if latest is not None:
            found.append((witness.name, latest))
    return found


async def _stored(engine: AsyncEngine, log_id: str, checkpoint_id: int) -> Checkpoint | None:
    c = audit_checkpoints.c
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                select(audit_checkpoints).where(c.log_id == log_id, c.id == checkpoint_id)
            )
        ).first()
    return checkpoint_from_row(row) if row else None


async def check_opening(
    engine: AsyncEngine,
    head: Head,
    signing: Signing,
    witnesses: Sequence[Witness],
    *,
    genesis: bool,
) -> None:
    """Raise `AuditCorrupt` unless `head` may be continued (see the module's docstring)."""
    mine = head.checkpoint
    if mine is None and not genesis:
        raise AuditCorrupt(
            f"the audit database holds nothing of chain {signing.log_id}, but this data "
            f"directory has written it before: the log was lost or reset. {_FIX}"
        )
    for name, seen in await witnessed(witnesses, signing.log_id):
        where = (
            f"witness {name} holds checkpoint {seen.id} at size {seen.size} (epoch {seen.epoch})"
        )
        if mine is None:
            raise AuditCorrupt(f"the audit database is empty, but {where}. {_FIX}")
        if seen.epoch > mine.epoch:
            raise AuditCorrupt(
                f"{where}, later than the database's epoch {mine.epoch}: the database was "
                f"rolled back. {_FIX}"
            )
        if seen.epoch < mine.epoch:
            continue  # a new epoch began after it; verify reports what that epoch left behind
        if seen.size > head.seq or seen.id > mine.id:
            raise AuditCorrupt(
                f"{where}, but the log ends at size {head.seq} (checkpoint {mine.id}): "
                f"rows were removed. {_FIX}"
            )
        stored = await _stored(engine, signing.log_id, seen.id)
        if stored is None or stored.message() != seen.message():
            raise AuditCorrupt(
                f"{where}, but the database's checkpoint {seen.id} differs: the log was "
                f"rewritten. {_FIX}"
            )
