"""Curve statistics: intervals, clusters, pooling, the band, summaries, comparisons and verdicts, on data
whose truth is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from posbias.schemas import Curve, FakeCollapse, FakeSpec, Interval, PosbiasError
from posbias.schemas.schedule import RegressionRule
from posbias.service.schedules import verdicts
from posbias.service.stats import comparison, options
from posbias.service.stats.bootstrap import single
from posbias.service.stats.intervals import bounded_interval, clustered_interval, points, wilson_interval
from posbias.service.stats.position_curve import build_curve, distance_curve
from posbias.service.stats.regression import position_regression
from posbias.service.stats.shape_test import shape_test
from posbias.service.stats.trial_data import DistanceRow, ResultRow, TrialData, TrialRow
from posbias.workers.fake_engine import latent_correct, option_probs, with_prior


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
    assert wilson_interval(0, 0) == Interval(estimate=None, low=None, high=None)


def test_one_answer_per_cluster_is_wilsons_interval_and_correlated_clusters_widen_it() -> None:
    single_answers = clustered_interval(np.array([1.0] * 30 + [0.0] * 70), np.ones(100))
    assert (single_answers.low, single_answers.high) == (
        wilson_interval(30, 100).low,
        wilson_interval(30, 100).high,
    )
    # Ten clusters of ten answers each, all alike within a cluster: ten independent answers' worth.
    k = np.array([10.0] * 3 + [0.0] * 7)
    clustered = clustered_interval(k, np.full(10, 10.0))
    assert clustered.estimate == pytest.approx(0.3)
    assert clustered.high - clustered.low > 2.5 * (single_answers.high - single_answers.low)


def _data(
    rng: np.random.Generator, truth: np.ndarray, *, trials: int, question_effect: float = 0.0
) -> TrialData:
    n = len(truth)
    questions = np.array([rng.choice(500, n, replace=False) for _ in range(trials)])
    correct = latent_correct(
        np.broadcast_to(truth, (trials, n)),
        question=rng.standard_normal(500)[questions],
        prompt=0.0,
        noise=rng.standard_normal((trials, n)),
        question_effect=question_effect,
        prompt_effect=0.0,
    )
    return TrialData.from_arrays(
        correct.astype(float), questions=questions, keys=[tuple(map(str, q)) for q in questions]
    )


def test_failed_parses_are_kept_apart_from_accuracy() -> None:
    # A sheet cut after position 3 of 5: the last positions have no parsed answers. Accuracy among parsed
    # answers stays what it was; the strict accuracy (the seed's scoring) falls to zero there.
    correct = np.tile([1.0, 0.0, 1.0, 1.0, 0.0], (20, 1))
    parsed = np.tile([1.0, 1.0, 1.0, 0.0, 0.0], (20, 1))
    found = points(TrialData.from_arrays(correct, parsed=parsed))
    assert [p.n for p in found] == [20] * 5
    assert [p.n_parsed for p in found] == [20, 20, 20, 0, 0]
    assert [p.accuracy for p in found] == [1.0, 0.0, 1.0, None, None]
    assert [p.accuracy_strict for p in found] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert [p.parse_rate for p in found] == [1.0, 1.0, 1.0, 0.0, 0.0]
    # A correct answer that did not parse is not correct.
    assert found[3].n_correct == 0


def test_pooled_jobs_count_a_trial_they_share_once() -> None:
    def trial(trial_id: int, job: int, questions: tuple[str, ...]) -> TrialRow:
        return TrialRow(trial_id, job, 0, questions, None, False, (4, 4))

    trials = [
        trial(1, 1, ("a", "b")),
        trial(2, 1, ("c", "d")),
        trial(3, 2, ("a", "b")),
        trial(4, 2, ("e", "f")),
    ]
    results = [ResultRow(t, p, True, p == 1) for t in (1, 2, 3, 4) for p in (1, 2)]
    data = TrialData.from_rows(trials, results, batch_size=2)
    assert (data.trials, data.duplicates, data.jobs) == (3, 1, (1, 2))
    assert data.chance == pytest.approx(0.25)
    curve = build_curve(data, model="m", resamples=50)
    assert (curve.trials, curve.duplicate_trials) == (3, 1)
    assert [p.n for p in curve.points] == [3, 3]


def test_rotation_clusters_are_sampled_sets() -> None:
    trials = [
        TrialRow(10 * s + r, 1, s, (f"q{s}{r}", f"q{s}{1 - r}"), None, True)
        for s in range(4)
        for r in range(2)
    ]
    results = [ResultRow(t.trial_id, p, True, True) for t in trials for p in (1, 2)]
    data = TrialData.from_rows(trials, results, batch_size=2)
    assert (data.trials, data.clusters, data.cluster_unit) == (8, 4, "sampled set")


def test_the_bootstrap_resamples_whole_clusters() -> None:
    # Every trial is all right or all wrong, so every resample of whole trials has a flat curve.
    rng = np.random.default_rng(0)
    correct = np.repeat(rng.random((80, 1)) < 0.5, 20, axis=1).astype(float)
    accuracy = single(TrialData.from_arrays(correct), resamples=300).accuracy()
    assert np.allclose(accuracy[:, 0], accuracy[:, -1])
    assert accuracy[1:, 0].std() > 0


def test_the_band_holds_the_pointwise_intervals_and_the_summaries_their_estimates() -> None:
    rng = np.random.default_rng(4)
    truth = np.linspace(0.2, 0.8, 20)
    curve = build_curve(_data(rng, truth, trials=200), model="m", resamples=400)
    for p in curve.points:
        assert (
            p.band_low is not None
            and p.band_high is not None
            and p.ci_low is not None
            and p.ci_high is not None
        )
        assert p.band_low <= p.ci_low <= p.accuracy <= p.ci_high <= p.band_high  # type: ignore[operator]
    means = np.array([p.accuracy for p in curve.points], dtype=float)
    assert curve.contrast is not None and curve.contrast.estimate == pytest.approx(means[-1] - means[0])
    assert curve.first_last_ratio is not None
    assert curve.first_last_ratio.estimate == pytest.approx(means[-1] / means[0])
    slope = curve.slope
    assert (
        slope is not None and slope.low is not None and slope.high is not None and slope.estimate is not None
    )
    assert abs(slope.estimate - 0.6 / 19) < slope.high - slope.low  # within two standard errors
    assert curve.shape_p is not None and curve.shape_p < 0.01
    assert Curve.model_validate_json(curve.model_dump_json()) == curve


def test_the_ratio_is_withheld_when_the_first_accuracy_is_near_zero() -> None:
    correct = np.zeros((40, 5))
    correct[::2, -1] = 1.0
    correct[0, 0] = 1.0
    curve = build_curve(TrialData.from_arrays(correct), model="m", resamples=100)
    assert curve.first_last_ratio is None
    assert curve.ratio_note is not None and "not bounded away from zero" in curve.ratio_note
    assert curve.contrast is not None and curve.contrast.estimate == pytest.approx(0.5 - 1 / 40)


def test_the_shape_test_sees_a_u_that_the_slope_misses() -> None:
    rng = np.random.default_rng(7)
    u = np.array([0.7, 0.5, 0.35, 0.3, 0.35, 0.5, 0.7])
    data = _data(rng, u, trials=150)
    fitted = position_regression(data)
    assert fitted is not None
    slope, _ = fitted
    assert slope.low < 0 < slope.high  # type: ignore[operator]
    p = shape_test(data)
    assert p is not None and p < 0.01


def test_the_shape_test_keeps_its_size_without_a_position_effect() -> None:
    rng = np.random.default_rng(11)
    rejections = sum(
        (
            shape_test(_data(rng, np.full(8, 0.4), trials=40, question_effect=0.3), permutations=199, seed=s)
            or 1
        )
        < 0.05
        for s in range(60)
    )
    assert rejections <= 9  # 5% of 60 is 3; binomial 99.9% bound


def test_the_regression_adjusts_for_question_difficulty() -> None:
    # Questions recur (a pool of 500) and difficulty is most of the variance: the adjusted fit is at least
    # as precise as the unadjusted and its interval holds the truth.
    rng = np.random.default_rng(2)
    truth = np.linspace(0.3, 0.6, 10)
    data = _data(rng, truth, trials=400, question_effect=0.6)
    fitted = position_regression(data)
    assert fitted is not None
    _, effect = fitted
    assert effect.low < 0.3 < effect.high  # type: ignore[operator]


def test_the_difficulty_adjustment_removes_a_confounded_difficulty_that_the_unadjusted_fit_keeps() -> None:
    # Easier questions tend to be shown later (the order is sorted on difficulty plus noise), so an unadjusted
    # fit reads the questions' difficulty as a position effect. The true first-to-last effect is 0.2.
    rng = np.random.default_rng(5)
    trials, n, pool = 400, 10, 100
    hardness = rng.standard_normal(pool)
    picks = [rng.choice(pool, n, replace=False) for _ in range(trials)]
    questions = np.array([p[np.argsort(-0.3 * hardness[p] + rng.standard_normal(n))] for p in picks])
    correct = latent_correct(
        np.broadcast_to(np.linspace(0.4, 0.6, n), (trials, n)),
        question=hardness[questions],
        prompt=0.0,
        noise=rng.standard_normal((trials, n)),
        question_effect=0.8,
        prompt_effect=0.0,
    ).astype(float)
    keys = [tuple(map(str, q)) for q in questions]
    adjusted = position_regression(TrialData.from_arrays(correct, questions=questions, keys=keys))
    # Without question codes every answer is its own question: the covariate is 0 and is left out.
    unadjusted = position_regression(TrialData.from_arrays(correct))
    assert adjusted is not None and unadjusted is not None
    (_, fixed), (_, naive) = adjusted, unadjusted
    assert fixed.estimate is not None and naive.estimate is not None and naive.low is not None
    assert abs(fixed.estimate - 0.2) < 0.06  # about 3 standard errors (0.018)
    assert naive.low > 0.3  # the unadjusted interval is far from the truth
    assert abs(naive.estimate - 0.2) > 3 * abs(fixed.estimate - 0.2)


def test_a_curve_compared_with_itself_differs_by_exactly_zero() -> None:
    data = _data(np.random.default_rng(1), np.linspace(0.3, 0.6, 12), trials=60)
    found = comparison.compare(data, data, labels=("a", "a"), resamples=300)
    assert (found.method, found.matched_trials) == ("paired", 60)
    for p in found.points:
        assert (p.diff, p.ci_low, p.ci_high, p.band_low, p.band_high, p.different) == (0, 0, 0, 0, 0, False)
        assert p.mcnemar_p == 1.0
    assert found.contrast_diff == Interval(estimate=0.0, low=0.0, high=0.0)


def test_matched_trials_are_paired_and_the_rest_unpaired() -> None:
    rng = np.random.default_rng(3)
    a = _data(rng, np.full(6, 0.5), trials=40)
    b_same = TrialData.from_arrays(
        (rng.random(a.correct.shape) < 0.5).astype(float), questions=a.questions, keys=list(a.keys)
    )
    assert comparison.compare(a, b_same, labels=("a", "b"), resamples=100).method == "paired"
    other = _data(rng, np.full(6, 0.5), trials=40)
    assert comparison.compare(a, other, labels=("a", "b"), resamples=100).method == "unpaired"
    half = TrialData.from_arrays(
        np.vstack([b_same.correct[:20], other.correct[:20]]),
        questions=np.vstack([a.questions[:20], other.questions[:20]]),
        keys=[*a.keys[:20], *other.keys[:20]],
    )
    partly = comparison.compare(a, half, labels=("a", "b"), resamples=100)
    assert (partly.method, partly.matched_trials) == ("partly paired", 20)


def test_pairing_shrinks_the_interval_of_a_difference() -> None:
    # Two checkpoints answering the same questions share their difficulty: the paired interval is narrower.
    rng = np.random.default_rng(9)
    n, trials = 10, 150
    questions = np.array([rng.choice(400, n, replace=False) for _ in range(trials)])
    difficulty = rng.standard_normal(400)[questions]

    def job(accuracy: float) -> TrialData:
        correct = latent_correct(
            np.full((trials, n), accuracy),
            question=difficulty,
            prompt=0.0,
            noise=rng.standard_normal((trials, n)),
            question_effect=0.7,
            prompt_effect=0.0,
        )
        return TrialData.from_arrays(
            correct.astype(float), questions=questions, keys=[tuple(map(str, q)) for q in questions]
        )

    base, cand = job(0.5), job(0.4)
    paired = comparison.compare(base, cand, labels=("a", "b"), resamples=400)
    shuffled = TrialData.from_arrays(
        cand.correct, questions=cand.questions, keys=[("x", str(i)) for i in range(trials)]
    )
    unpaired = comparison.compare(base, shuffled, labels=("a", "b"), resamples=400)
    width = lambda c: np.mean([p.ci_high - p.ci_low for p in c.points])  # noqa: E731
    assert width(paired) < 0.8 * width(unpaired)


def test_a_comparison_needs_one_batch_size() -> None:
    a = TrialData.from_arrays(np.ones((3, 2)))
    b = TrialData.from_arrays(np.ones((3, 5)))
    with pytest.raises(PosbiasError, match="different batch sizes"):
        comparison.compare(a, b, labels=("a", "b"))


def test_verdict_blocks_cover_positions_and_fractions_of_the_prompt_at_every_start() -> None:
    family = verdicts.blocks(50)
    assert family[:50] == [(p, p + 1) for p in range(50)]
    assert (0, 10) in family and (40, 50) in family and (0, 25) in family and (0, 50) in family
    assert (3, 8) in family and (17, 27) in family and (12, 37) in family
    assert len(family) == len(set(family)) == 50 + 46 + 41 + 26 + 1
    # N = 16: widths 2, 3, 8 and 16, each at every start; a drop at positions 5-8 lies inside 5-7 and 6-8.
    assert len(verdicts.blocks(16)) == 16 + 15 + 14 + 9 + 1 and {(4, 7), (5, 8)} <= set(verdicts.blocks(16))
    assert verdicts.blocks(1) == [(0, 1)]
    assert verdicts.blocks(2) == [(0, 1), (1, 2), (0, 2)]


def test_a_verdict_catches_a_drop_over_a_block_that_no_position_shows() -> None:
    rng = np.random.default_rng(5)
    n, trials = 30, 100
    questions = np.array([rng.choice(600, n, replace=False) for _ in range(trials)])
    difficulty = rng.standard_normal(600)[questions]
    truth = np.full(n, 0.5)
    lowered = truth.copy()
    lowered[:6] -= 0.12

    def job(acc: np.ndarray) -> TrialData:
        correct = latent_correct(
            np.broadcast_to(acc, (trials, n)),
            question=difficulty,
            prompt=0.0,
            noise=rng.standard_normal((trials, n)),
            question_effect=0.4,
            prompt_effect=0.0,
        )
        return TrialData.from_arrays(
            correct.astype(float), questions=questions, keys=[tuple(map(str, q)) for q in questions]
        )

    rule = RegressionRule(max_drop=5)
    judged = verdicts.judge(job(truth), job(lowered), rule=rule, alpha=0.05 / 2, resamples=500)
    assert judged.method == "paired" and judged.drop_flagged and not judged.parse_flagged
    assert (
        judged.worst_drop is not None and judged.worst_drop.last_position > judged.worst_drop.first_position
    )
    same = verdicts.judge(job(truth), job(truth), rule=rule, alpha=0.05 / 2, resamples=500)
    assert not same.drop_flagged
    assert same.worst_drop is not None and same.worst_drop.lower < 0 < same.worst_drop.upper


def test_token_distance_bins_are_clustered_by_trial_and_centred() -> None:
    rows = [
        DistanceRow(1, 3, 0, True, True, 0.9),
        DistanceRow(1, 3, 99, True, False, 0.1),
        DistanceRow(1, 3, 100, True, True),
        DistanceRow(2, 3, 250, False, False),
        DistanceRow(2, 3, None, False, False),
        DistanceRow(3, 4, 5, True, True),
    ]
    curve = distance_curve(
        rows, bin_width=100, clusters={}, model="m", revision=None, job_ids=[1], batch_size=3, resamples=50
    )
    assert [(p.position, p.x, p.n, p.n_parsed, p.n_correct) for p in curve.points] == [
        (0, 50.0, 2, 2, 1),
        (100, 150.0, 1, 1, 1),
        (200, 250.0, 1, 0, 0),
    ]
    assert curve.points[0].mean_gold_prob == pytest.approx(0.5)
    # Trial 1's two answers in the first bin are one cluster: the interval is wider than Wilson's on 2.
    assert (
        curve.points[0].ci_high - curve.points[0].ci_low
        >= wilson_interval(1, 2).high - wilson_interval(1, 2).low
    )  # type: ignore[operator]
    with pytest.raises(PosbiasError, match="bin width"):
        distance_curve(rows, bin_width=0, clusters={}, model="m", revision=None, job_ids=[1], batch_size=3)


def test_the_fake_marginal_accuracy_is_its_curve_whatever_the_effects() -> None:
    spec = FakeSpec(curve=(0.6, 0.2, 0.6), question_effect=0.4, prompt_effect=0.3)
    assert [spec.accuracy(p, 5) for p in range(1, 6)] == pytest.approx([0.6, 0.4, 0.2, 0.4, 0.6])
    rng = np.random.default_rng(0)
    draws = latent_correct(
        0.2,
        question=rng.standard_normal(200_000),
        prompt=rng.standard_normal(200_000),
        noise=rng.standard_normal(200_000),
        question_effect=0.4,
        prompt_effect=0.3,
    )
    assert draws.mean() == pytest.approx(0.2, abs=0.005)


# --- possible intervals, compare's family, parse collapses, options by position ---------------------------


def _tiny(rng: np.random.Generator, *, trials: int, n: int, accuracy: float) -> TrialData:
    correct = rng.random((trials, n)) < accuracy
    return TrialData.from_arrays(correct, keys=[(f"t{t}",) for t in range(trials)])


def test_intervals_at_four_trials_stay_possible_and_say_they_are_rough() -> None:
    """At the demo's 4 iterations, every interval is inside what its statistic can be, by construction."""
    for seed in range(6):
        rng = np.random.default_rng(seed)
        a = _tiny(rng, trials=4, n=5, accuracy=0.5)
        b = _tiny(rng, trials=4, n=5, accuracy=0.3)
        curve = build_curve(a, model="m", resamples=400, permutations=20)
        assert curve.note is not None and "only 4 trials: too few" in curve.note
        for k in (curve.contrast, curve.position_effect):
            if k is not None and k.low is not None and k.high is not None:
                assert -1 <= k.low <= k.high <= 1
        if curve.first_last_ratio is not None and curve.first_last_ratio.low is not None:
            assert curve.first_last_ratio.low >= 0
        found = comparison.compare(a, b, labels=("a", "b"), resamples=400)
        assert found.warning is not None and "only 4 trials" in found.warning
        bounds = [(p.ci_low, p.ci_high) for p in found.points] + [
            (p.band_low, p.band_high) for p in found.points
        ]
        bounds += [(d.band_low, d.band_high) for d in (*found.blocks, *found.parse)]
        for low, high in bounds:
            assert low is not None and high is not None and -1 <= low <= high <= 1
        assert found.contrast_diff is not None and found.contrast_diff.low is not None
        assert -2 <= found.contrast_diff.low <= found.contrast_diff.high <= 2  # type: ignore[operator]


