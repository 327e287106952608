"""End to end on the fake engine: the analysis recovers the curve the engine was given, through the whole
worker path (render, answer, parse) and with answers as correlated as a model's."""

from __future__ import annotations

from collections.abc import Callable

from posbias.schemas import JobSpec, QuestionPool, WorkerConfig
from posbias.service.stats.position_curve import build_curve
from posbias.service.stats.trial_data import TrialData
from posbias.service.work.planner import plan
from posbias.service.work.shards import shard_spec
from posbias.workers.loader import load_engine
from posbias.workers.shard import run_shard

BATCH_SIZE = 50
FIRST, LAST = 0.25, 0.55


def test_known_curve_is_recovered(make_pool: Callable[..., QuestionPool], tmp_path: object) -> None:
    # Any seed passes with probability about 0.9 (pointwise coverage at 45 of 50 positions, the band's and
    # the slope's 95%); the seed is fixed so the test is deterministic, not chosen to pass.
    spec = JobSpec.model_validate(
        {
            "model": "fake",
            "engine": {"name": "fake"},
            "fake": {"first": FIRST, "last": LAST, "question_effect": 0.3, "prompt_effect": 0.1},
            "batch_sizes": [BATCH_SIZE],
            "iterations": 100,
            "seed": 1,
        }
    )
    planned = plan(spec, pool=make_pool(500))
    shard = shard_spec(spec, job_id=1, shard_id=1, trials=planned.trials, questions=planned.questions)
    result = run_shard(shard, engine=load_engine(shard, config=WorkerConfig(cache_dir=str(tmp_path))))

    curve = build_curve(TrialData.from_results(planned.trials, result.results), model="fake")

    assert [p.n for p in curve.points] == [100] * BATCH_SIZE
    truth = [spec.fake.accuracy(p.position, BATCH_SIZE) for p in curve.points]
    covered = [p.ci_low <= t <= p.ci_high for p, t in zip(curve.points, truth, strict=True)]  # type: ignore[operator]
    assert sum(covered) >= 0.9 * BATCH_SIZE
    assert all(p.band_low <= t <= p.band_high for p, t in zip(curve.points, truth, strict=True))  # type: ignore[operator]
    true_slope = (LAST - FIRST) / (BATCH_SIZE - 1)
    assert curve.slope is not None and curve.slope.low is not None and curve.slope.high is not None
    assert curve.slope.low <= true_slope <= curve.slope.high
    assert curve.contrast is not None and curve.contrast.low <= LAST - FIRST <= curve.contrast.high  # type: ignore[operator]
    assert curve.shape_p is not None and curve.shape_p < 0.01
