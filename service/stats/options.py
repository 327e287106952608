"""Options by position: which options a model answers at each position against which are right, how sure
it is, and its accuracy once its option prior is removed; so that an early position at chance can be read
as a collapse onto one option, a guess, or confident and wrong answers.

The debiased accuracy is PriDe's (Zheng et al. 2024, "Large language models are not robust multiple choice
selectors"): a model's observed probability of a shown option is taken as a prior over the option slots
times a content term, so the prior is estimated as the softmax of the mean log-probability per slot over
trials whose options were shuffled (the content then averages out over slots) and every answer is re-chosen
as the option maximising probability / prior. PriDe estimates the prior once from a small share of the
samples; here a model's prior moves with position (that is the point), so it is estimated per position, and
a fifth of 100 trials (20 answers a position) left it so noisy that the debiased accuracy came out 2 points
high (benchmarks/intervals.py: the noise flips wrong answers towards a gold option the model half believed).
So the prior is cross-fitted: the clusters fall into `FOLDS` folds, and each fold's answers are debiased
with the prior of the other four (no answer is debiased with a prior its own probabilities shaped). Its
interval is a cluster bootstrap that re-estimates the priors in every resample, a percentile interval
inside [0, 1] by construction; `benchmarks/intervals.py` checks its coverage against a model whose prior is
known.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from sqlalchemy import Text, cast, select

from posbias.schemas import BASELINE, Interval, NotFoundError, ParseStatus
from posbias.schemas.curve import OptionPoint, OptionsView
from posbias.service.stats import queries
from posbias.service.stats.bootstrap import PROPORTION, chunks, percentile
from posbias.service.stats.intervals import wilson_interval
from posbias.service.stats.trial_data import Floats, Ints, cluster_codes
from posbias.service.store import Database, Result, Trial

if TYPE_CHECKING:
    import pyarrow as pa

Bools = npt.NDArray[np.bool_]
FOLDS = 5
"""Cross-fitting folds (by cluster): each fold's answers are debiased with the prior of the other four."""
PROBABILITY_FLOOR = 1e-4
"""Option probabilities are floored here before logs (free mode reports 0 for options outside the top-k)."""
DEBIAS_RESAMPLES = 500
COLLAPSE_SHARE = 0.5
"""A position collapses onto an option when at least this share of its answers choose it..."""
COLLAPSE_EXCESS = 0.25
"""...and that is at least this much more than the share of answers it is right for."""
GUESS_CONFIDENCE = 0.5
"""Near chance with a mean top probability below this: a guess."""
CONFIDENT = 0.7
"""Near chance with a mean top probability at least this: confident and wrong."""


@dataclass(frozen=True)
class OptionData:
    """Every answer of one batch size, trials (rows) x positions (columns), with what it chose."""

    batch_size: int
    gold: Ints
    """Shown index of the gold option; -1 where there is no answer."""
    predicted: Ints
    """Shown index chosen; -1 where it did not parse."""
    probs: Floats
    """Trials x positions x options: option probabilities; NaN where not recorded."""
    shuffled: Bools
    """Per trial: its options were shuffled (a permutation is stored)."""
    cluster: Ints
    """Per trial: its cluster, 0..clusters-1."""

    @property
    def options(self) -> int:
        return int(self.probs.shape[2])


