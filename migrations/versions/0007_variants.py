"""Variants: a job's model under several engine configurations, answering the same trials.

- `shards`, `trials` and `results` gain `variant` (rows written before this revision are `baseline`'s), and
  `curve_points` keeps its totals per (job, variant, batch size, position).
- `job_variants`: per job and variant, what it asked of the engine at submit (its `hf_overrides` and the
  layers it expects vLLM to build) and what the engine built, read back at its first result. Every job
  written before this revision gets its `baseline` row, with the model and engine it recorded.
- `models` is one row per name, revision and config changes (`overrides`, with its digest `overrides_key`,
  '' for the model as published), with each attention layer's window and RoPE base as built
  (`layer_windows`, `layer_rope_theta`).
- `position_curve` gains the `variant` column.

Going down refuses while a job has a variant other than `baseline` or a model row has config changes: their
results could no longer be told apart from the baseline's (export them first, then delete those jobs).

Revision ID: 0007
Revises: 0005
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the types in service/store/tables.py as of this revision.
Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
BASELINE = "baseline"

# As revision 0003 created it, with the variant after the job.
POSITION_CURVE = """
CREATE VIEW position_curve AS
SELECT
    model, revision, job_id, variant, batch_size, position, n, n_parsed, n_correct, accuracy,
    CASE WHEN low < 0 THEN 0.0 ELSE low END AS ci_low,
    CASE WHEN high > 1 THEN 1.0 ELSE high END AS ci_high,
    parse_rate, accuracy_strict, mean_gold_prob
FROM (
    SELECT
        model, revision, job_id, variant, batch_size, position, n, n_parsed, n_correct,
        p AS accuracy,
        CASE WHEN m > 0 THEN
            (p + z * z / (2 * m) - z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m)
        END AS low,
        CASE WHEN m > 0 THEN
            (p + z * z / (2 * m) + z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m)
        END AS high,
        CAST(n_parsed AS {real}) / n AS parse_rate,
        CAST(n_correct AS {real}) / n AS accuracy_strict,
        CASE WHEN n_gold_prob > 0 THEN gold_prob_sum / n_gold_prob END AS mean_gold_prob
    FROM (
        SELECT
            jobs.model AS model, jobs.revision AS revision, c.job_id AS job_id, c.variant AS variant,
            c.batch_size AS batch_size, c.position AS position, c.n AS n, c.n_correct AS n_correct,
            c.n_parsed AS n_parsed, c.gold_prob_sum AS gold_prob_sum, c.n_gold_prob AS n_gold_prob,
            CAST(c.n_parsed AS {real}) AS m,
            CASE WHEN c.n_parsed > 0 THEN CAST(c.n_correct AS {real}) / c.n_parsed END AS p,
            CAST(1.959963984540054 AS {real}) AS z
        FROM curve_points AS c JOIN jobs ON jobs.id = c.job_id
        WHERE c.n > 0
    ) AS counts
) AS bounds
"""


def _previous_view() -> str:
    """The view as revision 0003 created it."""
    from importlib import import_module

    previous = import_module("posbias.migrations.versions.0003_parse_failures_apart")
    return str(previous.POSITION_CURVE)


def _real() -> str:
    return "REAL" if op.get_bind().dialect.name == "sqlite" else "DOUBLE PRECISION"


def _variant_column() -> sa.Column[str]:
    return sa.Column("variant", sa.String(length=64), server_default=BASELINE, nullable=False)


def upgrade() -> None:
    """Variant columns, per-variant curve totals, `job_variants`, models per config, the view."""
    op.execute("DROP VIEW position_curve")
    # Plain ADD COLUMN (no table copy on SQLite, no rewrite on PostgreSQL): `results` is the bulk.
    for table in ("shards", "trials", "results"):
        op.add_column(table, _variant_column())
    with op.batch_alter_table("curve_points", recreate="always") as batch:
        batch.add_column(_variant_column())
        batch.drop_constraint("pk_curve_points", type_="primary")
        batch.create_primary_key("pk_curve_points", ["job_id", "variant", "batch_size", "position"])

    op.add_column("models", sa.Column("overrides", sa.JSON(), server_default=sa.text("'{}'"), nullable=False))
    op.add_column(
        "models", sa.Column("overrides_key", sa.String(length=16), server_default="", nullable=False)
    )
    op.add_column("models", sa.Column("layer_windows", sa.JSON(), nullable=True))
    op.add_column("models", sa.Column("layer_rope_theta", sa.JSON(), nullable=True))
    with op.batch_alter_table("models") as batch:
        batch.drop_constraint("uq_models_name_revision", type_="unique")
        batch.create_unique_constraint(
            "uq_models_name_revision_overrides_key", ["name", "revision", "overrides_key"]
        )

    op.create_table(
        "job_variants",
        sa.Column("job_id", Id, nullable=False),
        sa.Column("variant", sa.String(length=64), nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("model_key", sa.String(length=64), nullable=False),
        sa.Column("hf_overrides", sa.JSON(), nullable=False),
        sa.Column("expected_layers", sa.JSON(), nullable=True),
        sa.Column("built_layers", sa.JSON(), nullable=True),
        sa.Column("model_id", Id, nullable=True),
        sa.Column("engine", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_variants_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_job_variants_model_id_models")),
        sa.PrimaryKeyConstraint("job_id", "variant", name=op.f("pk_job_variants")),
    )
    op.execute(
        f"""
        INSERT INTO job_variants (job_id, variant, ordinal, model_key, hf_overrides, model_id, engine)
        SELECT id, '{BASELINE}', 0, model_key, '{{}}', model_id, engine FROM jobs
        """
    )
    op.execute(POSITION_CURVE.format(real=_real()))


def downgrade() -> None:
    """Back to one configuration per job; refused while any job has another variant (see above)."""
    bind = op.get_bind()
    jobs = bind.execute(sa.text(f"SELECT DISTINCT job_id FROM shards WHERE variant <> '{BASELINE}'")).all()
    models = bind.execute(sa.text("SELECT count(*) FROM models WHERE overrides_key <> ''")).scalar_one()
    if jobs or models:
        named = ", ".join(str(row[0]) for row in jobs[:10]) or "none"
        raise RuntimeError(
            f"cannot go below revision 0007: jobs {named} have variants and {models} model rows have config "
            "changes, which the older store cannot tell from the baseline; export those jobs "
            "(`posbias export`) and delete them first"
        )
    op.execute("DROP VIEW position_curve")
    op.drop_table("job_variants")
    with op.batch_alter_table("models") as batch:
        batch.drop_constraint("uq_models_name_revision_overrides_key", type_="unique")
        batch.create_unique_constraint("uq_models_name_revision", ["name", "revision"])
        batch.drop_column("layer_rope_theta")
        batch.drop_column("layer_windows")
        batch.drop_column("overrides_key")
        batch.drop_column("overrides")
    with op.batch_alter_table("curve_points", recreate="always") as batch:
        batch.drop_constraint("pk_curve_points", type_="primary")
        batch.create_primary_key("pk_curve_points", ["job_id", "batch_size", "position"])
        batch.drop_column("variant")
    for table in ("results", "trials", "shards"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("variant")
    op.execute(_previous_view().format(real=_real()))
