"""The engine's context with its source, and bounded waiting for a node.

- `jobs` gain `context` (vLLM jobs: the `max_model_len` the engine starts with and where the number came from,
  a `schemas.job_records.EngineContext`; NULL for other engines and for jobs stored before this revision).
- `shards` gain `waits` (0 for the shards already there): times its model's actor waited past the placement
  timeout or was refused GPU memory; past `POSBIAS_PLACEMENT_WAITS` its job fails with the reason.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("context", sa.JSON(), nullable=True))
    op.add_column("shards", sa.Column("waits", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    # Not a batch (table copy) on SQLite: the views over `jobs` would not survive it; SQLite 3.35+ drops a
    # column in place, as PostgreSQL does.
    op.execute("ALTER TABLE shards DROP COLUMN waits")
    op.execute("ALTER TABLE jobs DROP COLUMN context")