def load(db: Database, *, job_ids: Sequence[int], batch_size: int, variant: str = BASELINE) -> OptionData:
    """The answers of `job_ids` at `batch_size` for `variant`, from the store, read as columns
    (`service.store.columns`): memory is the trials x positions x options array, not an object per answer."""
    from posbias.service.store import columns

    ids = sorted(set(job_ids))
    trials = columns.read_table(
        db,
        select(
            Trial.id.label("trial_id"), columns.filled(cast(Trial.choice_orders, Text), "").label("orders")
        )
        .where(Trial.job_id.in_(ids), Trial.batch_size == batch_size, Trial.variant == variant)
        .order_by(Trial.job_id, Trial.index),
    )
    trial_ids = _ints(trials, "trial_id")
    # SQL NULL (read as "") and a JSON null both mean "not shuffled".
    orders = trials.column("orders").to_pylist() if trials.num_rows else []
    shuffled = np.array([str(text).strip() not in ("", "null") for text in orders], dtype=bool)
    # Each batch goes into the arrays as it is read (holding the batches first was 3 x the arrays).
    shape = (trial_ids.size, batch_size)
    gold = np.full(shape, -1, dtype=np.int64)
    predicted = np.full(shape, -1, dtype=np.int64)
    probs = np.full((*shape, 2), np.nan)
    answered = np.zeros(trial_ids.size, dtype=bool)
    order = np.argsort(trial_ids, kind="stable")
    for batch in columns.record_batches(
        db,
        select(
            Result.trial_id,
            Result.position,
            Result.gold,
            columns.filled(Result.predicted, -1).label("predicted"),
            (Result.parse_status == ParseStatus.ok).label("parsed"),
            columns.filled(cast(Result.option_probs, Text), "").label("option_probs"),
        ).where(Result.job_id.in_(ids), Result.batch_size == batch_size, Result.variant == variant),
    ):
        b = _answers(batch)
        need = max(b.width, int(b.gold.max()) + 1 if b.gold.size else 0)
        if need > probs.shape[2]:  # wider options: rows with probabilities read 0 there, the others NaN
            extra = np.where(np.isnan(probs[..., :1]), np.nan, 0.0)
            probs = np.concatenate([probs, np.repeat(extra, need - probs.shape[2], axis=2)], axis=2)
        row = order[np.searchsorted(trial_ids[order], b.trial_id)]
        col = b.position - 1
        answered[row] = True
        gold[row, col] = b.gold
        predicted[row, col] = np.where(b.parsed, b.predicted, -1)
        if b.width:
            probs[row, col, : b.width] = b.probs
            probs[row, col, b.width :] = np.where(np.isnan(b.probs[:, :1]), np.nan, 0.0)
    kept = np.flatnonzero(answered)
    if kept.size < trial_ids.size:  # trials with no answer (not yet run) are not rows
        gold, predicted, probs = gold[kept], predicted[kept], probs[kept]
    clusters = queries.clusters_of(db, job_ids=ids)
    return OptionData(
        batch_size=batch_size,
        gold=gold,
        predicted=predicted,
        probs=probs,
        shuffled=shuffled[kept],
        cluster=cluster_codes([clusters.get(t, t) for t in trial_ids[kept].tolist()]),
    )


@dataclass(frozen=True)
class _Answers:
    """A batch of answers' option columns; `probs` answers x `width`, NaN rows where none were recorded."""

    trial_id: Ints
    position: Ints
    gold: Ints
    predicted: Ints
    parsed: Bools
    probs: Floats

    @property
    def width(self) -> int:
        return int(self.probs.shape[1]) if self.probs.size else 0


def _answers(batch: pa.RecordBatch) -> _Answers:
    """A batch read: the option probabilities, stored as JSON lists, parsed all at once (the texts of the
    batch joined into one, read by numpy), not one list per answer."""
    import pyarrow as pa
    import pyarrow.compute as pc

    texts = batch.column("option_probs").cast(pa.string())
    present = np.asarray(pc.not_equal(pc.utf8_length(texts), 0).to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.where(
        present, np.asarray(pc.count_substring(texts, ",").to_numpy(zero_copy_only=False)) + 1, 0
    )
    width = int(lengths.max()) if lengths.size else 0
    probs = np.full((len(texts), width), np.nan)
    if width:
        flat = pc.replace_substring(pc.replace_substring(texts.filter(pa.array(present)), "[", ""), "]", ",")
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(flat)], pa.int32()), flat), "")
        values = np.fromstring(joined[0].as_py()[:-1], dtype=np.float64, sep=",")
        rows = np.repeat(np.arange(len(texts)), lengths)
        columns = np.arange(values.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        probs[rows, columns] = values
        probs[present] = np.where(np.isnan(probs[present]), 0.0, probs[present])
    return _Answers(
        trial_id=_ints(batch, "trial_id"),
        position=_ints(batch, "position"),
        gold=_ints(batch, "gold"),
        predicted=_ints(batch, "predicted"),
        parsed=_ints(batch, "parsed").astype(bool),
        probs=probs,
    )


def _ints(data: pa.Table | pa.RecordBatch, name: str) -> Ints:
    column = data.column(name)
    return (
        np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
        if len(column)
        else np.zeros(0, np.int64)
    )


def by_position(
    db: Database,
    job_ids: Sequence[int],
    *,
    model: str,
    batch_size: int | None = None,
    variant: str = BASELINE,
    resamples: int = DEBIAS_RESAMPLES,
) -> list[OptionsView]:
    """Options by position per batch size of `job_ids` (`NotFoundError` naming the fix when there are no
    results)."""
    sizes = [
        n for n in queries.batch_sizes(db, job_ids=list(job_ids), variant=variant) if batch_size in (None, n)
    ]
    if not sizes:
        fixes = "; ".join(dict.fromkeys(queries.missing_results_fix(db, j) for j in job_ids))
        which = ", ".join(map(str, job_ids))
        raise NotFoundError(f"job {which} has no results to read options from: {fixes}")
    return [
        view(
            load(db, job_ids=job_ids, batch_size=n, variant=variant),
            model=model,
            job_ids=job_ids,
            variant=variant,
            resamples=resamples,
        )
        for n in sizes
    ]


def normalised(probs: Floats) -> Floats:
    """Option probabilities renormalised over the options (free mode's raw ones need not sum to 1)."""
    total = probs.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, probs / np.where(total > 0, total, 1.0), np.nan)


