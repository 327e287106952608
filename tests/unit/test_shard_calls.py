"""Several shards in one engine call: the same answers as one call each, seeded shards alone, and a bad
shard failing alone."""

from __future__ import annotations

from collections.abc import Callable

from posbias.schemas import JobSpec, QuestionPool, ShardResult, ShardSpec, WorkerConfig
from posbias.service.work.planner import plan
from posbias.service.work.shards import shard_spec
from posbias.workers.actor import ShardActor, ShardFailure
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard, run_shards

PoolFactory = Callable[..., QuestionPool]


def _shards(pool: QuestionPool, *, shard_size: int = 3, **fields: object) -> list[ShardSpec]:
    spec = JobSpec.model_validate(
        {"model": "fake-model", "engine": {"name": "fake"}, "shard_size": shard_size, **fields}
    )
    planned = plan(spec, pool=pool)
    return [
        shard_spec(
            spec,
            job_id=1,
            shard_id=10 + s.index,
            trials=[planned.trials[i] for i in s.trial_indices],
            questions=planned.questions,
        )
        for s in planned.shards
    ]


def _answers(result: ShardResult) -> list[tuple[int, int, int | None]]:
    return [(r.trial_index, r.position, r.predicted) for r in result.results]


def test_greedy_shards_share_one_engine_call_and_answer_as_alone(make_pool: PoolFactory) -> None:
    shards = _shards(make_pool(60), batch_sizes=[2, 5], iterations=4)
    engine = FakeEngine(shards[0].fake)
    together = run_shards(shards, engine=engine)

    assert engine.calls == 1
    assert [r.shard_id for r in together] == [s.shard_id for s in shards]
    for shard, result in zip(shards, together, strict=True):
        alone = run_shard(shard, engine=FakeEngine(shard.fake))
        assert _answers(result) == _answers(alone)
        assert [t.trial_index for t in result.trials] == [t.index for t in shard.trials]
        assert result.generate_seconds >= 0.0


def test_a_shard_with_a_sampling_seed_gets_a_call_of_its_own(make_pool: PoolFactory) -> None:
    greedy = _shards(make_pool(40), batch_sizes=[2], iterations=6)
    seeded = _shards(make_pool(40), batch_sizes=[2], iterations=6, sampling={"temperature": 1.0, "seed": 5})
    engine = FakeEngine(greedy[0].fake)
    run_shards([*greedy, *seeded], engine=engine)
    assert engine.calls == 1 + len(seeded)


def test_a_bad_shard_fails_alone_in_a_shared_call(make_pool: PoolFactory, tmp_path: object) -> None:
    good, bad, other = _shards(make_pool(40), batch_sizes=[3], iterations=9)
    trial = bad.trials[0]
    broken = trial.model_copy(update={"choice_orders": ((0, 0, 1, 2),) * 3})  # not a permutation
    bad = bad.model_copy(update={"trials": (broken, *bad.trials[1:])})
    actor = ShardActor(good, config=WorkerConfig(cache_dir=str(tmp_path)))

    outcomes = actor.run_many([good, bad, other])

    assert isinstance(outcomes[0], ShardResult) and outcomes[0].shard_id == good.shard_id
    assert isinstance(outcomes[2], ShardResult) and outcomes[2].shard_id == other.shard_id
    failure = outcomes[1]
    assert isinstance(failure, ShardFailure) and failure.shard_id == bad.shard_id
    assert failure.error.startswith("ValueError: ") and "does not permute" in failure.error
