"""Dispatchers and lease lapses: a registry of running dispatchers (host, process, heartbeat), so the leases
of one whose process is visibly gone are reclaimed at once; and a count per shard of leases that lapsed
(its dispatcher died or lost the store), kept apart from `attempts`, which count what the shard itself did.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types in service/store/tables.py as of this revision.
Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create `dispatchers`; add `shards.lapses` (0 for the shards already there)."""
    op.create_table(
        "dispatchers",
        sa.Column("owner", sa.String(length=200), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("machine", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("process_started", sa.BigInteger(), nullable=True),
        sa.Column("started_at", Timestamp, nullable=False),
        sa.Column("heartbeat_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_dispatchers")),
    )
    op.create_index(op.f("ix_dispatchers_machine"), "dispatchers", ["machine"])
    with op.batch_alter_table("shards") as batch:
        batch.add_column(sa.Column("lapses", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop them again."""
    with op.batch_alter_table("shards") as batch:
        batch.drop_column("lapses")
    op.drop_index(op.f("ix_dispatchers_machine"), table_name="dispatchers")
    op.drop_table("dispatchers")
