"""The words `posbias explain` prints: each cause's reading in the table (`Effect.reading`, `rules_out`)
and the verdict, both written from the same fields of the fit (`service/stats/explain.py`), so that they never
disagree."""

from __future__ import annotations

from collections.abc import Sequence

from posbias.schemas import Interval
from posbias.schemas.explanation import Confound, Effect, WindowStep, listed

MATERIAL = 0.10
"""A cause whose intervals rule out every change beyond this (10 points, a third of the seed's first-to-last
gap) reads "no effect larger than +/-X"; one whose intervals reach past it reads "cannot tell"."""


def read(effect: Effect, confounds: Sequence[Confound]) -> Effect:
    """The effect with its `reading` and `rules_out` filled in: the words the table and the verdict share."""
    if effect.status != "estimated" or effect.effect is None:
        return effect
    if not effect.separable:
        others = next((c.effects for c in confounds if effect.name in c.effects), ())
        rest = listed([o for o in others if o != effect.name]) or "the other causes"
        return effect.model_copy(update={"reading": f"not separable from {rest}"})
    if effect.distinguishable:
        return effect.model_copy(update={"reading": "moves the curve"})
    bound = _bound(effect)
    unit = " per 1,000 tokens" if effect.name == "token distance" else ""
    if bound < MATERIAL:
        reading = f"no effect larger than +/-{100 * bound:.1f} points{unit}"
    else:
        reading = f"cannot tell (effects up to +/-{100 * bound:.1f} points{unit} fit the data)"
    return effect.model_copy(update={"rules_out": bound, "reading": reading + _unnamed(effect)})


def _unnamed(effect: Effect) -> str:
    """Why an interval that leaves out 0 does not name its cause: the cause is judged by the joint test of
    all its terms, Holm-adjusted over the causes, and that test is not significant."""
    leaves_out = [
        i for i in (effect.effect, effect.bend) if i is not None and i.low is not None and i.high is not None
    ]
    if not any(i.low > 0 or i.high < 0 for i in leaves_out):  # type: ignore[operator]
        return ""
    p = f" (p {effect.p:.2g} after Holm's adjustment)" if effect.p is not None else ""
    terms = f"{effect.terms} terms" if effect.terms else "terms"
    return f"; its interval leaves out 0, but the joint test of its {terms} is not significant{p}"


def alone(effect: Effect) -> Effect:
    """A cause not separable here without summaries of its own: the fit can only extrapolate them (at an
    information of 0.2 it fits a first-to-last change of 120 points); its group's joint test judges it."""
    if effect.status != "estimated" or effect.separable:
        return effect
    return effect.model_copy(update={"effect": None, "bend": None, "bend_at": None, "span": None})


def _bound(effect: Effect) -> float:
    bounds = [0.0]
    for interval in (effect.effect, effect.bend):
        if interval is not None and interval.low is not None and interval.high is not None:
            bounds += [abs(interval.low), abs(interval.high)]
    return max(bounds)


def verdict(effects: Sequence[Effect], confounds: Sequence[Confound], window: WindowStep | None) -> str:
    """The verdict: the causes that move the curve, the groups not separable here with the design that
    would separate them, what is ruled out, what more iterations would settle, and the window's step."""
    parts = []
    moving = [e for e in effects if e.reading == "moves the curve"]
    if moving:
        parts.append("Moves the curve: " + "; ".join(_describe(e, window) for e in moving) + ".")
    for c in confounds:
        names = c.named
        if c.moves_curve:
            parts.append(
                f"{names[0].upper() + names[1:]} together move the curve (p = {c.joint_p:.2g}, "
                f"{c.terms} terms), and this design cannot say which: use {c.fix}."
            )
        else:
            parts.append(
                f"{names[0].upper() + names[1:]} (not separable here) do not move the curve together "
                f"(p = {c.joint_p:.2g}); to tell them apart use {c.fix}."
            )
    cleared = [e for e in effects if e.reading.startswith("no effect")]
    if cleared:
        parts.append("; ".join(f"{e.name}: {e.reading}" for e in cleared).capitalize() + ".")
    unknown = [e for e in effects if e.reading.startswith("cannot tell")]
    if unknown:
        parts.append(
            "; ".join(f"{e.name}: {e.reading}" for e in unknown).capitalize()
            + ": more iterations would narrow it."
        )
    for e in effects:
        if e.status != "estimated" and e.note:
            parts.append(e.note[0].upper() + e.note[1:] + ".")
    if window is not None:
        parts.append(_window_sentence(window))
    return " ".join(parts) if parts else "Nothing to say: no cause could be estimated."


def _describe(effect: Effect, window: WindowStep | None) -> str:
    found = f"{effect.name} ({_pp(effect.effect)} {effect.unit}"
    if effect.bend is not None and _excludes_zero(effect.bend):
        shape = "a U, lowest in the middle" if (effect.bend.estimate or 0) < 0 else "highest in the middle"
        found += f"; the middle {_pp(effect.bend)} against the ends: {shape}"
    if effect.name == "token distance" and window is not None and window.found:
        found += f"; a step {window.direction} of {_pp(window.jump, sign=False)} at the window"
    return found + f"; joint test of {effect.terms} terms p = {effect.p:.2g})"


def _window_sentence(window: WindowStep) -> str:
    if not window.tested:
        return f"Sliding window ({window.window:,} tokens) not tested: {window.note}."
    if not window.found or window.jump is None:
        ruled = f": no step larger than +/-{100 * window.rules_out:.1f} points" if window.rules_out else ""
        return f"No step at the sliding window ({window.window:,} tokens) beyond a smooth decay{ruled}."
    where = ""
    if window.break_interval is not None:
        low, high = window.break_interval
        if window.informative:
            at = "at the window" if window.window_in_interval else "not at the window"
            where = (
                f"; the data put it between {window.break_low:,} and {window.break_high:,} tokens "
                f"(95% CI {low:,.0f} to {high:,.0f}): {at}"
            )
        else:
            where = (
                f"; where it is the data cannot say (95% CI {low:,.0f} to {high:,.0f} tokens, wide against "
                "the window)"
            )
    up = "; a step up is not what a sliding window does" if window.direction == "up" else ""
    return (
        f"A step {window.direction} at the sliding window ({window.window:,} tokens): {_pp(window.jump)} "
        f"beyond it, over a smooth decay (p = {window.p:.2g}){where}{up}."
    )


def _excludes_zero(interval: Interval) -> bool:
    return (interval.low is not None and interval.low > 0) or (
        interval.high is not None and interval.high < 0
    )


def _pp(interval: Interval | None, *, sign: bool = True) -> str:
    if interval is None or interval.estimate is None:
        return "n/a"
    value = 100 * interval.estimate
    return f"{value:+.1f} points" if sign else f"{abs(value):.1f} points"
