"""The window step of `posbias explain`: whether a model's sliding window puts a step in its curve.

For a model with a sliding window W, the joint fit (`service/stats/explain.py`) gives the token distance a
term 1[distance >= W] beside its smooth natural spline, so that the step is judged with position, slot and the
smooth decay held fixed, in the same fit that says what moves the curve. Its coefficient, with its clustered
interval and Wald p-value, is the jump; it is reported as a step only when the token distance moves the curve
(its joint test, step included, rejects, so that the step never contradicts the verdict) and then its own test
rejects at the level distance was tested at: one family with the causes' Holm-adjusted tests (`explain._holm`;
`p` is the adjusted p-value). When there is one, where the data put it: the split of the answers by distance
(at any observed distance, 5% trimmed each side) that fits the joint model best, and the 95% interval of that
split from a cluster bootstrap; that interval says whether the step is at the window only when it is narrow
against it.

`benchmarks/coverage.py` checks it by simulation with fakes that step at their window and fakes that do not.
"""

from __future__ import annotations

import math

import numpy as np

from posbias.schemas import Interval, ModelInfo
from posbias.schemas.explanation import WindowStep
from posbias.service.stats.causes import ALPHA, Answers
from posbias.service.stats.trial_data import Floats, Ints

TRIM = 0.05
"""Share of answers, by distance, kept off each end of the break search (and needed each side of W)."""
BREAK_RESAMPLES = 1000
INFORMATIVE = 0.5
"""A break interval at most this share of the window wide is narrow enough to say where the step is."""
_CHUNK = 100


def step_term(
    rows: Answers, *, info: ModelInfo | None, smooth: Floats
) -> tuple[WindowStep | None, Floats | None]:
    """The window's record before the fit (untested, with a note saying why, where the design cannot test
    it; None for a model without a window) and the step's column for the joint fit (None when untested).
    `smooth`: the fit's other columns, but the intercept."""
    window = info.sliding_window if info is not None else None
    if info is None or window is None:
        return None, None
    beyond = rows.distance >= window
    untested = WindowStep(
        window=window,
        sliding_layers=info.sliding_window_layers,
        num_layers=info.num_layers,
        answers_inside=int((~beyond).sum()),
        answers_beyond=int(beyond.sum()),
        tested=False,
    )
    if min(untested.answers_inside, untested.answers_beyond) < max(math.ceil(TRIM * rows.y.size), 5):
        nearest, farthest = int(rows.distance.min()), int(rows.distance.max())
        return untested.model_copy(
            update={
                "note": f"the answers' distances ({nearest:,} to {farthest:,} tokens) do not straddle the "
                f"window of {window:,}: add filler (--filler-tokens) or larger batch sizes to move questions "
                "past it"
            }
        ), None
    step = beyond.astype(np.float64)
    basis = np.column_stack([np.ones_like(step), smooth])
    residual = step - basis @ np.linalg.lstsq(basis, step, rcond=None)[0]
    if float(residual.var()) < 0.01 * float(step.var()):
        return untested.model_copy(
            update={
                "note": "in this design the window's side is fixed by the other causes: a step there cannot "
                "be told from them"
            }
        ), None
    return untested, step


def tested_step(
    untested: WindowStep,
    *,
    jump: Interval,
    p: float,
    distance_moves: bool,
    rows: Answers,
    smooth: Floats,
    resamples: int,
    seed: int,
) -> WindowStep:
    """The window's record from the joint fit's step term (`jump`; `p`, adjusted in the causes' family),
    located when found."""
    found = p < ALPHA and distance_moves
    update: dict[str, object] = {"tested": True, "jump": jump, "p": p, "found": found}
    if found and jump.estimate is not None:
        update["direction"] = "down" if jump.estimate < 0 else "up"
        located = _break(rows, smooth, window=untested.window, resamples=resamples, seed=seed)
        interval = located.get("break_interval")
        if isinstance(interval, tuple):
            located["informative"] = interval[1] - interval[0] <= INFORMATIVE * untested.window
        update.update(located)
    elif jump.low is not None and jump.high is not None:
        update["rules_out"] = max(abs(jump.low), abs(jump.high))
    return WindowStep.model_validate({**untested.model_dump(), **update})


def _break(rows: Answers, smooth: Floats, *, window: int, resamples: int, seed: int) -> dict[str, object]:
    """The best split of the answers by distance for the step model, and its cluster-bootstrap interval."""
    order = np.argsort(rows.distance, kind="stable")
    d = rows.distance[order]
    y = rows.y[order]
    x = np.column_stack([np.ones_like(y), smooth[order]])
    cluster = rows.cluster[order]
    starts = np.flatnonzero(np.r_[True, d[1:] != d[:-1]])  # first answer at each distinct distance
    lo, hi = np.quantile(d, [TRIM, 1 - TRIM])
    candidates = starts[(d[starts] > lo) & (d[starts] <= hi) & (starts > 0)]
    if candidates.size == 0:
        return {}
    previous = d[starts[np.searchsorted(starts, candidates) - 1]]
    clusters = int(cluster.max()) + 1
    rng = np.random.default_rng(seed)
    picks: list[Ints] = []
    done = 0
    while done < resamples + 1:
        chunk = min(_CHUNK, resamples + 1 - done)
        weights = rng.multinomial(clusters, np.full(clusters, 1.0 / clusters), size=chunk).astype(np.float64)
        if done == 0:
            weights[0] = 1.0
        picks.append(_best_splits(y, x, weights[:, cluster], candidates))
        done += chunk
    best = np.concatenate(picks)
    estimate = int(best[0])
    lows, highs = previous[best[1:]], d[candidates[best[1:]]]
    interval = (float(np.quantile(lows, ALPHA / 2)), float(np.quantile(highs, 1 - ALPHA / 2)))
    return {
        "break_low": int(previous[estimate]),
        "break_high": int(d[candidates[estimate]]),
        "break_interval": interval,
        "window_in_interval": interval[0] < window <= interval[1],
    }


def _best_splits(y: Floats, x: Floats, w: Floats, candidates: Ints) -> Ints:
    """Per row of weights `w` (resamples x answers, answers sorted by distance), the index into
    `candidates` of the split (step = 1 from that answer on) that most reduces the weighted squared error of
    the smooth model `x`: by partialling out `x`, the reduction is (s'Wr)^2 / (s'Ws - v'G^-1 v) with r the
    smooth model's residual, v = x'Ws and G = x'Wx; suffix sums give every split at once."""
    gram = np.einsum("rn,ni,nj->rij", w, x, x)
    gram += np.eye(x.shape[1]) * 1e-9
    beta = np.linalg.solve(gram, np.einsum("rn,ni,n->ri", w, x, y)[..., None])[..., 0]
    residual = y[None, :] - beta @ x.T
    weighted_r = np.cumsum((w * residual)[:, ::-1], axis=1)[:, ::-1][:, candidates]
    weight = np.cumsum(w[:, ::-1], axis=1)[:, ::-1][:, candidates]
    v = np.cumsum((w[:, :, None] * x[None])[:, ::-1], axis=1)[:, ::-1][:, candidates]
    inverse = np.linalg.inv(gram)
    explained = np.einsum("rmi,rij,rmj->rm", v, inverse, v)
    denominator = weight - explained
    with np.errstate(invalid="ignore", divide="ignore"):
        gain = np.where(denominator > 1e-9, weighted_r**2 / denominator, -np.inf)
    picked: Ints = np.argmax(gain, axis=1).astype(np.int64)
    return picked
