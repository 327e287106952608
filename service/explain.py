"""Which of position, answer slot and token distance moves a curve, and whether the sliding window puts a step
in it: the analysis behind `posbias explain`.

In the seed's design the three move together: question 1 is first in the prompt, farthest from its answer
and answered first. Designs pull them apart (a random answer order moves the slot, filler moves the distance),
and this module fits correctness on all three at once so that each is judged with the others held fixed:

- **One fit.** Least squares of correctness (parsed answers) on relative position (0 first, 1 last),
  relative answer slot (the same) and token distance (per 1,000 tokens), with question difficulty as a
  covariate (`regression.difficulty`, as in `regression.position_regression`; left out when rotation or a
  filler sweep shows each set several times), errors clustered by trial or sampled set, t with clusters - 1
  degrees of freedom (statsmodels). An effect is *distinguishable from zero* when its 95% interval excludes
  zero. The rows it fits are `service/causes.py`'s.
- **What the design cannot separate.** A variable the design does not vary is *held fixed* (a probe's slot);
  one that is an exact linear function of another is *not estimable* (slot and position in forward or reverse
  order) and is left out of the fit; two whose correlation over the answers is 0.95 or more are *confounded*
  (position and distance without filler): each one's interval is then mostly the other's, so the verdict
  names them together, with a joint Wald test, and says which design would separate them.
- **The window.** For a model with a sliding window, a step at the window on the distance axis against a
  smooth decay, and where the data put it (`service/window_step.py`).

`benchmarks/coverage.py` checks every interval here by simulation with fakes driven by each cause.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from posbias.schemas import Interval, ModelInfo
from posbias.schemas.explanation import Confound, Effect, Explanation, WindowStep
from posbias.service.causes import ALPHA, NAMES, PER_TOKENS, Answers, answers
from posbias.service.trial_data import TrialData
from posbias.service.window_step import BREAK_RESAMPLES, window_step

CONFOUNDED = 0.95
"""Correlation (absolute) at which two causes count as moved together by the design: they share 90% of
their variance, and each one's interval is about three times as wide as in a design that separates them."""
LOCKSTEP = 1e-6
"""A cause whose variance left after the causes before it is below this share moves in lockstep with them."""
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


def explain_curve(
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
    window = window_step(rows, kept=kept, info=info, resamples=resamples, seed=seed) if info else None
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
