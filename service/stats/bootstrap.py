"""The cluster bootstrap: whole clusters resampled, one curve's or two curves' sums per resample, and what
is read off the resamples: percentile intervals widened for few clusters, the max-|t| simultaneous band,
the last-minus-first contrast and the last/first ratio.

Every interval stays inside what its statistic can be (a difference of proportions within +-1, a ratio at
least 0) by construction: the percentile interval's small-sample widening and the band's estimate +- c x SE
are taken on a scale that maps the possible range onto the whole line (`Bounds`: atanh for a bounded
range, log for a ratio) and mapped back. Nothing is clipped.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from posbias.schemas import Interval
from posbias.service.stats.intervals import LEVEL, clustered_interval, wilson_interval
from posbias.service.stats.trial_data import Floats, Ints, TrialData

BOOTSTRAP_RESAMPLES = 2000
Bounds = tuple[float, float]
"""The range a statistic can take, (low, high); high may be infinite (a ratio)."""
DIFF: Bounds = (-1.0, 1.0)
"""A difference of two proportions."""
DIFF_OF_DIFFS: Bounds = (-2.0, 2.0)
"""A difference of two differences of proportions (a contrast's change)."""
PROPORTION: Bounds = (0.0, 1.0)
RATIO: Bounds = (0.0, math.inf)
RATIO_MIN_FIRST = 0.1
"""The ratio is given only when the first position's pointwise interval starts at or above this: below it
the ratio is unbounded in practice and its bootstrap is dominated by resamples near 0."""
MIN_CLUSTERS = 16
"""The fewest clusters at which the cluster bootstrap's 95% intervals hold their level by simulation
(`benchmarks/intervals.py clusters`, N = 10, question and prompt effects, 150 runs each): the simultaneous
band of a paired difference covered 19% at 4 clusters, 73% at 8, 90% at 12 and 96% at 16; the contrast and
the pointwise difference 85-86% at 4 and 95% from 8 on. Below it a curve or comparison says so."""
_CHUNK = 200
"""Bootstrap resamples computed at a time (memory: chunk x clusters weights)."""
_WEIGHTS_AT_ONCE = 8_000_000
"""Resample x unit weights held at once past `DRAW_UP_TO` units (32 MB in float32): fewer and the product
with the clusters' sums, read once per chunk, is bound by memory instead of arithmetic (5M results: 83 s
at 10 resamples a chunk)."""
DRAW_UP_TO = 2_000
"""Units (clusters) of a stratum up to which the weights come from numpy's multinomial sampler (`_counts`)."""


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

    def counts(self, columns: Sequence[Sequence[int]] | None = None) -> tuple[Floats, Floats]:
        """The data's parsed answers and answers (row 0): per position, or per group of `columns`."""
        return self._grouped(self.parsed[:1], columns)[0], self._grouped(self.answered[:1], columns)[0]

    @staticmethod
    def _grouped(values: Floats, columns: Sequence[Sequence[int]] | None) -> Floats:
        if columns is None:
            return values
        ranges = [group for group in columns if isinstance(group, range) and group.step == 1]
        if len(ranges) == len(columns):
            # Blocks of consecutive positions (a comparison's family: every start of every width) from
            # running sums, a subtraction per block: summing each block's columns cost seconds at N = 200.
            # Whole counts summed in float64 (the resampled sums may be float32): the differences are exact.
            running = np.zeros((values.shape[0], values.shape[1] + 1))
            np.cumsum(values, axis=1, dtype=np.float64, out=running[:, 1:])
            starts = [group.start for group in ranges]
            stops = [group.stop for group in ranges]
            return running[:, stops] - running[:, starts]
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
    out = [np.empty((resamples + 1, 3 * s[0].shape[1])) for s in sums]
    stacked = [_stacked(counts) for counts in sums]
    done = 0
    # Past DRAW_UP_TO units, fewer resamples at a time: memory is a few chunk x units arrays.
    at_once = _CHUNK if units <= DRAW_UP_TO else max(1, min(_CHUNK, _WEIGHTS_AT_ONCE // units))
    exact = all(values.dtype == np.float32 for values in stacked)  # integer sums: float32 weights too
    # One stratum of every unit in order, units their own curve's clusters (a single curve): the counts are
    # the weights, drawn in place, with no copy of a chunk x units array per step (a third of the time).
    one_stratum = len(strata) == 1 and _in_order(strata[0], units)
    direct = [_in_order(m, units) for m in membership]
    for chunk in (c for whole in chunks(resamples + 1) for c in _pieces(whole, at_once)):
        weights = np.zeros((chunk, units), dtype=np.float32 if exact else np.float64)
        for stratum in strata:
            size = len(stratum)
            if size and one_stratum:
                _counts(rng, size, chunk, out=weights)
            elif size:
                weights[:, stratum] = _counts(rng, size, chunk)
        if done == 0:
            weights[0] = 0.0
            for stratum in strata:
                weights[0, stratum] = 1.0
        for i, values in enumerate(stacked):
            w = weights if direct[i] else weights[:, membership[i]]
            out[i][done : done + chunk] = w.astype(values.dtype, copy=False) @ values
        done += chunk
    width = [s[0].shape[1] for s in sums]
    return [
        Resampled(correct=o[:, :k], parsed=o[:, k : 2 * k], answered=o[:, 2 * k :])
        for o, k in zip(out, width, strict=True)
    ]


def _pieces(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


def _counts(
    rng: np.random.Generator, size: int, chunk: int, *, out: npt.NDArray[np.floating[Any]] | None = None
) -> npt.NDArray[np.floating[Any]]:
    """Per resample (rows), how often each of `size` units is drawn when `size` are drawn with replacement:
    multinomial counts. Up to `DRAW_UP_TO` units numpy's multinomial sampler (the draws every figure in the
    tests and the coverage program rests on); past it the counts of `size` uniform draws, which have the
    same distribution and cost a fraction of the time (the multinomial sampler is sequential over units).
    With `out` (chunk x size), written there and returned."""
    if size <= DRAW_UP_TO:
        drawn = rng.multinomial(size, np.full(size, 1.0 / size), size=chunk).astype(np.float64)
        if out is None:
            return drawn
        out[...] = drawn
        return out
    # Counts are small integers: exact in float32.
    counts = np.empty((chunk, size), dtype=np.float32) if out is None else out
    for row in range(chunk):  # a resample at a time: the draws of a chunk at once were 3 x its weights
        counts[row] = np.bincount(rng.integers(0, size, size=size), minlength=size)
    return counts


def _in_order(units: Ints, count: int) -> bool:
    """True when `units` is 0, 1, ..., count - 1 (indexing by it would only copy)."""
    found = np.asarray(units)
    return found.size == count and bool(np.array_equal(found, np.arange(count)))


def _stacked(counts: tuple[Floats, Floats, Floats]) -> Floats:
    """A curve's (correct, parsed, answered) side by side, in float32 where every resampled sum stays an
    integer below 2^24 (then float32 sums are exact and the same as float64's, at half the time)."""
    units = counts[0].shape[0]
    largest = max((float(c.max()) for c in counts if c.size), default=0.0)
    exact = all(_integral(c) for c in counts) and units * largest < 2**24
    # Filled in place, not stacked and then cast: at 5M answers the stacked float64 copy alone was 120 MB.
    values = np.empty((units, sum(c.shape[1] for c in counts)), dtype=np.float32 if exact else np.float64)
    start = 0
    for c in counts:
        values[:, start : start + c.shape[1]] = c
        start += c.shape[1]
    return values


def _integral(values: Floats, *, block: int = 1_000_000) -> bool:
    """Every entry a whole number (checked a block at a time, without a copy of the whole array)."""
    flat = values.reshape(-1)
    return all(
        bool(np.all(np.floor(flat[i : i + block]) == flat[i : i + block])) for i in range(0, flat.size, block)
    )


def too_few_clusters(clusters: int, *, unit: str = "trial") -> str | None:
    """One line saying the intervals cannot be read at their level, when `clusters` is below
    `MIN_CLUSTERS`; None otherwise."""
    if clusters >= MIN_CLUSTERS:
        return None
    units = f"{unit}s" if clusters != 1 else unit
    return (
        f"only {clusters} {units}: too few for the cluster bootstrap, whose 95% intervals hold their level "
        f"from {MIN_CLUSTERS} {unit}s on (benchmarks/intervals.py); read the intervals as rough"
    )


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
    from scipy.special import ndtr, stdtrit  # scipy.stats costs half a second more to import

    if df is None or df < 1 or not math.isfinite(z) or z <= 0:
        return z
    clusters = df + 1
    return float(stdtrit(df, ndtr(z))) * math.sqrt(clusters / (clusters - 1))


def to_scale(values: Floats | float, bounds: Bounds) -> Floats:
    """`values` on the unbounded scale of `bounds` (the ends map to -inf and +inf)."""
    low, high = bounds
    x = np.asarray(values, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        if math.isinf(high):
            return np.log(x - low)
        return np.arctanh(np.clip((2 * x - low - high) / (high - low), -1.0, 1.0))


def from_scale(values: Floats | float, bounds: Bounds) -> Floats:
    """The inverse of `to_scale`: always inside `bounds`."""
    low, high = bounds
    y = np.asarray(values, dtype=np.float64)
    if math.isinf(high):
        return low + np.exp(y)
    return low + (high - low) * (np.tanh(y) + 1) / 2


def percentile(
    estimate: float | None,
    resampled: Floats,
    *,
    level: float = LEVEL,
    df: int | None = None,
    bounds: Bounds | None = None,
) -> Interval:
    """Percentile interval of `resampled` (NaN resamples, where the statistic is undefined, left out),
    each side's distance from the estimate widened by `small_sample(df)` when `df` is given; with `bounds`,
    widened on their unbounded scale, so the interval stays inside them."""
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
    if bounds is None:
        return Interval(
            estimate=float(estimate),
            low=float(estimate - widen * (estimate - low)),
            high=float(estimate + widen * (high - estimate)),
        )
    centre = float(to_scale(estimate, bounds))
    ends = []
    for q in (float(low), float(high)):
        scaled = float(to_scale(q, bounds))
        if q == estimate or not math.isfinite(centre):
            # No spread on this side, or the estimate sits at a bound: the percentile itself (no widening).
            ends.append(q)
            continue
        ends.append(float(from_scale(centre + widen * (scaled - centre), bounds)))
    return Interval(estimate=float(estimate), low=ends[0], high=ends[1])


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


def diff_band(
    a: Floats,
    b: Floats,
    *,
    counts: tuple[Floats, Floats],
    level: float = LEVEL,
    one_sided: str | None = None,
    df: int | None = None,
    same: bool = False,
) -> Band:
    """The simultaneous band of the differences `b - a` of two proportions over a family (columns; rows:
    the bootstrap resamples, row 0 the data), inside +-1 by construction.

    The critical value is the max-|t| band's (`max_t_band` of the differences). Each member's bounds are
    then Newcombe's hybrid score interval at that critical value: Wilson's interval of each side at the
    effective sample size its bootstrap variance implies (p(1 - p) / variance, so clustering counts;
    `counts`, the answers behind each side, where it does not vary), combined with the two sides'
    bootstrap correlation (paired trials narrow it). Wilson's bounds lie in [0, 1], so the difference's
    lie in [-1, 1]. A member whose difference does not vary under resampling while its sides do (a curve
    compared with itself) has a band of zero width; so has every member with `same` (the two sides are
    the same answers). `one_sided="upper"`: upper bounds only."""
    d = b - a
    raw = max_t_band(d[0], d[1:], level=level, one_sided=one_sided, clip=None, df=df)
    return _newcombe(a, b, counts=counts, z=raw.critical, raw=raw, one_sided=one_sided, same=same)


def diff_interval(
    a: Floats,
    b: Floats,
    *,
    counts: tuple[Floats, Floats],
    level: float = LEVEL,
    df: int | None = None,
    same: bool = False,
) -> Band:
    """Per member, the pointwise interval of `b - a` as `diff_band` builds it, at the normal critical
    value of `level` widened by `small_sample(df)`."""
    from scipy.special import ndtri

    d = b - a
    raw = max_t_band(d[0], d[1:], level=level, clip=None, df=df)
    z = small_sample(df, float(ndtri((1 + level) / 2)))
    return _newcombe(a, b, counts=counts, z=z, raw=raw, same=same)


def _newcombe(
    a: Floats,
    b: Floats,
    *,
    counts: tuple[Floats, Floats],
    z: float,
    raw: Band,
    one_sided: str | None = None,
    same: bool = False,
) -> Band:
    members = a.shape[1]
    low = np.full(members, np.nan)
    high = np.full(members, np.nan)
    for k in range(members):
        pa, pb = float(a[0, k]), float(b[0, k])
        if not (math.isfinite(pa) and math.isfinite(pb)):
            continue
        ra, rb = a[1:, k], b[1:, k]
        both = np.isfinite(ra) & np.isfinite(rb)
        va = float(np.var(ra[both], ddof=1)) if both.sum() > 1 else 0.0
        vb = float(np.var(rb[both], ddof=1)) if both.sum() > 1 else 0.0
        if raw.se[k] <= 1e-12 and (same or va > 1e-12 or vb > 1e-12):
            low[k] = high[k] = pb - pa  # the difference cannot move: the same answers on both sides
            continue
        sides = []
        for p, v, n in ((pa, va, float(counts[0][k])), (pb, vb, float(counts[1][k]))):
            effective = p * (1 - p) / v if v > 1e-12 and 0 < p < 1 else max(n, 1.0)
            found = wilson_interval(p * effective, effective, z=z)
            assert found.low is not None and found.high is not None
            sides.append((found.low, found.high))
        (la, ua), (lb, ub) = sides
        phi = 0.0
        if va > 1e-12 and vb > 1e-12:
            phi = float(np.corrcoef(ra[both], rb[both])[0, 1])
        down = (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2
        up = (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2
        low[k] = pb - pa - math.sqrt(max(down, 0.0))
        high[k] = pb - pa + math.sqrt(max(up, 0.0))
    if one_sided == "upper":
        low = np.full(members, -np.inf)
    return Band(low=low, high=high, critical=z, se=raw.se)


def contrast(resampled: Floats, *, df: int | None = None) -> Interval:
    """Last minus first position's accuracy, with its percentile interval (within +-1)."""
    values = resampled[:, -1] - resampled[:, 0]
    return percentile(float(values[0]), values[1:], df=df, bounds=DIFF)


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
    return percentile(float(values[0]), values[1:], df=data.clusters - 1, bounds=RATIO), note
