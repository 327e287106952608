"""Which of position, answer slot and token distance moves a curve, and whether the sliding window puts a step
in it: the analysis behind `posbias explain`.

In the seed's design the three move together: question 1 is first in the prompt, farthest from its answer
and answered first. Designs pull them apart (a random answer order moves the slot, filler moves the distance),
and this module fits correctness on all three at once so that each is judged with the others held fixed:

- **One fit, each cause flexible.** Least squares of correctness (parsed answers) on a natural cubic spline of
  each cause (`causes.Spline`): relative position and relative answer slot with three knots (a line and a
  bend: a U shape), token distance with four (a smooth decay, convex or concave) and, for a model with a
  sliding window, a step at the window (`service/stats/window_step.py`), with question difficulty as a
  covariate (`regression.difficulty`; left out when rotation or a filler sweep shows each set several times),
  errors clustered by trial or sampled set, t with clusters - 1 degrees of freedom
  (`regression.clustered_ols`: statsmodels' figures, from sums). A linear probability model, so that every
  summary is a linear combination of the coefficients, in points.
- **Each cause tested jointly**: a clustered Wald test of all its terms (the step included), its degrees of
  freedom stated, read as Hotelling's T^2 of the clusters' scores (F with q and clusters - q degrees of
  freedom, `ClusteredFit.hotelling_p`; statsmodels' F with clusters - 1 is liberal for several terms at
  few clusters: benchmarks/README.md, "Explain's false causes"); these tests are Holm-adjusted, and the
  step's own (its one term's) joins their family after distance's, with distance's share of the level
  (`_holm`), so that a job's verdict says something false at most 5% of the time, the step included.
  Summaries with 95% intervals: first to last and the bend (middle against the ends) for position and
  slot, the smooth part's average change per 1,000 tokens and the step for distance. Each interval is the
  fit's t interval made on Fisher's z scale (`intervals.bounded_interval`), so that it stays inside what a
  curve within [0, 1] allows at any sample size.
- **What the data rule out.** A cause that does not move the curve gets the largest change its intervals
  allow: "no effect larger than +/-X points" when X is under `MATERIAL`, "cannot tell" when it is not (the
  words, the table's and the verdict's, are `service/stats/explain_reading.py`'s).
- **What the design cannot separate.** A variable the design does not vary is *held fixed* (a probe's slot);
  one that is an exact linear function of another is *not estimable* (slot and position in forward or reverse
  order) and is left out of the fit. Of the rest, each cause's *information*, the share of its terms'
  variation the other causes do not explain (one over the generalized variance inflation factor of Fox and
  Monette, 1992, to the power 1/terms), below `SEPARABLE` puts it with the causes that explain it into one
  group, judged by their joint test, with the design that would separate them; such a cause gets no
  summary or interval of its own (the fit could only extrapolate one, past +-100 points at times).
- **Too few clusters.** Below `MIN_CLUSTERS` nothing is fitted, and the verdict says how many are needed.
- **Many answers.** Past `FIT_ANSWERS` the fit runs on a random sample of whole clusters, and says so.

The table (`Effect.reading`) and the verdict are written from the same fields. `benchmarks/coverage.py`
checks every interval here, every false call and the threshold by simulation on shapes the fit does not
assume (steps, convex and concave decays, U shapes, two causes at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from posbias.schemas import Interval, ModelInfo
from posbias.schemas.explanation import Confound, Effect, Explanation
from posbias.service.stats.causes import (
    ALPHA,
    NAMES,
    PER_TOKENS,
    Answers,
    Spline,
    answers,
    correlations,
    estimability,
    groups_of,
    information_of,
    spline_for,
    with_lockstep,
)
from posbias.service.stats.explain_reading import alone, read, verdict
from posbias.service.stats.intervals import bounded_interval
from posbias.service.stats.regression import clustered_ols
from posbias.service.stats.trial_data import Floats, TrialData, sampled
from posbias.service.stats.window_step import BREAK_RESAMPLES, step_term, tested_step

SEPARABLE = 0.5
"""Information (share of a cause's variation not explained by the others) below which it is reported as not
separable: chosen by simulation (benchmarks/coverage.py, `explain-*` settings; see benchmarks/README.md). At
0.4, causes in random or forward order with widely varying question lengths sat at the threshold: separable
in a quarter to a half of the jobs, and named there in only 68-72% when they moved the curve."""
MIN_CLUSTERS = 12
"""Trials (or sampled sets, in a filler sweep) below which explain fits nothing: its cluster-robust tests
have clusters - 1 denominator degrees of freedom, and with fewer they named a cause with no effect in 7% (10
clusters) to 25% (4) of simulated jobs; 5.6% at 12, 4.3% at 16. The intervals covered 96% at every count
(`python benchmarks/intervals.py explain --reps 200`; figures in benchmarks/README.md)."""
LOCKSTEP = 1e-6
"""A cause whose variance left after the causes before it is below this share moves in lockstep with them."""
KNOTS = {"position": 4, "answer slot": 4, "token distance": 5}
"""Knots of each cause's natural spline: position and slot a line and two bends (a U, a V), distance
a line and three (a convex or concave decay; four knots let a convex one through as a false step)."""
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
_ALL = frozenset({"answer slot", "token distance"})
"""The pair whose fix (a random order with filler) separates all three causes."""


@dataclass(frozen=True)
class _Block:
    """One cause's terms in the design matrix."""

    name: str
    basis: Spline
    start: int
    stop: int


FIT_ANSWERS = 300_000
"""Parsed answers at one batch size past which explain fits a random sample of whole clusters (`sampled`):
the fit holds every answer's terms (a dozen columns) in memory, and its intervals are narrow far below this,
so a larger job buys memory, not information."""


def explain_curve(
    data: TrialData,
    *,
    model: str,
    revision: str | None = None,
    info: ModelInfo | None = None,
    design: str = "",
    resamples: int = BREAK_RESAMPLES,
    seed: int = 0,
    minimum: int = MIN_CLUSTERS,
) -> Explanation:
    """Fit `data`'s correctness on position, answer slot and token distance together and say which moves it;
    with `info` naming a sliding window, test for a step there (see the module's docstring). With fewer than
    `minimum` clusters nothing is fitted (the benchmark lowers it to measure what a fit there would print)."""
    data, sample = sampled(data, answers=FIT_ANSWERS, seed=seed, why="to keep the fit's memory bounded")
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
        "sample": sample,
        "difficulty_adjusted": rows.difficulty is not None,
        "threshold": SEPARABLE,
    }
    if rows.y.size < 10 or data.clusters < max(minimum, 3):
        unit = data.cluster_unit or "trial"
        return Explanation(
            **base,
            effects=(),
            confounds=(),
            window=None,
            verdict=f"too few {unit}s to fit: {data.clusters} {unit}s, and explain's tests and intervals "
            f"hold their level from {max(minimum, 3)} on (benchmarks/intervals.py explain); run at least "
            f"{max(minimum, 3)} iterations",
        )

    if np.ptp(rows.y) == 0:  # a floor or a ceiling: every test's variance is zero (p NaN), nothing to fit
        said = "right" if rows.y[0] else "wrong"
        return Explanation(
            **base,
            effects=(),
            confounds=(),
            window=None,
            verdict=f"every parsed answer is {said} ({100 * float(rows.y[0]):.0f}% at every position): a "
            "floor or a ceiling, so nothing here can tell what moves the curve; a harder or easier dataset "
            "would",
        )
    estimable = estimability(rows, lockstep=LOCKSTEP)
    status, notes, kept = estimable.status, estimable.notes, estimable.kept
    if not kept:  # every cause held fixed or in lockstep: a fit would have no term to test
        return Explanation(
            **base,
            effects=tuple(
                Effect(name=n, unit=UNITS[n], status=status[n], note=notes.get(n), reading=status[n])
                for n in NAMES
            ),
            confounds=(),
            window=None,
            verdict="nothing to explain: this design moves none of position, answer slot and token distance",
        )
    correlated = correlations(rows, [n for n in NAMES if status[n] != "held fixed"])
    blocks, columns = _blocks(rows, kept)
    smooth = np.column_stack(columns[1:])
    window, step = step_term(rows, info=info, smooth=smooth)
    if step is not None and "token distance" not in kept:
        step = None
        window = (
            window.model_copy(update={"note": _unmoved(estimable.lockstep.get("token distance"))})
            if window
            else None
        )
    step_at = None
    if step is not None:
        step_at = len(columns)
        columns.append(step)
    design_matrix = np.column_stack(columns)
    fit = clustered_ols(rows.y, design_matrix, rows.cluster)
    width = design_matrix.shape[1]

    def contrast(vector: Floats, bound: float) -> Interval:
        """A linear combination of the coefficients with its 95% interval: the fit's t interval, on Fisher's
        z scale so that it stays within +-`bound`, the most the combination can be."""
        low, high = fit.combination(vector, level=1 - ALPHA)
        return bounded_interval((low + high) / 2, (high - low) / 2, bound=bound)

    def joint(indices: Sequence[int]) -> float:
        restriction = np.zeros((len(indices), width))
        for row, index in enumerate(indices):
            restriction[row, index] = 1.0
        return fit.hotelling_p(restriction)

    terms = {b.name: list(range(b.start, b.stop)) for b in blocks}
    if step_at is not None:
        terms["token distance"].append(step_at)
    information, pairs = information_of(design_matrix, terms)
    groups = with_lockstep(groups_of(information, pairs, kept, threshold=SEPARABLE), estimable.lockstep)
    grouped = {name for members in groups for name in members}
    effects = []
    for name in NAMES:
        x = rows.distance if name == "token distance" else rows.causes[name]
        covered = (float(x.min()), float(x.max()))
        if name not in kept:
            effects.append(
                Effect(
                    name=name,
                    unit=UNITS[name],
                    status=status[name],
                    note=notes.get(name),
                    range_covered=covered,
                    reading=status[name],
                )
            )
            continue
        block = next(b for b in blocks if b.name == name)
        ends = (float(np.quantile(x, 0.05)), float(np.quantile(x, 0.95)))
        middle = _middle(x)
        summary, bend, span = _summaries(block, width, contrast, ends, middle, stepped=step_at is not None)
        p = joint(terms[name])
        separable = name not in grouped
        effects.append(
            Effect(
                name=name,
                unit=UNITS[name],
                status="estimated",
                effect=summary,
                bend=bend,
                bend_at=middle if bend is not None else None,
                span=span,
                terms=len(terms[name]),
                p=p,
                distinguishable=separable and p < ALPHA,
                information=information[name],
                separable=separable,
                range_covered=covered,
                note=notes.get(name),
            )
        )
    confounds = _confounds(groups, terms, information, correlated, joint)
    step_p = fit.p_value(step_at) if step_at is not None else None
    effects, confounds, step_p = _holm(effects, confounds, step=step_p)
    if window is not None and step_at is not None:
        assert step_p is not None  # the step's term is in the fit
        distance = next(e for e in effects if e.name == "token distance")
        moves = distance.distinguishable or any(
            c.moves_curve and "token distance" in c.effects for c in confounds
        )
        window = tested_step(
            window,
            jump=contrast(np.eye(width)[step_at], 1.0),
            p=step_p,
            distance_moves=moves,
            rows=rows,
            smooth=_location_smooth(rows, columns[:step_at], blocks),
            resamples=resamples,
            seed=seed,
        )
    effects = [alone(read(e, confounds)) for e in effects]
    return Explanation(
        **base,
        effects=tuple(effects),
        confounds=tuple(confounds),
        window=window,
        verdict=verdict(effects, confounds, window),
    )


