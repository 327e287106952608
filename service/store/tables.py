"""The store's schema: its tables (SQLAlchemy 2 ORM). The migrations in `migrations/versions` build exactly
these; a test compares the two on SQLite and PostgreSQL.

Portability choices, the same on both dialects so one set of migrations serves both:

- integer keys are BIGINT on PostgreSQL and INTEGER on SQLite (SQLite only autoincrements `INTEGER PRIMARY
  KEY`);
- enums are strings with a CHECK constraint, not PostgreSQL enum types, so adding a status is a plain batch
  migration;
- timestamps are UTC: stored `timestamp with time zone` on PostgreSQL and naive-UTC text on SQLite, always
  returned timezone-aware.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Double,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from posbias.schemas import BASELINE, JobStatus, ParseStatus, ShardStatus, TrialStatus
from posbias.schemas.schedule import Announcement, BaselineKind, HubRevisions, ScheduleSource, Verdict

# Named constraints: SQLite batch migrations recreate tables and can only drop constraints that have names.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

Id = BigInteger().with_variant(Integer(), "sqlite")


class UtcDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on both dialects (SQLite has no time zones: it stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware (use datetime.now(UTC))")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _enum(enum: type[StrEnum], name: str) -> Enum:
    return Enum(
        enum,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        values_callable=lambda members: [member.value for member in members],
        validate_strings=True,
    )


class Base(DeclarativeBase):
    """Base of every table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UtcDateTime()}


def _variant() -> Mapped[str]:
    """A variant's name; rows written before variants existed are the baseline's."""
    return mapped_column(String(64), default=BASELINE, server_default=BASELINE)


class Model(Base):
    """A model's architecture facts, written at the first result of a job that ran it: one row per model,
    revision and config changes (`overrides`), as the engine built it (first write wins)."""

    __tablename__ = "models"
    __table_args__ = (UniqueConstraint("name", "revision", "overrides_key"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(500))
    # '' when the job named no revision: a UNIQUE constraint treats NULLs as distinct on both dialects.
    revision: Mapped[str] = mapped_column(String(200), default="")
    architecture: Mapped[str | None] = mapped_column(String(200))
    num_layers: Mapped[int | None] = mapped_column(Integer)
    sliding_window: Mapped[int | None] = mapped_column(Integer)
    sliding_window_layers: Mapped[list[int] | None] = mapped_column(JSON)
    rope_theta: Mapped[float | None] = mapped_column(Double)
    context_length: Mapped[int | None] = mapped_column(Integer)
    num_parameters: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    # The hf_overrides it was built with ({} as published) and their digest ('' for none), for the key.
    overrides: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict, server_default=text("'{}'"))
    overrides_key: Mapped[str] = mapped_column(String(16), default="", server_default="")
    # Per attention layer, as read back from the built model: window (null: global) and RoPE base.
    layer_windows: Mapped[list[int | None] | None] = mapped_column(JSON)
    layer_rope_theta: Mapped[list[float | None] | None] = mapped_column(JSON)


class Job(Base):
    """One submitted evaluation. `spec` is the `JobSpec` verbatim; model columns are copies for queries."""

    __tablename__ = "jobs"
    __table_args__ = (Index(None, "model", "revision"), Index(None, "status"))

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    spec_hash: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(500))
    revision: Mapped[str | None] = mapped_column(String(200))
    model_key: Mapped[str] = mapped_column(String(64))
    status: Mapped[JobStatus] = mapped_column(_enum(JobStatus, "job_status"))
    priority: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    # Engine name and version, dtype, attention backend, device: recorded from the first result written.
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # openai: a `schemas.endpoint.EndpointReport`, written at submit (what the endpoint can do, how the job
    # uses it, its token bound). No API key is ever part of it.
    endpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    model_id: Mapped[int | None] = mapped_column(Id, ForeignKey("models.id"))
    # vLLM: a `schemas.job_records.EngineContext`, written at submit (the engine's context and where it came
    # from).
    context: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    trials_total: Mapped[int] = mapped_column(Integer)
    shards_total: Mapped[int] = mapped_column(Integer)


