"""The attention section of `posbias explain`: for an `hf` job (or the `hf` job paired with a job of the same
trials), own-question attention by token distance in the sliding and in the global layers, and whether that
attention predicts correctness at a fixed position.

- **By distance.** Bands relative to the window W the canary built: the near half of the window
  `[0, W/2)`, its far half `[W/2, W)`, then `[W, 2W)` and `[2W, ...)`. Inside the window, the sliding layers'
  far half over their near half says whether attention decays *within* the window (below 1); beyond it, the
  sliding layers' mass is 0 by the mask, and the global layers' says whether they carry the question.
  Without a window: quartiles of the distances seen.
- **Does attention predict correctness?** Correctness is not an `hf` job's own (it parses its answer sheet):
  it comes from the *scored* job, the vLLM (or any non-`hf`) job of the same trials: the job named by
  `engine.answer_sheet: {job: N}`, else the latest done job of the same model with identical trials. Per
  (trial, position) the score is own-question attention (head mean) averaged over the layers of one kind;
  within each (batch size, position) with both correct and wrong answers, the AUROC is Mann-Whitney's U over
  (correct x wrong) (`scipy.stats.mannwhitneyu`, ties counted half); pooled over cells by their pairs (the
  share of within-cell pairs the score orders rightly), so position itself cannot make the score look
  predictive. A 95% percentile interval from resampling whole trials (`RESAMPLES`, seeded).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from posbias.schemas import BASELINE, NotFoundError
from posbias.schemas.attention import AttentionAuroc, AttentionBand, AttentionExplanation, LayerKind
from posbias.service.stats.bootstrap import MIN_CLUSTERS
from posbias.service.store import Database, tables

RESAMPLES = 1000
"""Bootstrap resamples (by trial) of the pooled AUROC."""
_SEED = 20260226


@dataclass(frozen=True)
class Scored:
    """One (trial, position) answer of the scored job with its attention score per layer kind."""

    trial: int
    batch_size: int
    position: int
    correct: bool
    score: float


def pooled_auroc(answers: Sequence[Scored]) -> tuple[float | None, int, int, int]:
    """(AUROC pooled within (batch size, position), cells, correct, wrong): each cell's U (Mann-Whitney,
    ties half) summed over cells, over the summed correct x wrong pairs."""
    # Imported here: scipy.stats is a second of start-up, and every command that reaches the jobs module
    # imports this one (`posbias curve` started in 1.8 s, 1.2 of them scipy.stats).
    from scipy.stats import mannwhitneyu

    cells: dict[tuple[int, int], list[Scored]] = defaultdict(list)
    for answer in answers:
        cells[answer.batch_size, answer.position].append(answer)
    u_sum = pairs = strata = correct = wrong = 0.0
    for cell in cells.values():
        yes = [a.score for a in cell if a.correct]
        no = [a.score for a in cell if not a.correct]
        if not yes or not no:
            continue
        u_sum += float(mannwhitneyu(yes, no, alternative="two-sided").statistic)
        pairs += len(yes) * len(no)
        strata += 1
        correct += len(yes)
        wrong += len(no)
    return (u_sum / pairs if pairs else None), int(strata), int(correct), int(wrong)


@dataclass(frozen=True)
class _Cell:
    """One (batch size, position) cell prepared for the bootstrap: its answers sorted by score, the trial
    (slot) of each, whether each is correct, and where each run of tied scores starts."""

    owners: np.ndarray
    correct: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, cell: Sequence[Scored], slot: dict[int, int]) -> _Cell:
        order = sorted(cell, key=lambda a: a.score)
        scores = np.array([a.score for a in order])
        starts = np.flatnonzero(np.r_[True, scores[1:] != scores[:-1]])
        return cls(
            owners=np.array([slot[a.trial] for a in order]),
            correct=np.array([a.correct for a in order], dtype=bool),
            starts=starts,
        )

    def u_and_pairs(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mann-Whitney's U (ties half) and the correct x wrong pairs of this cell in each resample, each
        answer counted as often as its trial was drawn (`counts`: resamples x trials): a correct answer
        drawn a times and a wrong one drawn b times make a x b pairs, as in the resample written out."""
        weights = counts[:, self.owners].astype(np.float64)
        right = np.add.reduceat(np.where(self.correct, weights, 0.0), self.starts, axis=1)
        wrong = np.add.reduceat(np.where(self.correct, 0.0, weights), self.starts, axis=1)
        below = np.cumsum(wrong, axis=1) - wrong  # wrong answers scored strictly lower, per tie run
        u = (right * (below + 0.5 * wrong)).sum(axis=1)
        return u, right.sum(axis=1) * wrong.sum(axis=1)


