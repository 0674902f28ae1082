"""Verify the audit log offline: the hash chain row by row, and every signed checkpoint.

One function for the compliance API and the CLI; it only reads (both tables are append-only, so
reading checkpoints first and rows up to the largest seq then gives a consistent view while a
writer keeps appending).

What each check proves:
- chain (`gap`, `prev_hash_mismatch`, `row_hash_mismatch`, `body_invalid`, `column_mismatch`):
  the row at that seq was deleted, re-linked, edited, or its filter columns no longer match its
  body.  Checking continues from each row's stored hash, so independent edits are each found.
- checkpoints (`checkpoint_*`): the rows of a signed range no longer hash to the signed Merkle
  root, the signature is invalid or from a key that is not trusted, or a checkpoint is missing
  from the linked sequence.  This is the only evidence against an attacker who rewrote a row and
  recomputed every hash after it; a root cannot say which row of its range changed, so such a
  problem is reported at the range's first seq.

`first_bad_seq` is the lowest seq any problem points at: everything before it is proven intact
(by the chain, and by signed checkpoints as far as they reach).  Rows after the last checkpoint
are protected by the chain alone (`chain_only_*`): an attacker who can write the database can
truncate or rewrite them undetected, so checkpoint often and keep copies of checkpoints off the
machine.  With `first_seq`/`last_seq` the range is widened to whole checkpoint ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .chain import GENESIS, columns, row_hash
from .checkpoint import (
    Checkpoint,
    check_signature,
    checkpoint_from_row,
    checkpoint_hash,
    range_root,
    trusted_by_id,
)
from .event import decode_event
from .schema import audit_checkpoints, audit_events

__all__ = ["Problem", "Reason", "VerifyReport", "verify"]

Reason = Literal[
    "gap",
    "prev_hash_mismatch",
    "row_hash_mismatch",
    "body_invalid",
    "column_mismatch",
    "checkpoint_missing",
    "checkpoint_link_mismatch",
    "checkpoint_range_invalid",
    "checkpoint_bad_signature",
    "checkpoint_untrusted_key",
    "checkpoint_root_mismatch",
]
_CHAIN_REASONS = frozenset(
    {"gap", "prev_hash_mismatch", "row_hash_mismatch", "body_invalid", "column_mismatch"}
)
_PAGE = 2000
MAX_PROBLEMS = 1000


class Problem(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finding: the seq it concerns (a checkpoint's first seq) and why."""

    seq: int
    reason: Reason
    checkpoint_id: int | None = None


