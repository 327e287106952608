"""Each answer's RoPE distance: `results.rope_distance`.

The rotary embedding sees the distance in position ids, not in tokens. They differ only where the hf engine's
`position_gap` adds G to the position ids of every token after the last question (the answer request and
the answers): there the RoPE distance of every answer is its token distance plus G, while the sliding window,
which masks by token index, still sees the token distance. Stored per answer so that curves (`posbias curve
--by rope-distance`) and SQL read it without knowing the job's engine options. Existing rows are filled from
their jobs' specs: token distance, plus the gap where the job had one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Not batch mode: SQLite adds a column in place, where batch mode would rebuild `results` under its views.
    op.add_column("results", sa.Column("rope_distance", sa.Integer(), nullable=True))
    bind = op.get_bind()
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("spec", sa.JSON))
    results = sa.table(
        "results",
        sa.column("job_id", sa.Integer),
        sa.column("token_distance", sa.Integer),
        sa.column("rope_distance", sa.Integer),
    )
    gaps = {
        job_id: int(gap)
        for job_id, spec in bind.execute(sa.select(jobs.c.id, jobs.c.spec))
        if (gap := ((spec or {}).get("engine") or {}).get("position_gap"))
    }
    bind.execute(sa.update(results).values(rope_distance=results.c.token_distance))
    for job_id, gap in gaps.items():
        bind.execute(
            sa.update(results)
            .where(results.c.job_id == job_id)
            .values(rope_distance=results.c.token_distance + gap)
        )


def downgrade() -> None:
    op.drop_column("results", "rope_distance")
