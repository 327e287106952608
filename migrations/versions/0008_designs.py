"""Designs that separate position, answer slot and token distance: what each trial asked and how, what each
answer's line and window were, and views by answer slot, filler length and window.

- `trials` gain the design: `answer_order` (positions in the order asked; NULL: forward), `probe_position`
  (the probe design's one asked position), `filler_tokens` (the filler's planned length, 0 for none) and
  `filler_token_start` / `filler_token_end` (its span in the rendered prompt).
- `results` gain `answer_slot` (the answer's line among the output's answer lines), `in_window` (its
  question inside the model's sliding window, from the answer) and `visible_layers` (layers that can see it).
  Rows written before this revision get what can be known without re-running: the slot of a constrained
  job's answer is its position (the regex forced forward order), and the window fields follow from the
  token distance and the `models` row of the job.
- Views `slot_curve` (per job, variant, batch size and answer slot), `filler_curve` (per job, variant,
  batch size, filler length and position: the length x position grid) and `window_curve` (per job, variant,
  batch size and whether the question was inside the window), each with accuracy among parsed answers and
  its Wilson interval: pointwise and unclustered, as `position_curve`'s; `posbias curve` and `posbias
  explain` cluster.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Counts per group, then accuracy among parsed answers with its Wilson 95% interval (as position_curve).
_WILSON = """
SELECT
    {keys}, n, n_parsed, n_correct, accuracy,
    CASE WHEN low < 0 THEN 0.0 ELSE low END AS ci_low,
    CASE WHEN high > 1 THEN 1.0 ELSE high END AS ci_high,
    parse_rate, accuracy_strict
FROM (
    SELECT
        {keys}, n, n_parsed, n_correct,
        p AS accuracy,
        CASE WHEN m > 0 THEN
            (p + z * z / (2 * m) - z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m)
        END AS low,
        CASE WHEN m > 0 THEN
            (p + z * z / (2 * m) + z * sqrt(p * (1 - p) / m + z * z / (4.0 * m * m))) / (1 + z * z / m)
        END AS high,
        CAST(n_parsed AS {real}) / n AS parse_rate,
        CAST(n_correct AS {real}) / n AS accuracy_strict
    FROM (
        SELECT
            {keys}, n, n_parsed, n_correct,
            CAST(n_parsed AS {real}) AS m,
            CASE WHEN n_parsed > 0 THEN CAST(n_correct AS {real}) / n_parsed END AS p,
            CAST(1.959963984540054 AS {real}) AS z
        FROM (
            SELECT
                {grouped}, count(*) AS n,
                sum(CASE WHEN r.parse_status = 'ok' THEN 1 ELSE 0 END) AS n_parsed,
                sum(CASE WHEN r.correct THEN 1 ELSE 0 END) AS n_correct
            FROM results AS r JOIN jobs ON jobs.id = r.job_id {join}
            {where}
            GROUP BY {group_by}
        ) AS totals
    ) AS counts
) AS bounds
"""

VIEWS = {
    "slot_curve": {
        "keys": "model, revision, job_id, variant, batch_size, answer_slot",
        "grouped": "jobs.model AS model, jobs.revision AS revision, r.job_id AS job_id, "
        "r.variant AS variant, "
        "r.batch_size AS batch_size, r.answer_slot AS answer_slot",
        "join": "",
        "where": "WHERE r.answer_slot IS NOT NULL",
        "group_by": "jobs.model, jobs.revision, r.job_id, r.variant, r.batch_size, r.answer_slot",
    },
    "filler_curve": {
        "keys": "model, revision, job_id, variant, batch_size, filler_tokens, position",
        "grouped": "jobs.model AS model, jobs.revision AS revision, r.job_id AS job_id, "
        "r.variant AS variant, "
        "r.batch_size AS batch_size, t.filler_tokens AS filler_tokens, r.position AS position",
        "join": "JOIN trials AS t ON t.id = r.trial_id",
        "where": "",
        "group_by": "jobs.model, jobs.revision, r.job_id, r.variant, r.batch_size, t.filler_tokens, "
        "r.position",
    },
    "window_curve": {
        "keys": "model, revision, job_id, variant, batch_size, in_window, visible_layers",
        "grouped": "jobs.model AS model, jobs.revision AS revision, r.job_id AS job_id, "
        "r.variant AS variant, "
        "r.batch_size AS batch_size, r.in_window AS in_window, r.visible_layers AS visible_layers",
        "join": "",
        "where": "WHERE r.in_window IS NOT NULL",
        "group_by": "jobs.model, jobs.revision, r.job_id, r.variant, r.batch_size, r.in_window, "
        "r.visible_layers",
    },
}


def _real() -> str:
    return "REAL" if op.get_bind().dialect.name == "sqlite" else "DOUBLE PRECISION"


def upgrade() -> None:
    """The design columns, what old rows can be given of them, and the three views."""
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("answer_order", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("probe_position", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("filler_tokens", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("filler_token_start", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("filler_token_end", sa.Integer(), nullable=True))
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("answer_slot", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("in_window", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("visible_layers", sa.Integer(), nullable=True))
    _fill_old_results()
    for name, parts in VIEWS.items():
        op.execute(f"CREATE VIEW {name} AS " + _WILSON.format(real=_real(), **parts))


def _fill_old_results() -> None:
    bind = op.get_bind()
    jobs = sa.table(
        "jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON), sa.column("model_id", sa.Integer)
    )
    models = sa.table(
        "models",
        sa.column("id", sa.Integer),
        sa.column("num_layers", sa.Integer),
        sa.column("sliding_window", sa.Integer),
        sa.column("sliding_window_layers", sa.JSON),
    )
    found = bind.execute(
        sa.select(
            jobs.c.id,
            jobs.c.spec,
            models.c.num_layers,
            models.c.sliding_window,
            models.c.sliding_window_layers,
        ).select_from(jobs.outerjoin(models, models.c.id == jobs.c.model_id))
    ).all()
    for job_id, spec, layers, window, sliding in found:
        if (spec or {}).get("answer_mode") == "constrained":
            bind.execute(
                sa.text(
                    "UPDATE results SET answer_slot = position "
                    "WHERE job_id = :job AND parse_status <> 'missing'"
                ),
                {"job": job_id},
            )
        if window is None:
            if layers is not None:
                bind.execute(
                    sa.text(
                        "UPDATE results SET visible_layers = :layers "
                        "WHERE job_id = :job AND token_distance IS NOT NULL"
                    ),
                    {"job": job_id, "layers": layers},
                )
            continue
        slide = len(sliding) if sliding is not None else layers
        bind.execute(
            sa.text(
                "UPDATE results SET in_window = (token_distance < :window), visible_layers = CASE "
                "WHEN token_distance < :window THEN :layers ELSE :global_layers END "
                "WHERE job_id = :job AND token_distance IS NOT NULL"
            ),
            {
                "job": job_id,
                "window": window,
                "layers": layers,
                "global_layers": None if layers is None or slide is None else layers - slide,
            },
        )


def downgrade() -> None:
    """Views and columns gone; the rows keep everything else."""
    for name in VIEWS:
        op.execute(f"DROP VIEW {name}")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("visible_layers")
        batch.drop_column("in_window")
        batch.drop_column("answer_slot")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("filler_token_end")
        batch.drop_column("filler_token_start")
        batch.drop_column("filler_tokens")
        batch.drop_column("probe_position")
        batch.drop_column("answer_order")
