"""The answers a page lists under its points, never all of a job's at once: a report file carries those of
a stated sample of its trials (`trial_sample`, `sample_answers`), and the viewer reads the answers at one
point from the store when it is clicked (`point_answers`), a page at a time.

A job of a million results has a million answers; a page that embedded them all was 55 MB and took minutes
to build. The curves are computed from every answer; only the lists that lead from a point to its trials
are bounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, select, tuple_

from posbias.schemas import PosbiasError, TrialStatus
from posbias.service.store import IN_CHUNK, Database, Result, Trial

ANSWER_COLUMNS = (
    "trial_id",
    "variant",
    "batch_size",
    "position",
    "answer_slot",
    "token_distance",
    "filler_tokens",
    "parse_status",
    "correct",
)
"""The columns of a page's answer rows: enough to find the trials behind any point on any axis."""
AXES = ("position", "answer-slot", "token-distance", "filler-length")
"""The axes a point can be on (an attention point is on `position` or `token-distance`)."""
POINT_ROWS = 1000
"""Answers the viewer sends for a point at a time (the next ones follow on request)."""


@dataclass(frozen=True)
class TrialSample:
    """Which of a job's answered trials a report file shows."""

    trial_ids: tuple[int, ...]
    """The trials shown, in id order."""
    total: int
    """The job's answered trials (every variant's)."""


def trial_sample(db: Database, job_id: int, *, limit: int) -> TrialSample:
    """Up to `limit` of job `job_id`'s answered trials, spread evenly: the budget is shared out in turn over
    its (variant, batch size) groups, so every chart's points lead to some, and each group's share is taken
    at even steps through its trials in id order (the same trials every time; at the same ranks in each
    variant, which answer the same prompts)."""
    query = (
        select(Trial.variant, Trial.batch_size, Trial.id)
        .where(Trial.job_id == job_id, Trial.status == TrialStatus.done)
        .order_by(Trial.variant, Trial.batch_size, Trial.id)
    )
    groups: dict[tuple[str, int], list[int]] = {}
    with db.read() as session:
        for variant, batch_size, trial_id in session.execute(query):
            groups.setdefault((variant, batch_size), []).append(trial_id)
    total = sum(len(ids) for ids in groups.values())
    shares = _shares([len(ids) for ids in groups.values()], limit=max(0, limit))
    picked = [
        ids[(2 * i + 1) * len(ids) // (2 * share)]
        for ids, share in zip(groups.values(), shares, strict=True)
        for i in range(share)
    ]
    return TrialSample(trial_ids=tuple(sorted(picked)), total=total)


def _shares(sizes: Sequence[int], *, limit: int) -> list[int]:
    """`limit` shared out one at a time over groups of `sizes`, none given more than it has."""
    shares = [0] * len(sizes)
    left = min(limit, sum(sizes))
    while left:
        for i, size in enumerate(sizes):
            if left and shares[i] < size:
                shares[i] += 1
                left -= 1
    return shares


def _answers() -> Select[*tuple[Any, ...]]:
    return select(
        Result.trial_id,
        Result.variant,
        Result.batch_size,
        Result.position,
        Result.answer_slot,
        Result.token_distance,
        Trial.filler_tokens,
        Result.parse_status,
        Result.correct,
    ).join(Trial, Trial.id == Result.trial_id)


def _rows(found: Any) -> list[list[Any]]:
    return [
        [trial, variant, n, position, slot, distance, filler, status.value, bool(correct)]
        for trial, variant, n, position, slot, distance, filler, status, correct in found
    ]


def sample_answers(db: Database, trial_ids: Sequence[int]) -> list[list[Any]]:
    """Every answer of `trial_ids` as a row of `ANSWER_COLUMNS`, in trial and position order."""
    rows: list[list[Any]] = []
    ids = sorted(set(trial_ids))
    with db.read() as session:
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            query = _answers().where(Result.trial_id.in_(chunk)).order_by(Result.trial_id, Result.position)
            rows += _rows(session.execute(query))
    return rows


@dataclass(frozen=True)
class Point:
    """One point of a chart, as a page names it: the answers behind it are those of `variant` at
    `batch_size` whose `axis` value is `at` (by token distance: from `at` for `width` tokens), and whose
    trial's filler is `filler` when given (the curve of one filler length)."""

    variant: str
    batch_size: int
    axis: str
    at: int
    width: int | None = None
    filler: int | None = None

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise PosbiasError(f"no axis {self.axis!r}: one of {', '.join(AXES)}")
        if self.axis == "token-distance" and not self.width:
            raise PosbiasError("a token-distance point needs its bin's width, e.g. width=256")


def point_answers(
    db: Database, job_id: int, point: Point, *, after: tuple[int, int] = (0, 0), limit: int = POINT_ROWS
) -> dict[str, Any]:
    """Up to `limit` answers of job `job_id` behind `point`, in trial and position order from after
    (trial, position) `after`: `rows` of `ANSWER_COLUMNS`, and `after` to ask for the next ones (None when
    these are the last). Read through the (job, batch size, trial) index, so a page costs about its rows'
    worth of the job's answers, not the whole job."""
    query = _answers().where(
        Result.job_id == job_id,
        Result.batch_size == point.batch_size,
        Result.variant == point.variant,
        tuple_(Result.trial_id, Result.position) > tuple_(*after),
    )
    if point.axis == "filler-length":
        query = query.where(Trial.filler_tokens == point.at)
    else:
        if point.filler is not None:
            query = query.where(Trial.filler_tokens == point.filler)
        if point.axis == "answer-slot":
            query = query.where(Result.answer_slot == point.at)
        elif point.axis == "token-distance":
            assert point.width is not None
            query = query.where(Result.token_distance.between(point.at, point.at + point.width - 1))
        else:
            query = query.where(Result.position == point.at)
    query = query.order_by(Result.trial_id, Result.position).limit(limit + 1)
    with db.read() as session:
        rows = _rows(session.execute(query))
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "columns": list(ANSWER_COLUMNS),
        "rows": rows,
        "after": [rows[-1][0], rows[-1][3]] if more else None,
    }
