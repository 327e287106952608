"""A diagnosis read from a done battery: for each suspect, what each line of evidence says of it, from the
analyses posbias already has (`explain` of the behaviour job, `compare` of each variant with the baseline,
options by position), and whether the lines agree.

Every call rests on a 95% interval in accuracy points: `implicated` when it excludes zero in the direction
the suspect acts, `ruled out` when it excludes every effect larger than the line's bound, `cannot tell`
otherwise (with what would settle it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posbias.schemas import BASELINE, Comparison, CurveQuery, Interval, OptionsView
from posbias.schemas.diagnosis import (
    Battery,
    Call,
    Diagnosis,
    Finding,
    Line,
    Suspect,
    SuspectVerdict,
)
from posbias.schemas.explanation import Effect, Explanation
from posbias.service.diagnose import mechanism, settle
from posbias.service.reports import curves
from posbias.service.store import Database

BEHAVIOUR_BOUND = 10.0
"""Points: explain's own bound for `no effect larger than +/-X` (docs/designs.md)."""
INTERVENTION_BOUND = 5.0
"""Points: a variant that moves the whole prompt's accuracy by less than this changes nothing that matters."""
ALONE = 0.05
"""Explain's level, for a grouped cause's own test: position's must be below it to be implicated by
elimination, a third member's at least it not to stand in the way."""
MORE = "more iterations (a larger --budget) would narrow it"
"""The end of a `cannot tell` reason that a larger budget would settle: `settle.settled` replaces it with the
command and what it costs (`Finding.settle`)."""


@dataclass(frozen=True)
class Evidence:
    """What the battery's done jobs say, as posbias's analyses read them: the behaviour job's explanation and
    options by position, and each variant compared with the baseline. `judge` turns it into verdicts; the
    coverage program (`benchmarks/diagnose_coverage.py`) builds it from simulated answers."""

    explanation: Explanation
    options: OptionsView
    compared: Mapping[str, Comparison]
    """Variant name -> the variant minus the baseline, paired (compare)."""
    mechanism: mechanism.MechanismEvidence | None = None
    """The hf jobs' attention (`service/diagnose/mechanism.py`); None without them."""
    tokens_per_trial: float | None = None
    """Mean prompt tokens of the battery's rendered trials: what a larger budget costs."""


def read_diagnosis(db: Database, battery: Battery, job_ids: Mapping[str, int]) -> Diagnosis:
    """The verdicts of `battery`, whose jobs (`job_ids`, by key) are done."""
    return judge(battery, gather(db, battery, job_ids), job_ids)


def gather(db: Database, battery: Battery, job_ids: Mapping[str, int]) -> Evidence:
    """Read the battery's evidence from the store: explain and options of the behaviour job, compare of each
    variant with the baseline, the mechanism jobs' attention."""
    n = battery.batch_size
    by_line = {job.line: job for job in battery.jobs}
    behaviour = job_ids[by_line[Line.behaviour].key]
    (explanation,) = curves.explain(db, [behaviour], batch_size=n)
    (options,) = curves.options(db, [behaviour], batch_size=n)
    intervention = by_line.get(Line.intervention)
    compared = {}
    if intervention is not None:
        job = CurveQuery(job_id=job_ids[intervention.key], variant=BASELINE)
        for name in intervention.spec.names[1:]:
            compared[name] = curves.compare(db, job, job.model_copy(update={"variant": name}), batch_size=n)
    return Evidence(
        explanation=explanation,
        options=options,
        compared=compared,
        mechanism=mechanism.gather(db, battery, job_ids),
        tokens_per_trial=settle.tokens_per_trial(db, job_ids.values()),
    )