def _unmoved(partners: list[str] | None) -> str:
    """Why the step is not tested when token distance is not in the fit (held fixed, or in lockstep)."""
    if not partners:
        return "the design does not move token distances"
    causes = " and ".join(f"the {p}" for p in partners)
    return f"the design moves token distances in lockstep with {causes}, so a step there cannot be told apart"


# --- the fit's terms ----------------------------------------------------------------------------------


def _blocks(rows: Answers, kept: list[str]) -> tuple[list[_Block], list[Floats]]:
    """The design's columns (intercept, each kept cause's spline, difficulty) and where each cause's are."""
    columns: list[Floats] = [np.ones_like(rows.y)]
    blocks = []
    for name in kept:
        x = rows.distance if name == "token distance" else rows.causes[name]
        basis = spline_for(x, knots=KNOTS[name], quantiles=name == "token distance")
        values = basis(x)
        blocks.append(_Block(name, basis, len(columns), len(columns) + values.shape[1]))
        columns.extend(values.T)
    if rows.difficulty is not None:
        columns.append(rows.difficulty)
    return blocks, columns


def _middle(x: Floats) -> tuple[float, ...]:
    """The observed values nearest the middle of [0, 1]: one for an odd count of them, two for an even."""
    distinct = np.unique(x)
    order = np.argsort(np.abs(distinct - 0.5), kind="stable")
    count = 1 if distinct.size % 2 else 2
    return tuple(sorted(float(v) for v in distinct[order[:count]]))


