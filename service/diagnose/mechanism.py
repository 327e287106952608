"""The mechanism line of a diagnosis: where the attention goes, from the battery's `hf` jobs (one plain, one
with a position gap, the same trials) and the same trials answered on the battery's engine (`scored`: an hf
job teacher-forces its answer sheet, so its own answers say nothing of the model).

- **Sliding window.** explain's attention section of the plain job: a sliding layer puts exactly no
  attention on a question a window or more back (`sliding_beyond_max`, the largest head, 0: the mask), and
  whether the own-question attention the sliding layers carry predicts correctness at a fixed position (the
  sliding layers' AUROC, within (batch size, position) cells, against the scored job's answers, with its 95%
  bootstrap-by-trial interval). Ruled out when the interval lies within 0.5 +/- `AUROC_BOUND` (attention
  that predicts next to nothing, whether or not its interval leaves out 0.5); else implicated when it lies
  above 0.5 (the attention the window takes away is attention the answers need).
- **RoPE distance decay.** The gap job against the plain one, paired by (trial, position, layer): the
  percent change of the global layers' own-question attention (`service/stats/attention_gap.py`, a 95%
  bootstrap-by-trial interval). The gap lengthens every RoPE distance and leaves tokens and the window's mask
  alone, so ruled out when the interval lies within +/-`GAP_BOUND` percent (a change too small to matter,
  even where it is not zero); else implicated when it lies below 0 (RoPE distance takes attention off the
  question).
- Answer slot, position and an option collapse: attention by layer kind has no lever on them (not tested).

Both intervals' coverage is checked by simulation (`benchmarks/mechanism_coverage.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from posbias.schemas import Interval
from posbias.schemas.attention import AttentionAuroc, AttentionExplanation, LayerKind
from posbias.schemas.diagnosis import Battery, BatteryJob, Call, Finding, Line, Suspect
from posbias.service.stats import attention_explain, attention_gap
from posbias.service.store import Database
from posbias.workers import engines

AUROC_BOUND = 0.1
"""AUROC: attention that predicts correctness within 0.5 +/- this predicts next to nothing (0.6 is a weak
predictor; a correct answer's attention outranks a wrong one's 6 times in 10)."""
GAP_BOUND = 10.0
"""Percent: a position gap that moves the global layers' own-question attention by less than this leaves
the question's share where it was."""
MEASURE_WINDOW = "sliding layers' own-question attention predicting correctness, AUROC within position (hf)"
MEASURE_ROPE = "position gap against none: global layers' own-question attention, paired by trial (hf)"


@dataclass(frozen=True)
class MechanismEvidence:
    """What the battery's mechanism jobs say: the plain hf job's attention section (scored against the
    answers of the same trials) and the gap job's change of the global layers' attention."""

    plain_job: int
    """The hf job without a gap."""
    attention: AttentionExplanation | None
    """explain's attention section of the plain job; None when it recorded no attention."""
    gap_job: int | None = None
    """The hf job with a position gap; None when the battery has none."""
    gap: attention_gap.GapChange | None = None
    """The gap job against the plain one; None without a gap job, or when their trials differ."""
    position_gap: int | None = None
    """The gap in tokens."""


def _roles(battery: Battery) -> dict[str, BatteryJob]:
    """The battery's mechanism jobs by role: `plain` and `gap` (hf, recording attention), `scored`."""
    found: dict[str, BatteryJob] = {}
    for job in battery.jobs:
        if job.line is not Line.mechanism:
            continue
        if not engines.declared(str(job.spec.engine.name)).records_attention:
            found["scored"] = job
        elif job.spec.engine.position_gap:
            found["gap"] = job
        else:
            found["plain"] = job
    return found


def gather(db: Database, battery: Battery, job_ids: Mapping[str, int]) -> MechanismEvidence | None:
    """Read the mechanism jobs' attention evidence from the store; None when the battery has no hf job."""
    roles = _roles(battery)
    if "plain" not in roles:
        return None
    plain = job_ids[roles["plain"].key]
    scored = job_ids[roles["scored"].key] if "scored" in roles else None
    attention = attention_explain.explain_pair(db, plain, scored)
    gap_job = job_ids[roles["gap"].key] if "gap" in roles else None
    gap = attention_gap.read_gap_change(db, plain, gap_job) if gap_job is not None else None
    return MechanismEvidence(
        plain_job=plain,
        attention=attention,
        gap_job=gap_job,
        gap=gap,
        position_gap=roles["gap"].spec.engine.position_gap if "gap" in roles else None,
    )


def finding(suspect: Suspect, evidence: MechanismEvidence | None, *, window: int | None) -> Finding:
    """What the mechanism line says of `suspect` (`window`: the model's sliding window, None without)."""
    if evidence is None:
        return Finding(
            line=Line.mechanism,
            call=Call.not_tested,
            measure="attention by layer kind",
            reason="no hf job in the battery (the fake engine records no attention, or the model is too big)",
        )
    if suspect is Suspect.window:
        return _window(evidence, window=window)
    if suspect is Suspect.rope:
        return _rope(evidence)
    return Finding(
        line=Line.mechanism,
        call=Call.not_tested,
        measure="attention by layer kind (hf)",
        reason=f"attention by layer kind tests the window and RoPE; it has no lever on the {suspect.value}",
    )


def _sliding_auroc(attention: AttentionExplanation) -> AttentionAuroc | None:
    return next((a for a in attention.aurocs if a.layer_kind is LayerKind.sliding), None)


