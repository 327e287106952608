"""Parse failures kept apart: a failed parse is never correct, and `position_curve` gives accuracy among
parsed answers beside the parse rate and the seed's scoring; regression rules lose the ratio limit.

- `results.correct` becomes false wherever the status is not `ok` (a position answered twice could count as
  correct before), and `curve_points.n_correct` is recounted from `results` to match.
- `position_curve`: `accuracy` is n_correct / n_parsed with its Wilson interval over n_parsed (the headline);
  new columns `n_parsed` and `accuracy_strict` (n_correct / n, failures as wrong). Pointwise and unclustered:
  for a rotation job, `posbias curve` gives the clustered interval.
- A stored regression rule's `max_ratio_drop` (judged asymmetrically, and undefined near zero) is replaced by
  `max_shift`, 10 points of last-minus-first accuracy, and the schedule's `last_error` says so.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REPLACED_RATIO_SHIFT = 10.0

# Wilson 95% interval over the parsed answers, in SQL so any client (psql, sqlite3) gets it.
POSITION_CURVE = """
CREATE VIEW position_curve AS
SELECT
    model, revision, job_id, batch_size, position, n, n_parsed, n_correct, accuracy,
    CASE WHEN low < 0 THEN 0.0 ELSE low END AS ci_low,
    CASE WHEN high > 1 THEN 1.0 ELSE high END AS ci_high,
    parse_rate, accuracy_strict, mean_gold_prob
FROM (
    SELECT
        model, revision, job_id, batch_size, position, n, n_parsed, n_correct,
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
            jobs.model AS model, jobs.revision AS revision, c.job_id AS job_id, c.batch_size AS batch_size,
            c.position AS position, c.n AS n, c.n_correct AS n_correct, c.n_parsed AS n_parsed,
            c.gold_prob_sum AS gold_prob_sum, c.n_gold_prob AS n_gold_prob,
            CAST(c.n_parsed AS {real}) AS m,
            CASE WHEN c.n_parsed > 0 THEN CAST(c.n_correct AS {real}) / c.n_parsed END AS p,
            CAST(1.959963984540054 AS {real}) AS z
        FROM curve_points AS c JOIN jobs ON jobs.id = c.job_id
        WHERE c.n > 0
    ) AS counts
) AS bounds
"""

# As revision 0001 created it: accuracy with failures as wrong.
PREVIOUS_POSITION_CURVE = """
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


def _real() -> str:
    return "REAL" if op.get_bind().dialect.name == "sqlite" else "DOUBLE PRECISION"


def upgrade() -> None:
    """Failed parses never correct; the view with accuracy among parsed answers; rules without ratios."""
    bind = op.get_bind()
    op.execute("UPDATE results SET correct = false WHERE parse_status <> 'ok' AND correct")
    op.execute(
        """
        UPDATE curve_points SET n_correct = (
            SELECT count(*) FROM results
            WHERE results.job_id = curve_points.job_id AND results.batch_size = curve_points.batch_size
                AND results.position = curve_points.position AND results.correct
        )
        """
    )
    op.execute("DROP VIEW position_curve")
    op.execute(POSITION_CURVE.format(real=_real()))

    schedules = sa.table(
        "schedules", sa.column("id", sa.Integer), sa.column("rule", sa.JSON), sa.column("last_error", sa.Text)
    )
    for row in bind.execute(sa.select(schedules.c.id, schedules.c.rule)).all():
        rule = dict(row.rule)
        if "max_ratio_drop" not in rule:
            continue
        ratio = rule.pop("max_ratio_drop")
        note = None
        if ratio is not None:
            rule.setdefault("max_shift", REPLACED_RATIO_SHIFT)
            note = (
                f"migration 0003 replaced the rule's max_ratio_drop {ratio:g} by max_shift "
                f"{rule['max_shift']:g} points (last-minus-first accuracy); check it with "
                "`posbias schedule show`"
            )
        values: dict[str, object] = {"rule": rule}
        if note is not None:
            values["last_error"] = note
        bind.execute(sa.update(schedules).where(schedules.c.id == row.id).values(**values))


def downgrade() -> None:
    """The view as before (failures counted as wrong). Results and rules stay as they are now."""
    op.execute("DROP VIEW position_curve")
    op.execute(PREVIOUS_POSITION_CURVE.format(real=_real()))
