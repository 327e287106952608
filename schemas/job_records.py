"""Jobs and shards as the queue tracks them, and what the job-level operations of the API return."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field, JsonValue

from posbias.schemas.curve import Curve
from posbias.schemas.endpoint import EndpointReport
from posbias.schemas.job_spec import JobSpec
from posbias.schemas.record import Record, records_frame
from posbias.schemas.shard_work import EngineInfo
from posbias.schemas.variant import BASELINE, LayerConfig

if TYPE_CHECKING:
    import pandas as pd


class JobStatus(StrEnum):
    """Where a job stands; it follows its shards."""

    queued = "queued"
    running = "running"
    done = "done"
    failed = "failed"
    """Every shard finished, and at least one is dead (ran out of attempts); `posbias retry` requeues them."""
    cancelled = "cancelled"


class ShardStatus(StrEnum):
    """Where a shard stands in the queue. Only `posbias.service.work.queue` moves a shard between them."""

    queued = "queued"
    leased = "leased"
    done = "done"
    dead = "dead"
    """Failed `max_attempts` times (or its leases lapsed `MAX_LAPSES` times); its last error is kept."""
    cancelled = "cancelled"
    """Its job was cancelled; a late result for it is discarded."""


FINISHED_JOB_STATUSES = frozenset({JobStatus.done, JobStatus.failed, JobStatus.cancelled})


class Submitted(Record):
    """What submitting a job did."""

    job_id: int = Field(description="The job's id.")
    created: bool = Field(
        description="False when the idempotency key already named a job: that job is returned, nothing is "
        "written."
    )
    trials: int = Field(description="Trials the job has.")
    shards: int = Field(description="Shards the job has.")


class JobProgress(Record):
    """How far a job has got (for a progress bar)."""

    job_id: int = Field(description="Job id.")
    status: JobStatus = Field(description="Where the job stands.")
    trials_total: int = Field(description="Trials planned.")
    trials_done: int = Field(description="Trials answered.")
    trials_skipped: int = Field(description="Trials skipped (e.g. the prompt did not fit the context).")
    shards: dict[ShardStatus, int] = Field(description="Shard count by status (every status, 0 when none).")

    @property
    def trials_finished(self) -> int:
        """Trials answered or skipped."""
        return self.trials_done + self.trials_skipped

    @property
    def finished(self) -> bool:
        """True once the job is done, failed or cancelled."""
        return self.status in FINISHED_JOB_STATUSES


class VariantRun(Record):
    """One variant of a job: what it asked of the engine at submit, and what the engine built."""

    name: str = Field(description="The variant's name (`baseline`, `global-only`, ...).")
    model_key: str = Field(description="Identity of its engine.")
    hf_overrides: dict[str, JsonValue] = Field(description="Config changes it loads the model with.")
    expected: LayerConfig | None = Field(
        description="What vLLM must build for it to run (None: the model as published, recorded only)."
    )
    built: LayerConfig | None = Field(
        description="Each layer's window and RoPE base read back from the engine that answered; None until "
        "its first result, or when the engine cannot say."
    )
    engine: EngineInfo | None = Field(description="The engine that answered; None until its first result.")


class EngineContext(Record):
    """The context length a vLLM job's engine starts with, and where the number came from (stored at submit:
    the machine that submits may lack the model's files, and a user should see what the engine will get)."""

    tokens: int | None = Field(description="`max_model_len` the engine starts with; None: the model's own.")
    source: str = Field(
        description="Where it came from, in words: the spec, the longest prompt counted with the tokenizer "
        "or estimated, and where the model's own limit was read (its config here or fetched from the hub)."
    )

    def describe(self) -> str:
        """`6,144 (the longest prompt ...)`, as the dry run and `posbias status` show it."""
        tokens = f"{self.tokens:,}" if self.tokens is not None else "the model's own"
        return f"{tokens} ({self.source})"


