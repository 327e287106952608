"""The three causes `posbias explain` weighs (position, answer slot and token distance), per parsed answer:
the regression rows that its joint fit (`service/stats/explain.py`) and its window step
(`service/stats/window_step.py`) read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from posbias.service.stats.intervals import LEVEL
from posbias.service.stats.regression import difficulty
from posbias.service.stats.trial_data import Floats, Ints, TrialData

ALPHA = 1 - LEVEL
"""The size of every test of `posbias explain`: one minus the level of its intervals."""
PER_TOKENS = 1000.0
NAMES = ("position", "answer slot", "token distance")


@dataclass(frozen=True)
class Answers:
    """The parsed answers of a `TrialData` as regression rows."""

    y: Floats
    causes: dict[str, Floats]
    """Relative position, relative slot, distance per 1,000 tokens (NaN-free)."""
    distance: Floats
    """Token distance (tokens)."""
    cluster: Ints
    difficulty: Floats | None


def answers(data: TrialData) -> Answers:
    """The rows the fits use: every parsed answer with a recorded distance (all of them, for an engine that
    reports token offsets)."""
    rows, cols = np.nonzero(data.parsed > 0)
    n = data.batch_size
    distance = data.distance[rows, cols] if data.distance is not None else np.full(rows.size, np.nan)
    keep = np.isfinite(distance) if np.isfinite(distance).any() else np.ones(rows.size, dtype=bool)
    rows, cols, distance = rows[keep], cols[keep], distance[keep]
    y = data.correct[rows, cols]
    position = cols / (n - 1) if n > 1 else np.zeros(rows.size)
    slot_of = data.slot[rows, cols] if data.slot is not None else cols + 1.0
    lines = data.lines[rows] if data.lines is not None else np.full(rows.size, float(n))
    with np.errstate(invalid="ignore", divide="ignore"):
        slot = np.where(lines > 1, (slot_of - 1) / np.maximum(lines - 1, 1), 0.0)
    slot = np.where(np.isfinite(slot), slot, 0.0)
    adjust = difficulty(data, rows, cols) if data.cluster_unit == "trial" else None
    return Answers(
        y=y,
        causes={
            "position": position.astype(np.float64),
            "answer slot": slot.astype(np.float64),
            "token distance": np.nan_to_num(distance) / PER_TOKENS,
        },
        distance=np.nan_to_num(distance),
        cluster=data.cluster[rows],
        difficulty=adjust if adjust is not None and adjust.size and np.ptp(adjust) > 0 else None,
    )


@dataclass(frozen=True)
class Spline:
    """A natural cubic spline basis (Hastie, Tibshirani and Friedman, The Elements of Statistical Learning,
    eq. 5.4-5.5) on `knots`, without its constant: `len(knots) - 1` columns, linear beyond the end knots.
    With two knots it is the straight line."""

    knots: tuple[float, ...]

    @property
    def columns(self) -> int:
        return len(self.knots) - 1

    def __call__(self, x: Floats) -> Floats:
        """The basis at `x`: one row per value."""
        x = np.asarray(x, dtype=np.float64)
        k = np.asarray(self.knots)
        scale = float(k[-1] - k[0]) or 1.0
        z = (x - k[0]) / scale  # unit scale: the cubic terms stay of order one
        knots = (k - k[0]) / scale
        columns = [z]

        def d(j: int) -> Floats:
            found: Floats = (np.maximum(z - knots[j], 0.0) ** 3 - np.maximum(z - knots[-1], 0.0) ** 3) / (
                knots[-1] - knots[j]
            )
            return found

        last = d(len(knots) - 2)
        for j in range(len(knots) - 2):
            columns.append(d(j) - last)
        return np.column_stack(columns)


def spline_for(values: Floats, *, knots: int, quantiles: bool) -> Spline:
    """A basis for `values` with `knots` knots (fewer where `values` has fewer distinct values): at evenly
    spaced quantiles from the least to the greatest (`quantiles`) or evenly over the range."""
    distinct = np.unique(values)
    count = max(2, min(knots, distinct.size))
    if quantiles:
        at = np.unique(np.quantile(values, np.linspace(0.0, 1.0, count)))
    else:
        at = np.linspace(float(distinct[0]), float(distinct[-1]), count)
    if at.size < 2:
        at = np.array([float(distinct[0]), float(distinct[-1])])
    return Spline(tuple(float(v) for v in at))


# --- what the design separates -----------------------------------------------------------------------


@dataclass(frozen=True)
class Estimability:
    """What the design lets the fit estimate of each cause."""

    status: dict[str, str]
    """Each cause: "held fixed", "not estimable" or "estimated"."""
    notes: dict[str, str]
    kept: list[str]
    """The causes the fit estimates, in order."""
    lockstep: dict[str, list[str]]
    """Each cause not estimable: the kept causes it moves in lockstep with, which the fit's terms for them
    stand in for (so that they are judged together, never one of them alone)."""


def estimability(rows: Answers, *, lockstep: float) -> Estimability:
    """Each cause's status and notes, the causes kept for the fit, and for each one left out the kept ones it
    moves in lockstep with."""
    status: dict[str, str] = {}
    notes: dict[str, str] = {}
    kept: list[str] = []
    partners: dict[str, list[str]] = {}
    for name in NAMES:
        x = rows.causes[name]
        if np.ptp(x) == 0:
            status[name] = "held fixed"
            notes[name] = f"the design holds the {name} fixed: it cannot move the curve here"
            continue
        if _left(rows, x, kept) < lockstep:
            status[name] = "not estimable"
            needed = [k for k in kept if _left(rows, x, [o for o in kept if o != k]) >= lockstep]
            partners[name] = needed or list(kept)
            others = " and ".join(f"the {k}" for k in partners[name])
            notes[name] = f"the design moves the {name} in lockstep with {others}: not estimable apart"
            continue
        status[name] = "estimated"
        kept.append(name)
    return Estimability(status, notes, kept, partners)


def _left(rows: Answers, x: Floats, names: list[str]) -> float:
    """The share of `x`'s variance the causes `names` (with an intercept) leave unexplained."""
    basis = np.column_stack([np.ones_like(x), *(rows.causes[k] for k in names)])
    residual = x - basis @ np.linalg.lstsq(basis, x, rcond=None)[0]
    return float(residual.var()) / float(x.var())