class Shard(Base):
    """A unit of work in the queue: some trials of one job."""

    __tablename__ = "shards"
    __table_args__ = (
        UniqueConstraint("job_id", "index"),
        # The lease query: queued shards by priority, then oldest job, then shard order.
        Index(None, "status", "priority", "job_id", "index"),
        # Preferred model keys and the dispatcher's `pending_model_keys`.
        Index(None, "model_key", "status"),
        # A job's shards by status: is anything left to run, what is dead, what to cancel or retry.
        Index(None, "job_id", "status"),
    )

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    status: Mapped[ShardStatus] = mapped_column(_enum(ShardStatus, "shard_status"))
    # Failed tries of the shard itself (its engine call failed, or its worker died running it).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    # Leases that lapsed without a result: its dispatcher died or lost the store (`queue.MAX_LAPSES`).
    lapses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Times its model waited past the placement timeout or was refused GPU memory (`queue.give_up_waiting`).
    waits: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_owner: Mapped[str | None] = mapped_column(String(200))
    leased_at: Mapped[datetime | None]
    lease_expires_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    trial_count: Mapped[int] = mapped_column(Integer)
    # Copied from the job (and its variant's engine) so the lease query needs no join.
    model_key: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer)
    variant: Mapped[str] = _variant()


class Dispatcher(Base):
    """A running dispatcher, by its lease owner name: where it runs and when it last heartbeated.

    `machine` says where `pid` means something (the kernel's boot id and the process's PID namespace): a
    dispatcher on the same machine whose process is gone has died, and its leases are reclaimed at once.
    """

    __tablename__ = "dispatchers"
    __table_args__ = (Index(None, "machine"),)

    owner: Mapped[str] = mapped_column(String(200), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    machine: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    process_started: Mapped[int | None] = mapped_column(BigInteger)
    """The process's start time (clock ticks since boot), so a reused pid is not taken for it."""
    started_at: Mapped[datetime]
    heartbeat_at: Mapped[datetime]


class Trial(Base):
    """One prompt of a job: N question ids in order. Planned at submit; its outcome written with its shard."""

    __tablename__ = "trials"
    __table_args__ = (UniqueConstraint("job_id", "index"), Index(None, "shard_id"))

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    shard_id: Mapped[int] = mapped_column(Id, ForeignKey("shards.id", ondelete="CASCADE"))
    batch_size: Mapped[int] = mapped_column(Integer)
    iteration: Mapped[int] = mapped_column(Integer)
    rotation: Mapped[int] = mapped_column(Integer, default=0)
    question_ids: Mapped[list[str]] = mapped_column(JSON)
    choice_orders: Mapped[list[list[int]] | None] = mapped_column(JSON)
    # The design (migration 0006): positions in the order asked (NULL: forward), the probed position (NULL
    # unless the probe design), the filler's length as planned and its token span as rendered.
    answer_order: Mapped[list[int] | None] = mapped_column(JSON)
    probe_position: Mapped[int | None] = mapped_column(Integer)
    filler_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    filler_token_start: Mapped[int | None] = mapped_column(Integer)
    filler_token_end: Mapped[int | None] = mapped_column(Integer)
    status: Mapped[TrialStatus] = mapped_column(_enum(TrialStatus, "trial_status"))
    skip_reason: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    output_tokens: Mapped[int | None] = mapped_column(Integer)
    output_text: Mapped[str | None] = mapped_column(Text)
    variant: Mapped[str] = _variant()


class JobVariant(Base):
    """One variant of a job: what was asked of the engine (at submit) and what it built (at its first
    result). A job without variants has one, `baseline`."""

    __tablename__ = "job_variants"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    model_key: Mapped[str] = mapped_column(String(64))
    hf_overrides: Mapped[dict[str, Any]] = mapped_column(JSON)
    # A `LayerConfig`: what the variant asks vLLM to build (null: nothing checked), and what it built.
    expected_layers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    built_layers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    model_id: Mapped[int | None] = mapped_column(Id, ForeignKey("models.id"))
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class Question(Base):
    """A dataset question, stored once under its stable id: a leased shard is rebuilt from the store."""

    __tablename__ = "questions"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    subject: Mapped[str] = mapped_column(String(200))
    question: Mapped[str] = mapped_column(Text)
    choices: Mapped[list[str]] = mapped_column(JSON)
    answer: Mapped[int] = mapped_column(Integer)


class Result(Base):
    """One answer: a (trial, position) pair. The bulk of the store; written with COPY on PostgreSQL.

    `job_id`, `batch_size` and `subject` are copied from the trial and question so analyses need no joins.
    No column is a declared foreign key: PostgreSQL checks one with a trigger per inserted row, which cost
    about a third of the ingest rate (benchmarks/README.md). The one writer, `store.write_shard_result`,
    takes `trial_id` from the locked shard's own trials; deleting a job must delete its results explicitly.
    `option_probs` is a JSON array with 8 significant digits per probability.
    """

    __tablename__ = "results"
    # Every read of results picks a job's rows of one batch size, in trial order (migration 0011). Keyed by
    # trial, a shard's rows go in at one place in the index, not at one place per position.
    __table_args__ = (Index(None, "job_id", "batch_size", "trial_id"),)

    trial_id: Mapped[int] = mapped_column(Id, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Id)
    batch_size: Mapped[int] = mapped_column(Integer)
    question_id: Mapped[str] = mapped_column(String(255))
    subject: Mapped[str] = mapped_column(String(200))
    gold: Mapped[int] = mapped_column(Integer)
    predicted: Mapped[int | None] = mapped_column(Integer)
    correct: Mapped[bool] = mapped_column(Boolean)
    parse_status: Mapped[ParseStatus] = mapped_column(_enum(ParseStatus, "parse_status"))
    question_token_start: Mapped[int | None] = mapped_column(Integer)
    question_token_end: Mapped[int | None] = mapped_column(Integer)
    answer_token_index: Mapped[int | None] = mapped_column(Integer)
    token_distance: Mapped[int | None] = mapped_column(Integer)
    gold_prob: Mapped[float | None] = mapped_column(Double)
    option_probs: Mapped[list[float] | None] = mapped_column(JSON)
    variant: Mapped[str] = _variant()
    # Migration 0006: the answer's line in the output, and what the model's sliding window made of it.
    answer_slot: Mapped[int | None] = mapped_column(Integer)
    in_window: Mapped[bool | None] = mapped_column(Boolean)
    visible_layers: Mapped[int | None] = mapped_column(Integer)
    # Migration 0012: the distance in position ids (token distance, plus the hf engine's position gap).
    rope_distance: Mapped[int | None] = mapped_column(Integer)


class CurvePoint(Base):
    """Running totals per (job, variant, batch size, position), incremented as each shard is written.

    `posbias curve` and the `position_curve` view read these instead of scanning `results`.
    """

    __tablename__ = "curve_points"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True, server_default=BASELINE)
    batch_size: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    n: Mapped[int] = mapped_column(Integer)
    n_correct: Mapped[int] = mapped_column(Integer)
    n_parsed: Mapped[int] = mapped_column(Integer)
    gold_prob_sum: Mapped[float] = mapped_column(Double)
    n_gold_prob: Mapped[int] = mapped_column(Integer)


