"""The estimators at cluster scale (issue 39) give what they gave before, or, past the sizes the tests and the
coverage program use, what the same statistic's faster form gives: the clustered least squares against
statsmodels, the bootstrap's sums against plain float64 products of numpy's multinomial weights, the large
jobs' weights against the multinomial's distribution, and the shape test's large-sample form against its
permutations."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

from posbias.service.stats import bootstrap, shape_test
from posbias.service.stats.regression import clustered_ols
from posbias.service.stats.trial_data import TrialData


@pytest.mark.parametrize(("answers", "terms", "clusters"), [(400, 2, 30), (5000, 3, 200), (20000, 8, 900)])
def test_clustered_least_squares_is_statsmodels(answers: int, terms: int, clusters: int) -> None:
    rng = np.random.default_rng(answers)
    design = np.column_stack([np.ones(answers), *(rng.random(answers) for _ in range(terms - 1))])
    y = (rng.random(answers) < 0.3 + 0.2 * design[:, 1]).astype(float)
    groups = rng.integers(0, clusters, answers)
    theirs = sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": groups}, use_t=True)
    ours = clustered_ols(y, design, groups)
    assert np.allclose(ours.params, theirs.params, rtol=0, atol=1e-12)
    assert np.allclose(ours.cov, theirs.cov_params(), rtol=1e-9, atol=1e-15)
    for k in range(terms):
        assert np.allclose(ours.interval(k), theirs.conf_int(alpha=0.05)[k], rtol=0, atol=1e-10)
    restriction = np.eye(terms)[1:]
    assert ours.joint_p(restriction) == pytest.approx(float(theirs.f_test(restriction).pvalue), rel=1e-8)
    vector = np.eye(terms)[1]
    found = np.asarray(theirs.t_test(vector).conf_int(alpha=0.05)).ravel()
    assert np.allclose(ours.combination(vector), found, rtol=0, atol=1e-10)


def _reference_bootstrap(sums: tuple[np.ndarray, ...], resamples: int, seed: int) -> list[np.ndarray]:
    """The single-curve bootstrap as it was: numpy's multinomial weights, three float64 products a chunk."""
    units = sums[0].shape[0]
    rng = np.random.default_rng(seed)
    out = [np.empty((resamples + 1, s.shape[1])) for s in sums]
    done = 0
    for chunk in bootstrap.chunks(resamples + 1):
        weights = rng.multinomial(units, np.full(units, 1.0 / units), size=chunk).astype(float)
        if done == 0:
            weights[0] = 1.0
        for target, values in zip(out, sums, strict=True):
            target[done : done + chunk] = weights @ values
        done += chunk
    return out


@pytest.mark.parametrize("clusters", [20, 300, bootstrap.DRAW_UP_TO])
def test_the_bootstrap_of_tests_sized_jobs_is_unchanged(clusters: int) -> None:
    rng = np.random.default_rng(clusters)
    data = TrialData.from_arrays(
        (rng.random((clusters, 12)) < 0.5).astype(float), parsed=rng.random((clusters, 12)) < 0.9
    )
    found = bootstrap.single(data, resamples=450, seed=7)
    expected = _reference_bootstrap(data.cluster_sums(), 450, 7)
    for got, want in zip((found.correct, found.parsed, found.answered), expected, strict=True):
        assert np.array_equal(got, want)  # float32 sums of integers below 2^24 are exact


def test_large_jobs_draw_weights_with_the_multinomial_distribution() -> None:
    units = bootstrap.DRAW_UP_TO * 3
    counts = bootstrap._counts(np.random.default_rng(1), units, 400)
    assert counts.shape == (400, units)
    assert np.all(counts.sum(axis=1) == units)  # every resample draws `units` clusters
    # multinomial(units, 1/units): each count has mean 1 and variance 1 - 1/units; counts are 0, 1, 2, ...
    assert counts.mean() == pytest.approx(1.0)
    assert counts.var() == pytest.approx(1 - 1 / units, rel=0.02)
    assert np.mean(counts == 0) == pytest.approx((1 - 1 / units) ** units, abs=0.01)


def test_the_shape_tests_large_sample_form_agrees_with_its_permutations() -> None:
    rng = np.random.default_rng(5)
    for effect in (0.0, 0.03, 0.06):
        trials, n = 600, 30
        accuracy = 0.45 + effect * np.linspace(-1, 1, n)
        difficulty = rng.normal(0, 1, (trials, n))
        chance = 1 / (1 + np.exp(-(np.log(accuracy / (1 - accuracy)) + difficulty)))
        data = TrialData.from_arrays(
            (rng.random((trials, n)) < chance).astype(float), parsed=rng.random((trials, n)) > 0.05
        )
        assert shape_test.method(data) == "permutation"  # 18,000 answers: permuted, compared with the form
        correct, parsed, _ = data.cluster_sums()
        large = shape_test.large_sample_p(correct, parsed)
        permuted = shape_test.shape_test(data, permutations=1999)  # small enough to permute
        assert large is not None and permuted is not None
        # Monte Carlo error of 1,999 permutations: about 0.011 at p = 0.5
        assert abs(large - permuted) < 0.04, (effect, large, permuted)


def test_jobs_past_the_permutations_reach_use_the_large_sample_form() -> None:
    rng = np.random.default_rng(2)
    small = TrialData.from_arrays((rng.random((100, 50)) < 0.4).astype(float))
    large = TrialData.from_arrays((rng.random((1100, 50)) < 0.4).astype(float))
    assert shape_test.method(small) == "permutation"
    assert shape_test.method(large) == "large-sample"
    correct, parsed, _ = large.cluster_sums()
    assert shape_test.shape_test(large) == shape_test.large_sample_p(correct, parsed)
