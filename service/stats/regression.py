"""Slopes of accuracy on position: the least-squares slope of each bootstrap resample's curve, and the curve's
slope from a regression of correctness on position with errors clustered and question difficulty adjusted
(statsmodels), with the difficulty covariate that `posbias explain`'s rows (`service/stats/causes.py`) use
too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import Interval
from posbias.service.stats.intervals import LEVEL
from posbias.service.stats.trial_data import Floats, Ints, TrialData


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


def position_regression(data: TrialData) -> tuple[Interval, Interval] | None:
    """Correctness (parsed answers) on relative position, least squares with errors clustered by `data`'s
    clusters (`clustered_ols`, t with clusters - 1 degrees of freedom), adjusted for question difficulty by a
    covariate: how much better than its positions' means the question did in its other answers (shrunk to 0,
    so a question seen once adds nothing). Returns (slope per position, first-to-last effect)."""
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
    if np.ptp(relative) == 0:
        return None
    fit = clustered_ols(y, columns, data.cluster[rows])
    effect = float(fit.params[1])
    low, high = fit.interval(1)
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


@dataclass(frozen=True)
class ClusteredFit:
    """A least-squares fit with cluster-robust errors: what statsmodels' `OLS(...).fit(cov_type="cluster",
    use_t=True)` gives, from sums instead of its copies of the design (a million answers: a quarter of the
    time, a fraction of the memory; tests/unit/test_regression.py checks it against statsmodels)."""

    params: Floats
    cov: Floats
    """The clustered covariance of `params`, with statsmodels' small-sample correction."""
    df: int
    """Degrees of freedom of its t and F tests: clusters - 1."""

    def interval(self, index: int, *, level: float = LEVEL) -> tuple[float, float]:
        """The `level` t interval of coefficient `index`."""
        return self.combination(np.eye(len(self.params))[index], level=level)

    def combination(self, vector: Floats, *, level: float = LEVEL) -> tuple[float, float]:
        """The `level` t interval of the linear combination `vector` of the coefficients."""
        from scipy.special import stdtrit

        estimate = float(vector @ self.params)
        se = float(np.sqrt(max(float(vector @ self.cov @ vector), 0.0)))
        half = float(stdtrit(self.df, (1 + level) / 2)) * se
        return estimate - half, estimate + half

    def p_value(self, index: int) -> float:
        """Two-sided t test p-value that coefficient `index` is 0 (statsmodels' `pvalues`)."""
        from scipy.special import stdtr

        se = float(np.sqrt(self.cov[index, index]))
        if not se > 0:
            return float("nan")
        return float(2 * stdtr(self.df, -abs(float(self.params[index]) / se)))

    def joint_p(self, restriction: Floats) -> float:
        """p-value of the Wald F test that `restriction` @ params = 0 (F with rank and `df` degrees of
        freedom, as statsmodels' `f_test`: its numerator's degrees of freedom are the restrictions)."""
        from scipy.special import fdtrc

        r = np.atleast_2d(restriction)
        value = r @ self.params
        middle = r @ self.cov @ r.T
        statistic = float(value @ np.linalg.pinv(middle) @ value)
        restrictions = r.shape[0]
        if not np.any(middle):
            return float("nan")
        return float(fdtrc(restrictions, self.df, statistic / restrictions))

    def hotelling_p(self, restriction: Floats) -> float:
        """p-value of the same Wald statistic W read as Hotelling's T^2 of the G clusters' score sums:
        W / q x (G - q) / (G - 1) is F with q and G - q degrees of freedom, the statistic's exact null
        distribution when the cluster sums are normal (`joint_p`, statsmodels' reading, takes W / q as F
        with q and G - 1, which is liberal for q > 1 at few clusters: its size at 5% is 6.0% for q = 3 at
        G = 40, 7.8% at G = 16, 5.2% at G = 200). The same as `joint_p` for one restriction."""
        from scipy.special import fdtrc

        r = np.atleast_2d(restriction)
        value = r @ self.params
        middle = r @ self.cov @ r.T
        if not np.any(middle):
            return float("nan")
        statistic = float(value @ np.linalg.pinv(middle) @ value)
        restrictions = int(np.linalg.matrix_rank(middle))
        clusters = self.df + 1
        if clusters <= restrictions:
            return 1.0  # no degrees of freedom left: the data cannot reject
        scaled = statistic / restrictions * (clusters - restrictions) / (clusters - 1)
        return float(fdtrc(restrictions, clusters - restrictions, scaled))


def clustered_ols(y: Floats, design: Floats | Sequence[Floats], groups: Ints) -> ClusteredFit:
    """Least squares of `y` on `design` (answers x terms, or its columns) with errors clustered by
    `groups`: the estimate from the normal equations (pseudo-inverse, as statsmodels), the sandwich
    covariance from each cluster's summed scores, times G / (G - 1) x (N - 1) / (N - K) (statsmodels'
    correction), t and F with G - 1 degrees of freedom. Built from dot products of the columns, so it holds
    no copy of the design (at 5M answers a three-column copy was 120 MB, statsmodels' several)."""
    columns = (
        [design[:, j] for j in range(design.shape[1])] if isinstance(design, np.ndarray) else list(design)
    )
    n, k = y.size, len(columns)
    gram = np.array([[float(np.dot(a, b)) for b in columns] for a in columns])
    bread = np.linalg.pinv(gram)
    params = bread @ np.array([float(np.dot(c, y)) for c in columns])
    residual = y.astype(np.float64, copy=True)
    for beta, c in zip(params, columns, strict=True):
        residual -= beta * c
    codes = np.asarray(groups, dtype=np.int64)
    if codes.size and codes.min() < 0:
        codes = np.unique(codes, return_inverse=True)[1]
    g = int(np.count_nonzero(np.bincount(codes))) if codes.size else 0
    scores = np.column_stack([np.bincount(codes, weights=c * residual) for c in columns])
    meat = scores.T @ scores
    correction = g / max(g - 1, 1) * (n - 1) / max(n - k, 1)
    cov = correction * bread @ meat @ bread
    return ClusteredFit(params=params, cov=cov, df=max(g - 1, 1))
