"""The cluster bootstrap: whole clusters resampled, one curve's or two curves' sums per resample, and what
is read off the resamples: percentile intervals widened for few clusters, the max-|t| simultaneous band,
the last-minus-first contrast and the last/first ratio."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import Interval
from posbias.service.intervals import LEVEL, clustered_interval
from posbias.service.trial_data import Floats, Ints, TrialData

BOOTSTRAP_RESAMPLES = 2000
RATIO_MIN_FIRST = 0.1
"""The ratio is given only when the first position's pointwise interval starts at or above this: below it
the ratio is unbounded in practice and its bootstrap is dominated by resamples near 0."""
_CHUNK = 200
"""Bootstrap resamples computed at a time (memory: chunk x clusters weights)."""


@dataclass(frozen=True)
class Resampled:
    """One curve's weighted sums per bootstrap resample (rows; row 0 is the data) and position (columns)."""

    correct: Floats
    parsed: Floats
    answered: Floats

    def accuracy(self, columns: Sequence[Sequence[int]] | None = None) -> Floats:
        """Accuracy among parsed answers per resample: per position, or per group of `columns` pooled."""
        k, m = self._grouped(self.correct, columns), self._grouped(self.parsed, columns)
        with np.errstate(invalid="ignore", divide="ignore"):
            return k / m

    def parse_rate(self, columns: Sequence[Sequence[int]] | None = None) -> Floats:
        """Share of answers that parsed per resample: per position, or per group of `columns` pooled."""
        m, a = self._grouped(self.parsed, columns), self._grouped(self.answered, columns)
        with np.errstate(invalid="ignore", divide="ignore"):
            return m / a

    @staticmethod
    def _grouped(values: Floats, columns: Sequence[Sequence[int]] | None) -> Floats:
        if columns is None:
            return values
        return np.column_stack([values[:, list(group)].sum(axis=1) for group in columns])


