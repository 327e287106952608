"""Regression schedules: the rule a new checkpoint is judged by, and the verdict it gets.

Both are stored as JSON (the rule on its schedule, the verdict's numbers on its checkpoint) and the verdict is
what the webhook receives, so each field says what it means.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, model_validator

from posbias.schemas.curve import Interval
from posbias.schemas.record import Record


class ScheduleSource(StrEnum):
    """Where a schedule finds new checkpoints."""

    folder = "folder"
    """Subfolders of a local (or mounted) folder, each one checkpoint."""
    hub = "hub"
    """Revisions of a Hugging Face repository."""


class HubRevisions(StrEnum):
    """Which revisions of a hub repository count as checkpoints."""

    commits = "commits"
    """Each new commit on one branch (from the branch's head when the schedule first looks)."""
    branches = "branches"
    """Each branch or tag other than that branch (e.g. `step1000`), at the commit it names when found."""


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
    """When a checkpoint counts as a regression against its baseline. At least one limit must be set.

    Every check is a point estimate beyond its limit AND an interval that excludes zero, with the
    intervals widened (Bonferroni) for the number of comparisons made, so that a checkpoint that is as good
    as its baseline is flagged with probability at most 1 - `confidence` per check.
    """

    model_config = ConfigDict(allow_inf_nan=False)

    max_drop: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Percentage points: a regression when accuracy at some position drops by more than this "
        "and the simultaneous interval of the difference lies below zero.",
    )
    max_ratio_drop: float | None = Field(
        None,
        gt=0,
        description="A regression when the last/first accuracy ratio moves further from 1 (more position "
        "bias) by more than this, and the bootstrap interval of that change lies above zero.",
    )
    confidence: float = Field(
        0.95, gt=0.5, lt=1.0, description="Family-wise confidence of the intervals the checks use."
    )

    @model_validator(mode="after")
    def _one_limit(self) -> Self:
        if self.max_drop is None and self.max_ratio_drop is None:
            raise ValueError("give a regression rule: --max-drop POINTS and/or --max-ratio-drop RATIO")
        return self

    def describe(self) -> str:
        """The rule in words, e.g. `drop > 5 points at any position, or ratio worse by > 0.2`."""
        parts = []
        if self.max_drop is not None:
            parts.append(f"drop > {self.max_drop:g} points at any position")
        if self.max_ratio_drop is not None:
            parts.append(f"last/first ratio worse by > {self.max_ratio_drop:g}")
        return " or ".join(parts) + f" ({self.confidence:.0%} confidence)"


class PositionDrop(Record):
    """Candidate minus baseline accuracy at one position."""

    position: int = Field(description="1-based position.")
    accuracy_baseline: float = Field(description="Baseline accuracy at this position.")
    accuracy_candidate: float = Field(description="Candidate accuracy at this position.")
    n_baseline: int = Field(description="Baseline answers at this position.")
    n_candidate: int = Field(description="Candidate answers at this position.")
    diff: float = Field(description="accuracy_candidate - accuracy_baseline (negative is a drop).")
    ci_low: float = Field(description="Simultaneous interval of the difference (Newcombe), lower bound.")
    ci_high: float = Field(description="Simultaneous interval of the difference, upper bound.")
    flagged: bool = Field(description="Dropped by more than `max_drop` with the interval below zero.")


class RatioChange(Record):
    """How the last/first accuracy ratio changed (cluster bootstrap over trials, jobs resampled apart)."""

    baseline: Interval = Field(description="Baseline last/first ratio.")
    candidate: Interval = Field(description="Candidate last/first ratio.")
    worsening: Interval = Field(
        description="|candidate - 1| - |baseline - 1|: how much further from 1 (no position effect) the "
        "candidate's ratio is; positive is worse."
    )
    flagged: bool = Field(description="Worse by more than `max_ratio_drop` with the interval above zero.")


class BatchSizeVerdict(Record):
    """The checks at one batch size."""

    batch_size: int = Field(description="N.")
    positions: int = Field(description="Positions compared.")
    worst_drop: PositionDrop | None = Field(
        description="The largest flagged drop, else the largest drop (None when no position was compared)."
    )
    drop_flagged: bool = Field(description="Some position fired the `max_drop` check.")
    ratio: RatioChange | None = Field(
        None, description="The ratio check; None when the rule has no `max_ratio_drop` or N is 1."
    )
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
    comparisons: int = Field(0, description="Position comparisons made (the Bonferroni divisor).")
    batch_sizes: tuple[BatchSizeVerdict, ...] = Field((), description="The checks, per batch size.")
