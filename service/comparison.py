"""Comparing two curves at one batch size: paired where their trials match, unpaired where they do not.

Two trials *match* when they show the same questions at the same positions (same seed, same pool: what
a schedule's checkpoints and a job's variants share). Matched trials are resampled together, so what the
two curves have in common (question difficulty, the prompt) cancels out of their difference; trials without
a match are resampled on their own side. Both kinds go into one stratified cluster bootstrap, and the
comparison says which method it used and how many trials matched. A job compared with itself has every
trial matched to itself and differences of exactly zero with intervals of zero width.

Per position: the difference with a pointwise percentile interval, a simultaneous 95% band (max-|t| over
positions), `different` only where the band excludes zero, and, for matched trials, the exact McNemar test.
`service/verdicts.py` asks the one-sided questions of regression runs of the same machinery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import Comparison, DiffPoint, Interval, PosbiasError
from posbias.service.bootstrap import (
    BOOTSTRAP_RESAMPLES,
    Resampled,
    bootstrap,
    contrast,
    max_t_band,
    percentile,
)
from posbias.service.regression import least_squares_slopes
from posbias.service.trial_data import Floats, Ints, TrialData


@dataclass(frozen=True)
class Matching:
    """How the trials of A and B pair up, and the units the bootstrap resamples."""

    pairs: tuple[tuple[int, int], ...]
    """(trial of A, trial of B) with the same questions at the same positions."""
    membership_a: Ints
    """Per cluster of A: its resampling unit."""
    membership_b: Ints
    strata: tuple[Ints, Ints, Ints]
    """Units with trials of both sides, of A only, of B only."""

    @property
    def df(self) -> int:
        """Degrees of freedom of the bootstrap's small-sample widening: resampled units less one per
        stratum."""
        return max(1, sum(len(s) - 1 for s in self.strata if len(s)))

    @property
    def method(self) -> str:
        matched, only_a, only_b = (len(s) for s in self.strata)
        if matched == 0:
            return "unpaired"
        return "paired" if only_a == only_b == 0 else "partly paired"


def match(a: TrialData, b: TrialData) -> Matching:
    """Pair trials of `a` and `b` that show the same questions in the same order (in order, when several
    do), and merge their clusters into resampling units: clusters linked by a matched trial form one unit,
    so a sampled set matched across the two jobs is resampled as one."""
    waiting: dict[tuple[str, ...], list[int]] = {}
    for index, key in enumerate(b.keys):
        waiting.setdefault(key, []).append(index)
    pairs = []
    for index, key in enumerate(a.keys):
        candidates = waiting.get(key)
        if candidates:
            pairs.append((index, candidates.pop(0)))
    ca, cb = a.clusters, b.clusters
    parent = list(range(ca + cb))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, j in pairs:
        parent[root(int(a.cluster[i]))] = root(ca + int(b.cluster[j]))
    roots = [root(x) for x in range(ca + cb)]
    unit_of = {r: u for u, r in enumerate(dict.fromkeys(roots))}
    units = np.array([unit_of[r] for r in roots], dtype=np.int64)
    side_a = set(units[:ca].tolist())
    side_b = set(units[ca:].tolist())
    both = sorted(side_a & side_b)
    return Matching(
        pairs=tuple(pairs),
        membership_a=units[:ca],
        membership_b=units[ca:],
        strata=(
            np.array(both, dtype=np.int64),
            np.array(sorted(side_a - side_b), dtype=np.int64),
            np.array(sorted(side_b - side_a), dtype=np.int64),
        ),
    )


def resample_pair(
    a: TrialData, b: TrialData, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> tuple[Matching, Resampled, Resampled]:
    """The stratified cluster bootstrap of two curves (see the module's docstring)."""
    if a.batch_size != b.batch_size:
        raise PosbiasError(
            f"cannot compare curves at different batch sizes ({a.batch_size} and {b.batch_size}); "
            "pick one batch size for both"
        )
    matching = match(a, b)
    ra, rb = bootstrap(
        [a.cluster_sums(), b.cluster_sums()],
        strata=[s for s in matching.strata if len(s)],
        membership=[matching.membership_a, matching.membership_b],
        resamples=resamples,
        seed=seed,
    )
    return matching, ra, rb


def mcnemar_p(a: TrialData, b: TrialData, pairs: Sequence[tuple[int, int]], column: int) -> float | None:
    """Exact McNemar p-value at one position over matched trials where both answers parsed."""
    from statsmodels.stats.contingency_tables import mcnemar

    both = [(i, j) for i, j in pairs if a.parsed[i, column] and b.parsed[j, column]]
    if not both:
        return None
    ya = np.array([a.correct[i, column] for i, _ in both])
    yb = np.array([b.correct[j, column] for _, j in both])
    table = [
        [int(np.sum((ya == 1) & (yb == 1))), int(np.sum((ya == 1) & (yb == 0)))],
        [int(np.sum((ya == 0) & (yb == 1))), int(np.sum((ya == 0) & (yb == 0)))],
    ]
    if table[0][1] + table[1][0] == 0:
        return 1.0
    return float(mcnemar(table, exact=True).pvalue)


def compare(
    a: TrialData,
    b: TrialData,
    *,
    labels: tuple[str, str],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Comparison:
    """B minus A at every position (accuracy among parsed answers), paired where trials match."""
    matching, ra, rb = resample_pair(a, b, resamples=resamples, seed=seed)
    acc_a, acc_b = ra.accuracy(), rb.accuracy()
    diff = acc_b - acc_a
    band = max_t_band(diff[0], diff[1:], clip=(-1.0, 1.0), df=matching.df)
    paired = matching.method != "unpaired"
    found = []
    for column in range(a.batch_size):
        d = float(diff[0, column])
        if not np.isfinite(d):
            found.append(
                DiffPoint(
                    position=column + 1,
                    accuracy_a=_finite(acc_a[0, column]),
                    accuracy_b=_finite(acc_b[0, column]),
                    diff=None,
                    ci_low=None,
                    ci_high=None,
                )
            )
            continue
        pointwise = percentile(d, diff[1:, column], df=matching.df)
        low, high = float(band.low[column]), float(band.high[column])
        found.append(
            DiffPoint(
                position=column + 1,
                accuracy_a=_finite(acc_a[0, column]),
                accuracy_b=_finite(acc_b[0, column]),
                diff=d,
                ci_low=pointwise.low,
                ci_high=pointwise.high,
                band_low=low,
                band_high=high,
                different=low > 0 or high < 0,
                mcnemar_p=mcnemar_p(a, b, matching.pairs, column) if paired else None,
            )
        )
    summaries: dict[str, Interval] = {}
    if a.batch_size > 1:
        summaries["contrast_a"] = contrast(acc_a, df=a.clusters - 1)
        summaries["contrast_b"] = contrast(acc_b, df=b.clusters - 1)
        summaries["contrast_diff"] = _difference(
            acc_b[:, -1] - acc_b[:, 0] - (acc_a[:, -1] - acc_a[:, 0]), df=matching.df
        )
        summaries["slope_diff"] = _difference(
            least_squares_slopes(acc_b) - least_squares_slopes(acc_a), df=matching.df
        )
    return Comparison(
        a=labels[0],
        b=labels[1],
        batch_size=a.batch_size,
        method=matching.method,
        matched_trials=len(matching.pairs),
        trials_a=a.trials,
        trials_b=b.trials,
        points=tuple(found),
        **summaries,
    )


def _difference(values: Floats, *, df: int) -> Interval:
    return percentile(float(values[0]), values[1:], df=df)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
