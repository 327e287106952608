"""Each battery `posbias diagnose` submitted: `batteries`.

A diagnosis is read from the jobs it submitted, not from what the planner of the day would submit: a newer
posbias whose plan differs (another least budget, another mechanism job) found no jobs under its keys, or
refused the budget outright. One row per request, what the user asked for (model, engine, budget, seed, the
fake's settings as given; `request_key` is their digest), with the battery as submitted (`schemas.diagnosis.
Battery` as JSON), the posbias that stored it and when. Batteries submitted before this table are found by
planning them again, as before, and stored at their next `posbias diagnose`. A downgrade drops the table:
the jobs stay, and are found by planning them again.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "batteries",
        sa.Column("id", _ID, nullable=False),
        sa.Column("request_key", sa.String(64), nullable=False),
        sa.Column("model", sa.String(500), nullable=False),
        sa.Column("engine", sa.String(64), nullable=False),
        sa.Column("budget", sa.Integer(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("fake", sa.JSON(), nullable=True),
        sa.Column("battery", sa.JSON(), nullable=False),
        sa.Column("posbias_version", sa.String(64), nullable=False),
        sa.Column("stored_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_batteries"),
        sa.UniqueConstraint("request_key", name="uq_batteries_request_key"),
    )
    op.create_index("ix_batteries_model", "batteries", ["model"])


def downgrade() -> None:
    op.drop_index("ix_batteries_model", table_name="batteries")
    op.drop_table("batteries")