# --- regression schedules ------------------------------------------------------------------------------


class Schedule(Base):
    """A regression schedule: where checkpoints appear, the job each gets, and how it is judged.

    `template` is the job spec without `model`/`revision` (the checkpoint fills them in); `rule` is a
    `schemas.schedule.RegressionRule`.
    """

    __tablename__ = "schedules"

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    source_kind: Mapped[ScheduleSource] = mapped_column(_enum(ScheduleSource, "schedule_source"))
    source: Mapped[str] = mapped_column(String(1000))
    """An absolute folder path, or a hub repository id."""
    hub_branch: Mapped[str | None] = mapped_column(String(200))
    hub_revisions: Mapped[HubRevisions | None] = mapped_column(_enum(HubRevisions, "hub_revisions"))
    template: Mapped[dict[str, Any]] = mapped_column(JSON)
    baseline: Mapped[BaselineKind] = mapped_column(_enum(BaselineKind, "baseline_kind"))
    baseline_job_id: Mapped[int | None] = mapped_column(Id, ForeignKey("jobs.id"))
    rule: Mapped[dict[str, Any]] = mapped_column(JSON)
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]
    last_tick_at: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    """What stopped the last tick from looking for checkpoints (hub unreachable, folder gone); None if
    nothing."""


class Checkpoint(Base):
    """One checkpoint of a schedule, found once: its job and its verdict.

    Unique per (schedule, name), so two ticks racing to record the same checkpoint write one row; its job
    is submitted with an idempotency key, so they also get one job.
    """

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("schedule_id", "name"), Index(None, "verdict"))

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    schedule_id: Mapped[int] = mapped_column(Id, ForeignKey("schedules.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(255))
    step: Mapped[int | None] = mapped_column(BigInteger)
    """Sort key: a folder's or branch's trailing number, a commit's place in its branch's history."""
    model: Mapped[str] = mapped_column(String(1000))
    """What the job's `model` is: the checkpoint folder, or the hub repository id."""
    revision: Mapped[str | None] = mapped_column(String(200))
    discovered_at: Mapped[datetime]
    job_id: Mapped[int | None] = mapped_column(Id, ForeignKey("jobs.id", ondelete="SET NULL"))
    verdict: Mapped[Verdict] = mapped_column(_enum(Verdict, "checkpoint_verdict"))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    """A `schemas.schedule.VerdictDetail`: the reason and the numbers behind the verdict."""
    evaluated_at: Mapped[datetime | None]
    baseline_job_id: Mapped[int | None] = mapped_column(Id, ForeignKey("jobs.id", ondelete="SET NULL"))
    announcement: Mapped[Announcement | None] = mapped_column(_enum(Announcement, "announcement"))
    """None when there is nothing to post (no webhook configured when the verdict was reached)."""
    announce_attempts: Mapped[int] = mapped_column(Integer, default=0)
    announce_error: Mapped[str | None] = mapped_column(Text)
    announced_at: Mapped[datetime | None]


# --- diagnoses (migration 0013) ----------------------------------------------------------------------------


class BatteryRow(Base):
    """A battery `posbias diagnose` submitted, one per request: what was asked (as given, never what the
    planner derived from it) and the `schemas.diagnosis.Battery` as submitted, so that the same command
    reads the same jobs whatever a newer planner would make of it. `request_key` is the request's digest."""

    __tablename__ = "batteries"
    __table_args__ = (Index(None, "model"),)

    id: Mapped[int] = mapped_column(Id, primary_key=True)
    request_key: Mapped[str] = mapped_column(String(64), unique=True)
    model: Mapped[str] = mapped_column(String(500))
    engine: Mapped[str] = mapped_column(String(64))
    budget: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(BigInteger)
    fake: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    battery: Mapped[dict[str, Any]] = mapped_column(JSON)
    posbias_version: Mapped[str] = mapped_column(String(64))
    stored_at: Mapped[datetime]


# --- attention (engine `hf`, migration 0010) -------------------------------------------------------------


class AttentionPoint(Base):
    """Where one answer line's attention went in one layer: a (trial, position, layer) of an `hf` job
    (`schemas.attention.AttentionRow`). Like `results`, no declared foreign key (rows are many: N times the
    layers per trial); `job_id`, `batch_size` and `variant` are copied from the trial."""

    __tablename__ = "attention"
    __table_args__ = (Index(None, "job_id", "batch_size", "position"),)

    trial_id: Mapped[int] = mapped_column(Id, primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    layer: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(Id)
    batch_size: Mapped[int] = mapped_column(Integer)
    variant: Mapped[str] = _variant()
    layer_kind: Mapped[str] = mapped_column(String(16))
    token_distance: Mapped[int | None] = mapped_column(Integer)
    query_tokens: Mapped[int] = mapped_column(Integer)
    own_mean: Mapped[float] = mapped_column(Double)
    own_max: Mapped[float] = mapped_column(Double)
    sink_mean: Mapped[float] = mapped_column(Double)
    sink_max: Mapped[float] = mapped_column(Double)
    other_mean: Mapped[float] = mapped_column(Double)
    other_max: Mapped[float] = mapped_column(Double)
    instructions_mean: Mapped[float] = mapped_column(Double)
    instructions_max: Mapped[float] = mapped_column(Double)
    answers_mean: Mapped[float] = mapped_column(Double)
    beyond_window_mean: Mapped[float | None] = mapped_column(Double)
    beyond_window_max: Mapped[float | None] = mapped_column(Double)


class AttentionLayer(Base):
    """One layer of an `hf` job's variant as built, with its mask canary (`schemas.attention.LayerCheck`);
    first write wins."""

    __tablename__ = "attention_layers"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True, server_default=BASELINE)
    layer: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    window: Mapped[int | None] = mapped_column(Integer)
    rope_theta: Mapped[float | None] = mapped_column(Double)
    beyond_mass: Mapped[float] = mapped_column(Double)
    edge_mass: Mapped[float] = mapped_column(Double)
    passed: Mapped[bool] = mapped_column(Boolean)


class AttentionRun(Base):
    """What recording an `hf` job's variant cost and how it was scored: the largest figures over its
    shards."""

    __tablename__ = "attention_runs"

    job_id: Mapped[int] = mapped_column(Id, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    variant: Mapped[str] = mapped_column(String(64), primary_key=True, server_default=BASELINE)
    answer_sheet: Mapped[str] = mapped_column(String(16))
    position_gap_safe: Mapped[bool | None] = mapped_column(Boolean)
    state_bytes_per_trial: Mapped[int] = mapped_column(BigInteger)
    map_bytes_peak: Mapped[int] = mapped_column(BigInteger)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