def judge(battery: Battery, evidence: Evidence, job_ids: Mapping[str, int]) -> Diagnosis:
    """The verdicts of `battery` from its `evidence` (a pure function: no store)."""
    n = battery.batch_size
    by_line = {job.line: job for job in battery.jobs}
    behaviour = job_ids[by_line[Line.behaviour].key]
    explanation, options = evidence.explanation, evidence.options
    collapse = [r for r in options.readings if "collapse" in r]
    window = battery.facts.sliding_window if battery.facts.sliding_window_layers else None
    effects = {e.name: e for e in explanation.effects}
    behaviour_ids = (behaviour,)

    found: dict[Suspect, list[Finding]] = {
        Suspect.window: [_window_behaviour(explanation, window=window, job_ids=behaviour_ids)],
        Suspect.rope: [_rope_behaviour(explanation, effects.get("token distance"), job_ids=behaviour_ids)],
        Suspect.slot: [_effect_finding(effects.get("answer slot"), job_ids=behaviour_ids)],
        Suspect.position: [_effect_finding(effects.get("position"), job_ids=behaviour_ids)],
        Suspect.collapse: [
            Finding(
                line=Line.behaviour,
                call=Call.implicated if collapse else Call.ruled_out,
                measure="options by position",
                reason="; ".join(collapse)
                if collapse
                else "no position's answers collapse onto one option"
                + (f" ({'; '.join(options.readings)})" if options.readings else ""),
                job_ids=behaviour_ids,
            )
        ],
    }

    intervention = by_line.get(Line.intervention)
    variants = tuple(evidence.compared)
    whole = {name: _whole_prompt(c.blocks, n) for name, c in evidence.compared.items()}
    ids = (job_ids[intervention.key],) if intervention is not None else ()
    window_variants = [v for v in variants if v == "global-only"]
    rope_variants = [(v, +1) for v in variants if v.startswith("rope-base")]
    rope_variants += [(v, -1) for v in variants if v.startswith("gap-")]
    found[Suspect.window].append(
        _intervention([(v, +1) for v in window_variants], whole, job_ids=ids, what="every layer global")
    )
    found[Suspect.rope].append(_intervention(rope_variants, whole, job_ids=ids, what="a RoPE change"))
    found[Suspect.position][0] = _position_alone(
        found[Suspect.position][0],
        explanation,
        distance_lines=(found[Suspect.window][-1], found[Suspect.rope][-1]),
        has_window=window is not None,
        collapse=collapse,
    )
    for suspect in (Suspect.slot, Suspect.position, Suspect.collapse):
        found[suspect].append(
            Finding(
                line=Line.intervention,
                call=Call.not_tested,
                measure="variants",
                reason="no change of the architecture acts on it alone; the behaviour job's design does",
            )
        )

    for suspect, findings in found.items():
        findings.append(mechanism.finding(suspect, evidence.mechanism, window=window))
        findings[:] = [
            settle.settled(
                f,
                battery=battery,
                tokens=evidence.tokens_per_trial,
                bounds={Line.behaviour: BEHAVIOUR_BOUND, Line.intervention: INTERVENTION_BOUND},
                more=MORE,
            )
            for f in findings
        ]

    verdicts = []
    for suspect, findings in found.items():
        if suspect is Suspect.window and window is None:
            verdicts.append(
                SuspectVerdict(
                    suspect=suspect,
                    call=Call.ruled_out,
                    agreement="the config: no layer slides",
                    findings=tuple(findings),
                )
            )
        else:
            verdicts.append(_together(suspect, findings))
    implicated = [v.suspect.value for v in verdicts if v.call is Call.implicated]
    ruled = [v.suspect.value for v in verdicts if v.call is Call.ruled_out]
    summary = (
        (f"implicated: {', '.join(implicated)}" if implicated else "no suspect implicated")
        + (f"; ruled out: {', '.join(ruled)}" if ruled else "")
        + "."
    )
    return Diagnosis(
        model=battery.model,
        batch_size=n,
        job_ids=tuple(job_ids[j.key] for j in battery.jobs),
        suspects=tuple(verdicts),
        summary=summary,
    )


def _points(interval: Interval | None, scale: float = 100.0) -> Interval | None:
    if interval is None or interval.estimate is None:
        return None
    low = None if interval.low is None else interval.low * scale
    high = None if interval.high is None else interval.high * scale
    return Interval(estimate=interval.estimate * scale, low=low, high=high)


