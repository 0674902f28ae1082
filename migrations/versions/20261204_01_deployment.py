"""The audit log can be searched by deployment: `audit_events.deployment`, a copy of the
event's `deployment` like the other filter columns, indexed in the merged order
(deployment, ts_us).  And an index on (kind, outcome, ts_us): the console offers both as lists,
and a pair that matches few rows (a kind that rarely fails) otherwise reads every row of the
outcome (170 ms on 1M events, growing with the log; BENCHMARKS.md, "console").

Existing rows are filled from their stored body.  The chain covers the body, not the column,
and verification checks that every copy equals its body (`column_mismatch`), so the copy adds
nothing to trust.  A body that is not JSON (a tampered row) gets NULL: the migration does not
stop on it, and verification reports that row as it did before.

SQLite drops its append-only UPDATE trigger for the one UPDATE and recreates it.  PostgreSQL
disables the trigger inside the migration's transaction (only the table's owner can, which is
the point of running migrations as a separate owner role); its JSON cast runs in a function
that turns a malformed body into NULL.

Revision ID: 20261204_01_deployment
Revises: 20261203_01_chains
Create Date: 2026-12-04
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "20261204_01_deployment"
down_revision: str | None = "20261203_01_chains"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HAS_KEY = "body LIKE '%\"deployment\":%'"  # only these bodies can name a deployment


def _sqlite() -> None:
    op.execute("DROP TRIGGER audit_events_no_update")
    op.execute(
        "UPDATE audit_events SET deployment = substr(json_extract(body, '$.deployment'), 1, 128) "
        f"WHERE {_HAS_KEY} AND json_valid(body) "
        "AND json_type(body, '$.deployment') = 'text'"
    )
    op.execute(
        "CREATE TRIGGER audit_events_no_update BEFORE UPDATE ON audit_events "
        "BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END"
    )


def _postgresql() -> None:
    op.execute(
        "CREATE FUNCTION pg_temp.airgate_deployment(body text) RETURNS text "
        "LANGUAGE plpgsql IMMUTABLE AS $$ "
        "BEGIN RETURN left(body::json ->> 'deployment', 128); "
        "EXCEPTION WHEN others THEN RETURN NULL; END $$"
    )
    trigger = "audit_events_no_update_delete"
    op.execute(f"ALTER TABLE audit_events DISABLE TRIGGER {trigger}")
    op.execute(
        f"UPDATE audit_events SET deployment = pg_temp.airgate_deployment(body) WHERE {_HAS_KEY}"
    )
    op.execute(f"ALTER TABLE audit_events ENABLE TRIGGER {trigger}")
    op.execute("DROP FUNCTION pg_temp.airgate_deployment(text)")


def upgrade() -> None:
    op.add_column("audit_events", sa.Column("deployment", sa.String(length=128), nullable=True))
    if op.get_context().dialect.name == "sqlite":
        _sqlite()
    else:
        _postgresql()
    op.create_index(
        op.f("ix_audit_events_deployment_ts_us"), "audit_events", ["deployment", "ts_us"]
    )
    op.create_index(
        op.f("ix_audit_events_kind_outcome_ts_us"), "audit_events", ["kind", "outcome", "ts_us"]
    )


def downgrade() -> None:
    raise RuntimeError("the audit log cannot be downgraded: its chains would merge")
