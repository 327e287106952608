"""Served models: `jobs.endpoint`, what submit found out about an OpenAI-compatible endpoint.

A nullable JSON column (a `schemas.endpoint.EndpointReport`). Added and dropped with plain ALTER TABLE on
both dialects (SQLite has had DROP COLUMN since 3.35), so `jobs` is never rebuilt and the `position_curve`
view that reads it is left alone.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add `jobs.endpoint`."""
    op.add_column("jobs", sa.Column("endpoint", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Drop `jobs.endpoint`."""
    # Not batch mode: on SQLite that rebuilds the table, which a view reading it forbids.
    op.execute("ALTER TABLE jobs DROP COLUMN endpoint")
