"""Statistics of position curves: pure functions over plain data, no database.

Per point: n, accuracy and a Wilson 95% interval. The questions of one prompt are not independent (one
prompt, one model state), so the summaries of a whole curve, its slope and its first/last ratio, come from a
cluster bootstrap that resamples whole trials. Two curves compare position by position with Newcombe's
hybrid score interval for a difference of proportions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from posbias.schemas import (
    Comparison,
    Curve,
    CurvePoint,
    DiffPoint,
    Interval,
    ParseStatus,
    PosbiasError,
    QuestionResult,
)

Z95 = 1.959963984540054
BOOTSTRAP_RESAMPLES = 2000


@dataclass(frozen=True)
class PositionCount:
    """The counts behind one curve point: what the store aggregates per (job, batch size, position)."""

    batch_size: int
    position: int
    """1-based position, or the start of a token-distance bin."""
    n: int
    n_correct: int
    n_parsed: int
    gold_prob_sum: float = 0.0
    """Sum of the gold option's probability over the answers that recorded one."""
    n_gold_prob: int = 0
    """How many answers recorded a gold probability."""


@dataclass(frozen=True)
class CorrectnessMatrix:
    """Per-trial correctness at one batch size: row t, column p-1 is trial t's answer at position p."""

    batch_size: int
    correct: npt.NDArray[np.float64]
    """Trials x positions; 1.0 correct, 0.0 wrong (a failed parse is wrong), NaN for no result."""

    def __post_init__(self) -> None:
        if self.correct.ndim != 2 or self.correct.shape[1] != self.batch_size:
            raise ValueError(f"expected a trials x {self.batch_size} matrix, got shape {self.correct.shape}")

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, int, bool]], *, batch_size: int) -> CorrectnessMatrix:
        """From (trial index, position, correct) rows, e.g. a SQL query; a missing cell is NaN."""
        trial_of: dict[int, int] = {}
        cells: list[tuple[int, int, float]] = []
        for trial, position, correct in rows:
            row = trial_of.setdefault(trial, len(trial_of))
            cells.append((row, position - 1, float(correct)))
        matrix = np.full((len(trial_of), batch_size), np.nan)
        if cells:
            at = np.array(cells)
            matrix[at[:, 0].astype(np.int64), at[:, 1].astype(np.int64)] = at[:, 2]
        return cls(batch_size=batch_size, correct=matrix)

    @classmethod
    def from_results(cls, results: Iterable[QuestionResult], *, batch_size: int) -> CorrectnessMatrix:
        """From the results of trials of one batch size."""
        return cls.from_rows(((r.trial_index, r.position, r.correct) for r in results), batch_size=batch_size)


@dataclass(frozen=True)
class CurveStats:
    """The bootstrapped summaries of one curve."""

    first_last_ratio: Interval
    """Accuracy at the last position over the first. Estimate None when the first is 0; a bound None when
    resamples reach a first-position accuracy of 0 (unbounded)."""
    slope: Interval
    """Least-squares change in accuracy per position."""


class DistanceRow(NamedTuple):
    """One result for a token-distance curve (a SQL row can be passed as is)."""

    batch_size: int
    token_distance: int | None
    correct: bool
    parsed: bool
    gold_prob: float | None = None


def wilson_interval(k: int, n: int, *, z: float = Z95) -> Interval:
    """Proportion k/n with its Wilson score interval; all None when n is 0."""
    if n == 0:
        return Interval(estimate=None, low=None, high=None)
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(estimate=p, low=max(0.0, centre - half), high=min(1.0, centre + half))


def count_positions(results: Iterable[QuestionResult], *, batch_size: int) -> list[PositionCount]:
    """Per-position counts of the results of trials of one batch size (what the store aggregates)."""
    totals: dict[int, list[float]] = {}
    for result in results:
        total = totals.setdefault(result.position, [0, 0, 0, 0.0, 0])
        total[0] += 1
        total[1] += result.correct
        total[2] += result.parse_status is ParseStatus.ok
        if result.gold_prob is not None:
            total[3] += result.gold_prob
            total[4] += 1
    return [
        PositionCount(batch_size, position, int(t[0]), int(t[1]), int(t[2]), float(t[3]), int(t[4]))
        for position, t in sorted(totals.items())
    ]