def _location_smooth(rows: Answers, columns: list[Floats], blocks: list[_Block]) -> Floats:
    """The smooth model the step's location is searched against: every column of the fit but the intercept,
    the step and the distance's spline, with distance and distance squared in its place (a spline would bend
    to follow a step put anywhere near the window, and blur where the data put it)."""
    distance = next((b for b in blocks if b.name == "token distance"), None)
    keep = [
        c
        for i, c in enumerate(columns[1:], start=1)
        if distance is None or not distance.start <= i < distance.stop
    ]
    d = rows.causes["token distance"]
    centred = d - d.mean()
    return np.column_stack([*keep, d, centred * centred])


def _summaries(
    block: _Block,
    width: int,
    contrast: Callable[[Floats, float], Interval],
    span: tuple[float, float],
    middle: tuple[float, ...],
    *,
    stepped: bool,
) -> tuple[Interval, Interval | None, tuple[float, float] | None]:
    """A cause's summary (first to last, or per 1,000 tokens over its span), and the bend of position and
    slot: the fitted curve at its `middle` values minus the mean of its ends. Each is at most 100 points
    (a curve within [0, 1]); distance's smooth part may change by 200 over its span when the fit has a step
    (a jump of up to 100 points at the window)."""

    def vector(values: Floats) -> Floats:
        found = np.zeros(width)
        found[block.start : block.stop] = values
        return found

    b = block.basis
    if block.name == "token distance":
        low, high = span
        ends = b(np.array([low, high]))
        per = PER_TOKENS / (high - low) if high > low else 0.0
        most = (2.0 if stepped else 1.0) * per
        summary = contrast(vector((ends[1] - ends[0]) * per), most if per else 1.0)
        return summary, None, (low, high)
    points = b(np.array([0.0, *middle, 1.0]))
    centre = points[1:-1].mean(axis=0)
    summary = contrast(vector(points[-1] - points[0]), 1.0)
    bend = contrast(vector(centre - (points[0] + points[-1]) / 2), 1.0) if b.columns > 1 else None
    return summary, bend, None


