"""The shape test: a permutation test of "accuracy does not depend on position" at all, whatever the curve's
shape (a U shape has no slope but moves)."""

from __future__ import annotations

import numpy as np

from posbias.service.stats.bootstrap import chunks
from posbias.service.stats.trial_data import Floats, TrialData

PERMUTATIONS = 999


def shape_test(data: TrialData, *, permutations: int = PERMUTATIONS, seed: int = 0) -> float | None:
    """p-value of "accuracy does not depend on position": the spread of the position accuracies
    (sum over positions of parsed answers x squared deviation from the overall accuracy) against its
    distribution when positions are permuted within each cluster (the same permutation for every trial of
    a sampled set), which under no position effect leaves the data's distribution unchanged because the
    planner assigned questions to positions at random."""
    n = data.batch_size
    if n < 2 or data.trials < 2:
        return None
    rng = np.random.default_rng(seed)
    observed = _spread(data.correct[None], data.parsed[None])[0]
    exceed = 0
    for chunk in chunks(permutations):
        order = np.argsort(rng.random((chunk, data.clusters, n)), axis=2)[:, data.cluster, :]
        correct = np.take_along_axis(np.broadcast_to(data.correct, order.shape), order, axis=2)
        parsed = np.take_along_axis(np.broadcast_to(data.parsed, order.shape), order, axis=2)
        exceed += int(np.sum(_spread(correct, parsed) >= observed - 1e-12))
    return (1 + exceed) / (1 + permutations)


def _spread(correct: Floats, parsed: Floats) -> Floats:
    k = correct.sum(axis=1)
    m = parsed.sum(axis=1)
    overall = k.sum(axis=1) / np.maximum(m.sum(axis=1), 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(m > 0, k / np.where(m > 0, m, 1), overall[:, None])
    spread: Floats = (m * (accuracy - overall[:, None]) ** 2).sum(axis=1)
    return spread