def view(
    data: OptionData,
    *,
    model: str,
    job_ids: Sequence[int] = (),
    variant: str = BASELINE,
    resamples: int = DEBIAS_RESAMPLES,
    seed: int = 0,
) -> OptionsView:
    """Options by position of `data` (see the module's docstring)."""
    k = data.options
    chance = 1.0 / k
    # Renormalised a position at a time (a whole copy of a 5M-answer job's probabilities is 160 MB); a row is
    # recorded where its probabilities are finite and sum to more than 0, as `normalised` keeps them.
    recorded: Bools = np.zeros(data.probs.shape[:2], dtype=bool)
    for j in range(data.batch_size):
        column = data.probs[:, j]
        recorded[:, j] = np.isfinite(column).all(axis=-1) & (column.sum(axis=-1) > 0)
    parsed: Bools = np.asarray(data.predicted >= 0)
    notes = []
    debiased: list[Interval | None] = [None] * data.batch_size
    prior = None
    usable = parsed & recorded
    if not data.shuffled.any():
        notes.append("no debiased accuracy: the job did not shuffle options (submit with --shuffle-choices)")
    elif not recorded.any():
        notes.append("no debiased accuracy: the engine recorded no option probabilities")
    elif len(set(data.cluster[data.shuffled].tolist())) < FOLDS:
        notes.append(f"no debiased accuracy: fewer than {FOLDS} clusters with shuffled options")
    else:
        logp = np.log(np.maximum(np.nan_to_num(normalised(data.probs), nan=1.0), PROBABILITY_FLOOR))
        intervals, prior = debiased_accuracy(
            logp, data.gold, usable & data.shuffled[:, None], data.cluster, resamples=resamples, seed=seed
        )
        debiased = list(intervals)
    points = []
    for j in range(data.batch_size):
        here = parsed[:, j]
        n = int(here.sum())
        chosen = np.bincount(data.predicted[here, j], minlength=k)[:k] / max(n, 1)
        right = np.bincount(data.gold[here, j], minlength=k)[:k] / max(n, 1)
        correct = int((data.predicted[here, j] == data.gold[here, j]).sum())
        with_probs = normalised(data.probs[np.logical_and(here, recorded[:, j]), j])
        entropy = confidence = None
        if len(with_probs):
            safe = np.where(with_probs > 0, with_probs, 1.0)
            entropy = float(np.mean(-(with_probs * np.log2(safe)).sum(axis=1)))
            confidence = float(np.mean(with_probs.max(axis=1)))
        accuracy = correct / n if n else None
        points.append(
            OptionPoint(
                position=j + 1,
                n=n,
                accuracy=accuracy,
                predicted_share=tuple(float(x) for x in chosen),
                gold_share=tuple(float(x) for x in right),
                entropy=entropy,
                confidence=confidence,
                debiased_accuracy=debiased[j],
                prior=None if prior is None else tuple(float(x) for x in prior[j]),
                reading=reading(chosen, right, correct=correct, n=n, confidence=confidence, chance=chance),
            )
        )
    return OptionsView(
        model=model,
        job_ids=tuple(job_ids),
        variant=variant,
        batch_size=data.batch_size,
        options=k,
        chance=chance,
        trials=int(data.gold.shape[0]),
        prior_trials=int(data.shuffled.sum()) if prior is not None else 0,
        points=tuple(points),
        readings=tuple(runs([pt.reading for pt in points])),
        note="; ".join(notes) or None,
    )


