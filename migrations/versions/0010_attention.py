"""Attention evidence of the `hf` engine, and the `attention_curve` view.

- `attention`: per (trial, position, layer) where the answer line's attention went (own question, sink,
  other questions, instructions, the answers so far; head mean and largest head; mass beyond the window).
- `attention_layers`: per (job, variant, layer) the layer as built and its mask canary.
- `attention_runs`: per (job, variant) the answer sheet and what recording cost (largest over shards).
- View `attention_curve(model, revision, job_id, variant, batch_size, position, layer_kind, n, ...)`: the
  masses averaged over trials and the layers of a kind.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MASSES = (
    "own_mean",
    "own_max",
    "sink_mean",
    "sink_max",
    "other_mean",
    "other_max",
    "instructions_mean",
    "instructions_max",
    "answers_mean",
)
"""The `attention` columns the view averages (besides the two beyond-window masses, which may be NULL)."""

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "attention",
        sa.Column("trial_id", _ID, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("layer", sa.Integer(), nullable=False),
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(64), nullable=False, server_default="baseline"),
        sa.Column("layer_kind", sa.String(16), nullable=False),
        sa.Column("token_distance", sa.Integer(), nullable=True),
        sa.Column("query_tokens", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.Double(), nullable=False) for name in MASSES),
        sa.Column("beyond_window_mean", sa.Double(), nullable=True),
        sa.Column("beyond_window_max", sa.Double(), nullable=True),
        sa.PrimaryKeyConstraint("trial_id", "position", "layer", name="pk_attention"),
    )
    op.create_index(
        "ix_attention_job_id_batch_size_position", "attention", ["job_id", "batch_size", "position"]
    )
    op.create_table(
        "attention_layers",
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("variant", sa.String(64), nullable=False, server_default="baseline"),
        sa.Column("layer", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("window", sa.Integer(), nullable=True),
        sa.Column("rope_theta", sa.Double(), nullable=True),
        sa.Column("beyond_mass", sa.Double(), nullable=False),
        sa.Column("edge_mass", sa.Double(), nullable=False),
        sa.Column("passed", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_attention_layers_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "variant", "layer", name="pk_attention_layers"),
    )
    op.create_table(
        "attention_runs",
        sa.Column("job_id", _ID, nullable=False),
        sa.Column("variant", sa.String(64), nullable=False, server_default="baseline"),
        sa.Column("answer_sheet", sa.String(16), nullable=False),
        sa.Column("position_gap_safe", sa.Boolean(), nullable=True),
        sa.Column("state_bytes_per_trial", sa.BigInteger(), nullable=False),
        sa.Column("map_bytes_peak", sa.BigInteger(), nullable=False),
        sa.Column("peak_memory_bytes", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_attention_runs_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "variant", name="pk_attention_runs"),
    )
    averages = ",\n            ".join(f"avg(a.{name}) AS {name}" for name in MASSES)
    op.execute(
        f"""
        CREATE VIEW attention_curve AS
        SELECT jobs.model AS model, jobs.revision AS revision, a.job_id AS job_id, a.variant AS variant,
            a.batch_size AS batch_size, a.position AS position, a.layer_kind AS layer_kind,
            count(*) AS n, count(DISTINCT a.trial_id) AS trials, avg(a.token_distance) AS token_distance,
            {averages},
            avg(a.beyond_window_mean) AS beyond_window_mean, max(a.beyond_window_max) AS beyond_window_max
        FROM attention AS a JOIN jobs ON jobs.id = a.job_id
        GROUP BY jobs.model, jobs.revision, a.job_id, a.variant, a.batch_size, a.position, a.layer_kind
        """
    )


def downgrade() -> None:
    op.execute("DROP VIEW attention_curve")
    op.drop_table("attention_runs")
    op.drop_table("attention_layers")
    op.drop_index("ix_attention_job_id_batch_size_position", table_name="attention")
    op.drop_table("attention")
