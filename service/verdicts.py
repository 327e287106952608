"""Verdicts: judging a candidate job against a baseline job by a `RegressionRule`, per position (a Newcombe
interval on the accuracy difference) and per batch size (a bootstrap interval on the change in the last/first
ratio), with the intervals adjusted to hold together.

Reads finished jobs' results from the store and writes nothing; the scheduler decides which jobs to compare
and records the outcome.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from posbias.schemas import Interval
from posbias.schemas.schedule import BatchSizeVerdict, PositionDrop, RatioChange, RegressionRule, Verdict
from posbias.service import store
from posbias.service.analysis import CorrectnessMatrix, PositionCount, wilson_interval
from posbias.service.database import Database

MIN_ANSWERS = 20
"""Fewer answers than this at a position (in either job) leave the comparison inconclusive: a Wilson
interval at n < 20 is about +-20 points wide, too wide for a `pass` to mean anything."""
RATIO_RESAMPLES = 2000


@dataclass(frozen=True)
class Outcome:
    """A comparison of two finished jobs under a rule."""

    verdict: Verdict
    reason: str
    comparisons: int
    batch_sizes: list[BatchSizeVerdict]


def compare_jobs(db: Database, *, baseline_job: int, candidate_job: int, rule: RegressionRule) -> Outcome:
    """Judge `candidate_job` against `baseline_job` at every batch size they share.

    Per position, candidate minus baseline accuracy with a Newcombe interval built from Wilson intervals at
    a Bonferroni-adjusted z (over every position compared), so all positions' intervals hold together with
    probability `rule.confidence`; per batch size, the change in the last/first ratio's distance from 1
    with a cluster-bootstrap interval (Bonferroni over batch sizes). A check fires when the estimate is
    beyond its limit and its interval excludes zero.
    """
    base = _counts_by_size(store.curve_counts(db, job_id=baseline_job))
    cand = _counts_by_size(store.curve_counts(db, job_id=candidate_job))
    sizes = sorted(base.keys() & cand.keys())
    if not sizes:
        return Outcome(
            verdict=Verdict.inconclusive,
            reason=f"no batch size in common: baseline job {baseline_job} has {sorted(base)}, candidate "
            f"{sorted(cand)}",
            comparisons=0,
            batch_sizes=[],
        )
    thin = {n: _thin_positions(base[n], cand[n], batch_size=n) for n in sizes}
    compared = [n for n in sizes if not thin[n]]
    comparisons = sum(compared)
    alpha = 1 - rule.confidence
    z = NormalDist().inv_cdf(1 - alpha / (2 * comparisons)) if comparisons else 0.0
    ratio_sizes = [n for n in compared if n > 1] if rule.max_ratio_drop is not None else []
    verdicts = []
    for n in sizes:
        if thin[n]:
            listed = ", ".join(map(str, thin[n][:5])) + (" ..." if len(thin[n]) > 5 else "")
            verdicts.append(
                BatchSizeVerdict(
                    batch_size=n,
                    positions=0,
                    worst_drop=None,
                    drop_flagged=False,
                    note=f"fewer than {MIN_ANSWERS} answers at position {listed} in one of the jobs",
                )
            )
            continue
        drops = [_drop(base[n][p], cand[n][p], z=z, max_drop=rule.max_drop) for p in range(1, n + 1)]
        flagged = [d for d in drops if d.flagged]
        worst = min(flagged or drops, key=lambda d: d.diff)
        ratio, note = None, None
        if n in ratio_sizes:
            assert rule.max_ratio_drop is not None
            ratio = _ratio_change(
                db,
                baseline_job=baseline_job,
                candidate_job=candidate_job,
                batch_size=n,
                alpha=alpha / len(ratio_sizes),
                limit=rule.max_ratio_drop,
            )
            if ratio is None:
                note = "the last/first ratio is undefined (accuracy 0 at position 1 in one of the jobs)"
        verdicts.append(
            BatchSizeVerdict(
                batch_size=n,
                positions=n,
                worst_drop=worst,
                drop_flagged=bool(flagged),
                ratio=ratio,
                note=note,
            )
        )
    verdict, reason = _overall(verdicts, rule=rule)
    return Outcome(verdict=verdict, reason=reason, comparisons=comparisons, batch_sizes=verdicts)


def _overall(verdicts: Sequence[BatchSizeVerdict], *, rule: RegressionRule) -> tuple[Verdict, str]:
    fired = []
    for v in verdicts:
        if v.drop_flagged and v.worst_drop is not None:
            d = v.worst_drop
            fired.append(
                f"N={v.batch_size} position {d.position}: {_points(d.diff)} ({_points(d.ci_low)} to "
                f"{_points(d.ci_high)}), limit -{rule.max_drop:g} points"
            )
        if v.ratio is not None and v.ratio.flagged:
            r = v.ratio
            fired.append(
                f"N={v.batch_size} last/first ratio {_num(r.baseline.estimate)} -> "
                f"{_num(r.candidate.estimate)} (further from 1 by {_num(r.worsening.estimate)}, "
                f"interval from {_num(r.worsening.low)}), "
                f"limit {rule.max_ratio_drop:g}"
            )
    if fired:
        more = f" (and {len(fired) - 1} more)" if len(fired) > 1 else ""
        return Verdict.regression, f"{fired[0]}{more}"
    notes = [f"N={v.batch_size}: {v.note}" for v in verdicts if v.note]
    if notes:
        return Verdict.inconclusive, "; ".join(notes)
    if rule.max_ratio_drop is not None and not any(v.ratio for v in verdicts):
        return (
            Verdict.inconclusive,
            "no batch size above 1 in common: the last/first ratio cannot be compared",
        )
    drops = [v.worst_drop for v in verdicts if v.worst_drop is not None]
    worst = min(drops, key=lambda d: d.diff)
    size = next(v.batch_size for v in verdicts if v.worst_drop is worst)
    return (
        Verdict.passed,
        f"within the rule: largest drop {_points(worst.diff)} at N={size} position {worst.position} "
        f"({_points(worst.ci_low)} to {_points(worst.ci_high)})",
    )


def _points(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f} pts"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _counts_by_size(counts: Iterable[PositionCount]) -> dict[int, dict[int, PositionCount]]:
    by_size: dict[int, dict[int, PositionCount]] = {}
    for count in counts:
        by_size.setdefault(count.batch_size, {})[count.position] = count
    return by_size


def _thin_positions(
    base: dict[int, PositionCount], cand: dict[int, PositionCount], *, batch_size: int
) -> list[int]:
    def answers(counts: dict[int, PositionCount], position: int) -> int:
        count = counts.get(position)
        return count.n if count else 0

    return [p for p in range(1, batch_size + 1) if min(answers(base, p), answers(cand, p)) < MIN_ANSWERS]


def _drop(base: PositionCount, cand: PositionCount, *, z: float, max_drop: float | None) -> PositionDrop:
    """Newcombe's hybrid score interval (method 10) at `z` for candidate minus baseline."""
    wb = wilson_interval(base.n_correct, base.n, z=z)
    wc = wilson_interval(cand.n_correct, cand.n, z=z)
    assert wb.estimate is not None and wb.low is not None and wb.high is not None
    assert wc.estimate is not None and wc.low is not None and wc.high is not None
    diff = wc.estimate - wb.estimate
    low = diff - math.sqrt((wc.estimate - wc.low) ** 2 + (wb.high - wb.estimate) ** 2)
    high = diff + math.sqrt((wc.high - wc.estimate) ** 2 + (wb.estimate - wb.low) ** 2)
    return PositionDrop(
        position=base.position,
        accuracy_baseline=wb.estimate,
        accuracy_candidate=wc.estimate,
        n_baseline=base.n,
        n_candidate=cand.n,
        diff=diff,
        ci_low=low,
        ci_high=high,
        flagged=max_drop is not None and -diff > max_drop / 100 and high < 0,
    )