class JobRecord(Record):
    """A job as `posbias status` shows it."""

    id: int = Field(description="Job id.")
    spec: JobSpec = Field(description="The job spec as submitted.")
    model: str = Field(description="Model as submitted.")
    revision: str | None = Field(description="Model revision.")
    model_key: str = Field(description="Identity of the engine the job's shards need.")
    status: JobStatus = Field(description="Where the job stands.")
    priority: int = Field(description="Higher runs first.")
    created_at: datetime = Field(description="When it was submitted (UTC).")
    started_at: datetime | None = Field(description="When its first shard was leased.")
    finished_at: datetime | None = Field(description="When it became done, failed or cancelled.")
    error: str | None = Field(description="Why it failed, on one line.")
    idempotency_key: str | None = Field(description="The key it was submitted under, if any.")
    trials_total: int = Field(description="Trials planned.")
    shards_total: int = Field(description="Shards planned.")
    engine: EngineInfo | None = Field(
        description="What produced the answers (of the first variant that wrote any); None until the first "
        "result is written."
    )
    progress: JobProgress = Field(description="Trials done and skipped, shards by status, when it was read.")
    endpoint: EndpointReport | None = Field(
        None, description="openai: the endpoint's probed capabilities and how the job uses them."
    )
    variants: tuple[VariantRun, ...] = Field(
        (), description="Each variant: what it asked of the engine and what the engine built."
    )
    context: EngineContext | None = Field(
        None, description="vLLM: the context the engine starts with and its source; None for other engines."
    )


class JobChange(Record):
    """What cancelling or retrying a job did."""

    job: JobRecord = Field(description="The job as it is now.")
    shards: int = Field(description="Shards cancelled (cancel) or put back in the queue (retry).")


class ShardRecord(Record):
    """One shard of a job and where it stands."""

    id: int = Field(description="Shard id.")
    job_id: int = Field(description="Its job.")
    index: int = Field(description="0-based index within the job.")
    status: ShardStatus = Field(description="Where it stands in the queue.")
    attempts: int = Field(
        description="Failed attempts so far: its engine call failed, or its worker died running it."
    )
    max_attempts: int = Field(description="Failed attempts allowed before it is dead.")
    lapses: int = Field(
        0, description="Leases that lapsed without a result (its dispatcher died); not attempts."
    )
    lease_owner: str | None = Field(description="The dispatcher holding its lease, while leased.")
    lease_expires_at: datetime | None = Field(description="When that lease lapses without a heartbeat.")
    finished_at: datetime | None = Field(description="When it became done, dead or cancelled.")
    last_error: str | None = Field(description="The error of its last failed attempt.")
    trial_count: int = Field(description="Trials it holds.")
    variant: str = Field(BASELINE, description="The variant whose engine runs it.")


class BatchSizeEstimate(Record):
    """What one batch size of a job will send to the model."""

    batch_size: int = Field(description="N.")
    trials: int = Field(description="Prompts at this batch size.")
    shards: int = Field(description="Shards at this batch size.")
    mean_prompt_tokens: float = Field(description="Mean prompt length in tokens (of a sample of prompts).")
    max_prompt_tokens: int = Field(description="Longest prompt of the sample, in tokens.")


class DesignEstimate(Record):
    """What one batch size and filler length of a job's design send, and the token distances it covers."""

    batch_size: int = Field(description="N.")
    filler_tokens: int = Field(description="Filler length (0: none).")
    trials: int = Field(description="Prompts at this batch size and filler length.")
    mean_prompt_tokens: float = Field(description="Mean prompt length in tokens (of a sample of prompts).")
    max_prompt_tokens: int = Field(description="Longest prompt of the sample, in tokens.")
    min_distance: int | None = Field(
        None,
        description="Shortest token distance from a question's end to its answer over the sample, with the "
        "answers on the lines the design asks for (exact for constrained answers); None if not known.",
    )
    max_distance: int | None = Field(None, description="Longest such distance.")
    past_window: float | None = Field(
        None,
        description="Share of the sample's answers whose question is beyond the model's sliding window "
        "(distance >= window); None for a model without one (or not known here).",
    )


