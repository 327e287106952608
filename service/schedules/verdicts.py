"""Verdicts: every decision about a schedule's checkpoint. Whether its job's state settles it (`error`,
`pending`), which checkpoint is its baseline, whether it is the baseline, how it compares with the
baseline's job by the schedule's `RegressionRule` (`pass`, `regression`, `inconclusive`), when an `error` is
reopened, and which schedules stand on a regression (the CI gate).

At each batch size the two jobs are compared with the stratified cluster bootstrap of
`service/stats/comparison.py`: paired over matched trials (same questions at the same positions, which is what
a schedule's checkpoints share), unpaired for the rest. Three checks, each asked one-sidedly where the
question is one-sided:

- drop: accuracy (among parsed answers) at every position and over blocks of positions (a tenth, a fifth,
  a half of the prompt, and all of it, at every start): a regression where the change is below `-max_drop`
  and its simultaneous one-sided upper bound (max-t over the whole family) is below zero. The blocks give
  power for drops that span several positions, which no single position has the answers to show; the
  reason cites the flagged member that best fits the drop (the whole curve for a uniform drop).
- shift: the last-minus-first contrast's change, either direction, beyond `max_shift` with its interval
  excluding zero (symmetric: recency and primacy alike).
- parse: the parse rate, as the drop check, beyond `max_parse_drop`, over every position with at least
  `MIN_ANSWERS` answers (parsed or not) in both jobs: a position whose answers stopped parsing has too few
  parsed answers to judge its accuracy, and that is exactly what this check must see (a collapse of the end
  of the answer sheet fails it).

Positions left out of a check are named in the verdict's note, and in the reason of a `pass`.

The rule's confidence is split (Bonferroni) over the checks made and the batch sizes, so a checkpoint as good
as its baseline is flagged with probability at most 1 - confidence. `benchmarks/coverage.py` measures that
rate and the power to catch a given drop.

Reads checkpoints, jobs and finished jobs' results from the store and writes nothing:
`service/schedules/scheduler.py` asks for each pending checkpoint's verdict and records it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from posbias.schemas import BASELINE, FINISHED_JOB_STATUSES, JobStatus, NotFoundError
from posbias.schemas.schedule import (
    BaselineKind,
    BatchSizeVerdict,
    PositionDrop,
    RegressionRule,
    ShiftChange,
    Verdict,
    VerdictDetail,
)
from posbias.service.schedules.schedule_rows import CheckpointRecord, ScheduleRecord, list_checkpoints
from posbias.service.stats import (
    BLOCK_FRACTIONS,
    BOOTSTRAP_RESAMPLES,
    DIFF,
    DIFF_OF_DIFFS,
    Floats,
    TrialData,
    blocks,
    comparison,
    diff_band,
    percentile,
    queries,
    resample_pair,
)
from posbias.service.store import Database
from posbias.service.work import jobs

MIN_ANSWERS = comparison.MIN_ANSWERS
"""Fewer parsed answers than this at a position (in either job) leave that position out of the accuracy
checks, and fewer answers (parsed or not) out of the parse check: an interval at n < 20 is about +-20 points
wide, too wide for a `pass` to mean anything."""
__all__ = ["BLOCK_FRACTIONS", "MIN_ANSWERS", "blocks", "compare_jobs", "judge", "judge_checkpoint"]


@dataclass(frozen=True)
class Outcome:
    """A comparison of two finished jobs under a rule."""

    verdict: Verdict
    reason: str
    comparisons: int
    batch_sizes: list[BatchSizeVerdict]


def compare_jobs(db: Database, *, baseline_job: int, candidate_job: int, rule: RegressionRule) -> Outcome:
    """Judge `candidate_job` against `baseline_job` at every batch size they share, variant by variant (a
    schedule whose template has variants watches each: a checkpoint's `global-only` against the baseline
    checkpoint's `global-only`, and so on)."""
    base_variants = queries.variants_of(db, job_ids=[baseline_job])
    cand_variants = set(queries.variants_of(db, job_ids=[candidate_job]))
    pairs = []
    for variant in [v for v in base_variants if v in cand_variants]:
        base_sizes = set(queries.batch_sizes(db, job_ids=[baseline_job], variant=variant))
        cand_sizes = set(queries.batch_sizes(db, job_ids=[candidate_job], variant=variant))
        pairs += [(variant, n) for n in sorted(base_sizes & cand_sizes)]
    if not pairs:
        return Outcome(
            verdict=Verdict.inconclusive,
            reason=f"no batch size in common: baseline job {baseline_job} has "
            f"{_shape(db, baseline_job)}, candidate {_shape(db, candidate_job)}",
            comparisons=0,
            batch_sizes=[],
        )
    data = {
        (variant, n): (
            queries.trial_data(db, job_ids=[baseline_job], batch_size=n, variant=variant),
            queries.trial_data(db, job_ids=[candidate_job], batch_size=n, variant=variant),
        )
        for variant, n in pairs
    }
    checks = [pair for pair in pairs if _usable(*data[pair])]
    parts = (rule.max_drop is not None) + 1 + (rule.max_shift is not None)
    comparisons = max(1, len(checks) * parts)
    alpha = (1 - rule.confidence) / comparisons
    verdicts = [
        judge(*data[pair], rule=rule, alpha=alpha).model_copy(update={"variant": pair[0]}) for pair in pairs
    ]
    verdict, reason = _overall(verdicts, rule=rule)
    return Outcome(verdict=verdict, reason=reason, comparisons=comparisons, batch_sizes=verdicts)


def _shape(db: Database, job_id: int) -> str:
    """A job's batch sizes per variant, for messages: `[1, 10]` or `baseline [1, 10], global-only [10]`."""
    variants = queries.variants_of(db, job_ids=[job_id])
    sizes = {v: queries.batch_sizes(db, job_ids=[job_id], variant=v) for v in variants}
    if variants == [BASELINE]:
        return str(sizes[BASELINE])
    return ", ".join(f"{v} {sizes[v]}" for v in variants) or "no results"


def _usable(base: TrialData, cand: TrialData) -> bool:
    return bool(_positions(base, cand, of="answered"))


def _positions(base: TrialData, cand: TrialData, *, of: str = "parsed") -> list[int]:
    """0-based positions with at least `MIN_ANSWERS` answers in both jobs: parsed ones (what the accuracy
    checks need), or any (`of="answered"`: what the parse check needs)."""
    counts = np.minimum(getattr(base, of).sum(axis=0), getattr(cand, of).sum(axis=0))
    return [p for p in range(base.batch_size) if counts[p] >= MIN_ANSWERS]


def spans(positions: Iterable[int]) -> str:
    """0-based positions as 1-based runs: `41-50`, `3, 7-9`."""
    runs: list[tuple[int, int]] = []
    for p in sorted(positions):
        if runs and p == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], p)
        else:
            runs.append((p, p))
    return ", ".join(f"{a + 1}" if a == b else f"{a + 1}-{b + 1}" for a, b in runs)


