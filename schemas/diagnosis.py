"""A diagnosis: the battery of jobs `posbias diagnose` plans for a model, and the verdict it reads from them,
one per suspect and line of evidence."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import Field

from posbias.schemas.curve import Interval
from posbias.schemas.job_spec import JobSpec
from posbias.schemas.record import Record
from posbias.schemas.shard_work import ModelInfo


class Line(StrEnum):
    """A line of evidence: what the curve does under a separating design, what an intervention on the
    architecture changes, where the attention goes."""

    behaviour = "behaviour"
    intervention = "intervention"
    mechanism = "mechanism"


class Suspect(StrEnum):
    """A cause of a position curve that a diagnosis weighs."""

    window = "sliding window"
    rope = "RoPE distance decay"
    slot = "answer slot"
    position = "position"
    collapse = "option-letter collapse"


class Call(StrEnum):
    """What one line of evidence says of one suspect."""

    implicated = "implicated"
    ruled_out = "ruled out"
    cannot_tell = "cannot tell"
    not_tested = "not tested"


class BatteryJob(Record):
    """One job of a diagnosis's battery: an ordinary job, submitted under its idempotency key."""

    line: Line = Field(description="The line of evidence it serves.")
    purpose: str = Field(description="What it is for, in words.")
    key: str = Field(
        description="Its idempotency key (`diagnose/<digest>/<name>`): the same plan, the same job."
    )
    spec: JobSpec = Field(description="The job spec.")


class Battery(Record):
    """What `posbias diagnose` submits for a model, planned from its config facts alone."""

    model: str = Field(description="The model.")
    facts: ModelInfo = Field(description="The config facts the plan was made from.")
    budget: int = Field(description="Trials the battery may use in all.")
    batch_size: int = Field(description="N of every job of the battery.")
    digest: str = Field(
        description="Digest of the plan: its jobs' keys carry it (after `--replan`, a job the plan shares "
        "with the battery it replaced keeps that job's key)."
    )
    jobs: tuple[BatteryJob, ...] = Field(description="The jobs, in the order they are submitted.")
    notes: tuple[str, ...] = Field((), description="What was left out of the plan, and why.")

    @property
    def total_trials(self) -> int:
        """Prompts the battery renders in all, every variant's."""
        return sum(job.spec.total_trials for job in self.jobs)


class BatteryRequest(Record):
    """What a `posbias diagnose` call asks for, as given: the battery stored for it is found by this, whatever
    a newer planner would derive from it."""

    model: str = Field(description="The model, as given.")
    engine: str = Field(description="The engine of the behaviour and intervention jobs.")
    budget: int = Field(description="Trials the battery may use in all.")
    seed: int = Field(description="Seed of the battery's trials.")
    fake: dict[str, Any] | None = Field(
        None, description="Engine fake: the settings given (those set, not the defaults filled in)."
    )

    @property
    def key(self) -> str:
        """The request's digest: the stored battery's unique key."""
        data = [self.model, self.engine, self.budget, self.seed, self.fake]
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


class Finding(Record):
    """What one line of evidence says of one suspect."""

    line: Line = Field(description="The line of evidence.")
    call: Call = Field(description="Implicated, ruled out, cannot tell, or not tested by this line.")
    measure: str = Field(description="What was measured, e.g. `step at the window (explain)`.")
    effect: Interval | None = Field(None, description="The effect with its 95% interval, in `unit`.")
    unit: str = Field(
        "points",
        description="The effect's unit: `points` (accuracy points), `AUROC` (attention predicting "
        "correctness; 0.5 is none) or `%` (a relative change of attention).",
    )
    bound: float | None = Field(None, description="Ruled out: no effect larger than +/- this, in `unit`.")
    reason: str = Field(description="Why this call.")
    settle: str | None = Field(
        None,
        description="For `cannot tell`: what would settle it: a larger budget (the command, the trials and "
        "prompt tokens it adds) or a change of design.",
    )
    job_ids: tuple[int, ...] = Field((), description="The jobs the number comes from.")
    variant: str | None = Field(None, description="The variant compared with the baseline, if any.")


class SuspectVerdict(Record):
    """One suspect: each line's finding and whether the lines agree."""

    suspect: Suspect = Field(description="The suspect.")
    call: Call = Field(description="The lines together: implicated or ruled out only when none disagrees.")
    agreement: str = Field(description="Whether the lines that decided agree, in words.")
    findings: tuple[Finding, ...] = Field(description="One per line of evidence.")


class Diagnosis(Record):
    """The verdicts of a battery whose jobs are done."""

    model: str = Field(description="The model.")
    batch_size: int = Field(description="N.")
    job_ids: tuple[int, ...] = Field(description="The battery's jobs.")
    suspects: tuple[SuspectVerdict, ...] = Field(description="One per suspect.")
    summary: str = Field(description="The suspects implicated and ruled out, in one sentence.")


class BatteryCost(Record):
    """What one job of a battery costs, from the dry run."""

    key: str = Field(description="The job's idempotency key.")
    trials: int = Field(description="Prompts, every variant's.")
    prompt_tokens: int = Field(description="Prompt tokens in all (the dry run's estimate).")
    gpu_seconds: float | None = Field(
        None, description="Estimated from the store's past jobs of this model and engine; None without any."
    )
    rate_source: str = Field(description="Where the GPU time estimate came from, or why there is none.")


class BatteryJobState(Record):
    """A submitted job of a battery."""

    line: Line = Field(description="The line of evidence it serves.")
    key: str = Field(description="Its idempotency key.")
    job_id: int = Field(description="The job's id.")
    created: bool = Field(description="False when the key named a job already (resubmitted).")
    status: str = Field(description="The job's status.")


class DiagnoseOutcome(Record):
    """What `posbias diagnose` did: planned (and costed), submitted, or read the diagnosis."""

    battery: Battery = Field(description="The plan: the stored battery of this request, or a fresh plan.")
    battery_read: bool = Field(
        False, description="The battery stored for this request at its first submit, read as submitted."
    )
    battery_stored_at: datetime | None = Field(
        None, description="When the battery was stored; None for a fresh plan not stored (a dry run's)."
    )
    battery_stored_by: str | None = Field(None, description="The posbias version that stored it.")
    plan_change: str | None = Field(
        None,
        description="A stored battery read: how a fresh plan of the same request would differ and how to "
        "get it (`--replan`), or why none can be made; None when it would not differ.",
    )
    replaced_stored_at: datetime | None = Field(
        None, description="`--replan`: when the battery it replaces (a dry run: would replace) was stored."
    )
    replaced_job_ids: tuple[int, ...] = Field(
        (), description="`--replan`: the replaced battery's jobs; they stay in the store."
    )
    costs: tuple[BatteryCost, ...] = Field((), description="Dry run: each job's cost.")
    jobs: tuple[BatteryJobState, ...] = Field((), description="Submitted: each job's id and status.")
    diagnosis: Diagnosis | None = Field(None, description="When every job is done: the verdicts.")