def test_compare_marks_a_drop_spread_over_a_block_and_holm_never_lowers_a_p_value() -> None:
    """A 10-point drop at positions 1-10 of N = 50, 100 matched trials (benchmarks/compare_power.py:
    caught in 100% of 200 runs): marked on a block; McNemar's adjusted p-values are at least the pointwise."""
    rng = np.random.default_rng(3)
    truth = np.linspace(0.3, 0.6, 50)
    lowered = truth.copy()
    lowered[:10] -= 0.10
    questions = np.array([rng.choice(2000, 50, replace=False) for _ in range(100)])
    difficulty = rng.standard_normal(2000)[questions]
    prompts = rng.standard_normal(100)[:, None]
    keys = [tuple(map(str, row)) for row in questions]

    def job(acc: np.ndarray) -> TrialData:
        correct = latent_correct(
            np.broadcast_to(acc, questions.shape),
            question=difficulty,
            prompt=prompts,
            noise=rng.standard_normal(questions.shape),
            question_effect=0.3,
            prompt_effect=0.1,
        )
        return TrialData.from_arrays(correct, questions=questions, keys=keys)

    found = comparison.compare(job(truth), job(lowered), labels=("a", "b"))
    marked = [d.where for d in found.blocks if d.different]
    assert marked and all(d.diff is not None and d.diff < 0 for d in found.blocks if d.different)
    assert any(w in ("positions 1-5", "positions 6-10", "positions 1-10") for w in marked), marked
    for p in found.points:
        assert p.mcnemar_p is not None and p.mcnemar_holm is not None and p.mcnemar_holm >= p.mcnemar_p


