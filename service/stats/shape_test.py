"""The shape test: a permutation test of "accuracy does not depend on position" at all, whatever the curve's
shape (a U shape has no slope but moves).

Its cost is permutations x trials x positions; past `PERMUTE_UP_TO` answers (a job of 1,000 trials at
N = 50), given enough clusters, the permutation distribution is replaced by its large-sample form, which is
exact in the limit of many clusters and costs one pass over the data. Under the permutations each
cluster's residuals (correct - p x parsed, p the overall accuracy) are spread over the positions at
random, so the positions' summed residuals have mean 0 and covariance V n/(n - 1) (I - J/n), V the sum of
the clusters' variances of their residuals over positions; the statistic, scaled by M (n - 1) / (n^2 V)
with M the parsed answers, is then chi-squared with n - 1 degrees of freedom. benchmarks/intervals.py
(`shape`) checks that the two agree and that the large-sample form's false-positive rate holds at the
sizes it is used for (at 400 trials of N = 50 it called 6.5% of 200 null jobs, 3.8-10.8%; at 1,000, 3.5%:
hence 1,000 and 500 clusters).
"""

from __future__ import annotations

import numpy as np

from posbias.service.stats.bootstrap import chunks
from posbias.service.stats.trial_data import Floats, TrialData

PERMUTATIONS = 999
PERMUTE_UP_TO = 50_000
"""Answers (trials x positions) up to which the p-value is the permutation test's; past it, with at least
`LARGE_SAMPLE_CLUSTERS` clusters, its large-sample form."""
LARGE_SAMPLE_CLUSTERS = 500
_CELLS_AT_ONCE = 4_000_000
"""Permuted answers held at once (a few arrays of this many floats)."""


def shape_test(data: TrialData, *, permutations: int = PERMUTATIONS, seed: int = 0) -> float | None:
    """p-value of "accuracy does not depend on position": the spread of the position accuracies
    (sum over positions of parsed answers x squared deviation from the overall accuracy) against its
    distribution when positions are permuted within each cluster (the same permutation for every trial of
    a sampled set), which under no position effect leaves the data's distribution unchanged because the
    planner assigned questions to positions at random."""
    n = data.batch_size
    if n < 2 or data.trials < 2:
        return None
    if method(data) == "large-sample":
        correct, parsed, _ = data.cluster_sums()
        return large_sample_p(correct, parsed)
    rng = np.random.default_rng(seed)
    observed = _spread(data.correct[None], data.parsed[None])[0]
    exceed = 0
    at_once = max(1, _CELLS_AT_ONCE // max(data.correct.size, 1))  # memory: chunk x trials x positions
    for chunk in (c for whole in chunks(permutations) for c in _pieces(whole, at_once)):
        order = np.argsort(rng.random((chunk, data.clusters, n)), axis=2)[:, data.cluster, :]
        correct = np.take_along_axis(np.broadcast_to(data.correct, order.shape), order, axis=2)
        parsed = np.take_along_axis(np.broadcast_to(data.parsed, order.shape), order, axis=2)
        exceed += int(np.sum(_spread(correct, parsed) >= observed - 1e-12))
    return (1 + exceed) / (1 + permutations)


def method(data: TrialData) -> str:
    """Which form of the test `shape_test` uses on `data`: "permutation" or "large-sample"."""
    large = data.correct.size > PERMUTE_UP_TO and data.clusters >= LARGE_SAMPLE_CLUSTERS
    return "large-sample" if large else "permutation"


def _spread(correct: Floats, parsed: Floats) -> Floats:
    k = correct.sum(axis=1)
    m = parsed.sum(axis=1)
    overall = k.sum(axis=1) / np.maximum(m.sum(axis=1), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(m > 0, k / np.where(m > 0, m, 1), overall[:, None])
    spread: Floats = (m * (accuracy - overall[:, None]) ** 2).sum(axis=1)
    return spread


def large_sample_p(correct: Floats, parsed: Floats) -> float | None:
    """The shape test's p-value from the permutation distribution's large-sample form (module docstring):
    `correct` and `parsed` are per cluster (rows) and position (columns)."""
    from scipy.special import chdtrc

    n = correct.shape[1]
    total = float(parsed.sum())
    if total <= 0 or n < 2:
        return None
    p = float(correct.sum()) / total
    residual = correct - p * parsed
    spread = float(((residual - residual.mean(axis=1, keepdims=True)) ** 2).sum()) / n  # V
    if spread <= 0:
        return 1.0
    observed = float(_spread(correct.sum(axis=0)[None, None], parsed.sum(axis=0)[None, None])[0])
    statistic = observed * total * (n - 1) / (n * n * spread)
    return float(chdtrc(n - 1, statistic))


def _pieces(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]
