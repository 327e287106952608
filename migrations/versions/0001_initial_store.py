"""Initial store: models, jobs, shards, trials, questions, results, curve points, and the `position_curve`
view.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types in service/store/tables.py as of this revision (a migration must not change when
# the application code does).
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Timestamp = sa.DateTime(timezone=True)


def _enum(name: str, *values: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=16)


# Wilson 95% interval, computed in SQL so any client (psql, sqlite3) gets it. z = 1.959963984540054. SQLite
# builds without math functions get sqrt from service.store.database on connect; the sqlite3 shell has it
# since 3.35 (check with `select sqrt(4);`).
POSITION_CURVE = """
CREATE VIEW position_curve AS
SELECT
    model, revision, job_id, batch_size, position, n, n_correct, accuracy,
    CASE WHEN low < 0 THEN 0.0 ELSE low END AS ci_low,
    CASE WHEN high > 1 THEN 1.0 ELSE high END AS ci_high,
    parse_rate, mean_gold_prob
FROM (
    SELECT
        model, revision, job_id, batch_size, position, n, n_correct,
        p AS accuracy,
        (p + z * z / (2 * n) - z * sqrt(p * (1 - p) / n + z * z / (4.0 * n * n))) / (1 + z * z / n) AS low,
        (p + z * z / (2 * n) + z * sqrt(p * (1 - p) / n + z * z / (4.0 * n * n))) / (1 + z * z / n) AS high,
        CAST(n_parsed AS {real}) / n AS parse_rate,
        CASE WHEN n_gold_prob > 0 THEN gold_prob_sum / n_gold_prob END AS mean_gold_prob
    FROM (
        SELECT
            jobs.model AS model, jobs.revision AS revision, c.job_id AS job_id, c.batch_size AS batch_size,
            c.position AS position, c.n AS n, c.n_correct AS n_correct, c.n_parsed AS n_parsed,
            c.gold_prob_sum AS gold_prob_sum, c.n_gold_prob AS n_gold_prob,
            CAST(c.n_correct AS {real}) / c.n AS p,
            CAST(1.959963984540054 AS {real}) AS z
        FROM curve_points AS c JOIN jobs ON jobs.id = c.job_id
        WHERE c.n > 0
    ) AS counts
) AS bounds
"""


def upgrade() -> None:
    """Create the tables and the view."""
    op.create_table(
        "models",
        sa.Column("id", Id, nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("revision", sa.String(length=200), nullable=False),
        sa.Column("architecture", sa.String(length=200), nullable=True),
        sa.Column("num_layers", sa.Integer(), nullable=True),
        sa.Column("sliding_window", sa.Integer(), nullable=True),
        sa.Column("sliding_window_layers", sa.JSON(), nullable=True),
        sa.Column("rope_theta", sa.Double(), nullable=True),
        sa.Column("context_length", sa.Integer(), nullable=True),
        sa.Column("num_parameters", sa.BigInteger(), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_models")),
        sa.UniqueConstraint("name", "revision", name=op.f("uq_models_name_revision")),
    )
    op.create_table(
        "questions",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("question", sa.Text(), nullable=False),
        sa.Column("choices", sa.JSON(), nullable=False),
        sa.Column("answer", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_questions")),
    )
    op.create_table(
        "jobs",
        sa.Column("id", Id, nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=500), nullable=False),
        sa.Column("revision", sa.String(length=200), nullable=True),
        sa.Column("model_key", sa.String(length=64), nullable=False),
        sa.Column(
            "status", _enum("job_status", "queued", "running", "done", "failed", "cancelled"), nullable=False
        ),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("started_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("engine", sa.JSON(), nullable=True),
        sa.Column("model_id", Id, nullable=True),
        sa.Column("trials_total", sa.Integer(), nullable=False),
        sa.Column("shards_total", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_jobs_model_id_models")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_jobs_idempotency_key")),
    )
    op.create_index(op.f("ix_jobs_model_revision"), "jobs", ["model", "revision"])
    op.create_index(op.f("ix_jobs_status"), "jobs", ["status"])
    op.create_table(
        "curve_points",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("n_correct", sa.Integer(), nullable=False),
        sa.Column("n_parsed", sa.Integer(), nullable=False),
        sa.Column("gold_prob_sum", sa.Double(), nullable=False),
        sa.Column("n_gold_prob", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_curve_points_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "batch_size", "position", name=op.f("pk_curve_points")),
    )
    op.create_table(
        "shards",
        sa.Column("id", Id, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column(
            "status", _enum("shard_status", "queued", "leased", "done", "dead", "cancelled"), nullable=False
        ),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_owner", sa.String(length=200), nullable=True),
        sa.Column("leased_at", Timestamp, nullable=True),
        sa.Column("lease_expires_at", Timestamp, nullable=True),
        sa.Column("finished_at", Timestamp, nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("trial_count", sa.Integer(), nullable=False),
        sa.Column("model_key", sa.String(length=64), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_shards_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_shards")),
        sa.UniqueConstraint("job_id", "index", name=op.f("uq_shards_job_id_index")),
    )
    op.create_index(op.f("ix_shards_model_key_status"), "shards", ["model_key", "status"])
    op.create_index(op.f("ix_shards_job_id_status"), "shards", ["job_id", "status"])
    op.create_index(
        op.f("ix_shards_status_priority_job_id_index"), "shards", ["status", "priority", "job_id", "index"]
    )
    op.create_table(
        "trials",
        sa.Column("id", Id, nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("index", sa.Integer(), nullable=False),
        sa.Column("shard_id", Id, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("rotation", sa.Integer(), nullable=False),
        sa.Column("question_ids", sa.JSON(), nullable=False),
        sa.Column("choice_orders", sa.JSON(), nullable=True),
        sa.Column("status", _enum("trial_status", "planned", "done", "skipped"), nullable=False),
        sa.Column("skip_reason", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("output_tokens", sa.Integer(), nullable=True),
        sa.Column("output_text", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_trials_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["shard_id"], ["shards.id"], name=op.f("fk_trials_shard_id_shards"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trials")),
        sa.UniqueConstraint("job_id", "index", name=op.f("uq_trials_job_id_index")),
    )
    op.create_index(op.f("ix_trials_shard_id"), "trials", ["shard_id"])
    op.create_table(
        "results",
        sa.Column("trial_id", Id, nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("job_id", Id, nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("question_id", sa.String(length=255), nullable=False),
        sa.Column("subject", sa.String(length=200), nullable=False),
        sa.Column("gold", sa.Integer(), nullable=False),
        sa.Column("predicted", sa.Integer(), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=False),
        sa.Column(
            "parse_status",
            _enum("parse_status", "ok", "missing", "duplicate", "out_of_range", "unparseable"),
            nullable=False,
        ),
        sa.Column("question_token_start", sa.Integer(), nullable=True),
        sa.Column("question_token_end", sa.Integer(), nullable=True),
        sa.Column("answer_token_index", sa.Integer(), nullable=True),
        sa.Column("token_distance", sa.Integer(), nullable=True),
        sa.Column("gold_prob", sa.Double(), nullable=True),
        sa.Column("option_probs", sa.JSON(), nullable=True),
        # No foreign keys here: see service/store/tables.py (Result).
        sa.PrimaryKeyConstraint("trial_id", "position", name=op.f("pk_results")),
    )
    op.create_index(
        op.f("ix_results_job_id_batch_size_position"), "results", ["job_id", "batch_size", "position"]
    )
    real = "REAL" if op.get_bind().dialect.name == "sqlite" else "DOUBLE PRECISION"
    # A later batch migration of `jobs` or `curve_points` must drop this view first and recreate it after:
    # SQLite checks views when it renames the rebuilt table.
    op.execute(POSITION_CURVE.format(real=real))


def downgrade() -> None:
    """Drop the view and every table."""
    op.execute("DROP VIEW position_curve")
    op.drop_table("results")
    op.drop_table("trials")
    op.drop_table("shards")
    op.drop_table("curve_points")
    op.drop_table("jobs")
    op.drop_table("questions")
    op.drop_table("models")