def reading(
    chosen: Floats, right: Floats, *, correct: int, n: int, confidence: float | None, chance: float
) -> str | None:
    """What one position's answers say (see `OptionPoint.reading`)."""
    if n == 0:
        return None
    top = int(np.argmax(chosen))
    if chosen[top] >= COLLAPSE_SHARE and chosen[top] - right[top] >= COLLAPSE_EXCESS:
        return f"a collapse onto option {top + 1}"
    low = wilson_interval(correct, n).low
    if low is None or low > chance or confidence is None:
        return None
    if confidence < GUESS_CONFIDENCE:
        return "a guess"
    if confidence >= CONFIDENT:
        return "confident and wrong"
    return None


def runs(readings: Sequence[str | None]) -> list[str]:
    """Consecutive positions with one reading, in words: `positions 1-8: a collapse onto option 4`."""
    found: list[str] = []
    start = 0
    for j in range(1, len(readings) + 1):
        if j < len(readings) and readings[j] == readings[start]:
            continue
        if readings[start] is not None:
            where = f"position {start + 1}" if j - 1 == start else f"positions {start + 1}-{j}"
            found.append(f"{where}: {readings[start]}")
        start = j
    return found


def debiased_accuracy(
    logp: Floats,
    gold: Ints,
    usable: Bools,
    cluster: Ints,
    *,
    resamples: int = DEBIAS_RESAMPLES,
    seed: int = 0,
) -> tuple[list[Interval | None], Floats]:
    """PriDe's debiased accuracy per position with its interval, and the prior per position (positions x
    options, from every usable answer). `logp`: trials x positions x options log-probabilities; `usable`:
    answers that parsed with probabilities on shuffled trials. Cross-fitted: the clusters fall into `FOLDS`
    folds, and each fold's answers are debiased with the prior estimated from the other folds."""
    clusters = int(cluster.max()) + 1
    fold = cluster % FOLDS
    rng = np.random.default_rng(seed)
    rows = usable.astype(np.float64)

    def log_prior(w: Floats, mask: Floats) -> Floats:
        """Per resample, the log prior per position from the answers `mask` selects, weighted by `w`."""
        with np.errstate(invalid="ignore", divide="ignore"):
            mean: Floats = np.einsum("rt,tpk->rpk", w, mask[:, :, None] * logp) / (w @ mask)[:, :, None]
        top = np.nan_to_num(mean.max(axis=2, keepdims=True), nan=0.0)
        found: Floats = mean - top - np.log(np.exp(mean - top).sum(axis=2, keepdims=True))  # softmax, in logs
        return found

    def estimate(weights: Floats) -> Floats:
        """Per resample (rows of cluster `weights`): debiased accuracy per position."""
        w = weights[:, cluster]
        right = np.zeros((w.shape[0], gold.shape[1]))
        total = np.zeros_like(right)
        for f in range(FOLDS):
            held = usable & (fold == f)[:, None]
            if not held.any():
                continue
            prior_f = np.nan_to_num(log_prior(w, rows * (fold != f)[:, None]), nan=0.0)
            pick = np.argmax(logp[None] - prior_f[:, None], axis=3)
            right += np.einsum("rt,rtp->rp", w, (pick == gold[None]) & held[None])
            total += w @ held
        with np.errstate(invalid="ignore", divide="ignore"):
            return right / total

    point = estimate(np.ones((1, clusters)))[0]
    prior = np.exp(log_prior(np.ones((1, cluster.size)), rows)[0])  # every trial once (weights per trial)
    draws = np.empty((resamples, gold.shape[1]))
    done = 0
    for size in chunks(resamples):
        weights = rng.multinomial(clusters, np.full(clusters, 1 / clusters), size=size).astype(np.float64)
        draws[done : done + size] = estimate(weights)
        done += size
    found: list[Interval | None] = []
    for j in range(gold.shape[1]):
        if not np.isfinite(point[j]) or not np.isfinite(prior[j]).all():
            found.append(None)
            continue
        found.append(percentile(float(point[j]), draws[:, j], df=clusters - 1, bounds=PROPORTION))
    return found, prior
