"""Writing shard results exactly once, and reading curves back: through the store's queries and through the
`position_curve` view with plain SQL, as an analyst would from psql or sqlite3."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from support.job_runs import answer_every_shard

from posbias.schemas import NotFoundError, ShardResult, Submitted
from posbias.service.reports import export
from posbias.service.stats import queries
from posbias.service.stats.intervals import wilson_interval
from posbias.service.stats.queries import PositionCount
from posbias.service.store.database import Database
from posbias.service.store.database_url import normalise_url
from posbias.service.store.tables import JobStatus, ShardStatus
from posbias.service.work import jobs, queue

MakeJob = Callable[..., Submitted]
Answer = Callable[..., ShardResult]
LEASE_S = 60.0


def _count(db: Database, table: str) -> int:
    with db.read() as session:
        return int(session.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


# --- writing ------------------------------------------------------------------------------------------


def test_writing_every_shard_finishes_the_job(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db).job_id
    leases = queue.lease(db, owner="w1", limit=10, lease_seconds=LEASE_S)

    outcome = queue.complete(db, [answer(leases[0].shard)], owner="w1")[0]
    assert outcome.written and outcome.reason is None
    assert outcome.results == 2 + 2  # two trials at batch size 2
    assert jobs.get(db, job_id).status is JobStatus.running
    for lease in leases[1:]:
        queue.complete(db, [answer(lease.shard)], owner="w1")[0]

    job = jobs.get(db, job_id)
    assert job.status is JobStatus.done and job.finished_at is not None
    assert job.engine is not None and (job.engine.name, job.engine.dtype) == ("fake", "float32")
    assert _count(db, "results") == 4 * 2 + 4 * 3
    progress = jobs.progress(db, job_id)
    assert (progress.trials_done, progress.finished) == (8, True)
    (model,) = queries.list_models(db)
    assert (model.name, model.revision, model.sliding_window_layers) == ("fake/model", None, (0, 2))


def test_a_redelivered_result_is_written_once(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db).job_id
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=LEASE_S)
    result = answer(lease.shard)

    assert queue.complete(db, [result], owner="w1")[0].written
    counts = queries.curve_counts(db, job_id=job_id)
    again = queue.complete(db, [result], owner="w1")[0]

    assert not again.written and again.reason == f"shard {lease.shard_id} is already done"
    assert _count(db, "results") == 4
    assert queries.curve_counts(db, job_id=job_id) == counts


def test_a_late_result_after_the_lease_moved_on_is_discarded(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    make_job(db, iterations=1, batch_sizes=(2,))
    (stale,) = queue.lease(db, owner="slow", limit=1, lease_seconds=LEASE_S)
    queue.recover_expired(db, now=stale.expires_at + timedelta(seconds=1))
    (fresh,) = queue.lease(db, owner="fast", limit=1, lease_seconds=LEASE_S)
    assert fresh.shard_id == stale.shard_id and fresh.attempt == 1  # a lapse is not an attempt

    late = queue.complete(db, [answer(stale.shard)], owner="slow")[0]
    assert not late.written
    assert late.reason == f"the lease on shard {stale.shard_id} was lost: it is leased by fast"
    assert _count(db, "results") == 0

    assert queue.complete(db, [answer(fresh.shard)], owner="fast")[0].written
    assert _count(db, "results") == 2


def test_a_result_for_an_expired_but_unclaimed_lease_is_still_written(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    # Nobody recovered it yet: the work is done, so keeping it beats redoing it.
    make_job(db, iterations=1, batch_sizes=(2,))
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=0.001)
    assert queue.complete(db, [answer(lease.shard)], owner="w1")[0].written


def test_a_result_that_does_not_match_its_shard_writes_nothing(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    make_job(db)
    first, second = queue.lease(db, owner="w1", limit=2, lease_seconds=LEASE_S)
    wrong = answer(first.shard).model_copy(update={"shard_id": second.shard_id})

    with pytest.raises(ValueError, match="reports trials"):
        queue.complete(db, [wrong], owner="w1")[0]

    assert _count(db, "results") == 0
    assert queue.heartbeat(db, [second.shard_id], owner="w1", lease_seconds=LEASE_S) == {second.shard_id}


def test_skipped_trials_have_no_results(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db, iterations=2, batch_sizes=(3,)).job_id
    answer_every_shard(db, job_id, answer, skip=lambda trial: trial == 0)

    progress = jobs.progress(db, job_id)
    assert (progress.trials_done, progress.trials_skipped) == (1, 1)
    assert _count(db, "results") == 3
    assert [c.n for c in queries.curve_counts(db, job_id=job_id)] == [1, 1, 1]
    assert jobs.shards(db, job_id)[0].status is ShardStatus.done


# --- reading ------------------------------------------------------------------------------------------


def _expected_counts(batch_size: int, trials: int, *, right: Callable[[int], bool]) -> list[PositionCount]:
    return [
        PositionCount(
            batch_size=batch_size,
            position=p,
            n=trials,
            n_correct=trials if right(p) else 0,
            n_parsed=trials,
            gold_prob_sum=pytest.approx((0.9 if right(p) else 0.1) * trials),
            n_gold_prob=trials,
        )
        for p in range(1, batch_size + 1)
    ]


def test_curve_counts_by_job_and_by_model(db: Database, make_job: MakeJob, answer: Answer) -> None:
    even = make_job(db, iterations=3).job_id
    answer_every_shard(db, even, answer)  # even positions right
    later = make_job(db, iterations=3, seed=9).job_id
    answer_every_shard(db, later, answer, correct=lambda trial, position: True)
    other = make_job(db, model="fake/other").job_id
    answer_every_shard(db, other, answer)

    assert queries.curve_counts(db, job_id=even, batch_size=3) == _expected_counts(
        3, 3, right=lambda p: p % 2 == 0
    )
    by_model = queries.curve_counts(db, model="fake/model", batch_size=2)
    assert [(c.position, c.n, c.n_correct) for c in by_model] == [(1, 6, 3), (2, 6, 6)]
    assert [(c.batch_size, c.position) for c in queries.curve_counts(db, model="fake/model")] == [
        (2, 1),
        (2, 2),
        (3, 1),
        (3, 2),
        (3, 3),
    ]
    assert queries.matching_jobs(db, model="fake/model") == [even, later]
    assert queries.matching_jobs(db, model="fake/model", revision="main") == []
    assert queries.curve_counts(db, model="nobody") == []


def test_unparsed_answers_count_as_wrong_and_lower_the_parse_rate(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    job_id = make_job(db, iterations=4, batch_sizes=(2,)).job_id
    answer_every_shard(
        db,
        job_id,
        answer,
        correct=lambda trial, position: True,
        unparsed=lambda trial, position: position == 1 and trial < 3,
    )
    first, second = queries.curve_counts(db, job_id=job_id)
    assert (first.n, first.n_correct, first.n_parsed) == (4, 1, 1)
    assert (second.n, second.n_correct, second.n_parsed) == (4, 4, 4)


def _raw_rows(url: str, query: str, params: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Run `query` with the database's own driver, no SQLAlchemy and no posbias connection hooks."""
    parsed = normalise_url(url)
    if parsed.get_backend_name() == "sqlite":
        with sqlite3.connect(str(parsed.database)) as connection:
            return connection.execute(query.replace("%s", "?"), params).fetchall()
    dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn) as connection:
        return connection.execute(query.encode(), params).fetchall()