def test_holm_is_statsmodels_holm() -> None:
    """posbias computes Holm itself (statsmodels' holm path runs gc.collect() on every call); the figures are
    statsmodels', ties and Nones included."""
    from statsmodels.stats.multitest import multipletests

    rng = np.random.default_rng(7)
    for size in (1, 2, 7, 50):
        given = [float(p) for p in rng.uniform(0, 0.2, size)]
        given[0:2] = given[:1] * min(2, size)  # a tie
        ours = comparison.holm_adjust([None, *given, None])
        assert ours[0] is None and ours[-1] is None
        assert ours[1:-1] == pytest.approx(list(multipletests(given, method="holm")[1]), abs=1e-12)


def test_a_parse_collapse_at_the_end_of_the_sheet_is_flagged_and_named() -> None:
    """Parse rate 100% -> 9% at positions 41-50 of N = 50: those positions have too few parsed answers for
    the accuracy check, and the parse check still sees them."""
    rng = np.random.default_rng(1)
    keys = [(f"t{t}",) for t in range(100)]
    base = TrialData.from_arrays(rng.random((100, 50)) < 0.5, keys=keys)
    parsed = np.ones((100, 50))
    parsed[:, 40:] = rng.random((100, 10)) < 0.09
    cand = TrialData.from_arrays(rng.random((100, 50)) < 0.5, parsed=parsed, keys=keys)
    judged = verdicts.judge(base, cand, rule=RegressionRule(max_drop=5), alpha=0.05 / 2, resamples=500)
    assert judged.parse_flagged and judged.parse_drop is not None
    assert judged.parse_drop.first_position > 40 and judged.parse_drop.diff < -0.8
    assert judged.note is not None and "accuracy not judged at positions 41-50" in judged.note


