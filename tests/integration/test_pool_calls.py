"""Shards travel to actors several to a call, and their results are written several to a transaction,
each still exactly once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import ray
import sqlalchemy as sa

from posbias.schemas import ShardResult, ShardSpec, Submitted, WorkerConfig
from posbias.service.dispatch.placement import Placer
from posbias.service.dispatch.pools import ModelPools
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus
from posbias.service.work import jobs, queue

MakeJob = Callable[..., Submitted]
Answer = Callable[..., ShardResult]


def _leased(db: Database, make_job: MakeJob, **fields: object) -> list[ShardSpec]:
    job_id = make_job(db, **fields).job_id
    return [
        lease.shard for lease in queue.lease(db, owner="w1", limit=100, lease_seconds=60, job_ids=[job_id])
    ]


@pytest.mark.usefixtures("ray_session")
def test_calls_spread_over_idle_actors_and_hold_at_most_shards_per_call(
    db: Database, make_job: MakeJob, tmp_path: Path
) -> None:
    shards = _leased(db, make_job, batch_sizes=(2,), iterations=11, shard_size=1)
    pools = ModelPools(
        config=WorkerConfig(cache_dir=str(tmp_path)), placer=Placer(actors_per_model=2), shards_per_call=4
    )
    try:
        assert pools.ensure(shards[0], keep=())
        for ref in pools.load_refs():
            ray.get(ref)
            pools.load_finished(ref)
        assert pools.free_slots() == {shards[0].model_key: 2 * 2 * 4}

        # Two idle actors and three shards: one call each rather than one call of three.
        first = pools.submit(shards[:3])
        assert [len(call.shards) for call in first] == [2, 1]
        assert pools.free_slots() == {shards[0].model_key: 2 * 4}
        # Seven more, into the two call slots left: as few calls as four shards a call allows, in order.
        second = pools.submit(shards[3:10])
        assert [len(call.shards) for call in second] == [4, 3]
        with pytest.raises(ValueError, match="do not fit"):
            pools.submit(shards[10:])
        assert [s.shard_id for call in first + second for s in call.shards] == [
            s.shard_id for s in shards[:10]
        ]
        assert pools.free_slots() == {shards[0].model_key: 0}

        for call in first + second:
            outcomes = ray.get(call.ref)
            assert [o.shard_id for o in outcomes] == [s.shard_id for s in call.shards]
            assert all(isinstance(o, ShardResult) for o in outcomes)
            pools.done(call.ref, actor_failed=False)
        assert pools.free_slots() == {shards[0].model_key: 2 * 2 * 4}
    finally:
        pools.shutdown()


def test_a_batch_of_results_is_written_in_one_go_and_a_lost_lease_only_loses_its_own(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    shards = _leased(db, make_job, batch_sizes=(2, 3), iterations=4, shard_size=2)
    assert len(shards) == 4
    lost = shards[1]
    queue.release(db, [lost.shard_id], owner="w1")
    results = [answer(shard) for shard in shards]

    outcomes = queue.complete(db, [*results, results[0]], owner="w1")

    assert [o.written for o in outcomes] == [True, False, True, True, False]
    assert outcomes[1].reason is not None and "lease" in outcomes[1].reason
    assert outcomes[4].reason is not None and "already done" in outcomes[4].reason
    assert [o.results for o in outcomes if o.written] == [len(results[i].results) for i in (0, 2, 3)]
    with db.read() as session:
        rows, totals = session.execute(
            sa.text("SELECT (SELECT count(*) FROM results), (SELECT sum(n) FROM curve_points)")
        ).one()
    assert rows == totals == sum(len(results[i].results) for i in (0, 2, 3))
    assert jobs.get(db, lost.job_id).status is JobStatus.running

    again = queue.lease(db, owner="w2", limit=10, lease_seconds=60)
    assert [lease.shard_id for lease in again] == [lost.shard_id]
    assert queue.complete(db, [answer(again[0].shard)], owner="w2")[0].written
    assert jobs.get(db, lost.job_id).status is JobStatus.done
