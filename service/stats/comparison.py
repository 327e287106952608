"""Comparing two curves at one batch size: paired where their trials match, unpaired where they do not.

Two trials *match* when they show the same questions at the same positions (same seed, same pool: what
a schedule's checkpoints and a job's variants share). Matched trials are resampled together, so what the
two curves have in common (question difficulty, the prompt) cancels out of their difference; trials without
a match are resampled on their own side. Both kinds go into one stratified cluster bootstrap, and the
comparison says which method it used and how many trials matched. A job compared with itself has every
trial matched to itself and differences of exactly zero with intervals of zero width.

Per position: the difference with a pointwise percentile interval, a simultaneous 95% band (max-|t| over
positions), `different` only where the band excludes zero, and, for matched trials, the exact McNemar test.
`service/schedules/verdicts.py` asks the one-sided questions of regression runs of the same machinery.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import Comparison, DiffPoint, Interval, PosbiasError
from posbias.schemas.curve import BlockDiff
from posbias.service.stats.bootstrap import (
    BOOTSTRAP_RESAMPLES,
    DIFF_OF_DIFFS,
    Resampled,
    bootstrap,
    contrast,
    diff_band,
    diff_interval,
    max_t_band,
    percentile,
    too_few_clusters,
)
from posbias.service.stats.intervals import LEVEL
from posbias.service.stats.regression import least_squares_slopes
from posbias.service.stats.trial_data import Floats, Ints, TrialData

MIN_ANSWERS = 20
"""A block of positions is compared for accuracy only where each of its positions has at least this many
parsed answers on both sides: pooled over positions whose answers stopped parsing, a block's accuracy moves
with which positions still parse, not with accuracy."""
BLOCK_FRACTIONS = (0.1, 0.2, 0.5, 1.0)
"""Block widths, as fractions of the batch size, that comparisons and verdicts look at besides positions."""

UNIFORM_LEVEL = 0.99
"""The level of `best_fit`'s test of a uniform change: a change is described as the whole curve's unless the
data show it is not at 99%. A description, not a call: at 95% a uniform 8-point drop at N = 50 (100 matched
trials) was taken for a non-uniform one in 7 of 100 simulated pairs, at 99% in 3, and drops at positions 1-10
of 50 and 5-8 of 16 were located as often (benchmarks/compare_power.py's model)."""


def blocks(batch_size: int) -> list[tuple[int, int]]:
    """The family a comparison looks at: each position, then the blocks of each width in `BLOCK_FRACTIONS`
    at every start (0-based, end exclusive), without repeats.

    Every start, not a tiling: a drop at positions 5-8 of 16 lies inside blocks 5-7 and 6-8, where a tiling
    of widths 2, 3 and 8 only has blocks that straddle it (5-6, 4-6, 1-8). The band stays simultaneous over
    the larger family (its max-|t| critical value is taken over every member) and grows little, the new
    blocks overlapping the tiling's: from 3.18 to 3.28 at N = 16, from 3.47 to 3.60 at N = 50 (means over
    100 simulated pairs, `benchmarks/compare_power.py`)."""
    family: list[tuple[int, int]] = [(p, p + 1) for p in range(batch_size)]
    seen = set(family)
    for fraction in BLOCK_FRACTIONS:
        width = max(2, round(batch_size * fraction))
        for start in range(batch_size - width + 1):
            if (start, start + width) not in seen:
                seen.add((start, start + width))
                family.append((start, start + width))
    return family


def best_fit(
    diff: Floats,
    family: Sequence[range],
    candidates: Sequence[bool],
    *,
    se: Floats,
    sign: int = 0,
    df: int | None = None,
) -> int | None:
    """Of the members of `family` whose `candidates` is true (those marked different, or flagged), the one
    that best fits the difference `diff` (rows: the data, then the bootstrap resamples); None when no
    member is a candidate. `se`: each member's bootstrap standard error; `sign` -1 looks for a drop, +1 for
    a rise, 0 for either.

    First, whether the change is uniform as far as the data tell: no member's change departs from the
    widest member's (the whole curve's) beyond the max-|t| band of the departures (`UNIFORM_LEVEL`, over
    the family).
    If it is, the widest member, when it is a candidate. If it is not, the widest is left out (unless it is
    the only candidate), and the answer is the candidate with the largest change in standard errors: the
    scan statistic of a change over one block, the block whose mean change leaves the smallest residual.
    Over blocks inside a drop it grows with the width, and it falls once the block runs past the drop: a
    drop at positions 5-8 of 16 is fitted by 5-7 or 6-8. The scan alone is not enough for a uniform drop:
    taking the largest of many narrower blocks' noisy changes against the one whole curve's, it put a
    uniform 8-point drop at N = 20 on a half of the curve in 2 of 6 simulated pairs of checkpoints. And it
    cannot tell a tapering drop from a uniform one where the variance grows with the change (two fakes
    with shared noise): there it chose the whole curve for a drop of 20 points at position 1 to none at 10.
    """
    chosen = [k for k, c in enumerate(candidates) if c and np.isfinite(diff[0, k])]
    if not chosen:
        return None
    widest = max(range(len(family)), key=lambda k: len(family[k]))
    if widest in chosen:
        departures = diff - diff[:, [widest]]
        band = max_t_band(departures[0], departures[1:], clip=None, df=df, level=UNIFORM_LEVEL)
        if not np.any((band.low > 0) | (band.high < 0)):
            return widest
        if len(chosen) > 1:
            chosen.remove(widest)  # the change is not uniform: the whole curve does not fit it

    along = {k: float(abs(diff[0, k]) if sign == 0 else sign * diff[0, k]) for k in chosen}
    score = {
        k: along[k] / float(se[k]) if se[k] > 0 else float(np.sign(along[k])) * np.inf if along[k] else 0.0
        for k in chosen
    }
    top = max(score.values())
    # A block that only adds positions where nothing changed and nothing varies (parse rates of 100% on both
    # sides) has the same score as the block without them: of those, the one with the largest change.
    tied = [k for k in chosen if score[k] == top or score[k] >= top - 1e-9 * abs(top)]
    return max(tied, key=lambda k: (along[k], len(family[k])))


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
    level: float = LEVEL,
) -> Comparison:
    """B minus A at every position and block (accuracy among parsed answers, and parse rate), paired where
    trials match; `level` is the simultaneous band's (the coverage tests loosen it to build a broken
    compare)."""
    matching, ra, rb = resample_pair(a, b, resamples=resamples, seed=seed)
    n = a.batch_size
    family = [range(start, stop) for start, stop in blocks(n)]
    thick = np.minimum(a.parsed.sum(axis=0), b.parsed.sum(axis=0)) >= MIN_ANSWERS
    family_acc = [r for r in family if len(r) == 1 or bool(thick[r.start : r.stop].all())]
    acc_a, acc_b = ra.accuracy(family_acc), rb.accuracy(family_acc)
    diff = acc_b - acc_a
    (parsed_a, _), (parsed_b, _) = ra.counts(family_acc), rb.counts(family_acc)
    (_, answered_a), (_, answered_b) = ra.counts(family), rb.counts(family)
    # A curve compared with itself: the same answers on both sides, every interval of zero width.
    same = a.keys == b.keys and np.array_equal(a.correct, b.correct) and np.array_equal(a.parsed, b.parsed)
    band = diff_band(acc_a, acc_b, counts=(parsed_a, parsed_b), level=level, df=matching.df, same=same)
    pointwise = diff_interval(
        acc_a[:, :n], acc_b[:, :n], counts=(parsed_a[:n], parsed_b[:n]), df=matching.df, same=same
    )
    members = _members(family_acc, acc_a[0], acc_b[0], band.low, band.high)
    located = best_fit(diff, family_acc, [m.different for m in members], se=band.se, df=matching.df)
    paired = matching.method != "unpaired"
    pvalues = [mcnemar_p(a, b, matching.pairs, column) if paired else None for column in range(n)]
    holm = holm_adjust(pvalues)
    found = []
    for column in range(n):
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
        member = members[column]
        found.append(
            DiffPoint(
                position=column + 1,
                accuracy_a=_finite(acc_a[0, column]),
                accuracy_b=_finite(acc_b[0, column]),
                diff=d,
                ci_low=float(pointwise.low[column]),
                ci_high=float(pointwise.high[column]),
                band_low=member.band_low,
                band_high=member.band_high,
                different=member.different,
                mcnemar_p=pvalues[column],
                mcnemar_holm=holm[column],
            )
        )
    parse_a, parse_b = ra.parse_rate(family), rb.parse_rate(family)
    parse_band = diff_band(parse_a, parse_b, counts=(answered_a, answered_b), df=matching.df, same=same)
    whole = acc_a[:, :n], acc_b[:, :n]
    summaries: dict[str, Interval] = {}
    if n > 1:
        summaries["contrast_a"] = contrast(whole[0], df=a.clusters - 1)
        summaries["contrast_b"] = contrast(whole[1], df=b.clusters - 1)
        summaries["contrast_diff"] = _difference(
            whole[1][:, -1] - whole[1][:, 0] - (whole[0][:, -1] - whole[0][:, 0]),
            df=matching.df,
            bounds=DIFF_OF_DIFFS,
        )
        summaries["slope_diff"] = _difference(
            least_squares_slopes(whole[1]) - least_squares_slopes(whole[0]), df=matching.df
        )
    fewest = min(a.clusters, b.clusters)
    return Comparison(
        a=labels[0],
        b=labels[1],
        batch_size=n,
        method=matching.method,
        matched_trials=len(matching.pairs),
        trials_a=a.trials,
        trials_b=b.trials,
        points=tuple(found),
        blocks=tuple(members[n:]),
        located=None if located is None else members[located],
        parse=tuple(_members(family, parse_a[0], parse_b[0], parse_band.low, parse_band.high)),
        warning=too_few_clusters(fewest, unit=a.cluster_unit),
        **summaries,
    )


