"""The audit tables, on the shared `gateway.db.metadata` (Alembic revisions `20261129_01_audit`,
`20261202_01_tamper`, `20261203_01_chains` and `20261204_01_deployment`).

The log is a set of chains, one per writer (`log_id`: each replica appends to its own, so
replicas never contend for a sequence number).  `audit_events` holds every chain's rows: `seq`
is assigned by the chain's one writer, gapless from 1; `body` is the event's canonical JSON
(TEXT, not JSONB: the chain hashes its exact bytes); the other columns copy values out of the
body for the compliance filters, which read the chains merged by time (`ts_us`, then chain and
seq).  `audit_checkpoints` holds each chain's signed tree heads (`checkpoint.py`).

Both tables are append-only.  The migrations add triggers that reject UPDATE and DELETE (and
TRUNCATE on PostgreSQL; on SQLite also an INSERT out of order); on PostgreSQL also grant the
gateway's role only SELECT and INSERT:

    GRANT SELECT, INSERT ON audit_events, audit_checkpoints TO airgate;

and let a separate owner role run migrations, since a table's owner can drop its triggers.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, SmallInteger, String, Table, Text, text
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.db import metadata

__all__ = ["append_only_intact", "audit_checkpoints", "audit_events"]

audit_events = Table(
    "audit_events",
    metadata,
    Column("log_id", String(32), primary_key=True),  # the chain
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("ts_us", BigInteger, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("key_id", String(128)),
    Column("team", String(128)),
    Column("model", String(128)),
    Column("outcome", String(16), nullable=False),
    Column("http_status", SmallInteger),
    Column("deployment", String(128)),
    Column("body", Text, nullable=False),
    Column("prev_hash", String(64), nullable=False),
    Column("row_hash", String(64), nullable=False),
    # the merged order, and each filter in that order
    Index(None, "ts_us", "log_id", "seq"),
    Index(None, "key_id", "ts_us"),
    Index(None, "team", "ts_us"),
    Index(None, "model", "ts_us"),
    Index(None, "kind", "ts_us"),
    Index(None, "outcome", "ts_us"),
    Index(None, "deployment", "ts_us"),
    Index(None, "kind", "outcome", "ts_us"),  # the console's two lists, chosen together
)

audit_checkpoints = Table(
    "audit_checkpoints",
    metadata,
    Column("log_id", String(32), primary_key=True),
    Column("id", BigInteger, primary_key=True, autoincrement=False),
    Column("epoch", Integer, nullable=False),
    Column("kind", String(8), nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),  # the tree size
    Column("count", Integer, nullable=False),
    Column("merkle_root", String(64), nullable=False),  # the tree root at last_seq
    Column("prev_hash", String(64), nullable=False),
    Column("ts_us", BigInteger, nullable=False),
    Column("alg", String(24), nullable=False),
    Column("key_id", String(16), nullable=False),
    Column("signature", String(128), nullable=False),
    Column("frontier", Text, nullable=False),  # the writer's cache: the tree's right edge
    Index(None, "log_id", "last_seq"),
)

_TRIGGERS = {
    "sqlite": {
        "audit_events_no_update",
        "audit_events_no_delete",
        "audit_events_in_order",
        "audit_checkpoints_no_update",
        "audit_checkpoints_no_delete",
        "audit_checkpoints_in_order",
    },
    "postgresql": {
        "audit_events_no_update_delete",
        "audit_events_no_truncate",
        "audit_checkpoints_no_update_delete",
        "audit_checkpoints_no_truncate",
    },
}


async def append_only_intact(conn: AsyncConnection) -> bool:
    """Whether every append-only trigger the migrations create is there and enabled."""
    dialect = conn.dialect.name
    expected = _TRIGGERS.get(dialect)
    if expected is None:
        return True
    if dialect == "sqlite":
        query = text("SELECT name FROM sqlite_master WHERE type = 'trigger'")
    else:
        query = text(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgenabled != 'D' "
            "AND tgrelid IN ('audit_events'::regclass, 'audit_checkpoints'::regclass)"
        )
    names = {str(name) for name in (await conn.execute(query)).scalars()}
    return expected <= names
