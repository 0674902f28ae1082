"""API keys: the `api_keys` table (HMAC of each secret, never the secret).

Revision ID: 20261129_02_api_keys
Revises: 20261129_01_audit
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "20261129_02_api_keys"
down_revision: str | None = "20261129_01_audit"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.String(12), nullable=False),
        sa.Column("secret_hmac", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("team", sa.String(128), nullable=True),
        sa.Column("name", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(300), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
        sa.CheckConstraint("role IN ('app', 'auditor', 'admin')", name=op.f("ck_api_keys_role")),
    )


def downgrade() -> None:
    op.drop_table("api_keys")
