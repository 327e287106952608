"""Which of position, answer slot and token distance moves a curve, and whether the sliding window puts a step
in it: the analysis behind `posbias explain`.

In the seed's design the three move together: question 1 is first in the prompt, farthest from its answer
and answered first. Designs pull them apart (a random answer order moves the slot, filler moves the distance),
and this module fits correctness on all three at once so that each is judged with the others held fixed:

- **One fit.** Least squares of correctness (parsed answers) on relative position (0 first, 1 last),
  relative answer slot (the same) and token distance (per 1,000 tokens), with question difficulty as a
  covariate (`analysis.difficulty`, as in `analysis.position_regression`; left out when rotation or a filler
  sweep shows each set several times), errors clustered by trial or sampled set, t with clusters - 1 degrees
  of freedom (statsmodels). An effect is *distinguishable from zero* when its 95% interval excludes zero.
- **What the design cannot separate.** A variable the design does not vary is *held fixed* (a probe's slot);
  one that is an exact linear function of another is *not estimable* (slot and position in forward or reverse
  order) and is left out of the fit; two whose correlation over the answers is 0.95 or more are *confounded*
  (position and distance without filler): each one's interval is then mostly the other's, so the verdict
  names them together, with a joint Wald test, and says which design would separate them.
- **The window.** For a model with a sliding window W, a step at W on the distance axis against a smooth
  decay: the smooth model has position, slot, distance and distance squared (and difficulty); the step model
  adds 1[distance >= W]. Its coefficient, with its clustered interval and Wald p-value (the cluster-robust
  equivalent of a likelihood-ratio test between the two), is the jump. When there is one, where the data put
  it: the split of the answers by distance (at any observed distance, 5% trimmed each side) that fits the
  step model best, and the 95% interval of that split from a cluster bootstrap.

`benchmarks/coverage.py` checks every interval here by simulation with fakes driven by each cause.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from posbias.schemas import Interval, ModelInfo
from posbias.schemas.explanation import Confound, Effect, Explanation, WindowStep
from posbias.service.analysis import LEVEL, TrialData, difficulty

CONFOUNDED = 0.95
"""Correlation (absolute) at which two causes count as moved together by the design: they share 90% of
their variance, and each one's interval is about three times as wide as in a design that separates them."""
LOCKSTEP = 1e-6
"""A cause whose variance left after the causes before it is below this share moves in lockstep with them."""
TRIM = 0.05
"""Share of answers, by distance, kept off each end of the break search (and needed each side of W)."""
BREAK_RESAMPLES = 1000
ALPHA = 1 - LEVEL
PER_TOKENS = 1000.0
NAMES = ("position", "answer slot", "token distance")
UNITS = {"position": "first to last", "answer slot": "first to last", "token distance": "per 1,000 tokens"}
_FIXES = {
    frozenset(
        {"position", "answer slot"}
    ): "a random answer order (--answer-order random), or a reverse-order job pooled with a forward one",
    frozenset(
        {"position", "token distance"}
    ): "filler at several lengths (--filler-tokens 0,L at the end, or "
    "after question k), which moves distances and not positions",
    frozenset({"answer slot", "token distance"}): "a random answer order with filler at several lengths",
}
_CHUNK = 100

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


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
        difficulty=adjust if adjust is not None and np.ptp(adjust) > 0 else None,
    )