class DryRun(Record):
    """What a job would do, without enqueueing it."""

    spec: JobSpec = Field(description="The validated spec.")
    spec_hash: str = Field(description="Digest of the spec (same spec, same hash).")
    model_key: str = Field(description="Identity of the engine the job needs.")
    questions_in_pool: int = Field(description="Questions the job samples from.")
    source: str = Field(description="Where the questions come from.")
    tokenizer: str = Field(
        description="`the model's tokenizer` when prompts were counted with it, else how tokens were "
        "estimated."
    )
    counting: str = Field(
        "",
        description="How the sampled prompts' tokens were counted: exactly from each prompt's pieces (the "
        "fake engine's tokenizer), from its pieces with a few prompts tokenized whole to check (a model's "
        "tokenizer, which states no bound on how far text shapes a token), or each prompt tokenized whole; "
        "empty when no tokenizer here counted them (`tokenizer` says how).",
    )
    batch_sizes: tuple[BatchSizeEstimate, ...] = Field(description="One estimate per batch size.")
    max_model_len: int | None = Field(
        None,
        description="Context length the engine will start with: the spec's, or the longest prompt plus its "
        "answer budget, rounded up (None for engines that take none).",
    )
    model_context: int | None = Field(
        None, description="The model's own context limit, from its config; None when it is not known here."
    )
    context: EngineContext | None = Field(
        None, description="vLLM: the context the engine will start with and where the number came from."
    )
    endpoint: EndpointReport | None = Field(
        None, description="openai: the endpoint's capabilities, the mode the job would use, its token bound."
    )
    max_job_tokens: int | None = Field(None, description="openai: the job's cost guard, when it has one.")
    design: str = Field("", description="The design in words: trials, answer order, probe, filler.")
    sliding_window: int | None = Field(
        None, description="The model's sliding window in tokens; None without one or when not known here."
    )
    designs: tuple[DesignEstimate, ...] = Field(
        (), description="Per batch size and filler length: prompt lengths and the token distances covered."
    )

    @property
    def total_prompt_tokens(self) -> int:
        """Prompt tokens over the whole job (estimate)."""
        return round(sum(b.mean_prompt_tokens * b.trials for b in self.batch_sizes))

    def to_pandas(self) -> pd.DataFrame:
        """One row per batch size and filler length (`designs`; per batch size, `batch_sizes`, when the
        designs were not estimated), with the model as a column."""
        rows = self.designs or self.batch_sizes
        return records_frame(rows, same={"model": self.spec.model})


class DispatchSummary(Record):
    """What one dispatcher run did (`posbias worker`)."""

    owner: str = Field(description="The lease owner name this dispatcher used.")
    shards_written: int = Field(0, description="Shards whose results it wrote.")
    shards_failed: int = Field(0, description="Shard attempts that failed (sent back to the queue or dead).")
    shards_discarded: int = Field(
        0, description="Results it did not write: the lease was lost, or the job cancelled."
    )
    trials_done: int = Field(0, description="Trials in the shards it wrote.")
    results_written: int = Field(0, description="Result rows (answers) in the shards it wrote.")
    engine_seconds: float = Field(
        0.0,
        description="The written shards' time inside their engine calls (each shard's share of its call), "
        "summed over actors: more than `seconds` when several actors answered at once.",
    )
    store_seconds: float = Field(0.0, description="Wall time it spent writing results to the store.")
    loads: dict[str, int] = Field(default_factory=dict, description="Model loads, by model key.")
    load_seconds: dict[str, float] = Field(
        default_factory=dict, description="Seconds its actors spent loading each model, by model key."
    )
    jobs_finished: tuple[int, ...] = Field((), description="Jobs it worked on that finished.")
    seconds: float = Field(0.0, description="Wall time of the run.")
    interrupted: bool = Field(False, description="True when it stopped on SIGTERM or Ctrl-C.")

    @property
    def trials_per_second(self) -> float:
        """Trials written per second of the run's wall time (0 for a run of no time)."""
        return self.trials_done / self.seconds if self.seconds > 0 else 0.0

    @property
    def results_per_second(self) -> float:
        """Result rows written per second of the run's wall time."""
        return self.results_written / self.seconds if self.seconds > 0 else 0.0

    @property
    def store_rows_per_second(self) -> float:
        """Result rows written per second spent writing them: the store's own rate."""
        return self.results_written / self.store_seconds if self.store_seconds > 0 else 0.0


class RunOutcome(Record):
    """A job submitted and run here to the end (`posbias run`)."""

    job: JobRecord = Field(description="The job as it ended.")
    curves: tuple[Curve, ...] = Field(description="Its curves by position, when it is done; else none.")
    dispatch: DispatchSummary = Field(description="What the dispatcher did.")


class ExportSummary(Record):
    """What `export_results` wrote."""

    job_id: int = Field(description="The job exported.")
    path: Path = Field(description="The file written.")
    format: str = Field(description="`csv` or `parquet`.")
    rows: int = Field(description="Result rows written.")
