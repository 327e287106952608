"""Curve statistics: Wilson intervals, curve points, the cluster bootstrap, token distance, comparisons."""

from __future__ import annotations

import numpy as np
import pytest

from posbias.schemas import Curve, Interval, ParseStatus, PosbiasError, QuestionResult
from posbias.service.analysis import (
    CorrectnessMatrix,
    DistanceRow,
    PositionCount,
    bootstrap_curve_stats,
    build_curve,
    compare_curves,
    count_positions,
    curve_points,
    token_distance_points,
    wilson_interval,
)


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    # Reference values: Newcombe (1998), Table I, and the closed form at the extremes.
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (29, 29, 0.8830, 1.0),
        (5, 10, 0.2366, 0.7634),
    ],
)
def test_wilson_interval_matches_published_values(k: int, n: int, low: float, high: float) -> None:
    interval = wilson_interval(k, n)
    assert interval.estimate == pytest.approx(k / n)
    assert interval.low == pytest.approx(low, abs=1e-4)
    assert interval.high == pytest.approx(high, abs=1e-4)


def test_wilson_interval_without_data() -> None:
    assert wilson_interval(0, 0) == Interval(estimate=None, low=None, high=None)


def test_curve_points_from_counts() -> None:
    counts = [
        PositionCount(
            batch_size=2, position=2, n=10, n_correct=4, n_parsed=9, gold_prob_sum=3.0, n_gold_prob=6
        ),
        PositionCount(batch_size=2, position=1, n=10, n_correct=3, n_parsed=10),
        PositionCount(batch_size=2, position=3, n=0, n_correct=0, n_parsed=0),
    ]
    first, second, empty = curve_points(counts)
    assert (first.position, first.accuracy, first.parse_rate, first.mean_gold_prob) == (1, 0.3, 1.0, None)
    assert (second.position, second.accuracy, second.parse_rate) == (2, 0.4, 0.9)
    assert second.mean_gold_prob == pytest.approx(0.5)
    assert (second.ci_low, second.ci_high) == (wilson_interval(4, 10).low, wilson_interval(4, 10).high)
    assert (empty.accuracy, empty.ci_low, empty.ci_high, empty.parse_rate) == (None, None, None, None)


def _result(
    trial: int, position: int, correct: bool, status: ParseStatus = ParseStatus.ok, prob: float | None = None
) -> QuestionResult:
    return QuestionResult(
        trial_index=trial,
        position=position,
        question_id=f"q/{trial}-{position}",
        subject="q",
        gold=0,
        predicted=0 if correct else (None if status is not ParseStatus.ok else 1),
        correct=correct,
        parse_status=status,
        gold_prob=prob,
    )


def test_count_positions_and_matrix_from_results() -> None:
    results = [
        _result(0, 1, True, prob=0.9),
        _result(0, 2, False, ParseStatus.missing),
        _result(1, 1, False, prob=0.2),
        _result(1, 2, True),
        _result(2, 1, True),
    ]
    counts = count_positions(results, batch_size=2)
    assert counts == [
        PositionCount(2, 1, n=3, n_correct=2, n_parsed=3, gold_prob_sum=pytest.approx(1.1), n_gold_prob=2),
        PositionCount(2, 2, n=2, n_correct=1, n_parsed=1),
    ]
    matrix = CorrectnessMatrix.from_results(results, batch_size=2)
    np.testing.assert_array_equal(matrix.correct, [[1.0, 0.0], [0.0, 1.0], [1.0, np.nan]])


def test_bootstrap_estimates_are_those_of_the_data() -> None:
    rng = np.random.default_rng(5)
    truth = np.linspace(0.2, 0.8, 10)
    correct = (rng.random((300, 10)) < truth).astype(float)
    stats = bootstrap_curve_stats(CorrectnessMatrix(batch_size=10, correct=correct), resamples=500, seed=1)

    means = correct.mean(axis=0)
    assert stats.slope.estimate == pytest.approx(np.polyfit(np.arange(1, 11), means, 1)[0])
    assert stats.first_last_ratio.estimate == pytest.approx(means[-1] / means[0])
    for interval in (stats.slope, stats.first_last_ratio):
        assert interval.low is not None and interval.high is not None and interval.estimate is not None
        assert interval.low < interval.estimate < interval.high
    assert stats.slope.low < (0.6 / 9) < stats.slope.high  # type: ignore[operator]
    assert stats.first_last_ratio.low < 4.0 < stats.first_last_ratio.high  # type: ignore[operator]


def test_bootstrap_resamples_whole_trials() -> None:
    # Every trial is all right or all wrong, so any resample of whole trials has a flat curve: slope exactly
    # 0 and ratio exactly 1. Resampling answers one by one would scatter both.
    rng = np.random.default_rng(0)
    correct = np.repeat(rng.random((80, 1)) < 0.5, 20, axis=1).astype(float)
    stats = bootstrap_curve_stats(CorrectnessMatrix(batch_size=20, correct=correct), resamples=300)
    assert stats.slope.low == pytest.approx(0.0, abs=1e-12)
    assert stats.slope.high == pytest.approx(0.0, abs=1e-12)
    assert (stats.first_last_ratio.low, stats.first_last_ratio.high) == (
        pytest.approx(1.0),
        pytest.approx(1.0),
    )


def test_bootstrap_is_reproducible_and_seeded() -> None:
    correct = (np.random.default_rng(3).random((50, 8)) < 0.5).astype(float)
    matrix = CorrectnessMatrix(batch_size=8, correct=correct)
    assert bootstrap_curve_stats(matrix, seed=4) == bootstrap_curve_stats(matrix, seed=4)
    assert bootstrap_curve_stats(matrix, seed=4) != bootstrap_curve_stats(matrix, seed=5)


