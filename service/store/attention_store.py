"""Writing the `hf` engine's attention figures: the rows of each shard result's `attention`, its canary
(per layer, first write wins) and its costs (the largest over shards), in the caller's transaction.

`service/store/rows.py` calls `write_attention` from `write_results`, with the trial rows it has already read
for the locked shards, so a row's trial id, batch size and variant come from the store, not the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session

from posbias.schemas import ShardResult
from posbias.schemas.attention import AttentionShard
from posbias.service.store.database import dialect_insert
from posbias.service.store.tables import AttentionLayer, AttentionPoint, AttentionRun


class TrialRow(Protocol):
    """What `write_attention` reads of a stored trial."""

    @property
    def id(self) -> int: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def variant(self) -> str: ...


def write_attention(
    session: Session,
    results: Mapping[int, ShardResult],
    trials: Mapping[int, Mapping[int, TrialRow]],
) -> int:
    """Insert the attention rows of `results` (by shard id; `trials`: each shard's trials by index) and
    record each (job, variant)'s canary and costs. Results without attention write nothing. Returns the
    rows inserted."""
    rows: list[dict[str, Any]] = []
    for shard_id, result in results.items():
        attention = result.attention
        if attention is None:
            continue
        by_index = trials[shard_id]
        for row in attention.rows:
            trial = by_index[row.trial_index]
            values = row.model_dump(mode="json", exclude={"trial_index"})
            rows.append(
                {**values, "trial_id": trial.id, "job_id": result.job_id, "batch_size": trial.batch_size}
                | {"variant": trial.variant}
            )
        variant = next(iter(by_index.values())).variant if by_index else "baseline"
        _record_run(session, job_id=result.job_id, variant=variant, attention=attention)
    if rows:
        session.execute(sa.insert(AttentionPoint), rows)
    return len(rows)


def _record_run(session: Session, *, job_id: int, variant: str, attention: AttentionShard) -> None:
    dialect = session.get_bind().dialect.name
    layers = [
        {
            "job_id": job_id,
            "variant": variant,
            "layer": check.layer,
            "kind": check.kind.value,
            "window": check.window,
            "rope_theta": check.rope_theta,
            "beyond_mass": check.beyond_mass,
            "edge_mass": check.edge_mass,
            "passed": check.passed,
        }
        for check in attention.canary.layers
    ]
    if layers:
        session.execute(dialect_insert(dialect, AttentionLayer).values(layers).on_conflict_do_nothing())
    run = dialect_insert(dialect, AttentionRun).values(
        job_id=job_id,
        variant=variant,
        answer_sheet=attention.answer_sheet.value,
        position_gap_safe=attention.canary.position_gap_safe,
        state_bytes_per_trial=attention.state_bytes_per_trial,
        map_bytes_peak=attention.map_bytes_peak,
        peak_memory_bytes=attention.peak_memory_bytes,
    )
    largest = sa.func.greatest if dialect == "postgresql" else sa.func.max
    table = AttentionRun.__table__
    session.execute(
        run.on_conflict_do_update(
            index_elements=["job_id", "variant"],
            set_={
                name: largest(
                    sa.func.coalesce(table.c[name], run.excluded[name]),
                    sa.func.coalesce(run.excluded[name], table.c[name]),
                )
                for name in ("state_bytes_per_trial", "map_bytes_peak", "peak_memory_bytes")
            },
        )
    )