# --- what the design cannot separate ------------------------------------------------------------------


def _holm(
    effects: list[Effect], confounds: list[Confound], *, step: float | None
) -> tuple[list[Effect], list[Confound], float | None]:
    """The family of "this cause (or group) moves the curve" tests and the window's "a step at the window"
    (`step`, its own term's test), adjusted so that a job makes a claim the truth does not support at most 5%
    of the time, whichever and however many are tested (a one-cause truth is named alone in 95% of jobs).
    Each p becomes its adjusted p-value.

    Holm's procedure among the causes, drawn as a graph (Bretz, Maurer, Brannath and Posch, Stat. Med. 28:
    586, 2009), with the step hanging off the test that holds the token distance: it starts with no share
    of the level, inherits all of distance's once distance is rejected, and passes it on to the other causes
    once it is rejected itself. So the step is never reported without distance, and the causes' tests are
    Holm's whenever the step is found, and never more liberal. Outside the family the step was tested at a
    full 5% beside the causes (5.0% false steps over the coverage grid's smooth decays, up to 9% in a
    setting); a plain Holm family of all four cost distance's power (benchmarks/README.md)."""
    family: list[tuple[str, int, float]] = [
        ("effect", i, e.p) for i, e in enumerate(effects) if e.separable and e.p is not None
    ]
    family += [("group", i, c.joint_p) for i, c in enumerate(confounds) if c.joint_p is not None]
    causes = len(family)
    holders = [
        k
        for k, (kind, i, _) in enumerate(family)
        if (
            effects[i].name == "token distance"
            if kind == "effect"
            else "token distance" in confounds[i].effects
        )
    ]
    parent = holders[0] if holders else None
    if step is not None and parent is not None:
        family.append(("step", 0, step))
    weights = np.array([1.0 / causes] * causes + [0.0] * (len(family) - causes)) if causes else np.zeros(0)
    graph = np.zeros((len(family), len(family)))
    for k in range(causes):
        if k == parent and len(family) > causes:
            graph[k, causes] = 1.0
        elif causes > 1:
            graph[k, [o for o in range(causes) if o != k]] = 1.0 / (causes - 1)
    if len(family) > causes and causes > 1:
        graph[causes, [o for o in range(causes) if o != parent]] = 1.0 / (causes - 1)
    found = _graph_adjusted(np.array([p for _, _, p in family]), weights, graph)
    adjusted = {(kind, i): float(p) for (kind, i, _), p in zip(family, found, strict=True)}
    effects = [
        e.model_copy(
            update={
                "p": adjusted[("effect", i)],
                "p_single": e.p,
                "distinguishable": adjusted[("effect", i)] < ALPHA,
            }
        )
        if ("effect", i) in adjusted
        else e
        for i, e in enumerate(effects)
    ]
    confounds = [
        c.model_copy(
            update={"joint_p": adjusted[("group", i)], "moves_curve": adjusted[("group", i)] < ALPHA}
        )
        if ("group", i) in adjusted
        else c
        for i, c in enumerate(confounds)
    ]
    return effects, confounds, adjusted.get(("step", 0), None if step is None else 1.0)


