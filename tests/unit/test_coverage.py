"""A small version of benchmarks/coverage.py: the intervals posbias prints hold their truth about 95% of the
time, and identical things are called different rarely, on fixed seeds, with binomial tolerances.

The program's full run (500 replications per setting, every interval) is in benchmarks/README.md; these few
replications only catch an interval that is badly off (the tolerance is the 0.1% binomial bound).
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
from scipy.stats import binom

from posbias.schemas import FakeSpec

REPS = 30
FAST = {"resamples": 400}
"""Fewer resamples than the CLI's 2,000: enough for a 95% interval's ends, and five times faster."""


def _run(coverage: ModuleType, body: object, *, name: str) -> dict[str, object]:
    setting = coverage.Setting(name, "test", body)
    for _ in coverage.replications(setting, reps=REPS, seed=7):
        pass
    return setting.tallies  # type: ignore[no-any-return]


def _lowest(target: float = 0.95) -> float:
    """The fewest hits out of REPS a 95% interval gives with probability 0.999."""
    return float(binom.ppf(0.001, REPS, target)) / REPS


def test_curve_intervals_hold_their_truth(coverage: ModuleType) -> None:
    spec = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.15)
    tallies = _run(
        coverage, coverage.curve_checks(spec, n=12, iterations=60, permutations=99, **FAST), name="curve"
    )
    for name in ("pointwise", "band", "contrast", "slope"):
        assert tallies[name].rate() >= _lowest(), f"{name}: {tallies[name].rate():.3f}"  # type: ignore[attr-defined]


def test_rotation_intervals_hold_their_truth(coverage: ModuleType) -> None:
    spec = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.3)
    tallies = _run(
        coverage,
        coverage.curve_checks(spec, n=6, iterations=40, rotation=True, permutations=99, **FAST),
        name="rotation",
    )
    for name in ("pointwise", "band", "contrast"):
        assert tallies[name].rate() >= _lowest(), f"{name}: {tallies[name].rate():.3f}"  # type: ignore[attr-defined]


def test_identical_curves_are_rarely_called_different(coverage: ModuleType) -> None:
    spec = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.15)
    for matched in (True, False):
        tallies = _run(
            coverage,
            coverage.paired_checks(spec, spec, n=12, iterations=60, matched=matched, **FAST),
            name="pair",
        )
        kind = "paired" if matched else "unpaired"
        called = tallies[f"{kind}: identical called different"].rate()  # type: ignore[attr-defined]
        assert called <= float(binom.ppf(0.999, REPS, 0.05)) / REPS
        assert tallies[f"{kind} difference, pointwise"].rate() >= _lowest()  # type: ignore[attr-defined]


def test_verdicts_catch_a_block_drop_and_pass_an_identical_checkpoint(coverage: ModuleType) -> None:
    spec = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.15)
    same = _run(
        coverage,
        coverage.verdict_checks(spec, n=20, iterations=80, drop=0.0, drop_positions=0, **FAST),
        name="v0",
    )
    assert same["verdict: identical flagged"].rate() <= float(binom.ppf(0.999, REPS, 0.05)) / REPS  # type: ignore[attr-defined]
    drop = _run(
        coverage,
        coverage.verdict_checks(spec, n=20, iterations=80, drop=0.15, drop_positions=5, **FAST),
        name="v1",
    )
    (caught,) = drop.values()
    assert caught.rate() >= 0.8  # type: ignore[attr-defined]
    assert np.isfinite(caught.rate())  # type: ignore[attr-defined]
