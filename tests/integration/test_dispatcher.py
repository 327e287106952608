"""The dispatcher with a real local Ray and the fake engine: exact results through crashes and restarts."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import text
from support.job_runs import dispatch, summary_of, worker_process
from support.results import expected_rows, result_rows
from support.waiting import wait_for

from posbias.schemas import Submitted
from posbias.service.dispatch.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus, ShardStatus
from posbias.service.work import jobs

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
    from posbias.service.store import database

    with database.connect(postgres_url) as db:
        # Both are polling before the job exists (however long each Ray takes to start), so each leases a
        # shard at its first poll after the submit: neither can have finished 80 shards by then.
        workers = [worker_process(postgres_url, tmp_path) for _ in range(2)]
        try:
            wait_for(lambda: _dispatchers(db) == 2, timeout=240, what="two dispatchers polling")
            job = make_job(db, batch_sizes=(2, 4), iterations=40, shard_size=1, fake={"delay_s": 0.1}).job_id
            shards = len(jobs.shards(db, job))
            wait_for(lambda: jobs.get(db, job).status is JobStatus.done, what="the job done")
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
        summaries = [summary_of(w) for w in workers]

        written = [s["shards_written"] for s in summaries]
        assert sum(written) == shards
        assert all(w > 0 for w in written), f"one dispatcher did all the work: {written}"
        rows, distinct = result_rows(db, job)
        assert rows == distinct == expected_rows(db, job)


def _dispatchers(db: Database) -> int:
    """Dispatchers registered in the store: each registers as its loop starts."""
    with db.read() as session:
        return int(session.execute(text("SELECT count(*) FROM dispatchers")).scalar_one())


# SQLite here: on PostgreSQL, tests/integration/test_faults.py kills a dispatcher ten times in one job.
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_dispatcher_killed_mid_job_and_restarted_finishes_it(
    database_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    from posbias.service.store import database

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


def test_the_engine_actors_run_at_the_niceness_posbias_was_started_with(
    database_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    """Ray starts its workers at niceness 15, behind every ordinary process on the machine; the local Ray
    that `posbias worker` starts runs them, the engine actors, at the worker's own (benchmarks/README.md:
    one busy process at niceness 19 halved the engine's throughput at 15)."""
    import psutil

    from posbias.service.store import database

    def actors() -> list[psutil.Process]:
        found = []
        for process in psutil.Process(worker.pid).children(recursive=True):
            try:
                if " ".join(process.cmdline()).startswith("ray::ShardActor"):
                    found.append(process)
            except psutil.Error:
                continue
        return found

    with database.connect(database_url) as db:
        job = make_job(db, batch_sizes=(2,), iterations=8, shard_size=1, fake={"delay_s": 0.3}).job_id
        worker = worker_process(database_url, tmp_path, "--until-empty", niceness=3)
        try:
            wait_for(lambda: bool(actors()), what="the worker's engine actor")
            assert psutil.Process(worker.pid).nice() == 3
            assert {actor.nice() for actor in actors()} == {3}
        except BaseException:
            os.killpg(worker.pid, signal.SIGKILL)  # the worker and the Ray it started
            worker.communicate()
            raise
        summary_of(worker)
        assert jobs.get(db, job).status is JobStatus.done


def test_sigterm_stops_leasing_finishes_in_flight_and_exits_cleanly(
    database_url: str, make_job: Callable[..., Submitted], tmp_path: Path
) -> None:
    from posbias.service.store import database

    with database.connect(database_url) as db:
        job = make_job(db, batch_sizes=(2,), iterations=30, shard_size=1, fake={"delay_s": 0.3}).job_id
        process = worker_process(database_url, tmp_path, "--until-empty")
        in_flight: list[int] = []

        def running() -> bool:
            in_flight[:] = _leased(db, job)
            return bool(in_flight) and jobs.progress(db, job).trials_done >= 1

        wait_for(running, what="a shard in flight after one done")
        process.send_signal(signal.SIGTERM)
        summary = summary_of(process)

        assert summary["interrupted"] is True
        progress = jobs.progress(db, job)
        assert progress.shards[ShardStatus.leased] == 0, "a stopped dispatcher must not keep leases"
        assert 1 <= progress.trials_done < 30
        assert progress.shards[ShardStatus.queued] == 30 - progress.trials_done
        # The shards in flight when the signal came (leased a moment before it) were finished, not given
        # back: each is done with its two answers, written once.
        status = {s.id: s.status for s in jobs.shards(db, job)}
        assert [status[shard] for shard in in_flight] == [ShardStatus.done] * len(in_flight)
        assert _answers_by_shard(db, in_flight) == {shard: 2 for shard in in_flight}
        rows, distinct = result_rows(db, job)
        assert rows == distinct == 2 * progress.trials_done
        assert all(s.attempts == 0 and s.lapses == 0 for s in jobs.shards(db, job))


def test_a_drain_of_posbias_drain_seconds_0_gives_in_flight_shards_back_at_once(
    db: Database,
    make_job: Callable[..., Submitted],
    fast_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A shard takes 30 s here, so one that is back in the queue when the dispatcher returns was given back,
    # not finished: with no drain allowed, a stop does not wait for it.
    monkeypatch.setenv("POSBIAS_DRAIN_SECONDS", "0")
    settings = fast_settings(db.url)
    assert settings.drain_seconds == 0
    job = make_job(db, batch_sizes=(2,), iterations=2, shard_size=1, fake={"delay_s": 30}).job_id
    dispatcher = Dispatcher(db, settings=settings)
    in_flight: list[int] = []

    def stop_once_in_flight() -> None:
        wait_for(lambda: bool(dispatcher.writes.busy), what="a shard sent to an actor")
        in_flight[:] = _leased(db, job)
        dispatcher.request_stop()

    stopper = threading.Thread(target=stop_once_in_flight)
    stopper.start()
    try:
        summary = dispatcher.run(until_empty=True)
    finally:
        stopper.join()
        dispatcher.close()

    assert summary.interrupted and summary.shards_written == 0
    assert in_flight
    assert [s.status for s in jobs.shards(db, job)] == [ShardStatus.queued] * 2
    assert result_rows(db, job) == (0, 0)
    assert all(s.attempts == 0 and s.lease_owner is None for s in jobs.shards(db, job))


def _leased(db: Database, job_id: int) -> list[int]:
    return [s.id for s in jobs.shards(db, job_id) if s.status is ShardStatus.leased]


def _answers_by_shard(db: Database, shard_ids: list[int]) -> dict[int, int]:
    """Result rows per shard, for `shard_ids`."""
    query = text(
        "SELECT t.shard_id, count(*) FROM results r JOIN trials t ON t.id = r.trial_id "
        "WHERE t.shard_id IN :ids GROUP BY t.shard_id"
    ).bindparams(sa.bindparam("ids", expanding=True))
    with db.read() as session:
        return {int(shard): int(count) for shard, count in session.execute(query, {"ids": shard_ids})}
