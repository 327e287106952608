"""Four processes drain one queue of 1,000 shards: every shard is completed exactly once and no lease is ever
held by two owners. On PostgreSQL (SKIP LOCKED), and on SQLite (BEGIN IMMEDIATE: several workers on one host
sharing the embedded default)."""

from __future__ import annotations

import multiprocessing
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import sqlalchemy as sa

from posbias.schemas import (
    EngineInfo,
    JobSpec,
    ModelInfo,
    ParseStatus,
    Plan,
    PlannedShard,
    Question,
    QuestionResult,
    ShardResult,
    ShardSpec,
    Trial,
    TrialResult,
    TrialStatus,
)
from posbias.service.stats import queries
from posbias.service.store.database import connect
from posbias.service.store.tables import JobStatus, ShardStatus
from posbias.service.work import jobs, queue

SHARDS = 1_000
PROCESSES = 4
BATCH_SIZE = 2
FAIL_EVERY = 20
"""Shards whose id is a multiple of this fail their first attempt, so they are leased twice."""


class Event(NamedTuple):
    """Something one owner did to one shard, as that owner saw it."""

    kind: str  # leased, failed, written, discarded
    shard_id: int
    attempt: int
    owner: str


def _result(shard: ShardSpec) -> ShardResult:
    trials, results = [], []
    for trial in shard.trials:
        trials.append(TrialResult(trial_index=trial.index, status=TrialStatus.done))
        for position, qid in enumerate(trial.question_ids, start=1):
            gold = shard.questions[qid].answer
            results.append(
                QuestionResult(
                    trial_index=trial.index,
                    position=position,
                    question_id=qid,
                    subject="s",
                    gold=gold,
                    predicted=gold,
                    correct=True,
                    parse_status=ParseStatus.ok,
                )
            )
    return ShardResult(
        job_id=shard.job_id,
        shard_id=shard.shard_id,
        trials=tuple(trials),
        results=tuple(results),
        model=ModelInfo(name=shard.model),
        engine=EngineInfo(name="fake", version="0", dtype="none", device="none"),
        generate_seconds=0.0,
    )


def drain(url: str, owner: str) -> list[Event]:
    """One worker process: lease a few shards at a time until the queue is empty; fail some on their first
    attempt, write the rest."""
    events: list[Event] = []
    with connect(url) as db:
        while leases := queue.lease(db, owner=owner, limit=5, lease_seconds=600):
            for lease in leases:
                events.append(Event("leased", lease.shard_id, lease.attempt, owner))
                if lease.shard_id % FAIL_EVERY == 0 and lease.attempt == 1:
                    status = queue.fail(db, lease.shard_id, owner=owner, error="first attempts fail")
                    assert status is ShardStatus.queued
                    events.append(Event("failed", lease.shard_id, lease.attempt, owner))
                    continue
                outcome = queue.complete(db, [_result(lease.shard)], owner=owner)[0]
                kind = "written" if outcome.written else "discarded"
                events.append(Event(kind, lease.shard_id, lease.attempt, owner))
    return events


def _plan() -> tuple[JobSpec, Plan]:
    spec = JobSpec.model_validate(
        {
            "model": "fake/concurrent",
            "batch_sizes": [BATCH_SIZE],
            "iterations": SHARDS,
            "engine": {"name": "fake"},
        }
    )
    questions = {
        f"s/q{i}": Question(id=f"s/q{i}", subject="s", question=f"q{i}?", choices=("a", "b"), answer=i % 2)
        for i in range(10)
    }
    trials = tuple(
        Trial(
            index=i, batch_size=BATCH_SIZE, iteration=i, question_ids=(f"s/q{i % 10}", f"s/q{(i + 1) % 10}")
        )
        for i in range(SHARDS)
    )
    shards = tuple(PlannedShard(index=i, trial_indices=(i,)) for i in range(SHARDS))
    return spec, Plan(trials=trials, shards=shards, questions=questions)


def test_four_processes_complete_every_shard_exactly_once(database_url: str) -> None:
    spec, plan = _plan()
    with connect(database_url) as db:
        job_id = jobs.submit(db, spec, plan).job_id

    # spawn, not fork: a forked child would share the parent's pooled connections.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(PROCESSES, mp_context=context) as pool:
        futures = [pool.submit(drain, database_url, f"worker-{i}") for i in range(PROCESSES)]
        events = [event for future in futures for event in future.result()]

    leases = [e for e in events if e.kind == "leased"]
    # Each (shard, attempt) was handed to exactly one owner, and attempts count up from 1 with no gaps.
    pairs = [(e.shard_id, e.attempt) for e in leases]
    assert len(set(pairs)) == len(pairs)
    attempts: dict[int, list[int]] = defaultdict(list)
    for e in leases:
        attempts[e.shard_id].append(e.attempt)
    assert len(attempts) == SHARDS
    assert all(sorted(a) == list(range(1, len(a) + 1)) for a in attempts.values())
    assert sum(len(a) == 2 for a in attempts.values()) == len([i for i in attempts if i % FAIL_EVERY == 0])
    # Each lease ended once, by the owner that took it; each shard was written once and nothing discarded.
    ends = [e for e in events if e.kind != "leased"]
    assert sorted((e.shard_id, e.attempt, e.owner) for e in ends) == sorted(
        (e.shard_id, e.attempt, e.owner) for e in leases
    )
    assert Counter(e.shard_id for e in events if e.kind == "written") == Counter(attempts.keys())
    assert not [e for e in events if e.kind == "discarded"]
    # Every process did some of the work.
    assert len({e.owner for e in leases}) == PROCESSES

    with connect(database_url) as db:
        assert jobs.get(db, job_id).status is JobStatus.done
        assert jobs.progress(db, job_id).shards[ShardStatus.done] == SHARDS
        with db.read() as session:
            assert (
                session.execute(sa.text("SELECT count(*) FROM results")).scalar_one() == SHARDS * BATCH_SIZE
            )
        assert [c.n for c in queries.curve_counts(db, job_id=job_id)] == [SHARDS, SHARDS]
