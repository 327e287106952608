"""Building a position curve from `TrialData`: accuracy by position (or by answer slot), by filler length or
by token distance, with every interval and summary. Pure functions, no database (`service/reports/curves.py`
reads the store and calls these).

A curve has, per point, a pointwise interval (`service/stats/intervals.py`) and (on request) a simultaneous
95% band: the max-|t| band of the cluster bootstrap (`service/stats/bootstrap.py`), which holds at every point
at once. Per curve: the last-minus-first contrast, the last/first ratio (only where the first accuracy is
bounded away from zero), the slope from a least-squares fit of correctness on position with errors clustered
and question difficulty adjusted (`service/stats/regression.py`), and a permutation test of "no position
effect at all" (`service/stats/shape_test.py`). `benchmarks/coverage.py` checks every interval's coverage by
simulation with the fake engine's model of answers. The store's `position_curve` view is the plain-SQL
counterpart for analysts: accuracy by position with pointwise, unclustered Wilson intervals.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from posbias.schemas import Curve, CurvePoint, Interval, PosbiasError
from posbias.service.stats.bootstrap import (
    BOOTSTRAP_RESAMPLES,
    Resampled,
    contrast,
    max_t_band,
    ratio,
    single,
    too_few_clusters,
)
from posbias.service.stats.intervals import Z95, points, wilson_interval
from posbias.service.stats.regression import position_regression
from posbias.service.stats.shape_test import PERMUTATIONS, shape_test
from posbias.service.stats.shape_test import method as shape_method
from posbias.service.stats.trial_columns import DistanceColumns
from posbias.service.stats.trial_data import DistanceRow, Floats, TrialData, cluster_codes


class Draws(Protocol):
    """How a curve's clusters are resampled: `bootstrap.single` (the default), or draws a caller shares
    between curves of as many clusters (`service/reports/report_views.py`), which must give the same sums
    as `single` with the same `resamples` and `seed`."""

    def __call__(self, data: TrialData, *, resamples: int, seed: int) -> Resampled: ...


def build_curve(
    data: TrialData,
    *,
    model: str,
    revision: str | None = None,
    band: bool = True,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
    seed: int = 0,
    by: str = "position",
    filler_tokens: int | None = None,
    draws: Draws = single,
) -> Curve:
    """The curve by position of `data` (or, with `by="answer-slot"`, of `slot_view(data)`: its columns are
    then slots), with every summary (see the module's docstring). `draws` resamples its clusters (see
    `Draws`)."""
    found = points(data)
    summaries: dict[str, Any] = {}  # Curve fields
    if data.trials and data.batch_size > 1:
        resampled = draws(data, resamples=resamples, seed=seed).accuracy()
        found_contrast = contrast(resampled, df=data.clusters - 1)
        summaries["contrast"] = found_contrast if found_contrast.estimate is not None else None
        summaries["first_last_ratio"], summaries["ratio_note"] = ratio(data, resampled)
        fitted = position_regression(data)
        bounded = within_one(*fitted, batch_size=data.batch_size) if fitted is not None else None
        if bounded is not None:
            summaries["slope"], summaries["position_effect"] = bounded
        summaries["shape_p"] = shape_test(data, permutations=permutations, seed=seed)
        summaries["shape_method"] = shape_method(data)
        if band:
            found = with_band(found, resampled, df=data.clusters - 1)
    return Curve(
        model=model,
        revision=revision,
        job_ids=data.jobs,
        batch_size=data.batch_size,
        by=by,
        filler_tokens=filler_tokens,
        points=tuple(found),
        trials=data.trials,
        clusters=data.clusters,
        cluster_unit=data.cluster_unit,
        duplicate_trials=data.duplicates,
        chance=data.chance,
        note=too_few_clusters(data.clusters, unit=data.cluster_unit) if data.trials else None,
        **summaries,
    )


def within_one(per: Interval, whole: Interval, *, batch_size: int) -> tuple[Interval, Interval] | None:
    """The regression's first-to-last effect (`whole`) and slope (`per`) with the interval taken on the
    atanh scale (the delta method, at the fit's own critical value) and mapped back, so it stays within
    +-1 (100 points) by construction; None when the linear fit's estimate itself is not inside +-1 (a
    linear probability model can overshoot: a step of 100 points in the middle fits as a line of 150)."""
    e, low, high = whole.estimate, whole.low, whole.high
    if e is None or low is None or high is None or not abs(e) < 1:
        return None
    centre = math.atanh(e)
    spread = (high - low) / 2 / (1 - e * e)
    lo, hi = math.tanh(centre - spread), math.tanh(centre + spread)
    steps = batch_size - 1
    return (
        Interval(estimate=per.estimate, low=lo / steps, high=hi / steps),
        Interval(estimate=e, low=lo, high=hi),
    )


# --- answer slots and filler lengths ------------------------------------------------------------------


def slot_view(data: TrialData) -> TrialData:
    """`data` with its columns rearranged by answer slot: column s - 1 holds, per trial, the answer given on
    line s (a missing answer on the line the design asked it on, or, when another answer took that line,
    on the first line no answer took: so every answer is counted once, as `n` counts it on every axis).
    Forward order leaves it as it is; under the probe design everything is in slot 1."""
    if data.slot is None:
        return data
    shape = data.correct.shape
    moved = [np.zeros(shape) for _ in range(3)]
    gold = np.full(shape, np.nan)
    questions = np.zeros(shape, dtype=np.int64)
    distance = np.full(shape, np.nan)
    rows, cols = np.nonzero(data.answered > 0)
    slots = data.slot[rows, cols]
    # Answers that have a line first, so a missing answer never displaces one that was given.
    placed = sorted(range(rows.size), key=lambda i: (data.parsed[rows[i], cols[i]] == 0, i))
    taken = np.zeros(shape, dtype=bool)
    displaced = []
    for i in placed:
        r, c, s = rows[i], cols[i], slots[i]
        if not np.isfinite(s) or not 1 <= s <= shape[1] or taken[r, int(s) - 1]:
            displaced.append(i)
            continue
        taken[r, int(s) - 1] = True
    for i in displaced:  # failed answers whose line another took: the first free line of their trial
        free = np.flatnonzero(~taken[rows[i]])
        if free.size and data.parsed[rows[i], cols[i]] == 0:
            taken[rows[i], free[0]] = True
            slots[i] = free[0] + 1.0
    taken[:] = False
    for i in placed:
        r, c, s = rows[i], cols[i], slots[i]
        if not np.isfinite(s) or not 1 <= s <= shape[1] or taken[r, int(s) - 1]:
            continue
        target = int(s) - 1
        taken[r, target] = True
        for out, values in zip(moved, (data.correct, data.parsed, data.answered), strict=True):
            out[r, target] = values[r, c]
        gold[r, target] = data.gold_prob[r, c]
        questions[r, target] = data.questions[r, c]
        if data.distance is not None:
            distance[r, target] = data.distance[r, c]
    return dataclasses.replace(
        data,
        correct=moved[0],
        parsed=moved[1],
        answered=moved[2],
        gold_prob=gold,
        questions=questions,
        slot=np.where(taken, np.arange(1, shape[1] + 1, dtype=np.float64), np.nan),
        distance=distance,
    )


def filler_curve(
    data: TrialData,
    *,
    model: str,
    revision: str | None = None,
    band: bool = True,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Curve:
    """Accuracy by filler length (every position pooled): one point per length, its interval clustered
    (a trial gives all its answers to its length, and a sampled set its answers to every length), the band
    over lengths, and the contrast of the longest minus the shortest."""
    levels = data.filler_levels()
    filler = data.filler if data.filler is not None else np.zeros(data.trials)
    column = np.searchsorted(levels, filler).astype(np.int64)
    shape = (data.trials, len(levels))
    sums = [np.zeros(shape) for _ in range(3)]
    for out, values in zip(sums, (data.correct, data.parsed, data.answered), strict=True):
        out[np.arange(data.trials), column] = values.sum(axis=1)
    gold = np.full(shape, np.nan)
    with np.errstate(invalid="ignore"):
        gold[np.arange(data.trials), column] = np.nanmean(
            np.where(data.answered > 0, data.gold_prob, np.nan), axis=1
        )
    pooled = dataclasses.replace(
        data,
        batch_size=data.batch_size,
        correct=sums[0],
        parsed=sums[1],
        answered=sums[2],
        gold_prob=gold,
        questions=np.zeros(shape, dtype=np.int64),
        slot=None,
        distance=None,
    )
    found = [p.model_copy(update={"batch_size": data.batch_size}) for p in points(pooled, columns=levels)]
    summaries: dict[str, Any] = {}
    if band and len(levels) > 1 and data.trials:
        resampled = single(pooled, resamples=resamples).accuracy()
        summaries["contrast"] = contrast(resampled, df=data.clusters - 1)
        found = with_band(
            found, resampled, columns=[levels.index(p.position) for p in found], df=data.clusters - 1
        )
    return Curve(
        model=model,
        revision=revision,
        job_ids=data.jobs,
        batch_size=data.batch_size,
        by="filler-length",
        points=tuple(found),
        trials=data.trials,
        clusters=data.clusters,
        cluster_unit=data.cluster_unit,
        duplicate_trials=data.duplicates,
        chance=data.chance,
        note=too_few_clusters(data.clusters, unit=data.cluster_unit) if data.trials else None,
        **summaries,
    )


def with_band(
    found: Sequence[CurvePoint],
    resampled: Floats,
    *,
    columns: Sequence[int] | None = None,
    df: int | None = None,
) -> list[CurvePoint]:
    """`found` with the simultaneous 95% band of its accuracies (`resampled`: the cluster bootstrap, row 0
    the data; `columns`: each point's column in it).

    The common critical value c is the max-|t| quantile of the bootstrap; each point's band is then
    Wilson's interval at z = c and at the effective sample size the bootstrap variance implies
    (p(1 - p) / variance, so clustering is accounted for). Wilson's shape rather than estimate +- c x SE:
    at the z of a simultaneous band (about 3.3 for 50 positions) the symmetric interval misses on the long
    side of a skewed proportion (coverage 0.91 by simulation, against 0.95; benchmarks/coverage.py).
    """
    index = list(columns) if columns is not None else [p.position - 1 for p in found]
    estimate = resampled[0, index]
    band = max_t_band(estimate, resampled[1:, index], df=df)
    updated = []
    for i, p in enumerate(found):
        if p.accuracy is None:
            updated.append(p)
            continue
        se = float(band.se[i])
        variance = p.accuracy * (1 - p.accuracy)
        effective = variance / se**2 if se > 0 and variance > 0 else float(p.n_parsed)
        wilson = wilson_interval(p.accuracy * effective, effective, z=max(band.critical, Z95))
        updated.append(p.model_copy(update={"band_low": wilson.low, "band_high": wilson.high}))
    return updated


# --- token distance -----------------------------------------------------------------------------------


def distance_curve(
    rows: Iterable[DistanceRow] | DistanceColumns,
    *,
    bin_width: int,
    clusters: dict[int, int],
    model: str,
    revision: str | None,
    job_ids: Sequence[int],
    batch_size: int,
    band: bool = True,
    resamples: int = BOOTSTRAP_RESAMPLES,
    by: str = "token-distance",
    draws: Draws = single,
) -> Curve:
    """Accuracy by distance in tokens from a question's end to its answer, in bins of `bin_width`: each
    point at its bin's centre, its interval clustered (one trial gives several answers to a bin). Answers
    with no distance (nothing parsed to place) are left out, so the parse rate here is among answers that
    have one. `clusters` maps each trial to its cluster (itself, or its sampled set). `draws` resamples
    its clusters (see `Draws`)."""
    if bin_width < 1:
        raise PosbiasError(f"bin width must be a positive number of tokens (got {bin_width})")
    answers = rows if isinstance(rows, DistanceColumns) else DistanceColumns.from_rows(rows)
    keep = ~np.isnan(answers.token_distance) & (answers.batch_size == batch_size)
    start = (answers.token_distance[keep] // bin_width * bin_width).astype(np.int64)
    starts = np.unique(start).tolist()
    j = np.searchsorted(starts, start)
    trial_ids, i = np.unique(answers.trial_id[keep], return_inverse=True)
    shape = (trial_ids.size, len(starts))
    ok = answers.parsed[keep]
    cell = i * shape[1] + j  # each answer's (trial, bin), flat

    def summed(where: Any, weights: Any = None) -> Floats:
        # bincount adds in the answers' order, as np.add.at does, at a tenth of its time (a million answers)
        chosen = cell if where is None else cell[where]
        found: Floats = np.bincount(chosen, weights=weights, minlength=shape[0] * shape[1]).astype(np.float64)
        return found.reshape(shape)

    answered = summed(None)
    parsed = summed(None, ok.astype(np.float64))
    correct = summed(None, (ok & answers.correct[keep]).astype(np.float64))
    gold = answers.gold_prob[keep]
    recorded = ~np.isnan(gold)
    gold_sum, gold_n = summed(recorded, gold[recorded]), summed(recorded)
    column = {s: index for index, s in enumerate(starts)}
    trial_code = trial_ids.tolist()
    with np.errstate(invalid="ignore", divide="ignore"):
        gold = np.where(gold_n > 0, gold_sum / np.where(gold_n > 0, gold_n, 1), np.nan)
    data = TrialData(
        batch_size=batch_size,
        correct=correct,
        parsed=parsed,
        answered=answered,
        cluster=cluster_codes([clusters.get(t, t) for t in trial_code]),
        keys=(),
        questions=np.zeros(shape, dtype=np.int64),
        gold_prob=gold,
        jobs=tuple(job_ids),
    )
    found = [
        p.model_copy(update={"batch_size": batch_size})
        for p in points(data, columns=starts, xs=[s + bin_width / 2 for s in starts])
    ]
    if band and bool(keep.any()) and len(starts) > 1:
        resampled = draws(data, resamples=resamples, seed=0).accuracy()
        index = [column[p.position] for p in found]
        found = with_band(found, resampled, columns=index, df=data.clusters - 1)
    return Curve(
        model=model,
        revision=revision,
        job_ids=tuple(job_ids),
        batch_size=batch_size,
        by=by,
        points=tuple(found),
        trials=len(trial_code),
        clusters=data.clusters,
        note=too_few_clusters(data.clusters) if keep.any() else None,
    )