def judge(
    base: TrialData,
    cand: TrialData,
    *,
    rule: RegressionRule,
    alpha: float,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> BatchSizeVerdict:
    """The checks of `rule` at one batch size, each at one-sided level `alpha` (simultaneous over its
    family)."""
    n = base.batch_size
    kept = set(_positions(base, cand))
    answered = set(_positions(base, cand, of="answered"))
    if not answered:
        return BatchSizeVerdict(
            batch_size=n,
            positions=0,
            worst_drop=None,
            drop_flagged=False,
            note=f"fewer than {MIN_ANSWERS} answers at every position in one of the jobs",
        )
    matching, rb, rc = resample_pair(base, cand, resamples=resamples, seed=seed)
    df = matching.df
    drop, drop_flagged = None, False
    if kept:
        family = [range(a, b) for a, b in blocks(n) if set(range(a, b)) <= kept]
        drop, drop_flagged = _one_sided(
            rb.accuracy(family),
            rc.accuracy(family),
            family,
            counts=(rb.counts(family)[0], rc.counts(family)[0]),
            limit=rule.max_drop,
            alpha=alpha,
            df=df,
        )
    parse_family = [range(a, b) for a, b in blocks(n) if set(range(a, b)) <= answered]
    parse, parse_flagged = _one_sided(
        rb.parse_rate(parse_family),
        rc.parse_rate(parse_family),
        parse_family,
        counts=(rb.counts(parse_family)[1], rc.counts(parse_family)[1]),
        limit=rule.max_parse_drop,
        alpha=alpha,
        df=df,
    )
    shift = None
    if rule.max_shift is not None and n > 1 and {0, n - 1} <= kept:
        shift = _shift(rb.accuracy(), rc.accuracy(), limit=rule.max_shift, alpha=alpha, df=df)
    notes = []
    if len(kept) < n:
        notes.append(
            f"accuracy not judged at positions {spans(set(range(n)) - kept)} "
            f"(fewer than {MIN_ANSWERS} parsed answers)"
            if kept
            else f"accuracy not judged: fewer than {MIN_ANSWERS} parsed answers at every position"
        )
    if len(answered) < n:
        notes.append(
            f"parse rate not judged at positions {spans(set(range(n)) - answered)} "
            f"(fewer than {MIN_ANSWERS} answers)"
        )
    return BatchSizeVerdict(
        batch_size=n,
        positions=len(kept),
        method=matching.method,
        matched_trials=len(matching.pairs),
        worst_drop=drop,
        drop_flagged=drop_flagged,
        shift=shift,
        parse_drop=parse,
        parse_flagged=parse_flagged,
        note="; ".join(notes) or None,
    )


def _one_sided(
    base: Floats,
    cand: Floats,
    family: Sequence[range],
    *,
    counts: tuple[Floats, Floats],
    limit: float | None,
    alpha: float,
    df: int,
) -> tuple[PositionDrop | None, bool]:
    """The family's changes with simultaneous one-sided bounds (`diff_band`: inside +-1); of the flagged
    drops the one that best fits the change (`comparison.best_fit`: a uniform drop is the whole curve's, a
    local one its block's, not the position whose noise dropped most), else the place where the data allow
    the largest drop; and whether any was flagged."""
    diff = cand - base
    band = diff_band(base, cand, counts=counts, level=1 - alpha, one_sided="upper", df=df)
    upper = band.high
    lower = -diff_band(cand, base, counts=counts[::-1], level=1 - alpha, one_sided="upper", df=df).high
    drops: list[PositionDrop | None] = []
    for k, positions in enumerate(family):
        d = float(diff[0, k])
        if not np.isfinite(d):
            drops.append(None)
            continue
        flagged = limit is not None and -d > limit / 100 and upper[k] < 0
        drops.append(
            PositionDrop(
                first_position=positions.start + 1,
                last_position=positions.stop,
                accuracy_baseline=float(base[0, k]),
                accuracy_candidate=float(cand[0, k]),
                diff=d,
                upper=float(upper[k]),
                lower=float(lower[k]),
                flagged=bool(flagged),
            )
        )
    known = [d for d in drops if d is not None]
    if not known:
        return None, False
    flagged = [d is not None and d.flagged for d in drops]
    fits = comparison.best_fit(diff, family, flagged, se=band.se, sign=-1, df=df)
    if fits is not None:
        return drops[fits], True
    return min(known, key=lambda d: d.lower), False


def _shift(base: Floats, cand: Floats, *, limit: float, alpha: float, df: int) -> ShiftChange:
    cb = base[:, -1] - base[:, 0]
    cc = cand[:, -1] - cand[:, 0]
    change = percentile(float(cc[0] - cb[0]), (cc - cb)[1:], level=1 - alpha, df=df, bounds=DIFF_OF_DIFFS)
    excludes = change.low is not None and change.high is not None and (change.low > 0 or change.high < 0)
    return ShiftChange(
        baseline=percentile(float(cb[0]), cb[1:], df=df, bounds=DIFF),
        candidate=percentile(float(cc[0]), cc[1:], df=df, bounds=DIFF),
        change=change,
        flagged=bool(change.estimate is not None and abs(change.estimate) > limit / 100 and excludes),
    )


def _overall(verdicts: Sequence[BatchSizeVerdict], *, rule: RegressionRule) -> tuple[Verdict, str]:
    fired = []
    for v in verdicts:
        at = f"N={v.batch_size}" + (f" {v.variant}" if v.variant != BASELINE else "")
        if v.drop_flagged and v.worst_drop is not None:
            d = v.worst_drop
            fired.append(
                f"{at} {_where(d, v.batch_size)}: accuracy {_points(d.diff)} (at most {_points(d.upper)}, "
                f"simultaneous bound), limit -{rule.max_drop:g} points"
            )
        if v.shift is not None and v.shift.flagged:
            s = v.shift
            fired.append(
                f"{at} last-minus-first {_points(s.baseline.estimate)} -> "
                f"{_points(s.candidate.estimate)} (change {_points(s.change.low)} to "
                f"{_points(s.change.high)}), "
                f"limit {rule.max_shift:g} points"
            )
        if v.parse_flagged and v.parse_drop is not None:
            d = v.parse_drop
            fired.append(
                f"{at} {_where(d, v.batch_size)}: parse rate {_points(d.diff)} (at most {_points(d.upper)}), "
                f"limit -{rule.max_parse_drop:g} points"
            )
    if fired:
        more = f" (and {len(fired) - 1} more)" if len(fired) > 1 else ""
        return Verdict.regression, f"{fired[0]}{more}"
    judged = [v for v in verdicts if v.worst_drop is not None]
    if not judged:
        notes = [f"N={v.batch_size}: {v.note}" for v in verdicts if v.note]
        return Verdict.inconclusive, "; ".join(notes) or "nothing to compare"
    if rule.max_shift is not None and not any(v.shift for v in verdicts):
        return (
            Verdict.inconclusive,
            "no batch size above 1 with both ends compared: the shift cannot be judged",
        )
    worst = min(judged, key=lambda v: v.worst_drop.lower if v.worst_drop else 0.0)
    drop = worst.worst_drop
    assert drop is not None
    allowed = _points(-drop.lower, signed=False)
    unjudged = [
        f"N={v.batch_size}{'' if v.variant == BASELINE else ' ' + v.variant} {v.note}"
        for v in verdicts
        if v.note
    ]
    return (
        Verdict.passed,
        f"within the rule: no drop established; the data allow a drop of at most {allowed} at "
        f"N={worst.batch_size}{'' if worst.variant == BASELINE else ' ' + worst.variant} "
        f"{_where(drop, worst.batch_size)} "
        f"(simultaneous bound; estimate {_points(drop.diff)})"
        + (f"; could not judge: {'; '.join(unjudged)}" if unjudged else ""),
    )


def _where(drop: PositionDrop, batch_size: int) -> str:
    """Where a drop is, for a reason: `position 7`, `positions 1-10`, or `the whole curve (positions 1-50)`
    (what a uniform drop is best fitted by)."""
    if batch_size > 1 and (drop.first_position, drop.last_position) == (1, batch_size):
        return f"the whole curve ({drop.where})"
    return drop.where


def _points(value: float | None, *, signed: bool = True) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f} pts" if signed else f"{100 * value:.1f} pts"