def explain(
    data: TrialData,
    *,
    model: str,
    revision: str | None = None,
    info: ModelInfo | None = None,
    design: str = "",
    resamples: int = BREAK_RESAMPLES,
    seed: int = 0,
) -> Explanation:
    """Fit `data`'s correctness on position, answer slot and token distance together and say which moves it;
    with `info` naming a sliding window, test for a step there (see the module's docstring)."""
    import statsmodels.api as sm

    rows = answers(data)
    base = {
        "model": model,
        "revision": revision,
        "job_ids": data.jobs,
        "batch_size": data.batch_size,
        "design": design,
        "trials": data.trials,
        "clusters": data.clusters,
        "cluster_unit": data.cluster_unit,
        "answers": int(rows.y.size),
        "difficulty_adjusted": rows.difficulty is not None,
    }
    if rows.y.size < 10 or data.clusters < 3:
        return Explanation(
            **base,
            effects=(),
            confounds=(),
            window=None,
            verdict="too few answers to fit: run more iterations",
        )

    status, notes, kept = _estimability(rows)
    correlations = _correlations(rows, [n for n in NAMES if status[n] != "held fixed"])
    columns = [np.ones_like(rows.y), *(rows.causes[n] for n in kept)]
    if rows.difficulty is not None:
        columns.append(rows.difficulty)
    fit = sm.OLS(rows.y, np.column_stack(columns)).fit(
        cov_type="cluster", cov_kwds={"groups": rows.cluster}, use_t=True
    )
    bounds = fit.conf_int(alpha=ALPHA)
    effects = []
    for name in NAMES:
        values = rows.causes[name] * (PER_TOKENS if name == "token distance" else 1.0)
        covered = (float(values.min()), float(values.max()))
        if name not in kept:
            effects.append(
                Effect(
                    name=name,
                    unit=UNITS[name],
                    status=status[name],
                    note=notes.get(name),
                    range_covered=covered,
                )
            )
            continue
        i = 1 + kept.index(name)
        estimate, low, high = float(fit.params[i]), float(bounds[i][0]), float(bounds[i][1])
        effects.append(
            Effect(
                name=name,
                unit=UNITS[name],
                status="estimated",
                effect=Interval(estimate=estimate, low=low, high=high),
                p=float(fit.pvalues[i]),
                distinguishable=low > 0 or high < 0,
                range_covered=covered,
                note=notes.get(name),
            )
        )
    confounds = _confounds(fit, kept, status, correlations)
    window = _window_step(rows, kept=kept, info=info, resamples=resamples, seed=seed) if info else None
    return Explanation(
        **base,
        effects=tuple(effects),
        confounds=tuple(confounds),
        window=window,
        verdict=_verdict(effects, confounds, window),
    )


# --- what the design can separate ---------------------------------------------------------------------


def _estimability(rows: Answers) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """Each cause's status, notes, and the causes kept for the fit (in order)."""
    status: dict[str, str] = {}
    notes: dict[str, str] = {}
    kept: list[str] = []
    for name in NAMES:
        x = rows.causes[name]
        if np.ptp(x) == 0:
            status[name] = "held fixed"
            notes[name] = f"the design holds the {name} fixed: it cannot move the curve here"
            continue
        basis = np.column_stack([np.ones_like(x), *(rows.causes[k] for k in kept)])
        residual = x - basis @ np.linalg.lstsq(basis, x, rcond=None)[0]
        if float(residual.var()) < LOCKSTEP * float(x.var()):
            status[name] = "not estimable"
            others = " and ".join(kept) if kept else "the intercept"
            notes[name] = f"the design moves the {name} in lockstep with the {others}: not estimable apart"
            continue
        status[name] = "estimated"
        kept.append(name)
    return status, notes, kept


def _correlations(rows: Answers, names: Sequence[str]) -> dict[frozenset[str], float]:
    found = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            r = float(np.corrcoef(rows.causes[a], rows.causes[b])[0, 1])
            found[frozenset({a, b})] = r if math.isfinite(r) else 0.0
    return found


