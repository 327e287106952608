"""Statistics of one curve: pure functions over per-trial answers, no database.

The rules every number follows (the README's "Statistics" says the same to users):

- An answer *parsed* when it has status `ok`; any other status is a parse failure and is never correct.
  `accuracy` is among parsed answers (the headline, on every axis and in verdicts), `parse_rate` is the
  share that parsed, `accuracy_strict` counts failures as wrong (the seed's scoring).
- Answers of one prompt are not independent, nor are the rotations of one sampled set. A *cluster* is a
  trial (random design) or a sampled set (rotation). Pointwise intervals are Wilson's with the design effect
  of the clusters; every other interval comes from a bootstrap that resamples whole clusters.
- Pooled jobs count each distinct trial once (`TrialData.pool`).

A curve has, per point, a pointwise interval and (on request) a simultaneous 95% band: the max-|t| band of
the cluster bootstrap, which holds at every point at once. Per curve: the last-minus-first contrast, the
last/first ratio (only where the first accuracy is bounded away from zero), the slope from a least-squares
fit of correctness on position with errors clustered and question difficulty adjusted (statsmodels), and a
permutation test of "no position effect at all". `benchmarks/coverage.py` checks every interval's coverage
by simulation with the fake engine's model of answers.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from posbias.schemas import Curve, CurvePoint, Interval, ParseStatus, PosbiasError, QuestionResult, Trial

Z95 = 1.959963984540054
LEVEL = 0.95
BOOTSTRAP_RESAMPLES = 2000
PERMUTATIONS = 999
RATIO_MIN_FIRST = 0.1
"""The ratio is given only when the first position's pointwise interval starts at or above this: below it
the ratio is unbounded in practice and its bootstrap is dominated by resamples near 0."""
_CHUNK = 200
"""Bootstrap resamples computed at a time (memory: chunk x clusters weights)."""

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


# --- the data -----------------------------------------------------------------------------------------


class TrialRow(NamedTuple):
    """One trial as the store has it (a SQL row can be passed as is)."""

    trial_id: int
    job_id: int
    iteration: int
    question_ids: Sequence[str]
    choice_orders: Sequence[Sequence[int]] | None
    rotation_design: bool
    """True when the trial's job used the rotation design: its sampled set is its cluster."""
    n_options: Sequence[int] | None = None
    """Options per position, when known (for the chance line)."""
    answer_order: Sequence[int] | None = None
    """Positions in the order asked; None for forward order."""
    probe: int | None = None
    """The probe design's asked position; None otherwise."""
    filler_tokens: int = 0
    """The prompt's filler length."""
    set_cluster: bool = False
    """True when its job showed each sampled set several times (a filler sweep): the set is its cluster."""


class ResultRow(NamedTuple):
    """One answer as the store has it."""

    trial_id: int
    position: int
    parsed: bool
    correct: bool
    gold_prob: float | None = None
    answer_slot: int | None = None
    token_distance: int | None = None