def _call(effect: Interval | None, *, bound: float, sign: int) -> tuple[Call, float | None]:
    """Implicated when the interval excludes zero on the suspect's side (`sign`: +1 up, -1 down, 0
    either); ruled out when it lies within +/-`bound`; else cannot tell (with the widest effect it allows)."""
    if effect is None or effect.low is None or effect.high is None:
        return Call.cannot_tell, None
    widest = max(abs(effect.low), abs(effect.high))
    if (sign >= 0 and effect.low > 0) or (sign <= 0 and effect.high < 0):
        return Call.implicated, None
    if widest <= bound:
        return Call.ruled_out, widest
    return Call.cannot_tell, widest


def _window_behaviour(explanation: Explanation, *, window: int | None, job_ids: tuple[int, ...]) -> Finding:
    measure = "step at the window (explain)"
    step = explanation.window
    if window is None or step is None:
        return Finding(
            line=Line.behaviour,
            call=Call.not_tested,
            measure=measure,
            reason="the model has no sliding window",
            job_ids=job_ids,
        )
    if not step.tested:
        return Finding(
            line=Line.behaviour,
            call=Call.cannot_tell,
            measure=measure,
            reason=step.note or "the answers' distances do not straddle the window: add filler",
            job_ids=job_ids,
        )
    jump = _points(step.jump)
    if step.found and step.direction == "down":
        where = (
            f", placed after {step.break_low:,} and by {step.break_high:,} tokens"
            if step.break_low is not None and step.break_high is not None
            else ""
        )
        return Finding(
            line=Line.behaviour,
            call=Call.implicated,
            measure=measure,
            effect=jump,
            reason=f"a step down at the {window:,}-token window (p = {step.p:.2g}){where}",
            job_ids=job_ids,
        )
    call, widest = _call(jump, bound=BEHAVIOUR_BOUND, sign=0)
    if call is Call.implicated:  # an interval that excludes zero the joint test did not confirm
        call = Call.cannot_tell
    return Finding(
        line=Line.behaviour,
        call=call,
        measure=measure,
        effect=jump,
        bound=widest if call is Call.ruled_out else None,
        reason=f"no step at the window larger than +/-{widest:.1f} points"
        if call is Call.ruled_out
        else f"steps up to +/-{widest or 0:.1f} points fit the data: {MORE}",
        job_ids=job_ids,
    )


def _rope_behaviour(explanation: Explanation, effect: Effect | None, *, job_ids: tuple[int, ...]) -> Finding:
    """The smooth part of the distance effect, per 1,000 tokens (the step at the window is the window's)."""
    measure = "smooth decay with token distance, per 1,000 tokens (explain)"
    if effect is None or effect.status != "estimated" or not effect.separable:
        return _unfitted(effect, measure=measure, job_ids=job_ids, prefix="token distance: ")
    change = _points(effect.effect)
    call, widest = _call(change, bound=BEHAVIOUR_BOUND, sign=-1)
    if call is Call.implicated and not effect.distinguishable:
        call = Call.cannot_tell
    if call is Call.cannot_tell and change is not None and change.low is not None and change.low > 0:
        reason = "accuracy rises with distance: not what a decay does"
    elif call is Call.implicated:
        reason = f"accuracy falls with distance (joint test p = {effect.p:.2g})"
    elif call is Call.ruled_out:
        reason = f"no smooth change larger than +/-{widest:.1f} points per 1,000 tokens"
    else:
        reason = f"changes up to +/-{widest or 0:.1f} points per 1,000 tokens fit the data: {MORE}"
    return _behaviour(call, measure=measure, change=change, widest=widest, reason=reason, job_ids=job_ids)


