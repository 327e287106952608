"""The dispatcher with a real local Ray and the fake engine: exact results through crashes and restarts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from support.job_runs import dispatch, summary_of, worker_process
from support.results import expected_rows, result_rows
from support.waiting import wait_for

from posbias.schemas import Submitted
from posbias.service import jobs
from posbias.service.database import Database
from posbias.service.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.tables import JobStatus, ShardStatus

pytestmark = pytest.mark.usefixtures("ray_session")


def test_a_job_of_several_batch_sizes_completes_with_exact_rows(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(db, batch_sizes=(1, 3, 5), iterations=6, shard_size=2).job_id
    summary = dispatch(db, fast_settings(db.url))

    assert jobs.get(db, job).status is JobStatus.done
    rows, distinct = result_rows(db, job)
    assert rows == distinct == expected_rows(db, job) == 6 * (1 + 3 + 5)
    assert summary.trials_done == 18
    with db.read() as session:
        aggregated = session.execute(
            text("SELECT sum(n) FROM curve_points WHERE job_id = :j"), {"j": job}
        ).scalar_one()
    assert aggregated == rows


def test_two_jobs_of_one_model_in_a_row_load_it_once(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    first = make_job(db, iterations=2).job_id
    dispatcher = Dispatcher(db, settings=fast_settings(db.url))
    try:
        dispatcher.run(until_empty=True)
        second = make_job(db, iterations=3, seed=7).job_id
        dispatcher.run(until_empty=True)
        loads = dict(dispatcher.pools.loads)
    finally:
        dispatcher.close()
    assert jobs.get(db, first).status is JobStatus.done
    assert jobs.get(db, second).status is JobStatus.done
    assert list(loads.values()) == [1]


def test_an_actor_killed_mid_shard_is_rerun_elsewhere_without_duplicates(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(db, batch_sizes=(3,), iterations=8, shard_size=2, fake={"delay_s": 0.4}).job_id
    key = jobs.get(db, job).model_key
    dispatcher = Dispatcher(db, settings=fast_settings(db.url))
    killed: list[int] = []

    def kill_one_actor() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            if key in dispatcher.pools.busy_keys():
                pid = dispatcher.pools.actor_pids(key)[0]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_one_actor)
    killer.start()
    try:
        summary = dispatcher.run(until_empty=True)
    finally:
        killer.join()
        dispatcher.close()

    assert killed, "the test never saw a shard in flight"
    assert summary.shards_failed >= 1
    shards = jobs.shards(db, job)
    retried = [s for s in shards if s.attempts >= 1]  # a worker that died running it is a failed attempt
    assert retried and all("worker died" in (s.last_error or "") for s in retried)
    assert jobs.get(db, job).status is JobStatus.done
    rows, distinct = result_rows(db, job)
    assert rows == distinct == expected_rows(db, job)


def test_a_model_that_fails_to_load_fails_its_job_and_others_carry_on(
    db: Database,
    make_job: Callable[..., Submitted],
    fast_settings: Callable[..., Settings],
    tmp_path: Path,
) -> None:
    # A vLLM job whose model folder disappeared after it was submitted.
    missing = tmp_path / "deleted-model"
    broken = make_job(db, model=str(missing), engine={"name": "vllm"}, batch_sizes=(2,), iterations=2).job_id
    healthy = make_job(db, iterations=2).job_id

    dispatch(db, fast_settings(db.url))

    failed = jobs.get(db, broken)
    assert failed.status is JobStatus.failed
    assert failed.error is not None and "does not exist" in failed.error
    assert "\n" not in failed.error
    assert jobs.get(db, healthy).status is JobStatus.done


# --- dispatchers as processes, as users run them ------------------------------------------------------


@pytest.mark.postgres
def test_two_dispatchers_on_one_postgres_queue_share_a_job_without_doubling(
    postgres_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    from posbias.service import database

    with database.connect(postgres_url) as db:
        job = make_job(db, batch_sizes=(2, 4), iterations=40, shard_size=1, fake={"delay_s": 0.1}).job_id
        shards = len(jobs.shards(db, job))
        workers = [worker_process(postgres_url, tmp_path, "--until-empty") for _ in range(2)]
        summaries = [summary_of(w) for w in workers]

        assert jobs.get(db, job).status is JobStatus.done
        written = [s["shards_written"] for s in summaries]
        assert sum(written) == shards
        assert all(w > 0 for w in written), f"one dispatcher did all the work: {written}"
        rows, distinct = result_rows(db, job)
        assert rows == distinct == expected_rows(db, job)


# SQLite here: on PostgreSQL, tests/integration/test_faults.py kills a dispatcher ten times in one job.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_dispatcher_killed_mid_job_and_restarted_finishes_it(
    database_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    from posbias.service import database

    with database.connect(database_url) as db:
        job = make_job(db, batch_sizes=(3,), iterations=10, shard_size=1, fake={"delay_s": 0.3}).job_id
        first = worker_process(database_url, tmp_path, "--until-empty")
        wait_for(lambda: jobs.progress(db, job).trials_done >= 2)
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
        leased = jobs.progress(db, job).shards[ShardStatus.leased]
        assert jobs.get(db, job).status is JobStatus.running

        second = worker_process(database_url, tmp_path, "--until-empty")
        summary_of(second)

        assert jobs.get(db, job).status is JobStatus.done
        rows, distinct = result_rows(db, job)
        assert rows == distinct == expected_rows(db, job)
        if leased:  # the killed dispatcher's leases went back to the queue, a lapse each and no attempt
            assert any(s.lapses >= 1 for s in jobs.shards(db, job))
            assert all(s.attempts == 0 for s in jobs.shards(db, job))


def test_sigterm_stops_leasing_finishes_in_flight_and_exits_cleanly(
    database_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    from posbias.service import database

    with database.connect(database_url) as db:
        job = make_job(db, batch_sizes=(2,), iterations=30, shard_size=1, fake={"delay_s": 0.3}).job_id
        process = worker_process(database_url, tmp_path, "--until-empty")
        wait_for(lambda: jobs.progress(db, job).trials_done >= 1)
        process.send_signal(signal.SIGTERM)
        summary = summary_of(process)

        assert summary["interrupted"] is True
        progress = jobs.progress(db, job)
        assert progress.shards[ShardStatus.leased] == 0, "a stopped dispatcher must not keep leases"
        assert 1 <= progress.trials_done < 30
        assert progress.shards[ShardStatus.queued] == 30 - progress.trials_done
        rows, distinct = result_rows(db, job)
        assert rows == distinct == 2 * progress.trials_done
        assert all(s.attempts == 0 and s.lapses == 0 for s in jobs.shards(db, job))
