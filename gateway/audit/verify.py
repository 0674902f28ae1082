"""Verify the audit log offline: the hash chains, the signed tree heads, and every witness.

The log is a set of chains, one per writer; each is verified on its own (`verify`), with its
own checkpoints and the witnesses' checkpoints of that chain, against the same pinned keys
(every replica's), and `verify_log` reports them all.  One code path for the compliance API
and the CLI; it only reads.  For a chain it reads the last seq first,
then the checkpoints, then the rows up to that seq: rows and their checkpoint commit together,
so every row it reads is covered by a checkpoint it has read.

Trust comes only from `trusted_keys` (pinned in configuration or named on the command line),
never from a key stored next to the data; the report lists the key ids it trusted.  An enrolled
device's key (`devices.DeviceKey`) vouches only for that device's chain, which no other key
does (`devices.chain_keys`); the chain's report names the device.

What each finding proves (`first_bad_seq` is the lowest seq any finding points at; 0 is the log
as a whole):
- chain (`gap`, `prev_hash_mismatch`, `row_hash_mismatch`, `body_invalid`, `column_mismatch`):
  the row at that seq was deleted, re-linked, edited, or its filter columns no longer match.
- checkpoints (`checkpoint_*`): the rows up to a signed size no longer hash to the signed tree
  root, a signature is invalid or from a key that is not pinned, or the chain of checkpoints is
  broken.  This is the evidence against an attacker who rewrote rows and recomputed the chain.
- `unsigned_row`: a row after the last checkpoint.  The writer never leaves one (rows commit
  with their checkpoint), so it was inserted by someone else.
- `no_checkpoint`: nothing signed at all (an empty log, or one stripped of its checkpoints).
- `append_only_missing`: the triggers that make the tables append-only were dropped.
- witnesses (`witness_truncated`, `witness_diverged`, `witness_rolled_back`,
  `witness_untrusted`): the log is shorter than a size a witness holds, its first N rows hash to
  another root than the witnessed tree head (the tree is recomputed from the rows at every
  witnessed size: a consistency check from each witnessed checkpoint to this log, with every
  leaf in hand), a witness holds a later epoch, or a witnessed checkpoint was not signed by a
  pinned key.  Checkpoints of an earlier epoch beyond where the next epoch began are reported
  as `epoch_losses`: the loss was declared (`airgate audit init --new-epoch`) and stays visible.
Findings about the whole log (seq 0) are named as `first_bad_seq` only when no row is.
With `first_seq`/`last_seq` only the chain in that range and the checkpoint signatures are
checked (`tree_checked` is false): tree heads and witnesses need every row from seq 1.
`progress(chain, rows_done, rows_total)`, if given, is called as each chain starts and after
every page of `_PAGE` rows (a million rows take about a minute: the console shows it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgspec
from sqlalchemy import Row, func, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from bundles.kms.signer import VerifyKey

from .chain import GENESIS, columns, row_hash
from .checkpoint import Checkpoint, check_signature, checkpoint_from_row, checkpoint_hash
from .devices import chain_keys
from .errors import InvalidQuery
from .event import decode_event
from .merkle import CompactTree
from .schema import append_only_intact, audit_checkpoints, audit_events
from .verify_report import (
    CHAIN_REASONS,
    MAX_PROBLEMS,
    EpochLoss,
    LogReport,
    Problem,
    Reason,
    VerifyReport,
    WitnessReport,
)
from .witness import latest_of

_PAGE = 2000
Progress = Callable[[str, int, int], None]  # (chain, rows done, rows to check)

__all__ = [
    "EpochLoss",
    "LogReport",
    "Problem",
    "Progress",
    "Reason",
    "VerifyReport",
    "WitnessReport",
    "chains",
    "verify",
    "verify_log",
]


class _Findings:
    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.count = 0
        self.first_bad: Problem | None = None  # the lowest seq named
        self.whole: Problem | None = None  # the first finding about the whole log
        self.failed_checkpoints: set[int] = set()

    def add(self, seq: int, reason: Reason, **extra: Any) -> None:
        found = Problem(seq=seq, reason=reason, **extra)
        self.count += 1
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(found)
        if seq == 0:  # about the log as a whole: reported only when no row is named
            self.whole = self.whole or found
        else:
            self._first(found)
        cp = extra.get("checkpoint_id")
        if cp is not None and reason != "checkpoint_untrusted_key":
            self.failed_checkpoints.add(cp)

    def _first(self, found: Problem) -> None:
        seq, reason = found.seq, found.reason
        best = self.first_bad
        if (
            best is None
            or seq < best.seq
            or (seq == best.seq and reason in CHAIN_REASONS and best.reason not in CHAIN_REASONS)
        ):
            self.first_bad = found


_COLUMN_NAMES = (
    "event_id", "ts_us", "kind", "key_id", "team", "model", "outcome", "http_status", "deployment",
)  # fmt: skip


class _Rows:
    """One pass over the rows in seq order: the chain, and the tree at the sizes asked for."""

    def __init__(self, found: _Findings, first: int, prev: str | None, sizes: set[int]) -> None:
        self.found = found
        self.expected = first
        self.prev = prev  # None: the predecessor is unknown (first row of a partial range)
        self.tree: CompactTree | None = CompactTree() if first == 1 else None
        self.sizes = sizes
        self.roots: dict[int, str] = {}
        self.rows = 0
        self.gaps: list[tuple[int, int]] = []
        if 0 in sizes and self.tree is not None:
            self.roots[0] = self.tree.root().hex()

    def gap(self, first: int, last: int) -> None:
        if len(self.gaps) < MAX_PROBLEMS:
            self.gaps.append((first, last))
        self.found.add(first, "gap")
        self.prev = None
        self.tree = None  # the tree over a log with holes proves nothing further

    def row(self, row: Row[Any]) -> None:
        seq = int(row.seq)
        if seq > self.expected:
            self.gap(self.expected, seq - 1)
        self.expected = seq + 1
        self.rows += 1
        body = str(row.body).encode("utf-8")
        if self.prev is not None and row.prev_hash != self.prev:
            self.found.add(seq, "prev_hash_mismatch")
        elif row_hash(str(row.prev_hash), seq, int(row.ts_us), body) != row.row_hash:
            self.found.add(seq, "row_hash_mismatch")
        else:
            try:
                event = decode_event(body)
            except (msgspec.DecodeError, msgspec.ValidationError):
                self.found.add(seq, "body_invalid")
            else:
                stored = {name: getattr(row, name) for name in _COLUMN_NAMES}
                if columns(event) != stored:
                    self.found.add(seq, "column_mismatch")
        self.prev = str(row.row_hash)
        if self.tree is not None:
            self.tree.append(bytes.fromhex(self.prev))
            if seq in self.sizes:
                self.roots[seq] = self.tree.root().hex()


def _check_checkpoints(
    checkpoints: list[Checkpoint], trusted: dict[str, VerifyKey], found: _Findings
) -> int:
    """Links, ranges and signatures; returns how many checkpoints were untrusted."""
    untrusted = 0
    prev: Checkpoint | None = None
    for cp in checkpoints:
        at = cp.first_seq if cp.count else max(cp.size, 1)
        first = prev.size + 1 if prev else 1
        if cp.id != (prev.id + 1 if prev else 1) or cp.first_seq != first:
            found.add(min(cp.first_seq, first), "checkpoint_missing", checkpoint_id=cp.id)
        elif cp.prev_hash != checkpoint_hash(prev):
            found.add(at, "checkpoint_link_mismatch", checkpoint_id=cp.id)
        epoch_ok = (
            (cp.epoch > prev.epoch if cp.kind == "epoch" else cp.epoch == prev.epoch)
            if prev is not None
            else True
        )
        if (
            cp.count != cp.size - cp.first_seq + 1
            or cp.count < 0
            or not epoch_ok
            or (prev is not None and cp.log_id != prev.log_id)
        ):
            found.add(at, "checkpoint_range_invalid", checkpoint_id=cp.id)
        signature = check_signature(cp, trusted)
        if signature == "untrusted_key":
            untrusted += 1
            found.add(at, "checkpoint_untrusted_key", checkpoint_id=cp.id)
        elif signature == "bad_signature":
            found.add(at, "checkpoint_bad_signature", checkpoint_id=cp.id)
        prev = cp
    return untrusted


def _check_witnesses(
    witnessed: Sequence[tuple[str, list[Checkpoint]]],
    checkpoints: list[Checkpoint],
    roots: dict[int, str],
    size: int,
    trusted: dict[str, VerifyKey],
    found: _Findings,
) -> tuple[list[WitnessReport], list[EpochLoss]]:
    log_id = checkpoints[0].log_id if checkpoints else None
    epoch = checkpoints[-1].epoch if checkpoints else 1
    # where each later epoch began: a witnessed checkpoint of an earlier epoch beyond it was lost
    began = {cp.epoch: cp.size for cp in reversed(checkpoints) if cp.kind == "epoch"}
    reports: list[WitnessReport] = []
    losses: dict[tuple[int, int], EpochLoss] = {}
    for name, kept in witnessed:
        mine = [cp for cp in kept if log_id is None or cp.log_id == log_id]
        before = found.count
        for cp in mine:
            where = {"witness": name, "witnessed_size": cp.size}
            if check_signature(cp, trusted) != "ok":
                found.add(0, "witness_untrusted", **where)
                continue
            if cp.epoch > epoch:
                found.add(0, "witness_rolled_back", **where)
                continue
            resumed = min((s for e, s in began.items() if e > cp.epoch), default=None)
            if resumed is not None and cp.size > resumed:
                loss = EpochLoss(epoch=cp.epoch, witnessed_size=cp.size, resumed_at=resumed)
                key = (cp.epoch, resumed)
                if key not in losses or losses[key].witnessed_size < cp.size:
                    losses[key] = loss
                continue
            if cp.size > size:
                found.add(size + 1, "witness_truncated", **where)
            elif cp.size in roots and roots[cp.size] != cp.root:
                found.add(max(cp.size, 1), "witness_diverged", **where)
        latest = latest_of(mine)
        reports.append(
            WitnessReport(
                name=name,
                checkpoints=len(mine),
                latest_epoch=latest.epoch if latest else None,
                latest_size=latest.size if latest else None,
                ok=found.count == before,
            )
        )
    return reports, list(losses.values())


async def chains(
    engine: AsyncEngine, witnesses: Sequence[tuple[str, list[Checkpoint]]] = ()
) -> list[str]:
    """The ids of every chain the log holds (a checkpoint or a row) or a witness saw, sorted:
    a chain deleted whole from the database is still verified, and fails, by its witnesses."""
    async with engine.connect() as conn:
        found = set((await conn.execute(select(audit_checkpoints.c.log_id).distinct())).scalars())
        found |= set((await conn.execute(select(audit_events.c.log_id).distinct())).scalars())
    found |= {cp.log_id for _, kept in witnesses for cp in kept}
    return sorted(str(log_id) for log_id in found)


async def verify_log(
    engine: AsyncEngine,
    trusted_keys: Iterable[VerifyKey],
    *,
    witnesses: Sequence[tuple[str, list[Checkpoint]]] = (),
    chain: str | None = None,
    first_seq: int | None = None,
    last_seq: int | None = None,
    progress: Progress | None = None,
) -> LogReport:
    """Every chain of the log (or only `chain`), each verified on its own (`verify`)."""
    keys = list(trusted_keys)
    names = [chain] if chain is not None else await chains(engine, witnesses)
    reports = [
        await verify(
            engine,
            keys,
            log_id=name,
            witnesses=witnesses,
            first_seq=first_seq,
            last_seq=last_seq,
            progress=progress,
        )
        for name in names
    ]
    return LogReport(
        ok=bool(reports) and all(r.ok for r in reports),
        chains=reports,
        problem_count=sum(r.problem_count for r in reports),
        trusted_keys=sorted(k.key_id for k in keys),
    )


async def verify(
    engine: AsyncEngine,
    trusted_keys: Iterable[VerifyKey],
    *,
    log_id: str | None = None,
    witnesses: Sequence[tuple[str, list[Checkpoint]]] = (),
    first_seq: int | None = None,
    last_seq: int | None = None,
    progress: Progress | None = None,
) -> VerifyReport:
    """Check chain `log_id` (None: the log's only chain) or its rows `first_seq..last_seq`
    against pinned keys and the checkpoints each witness kept (name, checkpoints)."""
    if log_id is None:
        found_chains = await chains(engine, witnesses)
        if len(found_chains) > 1:
            raise InvalidQuery("the log has several chains: name the one to verify")
        log_id = found_chains[0] if found_chains else ""
    bound, device = chain_keys(trusted_keys, log_id)
    trusted = {k.key_id: k for k in bound}
    found = _Findings()
    if not trusted:
        found.add(0, "no_trusted_key")
    ev, cps = audit_events.c, audit_checkpoints.c
    async with engine.connect() as conn:
        max_seq = int(
            (await conn.execute(select(func.max(ev.seq)).where(ev.log_id == log_id))).scalar() or 0
        )
        cp_rows = await conn.execute(
            select(audit_checkpoints).where(cps.log_id == log_id).order_by(cps.id)
        )
        checkpoints = [checkpoint_from_row(r) for r in cp_rows.all()]
        if not await append_only_intact(conn):
            found.add(0, "append_only_missing")
        size = checkpoints[-1].size if checkpoints else 0
        top = max(max_seq, size)
        first = max(1, first_seq or 1)
        last = min(top, last_seq) if last_seq is not None else top
        prev: str | None = GENESIS
        if first > 1:
            prev_row = await conn.execute(
                select(ev.row_hash).where(ev.log_id == log_id, ev.seq == first - 1)
            )
            prev = prev_row.scalar()
        sizes = {cp.size for cp in checkpoints} | {c.size for _, kept in witnesses for c in kept}
        rows = _Rows(found, first, prev, sizes)
        if progress is not None:
            progress(log_id, 0, max(0, last - first + 1))
        if first <= last:
            await _read(conn, log_id, first, last, rows, progress)
            if rows.expected <= last:
                rows.gap(rows.expected, last)
    if not checkpoints:
        found.add(0, "no_checkpoint")
    untrusted = _check_checkpoints(checkpoints, trusted, found)
    tree_checked = first == 1 and rows.tree is not None
    for cp in checkpoints:
        if cp.size in rows.roots and rows.roots[cp.size] != cp.root:
            found.add(max(cp.first_seq, 1), "checkpoint_root_mismatch", checkpoint_id=cp.id)
    unsigned = max(0, last - max(size, first - 1))
    if unsigned:
        found.add(last - unsigned + 1, "unsigned_row")
    mine = [(name, [c for c in kept if c.log_id == log_id]) for name, kept in witnesses]
    reports, losses = _check_witnesses(mine, checkpoints, rows.roots, max_seq, trusted, found)
    first_bad = found.first_bad or found.whole
    return VerifyReport(
        ok=found.count == 0,
        log_id=log_id,
        epoch=checkpoints[-1].epoch if checkpoints else None,
        first_seq=first if first <= last else None,
        last_seq=last if first <= last else None,
        rows=rows.rows,
        gaps=rows.gaps,
        chain_ok=not any(p.reason in CHAIN_REASONS for p in found.problems),
        tree_checked=tree_checked,
        first_bad_seq=first_bad.seq if first_bad else None,
        reason=first_bad.reason if first_bad else None,
        problems=sorted(found.problems, key=lambda p: p.seq),
        problem_count=found.count,
        trusted_keys=sorted(trusted),
        checkpoints_checked=len(checkpoints),
        checkpoints_failed=len(found.failed_checkpoints),
        checkpoints_untrusted=untrusted,
        witnesses=reports,
        epoch_losses=losses,
        chain_only_from=last - unsigned + 1 if unsigned else None,
        chain_only_rows=unsigned,
        device=device,
    )


async def _read(
    conn: AsyncConnection, log_id: str, first: int, last: int, rows: _Rows, tick: Progress | None
) -> None:
    after = first - 1
    ev = audit_events.c
    while after < last:
        query = (
            select(audit_events)
            .where(ev.log_id == log_id, ev.seq > after, ev.seq <= last)
            .order_by(ev.seq)
            .limit(_PAGE)
        )
        page = (await conn.execute(query)).all()
        if not page:
            break
        for row in page:
            rows.row(row)
        after = int(page[-1].seq)
        if tick is not None:
            tick(log_id, after - first + 1, last - first + 1)
