"""The arithmetic behind the statistical tests' sizes (tests/support/power.py): the R and cut-off it finds
meet both conditions, no smaller R does, and the figures agree with a direct count of binomial outcomes."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom, norm
from support.power import DOUBLED, NARROW, at, cutoff, narrowed_miss, sizing


def test_a_30_percent_narrower_95_interval_misses_17_percent() -> None:
    assert narrowed_miss() == pytest.approx(0.170, abs=5e-4)
    assert narrowed_miss(narrower=0.0) == pytest.approx(0.05)
    z = norm.isf(0.025) * 0.7
    assert narrowed_miss() == pytest.approx(norm.cdf(-z) + norm.sf(z))


@pytest.mark.parametrize(("correct", "broken"), [(0.05, narrowed_miss()), (0.05, 0.10), (0.02, 0.20)])
def test_the_sizing_meets_both_conditions_at_the_smallest_r(correct: float, broken: float) -> None:
    found = sizing(correct, broken)
    r, c = found.replications, found.most
    assert binom.cdf(c, r, correct) >= 0.99 and binom.sf(c, r, broken) >= 0.90
    for smaller in range(1, r):
        # At a smaller R, no cut-off meets both (every one from 0 to R tried).
        most = np.arange(smaller + 1)
        both = (binom.cdf(most, smaller, correct) >= 0.99) & (binom.sf(most, smaller, broken) >= 0.90)
        assert not both.any(), smaller


def test_the_suites_two_sizings() -> None:
    assert (NARROW.replications, NARROW.most) == (81, 9)
    assert (DOUBLED.replications, DOUBLED.most) == (346, 27)
    assert NARROW.pass_correct >= 0.99 and NARROW.fail_broken >= 0.90
    assert DOUBLED.pass_correct >= 0.99 and DOUBLED.fail_broken >= 0.90


def test_the_figures_agree_with_simulated_counts() -> None:
    rng = np.random.default_rng(0)
    draws = 40_000
    for rate, expected in ((NARROW.correct, NARROW.pass_correct), (NARROW.broken, 1 - NARROW.fail_broken)):
        passed = np.mean(rng.binomial(NARROW.replications, rate, draws) <= NARROW.most)
        assert abs(passed - expected) < 4 * np.sqrt(expected * (1 - expected) / draws) + 1e-3


def test_the_cutoff_is_the_lowest_that_keeps_the_correct_chance() -> None:
    for r in (30, 81, 346, 1000):
        c = cutoff(r, 0.05)
        assert binom.cdf(c, r, 0.05) >= 0.99
        assert c == 0 or binom.cdf(c - 1, r, 0.05) < 0.99
    assert at(400, 0.05, 0.10).most == cutoff(400, 0.05)


def test_rates_the_wrong_way_round_are_refused() -> None:
    with pytest.raises(ValueError, match="correct < broken"):
        sizing(0.10, 0.05)
    with pytest.raises(ValueError, match="raise at_most"):
        sizing(0.05, 0.051, at_most=50)
