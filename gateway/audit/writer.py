"""A chain's one writer: a task that owns the chain head and commits events in groups.

Each writer appends to its own chain (`log_id`) of the shared tables; replicas on one database
never contend for a sequence number.  On PostgreSQL the writer holds a session advisory lock
on its chain for as long as it runs (`_lease.py`), so a second process configured with the same
chain is refused at start instead of racing this one.

Appenders put `(event, future)` on a queue and await the future; the writer takes everything
queued (up to `batch_max`), extends the chain head with it (`_head.py`: the next sequence
numbers, the row hashes, the tree head), signs a checkpoint over the new tree (and one per
`checkpoint_every` rows inside a large batch), inserts rows and checkpoints in ONE transaction,
and resolves the futures only after COMMIT returned.  Whatever arrives while a commit runs goes
into the next one: group commit, so a thousand concurrent requests cost a handful of fsyncs
and signatures, not a thousand.  No row is ever stored without its signed checkpoint.

Start: the head is read back and checked (`read_head`), then held against every witness
(`opening.check_opening`): a log shorter than, diverging from, or an epoch behind what a witness
holds does not start.  Then an `open` checkpoint ("opened at size N") is signed, stored and
published.  `stop()` commits what is queued and signs a `close` checkpoint.  Witnesses receive
the latest checkpoint at most every `witness_interval_s` (each one vouches for all before it),
and the open and close ones at once.

Failure: if a transaction fails, every event in it raises `AuditUnavailable` and the writer
forgets its head; the next batch re-reads the head from the database (which also repairs the
case where COMMIT succeeded but its answer was lost).  A conflicting `seq` (another process
appended) is retried on the re-read head; an `event_id` already stored fails that event alone
(`AuditRejected`), unless the stored event is the same one: then it succeeds with its seq.
Driver errors are logged by class name only (their messages can carry statement parameters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from types import TracebackType

import msgspec
from sqlalchemy import insert, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import Signer

from ._head import Head, Signing, extend, read_head, seal
from ._lease import ChainLease
from ._sqlite_batch import SqliteBatchWriter
from .checkpoint import Checkpoint, CheckpointKind, signed
from .errors import AuditCorrupt, AuditRejected, AuditUnavailable
from .event import AuditEvent, encode_event
from .opening import check_opening
from .publisher import Publisher
from .schema import audit_checkpoints, audit_events
from .witness import Witness

__all__ = ["AuditWriter", "WriterStats"]

_log = logging.getLogger("airgate.audit")
_RETRIES = 3
_Item = tuple[AuditEvent, "asyncio.Future[int] | None"]


class WriterStats(msgspec.Struct, kw_only=True):
    """Counters for metrics and tests (mutated by the writer's tasks only)."""

    appended: int = 0  # events committed
    batches: int = 0  # transactions that committed events
    max_batch: int = 0
    checkpoints: int = 0
    failures: int = 0  # transactions that failed
    rejected: int = 0
    dropped: int = 0  # append_nowait events not queued (writer stopped or queue full)


class AuditWriter:
    """Appends events to the audit chain.  Use as `async with AuditWriter(...) as writer:` or
    `start()` / `stop()`; `stop()` commits everything queued and signs a close checkpoint."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        signer: Signer,
        log_id: str,
        witnesses: Sequence[Witness] = (),
        checkpoint_every: int = 1000,
        witness_interval_s: float = 1.0,
        batch_max: int = 512,
        queue_max: int = 65536,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if checkpoint_every < 1 or batch_max < 1 or queue_max < 1:
            raise ValueError("checkpoint_every, batch_max and queue_max must be > 0")
        self._engine = engine
        self._signer = signer
        key = signer.verify_key
        self.signing = Signing(log_id=log_id, alg=key.alg, key_id=key.key_id)
        self.publisher = Publisher(witnesses, witness_interval_s)
        self._every = checkpoint_every
        self._batch_max = batch_max
        self._clock = clock
        self._queue: asyncio.Queue[_Item | None] = asyncio.Queue(queue_max)
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._head: Head | None = None
        self._sqlite: SqliteBatchWriter | None = None  # SQLite: batches in one thread hop
        self._lease = ChainLease(engine, log_id)
        self.stats = WriterStats()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self, *, genesis: bool = True, check: bool = True) -> None:
        """Check the stored log against the witnesses, sign the open checkpoint and start.
        `genesis=False` refuses an empty log (the data directory says one existed);
        `check=False` skips both (a new epoch, which marks its own).  Raises `AuditCorrupt`
        (the message says what is wrong and what to do), `AuditChainBusy` (another process
        writes this chain) or `AuditUnavailable`."""
        if self._task is not None:
            raise RuntimeError("the audit writer is already running")
        self._closing = False
        await self._lease.acquire()
        try:
            head = await self._load_head()
            if check:
                await check_opening(
                    self._engine, head, self.signing, self.witnesses, genesis=genesis
                )
            self._sqlite = await SqliteBatchWriter.for_engine(self._engine)
            self._head = head
            if check:
                await self.mark("open")
        except BaseException:
            if self._sqlite is not None:
                await self._sqlite.close()
                self._sqlite = None
            await self._lease.release()
            raise
        self._task = asyncio.create_task(self._run(), name="audit-writer")
        self.publisher.start()

    async def stop(self) -> None:
        """Commit what is queued, sign the close checkpoint, publish it, stop.  Idempotent."""
        task = self._task
        if task is None:
            return
        self._closing = True
        if not task.done():
            await self._queue.put(None)
        try:
            await task
            await self.publisher.stop()  # the close checkpoint is published in order, last
            if self._head is not None or await self._reload():
                await self.mark("close")
        finally:
            self._task = None
            self._fail_queued()
            await self.publisher.stop()
            await self.publisher.publish_now()
            if self._sqlite is not None:
                await self._sqlite.close()
                self._sqlite = None
            await self._lease.release()

    async def __aenter__(self) -> AuditWriter:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    @property
    def witnesses(self) -> tuple[Witness, ...]:
        return self.publisher.witnesses

    @property
    def head(self) -> Head | None:
        return self._head

    # -- appending -------------------------------------------------------------------------

    async def append(self, event: AuditEvent) -> int:
        """The event's sequence number, once the transaction holding it has committed.
        Raises `AuditUnavailable` (not durable) or `AuditRejected`.  If the caller is
        cancelled, the event is still written."""
        if not self.running:
            raise AuditUnavailable("the audit writer is not running")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        await self._queue.put((event, future))
        if self._task is None or self._task.done():
            self._fail_queued()  # the writer ended while this append waited for queue space
        return await future

    def append_nowait(self, event: AuditEvent) -> None:
        """Queue an event without waiting (best effort: dropped and counted when the writer is
        stopped or its queue is full)."""
        if not self.running:
            self.stats.dropped += 1
            return
        try:
            self._queue.put_nowait((event, None))
        except asyncio.QueueFull:
            self.stats.dropped += 1
            _log.warning("audit queue full: event dropped (%d so far)", self.stats.dropped)

    # -- marks: open, close, epoch -----------------------------------------------------------

    async def mark(self, kind: CheckpointKind, *, epoch: int | None = None) -> Checkpoint:
        """Sign and store an open/close/epoch checkpoint at the head, and publish it now
        (a witness that cannot be written is logged, not fatal).  Never while appends are
        in flight: at start, at stop, or (a new epoch) before the first append."""
        head = self._head or await self._reload()
        if head is None:
            raise AuditUnavailable("the audit log is unavailable")
        unsigned = seal(head, kind, ts_us=self._ts_us(), signing=self.signing, epoch=epoch)
        (checkpoint,) = await self._sign([unsigned])
        try:
            async with self._engine.begin() as conn:
                await conn.execute(insert(audit_checkpoints), [checkpoint.row(head.tree.stack)])
        except Exception as exc:
            self._head = None
            _log.error("audit %s checkpoint failed (%s)", kind, _describe(exc))
            raise AuditUnavailable("the audit log is unavailable") from exc
        self._head = msgspec.structs.replace(head, checkpoint=checkpoint)
        self.stats.checkpoints += 1
        await self.publisher.publish_now(checkpoint)
        return checkpoint

    # -- the task --------------------------------------------------------------------------

    async def _run(self) -> None:
        getter: asyncio.Future[_Item | None] | None = None
        try:
            while True:
                getter = asyncio.ensure_future(self._queue.get())
                first = await getter
                getter = None
                batch: list[_Item] = []
                stopping = first is None
                if first is not None:
                    batch.append(first)
                while not stopping and len(batch) < self._batch_max:
                    try:
                        item = self._queue.get_nowait()
                    except asyncio.QueueEmpty:
                        break
                    if item is None:
                        stopping = True
                    else:
                        batch.append(item)
                if batch:
                    try:
                        await self._commit(batch)
                    except asyncio.CancelledError:
                        self._fail(batch, asyncio.CancelledError())
                        raise
                if stopping:
                    return
        finally:
            if getter is not None and not getter.cancel():
                # the getter had already taken an item: put it back for _fail_queued
                with contextlib.suppress(BaseException):
                    if (item := getter.result()) is not None:
                        self._queue.put_nowait(item)
            self._fail_queued()

    def _fail_queued(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if item is not None:
                _settle(item[1], AuditUnavailable("the audit writer stopped"))

    def _ts_us(self) -> int:
        return int(self._clock() * 1_000_000)

    async def _sign(self, checkpoints: Sequence[Checkpoint]) -> list[Checkpoint]:
        def sign_all() -> list[Checkpoint]:
            return [signed(c, self._signer.sign(c.message())) for c in checkpoints]

        if self._signer.local:
            return sign_all()
        return await asyncio.to_thread(sign_all)

    async def _commit(self, batch: list[_Item]) -> None:
        for attempt in range(_RETRIES):
            try:
                head = self._head or await self._load_head()
                self._head = head
                rows, unsigned, new_head = extend(
                    head,
                    [event for event, _ in batch],
                    every=self._every,
                    ts_us=self._ts_us(),
                    signing=self.signing,
                )
                checkpoints = await self._sign([c for c, _ in unsigned])
                cp_rows = [
                    c.row(frontier) for c, (_, frontier) in zip(checkpoints, unsigned, strict=True)
                ]
                if self._sqlite is not None:
                    await self._sqlite.write(rows, cp_rows)
                else:
                    async with self._engine.begin() as conn:
                        await conn.execute(insert(audit_events), rows)
                        await conn.execute(insert(audit_checkpoints), cp_rows)
            except IntegrityError:
                # another writer took these seq numbers, or an event_id is already stored
                self._head = None
                try:
                    batch = await self._settle_duplicates(batch)
                except Exception as exc:
                    self._fail(batch, exc)
                    return
                if not batch:
                    return
                continue
            except AuditCorrupt as exc:
                self._fail(batch, exc)
                return
            except DBAPIError as exc:
                # a pooled connection the server had closed (restart, failover): the pool is
                # invalidated, so one retry on a fresh connection decides; a COMMIT whose answer
                # was lost is caught by the re-read head and the duplicate check
                self._head = None
                if exc.connection_invalidated and attempt == 0:
                    continue
                self._fail(batch, exc)
                return
            except Exception as exc:
                self._fail(batch, exc)
                return
            new_head = msgspec.structs.replace(new_head, checkpoint=checkpoints[-1])
            self._committed(head, new_head, batch, len(checkpoints))
            return
        self._fail(batch, RuntimeError("the audit chain kept moving under this writer"))

    def _committed(self, head: Head, new_head: Head, batch: list[_Item], cps: int) -> None:
        self._head = new_head
        self.publisher.offer(new_head.checkpoint)
        seq = head.seq
        for _, future in batch:
            seq += 1
            _settle(future, seq)
        self.stats.appended += len(batch)
        self.stats.batches += 1
        self.stats.max_batch = max(self.stats.max_batch, len(batch))
        self.stats.checkpoints += cps

    def _fail(self, batch: Sequence[_Item], exc: BaseException) -> None:
        self._head = None
        self.stats.failures += 1
        # the class name only: driver messages can carry the statement's parameters
        _log.error("audit write failed (%s): %d events not stored", _describe(exc), len(batch))
        for _, future in batch:
            _settle(future, AuditUnavailable("the audit log is unavailable"))

    async def _settle_duplicates(self, batch: list[_Item]) -> list[_Item]:
        """Take out of `batch` the events whose event_id is stored: the same event (a retried
        append, or a commit whose answer was lost) succeeds with its stored seq, a different
        one is rejected.  Returns the rest."""
        ids = [event.event_id for event, _ in batch]
        async with self._engine.connect() as conn:
            result = await conn.execute(
                select(audit_events.c.event_id, audit_events.c.seq, audit_events.c.body).where(
                    audit_events.c.event_id.in_(ids)
                )
            )
            stored = {row.event_id: (int(row.seq), str(row.body)) for row in result}
        seen: set[str] = set()
        kept: list[_Item] = []
        for event, future in batch:
            found = stored.get(event.event_id)
            if found is not None and found[1] == encode_event(event).decode("utf-8"):
                _settle(future, found[0])
            elif found is not None or event.event_id in seen:
                self.stats.rejected += 1
                _settle(future, AuditRejected("this event_id is already in the audit log"))
            else:
                seen.add(event.event_id)
                kept.append((event, future))
        return kept

    async def _reload(self) -> Head | None:
        try:
            self._head = await self._load_head()
        except (AuditCorrupt, AuditUnavailable):
            return None
        return self._head

    async def _load_head(self) -> Head:
        try:
            return await read_head(self._engine, self.signing.log_id)
        except AuditCorrupt:
            raise
        except Exception as exc:
            _log.error("audit head unreadable (%s)", _describe(exc))
            raise AuditUnavailable("the audit log is unavailable") from exc


def _settle(future: asyncio.Future[int] | None, outcome: int | BaseException) -> None:
    if future is None or future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _describe(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return type(exc).__name__ + (f"/{type(orig).__name__}" if orig is not None else "")