def test_the_position_curve_view_answers_plain_sql(
    database_url: str, db: Database, make_job: MakeJob, answer: Answer
) -> None:
    job_id = make_job(db, iterations=4, batch_sizes=(4,), shard_size=1).job_id
    # Right at position 1 in no trial, at 2 in 3 of 4, at 3 in all but trial 0, where it did not parse;
    # at 4 in every trial.
    answer_every_shard(
        db,
        job_id,
        answer,
        correct=lambda trial, position: position >= 3 or (position == 2 and trial < 3),
        unparsed=lambda trial, position: (trial, position) == (0, 3),
    )

    rows = _raw_rows(
        database_url,
        "SELECT position, n, n_parsed, n_correct, accuracy, ci_low, ci_high, parse_rate, accuracy_strict, "
        "mean_gold_prob, job_id, revision FROM position_curve WHERE model = %s AND batch_size = 4 "
        "ORDER BY position",
        ("fake/model",),
    )

    assert [row[:4] for row in rows] == [(1, 4, 4, 0), (2, 4, 4, 3), (3, 4, 3, 3), (4, 4, 4, 4)]
    for position, n, m, k, accuracy, low, high, parse_rate, strict, gold_prob, job, revision in rows:
        # Accuracy is among parsed answers, with its Wilson interval over them; strict counts the one
        # failed parse (trial 0, position 3) as wrong.
        interval = wilson_interval(k, m)
        assert accuracy == pytest.approx(interval.estimate)
        assert low == pytest.approx(interval.low, abs=1e-12)
        assert high == pytest.approx(interval.high, abs=1e-12)
        assert 0.0 <= low <= accuracy <= high <= 1.0
        assert parse_rate == pytest.approx(0.75 if position == 3 else 1.0)
        assert strict == pytest.approx(k / n)
        assert gold_prob == pytest.approx((0.9 * k + 0.1 * (n - k)) / n)
        assert (job, revision) == (job_id, None)