def _confounds(
    fit: object, kept: list[str], status: dict[str, str], correlations: dict[frozenset[str], float]
) -> list[Confound]:
    """Groups of causes linked by a correlation of CONFOUNDED or more, each with the joint test of the
    estimated ones."""
    parent = {name: name for name in NAMES}

    def root(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    for pair, r in correlations.items():
        if abs(r) >= CONFOUNDED:
            a, b = sorted(pair)
            parent[root(a)] = root(b)
    groups: dict[str, list[str]] = {}
    for name in NAMES:
        if status[name] != "held fixed":
            groups.setdefault(root(name), []).append(name)
    found = []
    for members in groups.values():
        if len(members) < 2:
            continue
        pairs = [frozenset({a, b}) for i, a in enumerate(members) for b in members[i + 1 :]]
        strongest = max(pairs, key=lambda p: abs(correlations.get(p, 0.0)))
        estimated = [m for m in members if m in kept]
        joint = None
        if estimated:
            restriction = np.zeros((len(estimated), len(fit.params)))  # type: ignore[attr-defined]
            for row, name in enumerate(estimated):
                restriction[row, 1 + kept.index(name)] = 1.0
            joint = float(np.asarray(fit.f_test(restriction).pvalue))  # type: ignore[attr-defined]
        fixes = sorted({_FIXES[p] for p in pairs if p in _FIXES})
        found.append(
            Confound(
                effects=tuple(members),
                correlation=correlations.get(strongest),
                joint_p=joint,
                moves_curve=joint is not None and joint < ALPHA,
                fix="; or ".join(fixes),
            )
        )
    return found


# --- the window ---------------------------------------------------------------------------------------


def _window_step(
    rows: Answers, *, kept: list[str], info: ModelInfo, resamples: int, seed: int
) -> WindowStep | None:
    import statsmodels.api as sm

    window = info.sliding_window
    if window is None:
        return None
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
        )
    smooth = _smooth(rows, kept)
    step = beyond.astype(np.float64)
    basis = np.column_stack([np.ones_like(step), smooth])
    residual = step - basis @ np.linalg.lstsq(basis, step, rcond=None)[0]
    if float(residual.var()) < 0.01 * float(step.var()):
        return untested.model_copy(
            update={
                "note": "in this design the window's side is fixed by the other causes: a step there cannot "
                "be told from them"
            }
        )
    design = np.column_stack([np.ones_like(step), smooth, step])
    fit = sm.OLS(rows.y, design).fit(cov_type="cluster", cov_kwds={"groups": rows.cluster}, use_t=True)
    low, high = (float(v) for v in fit.conf_int(alpha=ALPHA)[-1])
    p = float(fit.pvalues[-1])
    update: dict[str, object] = {
        "tested": True,
        "jump": Interval(estimate=float(fit.params[-1]), low=low, high=high),
        "p": p,
        "found": p < ALPHA,
    }
    if p < ALPHA:
        update.update(_break(rows, smooth, window=window, resamples=resamples, seed=seed))
    return WindowStep.model_validate({**untested.model_dump(), **update})


def _smooth(rows: Answers, kept: list[str]) -> Floats:
    """The smooth model's causes: the estimable ones, distance squared, difficulty."""
    columns = [rows.causes[name] for name in kept]
    d = rows.causes["token distance"]
    if np.ptp(d) > 0:
        if "token distance" not in kept:
            columns.append(d)
        centred = d - d.mean()
        columns.append(centred * centred)
    if rows.difficulty is not None:
        columns.append(rows.difficulty)
    return np.column_stack(columns)


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


# --- the verdict --------------------------------------------------------------------------------------


def _verdict(effects: Sequence[Effect], confounds: Sequence[Confound], window: WindowStep | None) -> str:
    grouped = {name for c in confounds for name in c.effects}
    moving = [e for e in effects if e.distinguishable and e.name not in grouped]
    quiet = [
        e.name for e in effects if e.status == "estimated" and not e.distinguishable and e.name not in grouped
    ]
    parts = []
    if moving:
        parts.append(
            "Moves the curve: "
            + "; ".join(f"{e.name} ({_pp(e.effect)} {e.unit})" for e in moving if e.effect is not None)
            + "."
        )
    for c in confounds:
        names = " and ".join(c.effects)
        if c.moves_curve:
            parts.append(f"{names} together move the curve, and this design cannot say which: use {c.fix}.")
        else:
            quiet.append(f"{names} (moved together by this design)")
    if quiet:
        parts.append("Not distinguishable from zero: " + ", ".join(quiet) + ".")
    for e in effects:
        if e.status != "estimated" and e.note and e.name not in grouped:
            parts.append(e.note[0].upper() + e.note[1:] + ".")
    if window is not None:
        if not window.tested:
            parts.append(f"Sliding window ({window.window:,} tokens) not tested: {window.note}.")
        elif window.found and window.jump is not None:
            where = ""
            if window.break_interval is not None:
                low, high = window.break_interval
                inside = "which includes" if window.window_in_interval else "which does not include"
                where = (
                    f"; the data put it between {window.break_low:,} and {window.break_high:,} tokens "
                    f"(95% CI {low:,.0f} to {high:,.0f}), {inside} the window"
                )
            parts.append(
                f"A step at the sliding window ({window.window:,} tokens): {_pp(window.jump)} beyond it, "
                f"over a smooth decay (p = {window.p:.2g}){where}."
            )
        else:
            parts.append(
                f"No step at the sliding window ({window.window:,} tokens) beyond a smooth decay "
                f"(p = {window.p:.2g})."
            )
    return " ".join(parts) if parts else "Nothing to say: no cause could be estimated."


def _pp(interval: Interval | None) -> str:
    if interval is None or interval.estimate is None:
        return "n/a"
    return f"{100 * interval.estimate:+.1f} points"
