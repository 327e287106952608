"""The queue as the dispatcher and the CLI use it: submit, lease, heartbeat, expiry, failure, dead letters,
cancel and retry, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
import sqlalchemy as sa

from posbias.schemas import ConflictError, JobSpec, NotFoundError, QuestionPool, ShardResult, Submitted
from posbias.service.store.database import Database, connect
from posbias.service.store.tables import JobStatus, ShardStatus
from posbias.service.work import jobs, planner, queue

MakeJob = Callable[..., Submitted]
Answer = Callable[..., ShardResult]

LEASE_S = 60.0


def _lease_all(db: Database, owner: str = "w1", *, job_ids: list[int] | None = None) -> list[queue.Lease]:
    return queue.lease(db, owner=owner, limit=100, lease_seconds=LEASE_S, job_ids=job_ids)


def _statuses(db: Database, job_id: int) -> list[ShardStatus]:
    return [shard.status for shard in jobs.shards(db, job_id)]


# --- submit -------------------------------------------------------------------------------------------


def test_submit_writes_the_planned_job(db: Database, make_job: MakeJob) -> None:
    submitted = make_job(db)

    assert submitted.created
    job = jobs.get(db, submitted.job_id)
    assert job.status is JobStatus.queued
    assert (job.model, job.trials_total, job.shards_total) == ("fake/model", 8, 4)
    assert job.spec.batch_sizes == (2, 3)
    progress = jobs.progress(db, submitted.job_id)
    assert (progress.trials_total, progress.trials_done, progress.trials_skipped) == (8, 0, 0)
    assert progress.shards[ShardStatus.queued] == 4
    assert [s.trial_count for s in jobs.shards(db, submitted.job_id)] == [2, 2, 2, 2]


def test_same_idempotency_key_returns_the_same_job(db: Database, make_job: MakeJob) -> None:
    first = make_job(db, key="nightly-1")
    again = make_job(db, key="nightly-1")

    assert first.created and not again.created
    assert again.job_id == first.job_id
    assert len(jobs.find(db)) == 1
    assert jobs.get(db, first.job_id).shards_total == 4  # nothing written twice
    assert make_job(db, key="nightly-2").created


def test_same_key_with_another_spec_is_a_conflict(db: Database, make_job: MakeJob) -> None:
    make_job(db, key="k")
    with pytest.raises(ConflictError, match=r"already names job .*use a new key"):
        make_job(db, key="k", iterations=5)


def test_concurrent_submits_with_one_key_make_one_job(database_url: str, make_job: MakeJob) -> None:
    results: list[Submitted] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def submit() -> None:
        with connect(database_url) as db:
            barrier.wait()
            try:
                results.append(make_job(db, key="race"))
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert sorted(r.created for r in results) == [False, False, False, True]
    assert len({r.job_id for r in results}) == 1
    with connect(database_url) as db:
        assert len(jobs.find(db)) == 1


@pytest.mark.postgres
def test_a_submit_that_loses_the_race_for_its_key_returns_the_winner(
    postgres_url: str, pool: QuestionPool
) -> None:
    # Deterministic version of the race: the winner has inserted its job but not committed when the loser
    # checks the key (and sees nothing), so the loser's insert waits on the unique index, then fails.
    spec = JobSpec.model_validate(
        {"model": "fake/model", "batch_sizes": (2,), "iterations": 2, "engine": {"name": "fake"}}
    )
    plan = planner.plan(spec, pool=pool)
    outcome: list[Submitted] = []
    with connect(postgres_url) as db:
        loser = threading.Thread(
            target=lambda: outcome.append(jobs.submit(db, spec, plan, idempotency_key="k"))
        )
        with db.write() as winner:
            winner_id = jobs._insert_job(winner, spec, plan, idempotency_key="k", spec_hash=spec.spec_hash())
            loser.start()
            while not _someone_waits_on_a_lock(db):
                loser.join(timeout=0.01)
                assert loser.is_alive(), "the loser finished before the winner committed"
        loser.join()
        assert outcome == [Submitted(job_id=winner_id, created=False, trials=2, shards=len(plan.shards))]
        assert [job.id for job in jobs.find(db)] == [winner_id]


def _someone_waits_on_a_lock(db: Database) -> bool:
    with db.read() as session:
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return bool(session.execute(sa.text(query)).scalar_one())


def test_submit_stores_questions_once_across_jobs(
    db: Database, make_job: MakeJob, pool: QuestionPool
) -> None:
    def stored() -> list[str]:
        with db.read() as session:
            return list(session.execute(sa.text("SELECT id FROM questions ORDER BY id")).scalars())

    def planned(seed: int) -> set[str]:
        spec = {"model": "fake/model", "batch_sizes": (2, 3), "iterations": 4, "shard_size": 2, "seed": seed}
        return set(
            planner.plan(JobSpec.model_validate({**spec, "engine": {"name": "fake"}}), pool=pool).questions
        )

    first, second = planned(0), planned(1)
    assert first & second and second - first  # the two jobs share some questions, not all
    make_job(db, seed=0)
    assert stored() == sorted(first)
    make_job(db, seed=0, iterations=3)  # a new job over questions all stored already
    assert stored() == sorted(first)
    make_job(db, seed=1)
    assert stored() == sorted(first | second)  # each shared question once
    assert len(jobs.find(db)) == 3


# --- lease --------------------------------------------------------------------------------------------


def test_a_lease_carries_the_planned_trials_and_their_questions(db: Database, pool: QuestionPool) -> None:
    spec = JobSpec.model_validate(
        {"model": "fake/model", "batch_sizes": (3,), "iterations": 2, "engine": {"name": "fake"}, "seed": 7}
    )
    plan = planner.plan(spec, pool=pool)
    job_id = jobs.submit(db, spec, plan).job_id

    (lease,) = queue.lease(db, owner="w1", limit=5, lease_seconds=LEASE_S)

    assert lease.attempt == 1
    shard = lease.shard
    assert (shard.job_id, shard.model, shard.model_key) == (job_id, "fake/model", spec.model_key())
    assert shard.trials == plan.trials
    assert shard.questions == {qid: plan.questions[qid] for t in plan.trials for qid in t.question_ids}
    assert jobs.get(db, job_id).status is JobStatus.running
    assert jobs.get(db, job_id).started_at is not None


def test_a_leased_shard_is_not_leased_again(db: Database, make_job: MakeJob) -> None:
    job_id = make_job(db).job_id
    first = queue.lease(db, owner="w1", limit=3, lease_seconds=LEASE_S)
    second = queue.lease(db, owner="w2", limit=3, lease_seconds=LEASE_S)

    assert [lease.shard.shard_id for lease in first] == [s.id for s in jobs.shards(db, job_id)[:3]]
    assert len(second) == 1
    assert {lease.shard_id for lease in first}.isdisjoint({lease.shard_id for lease in second})
    assert queue.lease(db, owner="w3", limit=3, lease_seconds=LEASE_S) == []
    assert {s.lease_owner for s in jobs.shards(db, job_id)} == {"w1", "w2"}


def test_lease_order_prefers_loaded_models_then_priority_then_older_jobs(
    db: Database, make_job: MakeJob
) -> None:
    old = make_job(db, model="fake/old").job_id
    urgent = make_job(db, model="fake/urgent", priority=5).job_id
    loaded = make_job(db, model="fake/loaded").job_id
    loaded_key = jobs.get(db, loaded).model_key

    leases = queue.lease(db, owner="w", limit=12, lease_seconds=LEASE_S, prefer_model_keys=[loaded_key])

    order = [(lease.shard.job_id, lease.shard.trials[0].index) for lease in leases]
    assert order == [
        *[(loaded, i) for i in (0, 2, 4, 6)],
        *[(urgent, i) for i in (0, 2, 4, 6)],
        *[(old, i) for i in (0, 2, 4, 6)],
    ]


def test_lease_can_be_limited_to_some_jobs(db: Database, make_job: MakeJob) -> None:
    make_job(db)
    mine = make_job(db, seed=3).job_id
    leases = _lease_all(db, job_ids=[mine])
    assert {lease.shard.job_id for lease in leases} == {mine}
    assert queue.pending_model_keys(db, job_ids=[mine]) == {jobs.get(db, mine).model_key}


# --- heartbeat, release, expiry -----------------------------------------------------------------------


def test_only_the_holder_extends_a_lease(db: Database, make_job: MakeJob) -> None:
    make_job(db)
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=LEASE_S)

    assert queue.heartbeat(db, [lease.shard_id], owner="w2", lease_seconds=600) == set()
    held = queue.heartbeat(db, [lease.shard_id, 999_999], owner="w1", lease_seconds=600)

    assert held == {lease.shard_id}
    (shard,) = [s for s in jobs.shards(db, lease.shard.job_id) if s.id == lease.shard_id]
    assert shard.lease_expires_at is not None
    assert shard.lease_expires_at > lease.expires_at + timedelta(seconds=500)


def test_release_gives_shards_back_without_spending_an_attempt(db: Database, make_job: MakeJob) -> None:
    job_id = make_job(db).job_id
    leases = _lease_all(db)
    ids = [lease.shard_id for lease in leases]

    assert queue.release(db, ids, owner="someone else") == 0
    assert queue.release(db, ids, owner="w1") == 4
    assert queue.heartbeat(db, ids, owner="w1", lease_seconds=LEASE_S) == set()
    assert [s.attempts for s in jobs.shards(db, job_id)] == [0, 0, 0, 0]
    assert [lease.attempt for lease in _lease_all(db, owner="w2")] == [1, 1, 1, 1]


def test_an_expired_lease_goes_back_to_the_queue_without_an_attempt_until_the_lapse_budget_is_spent(
    db: Database, make_job: MakeJob
) -> None:
    job_id = make_job(db, max_attempts=2, iterations=1, batch_sizes=(2,)).job_id
    (first,) = _lease_all(db)

    assert queue.recover_expired(db) == 0  # not expired yet
    assert queue.recover_expired(db, now=first.expires_at + timedelta(seconds=1)) == 1
    (shard,) = jobs.shards(db, job_id)
    assert shard.status is ShardStatus.queued
    assert (shard.attempts, shard.lapses) == (0, 1)
    assert shard.last_error is not None and "lease expired" in shard.last_error and "w1" in shard.last_error
    assert queue.heartbeat(db, [first.shard_id], owner="w1", lease_seconds=LEASE_S) == set()

    # A dispatcher that dies is not the shard's failure: it lapses far more often than max_attempts allows
    # failures, and each new lease is still its first attempt.
    for lapse in range(2, queue.MAX_LAPSES + 1):
        (lease,) = _lease_all(db, owner=f"w{lapse}")
        assert lease.attempt == 1
        assert jobs.get(db, job_id).status is JobStatus.running
        assert queue.recover_expired(db, now=lease.expires_at + timedelta(seconds=1)) == 1

    (shard,) = jobs.shards(db, job_id)
    assert shard.status is ShardStatus.dead
    assert (shard.attempts, shard.lapses) == (0, queue.MAX_LAPSES)
    assert (
        shard.last_error is not None and f"lapse {queue.MAX_LAPSES} of {queue.MAX_LAPSES}" in shard.last_error
    )
    job = jobs.get(db, job_id)
    assert job.status is JobStatus.failed
    assert job.finished_at is not None
    assert job.error is not None and "lease expired" in job.error
    assert _lease_all(db) == []


# --- fail, dead letters, retry ------------------------------------------------------------------------


def test_failures_requeue_until_the_shard_is_dead_then_retry_revives_it(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    job_id = make_job(db, max_attempts=2, iterations=1, batch_sizes=(2,)).job_id

    (lease,) = _lease_all(db)
    assert queue.fail(db, lease.shard_id, owner="intruder", error="not mine") is None
    assert queue.fail(db, lease.shard_id, owner="w1", error="CUDA out of memory") is ShardStatus.queued
    (lease,) = _lease_all(db)
    assert queue.fail(db, lease.shard_id, owner="w1", error="CUDA out of memory again") is ShardStatus.dead

    job = jobs.get(db, job_id)
    assert job.status is JobStatus.failed
    assert job.error == "1 of 1 shards failed after their last attempt: CUDA out of memory again"
    assert jobs.finished(db, job_id)
    (shard,) = jobs.shards(db, job_id)
    assert (shard.attempts, shard.last_error) == (2, "CUDA out of memory again")

    assert jobs.retry(db, job_id) == 1
    job = jobs.get(db, job_id)
    assert (job.status, job.finished_at, job.error) == (JobStatus.running, None, None)
    (lease,) = _lease_all(db)
    assert lease.attempt == 1
    assert queue.complete(db, [answer(lease.shard)], owner="w1")[0].written
    assert jobs.get(db, job_id).status is JobStatus.done
    with pytest.raises(ConflictError, match="no dead shards"):
        jobs.retry(db, job_id)


def test_a_job_with_a_dead_shard_fails_only_once_the_rest_is_finished(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    job_id = make_job(db, max_attempts=1).job_id
    leases = _lease_all(db)
    queue.fail(db, leases[0].shard_id, owner="w1", error="boom")
    assert jobs.get(db, job_id).status is JobStatus.running
    for lease in leases[1:]:
        queue.complete(db, [answer(lease.shard)], owner="w1")[0]
    assert jobs.get(db, job_id).status is JobStatus.failed
    assert _statuses(db, job_id) == [ShardStatus.dead, *[ShardStatus.done] * 3]


def test_fail_job_kills_what_is_left(db: Database, make_job: MakeJob) -> None:
    job_id = make_job(db).job_id
    queue.lease(db, owner="w1", limit=1, lease_seconds=LEASE_S)
    assert jobs.fail(db, job_id, error="model failed to load: no such file") == 4
    job = jobs.get(db, job_id)
    assert job.status is JobStatus.failed
    assert job.error is not None and job.error.endswith("model failed to load: no such file")
    assert jobs.fail(db, job_id, error="again") == 0
    assert jobs.retry(db, job_id) == 4


# --- cancel -------------------------------------------------------------------------------------------


def test_cancel_stops_queued_and_leased_shards(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db).job_id
    first, second = queue.lease(db, owner="w1", limit=2, lease_seconds=LEASE_S)
    queue.complete(db, [answer(first.shard)], owner="w1")[0]

    assert jobs.cancel(db, job_id) == 3

    assert _statuses(db, job_id) == [ShardStatus.done, *[ShardStatus.cancelled] * 3]
    job = jobs.get(db, job_id)
    assert job.status is JobStatus.cancelled and job.finished_at is not None
    assert queue.pending_model_keys(db) == set()
    assert _lease_all(db) == []
    late = queue.complete(db, [answer(second.shard)], owner="w1")[0]
    assert not late.written and late.reason is not None and "cancelled" in late.reason
    assert queue.heartbeat(db, [second.shard_id], owner="w1", lease_seconds=LEASE_S) == set()
    assert queue.fail(db, second.shard_id, owner="w1", error="x") is None
    with pytest.raises(ConflictError, match="already cancelled"):
        jobs.cancel(db, job_id)
    with pytest.raises(ConflictError, match="submit it again"):
        jobs.retry(db, job_id)


def test_cancelling_a_finished_job_is_a_conflict(db: Database, make_job: MakeJob, answer: Answer) -> None:
    job_id = make_job(db).job_id
    for lease in _lease_all(db):
        queue.complete(db, [answer(lease.shard)], owner="w1")[0]
    assert jobs.get(db, job_id).status is JobStatus.done
    with pytest.raises(ConflictError, match=f"job {job_id} is already done"):
        jobs.cancel(db, job_id)


def test_unknown_jobs_are_not_found(db: Database) -> None:
    for call in (jobs.cancel, jobs.retry, jobs.get, jobs.progress, jobs.shards):
        with pytest.raises(NotFoundError, match="there is no job 42: list jobs with `posbias status`"):
            call(db, 42)


# --- listings -----------------------------------------------------------------------------------------


def test_pending_model_keys_follow_queued_and_leased_shards(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    assert queue.pending_model_keys(db) == set()
    a = make_job(db, model="fake/a").job_id
    b = make_job(db, model="fake/b").job_id
    keys = {jobs.get(db, a).model_key, jobs.get(db, b).model_key}
    assert queue.pending_model_keys(db) == keys

    for lease in _lease_all(db, job_ids=[a]):
        assert queue.pending_model_keys(db) == keys  # leased still counts
        queue.complete(db, [answer(lease.shard)], owner="w1")[0]
    assert queue.pending_model_keys(db) == {jobs.get(db, b).model_key}


def test_list_jobs_filters_and_progress_counts(db: Database, make_job: MakeJob, answer: Answer) -> None:
    a = make_job(db, model="fake/a").job_id
    b = make_job(db, model="fake/b").job_id
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=LEASE_S)
    queue.complete(db, [answer(lease.shard, skip=lambda trial: trial == 1)], owner="w1")[0]

    assert [job.id for job in jobs.find(db)] == [b, a]
    assert [job.id for job in jobs.find(db, status=JobStatus.running)] == [a]
    assert [job.id for job in jobs.find(db, model="fake/b")] == [b]
    assert [job.id for job in jobs.find(db, limit=1)] == [b]
    progress = jobs.progress(db, a)
    assert (progress.trials_done, progress.trials_skipped, progress.trials_finished) == (1, 1, 2)
    assert progress.shards[ShardStatus.done] == 1 and progress.shards[ShardStatus.queued] == 3
    assert not progress.finished