def _effect_finding(effect: Effect | None, *, job_ids: tuple[int, ...]) -> Finding:
    """Position or answer slot: its fitted first-to-last change."""
    name = effect.name if effect is not None else "cause"
    measure = f"{name}, first to last (explain)"
    if effect is None or effect.status != "estimated" or not effect.separable:
        return _unfitted(effect, measure=measure, job_ids=job_ids)
    change = _points(effect.effect)
    call, widest = _call(change, bound=BEHAVIOUR_BOUND, sign=0)
    if call is Call.implicated and not effect.distinguishable:
        call = Call.cannot_tell  # the joint test, Holm-adjusted, decides what moves the curve
    if call is Call.cannot_tell and effect.distinguishable:
        call = Call.implicated
    reason = {
        Call.implicated: f"moves the curve (joint test of {effect.terms} terms, p = {effect.p or 0:.2g})",
        Call.ruled_out: f"no effect larger than +/-{widest or 0:.1f} points",
        Call.cannot_tell: f"effects up to +/-{widest or 0:.1f} points fit the data: {MORE}",
    }[call]
    return _behaviour(call, measure=measure, change=change, widest=widest, reason=reason, job_ids=job_ids)


def _position_alone(
    finding: Finding,
    explanation: Explanation,
    *,
    distance_lines: tuple[Finding, Finding],
    has_window: bool,
    collapse: Sequence[str],
) -> Finding:
    """Position's behaviour finding, read with what the other lines say.

    - Where options read a collapse onto one option at some positions, those positions' answers are wrong
      whatever position does, so a position effect cannot be told from the collapse (`cannot tell`).
    - Where the design leaves position and token distance in one group (filler at two lengths separates
      them only partly: their information near explain's threshold) and that group moves the curve, the
      intervention line decides between them: when every variant that acts through distance (global-only,
      a RoPE change, a position gap) rules its suspect out, and position's own terms move the curve (their
      joint test in the fit, unadjusted), what moves the group is position."""
    if collapse:
        if finding.call is not Call.implicated:
            return finding
        return finding.model_copy(
            update={
                "call": Call.cannot_tell,
                "reason": f"{finding.reason}; but answers collapse onto one option ({'; '.join(collapse)}), "
                "which lowers those positions' accuracy whatever their position",
            }
        )
    effects = {e.name: e for e in explanation.effects}
    pair = {"position", "token distance"}
    group = next(
        (
            c
            for c in explanation.confounds
            if c.moves_curve
            and pair <= set(c.effects)
            # A third member (the answer slot) in the group only because position's information is low
            # given all the others: separable from each, and its own test does not say it moves the curve.
            and all(_apart(effects.get(m), explanation.threshold) for m in set(c.effects) - pair)
        ),
        None,
    )
    window_line, rope_line = distance_lines
    ruled = rope_line.call is Call.ruled_out and (window_line.call is Call.ruled_out or not has_window)
    # Position's own test too: once another cause is named, Holm tests the group at the whole 5%, so the
    # group alone would implicate position falsely at up to 5% (6.0% of 200 diagnoses of a slot truth).
    position = effects.get("position")
    own = position is not None and position.p is not None and position.p < ALONE
    if finding.call is not Call.cannot_tell or group is None or not ruled or not own:
        return finding
    return finding.model_copy(
        update={
            "call": Call.implicated,
            "reason": f"position and token distance together move the curve (joint test p = "
            f"{group.joint_p or 0:.2g}; position's own terms p = {position.p if position else 0:.2g}), and "
            "the variants rule out what acts through distance "
            f"({'; '.join(f.reason for f in (window_line, rope_line) if f.call is Call.ruled_out)})",
        }
    )


def _apart(effect: Effect | None, threshold: float | None) -> bool:
    """A cause in a group that is separable on its own and whose own joint test (unadjusted) does not
    reject: it does not move the group."""
    return (
        effect is not None
        and effect.information is not None
        and effect.information >= (threshold or 0.0)
        and effect.p is not None
        and effect.p >= ALONE
    )


def _unfitted(effect: Effect | None, *, measure: str, job_ids: tuple[int, ...], prefix: str = "") -> Finding:
    """Cannot tell: explain did not fit the cause apart (held fixed, in lockstep, not separable, no fit)."""
    why = (effect.note or effect.reading) if effect is not None else "not fitted"
    return Finding(
        line=Line.behaviour, call=Call.cannot_tell, measure=measure, reason=f"{prefix}{why}", job_ids=job_ids
    )