def _options_data(probs: np.ndarray, gold: np.ndarray) -> options.OptionData:
    return options.OptionData(
        batch_size=gold.shape[1],
        gold=gold,
        predicted=probs.argmax(axis=2),
        probs=probs,
        shuffled=np.ones(gold.shape[0], dtype=bool),
        cluster=np.arange(gold.shape[0]),
    )


def test_options_by_position_reads_a_collapse_a_guess_and_confident_wrong_answers() -> None:
    """Positions 1-3 behind a prior on option 4 (the fake engine's collapse: belief times prior), 4-5
    spread evenly (a guess), 6 sure of a wrong option, 7-8 answering well. The prior removed (PriDe), the
    collapsed positions' accuracy is the belief's again."""
    rng = np.random.default_rng(0)
    trials, n, k = 200, 8, 4
    gold = rng.integers(0, k, size=(trials, n))
    collapse = FakeCollapse(option=4, positions=(1, 3))
    probs = np.empty((trials, n, k))
    for t in range(trials):
        for j in range(n):
            right = rng.random() < 0.7
            chosen = int(gold[t, j]) if right else int((gold[t, j] + rng.integers(1, k)) % k)
            p = option_probs(k, chosen=chosen, gold=int(gold[t, j]), accuracy=0.7)
            if collapse.applies(j + 1):
                p = with_prior(p, collapse.weights(k))
            elif j in (3, 4):
                p = list(rng.dirichlet(np.full(k, 50.0)))
            elif j == 5:
                wrong = int((gold[t, j] + rng.integers(1, k)) % k)
                p = [0.9 if i == wrong else 0.1 / 3 for i in range(k)]
            probs[t, j] = p
    view = options.view(_options_data(probs, gold), model="m", resamples=300)
    assert view.readings == (
        "positions 1-3: a collapse onto option 4",
        "positions 4-5: a guess",
        "position 6: confident and wrong",
    )
    for point in view.points[:3]:
        assert point.predicted_share[3] > 0.95 and point.accuracy is not None and point.accuracy < 0.4
        d = point.debiased_accuracy
        assert d is not None and d.low is not None and d.high is not None and d.low <= 0.7 <= d.high
        assert d.low >= 0 and d.high <= 1
        assert point.prior is not None and point.prior[3] > 0.8
    assert view.points[3].entropy is not None and view.points[3].entropy > 1.9  # bits, of 2
    assert view.points[5].confidence == pytest.approx(0.9)


@pytest.mark.parametrize("bound", [1.0, 2.0, 0.25])
def test_a_bounded_interval_stays_inside_its_range_nears_wald_when_narrow_and_widens_to_the_bound(
    bound: float,
) -> None:
    for r in np.linspace(-1.2, 1.2, 49):
        for half in (0.0, 0.01, 0.3, 1.0, 5.0, 1e6, math.inf):
            found = bounded_interval(r * bound, half * bound, bound=bound)
            assert found.low is not None and found.high is not None
            assert -bound <= found.low <= found.high <= bound, (r, half, found)
            if abs(r) < 1:
                assert found.low - 1e-12 <= r * bound <= found.high + 1e-12
    narrow = bounded_interval(0.1 * bound, 0.02 * bound, bound=bound)
    assert narrow.low == pytest.approx(0.08 * bound, abs=1e-3 * bound)
    assert narrow.high == pytest.approx(0.12 * bound, abs=1e-3 * bound)
    at_the_bound = bounded_interval(-bound, 0.05 * bound, bound=bound)
    assert (at_the_bound.low, at_the_bound.high) == (-bound, bound)
