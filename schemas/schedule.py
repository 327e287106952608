"""Regression schedules: the rule a new checkpoint is judged by, and the verdict it gets.

Both are stored as JSON (the rule on its schedule, the verdict's numbers on its checkpoint) and the verdict is
what the webhook receives, so each field says what it means.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any, Self

from pydantic import ConfigDict, Field, model_validator

from posbias.schemas.choices import HubRevisions as HubRevisions
from posbias.schemas.curve import Interval
from posbias.schemas.record import Record, records_frame
from posbias.schemas.variant import BASELINE

if TYPE_CHECKING:
    import pandas as pd


class ScheduleSource(StrEnum):
    """Where a schedule finds new checkpoints."""

    folder = "folder"
    """Subfolders of a local (or mounted) folder, each one checkpoint."""
    hub = "hub"
    """Revisions of a Hugging Face repository."""


class BaselineKind(StrEnum):
    """What a checkpoint is compared with."""

    first = "first"
    """The schedule's first checkpoint (in step order) that did not end in error."""
    previous = "previous"
    """The nearest earlier checkpoint that did not end in error."""
    job = "job"
    """One fixed job (`schedules.baseline_job_id`)."""


class Announcement(StrEnum):
    """Where posting a checkpoint's verdict to the webhook stands."""

    due = "due"
    sending = "sending"
    """Claimed by one tick, so that a concurrent tick does not post it too (a tick killed mid-post leaves
    it here: a verdict is posted at most once)."""
    sent = "sent"
    failed = "failed"
    """Every attempt failed; the last error is kept."""


class Verdict(StrEnum):
    """What a checkpoint's evaluation concluded. Every value but `pending` is final."""

    pending = "pending"
    """Its job (or its baseline's job) has not finished yet; a later tick decides."""
    baseline = "baseline"
    """It is the schedule's baseline (`first`, or the first checkpoint under `previous`): nothing to
    compare."""
    passed = "pass"
    """Compared with its baseline, no part of the rule fired."""
    regression = "regression"
    """Some part of the rule fired: a drop beyond the limit whose interval excludes zero."""
    inconclusive = "inconclusive"
    """The comparison could not be made: the baseline failed, no batch size in common, too few answers."""
    error = "error"
    """Its job could not be submitted or failed (e.g. the checkpoint does not load); the reason says why."""


FINAL_VERDICTS = frozenset(Verdict) - {Verdict.pending}