@dataclass(frozen=True)
class TrialData:
    """Every answer at one batch size, by trial (rows) and position (columns): what every analysis reads.

    `correct` and `parsed` are 0/1 with `answered` saying where a result exists (a skipped trial has none).
    """

    batch_size: int
    correct: Floats
    parsed: Floats
    answered: Floats
    cluster: Ints
    """Per trial, its cluster: 0..clusters-1."""
    keys: tuple[tuple[str, ...], ...]
    """Per trial, its content: question ids in prompt order (what matching and pooling compare)."""
    questions: Ints
    """Trials x positions: an integer code per question (the same question, the same code)."""
    gold_prob: Floats
    """Trials x positions: the gold option's probability; NaN where not recorded."""
    jobs: tuple[int, ...] = ()
    duplicates: int = 0
    """Trials left out of a pool because an earlier job had the same content."""
    cluster_unit: str = "trial"
    chance: float | None = None
    slot: Floats | None = None
    """Trials x positions: the answer's line in the output (the line the design asked it on, for a missing
    answer); NaN where there is no answer. None when not known (then slot = position)."""
    distance: Floats | None = None
    """Trials x positions: tokens from the question's end to its answer; NaN where not recorded."""
    filler: Floats | None = None
    """Per trial, its filler length in tokens (None: none anywhere)."""
    lines: Floats | None = None
    """Per trial, the answers it asks for: N, or 1 under the probe design (None: N)."""

    @property
    def trials(self) -> int:
        return int(self.correct.shape[0])

    @property
    def clusters(self) -> int:
        return int(self.cluster.max()) + 1 if self.cluster.size else 0

    @classmethod
    def from_arrays(
        cls,
        correct: npt.ArrayLike,
        *,
        parsed: npt.ArrayLike | None = None,
        cluster: npt.ArrayLike | None = None,
        questions: npt.ArrayLike | None = None,
        keys: Sequence[tuple[str, ...]] | None = None,
        chance: float | None = None,
        answered: npt.ArrayLike | None = None,
        slot: npt.ArrayLike | None = None,
        distance: npt.ArrayLike | None = None,
        filler: npt.ArrayLike | None = None,
        lines: npt.ArrayLike | None = None,
        cluster_unit: str = "trial",
    ) -> TrialData:
        """From a trials x positions array of correctness (simulations, tests). `parsed` defaults to all
        (`answered` to all); `correct` is zeroed where an answer did not parse; `cluster` defaults to one per
        trial; `slot`, `distance`, `filler` and `lines` as the fields are."""
        right = np.asarray(correct, dtype=np.float64)
        asked = np.ones_like(right) if answered is None else np.asarray(answered, dtype=np.float64)
        ok = asked.copy() if parsed is None else np.asarray(parsed, dtype=np.float64) * asked
        trials, n = right.shape
        codes = (
            np.asarray(questions, dtype=np.int64)
            if questions is not None
            else np.arange(trials * n, dtype=np.int64).reshape(trials, n)
        )

        def optional(values: npt.ArrayLike | None) -> Floats | None:
            return None if values is None else np.asarray(values, dtype=np.float64)

        return cls(
            batch_size=n,
            correct=right * ok,
            parsed=ok,
            answered=asked,
            cluster=_codes(np.asarray(cluster).tolist() if cluster is not None else range(trials)),
            keys=tuple(keys) if keys is not None else tuple((f"t{t}",) for t in range(trials)),
            questions=codes,
            gold_prob=np.full_like(right, np.nan),
            chance=chance,
            cluster_unit=cluster_unit,
            slot=optional(slot),
            distance=optional(distance),
            filler=optional(filler),
            lines=optional(lines),
        )

    @classmethod
    def from_rows(
        cls, trials: Iterable[TrialRow], results: Iterable[ResultRow], *, batch_size: int
    ) -> TrialData:
        """From store rows of one batch size, possibly of several jobs (see `pool` for how they combine)."""
        by_job: dict[int, list[TrialRow]] = {}
        for trial in trials:
            by_job.setdefault(trial.job_id, []).append(trial)
        answers: dict[int, list[ResultRow]] = {}
        for result in results:
            answers.setdefault(result.trial_id, []).append(result)
        return cls.pool([(job, rows, answers) for job, rows in sorted(by_job.items())], batch_size=batch_size)

    @classmethod
    def from_results(
        cls,
        trials: Sequence[Trial],
        results: Iterable[QuestionResult],
        *,
        rotation: bool = False,
        job_id: int = 0,
    ) -> TrialData:
        """From a worker's results (a `ShardResult`'s) and the trials they answer, without a store."""
        sweep = len({t.filler_tokens for t in trials}) > 1
        rows = [
            TrialRow(
                t.index,
                job_id,
                t.iteration,
                t.question_ids,
                t.choice_orders,
                rotation,
                answer_order=t.answer_order,
                probe=t.probe,
                filler_tokens=t.filler_tokens,
                set_cluster=sweep,
            )
            for t in trials
        ]
        answers = [
            ResultRow(
                r.trial_index,
                r.position,
                r.parse_status is ParseStatus.ok,
                r.correct,
                r.gold_prob,
                answer_slot=r.answer_slot,
                token_distance=r.token_distance,
            )
            for r in results
        ]
        n = trials[0].batch_size if trials else 0
        return cls.from_rows(rows, answers, batch_size=n)

    @classmethod
    def pool(
        cls,
        jobs: Sequence[tuple[int, Sequence[TrialRow], dict[int, list[ResultRow]]]],
        *,
        batch_size: int,
    ) -> TrialData:
        """The trials of several jobs, each distinct trial once: a trial whose questions, order, options and
        design (answer order, probe, filler length) an earlier job (by id) already showed adds no information
        (greedy decoding answers it the same way; sampling answers it with the same questions), so it is left
        out and counted in `duplicates`."""
        seen: set[tuple[object, ...]] = set()
        kept: list[tuple[TrialRow, list[ResultRow]]] = []
        duplicates = 0
        for _, rows, answers in jobs:
            for trial in sorted(rows, key=lambda t: t.trial_id):
                content = (
                    tuple(trial.question_ids),
                    None if trial.choice_orders is None else tuple(map(tuple, trial.choice_orders)),
                    None if trial.answer_order is None else tuple(trial.answer_order),
                    trial.probe,
                    trial.filler_tokens,
                )
                if content in seen:
                    duplicates += 1
                    continue
                seen.add(content)
                kept.append((trial, answers.get(trial.trial_id, [])))
        n = batch_size
        t = len(kept)
        correct = np.zeros((t, n))
        parsed = np.zeros((t, n))
        answered = np.zeros((t, n))
        gold = np.full((t, n), np.nan)
        slot = np.full((t, n), np.nan)
        distance = np.full((t, n), np.nan)
        filler = np.zeros(t)
        lines = np.full(t, float(n))
        vocabulary: dict[str, int] = {}
        questions = np.zeros((t, n), dtype=np.int64)
        clusters: list[tuple[int, int, int]] = []
        options: list[float] = []
        for row, (trial, results) in enumerate(kept):
            for column, qid in enumerate(trial.question_ids[:n]):
                questions[row, column] = vocabulary.setdefault(qid, len(vocabulary))
            asked = (
                (trial.probe,) if trial.probe is not None else tuple(trial.answer_order or range(1, n + 1))
            )
            intended = {position: index for index, position in enumerate(asked, start=1)}
            filler[row] = trial.filler_tokens
            lines[row] = len(asked)
            for r in results:
                c = r.position - 1
                answered[row, c] = 1.0
                parsed[row, c] = float(r.parsed)
                correct[row, c] = float(r.parsed and r.correct)
                if r.gold_prob is not None:
                    gold[row, c] = r.gold_prob
                line = r.answer_slot if r.answer_slot is not None else intended.get(r.position)
                if line is not None:
                    slot[row, c] = line
                if r.token_distance is not None:
                    distance[row, c] = r.token_distance
            clusters.append(
                (trial.job_id, trial.iteration, -1)
                if trial.rotation_design or trial.set_cluster
                else (trial.job_id, -1, trial.trial_id)
            )
            if trial.n_options:
                options.extend(1.0 / k for k in trial.n_options)
        rotation = any(trial.rotation_design or trial.set_cluster for trial, _ in kept)
        return cls(
            batch_size=n,
            correct=correct,
            parsed=parsed,
            answered=answered,
            cluster=_codes(clusters),
            keys=tuple(_key(trial) for trial, _ in kept),
            questions=questions,
            gold_prob=gold,
            jobs=tuple(job for job, _, _ in jobs),
            duplicates=duplicates,
            cluster_unit="sampled set" if rotation else "trial",
            chance=float(np.mean(options)) if options else None,
            slot=slot,
            distance=distance,
            filler=filler if filler.any() else None,
            lines=lines,
        )

    def subset(self, rows: npt.ArrayLike) -> TrialData:
        """The trials at `rows` (indices or a boolean mask), their clusters renumbered."""
        index = np.arange(self.trials)[np.asarray(rows)]

        def take(values: Floats | None) -> Floats | None:
            return None if values is None else values[index]

        return dataclasses.replace(
            self,
            correct=self.correct[index],
            parsed=self.parsed[index],
            answered=self.answered[index],
            cluster=_codes(self.cluster[index]),
            keys=tuple(self.keys[i] for i in index) if self.keys else (),
            questions=self.questions[index],
            gold_prob=self.gold_prob[index],
            slot=take(self.slot),
            distance=take(self.distance),
            filler=take(self.filler),
            lines=take(self.lines),
        )

    def filler_levels(self) -> list[int]:
        """The filler lengths of its trials, in order ([0] without filler)."""
        return [0] if self.filler is None else sorted({int(f) for f in self.filler})

    def cluster_sums(self) -> tuple[Floats, Floats, Floats]:
        """Per cluster and position: correct, parsed and answered counts (clusters x positions)."""
        return (
            _sum_by(self.cluster, self.correct),
            _sum_by(self.cluster, self.parsed),
            _sum_by(self.cluster, self.answered),
        )


