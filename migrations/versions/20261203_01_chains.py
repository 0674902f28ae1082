"""The audit log becomes a set of chains, one per writer: `audit_events.log_id`, and both
tables keyed by (log_id, seq) / (log_id, id).

Replicas on one database each append to their own chain, with its own sequence, checkpoints
and signing key, instead of racing for the next seq of a shared one.  The rows of an existing
log join the chain its checkpoints already name (its `log_id`), so a single gateway continues
the same chain after the upgrade.  The filter indexes now follow the merged order of the
compliance search (time, then chain and seq).

SQLite rebuilds both tables (a primary key cannot be altered there) and recreates their
append-only triggers, the INSERT-order ones now per chain.  PostgreSQL alters them in place;
the one UPDATE that fills the new column runs with the append-only trigger disabled, inside
the migration's transaction (only the tables' owner can do that, which is the point of running
migrations as a separate owner role).

Revision ID: 20261203_01_chains
Revises: 20261202_01_tamper
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "20261203_01_chains"
down_revision: str | None = "20261202_01_tamper"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_INDEXES = (["ts_us"], ["key_id", "seq"], ["team", "seq"], ["model", "seq"], ["kind", "seq"])
_NEW_INDEXES = (
    ["ts_us", "log_id", "seq"],
    ["key_id", "ts_us"],
    ["team", "ts_us"],
    ["model", "ts_us"],
    ["kind", "ts_us"],
    ["outcome", "ts_us"],
)
_EVENT_COLUMNS = (
    "seq, event_id, ts_us, kind, key_id, team, model, outcome, http_status, body, prev_hash, "
    "row_hash"
)
_CHECKPOINT_COLUMNS = (
    "log_id, id, epoch, kind, first_seq, last_seq, count, merkle_root, prev_hash, ts_us, alg, "
    "key_id, signature, frontier"
)
_EXISTING_LOG = "COALESCE((SELECT MIN(log_id) FROM {table}), '')"


def _events_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("log_id", sa.String(length=32), nullable=False),
        sa.Column("seq", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("event_id", sa.String(length=64), nullable=False),
        sa.Column("ts_us", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key_id", sa.String(length=128), nullable=True),
        sa.Column("team", sa.String(length=128), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("http_status", sa.SmallInteger(), nullable=True),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("row_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("log_id", "seq", name=op.f("pk_audit_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_audit_events_event_id")),
    )


def _checkpoints_table(name: str) -> None:
    op.create_table(
        name,
        sa.Column("log_id", sa.String(length=32), nullable=False),
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("merkle_root", sa.String(length=64), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("ts_us", sa.BigInteger(), nullable=False),
        sa.Column("alg", sa.String(length=24), nullable=False),
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=False),
        sa.Column("frontier", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("log_id", "id", name=op.f("pk_audit_checkpoints")),
    )


def _indexes() -> None:
    for cols in _NEW_INDEXES:
        op.create_index(op.f("ix_audit_events_" + "_".join(cols)), "audit_events", cols)
    op.create_index(
        op.f("ix_audit_checkpoints_log_id_last_seq"), "audit_checkpoints", ["log_id", "last_seq"]
    )


def _sqlite() -> None:
    op.execute("ALTER TABLE audit_events RENAME TO audit_events_v2")
    op.execute("ALTER TABLE audit_checkpoints RENAME TO audit_checkpoints_v2")
    for cols in _OLD_INDEXES:  # index names are global in SQLite: free them
        op.execute(f"DROP INDEX IF EXISTS ix_audit_events_{'_'.join(cols)}")
    op.execute("DROP INDEX IF EXISTS ix_audit_events_outcome_seq")
    op.execute("DROP INDEX IF EXISTS ix_audit_checkpoints_last_seq")
    _events_table("audit_events")
    _checkpoints_table("audit_checkpoints")
    existing = _EXISTING_LOG.format(table="audit_checkpoints_v2")
    op.execute(
        f"INSERT INTO audit_events (log_id, {_EVENT_COLUMNS}) "
        f"SELECT {existing}, {_EVENT_COLUMNS} FROM audit_events_v2 ORDER BY seq"
    )
    op.execute(
        f"INSERT INTO audit_checkpoints ({_CHECKPOINT_COLUMNS}) "
        f"SELECT {_CHECKPOINT_COLUMNS} FROM audit_checkpoints_v2 ORDER BY id"
    )
    op.execute("DROP TABLE audit_events_v2")  # its triggers go with it
    op.execute("DROP TABLE audit_checkpoints_v2")
    _indexes()
    for table in ("audit_events", "audit_checkpoints"):
        for verb in ("update", "delete"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )
    op.execute(
        "CREATE TRIGGER audit_events_in_order BEFORE INSERT ON audit_events "
        "WHEN NEW.seq != (SELECT COALESCE(MAX(seq), 0) + 1 FROM audit_events "
        "WHERE log_id = NEW.log_id) "
        "BEGIN SELECT RAISE(ABORT, 'audit_events: seq is not the head + 1'); END"
    )
    op.execute(
        "CREATE TRIGGER audit_checkpoints_in_order BEFORE INSERT ON audit_checkpoints "
        "WHEN NEW.id != (SELECT COALESCE(MAX(id), 0) + 1 FROM audit_checkpoints "
        "WHERE log_id = NEW.log_id) "
        "BEGIN SELECT RAISE(ABORT, 'audit_checkpoints: id is not the head + 1'); END"
    )


def _postgresql() -> None:
    trigger = "audit_events_no_update_delete"
    op.execute("ALTER TABLE audit_events ADD COLUMN log_id VARCHAR(32) NOT NULL DEFAULT ''")
    op.execute(f"ALTER TABLE audit_events DISABLE TRIGGER {trigger}")
    existing = _EXISTING_LOG.format(table="audit_checkpoints")
    op.execute(f"UPDATE audit_events SET log_id = {existing}")
    op.execute(f"ALTER TABLE audit_events ENABLE TRIGGER {trigger}")
    op.execute("ALTER TABLE audit_events ALTER COLUMN log_id DROP DEFAULT")
    op.execute("ALTER TABLE audit_events DROP CONSTRAINT pk_audit_events")
    op.execute("ALTER TABLE audit_events ADD CONSTRAINT pk_audit_events PRIMARY KEY (log_id, seq)")
    op.execute("ALTER TABLE audit_checkpoints DROP CONSTRAINT pk_audit_checkpoints")
    op.execute(
        "ALTER TABLE audit_checkpoints ADD CONSTRAINT pk_audit_checkpoints PRIMARY KEY (log_id, id)"
    )
    for cols in (*_OLD_INDEXES, ["outcome", "seq"]):
        op.drop_index(op.f("ix_audit_events_" + "_".join(cols)), table_name="audit_events")
    op.drop_index(op.f("ix_audit_checkpoints_last_seq"), table_name="audit_checkpoints")
    _indexes()


def upgrade() -> None:
    if op.get_context().dialect.name == "sqlite":
        _sqlite()
    else:
        _postgresql()


def downgrade() -> None:
    raise RuntimeError("the audit log cannot be downgraded: its chains would merge")