class RegressionRule(Record):
    """When a checkpoint counts as a regression against its baseline. At least one of `max_drop` and
    `max_shift` must be set; parse rates are always judged (`max_parse_drop`).

    Every check needs a change beyond its limit AND a one-sided (or, for the shift, two-sided) interval that
    excludes zero; the intervals are simultaneous over everything a check looks at (each position, and
    blocks of a tenth, a fifth and a half of the positions, and all of them) and split by Bonferroni over
    the checks and batch sizes, so a checkpoint as good as its baseline is flagged with probability at most
    1 - `confidence` in all. Matched trials are compared paired (service/stats/comparison.py).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    max_drop: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Percentage points: a regression when accuracy (among parsed answers) at some position, "
        "or over some block of positions, drops by more than this and the simultaneous one-sided bound of "
        "the change lies below zero.",
    )
    max_shift: float | None = Field(
        None,
        gt=0,
        le=200,
        description="Percentage points: a regression when the last-minus-first contrast (position bias) "
        "changes by more than this in either direction and its interval excludes zero. Symmetric: a recency "
        "shift and a primacy shift of the same size count alike.",
    )
    max_parse_drop: float = Field(
        5.0,
        gt=0,
        le=100,
        description="Percentage points: a regression when the parse rate at some position or block drops by "
        "more than this and the simultaneous one-sided bound lies below zero (judged apart from accuracy).",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Family-wise confidence of the intervals the checks use, in all."
    )

    @model_validator(mode="before")
    @classmethod
    def _no_ratio(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("max_ratio_drop") is not None:
            raise ValueError(
                "max_ratio_drop is gone: the last/first ratio is unstable and was judged asymmetrically; use "
                "max_shift (points of change in last-minus-first accuracy), e.g. --max-shift 10"
            )
        if isinstance(data, dict) and "max_ratio_drop" in data:
            data = {k: v for k, v in data.items() if k != "max_ratio_drop"}
        return data

    @model_validator(mode="after")
    def _one_limit(self) -> Self:
        if self.max_drop is None and self.max_shift is None:
            raise ValueError("give a regression rule: --max-drop POINTS and/or --max-shift POINTS")
        return self

    def describe(self) -> str:
        """The rule in words, e.g. `drop > 5 points at any position or block, or ...`."""
        parts = []
        if self.max_drop is not None:
            parts.append(f"drop > {self.max_drop:g} points at a position or block")
        if self.max_shift is not None:
            parts.append(f"last-minus-first shift > {self.max_shift:g} points")
        parts.append(f"parse rate drop > {self.max_parse_drop:g} points")
        return " or ".join(parts) + f" ({self.confidence:.0%} confidence in all)"


class PositionDrop(Record):
    """Candidate minus baseline at one position or one block of positions."""

    first_position: int = Field(description="1-based first position of the block (the position itself).")
    last_position: int = Field(description="1-based last position of the block.")
    accuracy_baseline: float = Field(description="Baseline accuracy (or parse rate) there.")
    accuracy_candidate: float = Field(description="Candidate accuracy (or parse rate) there.")
    diff: float = Field(description="Candidate minus baseline (negative is a drop).")
    upper: float = Field(
        description="Simultaneous one-sided bound: the change is at most this (below zero: a drop is "
        "established)."
    )
    lower: float = Field(
        description="Simultaneous one-sided bound on the other side: the change is at least this (so the "
        "largest drop the data allow is -lower)."
    )
    flagged: bool = Field(description="Dropped by more than the limit with `upper` below zero.")

    @property
    def where(self) -> str:
        """`position 7` or `positions 1-10`."""
        if self.first_position == self.last_position:
            return f"position {self.first_position}"
        return f"positions {self.first_position}-{self.last_position}"


class ShiftChange(Record):
    """How the last-minus-first contrast changed (cluster bootstrap, paired where trials match)."""

    baseline: Interval = Field(description="Baseline last-minus-first accuracy.")
    candidate: Interval = Field(description="Candidate last-minus-first accuracy.")
    change: Interval = Field(description="Candidate's contrast minus the baseline's.")
    flagged: bool = Field(description="Changed by more than `max_shift` with the interval excluding zero.")


class BatchSizeVerdict(Record):
    """The checks at one batch size."""

    batch_size: int = Field(description="N.")
    variant: str = Field(BASELINE, description="The variant compared (the same in both jobs).")
    positions: int = Field(description="Positions compared.")
    method: str = Field("unpaired", description="`paired`, `partly paired` or `unpaired` (see Comparison).")
    matched_trials: int = Field(0, description="Baseline trials with a match in the candidate.")
    worst_drop: PositionDrop | None = Field(
        description="The flagged drop that best fits the change (the whole curve for a uniform drop, else "
        "the flagged position or block with the largest drop in standard errors), else the place where the "
        "data allow the largest drop."
    )
    drop_flagged: bool = Field(description="Some position or block fired the `max_drop` check.")
    shift: ShiftChange | None = Field(
        None, description="The shift check; None without `max_shift` or at N = 1."
    )
    parse_drop: PositionDrop | None = Field(
        None, description="The largest flagged parse-rate drop, else the largest the data allow."
    )
    parse_flagged: bool = Field(False, description="Some position or block fired the parse-rate check.")
    note: str | None = Field(None, description="Why a check could not be made here (insufficient data).")


class VerdictDetail(Record):
    """A checkpoint's verdict with the numbers behind it: stored with the checkpoint, sent to the webhook."""

    schedule: str = Field(description="Schedule name.")
    checkpoint: str = Field(description="Checkpoint name (folder name, hub branch or commit).")
    verdict: Verdict = Field(description="The verdict.")
    reason: str = Field(description="One line: why this verdict.")
    job_id: int | None = Field(None, description="The checkpoint's job.")
    baseline_job_id: int | None = Field(None, description="The job it was compared with.")
    baseline_checkpoint: str | None = Field(None, description="The baseline's checkpoint, when it has one.")
    rule: RegressionRule | None = Field(None, description="The rule applied.")
    comparisons: int = Field(0, description="Checks the confidence was split over (Bonferroni divisor).")
    batch_sizes: tuple[BatchSizeVerdict, ...] = Field((), description="The checks, per batch size.")

    def to_pandas(self) -> pd.DataFrame:
        """One row per batch size's checks (`BatchSizeVerdict`, the worst drop as `worst_drop_*` columns),
        with the schedule, checkpoint and verdict as columns."""
        same = {"schedule": self.schedule, "checkpoint": self.checkpoint, "verdict": self.verdict.value}
        return records_frame(self.batch_sizes, same=same)