def _key(trial: TrialRow) -> tuple[str, ...]:
    """What matching compares: the questions in order, and the filler length when there is filler (the
    lengths of one sampled set are different trials; its answer orders are not)."""
    ids = tuple(trial.question_ids)
    return ids if not trial.filler_tokens else (*ids, f"filler:{trial.filler_tokens}")


def _codes(values: Iterable[object]) -> Ints:
    """0..k-1 codes of `values` in order of first appearance."""
    index: dict[object, int] = {}
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    return np.array(
        [index.setdefault(v if not isinstance(v, list) else tuple(v), len(index)) for v in items],
        dtype=np.int64,
    )


def _sum_by(groups: Ints, values: Floats) -> Floats:
    out = np.zeros((int(groups.max()) + 1 if groups.size else 0, values.shape[1]))
    np.add.at(out, groups, values)
    return out


# --- points -------------------------------------------------------------------------------------------


def wilson_interval(k: float, n: float, *, z: float = Z95) -> Interval:
    """Proportion k/n with its Wilson score interval (n may be an effective, non-integer size); all None
    when n is 0."""
    if n <= 0:
        return Interval(estimate=None, low=None, high=None)
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(max(p * (1 - p), 0.0) / n + z * z / (4 * n * n)) / denominator
    return Interval(estimate=p, low=max(0.0, centre - half), high=min(1.0, centre + half))


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
    return Interval(estimate=p, low=interval.low, high=interval.high)


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


