"""Regression schedules: `schedules` and their `checkpoints`.

Only new tables: `jobs` and `curve_points` are not rebuilt, so the `position_curve` view is left alone.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types in service/store/tables.py as of this revision.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


def upgrade() -> None:
    """Create `schedules` and `checkpoints`."""
    op.create_table(
        "schedules",
        sa.Column("id", Id, nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("source_kind", _enum("schedule_source", "folder", "hub"), nullable=False),
        sa.Column("source", sa.String(length=1000), nullable=False),
        sa.Column("hub_branch", sa.String(length=200), nullable=True),
        sa.Column("hub_revisions", _enum("hub_revisions", "commits", "branches"), nullable=True),
        sa.Column("template", sa.JSON(), nullable=False),
        sa.Column("baseline", _enum("baseline_kind", "first", "previous", "job"), nullable=False),
        sa.Column("baseline_job_id", Id, nullable=True),
        sa.Column("rule", sa.JSON(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("last_tick_at", Timestamp, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["baseline_job_id"], ["jobs.id"], name=op.f("fk_schedules_baseline_job_id_jobs")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_schedules_name")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", Id, nullable=False),
        sa.Column("schedule_id", Id, nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("step", sa.BigInteger(), nullable=True),
        sa.Column("model", sa.String(length=1000), nullable=False),
        sa.Column("revision", sa.String(length=200), nullable=True),
        sa.Column("discovered_at", Timestamp, nullable=False),
        sa.Column("job_id", Id, nullable=True),
        sa.Column(
            "verdict",
            _enum("checkpoint_verdict", "pending", "baseline", "pass", "regression", "inconclusive", "error"),
            nullable=False,
        ),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column("evaluated_at", Timestamp, nullable=True),
        sa.Column("baseline_job_id", Id, nullable=True),
        sa.Column("announcement", _enum("announcement", "due", "sending", "sent", "failed"), nullable=True),
        sa.Column("announce_attempts", sa.Integer(), nullable=False),
        sa.Column("announce_error", sa.Text(), nullable=True),
        sa.Column("announced_at", Timestamp, nullable=True),
        sa.ForeignKeyConstraint(
            ["schedule_id"],
            ["schedules.id"],
            name=op.f("fk_checkpoints_schedule_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_checkpoints_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["baseline_job_id"],
            ["jobs.id"],
            name=op.f("fk_checkpoints_baseline_job_id_jobs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("schedule_id", "name", name=op.f("uq_checkpoints_schedule_id_name")),
    )
    op.create_index(op.f("ix_checkpoints_verdict"), "checkpoints", ["verdict"])


def downgrade() -> None:
    """Drop `checkpoints` and `schedules` (jobs submitted by schedules stay)."""
    op.drop_index(op.f("ix_checkpoints_verdict"), table_name="checkpoints")
    op.drop_table("checkpoints")
    op.drop_table("schedules")