def test_trial_data_has_one_row_per_answered_trial(db: Database, make_job: MakeJob, answer: Answer) -> None:
    a = make_job(db, iterations=3, batch_sizes=(2,)).job_id
    answer_every_shard(db, a, answer, skip=lambda trial: trial == 1)
    b = make_job(db, iterations=2, batch_sizes=(2,), seed=4).job_id
    answer_every_shard(db, b, answer, correct=lambda trial, position: trial == 0)

    data = queries.trial_data(db, job_ids=[a, b], batch_size=2)

    assert (data.batch_size, data.jobs, data.duplicates, data.cluster_unit) == (2, (a, b), 0, "trial")
    assert data.correct.tolist() == [[0.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]
    assert data.chance == pytest.approx(0.25)


def test_pooled_jobs_that_share_their_trials_count_them_once(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    first = make_job(db, iterations=3, batch_sizes=(2,)).job_id
    answer_every_shard(db, first, answer)
    again = make_job(db, iterations=3, batch_sizes=(2,), priority=1).job_id  # same seed: the same trials
    answer_every_shard(db, again, answer)

    data = queries.trial_data(db, job_ids=[first, again], batch_size=2)
    assert (data.trials, data.duplicates) == (3, 3)
    assert queries.trial_data(db, job_ids=[again], batch_size=2).trials == 3


def test_token_distance_rows(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db, iterations=1, batch_sizes=(2, 3)).job_id
    answer_every_shard(db, job_id, answer)

    found = queries.token_distance_rows(db, job_ids=[job_id], batch_size=2)
    rows = zip(found.token_distance, found.correct, found.parsed, found.gold_prob, strict=True)

    assert sorted((int(d), bool(c), bool(p), g) for d, c, p, g in rows) == [
        (7, True, True, pytest.approx(0.9)),
        (102, False, True, pytest.approx(0.1)),
    ]
    assert len(set(found.trial_id.tolist())) == 1
    assert queries.token_distance_rows(db, job_ids=[job_id]).trial_id.size == 5


def test_export_streams_every_result_in_trial_order(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db).job_id
    answer_every_shard(db, job_id, answer)

    rows = export.results_table(db, job_id).to_pylist()

    assert len(rows) == 4 * 2 + 4 * 3
    assert [(r["trial_index"], r["position"]) for r in rows[:5]] == [(0, 1), (0, 2), (1, 1), (1, 2), (2, 1)]
    first = rows[0]
    assert list(first) == [name for name, _ in export.RESULT_COLUMNS]
    assert (first["job_id"], first["batch_size"], first["iteration"], first["parse_status"]) == (
        job_id,
        2,
        0,
        "ok",
    )
    assert first["prompt_tokens"] == 200
    assert first["option_probs"] is not None
    assert first["option_probs"] == pytest.approx([0.1 if i == first["gold"] else 0.0 for i in range(4)])
    assert (
        first["predicted"] is not None and first["correct"] is False and first["predicted"] != first["gold"]
    )
    with pytest.raises(NotFoundError):
        export.result_batches(db, job_id + 1)