# --- the cluster bootstrap ----------------------------------------------------------------------------


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
    for chunk in _chunks(resamples + 1):
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


def _chunks(total: int) -> Iterator[int]:
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


# --- summaries of a curve -----------------------------------------------------------------------------


def contrast(resampled: Floats, *, df: int | None = None) -> Interval:
    """Last minus first position's accuracy, with its percentile interval."""
    values = resampled[:, -1] - resampled[:, 0]
    return percentile(float(values[0]), values[1:], df=df)


def least_squares_slopes(resampled: Floats) -> Floats:
    """Least-squares slope of each row's accuracy against positions 1..N (over positions with answers)."""
    positions = np.arange(1, resampled.shape[1] + 1, dtype=np.float64)
    have = np.isfinite(resampled)
    y = np.where(have, resampled, 0.0)
    x = np.where(have, positions, 0.0)
    count = have.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        x_mean = x.sum(axis=1) / count
        y_mean = y.sum(axis=1) / count
        dx = np.where(have, positions - x_mean[:, None], 0.0)
        slopes: Floats = (dx * (y - y_mean[:, None])).sum(axis=1) / (dx * dx).sum(axis=1)
    return slopes


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


def position_regression(data: TrialData) -> tuple[Interval, Interval] | None:
    """Correctness (parsed answers) on relative position, least squares with errors clustered by `data`'s
    clusters (statsmodels, t with clusters - 1 degrees of freedom), adjusted for question difficulty by a
    covariate: how much better than its positions' means the question did in its other answers (shrunk to 0,
    so a question seen once adds nothing). Returns (slope per position, first-to-last effect)."""
    import statsmodels.api as sm

    n = data.batch_size
    if n < 2 or data.clusters < 3:
        return None
    rows, cols = np.nonzero(data.parsed > 0)
    if rows.size < 3:
        return None
    y = data.correct[rows, cols]
    relative = cols / (n - 1)
    adjust = difficulty(data, rows, cols)
    columns = [np.ones_like(y), relative]
    # Under rotation each question is at every position of its set once: difficulty is balanced over
    # positions by design, and the covariate would add only its noise (wider intervals, by simulation).
    if data.cluster_unit == "trial" and np.ptp(adjust) > 0:
        columns.append(adjust)
    design = np.column_stack(columns)
    if np.ptp(relative) == 0:
        return None
    fit = sm.OLS(y, design).fit(cov_type="cluster", cov_kwds={"groups": data.cluster[rows]}, use_t=True)
    effect = float(fit.params[1])
    low, high = (float(v) for v in fit.conf_int(alpha=1 - LEVEL)[1])
    per = Interval(estimate=effect / (n - 1), low=low / (n - 1), high=high / (n - 1))
    return per, Interval(estimate=effect, low=low, high=high)


def difficulty(data: TrialData, rows: Ints, cols: Ints) -> Floats:
    """Per answer at (`rows`, `cols`), its question's difficulty as seen in the question's other answers,
    net of where those were: their residuals from the position means (so the covariate carries difficulty
    and not position: under rotation a question's other answers are at every other position, and their raw
    mean would move with this one's position), shrunk towards 0 (a question seen once adds nothing)."""
    n = data.batch_size
    y = data.correct[rows, cols]
    means = np.bincount(cols, weights=y, minlength=n) / np.maximum(np.bincount(cols, minlength=n), 1)
    residual = y - means[cols]
    codes = data.questions[rows, cols]
    s_q = np.bincount(codes, weights=residual)
    n_q = np.bincount(codes).astype(np.float64)
    prior = 2.0
    found: Floats = (s_q[codes] - residual) / (n_q[codes] - 1 + prior)
    return found


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
    for chunk in _chunks(permutations):
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


