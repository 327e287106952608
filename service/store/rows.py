"""A finished shard's results into the store: trial outcomes, result rows, the curve totals, and the model
and engine of each job and variant.

A shard's results are written in the transaction `queue.complete` opens, only while its lease is held, so a
re-delivered or late result changes nothing; this module moves the rows and never changes a shard's or a
job's status, and imports neither the queue nor the jobs (the queue locks the job rows and hands them over).
Results go in with `COPY` on PostgreSQL and `executemany` on SQLite; the per-(job, batch size, position)
totals in `curve_points` are incremented in the same transaction, so a curve is read from a few hundred rows
however many results there are (`service.stats.queries` reads them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, repeat
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import select
from sqlalchemy.orm import Session

from posbias.schemas import BASELINE, ModelInfo, ParseStatus, ShardResult, TrialStatus
from posbias.service.store.attention_store import write_attention
from posbias.service.store.database import dialect_insert
from posbias.service.store.tables import Job, JobVariant, Model, Trial

# Columns of `results` in the order both bulk paths write them, with the PostgreSQL types binary COPY sends
# (JSON goes as text: its binary form is its text).
RESULT_COLUMNS = {
    "trial_id": "int8",
    "job_id": "int8",
    "batch_size": "int4",
    "variant": "text",
    # From here on: the shard's `ResultColumns` of the same names.
    "position": "int4",
    "question_id": "text",
    "subject": "text",
    "gold": "int4",
    "predicted": "int4",
    "correct": "bool",
    "question_token_start": "int4",
    "question_token_end": "int4",
    "answer_token_index": "int4",
    "token_distance": "int4",
    "gold_prob": "float8",
    "answer_slot": "int4",
    "in_window": "bool",
    "visible_layers": "int4",
    "rope_distance": "int4",
    "parse_status": "text",
    "option_probs": "text",
}
_AS_STORED = {status: status.value for status in ParseStatus}
# JSON arrays of n probabilities to 8 significant digits: three times faster than json.dumps, whose float
# formatting was the largest cost of ingest per row.
_PROBS_JSON = {n: "[" + ",".join(["%.8g"] * n) + "]" for n in range(1, 33)}


class _TrialRow(NamedTuple):
    id: int
    batch_size: int
    variant: str


@dataclass(frozen=True)
class Written:
    """What `write_results` wrote, for `add_to_jobs`."""

    results: Mapping[int, ShardResult]
    """The results, by shard id."""
    trials: dict[int, dict[int, _TrialRow]]
    """The trials of each shard, by trial index."""


def write_results(session: Session, results: Mapping[int, ShardResult]) -> Written:
    """Move the results of shards (by shard id) into the store, in the caller's transaction: trial
    outcomes and result rows; then `add_to_jobs` adds them to their jobs.

    The queue calls this from `queue.complete` once it has locked the shards and checked their leases;
    marking them done is the queue's. Raises `ValueError` when a result does not match its shard's trials
    (before anything is written).
    """
    trials = _trials_of(session, sorted(results))
    for shard_id, result in results.items():
        _check_matches(result, trials[shard_id])
    if session.get_bind().dialect.name == "postgresql":
        # Not waiting for the WAL flush is safe here: a crash loses the whole transaction, results and
        # `done` together, so the shard stays leased, its lease expires and it runs again.
        session.execute(sa.text("SET LOCAL synchronous_commit = off"))
    _update_trials(session, [(result, trials[shard_id]) for shard_id, result in results.items()])
    if any(len(result.answers) for result in results.values()):
        _insert_results(
            session,
            chain.from_iterable(
                _result_rows(result, trials[shard_id]) for shard_id, result in results.items()
            ),
        )
    write_attention(session, results, trials)
    return Written(results=results, trials=trials)


def add_to_jobs(session: Session, written: Written, *, jobs: Mapping[int, Job], now: datetime) -> None:
    """Add `written` results to their jobs, in the caller's transaction: each job's (and each of its
    variants') model and engine (first write wins), and the curve totals.

    `jobs` are the results' jobs by id, locked by the caller: their row locks serialise the curve
    increments of concurrent writers of one job.
    """
    results, trials = written.results, written.trials
    unrecorded: set[tuple[int, str]] = {
        (job_id, variant)
        for job_id, variant in session.execute(
            select(JobVariant.job_id, JobVariant.variant).where(
                JobVariant.job_id.in_(sorted(jobs)), JobVariant.model_id.is_(None)
            )
        )
    }
    for shard_id, result in results.items():
        job = jobs[result.job_id]
        variant = next(iter(trials[shard_id].values())).variant if trials[shard_id] else BASELINE
        if job.model_id is None or (job.id, variant) in unrecorded:
            model_id = _model_id(session, result.model, now=now)
            if job.model_id is None:
                job.model_id = model_id
                job.engine = result.engine.model_dump(mode="json")
            if (job.id, variant) in unrecorded:
                _record_variant(session, job_id=job.id, variant=variant, result=result, model_id=model_id)
                unrecorded.discard((job.id, variant))
    trial_ids = sorted(trial.id for shard_id in results for trial in trials[shard_id].values())
    session.execute(CURVE_UPSERT, {"trial_ids": trial_ids})


def _trials_of(session: Session, shard_ids: Sequence[int]) -> dict[int, dict[int, _TrialRow]]:
    """The trials of each shard, by trial index."""
    found: dict[int, dict[int, _TrialRow]] = {shard_id: {} for shard_id in shard_ids}
    rows = session.execute(
        select(Trial.shard_id, Trial.index, Trial.id, Trial.batch_size, Trial.variant).where(
            Trial.shard_id.in_(shard_ids)
        )
    )
    for shard_id, index, trial_id, batch_size, variant in rows:
        found[shard_id][index] = _TrialRow(trial_id, batch_size, variant)
    return found


def _record_variant(
    session: Session, *, job_id: int, variant: str, result: ShardResult, model_id: int
) -> None:
    """The first result of a job's variant records what its engine built."""
    layers = result.model.layers
    session.execute(
        sa.update(JobVariant)
        .where(JobVariant.job_id == job_id, JobVariant.variant == variant)
        .values(
            model_id=model_id,
            engine=result.engine.model_dump(mode="json"),
            built_layers=None if layers is None else layers.model_dump(mode="json"),
        )
        .execution_options(synchronize_session=False)
    )


def overrides_key(overrides: Mapping[str, Any]) -> str:
    """A short digest of a model's config changes; '' for none (the model as published)."""
    if not overrides:
        return ""
    canonical = json.dumps(overrides, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _check_matches(result: ShardResult, trials: dict[int, _TrialRow]) -> None:
    reported = [t.trial_index for t in result.trials]
    if sorted(reported) != sorted(trials):
        raise ValueError(
            f"shard {result.shard_id}'s result reports trials {sorted(reported)}; "
            f"the shard holds {sorted(trials)}"
        )
    sizes = {
        t.trial_index: trials[t.trial_index].batch_size for t in result.trials if t.status is TrialStatus.done
    }
    answers = result.answers
    # The common case checked at C speed (every answer of a done trial, one batch size in the shard); the
    # answer-by-answer loop only for shards of several batch sizes, or to name the wrong answer.
    if set(answers.trial_index) <= sizes.keys() and (
        len(set(sizes.values())) == 1 and max(answers.position, default=1) <= next(iter(sizes.values()))
    ):
        return
    for index, position in zip(answers.trial_index, answers.position, strict=True):
        if not 1 <= position <= sizes.get(index, 0):
            raise ValueError(
                f"shard {result.shard_id}: a result for trial {index} position {position}, "
                "which is not a position of a done trial of the shard"
            )


def _model_id(session: Session, info: ModelInfo, *, now: datetime) -> int:
    """The id of the model row for `info` (its name, revision and config changes), inserting it on first
    sight (first write wins)."""
    revision = info.revision or ""
    key = overrides_key(info.hf_overrides)
    query = select(Model.id).where(
        Model.name == info.name, Model.revision == revision, Model.overrides_key == key
    )
    found = session.scalar(query)
    if found is not None:
        return found
    values = info.model_dump(exclude={"sliding_window_layers", "hf_overrides", "layers"})
    layers = info.layers
    values.update(
        revision=revision,
        created_at=now,
        sliding_window_layers=None
        if info.sliding_window_layers is None
        else list(info.sliding_window_layers),
        overrides=info.hf_overrides,
        overrides_key=key,
        layer_windows=None if layers is None else list(layers.windows),
        layer_rope_theta=None if layers is None else list(layers.rope_theta),
    )
    dialect = session.get_bind().dialect.name
    session.execute(
        dialect_insert(dialect, Model)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["name", "revision", "overrides_key"])
    )
    model_id = session.scalar(query)
    assert model_id is not None
    return model_id


# One statement compiled once, run as executemany (the ORM's bulk update by primary key costs more than the
# database's work for a shard's few trials).
TRIAL_UPDATE = sa.text(
    """
    UPDATE trials SET status = :status, skip_reason = :skip_reason, prompt_tokens = :prompt_tokens,
        output_tokens = :output_tokens, output_text = :output_text,
        filler_token_start = :filler_token_start, filler_token_end = :filler_token_end
    WHERE id = :id
    """
)


def _update_trials(session: Session, written: Sequence[tuple[ShardResult, dict[int, _TrialRow]]]) -> None:
    session.execute(
        TRIAL_UPDATE,
        [
            {
                "id": trials[t.trial_index].id,
                "status": t.status.value,
                "skip_reason": _storable(t.skip_reason),
                "prompt_tokens": t.prompt_tokens,
                "output_tokens": t.output_tokens,
                "output_text": _storable(t.output_text),
                "filler_token_start": t.filler_token_start,
                "filler_token_end": t.filler_token_end,
            }
            for result, trials in written
            for t in result.trials
        ],
    )


def _storable(text: str | None) -> str | None:
    """A model's text as both stores keep it: PostgreSQL refuses NUL in text, and a model may write one.
    It becomes U+FFFD, the replacement character, rather than failing the shard's write forever."""
    return text.replace("\x00", "\ufffd") if text is not None and "\x00" in text else text


def _result_rows(result: ShardResult, trials: dict[int, _TrialRow]) -> Iterator[tuple[Any, ...]]:
    """The shard's answers as `results` rows, in `RESULT_COLUMNS` order: its columns zipped, each answer's
    trial looked up once, its option probabilities as JSON text."""
    answers = result.answers
    of = [trials[index] for index in answers.trial_index]
    return zip(
        [trial.id for trial in of],
        repeat(result.job_id),
        [trial.batch_size for trial in of],
        [trial.variant for trial in of],
        answers.position,
        answers.question_id,
        answers.subject,
        answers.gold,
        answers.predicted,
        answers.correct,
        answers.question_token_start,
        answers.question_token_end,
        answers.answer_token_index,
        answers.token_distance,
        answers.gold_prob,
        answers.answer_slot,
        answers.in_window,
        answers.visible_layers,
        answers.rope_distance,
        [_AS_STORED[status] for status in answers.parse_status],
        [None if probs is None else _probs_json(probs) for probs in answers.option_probs],
    )


def _probs_json(probs: tuple[float, ...]) -> str:
    template = _PROBS_JSON.get(len(probs))
    return template % probs if template else json.dumps(probs)


def _insert_results(session: Session, rows: Iterable[tuple[Any, ...]]) -> None:
    """Every row in one statement: binary `COPY` on PostgreSQL, one `executemany` on SQLite."""
    # The driver's own bulk path on the session's connection (so inside its transaction): SQLAlchemy's
    # per-row parameter processing would cost more than the database's work.
    driver = session.connection().connection.driver_connection
    assert driver is not None
    columns = ", ".join(RESULT_COLUMNS)
    if session.get_bind().dialect.name == "postgresql":
        statement = f"COPY results ({columns}) FROM STDIN (FORMAT BINARY)"
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types(list(RESULT_COLUMNS.values()))
            write = copy.write_row
            for row in rows:
                write(row)
    else:
        marks = ", ".join("?" * len(RESULT_COLUMNS))
        # SQLite checks `parse_status IN (...)` by building a temporary table of the five values for every
        # row (its CHECK code has no run-once guard): a third of the insert's cost (benchmarks/README.md).
        # The values here are `_AS_STORED` of `ParseStatus` members, which cannot fail it, so this insert
        # alone skips the check; every other write to the store keeps it.
        driver.execute("PRAGMA ignore_check_constraints = ON")
        try:
            driver.executemany(f"INSERT INTO results ({columns}) VALUES ({marks})", rows)
        finally:
            driver.execute("PRAGMA ignore_check_constraints = OFF")


# The shard's just-written results, totalled per (variant, batch size, position) by the database and added to
# the job's running totals. Portable: PostgreSQL and SQLite (3.24+) share this upsert syntax (SQLite needs the
# WHERE to tell the SELECT from the ON CONFLICT). Ordered, so concurrent writers lock the rows in one order.
CURVE_UPSERT = sa.text(
    """
    INSERT INTO curve_points
        (job_id, variant, batch_size, position, n, n_correct, n_parsed, gold_prob_sum, n_gold_prob)
    SELECT job_id, variant, batch_size, position, count(*),
        sum(CASE WHEN correct THEN 1 ELSE 0 END),
        sum(CASE WHEN parse_status = 'ok' THEN 1 ELSE 0 END),
        coalesce(sum(gold_prob), 0.0),
        count(gold_prob)
    FROM results
    WHERE trial_id IN :trial_ids
    GROUP BY job_id, variant, batch_size, position
    ORDER BY job_id, variant, batch_size, position
    ON CONFLICT (job_id, variant, batch_size, position) DO UPDATE SET
        n = curve_points.n + excluded.n,
        n_correct = curve_points.n_correct + excluded.n_correct,
        n_parsed = curve_points.n_parsed + excluded.n_parsed,
        gold_prob_sum = curve_points.gold_prob_sum + excluded.gold_prob_sum,
        n_gold_prob = curve_points.n_gold_prob + excluded.n_gold_prob
    """
).bindparams(sa.bindparam("trial_ids", expanding=True))