def _ratio_change(
    db: Database, *, baseline_job: int, candidate_job: int, batch_size: int, alpha: float, limit: float
) -> RatioChange | None:
    """The two ratios and how much further from 1 the candidate's is, bootstrapped over each job's trials
    (the jobs are independent samples, so each is resampled on its own). None when a ratio is undefined."""
    rb = _bootstrap_ratios(store.trial_matrix(db, job_ids=[baseline_job], batch_size=batch_size), seed=1)
    rc = _bootstrap_ratios(store.trial_matrix(db, job_ids=[candidate_job], batch_size=batch_size), seed=2)
    if not (np.isfinite(rb[0]) and np.isfinite(rc[0])):
        return None
    with np.errstate(invalid="ignore"):
        worse = np.abs(rc - 1) - np.abs(rb - 1)
    interval = _percentiles(worse, alpha=alpha)
    return RatioChange(
        baseline=_percentiles(rb, alpha=alpha),
        candidate=_percentiles(rc, alpha=alpha),
        worsening=interval,
        flagged=bool(worse[0] > limit and interval.low is not None and interval.low > 0),
    )


def _bootstrap_ratios(matrix: CorrectnessMatrix, *, seed: int) -> npt.NDArray[np.float64]:
    """Last/first accuracy ratio of the data (element 0) and of `RATIO_RESAMPLES` cluster resamples of
    its trials (as in `analysis.bootstrap_curve_stats`)."""
    values = np.nan_to_num(matrix.correct, nan=0.0)
    answered = (~np.isnan(matrix.correct)).astype(np.float64)
    trials = values.shape[0]
    if trials == 0:
        return np.full(RATIO_RESAMPLES + 1, np.nan)
    rng = np.random.default_rng(seed)
    weights = np.vstack(
        [np.ones(trials), rng.multinomial(trials, np.full(trials, 1.0 / trials), size=RATIO_RESAMPLES)]
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = (weights @ values) / (weights @ answered)
        ratios: npt.NDArray[np.float64] = accuracy[:, -1] / accuracy[:, 0]
    return ratios


def _percentiles(samples: npt.NDArray[np.float64], *, alpha: float) -> Interval:
    """Estimate (element 0) and the percentile interval of the rest; an infinite bound is None."""

    def finite(value: float) -> float | None:
        return float(value) if np.isfinite(value) else None

    rest = np.sort(samples[1:][~np.isnan(samples[1:])])
    if rest.size == 0:
        return Interval(estimate=finite(samples[0]), low=None, high=None)
    last = rest.size - 1
    return Interval(
        estimate=finite(samples[0]),
        low=finite(rest[math.floor(alpha / 2 * last)]),
        high=finite(rest[math.ceil((1 - alpha / 2) * last)]),
    )