def _behaviour(
    call: Call,
    *,
    measure: str,
    change: Interval | None,
    widest: float | None,
    reason: str,
    job_ids: tuple[int, ...],
) -> Finding:
    """A behaviour finding from explain's fitted change: its bound where it rules the suspect out."""
    return Finding(
        line=Line.behaviour,
        call=call,
        measure=measure,
        effect=change,
        bound=widest if call is Call.ruled_out else None,
        reason=reason,
        job_ids=job_ids,
    )


def _whole_prompt(blocks: Sequence[object], n: int) -> Interval | None:
    """The difference over every position (the block 1..N), in points, with the family's band."""
    for block in blocks:
        first, last = getattr(block, "first_position", None), getattr(block, "last_position", None)
        if first == 1 and last == n and getattr(block, "diff", None) is not None:
            return _points(
                Interval(
                    estimate=getattr(block, "diff", None),
                    low=getattr(block, "band_low", None),
                    high=getattr(block, "band_high", None),
                )
            )
    return None


def _intervention(
    variants: Sequence[tuple[str, int]],
    whole: Mapping[str, Interval | None],
    *,
    job_ids: tuple[int, ...],
    what: str,
) -> Finding:
    """Each variant's change of the whole prompt's accuracy against the baseline (paired): implicated when
    one moves it the way the suspect predicts (+1 up, -1 down), ruled out when none moves it beyond the
    bound."""
    if not variants:
        return Finding(
            line=Line.intervention,
            call=Call.not_tested,
            measure="variants",
            reason=f"the config allows no variant that makes {what}",
            job_ids=job_ids,
        )
    calls = []
    for name, sign in variants:
        call, widest = _call(whole.get(name), bound=INTERVENTION_BOUND, sign=sign)
        calls.append((name, call, widest, whole.get(name)))
    hit = [c for c in calls if c[1] is Call.implicated]
    if hit:
        name, _, _, effect = hit[0]
        return Finding(
            line=Line.intervention,
            call=Call.implicated,
            measure=f"{name} minus baseline, whole prompt (compare, paired)",
            effect=effect,
            reason=f"{name} moves accuracy as the suspect predicts (the family's 95% band excludes 0)",
            job_ids=job_ids,
            variant=name,
        )
    name, call, widest, effect = max(calls, key=lambda c: c[2] or 0.0)
    if all(c[1] is Call.ruled_out for c in calls):
        return Finding(
            line=Line.intervention,
            call=Call.ruled_out,
            measure=f"{', '.join(n for n, *_ in calls)} minus baseline, whole prompt (compare, paired)",
            effect=effect,
            bound=widest,
            reason=f"no variant changes accuracy by more than +/-{widest or 0:.1f} points",
            job_ids=job_ids,
            variant=name,
        )
    return Finding(
        line=Line.intervention,
        call=Call.cannot_tell,
        measure=f"{name} minus baseline, whole prompt (compare, paired)",
        effect=effect,
        reason=f"changes up to +/-{widest or 0:.1f} points fit the data, or one against the suspect's "
        f"direction: {MORE}",
        job_ids=job_ids,
        variant=name,
    )


def _together(suspect: Suspect, findings: Sequence[Finding]) -> SuspectVerdict:
    decided = [f for f in findings if f.call in (Call.implicated, Call.ruled_out)]
    calls = {f.call for f in decided}
    if not decided:
        return SuspectVerdict(
            suspect=suspect, call=Call.cannot_tell, agreement="no line decides", findings=tuple(findings)
        )
    lines = ", ".join(f"{f.line.value} {f.call.value}" for f in decided)
    if len(calls) == 1:
        (call,) = calls
        agree = f"{len(decided)} line{'s agree' if len(decided) > 1 else ' decides'}: {lines}"
        return SuspectVerdict(suspect=suspect, call=call, agreement=agree, findings=tuple(findings))
    return SuspectVerdict(
        suspect=suspect,
        call=Call.cannot_tell,
        agreement=f"the lines disagree: {lines}",
        findings=tuple(findings),
    )