class VerifyReport(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool  # no problem at all
    first_seq: int | None  # the range examined (None: the log is empty)
    last_seq: int | None
    rows: int  # rows read in the range
    gaps: list[tuple[int, int]]  # missing seq ranges, inclusive
    chain_ok: bool
    first_bad_seq: int | None
    reason: Reason | None  # why first_bad_seq is bad
    problems: list[Problem]  # in seq order, at most MAX_PROBLEMS
    problem_count: int
    checkpoints_checked: int
    checkpoints_failed: int
    checkpoints_untrusted: int
    chain_only_from: int | None  # first row after the last checkpoint
    chain_only_rows: int


def _earlier(found: Problem, best: Problem | None) -> bool:
    """Lower seq first; at the same seq a row's own problem says more than its range's."""
    if best is None or found.seq < best.seq:
        return True
    return (
        found.seq == best.seq
        and found.reason in _CHAIN_REASONS
        and best.reason not in _CHAIN_REASONS
    )


class _Checker:
    """The state of one pass over the rows in seq order."""

    def __init__(self, checkpoints: list[Checkpoint], prev: str | None, first: int) -> None:
        self.problems: list[Problem] = []
        self.problem_count = 0
        self.first_bad: Problem | None = None
        self.gaps: list[tuple[int, int]] = []
        self.rows = 0
        self.expected = first
        self.prev = prev  # None: the predecessor is unknown (first row of a partial range)
        self.checkpoints = checkpoints
        self.cp_index = 0
        self.cp_hashes: list[str] = []
        self.failed_checkpoints: set[int] = set()

    def problem(self, seq: int, reason: Reason, checkpoint_id: int | None = None) -> None:
        found = Problem(seq=seq, reason=reason, checkpoint_id=checkpoint_id)
        self.problem_count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(found)
        if _earlier(found, self.first_bad):
            self.first_bad = found
        if checkpoint_id is not None and reason != "checkpoint_untrusted_key":
            self.failed_checkpoints.add(checkpoint_id)

    def gap(self, first: int, last: int) -> None:
        if len(self.gaps) < MAX_PROBLEMS:
            self.gaps.append((first, last))
        self.problem(first, "gap")
        self.prev = None

    def row(self, row: Row[Any]) -> None:
        seq = int(row.seq)
        self._close_checkpoints(seq)
        if seq > self.expected:
            self.gap(self.expected, seq - 1)
        self.expected = seq + 1
        self.rows += 1
        body = str(row.body).encode("utf-8")
        if self.prev is not None and row.prev_hash != self.prev:
            self.problem(seq, "prev_hash_mismatch")
        elif row_hash(str(row.prev_hash), seq, int(row.ts_us), body) != row.row_hash:
            self.problem(seq, "row_hash_mismatch")
        else:
            try:
                event = decode_event(body)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.problem(seq, "body_invalid")
            else:
                stored = {name: getattr(row, name) for name in _COLUMN_NAMES}
                if columns(event) != stored:
                    self.problem(seq, "column_mismatch")
        self.prev = str(row.row_hash)
        if self.cp_index < len(self.checkpoints):
            cp = self.checkpoints[self.cp_index]
            if cp.first_seq <= seq <= cp.last_seq:
                self.cp_hashes.append(str(row.row_hash))

    def finish(self, last: int) -> None:
        if self.expected <= last:
            self.gap(self.expected, last)
        self._close_checkpoints(None)

    def _close_checkpoints(self, seq: int | None) -> None:
        """Compare the roots of every checkpoint that ends before `seq` (all when None)."""
        while self.cp_index < len(self.checkpoints):
            cp = self.checkpoints[self.cp_index]
            if seq is not None and seq <= cp.last_seq:
                return
            if range_root(self.cp_hashes) != cp.merkle_root:
                self.problem(cp.first_seq, "checkpoint_root_mismatch", cp.id)
            self.cp_hashes = []
            self.cp_index += 1


_COLUMN_NAMES = ("event_id", "ts_us", "kind", "key_id", "team", "model", "outcome", "http_status")


def _check_checkpoint_chain(
    all_checkpoints: list[Checkpoint],
    relevant: set[int],
    trusted: Mapping[str, Ed25519PublicKey],
    checker: _Checker,
) -> int:
    """Signatures, links and contiguity; returns how many checkpoints were untrusted."""
    untrusted = 0
    prev: Checkpoint | None = None
    for cp in all_checkpoints:
        if cp.id in relevant:
            expected_first = prev.last_seq + 1 if prev else 1
            expected_id = prev.id + 1 if prev else 1
            if cp.first_seq != expected_first or cp.id != expected_id:
                checker.problem(min(cp.first_seq, expected_first), "checkpoint_missing", cp.id)
            elif cp.prev_hash != checkpoint_hash(prev):
                checker.problem(cp.first_seq, "checkpoint_link_mismatch", cp.id)
            if cp.count != cp.last_seq - cp.first_seq + 1 or cp.count < 1:
                checker.problem(cp.first_seq, "checkpoint_range_invalid", cp.id)
            signature = check_signature(cp, trusted)
            if signature == "untrusted_key":
                untrusted += 1
                checker.problem(cp.first_seq, "checkpoint_untrusted_key", cp.id)
            elif signature == "bad_signature":
                checker.problem(cp.first_seq, "checkpoint_bad_signature", cp.id)
        prev = cp
    return untrusted


async def _read_rows(conn: AsyncConnection, first: int, last: int, checker: _Checker) -> None:
    after = first - 1
    while after < last:
        query = (
            select(audit_events)
            .where(audit_events.c.seq > after, audit_events.c.seq <= last)
            .order_by(audit_events.c.seq)
            .limit(_PAGE)
        )
        rows = (await conn.execute(query)).all()
        if not rows:
            break
        for row in rows:
            checker.row(row)
        after = int(rows[-1].seq)


async def verify(
    engine: AsyncEngine,
    trusted_keys: Iterable[Ed25519PublicKey],
    *,
    first_seq: int | None = None,
    last_seq: int | None = None,
) -> VerifyReport:
    """Check the chain and the checkpoints over the whole log or `first_seq..last_seq`."""
    trusted = trusted_by_id(trusted_keys)
    async with engine.connect() as conn:
        cp_rows = await conn.execute(select(audit_checkpoints).order_by(audit_checkpoints.c.id))
        checkpoints = [checkpoint_from_row(r) for r in cp_rows.all()]
        max_seq = (await conn.execute(select(func.max(audit_events.c.seq)))).scalar()
        top = max(int(max_seq or 0), checkpoints[-1].last_seq if checkpoints else 0)
        first = max(1, first_seq or 1)
        last = min(top, last_seq) if last_seq is not None else top
        for cp in checkpoints:  # widen to whole checkpoint ranges
            if cp.first_seq <= first <= cp.last_seq:
                first = cp.first_seq
            if cp.first_seq <= last <= cp.last_seq:
                last = min(cp.last_seq, top)
        if first > last:
            return _report(_Checker([], None, first), None, None, checkpoints, 0, 0)
        prev: str | None = GENESIS
        if first > 1:
            prev_row = await conn.execute(
                select(audit_events.c.row_hash).where(audit_events.c.seq == first - 1)
            )
            prev = prev_row.scalar()
        relevant = [cp for cp in checkpoints if cp.first_seq >= first and cp.last_seq <= last]
        checker = _Checker(relevant, prev, first)
        untrusted = _check_checkpoint_chain(
            checkpoints, {cp.id for cp in relevant}, trusted, checker
        )
        await _read_rows(conn, first, last, checker)
        checker.finish(last)
    return _report(checker, first, last, checkpoints, len(relevant), untrusted)


def _report(
    checker: _Checker,
    first: int | None,
    last: int | None,
    checkpoints: list[Checkpoint],
    checked: int,
    untrusted: int,
) -> VerifyReport:
    covered = checkpoints[-1].last_seq if checkpoints else 0
    chain_only = max(0, (last or 0) - max(covered, (first or 1) - 1))
    problems = sorted(checker.problems, key=lambda p: p.seq)
    first_bad = checker.first_bad
    return VerifyReport(
        ok=checker.problem_count == 0,
        first_seq=first,
        last_seq=last,
        rows=checker.rows,
        gaps=checker.gaps,
        chain_ok=not any(p.reason in _CHAIN_REASONS for p in checker.problems),
        first_bad_seq=first_bad.seq if first_bad else None,
        reason=first_bad.reason if first_bad else None,
        problems=problems,
        problem_count=checker.problem_count,
        checkpoints_checked=checked,
        checkpoints_failed=len(checker.failed_checkpoints),
        checkpoints_untrusted=untrusted,
        chain_only_from=(last or 0) - chain_only + 1 if chain_only else None,
        chain_only_rows=chain_only,
    )