def share(target: Floats, others: Floats) -> float:
    """The share of `target`'s columns' variation that `others` (with an intercept) leave unexplained: the
    geometric mean over its canonical directions, det(residual covariance) / det(covariance), to 1/columns."""
    centred = target - target.mean(axis=0)
    basis = (
        np.column_stack([np.ones(target.shape[0]), others]) if others.size else np.ones((target.shape[0], 1))
    )
    residual = target - basis @ np.linalg.lstsq(basis, target, rcond=None)[0]
    total = np.linalg.slogdet(centred.T @ centred)
    left = np.linalg.slogdet(residual.T @ residual)
    if total[0] <= 0 or left[0] <= 0:
        return 0.0
    return float(min(1.0, math.exp((left[1] - total[1]) / target.shape[1])))


def information_of(
    x: Floats, terms: dict[str, list[int]]
) -> tuple[dict[str, float], dict[frozenset[str], float]]:
    """Each cause's information given all the others, and given each other one alone (the smaller of the
    two directions, per pair)."""
    found = {}
    pairs: dict[frozenset[str], float] = {}
    names = list(terms)
    for name in names:
        rest = [i for other in names if other != name for i in terms[other]]
        found[name] = share(x[:, terms[name]], x[:, rest])
        for other in names:
            if other != name:
                pair = frozenset({name, other})
                one = share(x[:, terms[name]], x[:, terms[other]])
                pairs[pair] = min(pairs.get(pair, 1.0), one)
    return found, pairs


def groups_of(
    information: dict[str, float], pairs: dict[frozenset[str], float], kept: list[str], *, threshold: float
) -> list[list[str]]:
    """Causes not separable from one another: joined by a pair below `threshold`; a cause below it given all
    the others but no one of them joins them all."""
    parent = {name: name for name in kept}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for pair, share in pairs.items():
        if share < threshold:
            a, b = sorted(pair)
            parent[root(a)] = root(b)
    for name in kept:
        if information[name] < threshold and all(root(o) != root(name) for o in kept if o != name):
            for other in kept:
                parent[root(other)] = root(name)
    found: dict[str, list[str]] = {}
    for name in kept:
        found.setdefault(root(name), []).append(name)
    return [members for members in found.values() if len(members) > 1]


def with_lockstep(groups: list[list[str]], lockstep: dict[str, list[str]]) -> list[list[str]]:
    """`groups` with each cause not estimable put with the causes it moves in lockstep with (groups that
    share a cause merged), each group's causes in the table's order."""
    merged = [set(g) for g in groups]
    for name, partners in lockstep.items():
        joined = {name, *partners}
        for group in [g for g in merged if g & joined]:
            joined |= group
            merged.remove(group)
        merged.append(joined)
    return [[n for n in NAMES if n in g] for g in merged]


def correlations(rows: Answers, names: Sequence[str]) -> dict[frozenset[str], float]:
    found = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            r = float(np.corrcoef(rows.causes[a], rows.causes[b])[0, 1])
            found[frozenset({a, b})] = r if math.isfinite(r) else 0.0
    return found