def auroc_interval(answers: Sequence[Scored], *, resamples: int = RESAMPLES) -> tuple[float, float] | None:
    """A 95% percentile interval of `pooled_auroc`, resampling whole trials; None below `MIN_CLUSTERS`
    trials (where the cluster bootstrap's intervals do not hold their level). Each resample's pooled AUROC
    is computed from counts (how often each trial was drawn), all resamples at once, not by writing the
    resample out; resamples in which no cell has both correct and wrong answers are left out."""
    trials = sorted({a.trial for a in answers})
    if len(trials) < MIN_CLUSTERS:
        return None
    slot = {t: i for i, t in enumerate(trials)}
    grouped: dict[tuple[int, int], list[Scored]] = defaultdict(list)
    for answer in answers:
        grouped[answer.batch_size, answer.position].append(answer)
    rng = np.random.default_rng(_SEED)
    draws = rng.integers(0, len(trials), (resamples, len(trials)))
    counts = np.zeros((resamples, len(trials)), dtype=np.int64)
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1)
    u_sum = np.zeros(resamples)
    pairs = np.zeros(resamples)
    for cell in grouped.values():
        u, n = _Cell.of(cell, slot).u_and_pairs(counts)
        u_sum += u
        pairs += n
    found = u_sum[pairs > 0] / pairs[pairs > 0]
    if len(found) < resamples // 2:
        return None
    low, high = np.quantile(found, [0.025, 0.975])
    return float(low), float(high)


def band_edges(window: int | None, distances: Iterable[int]) -> list[tuple[int, int | None]]:
    """The token-distance bands: relative to the window, or quartiles without one."""
    if window:
        half = window // 2
        return [(0, half), (half, window), (window, 2 * window), (2 * window, None)]
    seen = sorted(distances)
    if not seen:
        return []
    cuts = sorted({int(np.quantile(seen, q)) for q in (0.25, 0.5, 0.75)} - {0})
    edges = [0, *cuts]
    return [(low, high) for low, high in zip(edges, [*edges[1:], None], strict=True)]


def bands(rows: Sequence[dict[str, Any]], window: int | None) -> list[AttentionBand]:
    """Own-question attention per (layer kind, band) of `rows` (attention rows: layer_kind, token_distance,
    own_mean, own_max, trial)."""
    usable = [r for r in rows if r["token_distance"] is not None]
    found = []
    for kind in (LayerKind.sliding, LayerKind.global_):
        of_kind = [r for r in usable if r["layer_kind"] == kind.value]
        for low, high in band_edges(window, (r["token_distance"] for r in usable)):
            inside = [
                r
                for r in of_kind
                if r["token_distance"] >= low and (high is None or r["token_distance"] < high)
            ]
            if inside:
                found.append(
                    AttentionBand(
                        layer_kind=kind,
                        low=low,
                        high=high,
                        n=len(inside),
                        trials=len({r["trial"] for r in inside}),
                        own_mean=float(np.mean([r["own_mean"] for r in inside])),
                        own_max=float(np.mean([r["own_max"] for r in inside])),
                    )
                )
    return found