def bootstrap(
    sums: Sequence[tuple[Floats, Floats, Floats]],
    *,
    strata: Sequence[Ints],
    membership: Sequence[Ints],
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> list[Resampled]:
    """Resample clusters; return each curve's weighted sums per resample (row 0: the data itself).

    `sums[i]` are curve i's (correct, parsed, answered) counts per its own cluster; `membership[i]` maps each
    of curve i's clusters to a shared resampling unit; `strata[j]` lists the units of stratum j. A unit's
    weight is its multinomial count within its stratum, so each stratum keeps its size: a single curve has
    one stratum; a comparison has one of matched units (a matched trial's two answers resampled together)
    and one for each side's unmatched clusters.
    """
    units = 1 + max(int(m.max()) for m in membership if m.size)
    rng = np.random.default_rng(seed)
    out = [tuple(np.empty((resamples + 1, s[0].shape[1])) for _ in range(3)) for s in sums]
    done = 0
    for chunk in chunks(resamples + 1):
        weights = np.zeros((chunk, units))
        for stratum in strata:
            size = len(stratum)
            if size:
                weights[:, stratum] = rng.multinomial(size, np.full(size, 1.0 / size), size=chunk)
        if done == 0:
            weights[0] = 0.0
            for stratum in strata:
                weights[0, stratum] = 1.0
        for i, counts in enumerate(sums):
            w = weights[:, membership[i]]
            for target, values in zip(out[i], counts, strict=True):
                target[done : done + chunk] = w @ values
        done += chunk
    return [Resampled(correct=c, parsed=m, answered=a) for c, m, a in out]


def chunks(total: int) -> Iterator[int]:
    """`total` in pieces of at most `_CHUNK`: the resamples (or permutations) computed at a time."""
    while total > 0:
        yield min(_CHUNK, total)
        total -= min(_CHUNK, total)


def single(data: TrialData, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> Resampled:
    """A curve's sums per resample of its clusters (row 0: the data)."""
    sums = data.cluster_sums()
    clusters = np.arange(sums[0].shape[0], dtype=np.int64)
    return bootstrap([sums], strata=[clusters], membership=[clusters], resamples=resamples, seed=seed)[0]


def small_sample(df: int | None, z: float) -> float:
    """A bootstrap critical value `z` (on the normal scale) for `df + 1` resampled clusters, widened as
    cluster-robust inference widens it: Student's t with `df` degrees of freedom at the same tail
    probability, times sqrt(C / (C - 1)) for the bootstrap's variance, which is the clusters' divided by C
    instead of C - 1. With 100 clusters a 95% interval widens by 1.7%; without it, intervals and bands came
    out about a point short of their level (benchmarks/coverage.py)."""
    from scipy.stats import norm, t

    if df is None or df < 1 or not math.isfinite(z) or z <= 0:
        return z
    clusters = df + 1
    return float(t.ppf(norm.cdf(z), df)) * math.sqrt(clusters / (clusters - 1))


def percentile(
    estimate: float | None, resampled: Floats, *, level: float = LEVEL, df: int | None = None
) -> Interval:
    """Percentile interval of `resampled` (NaN resamples, where the statistic is undefined, left out),
    each side's distance from the estimate widened by `small_sample(df)` when `df` is given."""
    kept = resampled[np.isfinite(resampled)]
    if estimate is None or not math.isfinite(estimate) or kept.size == 0:
        return Interval(
            estimate=None if estimate is None or not math.isfinite(estimate) else estimate,
            low=None,
            high=None,
        )
    low, high = np.quantile(kept, [(1 - level) / 2, (1 + level) / 2])
    from scipy.special import ndtri  # scipy costs a quarter second to import: only when a curve is built

    z = float(ndtri((1 + level) / 2))
    widen = small_sample(df, z) / z
    return Interval(
        estimate=float(estimate),
        low=float(estimate - widen * (estimate - low)),
        high=float(estimate + widen * (high - estimate)),
    )


@dataclass(frozen=True)
class Band:
    """A simultaneous band: per position a low and high bound, holding at every position at once."""

    low: Floats
    high: Floats
    critical: float
    """The max-|t| quantile: the band is estimate +- critical x bootstrap standard error."""
    se: Floats
    """Per position, the bootstrap standard error (0 where resamples do not vary)."""


def max_t_band(
    estimate: Floats,
    resampled: Floats,
    *,
    level: float = LEVEL,
    clip: tuple[float, float] | None = (0.0, 1.0),
    one_sided: str | None = None,
    df: int | None = None,
) -> Band:
    """The max-|t| simultaneous band of the bootstrap: standardise each position's resamples by their
    standard error, take the largest deviation over positions in each resample, and use its `level`
    quantile as the common critical value. Positions whose resamples do not vary get a band of zero width
    (their estimate cannot move under resampling: e.g. a curve compared with itself).

    `one_sided="upper"` gives upper bounds only (the low side is -inf): for "no drop beyond" questions.
    With `df` (resampled clusters - 1) the critical value is widened by `small_sample`.
    """
    finite = np.isfinite(resampled)
    counts = finite.sum(axis=0)
    se = np.zeros_like(estimate)
    spread = counts > 1
    if spread.any():
        column = np.where(finite[:, spread], resampled[:, spread], 0.0)
        mean = column.sum(axis=0) / counts[spread]
        squares = np.where(finite[:, spread], (column - mean) ** 2, 0.0).sum(axis=0)
        se[spread] = np.sqrt(squares / (counts[spread] - 1))
    usable = np.isfinite(estimate) & np.isfinite(se) & (se > 1e-12)
    critical = 0.0
    if usable.any():
        deviation = (resampled[:, usable] - estimate[usable]) / se[usable]
        deviation = -deviation if one_sided == "upper" else np.abs(deviation)  # upper: how far below
        worst = np.where(np.isfinite(deviation), deviation, -np.inf).max(axis=1)
        worst = worst[np.isfinite(worst)]
        critical = small_sample(df, float(np.quantile(worst, level))) if worst.size else 0.0
    se_used = np.where(usable, se, 0.0)
    low = estimate - critical * se_used if one_sided != "upper" else np.full_like(estimate, -np.inf)
    high = estimate + critical * se_used
    if clip is not None:
        low = np.clip(low, *clip)
        high = np.clip(high, *clip)
    return Band(low=low, high=high, critical=critical, se=se_used)


def contrast(resampled: Floats, *, df: int | None = None) -> Interval:
    """Last minus first position's accuracy, with its percentile interval."""
    values = resampled[:, -1] - resampled[:, 0]
    return percentile(float(values[0]), values[1:], df=df)


def ratio(data: TrialData, resampled: Floats) -> tuple[Interval | None, str | None]:
    """Last over first accuracy with its percentile interval, when the first is bounded away from 0."""
    k, m, _ = data.cluster_sums()
    first = clustered_interval(k[:, 0], m[:, 0])
    if first.low is None or first.low < RATIO_MIN_FIRST:
        bound = "no answers" if first.low is None else f"its interval starts at {first.low:.2f}"
        return None, (
            f"no last/first ratio: the first position's accuracy is not bounded away from zero ({bound}, "
            f"below {RATIO_MIN_FIRST}); see the last-minus-first contrast"
        )
    with np.errstate(invalid="ignore", divide="ignore"):
        values = resampled[:, -1] / resampled[:, 0]
    if not np.isfinite(values[0]):
        return None, "no last/first ratio: the last position has no parsed answers"
    zeros = int(np.sum(resampled[1:, 0] == 0))
    note = f"{zeros} of {len(values) - 1} resamples had no correct first answer (left out)" if zeros else None
    return percentile(float(values[0]), values[1:], df=data.clusters - 1), note