# --- a checkpoint's verdict -----------------------------------------------------------------------------


def judge_checkpoint(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    *,
    states: Sequence[CheckpointRecord],
) -> VerdictDetail:
    """The verdict a checkpoint with a job has now: `error` when its job failed, was cancelled or deleted;
    `pending` while its job or its baseline's runs; `baseline` when it is the schedule's baseline;
    `inconclusive` when its baseline's job ended without results; else `compare_jobs`'s. `states`: the
    schedule's checkpoints in order, with the verdicts reached so far (the baseline is chosen among them)."""

    def detail(verdict: Verdict, reason: str, **fields: Any) -> VerdictDetail:
        return VerdictDetail(
            schedule=schedule.name,
            checkpoint=checkpoint.name,
            verdict=verdict,
            reason=reason,
            job_id=checkpoint.job_id,
            **fields,
        )

    status = checkpoint.job_status
    if status is None:
        return detail(Verdict.error, "its job was deleted")
    if status is JobStatus.failed:
        return detail(Verdict.error, checkpoint.job_error or f"job {checkpoint.job_id} failed")
    if status is JobStatus.cancelled:
        return detail(Verdict.error, f"job {checkpoint.job_id} was cancelled")
    if status is not JobStatus.done:
        return detail(Verdict.pending, f"job {checkpoint.job_id} is {status.value}")
    base = _baseline_for(db, schedule, checkpoint, states=states)
    if base.itself:
        which = (
            "first checkpoint" if schedule.baseline is BaselineKind.first else "first checkpoint, no previous"
        )
        return detail(Verdict.baseline, f"the schedule's baseline ({which})")
    where = f"baseline checkpoint {base.checkpoint}" if base.checkpoint else "baseline"
    if base.job_id is None:
        return detail(
            Verdict.pending, f"waiting for {where} to get a job", baseline_checkpoint=base.checkpoint
        )
    fields: dict[str, Any] = {"baseline_job_id": base.job_id, "baseline_checkpoint": base.checkpoint}
    if base.status is None:
        return detail(Verdict.inconclusive, f"{where} job {base.job_id} was deleted", **fields)
    if base.status in (JobStatus.failed, JobStatus.cancelled):
        return detail(
            Verdict.inconclusive, f"{where} job {base.job_id} {base.status.value}: {base.error}", **fields
        )
    if base.status is not JobStatus.done:
        return detail(
            Verdict.pending, f"waiting for {where} job {base.job_id} ({base.status.value})", **fields
        )
    assert checkpoint.job_id is not None
    outcome = compare_jobs(db, baseline_job=base.job_id, candidate_job=checkpoint.job_id, rule=schedule.rule)
    return detail(
        outcome.verdict,
        outcome.reason,
        rule=schedule.rule,
        comparisons=outcome.comparisons,
        batch_sizes=tuple(outcome.batch_sizes),
        **fields,
    )


