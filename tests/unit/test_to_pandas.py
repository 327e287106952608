"""Every record that holds a table gives it as a DataFrame (`to_pandas()`): one row per entry, the record's
shared values as columns, nested intervals as `field_estimate`/`field_low`/`field_high` (missing together
when the interval is), enums as their values. Curves and comparisons: tests/unit/test_analysis.py; a trial
view: tests/unit/test_trial_view.py."""

from __future__ import annotations

import math

from posbias.schemas import Interval
from posbias.schemas.explanation import Effect, Explanation
from posbias.schemas.schedule import BatchSizeVerdict, PositionDrop, Verdict, VerdictDetail


def test_an_explanation_is_one_row_per_cause_with_its_intervals_flat() -> None:
    explanation = Explanation(
        model="m",
        job_ids=(1, 2),
        batch_size=20,
        design="random design",
        trials=10,
        clusters=10,
        cluster_unit="trial",
        answers=200,
        difficulty_adjusted=True,
        effects=(
            Effect(
                name="position",
                unit="first to last",
                status="estimated",
                effect=Interval(estimate=0.2, low=0.1, high=0.3),
            ),
            Effect(name="answer slot", unit="first to last", status="not estimable"),
        ),
        confounds=(),
        verdict="position moves the curve",
    )
    frame = explanation.to_pandas()
    assert list(frame.name) == ["position", "answer slot"]
    assert list(frame.columns[:3]) == ["model", "revision", "batch_size"] and set(frame.batch_size) == {20}
    assert frame.effect_estimate[0] == 0.2 and frame.effect_high[0] == 0.3
    assert math.isnan(frame.effect_low[1]) and "effect" not in frame.columns
    assert "bend_estimate" in frame.columns


def test_a_verdict_is_one_row_per_batch_size_with_its_worst_drop() -> None:
    drop = PositionDrop(
        first_position=3,
        last_position=3,
        accuracy_baseline=0.6,
        accuracy_candidate=0.4,
        diff=-0.2,
        upper=-0.05,
        lower=-0.3,
        flagged=True,
    )
    detail = VerdictDetail(
        schedule="nightly",
        checkpoint="step-200",
        verdict=Verdict.regression,
        reason="position 3 dropped",
        batch_sizes=(
            BatchSizeVerdict(batch_size=10, positions=10, drop_flagged=True, worst_drop=drop),
            BatchSizeVerdict(batch_size=20, positions=20, drop_flagged=False, worst_drop=None, shift=None),
        ),
    )
    frame = detail.to_pandas()
    assert list(frame.batch_size) == [10, 20] and set(frame.verdict) == {"regression"}
    assert frame.worst_drop_diff[0] == -0.2 and frame.worst_drop_first_position[0] == 3
    assert frame.worst_drop_diff.isna()[1]
    assert frame.shift_change_estimate.isna().all()