def summarise(
    rows: Sequence[dict[str, Any]],
    correct: dict[tuple[int, int], bool] | None,
    *,
    model: str,
    job_id: int,
    scored_job_id: int | None,
    variant: str,
    window: int | None,
    resamples: int = RESAMPLES,
) -> AttentionExplanation:
    """The section from attention rows (dicts: trial, batch_size, position, layer_kind, token_distance,
    query_tokens, own_mean, own_max) and the scored job's correctness by (trial index, position), if any."""
    found = bands(rows, window)

    def band(kind: LayerKind, low: int) -> AttentionBand | None:
        return next((b for b in found if b.layer_kind is kind and b.low == low), None)

    decay = global_beyond = sliding_beyond = None
    if window:
        near, far = band(LayerKind.sliding, 0), band(LayerKind.sliding, window // 2)
        if near is not None and far is not None and near.own_mean > 0:
            decay = far.own_mean / near.own_mean
        # Wholly beyond: every query token of the line is a window or more past the question's last token.
        beyond = [
            r
            for r in rows
            if r["token_distance"] is not None and r["token_distance"] - r["query_tokens"] + 1 >= window
        ]
        on_global = [r["own_mean"] for r in beyond if r["layer_kind"] == LayerKind.global_.value]
        on_sliding = [r["own_max"] for r in beyond if r["layer_kind"] == LayerKind.sliding.value]
        global_beyond = float(np.mean(on_global)) if on_global else None
        sliding_beyond = float(max(on_sliding)) if on_sliding else None
    aurocs: list[AttentionAuroc] = []
    note = None
    if correct is None:
        note = (
            "no job of the same trials to score against: run a vllm job with the same spec (engine vllm), "
            "or submit the hf job with engine.answer_sheet: {job: N}"
        )
    else:
        for kind in (LayerKind.sliding, LayerKind.global_):
            scores: dict[tuple[int, int, int], list[float]] = defaultdict(list)
            for r in rows:
                if r["layer_kind"] == kind.value:
                    scores[r["trial"], r["batch_size"], r["position"]].append(r["own_mean"])
            answers = [
                Scored(trial, size, position, correct[trial, position], float(np.mean(values)))
                for (trial, size, position), values in sorted(scores.items())
                if (trial, position) in correct
            ]
            if not answers:
                continue
            value, strata, yes, no = pooled_auroc(answers)
            interval = auroc_interval(answers, resamples=resamples) if value is not None else None
            aurocs.append(
                AttentionAuroc(
                    layer_kind=kind,
                    strata=strata,
                    trials=len({a.trial for a in answers}),
                    correct=yes,
                    wrong=no,
                    auroc=value,
                    low=None if interval is None else interval[0],
                    high=None if interval is None else interval[1],
                )
            )
        if not any(a.auroc is not None for a in aurocs):
            note = f"job {scored_job_id} has no position with both correct and wrong answers"
    return AttentionExplanation(
        model=model,
        job_id=job_id,
        scored_job_id=scored_job_id,
        variant=variant,
        window=window,
        bands=tuple(found),
        decay_within_window=decay,
        global_beyond=global_beyond,
        sliding_beyond_max=sliding_beyond,
        aurocs=tuple(aurocs),
        note=note,
    )


# --- the store ---------------------------------------------------------------------------------------------


_TRIAL_FIELDS = ("batch_size", "variant", "question_ids", "choice_orders", "answer_order", "filler_tokens")


def trial_keys(db: Database, job_id: int) -> dict[int, tuple[Any, ...]]:
    """What makes a job's trials the same trials: per trial index, its batch size, variant, questions,
    choice and answer orders and filler."""
    trial = tables.Trial.__table__.c
    with db.read() as session:
        rows = session.execute(
            sa.select(trial["index"], *(trial[name] for name in _TRIAL_FIELDS)).where(trial.job_id == job_id)
        ).all()
    return {int(row[0]): tuple(_plain(v) for v in row[1:]) for row in rows}


def _plain(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, list | tuple | dict) else value


def plan_keys(trials: Iterable[Any]) -> dict[int, tuple[Any, ...]]:
    """`trial_keys` of planned trials (`schemas.Trial`), to compare a plan with a stored job."""
    return {
        t.index: tuple(
            _plain(v)
            for v in (
                t.batch_size,
                t.variant,
                t.question_ids,
                t.choice_orders,
                t.answer_order,
                t.filler_tokens,
            )
        )
        for t in trials
    }


def _jobs(db: Database) -> list[tuple[int, str, int, str, dict[str, Any], bool]]:
    """Every job: id, model, trials, status, spec, whether it has attention rows."""
    with db.read() as session:
        rows = session.execute(
            sa.text(
                "SELECT id, model, trials_total, status, spec, "
                "EXISTS (SELECT 1 FROM attention AS a WHERE a.job_id = jobs.id) FROM jobs ORDER BY id"
            )
        ).all()
    found = []
    for job, model, trials, status, spec, has in rows:
        if isinstance(spec, str):
            spec = json.loads(spec)
        found.append((int(job), str(model), int(trials), str(status), dict(spec or {}), bool(has)))
    return found


def sheet_job(spec: dict[str, Any]) -> int | None:
    """The job an `hf` spec's `engine.answer_sheet: {job: N}` names."""
    sheet = (spec.get("engine") or {}).get("answer_sheet")
    return int(sheet["job"]) if isinstance(sheet, dict) and "job" in sheet else None


def pairs(db: Database, job_ids: Sequence[int]) -> list[tuple[int, int | None]]:
    """(hf job, scored job or None) for each of `job_ids` that has, or is paired with, attention rows."""
    every = _jobs(db)
    by_id = {j[0]: j for j in every}
    keys: dict[int, dict[int, tuple[Any, ...]]] = {}

    def key(job: int) -> dict[int, tuple[Any, ...]]:
        if job not in keys:
            keys[job] = trial_keys(db, job)
        return keys[job]

    def same(a: int, b: int) -> bool:
        ja, jb = by_id[a], by_id[b]
        return ja[1] == jb[1] and ja[2] == jb[2] and key(a) == key(b)

    found: list[tuple[int, int | None]] = []
    for job in job_ids:
        if job not in by_id:
            continue
        _, _, _, _, spec, has = by_id[job]
        if has:
            named = sheet_job(spec)
            scored = named if named in by_id else None
            if scored is None:
                scored = next(
                    (
                        j[0]
                        for j in reversed(every)
                        if not j[5] and j[3] == "done" and j[0] != job and same(job, j[0])
                    ),
                    None,
                )
            pair = (job, scored)
        else:
            hf = next((j[0] for j in reversed(every) if j[5] and same(job, j[0])), None)
            if hf is None:
                continue
            pair = (hf, job)
        if pair not in found:
            found.append(pair)
    return found


def explain_attention(
    db: Database, job_ids: Sequence[int], *, variant: str = BASELINE, resamples: int = RESAMPLES
) -> list[AttentionExplanation]:
    """The attention section of each `hf` job among, or paired with, `job_ids`. `NotFoundError` when none
    has attention rows."""
    sections = [
        found
        for hf, scored in pairs(db, job_ids)
        if (found := explain_pair(db, hf, scored, variant=variant, resamples=resamples)) is not None
    ]
    if not sections:
        raise NotFoundError(
            "no attention figures for these jobs: run an hf job (engine: {name: hf}) on the same trials"
        )
    return sections


def explain_pair(
    db: Database, hf: int, scored: int | None, *, variant: str = BASELINE, resamples: int = RESAMPLES
) -> AttentionExplanation | None:
    """The attention section of `hf` job's `variant`, its AUROC against the answers of job `scored` (a job
    of the same trials that answered; None: no AUROC); None when the job has no attention rows."""
    with db.read() as session:
        rows = [
            dict(row._mapping)
            for row in session.execute(
                sa.text(
                    'SELECT t."index" AS trial, a.batch_size, a.position, a.layer_kind, '
                    "a.token_distance, a.query_tokens, a.own_mean, a.own_max "
                    "FROM attention AS a JOIN trials AS t ON t.id = a.trial_id "
                    "WHERE a.job_id = :j AND a.variant = :v "
                    'ORDER BY t."index", a.position, a.layer'  # the same sums, bit for bit, every read
                ),
                {"j": hf, "v": variant},
            )
        ]
        if not rows:
            return None
        window = session.execute(
            sa.text(
                'SELECT max("window") FROM attention_layers '
                "WHERE job_id = :j AND variant = :v AND kind = 'sliding'"
            ),
            {"j": hf, "v": variant},
        ).scalar_one_or_none()
        model = session.execute(sa.text("SELECT model FROM jobs WHERE id = :j"), {"j": hf}).scalar_one()
        correct = None
        if scored is not None:
            answers = session.execute(
                sa.text(
                    'SELECT t."index", r.position, r.correct FROM results AS r JOIN trials AS t '
                    "ON t.id = r.trial_id "
                    "WHERE r.job_id = :j AND t.variant = :v AND r.predicted IS NOT NULL"
                ),
                {"j": scored, "v": variant},
            ).all()
            correct = {(int(i), int(p)): bool(c) for i, p, c in answers}
    return summarise(
        rows,
        correct,
        model=model,
        job_id=hf,
        scored_job_id=scored,
        variant=variant,
        window=None if window is None else int(window),
        resamples=resamples,
    )