def _members(family: Sequence[range], a: Floats, b: Floats, low: Floats, high: Floats) -> list[BlockDiff]:
    """One `BlockDiff` per member of `family`."""
    found = []
    for k, positions in enumerate(family):
        d = float(b[k] - a[k])
        known = bool(np.isfinite(d))
        found.append(
            BlockDiff(
                first_position=positions.start + 1,
                last_position=positions.stop,
                a=_finite(a[k]),
                b=_finite(b[k]),
                diff=d if known else None,
                band_low=float(low[k]) if known else None,
                band_high=float(high[k]) if known else None,
                different=known and bool(low[k] > 0 or high[k] < 0),
            )
        )
    return found


def holm_adjust(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjustment of the p-values given (None stays None).

    The same figures as statsmodels' `multipletests(method="holm")` (a test checks), computed here because
    that path calls `gc.collect()` on every call: a full collection per compare, seconds in a large process.
    """
    given = [i for i, p in enumerate(pvalues) if p is not None]
    adjusted: list[float | None] = [None] * len(pvalues)
    if given:
        values = np.array([pvalues[i] for i in given], dtype=float)
        order = np.argsort(values, kind="stable")
        stepped = np.maximum.accumulate(values[order] * np.arange(len(values), 0, -1))
        corrected = np.empty_like(values)
        corrected[order] = np.minimum(stepped, 1.0)
        for i, p in zip(given, corrected, strict=True):
            adjusted[i] = float(p)
    return adjusted


def _difference(values: Floats, *, df: int, bounds: tuple[float, float] | None = None) -> Interval:
    return percentile(float(values[0]), values[1:], df=df, bounds=bounds)


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None