def _confounds(
    groups: list[list[str]],
    terms: dict[str, list[int]],
    information: dict[str, float],
    correlations: dict[frozenset[str], float],
    joint: object,
) -> list[Confound]:
    """Each group of causes not separable here, with the joint test of all their terms."""
    found = []
    for members in groups:
        pairs = [frozenset({a, b}) for i, a in enumerate(members) for b in members[i + 1 :]]
        strongest = max(pairs, key=lambda p: abs(correlations.get(p, 0.0)))
        indices = [i for m in members for i in terms.get(m, [])]  # one not estimable has no terms
        p = joint(indices)  # type: ignore[operator]
        # All three together: the one design that moves each apart from the others.
        every = len(members) == len(NAMES)
        fixes = [_FIXES[_ALL]] if every else sorted({_FIXES[p] for p in pairs if p in _FIXES})
        found.append(
            Confound(
                effects=tuple(members),
                correlation=correlations.get(strongest),
                information=min(information.get(m, 0.0) for m in members),
                terms=len(indices),
                joint_p=p,
                moves_curve=p < ALPHA,
                fix="; or ".join(fixes),
            )
        )
    return found


def _graph_adjusted(p: Floats, weights: Floats, graph: Floats) -> Floats:
    """Adjusted p-values of a sequentially rejective weighted Bonferroni procedure given by `weights` (each
    hypothesis's share of the level) and `graph` (where a rejected one's share goes): Bretz et al. (2009),
    algorithm 2. Holm's procedure is equal weights and every share split evenly among the rest."""
    left = list(range(p.size))
    w, g = weights.astype(np.float64).copy(), graph.astype(np.float64).copy()
    found = np.ones(p.size)
    running = 0.0
    while left:
        ratios = [p[i] / w[i] if w[i] > 0 else np.inf for i in left]
        j = left[int(np.argmin(ratios))]
        running = max(running, min(1.0, float(min(ratios))))
        found[j] = running
        left.remove(j)
        new_w, new_g = w.copy(), np.zeros_like(g)
        for a in left:
            new_w[a] = w[a] + w[j] * g[j, a]
            for b in left:
                denominator = 1.0 - g[a, j] * g[j, a]
                if a != b and denominator > 0:
                    new_g[a, b] = (g[a, b] + g[a, j] * g[j, b]) / denominator
        w, g = new_w, new_g
    return found
