"""End to end on the fake engine: the analysis recovers the curve the engine was given."""

from __future__ import annotations

from collections.abc import Callable

from posbias.schemas import JobSpec, QuestionPool
from posbias.service.analysis import CorrectnessMatrix, build_curve, count_positions
from posbias.service.planner import plan
from posbias.service.shards import shard_spec
from posbias.workers.shard import run_shard
from posbias.workers.testing import FakeEngine

BATCH_SIZE = 50
FIRST, LAST = 0.25, 0.55


def test_known_curve_is_recovered(make_pool: Callable[..., QuestionPool]) -> None:
    # Any seed passes with probability about 0.9 (Wilson coverage at 45 of 50 positions, and the slope
    # interval's 95%); the seed is fixed so the test is deterministic, not chosen to pass.
    spec = JobSpec.model_validate(
        {
            "model": "fake",
            "engine": {"name": "fake"},
            "fake": {"first": FIRST, "last": LAST},
            "batch_sizes": [BATCH_SIZE],
            "iterations": 100,
            "seed": 1,
        }
    )
    planned = plan(spec, pool=make_pool(500))
    shard = shard_spec(spec, job_id=1, shard_id=1, trials=planned.trials, questions=planned.questions)
    result = run_shard(shard, engine=FakeEngine(spec.fake, seed=spec.seed))

    curve = build_curve(
        count_positions(result.results, batch_size=BATCH_SIZE),
        model="fake",
        job_ids=[1],
        batch_size=BATCH_SIZE,
        matrix=CorrectnessMatrix.from_results(result.results, batch_size=BATCH_SIZE),
    )

    assert [p.n for p in curve.points] == [100] * BATCH_SIZE
    covered = [
        p.ci_low is not None
        and p.ci_high is not None
        and p.ci_low <= spec.fake.accuracy(p.position, BATCH_SIZE) <= p.ci_high
        for p in curve.points
    ]
    assert sum(covered) >= 0.9 * BATCH_SIZE
    true_slope = (LAST - FIRST) / (BATCH_SIZE - 1)
    assert curve.slope is not None and curve.slope.low is not None and curve.slope.high is not None
    assert curve.slope.low <= true_slope <= curve.slope.high
    assert curve.first_last_ratio is not None and curve.first_last_ratio.estimate is not None