def test_ratio_with_zero_first_accuracy() -> None:
    correct = np.zeros((40, 5))
    correct[::2, -1] = 1.0
    stats = bootstrap_curve_stats(CorrectnessMatrix(batch_size=5, correct=correct), resamples=200)
    assert stats.first_last_ratio.estimate is None  # last / 0 has no finite value
    assert stats.first_last_ratio.high is None
    assert stats.slope.estimate == pytest.approx(np.polyfit(np.arange(1, 6), correct.mean(axis=0), 1)[0])


def test_single_position_has_no_slope_or_ratio() -> None:
    stats = bootstrap_curve_stats(CorrectnessMatrix(batch_size=1, correct=np.ones((10, 1))))
    assert stats.slope == Interval(estimate=None, low=None, high=None)
    assert stats.first_last_ratio == Interval(estimate=None, low=None, high=None)


def test_matrix_from_rows_marks_missing_cells() -> None:
    matrix = CorrectnessMatrix.from_rows([(7, 1, True), (7, 3, False), (9, 2, True)], batch_size=3)
    np.testing.assert_array_equal(matrix.correct, [[1.0, np.nan, 0.0], [np.nan, 1.0, np.nan]])
    stats = bootstrap_curve_stats(matrix, resamples=50)
    assert stats.slope.estimate == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="trials x 3"):
        CorrectnessMatrix(batch_size=3, correct=np.ones((2, 4)))


def test_build_curve() -> None:
    results = [_result(t, p, (t + p) % 3 == 0) for t in range(30) for p in (1, 2, 3)]
    curve = build_curve(
        count_positions(results, batch_size=3),
        model="m",
        job_ids=[4],
        batch_size=3,
        matrix=CorrectnessMatrix.from_results(results, batch_size=3),
        resamples=100,
    )
    assert [p.position for p in curve.points] == [1, 2, 3]
    assert [p.n for p in curve.points] == [30, 30, 30]
    assert curve.slope is not None and curve.first_last_ratio is not None
    assert curve.first_last_ratio.estimate == pytest.approx(1.0)
    assert Curve.model_validate_json(curve.model_dump_json()) == curve
    without_matrix = build_curve(count_positions(results, batch_size=3), model="m", job_ids=[4], batch_size=3)
    assert without_matrix.slope is None


def test_token_distance_bins() -> None:
    rows = [
        DistanceRow(10, 0, True, True, 0.9),
        DistanceRow(10, 99, False, True, 0.1),
        DistanceRow(10, 100, True, True),
        DistanceRow(10, 250, False, False),
        DistanceRow(10, None, False, False),
        (20, 5, True, True, None),  # a plain SQL row works too
    ]
    points = token_distance_points(rows, bin_width=100)  # type: ignore[arg-type]
    assert [(p.batch_size, p.position, p.n, p.n_correct, p.n_parsed) for p in points] == [
        (10, 0, 2, 1, 2),
        (10, 100, 1, 1, 1),
        (10, 200, 1, 0, 0),
        (20, 0, 1, 1, 1),
    ]
    assert points[0].mean_gold_prob == pytest.approx(0.5)
    assert points[1].mean_gold_prob is None
    assert points[0].ci_low == wilson_interval(1, 2).low
    assert token_distance_points([], bin_width=10) == []
    with pytest.raises(PosbiasError, match="bin width"):
        token_distance_points(rows, bin_width=0)  # type: ignore[arg-type]


def _curve(counts: list[tuple[int, int]], *, batch_size: int = 2, ratio: Interval | None = None) -> Curve:
    points = curve_points(
        [
            PositionCount(batch_size, p, n=n, n_correct=k, n_parsed=n)
            for p, (k, n) in enumerate(counts, start=1)
        ]
    )
    return Curve(model="m", job_ids=(1,), batch_size=batch_size, points=tuple(points), first_last_ratio=ratio)


def test_compare_uses_newcombes_hybrid_score_interval() -> None:
    # Newcombe (1998), example (a): 56/70 vs 48/80, difference 0.2, method 10 interval 0.0524 to 0.3339.
    ratio = Interval(estimate=1.5, low=1.1, high=2.0)
    a = _curve([(48, 80), (10, 20)], ratio=ratio)
    b = _curve([(56, 70), (10, 20)])
    comparison = compare_curves(a, b, labels=("baseline", "candidate"))

    first, second = comparison.points
    assert (comparison.a, comparison.b, comparison.batch_size) == ("baseline", "candidate", 2)
    assert first.diff == pytest.approx(0.2)
    assert first.ci_low == pytest.approx(0.0524, abs=1e-4)
    assert first.ci_high == pytest.approx(0.3339, abs=1e-4)
    assert second.diff == 0.0
    assert second.ci_low is not None and second.ci_high is not None
    assert second.ci_low < 0 < second.ci_high
    assert comparison.ratio_a == ratio
    assert comparison.ratio_b is None


def test_compare_with_positions_on_one_side_only() -> None:
    a = _curve([(5, 10)], batch_size=2)
    b = _curve([(5, 10), (6, 10)], batch_size=2)
    second = compare_curves(a, b, labels=("a", "b")).points[1]
    assert (second.accuracy_a, second.accuracy_b, second.diff, second.ci_low) == (None, 0.6, None, None)


def test_compare_needs_one_batch_size() -> None:
    with pytest.raises(PosbiasError, match="different batch sizes"):
        compare_curves(_curve([(1, 2)], batch_size=2), _curve([(1, 2)], batch_size=5), labels=("a", "b"))
