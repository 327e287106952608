"""The index of `results` by trial instead of by position: (job_id, batch_size, trial_id).

Every read of results picks a job's rows of one batch size, in trial order (the trial data of curves and
compare, token distances, options, exports, the answer sheet, the slot, filler and window views); none
picks a position, since curves read `curve_points`. Keyed by position, the index took a shard's 1,000 rows
at 50 places (one per position) and cost about a sixth of a SQLite insert; keyed by trial, they go in at
one place, as they do in the primary key.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_results_job_id_batch_size_position", table_name="results")
    op.create_index("ix_results_job_id_batch_size_trial_id", "results", ["job_id", "batch_size", "trial_id"])


def downgrade() -> None:
    op.drop_index("ix_results_job_id_batch_size_trial_id", table_name="results")
    op.create_index("ix_results_job_id_batch_size_position", "results", ["job_id", "batch_size", "position"])
