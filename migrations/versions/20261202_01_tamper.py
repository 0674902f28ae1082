"""Audit checkpoints become signed tree heads (RFC 6962 root over the whole log, chained,
with the log's identity and epoch); SQLite refuses out-of-order INSERTs.

`audit_checkpoints` is recreated with the new columns (`log_id`, `epoch`, `kind`, `alg`,
`frontier`; `last_seq` is the tree size and no longer unique, since the open and close
checkpoints of an idle run share a size).  A log that already holds checkpoints of the first
format is refused: verify and export it with the release that wrote it, keep that export, and
start this one on a new database.

SQLite also gets INSERT triggers that refuse a row whose `seq` (or checkpoint `id`) is not the
current head + 1: defence in depth against a forged append; verification stays the guarantee.

Revision ID: 20261202_01_tamper
Revises: 20261129_02_api_keys
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "20261202_01_tamper"
down_revision: str | None = "20261129_02_api_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PG_FUNCTION = "airgate_audit_append_only"


def _create_checkpoints() -> None:
    op.create_table(
        "audit_checkpoints",
        sa.Column("id", sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column("log_id", sa.String(length=32), nullable=False),
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
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_checkpoints")),
    )
    op.create_index(op.f("ix_audit_checkpoints_last_seq"), "audit_checkpoints", ["last_seq"])


def _append_only(dialect: str) -> None:
    table = "audit_checkpoints"
    if dialect == "sqlite":
        for verb in ("update", "delete"):
            op.execute(
                f"CREATE TRIGGER {table}_no_{verb} BEFORE {verb.upper()} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )
    elif dialect == "postgresql":
        op.execute(
            f"CREATE TRIGGER {table}_no_update_delete BEFORE UPDATE OR DELETE ON {table} "
            f"FOR EACH ROW EXECUTE FUNCTION {_PG_FUNCTION}()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {_PG_FUNCTION}()"
        )


def upgrade() -> None:
    offline = op.get_context().as_sql  # `alembic upgrade --sql`: the DBA checks first
    if (
        not offline
        and op.get_bind().execute(sa.text("SELECT COUNT(*) FROM audit_checkpoints")).scalar()
    ):
        raise RuntimeError(
            "this audit log has checkpoints of the first format: verify and export it with "
            "the release that wrote it, then start this release on a new database"
        )
    op.drop_table("audit_checkpoints")  # its triggers go with it
    _create_checkpoints()
    dialect = op.get_context().dialect.name
    _append_only(dialect)
    if dialect == "sqlite":
        op.execute(
            "CREATE TRIGGER audit_events_in_order BEFORE INSERT ON audit_events "
            "WHEN NEW.seq != (SELECT COALESCE(MAX(seq), 0) + 1 FROM audit_events) "
            "BEGIN SELECT RAISE(ABORT, 'audit_events: seq is not the head + 1'); END"
        )
        op.execute(
            "CREATE TRIGGER audit_checkpoints_in_order BEFORE INSERT ON audit_checkpoints "
            "WHEN NEW.id != (SELECT COALESCE(MAX(id), 0) + 1 FROM audit_checkpoints) "
            "BEGIN SELECT RAISE(ABORT, 'audit_checkpoints: id is not the head + 1'); END"
        )


def downgrade() -> None:
    raise RuntimeError("the audit log cannot be downgraded: its checkpoints would not verify")