def not_submitted(
    schedule: ScheduleRecord, checkpoint: CheckpointRecord, *, problem: Exception
) -> VerdictDetail:
    """The verdict of a checkpoint whose job cannot be prepared (its spec, its model folder, the dataset):
    `error`, with the reason."""
    return VerdictDetail(
        schedule=schedule.name,
        checkpoint=checkpoint.name,
        verdict=Verdict.error,
        reason=f"could not submit its job: {problem}",
    )


def reopened(states: Sequence[CheckpointRecord]) -> list[int]:
    """The checkpoints whose `error` verdict no longer stands: their failed job was put back in the queue
    (`posbias retry`), so they are pending again."""
    return [
        s.id
        for s in states
        if s.verdict is Verdict.error
        and s.job_status is not None
        and s.job_status not in FINISHED_JOB_STATUSES
    ]


@dataclass(frozen=True)
class _BaselineChoice:
    """Whom a checkpoint is compared with."""

    itself: bool = False
    """The checkpoint is the baseline."""
    job_id: int | None = None
    status: JobStatus | None = None
    error: str | None = None
    checkpoint: str | None = None


def _baseline_for(
    db: Database,
    schedule: ScheduleRecord,
    checkpoint: CheckpointRecord,
    *,
    states: Sequence[CheckpointRecord],
) -> _BaselineChoice:
    if schedule.baseline is BaselineKind.job:
        assert schedule.baseline_job_id is not None
        try:
            job = jobs.get(db, schedule.baseline_job_id)
        except NotFoundError:
            return _BaselineChoice(job_id=schedule.baseline_job_id)
        return _BaselineChoice(job_id=job.id, status=job.status, error=job.error)
    # Checkpoints that ended in error have no curve: they are never a baseline.
    usable = [
        s
        for s in states
        if s.verdict is not Verdict.error and s.job_status not in (JobStatus.failed, JobStatus.cancelled)
    ]
    position = next(i for i, s in enumerate(usable) if s.id == checkpoint.id)
    if schedule.baseline is BaselineKind.first:
        chosen = usable[0]
    elif position == 0:
        chosen = checkpoint
    else:
        chosen = usable[position - 1]
    if chosen.id == checkpoint.id:
        return _BaselineChoice(itself=True)
    return _BaselineChoice(
        job_id=chosen.job_id, status=chosen.job_status, error=chosen.job_error, checkpoint=chosen.name
    )


# --- the gate -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Regressed:
    """A schedule whose newest compared checkpoint is a regression."""

    schedule: str
    checkpoint: str
    reason: str


def standing_regressions(db: Database, names: Sequence[str]) -> list[Regressed]:
    """For each named schedule whose newest checkpoint with a pass or regression verdict is a regression,
    that checkpoint: what `posbias schedule tick --fail-on-regression` fails on."""
    found = []
    for name in names:
        compared = [
            c for c in list_checkpoints(db, name) if c.verdict in (Verdict.passed, Verdict.regression)
        ]
        if compared and compared[-1].verdict is Verdict.regression:
            found.append(Regressed(schedule=name, checkpoint=compared[-1].name, reason=compared[-1].reason))
    return found