def curve_points(counts: Iterable[PositionCount]) -> list[CurvePoint]:
    """One point per count, ordered by batch size and position, with Wilson intervals."""
    points = []
    for count in sorted(counts, key=lambda c: (c.batch_size, c.position)):
        interval = wilson_interval(count.n_correct, count.n)
        points.append(
            CurvePoint(
                batch_size=count.batch_size,
                position=count.position,
                n=count.n,
                n_correct=count.n_correct,
                n_parsed=count.n_parsed,
                accuracy=interval.estimate,
                ci_low=interval.low,
                ci_high=interval.high,
                parse_rate=count.n_parsed / count.n if count.n else None,
                mean_gold_prob=count.gold_prob_sum / count.n_gold_prob if count.n_gold_prob else None,
            )
        )
    return points


def bootstrap_curve_stats(
    matrix: CorrectnessMatrix, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0
) -> CurveStats:
    """First/last ratio and slope with percentile intervals from a cluster bootstrap over trials.

    Each resample draws as many trials as there are, with replacement, and keeps each trial's answers
    together. Resamples are trial weights (multinomial counts), so a resample costs one matrix product.
    """
    values = np.nan_to_num(matrix.correct, nan=0.0)
    answered = (~np.isnan(matrix.correct)).astype(np.float64)
    n_trials = values.shape[0]
    empty = CurveStats(
        first_last_ratio=Interval(estimate=None, low=None, high=None),
        slope=Interval(estimate=None, low=None, high=None),
    )
    if n_trials == 0:
        return empty
    rng = np.random.default_rng(seed)
    weights = np.vstack(
        [np.ones(n_trials), rng.multinomial(n_trials, np.full(n_trials, 1.0 / n_trials), size=resamples)]
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = (weights @ values) / (weights @ answered)  # row 0 is the data itself
        slopes = _slopes(accuracy)
        ratios = accuracy[:, -1] / accuracy[:, 0]
    if matrix.batch_size < 2:
        return empty
    return CurveStats(
        first_last_ratio=_percentile_interval(ratios[0], ratios[1:]),
        slope=_percentile_interval(slopes[0], slopes[1:]),
    )


def build_curve(
    counts: Iterable[PositionCount],
    *,
    model: str,
    revision: str | None = None,
    job_ids: Sequence[int],
    batch_size: int,
    matrix: CorrectnessMatrix | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Curve:
    """The curve at `batch_size` from per-position counts, with bootstrapped ratio and slope when the
    per-trial `matrix` is given."""
    points = [p for p in curve_points(counts) if p.batch_size == batch_size]
    stats = bootstrap_curve_stats(matrix, resamples=resamples, seed=seed) if matrix is not None else None
    return Curve(
        model=model,
        revision=revision,
        job_ids=tuple(job_ids),
        batch_size=batch_size,
        points=tuple(points),
        first_last_ratio=stats.first_last_ratio if stats else None,
        slope=stats.slope if stats else None,
    )


def token_distance_points(rows: Iterable[DistanceRow], *, bin_width: int) -> list[CurvePoint]:
    """Accuracy by distance in tokens from question to answer, in bins of `bin_width` tokens.

    A point's `position` is its bin's first distance. Rows without a distance (skipped or unparsed answers)
    are left out.
    """
    if bin_width < 1:
        raise PosbiasError(f"bin width must be a positive number of tokens (got {bin_width})")
    kept = [DistanceRow(*row) for row in rows if row[1] is not None]
    if not kept:
        return []
    batch = np.array([row.batch_size for row in kept], dtype=np.int64)
    start = np.array([row.token_distance for row in kept], dtype=np.int64) // bin_width * bin_width
    correct = np.array([row.correct for row in kept], dtype=np.int64)
    parsed = np.array([row.parsed for row in kept], dtype=np.int64)
    has_prob = np.array([row.gold_prob is not None for row in kept], dtype=np.int64)
    prob = np.array([row.gold_prob or 0.0 for row in kept], dtype=np.float64)

    keys, group = np.unique(np.stack([batch, start], axis=1), axis=0, return_inverse=True)
    group = group.reshape(-1)
    sizes = len(keys)
    counts = [
        PositionCount(
            batch_size=int(key[0]),
            position=int(key[1]),
            n=int(n),
            n_correct=int(k),
            n_parsed=int(m),
            gold_prob_sum=float(s),
            n_gold_prob=int(g),
        )
        for key, n, k, m, s, g in zip(
            keys,
            np.bincount(group, minlength=sizes),
            np.bincount(group, weights=correct, minlength=sizes),
            np.bincount(group, weights=parsed, minlength=sizes),
            np.bincount(group, weights=prob, minlength=sizes),
            np.bincount(group, weights=has_prob, minlength=sizes),
            strict=True,
        )
    ]
    return curve_points(counts)


def compare_curves(a: Curve, b: Curve, *, labels: tuple[str, str]) -> Comparison:
    """B minus A at every position either curve has, with Newcombe's hybrid score 95% interval (method 10
    of Newcombe 1998, built from the two Wilson intervals), plus each curve's first/last ratio."""
    if a.batch_size != b.batch_size:
        raise PosbiasError(
            f"cannot compare curves at different batch sizes ({a.batch_size} and {b.batch_size}); "
            "pick one batch size for both"
        )
    points_a = {p.position: p for p in a.points}
    points_b = {p.position: p for p in b.points}
    diffs = []
    for position in sorted(points_a.keys() | points_b.keys()):
        pa, pb = points_a.get(position), points_b.get(position)
        acc_a = pa.accuracy if pa else None
        acc_b = pb.accuracy if pb else None
        diff = low = high = None
        if pa and pb and acc_a is not None and acc_b is not None:
            wa = wilson_interval(pa.n_correct, pa.n)
            wb = wilson_interval(pb.n_correct, pb.n)
            assert wa.low is not None and wa.high is not None and wb.low is not None and wb.high is not None
            diff = acc_b - acc_a
            low = diff - math.sqrt((acc_b - wb.low) ** 2 + (wa.high - acc_a) ** 2)
            high = diff + math.sqrt((wb.high - acc_b) ** 2 + (acc_a - wa.low) ** 2)
        diffs.append(
            DiffPoint(
                position=position, accuracy_a=acc_a, accuracy_b=acc_b, diff=diff, ci_low=low, ci_high=high
            )
        )
    return Comparison(
        a=labels[0],
        b=labels[1],
        batch_size=a.batch_size,
        points=tuple(diffs),
        ratio_a=a.first_last_ratio,
        ratio_b=b.first_last_ratio,
    )


def _slopes(accuracy: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Least-squares slope of each row against positions 1..N, over the positions that have answers."""
    positions = np.arange(1, accuracy.shape[1] + 1, dtype=np.float64)
    have = ~np.isnan(accuracy)
    y = np.where(have, accuracy, 0.0)
    x = np.where(have, positions, 0.0)
    count = have.sum(axis=1)
    x_mean = x.sum(axis=1) / count
    y_mean = y.sum(axis=1) / count
    dx = np.where(have, positions - x_mean[:, None], 0.0)
    result: npt.NDArray[np.float64] = (dx * (y - y_mean[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
    return result


def _percentile_interval(estimate: float, resampled: npt.NDArray[np.float64]) -> Interval:
    """Percentile interval; NaN resamples (0/0) are dropped, infinite bounds become None (unbounded)."""
    finite_or_inf = np.sort(resampled[~np.isnan(resampled)])
    if finite_or_inf.size == 0:
        return Interval(estimate=_finite(estimate), low=None, high=None)
    last = finite_or_inf.size - 1
    low = finite_or_inf[math.floor(0.025 * last)]
    high = finite_or_inf[math.ceil(0.975 * last)]
    return Interval(estimate=_finite(estimate), low=_finite(low), high=_finite(high))


def _finite(value: float | np.floating) -> float | None:
    return float(value) if np.isfinite(value) else None
