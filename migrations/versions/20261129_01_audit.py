"""Audit log: audit_events (the hash chain) and audit_checkpoints (signed Merkle roots),
both append-only.

SQLite: triggers reject UPDATE and DELETE.  PostgreSQL: a trigger function rejects UPDATE,
DELETE and TRUNCATE; also grant the gateway's role only SELECT and INSERT on both tables and
keep ownership with a separate migration role (an owner can drop triggers):

    GRANT SELECT, INSERT ON audit_events, audit_checkpoints TO airgate;

Downgrading drops the audit log.

Revision ID: 20261129_01_audit
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "20261129_01_audit"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("audit_events", "audit_checkpoints")
_PG_FUNCTION = "airgate_audit_append_only"


def upgrade() -> None:
    op.create_table(
        "audit_events",
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
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_events")),
        sa.UniqueConstraint("event_id", name=op.f("uq_audit_events_event_id")),
    )
    for cols in (
        ["ts_us"],
        ["key_id", "seq"],
        ["team", "seq"],
        ["model", "seq"],
        ["kind", "seq"],
        ["outcome", "seq"],
    ):
        op.create_index(op.f("ix_audit_events_" + "_".join(cols)), "audit_events", cols)
    op.create_table(
        "audit_checkpoints",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("first_seq", sa.BigInteger(), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("merkle_root", sa.String(length=64), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("ts_us", sa.BigInteger(), nullable=False),
        sa.Column("key_id", sa.String(length=16), nullable=False),
        sa.Column("signature", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_checkpoints")),
        sa.UniqueConstraint("last_seq", name=op.f("uq_audit_checkpoints_last_seq")),
    )
    dialect = op.get_context().dialect.name
    if dialect == "sqlite":
        for table in TABLES:
            for verb in ("update", "delete"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
                )
    elif dialect == "postgresql":
        op.execute(
            f"CREATE FUNCTION {_PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "RAISE EXCEPTION USING MESSAGE = TG_TABLE_NAME || ' is append-only', "
            "ERRCODE = 'insufficient_privilege'; END $$"
        )
        for table in TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table} "
                f"FOR EACH ROW EXECUTE FUNCTION {_PG_FUNCTION}()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                f"FOR EACH STATEMENT EXECUTE FUNCTION {_PG_FUNCTION}()"
            )


def downgrade() -> None:
    op.drop_table("audit_checkpoints")  # drops its triggers too
    for cols in (
        ["outcome", "seq"],
        ["kind", "seq"],
        ["model", "seq"],
        ["team", "seq"],
        ["key_id", "seq"],
        ["ts_us"],
    ):
        op.drop_index(op.f("ix_audit_events_" + "_".join(cols)), table_name="audit_events")
    op.drop_table("audit_events")
    if op.get_context().dialect.name == "postgresql":
        op.execute(f"DROP FUNCTION {_PG_FUNCTION}()")