# --- curves -------------------------------------------------------------------------------------------


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
) -> Curve:
    """The curve by position of `data` (or, with `by="answer-slot"`, of `slot_view(data)`: its columns are
    then slots), with every summary (see the module's docstring)."""
    found = points(data)
    summaries: dict[str, Any] = {}  # Curve fields
    if data.trials and data.batch_size > 1:
        resampled = single(data, resamples=resamples, seed=seed).accuracy()
        found_contrast = contrast(resampled, df=data.clusters - 1)
        summaries["contrast"] = found_contrast if found_contrast.estimate is not None else None
        summaries["first_last_ratio"], summaries["ratio_note"] = ratio(data, resampled)
        fitted = position_regression(data)
        if fitted is not None:
            summaries["slope"], summaries["position_effect"] = fitted
        summaries["shape_p"] = shape_test(data, permutations=permutations, seed=seed)
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
        **summaries,
    )


# --- answer slots and filler lengths ------------------------------------------------------------------


def slot_view(data: TrialData) -> TrialData:
    """`data` with its columns rearranged by answer slot: column s - 1 holds, per trial, the answer given on
    line s (a missing answer on the line the design asked it on, unless another answer took that line).
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


class DistanceRow(NamedTuple):
    """One answer for a token-distance curve (a SQL row can be passed as is)."""

    trial_id: int
    batch_size: int
    token_distance: int | None
    parsed: bool
    correct: bool
    gold_prob: float | None = None


def distance_curve(
    rows: Iterable[DistanceRow],
    *,
    bin_width: int,
    clusters: dict[int, int],
    model: str,
    revision: str | None,
    job_ids: Sequence[int],
    batch_size: int,
    band: bool = True,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Curve:
    """Accuracy by distance in tokens from a question's end to its answer, in bins of `bin_width`: each
    point at its bin's centre, its interval clustered (one trial gives several answers to a bin). Answers
    with no distance (nothing parsed to place) are left out, so the parse rate here is among answers that
    have one. `clusters` maps each trial to its cluster (itself, or its sampled set)."""
    if bin_width < 1:
        raise PosbiasError(f"bin width must be a positive number of tokens (got {bin_width})")
    kept = [r for r in rows if r.token_distance is not None and r.batch_size == batch_size]
    starts = sorted({r.token_distance // bin_width * bin_width for r in kept})  # type: ignore[operator]
    column = {start: i for i, start in enumerate(starts)}
    trial_code = {t: i for i, t in enumerate(sorted({r.trial_id for r in kept}))}
    shape = (len(trial_code), len(starts))
    correct, parsed, answered = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    gold_sum, gold_n = np.zeros(shape), np.zeros(shape)
    for r in kept:
        i, j = trial_code[r.trial_id], column[r.token_distance // bin_width * bin_width]  # type: ignore[operator]
        answered[i, j] += 1
        parsed[i, j] += r.parsed
        correct[i, j] += r.parsed and r.correct
        if r.gold_prob is not None:
            gold_sum[i, j] += r.gold_prob
            gold_n[i, j] += 1
    with np.errstate(invalid="ignore", divide="ignore"):
        gold = np.where(gold_n > 0, gold_sum / np.where(gold_n > 0, gold_n, 1), np.nan)
    data = TrialData(
        batch_size=batch_size,
        correct=correct,
        parsed=parsed,
        answered=answered,
        cluster=_codes([clusters.get(t, t) for t in sorted(trial_code)]),
        keys=(),
        questions=np.zeros(shape, dtype=np.int64),
        gold_prob=gold,
        jobs=tuple(job_ids),
    )
    found = [
        p.model_copy(update={"batch_size": batch_size})
        for p in points(data, columns=starts, xs=[s + bin_width / 2 for s in starts])
    ]
    if band and kept and len(starts) > 1:
        resampled = single(data, resamples=resamples).accuracy()
        index = [column[p.position] for p in found]
        found = with_band(found, resampled, columns=index, df=data.clusters - 1)
    return Curve(
        model=model,
        revision=revision,
        job_ids=tuple(job_ids),
        batch_size=batch_size,
        by="token-distance",
        points=tuple(found),
        trials=len(trial_code),
        clusters=data.clusters,
    )
