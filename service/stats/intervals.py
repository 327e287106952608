"""Pointwise intervals: Wilson's score interval, the same at the effective sample size that the clusters'
design effect leaves, a curve's points, one per position with its interval, and a Wald interval kept
inside a known range by Fisher's z transform."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from posbias.schemas import CurvePoint, Interval
from posbias.service.stats.trial_data import Floats, TrialData

Z95 = 1.959963984540054
LEVEL = 0.95
"""The level of every interval and band posbias gives."""


def wilson_interval(k: float, n: float, *, z: float = Z95) -> Interval:
    """Proportion k/n with its Wilson score interval (n may be an effective, non-integer size); all None
    when n is 0."""
    if n <= 0:
        return Interval(estimate=None, low=None, high=None)
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denominator
    # The score interval always holds p; in floating point its ends can miss it by an ulp (at k = 0 the low
    # end came out 5.6e-17), and an interval that leaves out its own estimate breaks every error bar.
    return Interval(estimate=p, low=min(p, max(0.0, centre - half)), high=max(p, min(1.0, centre + half)))


def bounded_interval(estimate: float, half: float, *, bound: float) -> Interval:
    """A Wald interval `estimate` +- `half` for a quantity known to lie within [-bound, bound], made on
    Fisher's z scale instead: z = atanh(estimate / bound), its half-width by the delta method (half / (bound
    (1 - r^2))), carried back with tanh. It lies inside the range by construction, is nearly the Wald
    interval where that is narrow against the range, and tends to the whole range as the estimate nears a
    bound (the whole range where it is at or past one). Its coverage is checked in benchmarks/coverage.py
    and benchmarks/intervals.py (`explain`)."""
    r = estimate / bound
    if not math.isfinite(half) or abs(r) >= 1.0:
        return Interval(estimate=estimate, low=-bound, high=bound)
    z = math.atanh(r)
    spread = half / (bound * (1.0 - r * r))
    return Interval(estimate=estimate, low=bound * math.tanh(z - spread), high=bound * math.tanh(z + spread))


def clustered_interval(k: Floats, m: Floats, *, z: float = Z95) -> Interval:
    """Accuracy sum(k)/sum(m) over clusters with `k` correct of `m` answers each: Wilson's interval at the
    effective sample size sum(m) / design effect, the design effect being the clusters' variance of the
    ratio estimate over the binomial variance (never below 1). With one answer per cluster it is Wilson's
    interval."""
    total = float(m.sum())
    if total <= 0:
        return Interval(estimate=None, low=None, high=None)
    p = float(k.sum()) / total
    effective = total
    used = m > 0
    clusters = int(used.sum())
    if clusters > 1 and float(m.max()) > 1 and 0 < p < 1:
        residual = k[used] - p * m[used]
        clustered = clusters / (clusters - 1) * float((residual**2).sum()) / total**2
        effective = total / max(1.0, clustered / (p * (1 - p) / total))
    interval = wilson_interval(p * effective, effective, z=z)
    low, high = interval.low or 0.0, interval.high or 0.0  # never None: effective > 0
    return Interval(estimate=p, low=min(p, low), high=max(p, high))


def points(
    data: TrialData, *, columns: Sequence[int] | None = None, xs: Sequence[float] | None = None
) -> list[CurvePoint]:
    """One point per column (position) of `data` that has answers, with its pointwise interval."""
    k, m, a = data.cluster_sums()
    labels = list(columns) if columns is not None else list(range(1, data.batch_size + 1))
    where = list(xs) if xs is not None else [float(c) for c in labels]
    found = []
    for column, label in enumerate(labels):
        n = float(a[:, column].sum())
        if n == 0:
            continue
        parsed = float(m[:, column].sum())
        correct = float(k[:, column].sum())
        interval = clustered_interval(k[:, column], m[:, column])
        gold = data.gold_prob[:, column]
        recorded = gold[~np.isnan(gold)]
        found.append(
            CurvePoint(
                batch_size=data.batch_size,
                position=label,
                x=where[column],
                n=round(n),
                n_parsed=round(parsed),
                n_correct=round(correct),
                accuracy=interval.estimate,
                ci_low=interval.low,
                ci_high=interval.high,
                parse_rate=parsed / n,
                accuracy_strict=correct / n,
                mean_gold_prob=float(recorded.mean()) if recorded.size else None,
            )
        )
    return found