def _window(evidence: MechanismEvidence, *, window: int | None) -> Finding:
    attention = evidence.attention
    ids = (evidence.plain_job,) + (
        (attention.scored_job_id,) if attention and attention.scored_job_id else ()
    )

    def cannot(reason: str, *, settle: str | None = None, effect: Interval | None = None) -> Finding:
        return Finding(
            line=Line.mechanism,
            call=Call.cannot_tell,
            measure=MEASURE_WINDOW,
            effect=effect,
            unit="AUROC",
            reason=reason,
            settle=settle,
            job_ids=ids,
        )

    if window is None:
        return Finding(
            line=Line.mechanism,
            call=Call.not_tested,
            measure=MEASURE_WINDOW,
            reason="the model has no sliding window",
            job_ids=ids,
        )
    if attention is None:
        return cannot(
            f"hf job {evidence.plain_job} recorded no attention",
            settle=f"look at `posbias status {evidence.plain_job}`: its shards' errors say why",
        )
    if attention.sliding_beyond_max is None:
        fix = "longer filler in the mechanism jobs moves answers past it"
        return cannot(f"no answer line lies wholly beyond the {window:,}-token window", settle=fix)
    if attention.sliding_beyond_max > 0:
        return cannot(
            f"the sliding layers put {attention.sliding_beyond_max:.2g} of a head's attention on a question "
            f"beyond the {window:,}-token window: not the mask the config states",
            settle="check the model's mask canary (`attention_layers`) against its config",
        )
    auroc = _sliding_auroc(attention)
    if auroc is None or auroc.auroc is None:
        why = attention.note or "no position has both correct and wrong answers"
        return cannot(f"attention cannot be scored: {why}", settle=why)
    effect = Interval(estimate=auroc.auroc, low=auroc.low, high=auroc.high)
    if auroc.low is None or auroc.high is None:
        return cannot(
            f"AUROC {auroc.auroc:.2f} over {auroc.trials} trials: too few for an interval", effect=effect
        )
    scored = f"job {attention.scored_job_id}'s answers, {auroc.trials} trials"
    lost = f"which they lose beyond the {window:,}-token window (largest head there: 0)"
    widest = max(abs(auroc.low - 0.5), abs(auroc.high - 0.5))
    if widest <= AUROC_BOUND:  # first: an interval this close to 0.5 says "next to nothing", even off it
        return Finding(
            line=Line.mechanism,
            call=Call.ruled_out,
            measure=MEASURE_WINDOW,
            effect=effect,
            unit="AUROC",
            bound=widest,
            reason=f"the attention the sliding layers carry, {lost}, predicts correctness no better than "
            f"AUROC 0.5 +/- {widest:.2f} ({scored})",
            job_ids=ids,
        )
    if auroc.low > 0.5:
        return Finding(
            line=Line.mechanism,
            call=Call.implicated,
            measure=MEASURE_WINDOW,
            effect=effect,
            unit="AUROC",
            reason=f"own-question attention in the sliding layers, {lost}, predicts correctness at a fixed "
            f"position ({scored})",
            job_ids=ids,
        )
    if auroc.high < 0.5:
        return cannot(
            "more own-question attention goes with wrong answers: not what a window does", effect=effect
        )
    return cannot(f"AUROCs from {auroc.low:.2f} to {auroc.high:.2f} fit the data ({scored})", effect=effect)


def _rope(evidence: MechanismEvidence) -> Finding:
    gap = evidence.gap
    ids = (evidence.plain_job,) + ((evidence.gap_job,) if evidence.gap_job is not None else ())
    if evidence.gap_job is None:
        return Finding(
            line=Line.mechanism,
            call=Call.not_tested,
            measure=MEASURE_ROPE,
            reason="the battery has no position-gap job",
            job_ids=ids,
        )
    if gap is None:
        return Finding(
            line=Line.mechanism,
            call=Call.cannot_tell,
            measure=MEASURE_ROPE,
            unit="%",
            reason="the gap job and the plain one share no global layer's answers (other trials, or no "
            "global layer)",
            settle="hf jobs of the same trials on a model with global layers",
            job_ids=ids,
        )
    effect = Interval(estimate=gap.change, low=gap.low, high=gap.high)
    moved = f"a position gap of {evidence.position_gap or 0:,} tokens"
    what = f"{gap.plain:.4g} -> {gap.gapped:.4g} on average over {gap.trials} trials"

    def found(call: Call, reason: str, *, bound: float | None = None) -> Finding:
        return Finding(
            line=Line.mechanism,
            call=call,
            measure=MEASURE_ROPE,
            effect=effect,
            unit="%",
            bound=bound,
            reason=reason,
            job_ids=ids,
        )

    if gap.low is None or gap.high is None:
        return found(
            Call.cannot_tell, f"{moved}: {gap.change:+.1f}% ({what}): too few trials for an interval"
        )
    widest = max(abs(gap.low), abs(gap.high))
    if widest <= GAP_BOUND:  # first: a change this small does not matter, even where it is not zero
        return found(
            Call.ruled_out,
            f"{moved} changes the global layers' own-question attention by less than +/-{widest:.2g}% "
            f"({what})",
            bound=widest,
        )
    if gap.high < 0:
        return found(
            Call.implicated,
            f"{moved} takes own-question attention off the global layers ({what}): RoPE distance lowers "
            "the attention an answer pays its question",
        )
    if gap.low > 0:
        return found(
            Call.cannot_tell, f"{moved} raises own-question attention ({what}): not what a decay does"
        )
    return found(Call.cannot_tell, f"changes up to +/-{widest:.1f}% fit the data ({what})")
