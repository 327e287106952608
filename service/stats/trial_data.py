"""The data every analysis reads: each answer at one batch size, by trial and position (`TrialData`), and the
store's rows it is built from. Pure data, no statistics and no database.

The rules every number follows (docs/statistics.md says the same to users):

- An answer *parsed* when it has status `ok`; any other status is a parse failure and is never correct.
  `accuracy` is among parsed answers (the headline, on every axis and in verdicts), `parse_rate` is the
  share that parsed, `accuracy_strict` counts failures as wrong (the seed's scoring).
- Answers of one prompt are not independent, nor are the rotations of one sampled set. A *cluster* is a trial
  (random design) or a sampled set (rotation). Pointwise intervals are Wilson's with the design effect of the
  clusters (`service/stats/intervals.py`); every other interval comes from a bootstrap that resamples whole
  clusters (`service/stats/bootstrap.py`).
- Pooled jobs count each distinct trial once (`TrialData.pool`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from posbias.schemas import ParseStatus, QuestionResult, Trial

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]


class TrialRow(NamedTuple):
    """One trial as the store has it (a SQL row can be passed as is)."""

    trial_id: int
    job_id: int
    iteration: int
    question_ids: Sequence[str]
    choice_orders: Sequence[Sequence[int]] | None
    rotation_design: bool
    """True when the trial's job used the rotation design: its sampled set is its cluster."""
    n_options: Sequence[int] | None = None
    """Options per position, when known (for the chance line: the mean of 1 / options over the answers)."""
    answer_order: Sequence[int] | None = None
    """Positions in the order asked; None for forward order."""
    probe: int | None = None
    """The probe design's asked position; None otherwise."""
    filler_tokens: int = 0
    """The prompt's filler length."""
    set_cluster: bool = False
    """True when its job showed each sampled set several times (a filler sweep, a probe of each position): the
    set is its cluster."""


class ResultRow(NamedTuple):
    """One answer as the store has it."""

    trial_id: int
    position: int
    parsed: bool
    correct: bool
    gold_prob: float | None = None
    answer_slot: int | None = None
    token_distance: int | None = None


class DistanceRow(NamedTuple):
    """One answer for a token-distance curve (a SQL row can be passed as is)."""

    trial_id: int
    batch_size: int
    token_distance: int | None
    parsed: bool
    correct: bool
    gold_prob: float | None = None


@dataclass(frozen=True)
class TrialData:
    """Every answer at one batch size, by trial (rows) and position (columns): what every analysis reads.

    `correct` and `parsed` are 0/1 with `answered` saying where a result exists (a skipped trial has none).
    """

    batch_size: int
    correct: Floats
    parsed: Floats
    answered: Floats
    cluster: Ints
    """Per trial, its cluster: 0..clusters-1."""
    keys: tuple[tuple[str, ...], ...]
    """Per trial, its content: question ids in prompt order (what matching and pooling compare)."""
    questions: Ints
    """Trials x positions: an integer code per question (the same question, the same code)."""
    gold_prob: Floats
    """Trials x positions: the gold option's probability; NaN where not recorded."""
    jobs: tuple[int, ...] = ()
    duplicates: int = 0
    """Trials left out of a pool because an earlier job had the same content."""
    cluster_unit: str = "trial"
    chance: float | None = None
    slot: Floats | None = None
    """Trials x positions: the answer's line in the output (the line the design asked it on, for a missing
    answer); NaN where there is no answer. None when not known (then slot = position)."""
    distance: Floats | None = None
    """Trials x positions: tokens from the question's end to its answer; NaN where not recorded."""
    filler: Floats | None = None
    """Per trial, its filler length in tokens (None: none anywhere)."""
    lines: Floats | None = None
    """Per trial, the answers it asks for: N, or 1 under the probe design (None: N)."""

    @property
    def trials(self) -> int:
        return int(self.correct.shape[0])

    @property
    def clusters(self) -> int:
        return int(self.cluster.max()) + 1 if self.cluster.size else 0

    @classmethod
    def from_arrays(
        cls,
        correct: npt.ArrayLike,
        *,
        parsed: npt.ArrayLike | None = None,
        cluster: npt.ArrayLike | None = None,
        questions: npt.ArrayLike | None = None,
        keys: Sequence[tuple[str, ...]] | None = None,
        chance: float | None = None,
        answered: npt.ArrayLike | None = None,
        slot: npt.ArrayLike | None = None,
        distance: npt.ArrayLike | None = None,
        filler: npt.ArrayLike | None = None,
        lines: npt.ArrayLike | None = None,
        cluster_unit: str = "trial",
    ) -> TrialData:
        """From a trials x positions array of correctness (simulations, tests). `parsed` defaults to all
        (`answered` to all); `correct` is zeroed where an answer did not parse; `cluster` defaults to one per
        trial; `slot`, `distance`, `filler` and `lines` as the fields are."""
        right = np.asarray(correct, dtype=np.float64)
        asked = np.ones_like(right) if answered is None else np.asarray(answered, dtype=np.float64)
        ok = asked.copy() if parsed is None else np.asarray(parsed, dtype=np.float64) * asked
        trials, n = right.shape
        codes = (
            np.asarray(questions, dtype=np.int64)
            if questions is not None
            else np.arange(trials * n, dtype=np.int64).reshape(trials, n)
        )

        def optional(values: npt.ArrayLike | None) -> Floats | None:
            return None if values is None else np.asarray(values, dtype=np.float64)

        return cls(
            batch_size=n,
            correct=right * ok,
            parsed=ok,
            answered=asked,
            cluster=cluster_codes(np.asarray(cluster).tolist() if cluster is not None else range(trials)),
            keys=tuple(keys) if keys is not None else tuple((f"t{t}",) for t in range(trials)),
            questions=codes,
            gold_prob=np.full_like(right, np.nan),
            chance=chance,
            cluster_unit=cluster_unit,
            slot=optional(slot),
            distance=optional(distance),
            filler=optional(filler),
            lines=optional(lines),
        )

    @classmethod
    def from_rows(
        cls, trials: Iterable[TrialRow], results: Iterable[ResultRow], *, batch_size: int
    ) -> TrialData:
        """From store rows of one batch size, possibly of several jobs (see `pool` for how they combine)."""
        by_job: dict[int, list[TrialRow]] = {}
        for trial in trials:
            by_job.setdefault(trial.job_id, []).append(trial)
        answers: dict[int, list[ResultRow]] = {}
        for result in results:
            answers.setdefault(result.trial_id, []).append(result)
        return cls.pool([(job, rows, answers) for job, rows in sorted(by_job.items())], batch_size=batch_size)

    @classmethod
    def from_results(
        cls,
        trials: Sequence[Trial],
        results: Iterable[QuestionResult],
        *,
        rotation: bool = False,
        job_id: int = 0,
    ) -> TrialData:
        """From a worker's results (a `ShardResult`'s) and the trials they answer, without a store."""
        # Each set shown several times (a filler sweep, a probe of each position): the set is a cluster.
        set_cluster = len({t.filler_tokens for t in trials}) > 1 or any(t.probe is not None for t in trials)
        rows = [
            TrialRow(
                t.index,
                job_id,
                t.iteration,
                t.question_ids,
                t.choice_orders,
                rotation,
                answer_order=t.answer_order,
                probe=t.probe,
                filler_tokens=t.filler_tokens,
                set_cluster=set_cluster,
            )
            for t in trials
        ]
        answers = [
            ResultRow(
                r.trial_index,
                r.position,
                r.parse_status is ParseStatus.ok,
                r.correct,
                r.gold_prob,
                answer_slot=r.answer_slot,
                token_distance=r.token_distance,
            )
            for r in results
        ]
        n = trials[0].batch_size if trials else 0
        return cls.from_rows(rows, answers, batch_size=n)

    @classmethod
    def pool(
        cls,
        jobs: Sequence[tuple[int, Sequence[TrialRow], dict[int, list[ResultRow]]]],
        *,
        batch_size: int,
    ) -> TrialData:
        """The trials of several jobs, each distinct trial once: a trial whose questions, order, options and
        design (answer order, probe, filler length) an earlier job (by id) already showed adds no information
        (greedy decoding answers it the same way; sampling answers it with the same questions), so it is left
        out and counted in `duplicates`."""
        seen: set[tuple[object, ...]] = set()
        kept: list[tuple[TrialRow, list[ResultRow]]] = []
        duplicates = 0
        for _, rows, answers in jobs:
            for trial in sorted(rows, key=lambda t: t.trial_id):
                content = (
                    tuple(trial.question_ids),
                    None if trial.choice_orders is None else tuple(map(tuple, trial.choice_orders)),
                    None if trial.answer_order is None else tuple(trial.answer_order),
                    trial.probe,
                    trial.filler_tokens,
                )
                if content in seen:
                    duplicates += 1
                    continue
                seen.add(content)
                kept.append((trial, answers.get(trial.trial_id, [])))
        n = batch_size
        t = len(kept)
        correct = np.zeros((t, n))
        parsed = np.zeros((t, n))
        answered = np.zeros((t, n))
        gold = np.full((t, n), np.nan)
        slot = np.full((t, n), np.nan)
        distance = np.full((t, n), np.nan)
        filler = np.zeros(t)
        lines = np.full(t, float(n))
        vocabulary: dict[str, int] = {}
        questions = np.zeros((t, n), dtype=np.int64)
        clusters: list[tuple[int, int, int]] = []
        options: list[float] = []
        for row, (trial, results) in enumerate(kept):
            for column, qid in enumerate(trial.question_ids[:n]):
                questions[row, column] = vocabulary.setdefault(qid, len(vocabulary))
            asked = (
                (trial.probe,) if trial.probe is not None else tuple(trial.answer_order or range(1, n + 1))
            )
            intended = {position: index for index, position in enumerate(asked, start=1)}
            filler[row] = trial.filler_tokens
            lines[row] = len(asked)
            for r in results:
                c = r.position - 1
                answered[row, c] = 1.0
                parsed[row, c] = float(r.parsed)
                correct[row, c] = float(r.parsed and r.correct)
                if r.gold_prob is not None:
                    gold[row, c] = r.gold_prob
                line = r.answer_slot if r.answer_slot is not None else intended.get(r.position)
                if line is not None:
                    slot[row, c] = line
                if r.token_distance is not None:
                    distance[row, c] = r.token_distance
                if trial.n_options and c < len(trial.n_options):
                    options.append(1.0 / trial.n_options[c])
            clusters.append(
                (trial.job_id, trial.iteration, -1)
                if trial.rotation_design or trial.set_cluster
                else (trial.job_id, -1, trial.trial_id)
            )
        rotation = any(trial.rotation_design or trial.set_cluster for trial, _ in kept)
        return cls(
            batch_size=n,
            correct=correct,
            parsed=parsed,
            answered=answered,
            cluster=cluster_codes(clusters),
            keys=tuple(_key(trial) for trial, _ in kept),
            questions=questions,
            gold_prob=gold,
            jobs=tuple(job for job, _, _ in jobs),
            duplicates=duplicates,
            cluster_unit="sampled set" if rotation else "trial",
            chance=float(np.mean(options)) if options else None,
            slot=slot,
            distance=distance,
            filler=filler if filler.any() else None,
            lines=lines,
        )

    def subset(self, rows: npt.ArrayLike) -> TrialData:
        """The trials at `rows` (indices or a boolean mask), their clusters renumbered."""
        index = np.arange(self.trials)[np.asarray(rows)]

        def take(values: Floats | None) -> Floats | None:
            return None if values is None else values[index]

        return dataclasses.replace(
            self,
            correct=self.correct[index],
            parsed=self.parsed[index],
            answered=self.answered[index],
            cluster=cluster_codes(self.cluster[index]),
            keys=tuple(self.keys[i] for i in index) if self.keys else (),
            questions=self.questions[index],
            gold_prob=self.gold_prob[index],
            slot=take(self.slot),
            distance=take(self.distance),
            filler=take(self.filler),
            lines=take(self.lines),
        )

    def filler_levels(self) -> list[int]:
        """The filler lengths of its trials, in order ([0] without filler)."""
        return [0] if self.filler is None else sorted({int(f) for f in self.filler})

    def cluster_sums(self) -> tuple[Floats, Floats, Floats]:
        """Per cluster and position: correct, parsed and answered counts (clusters x positions)."""
        return (
            _sum_by(self.cluster, self.correct),
            _sum_by(self.cluster, self.parsed),
            _sum_by(self.cluster, self.answered),
        )


def sampled(data: TrialData, *, answers: int, seed: int, why: str) -> tuple[TrialData, str | None]:
    """`data`, or past `answers` parsed answers a random sample of its whole clusters holding about that
    many, with a line that says how many of how many and `why`."""
    total = int(data.parsed.sum())
    if total <= answers:
        return data, None
    clusters = data.clusters
    chosen = np.random.default_rng(seed).choice(clusters, max(1, clusters * answers // total), replace=False)
    sample = data.subset(np.isin(data.cluster, chosen))
    unit = data.cluster_unit
    return sample, (
        f"fitted on {sample.clusters:,} of {clusters:,} {unit}s drawn at random "
        f"({int(sample.parsed.sum()):,} of {total:,} parsed answers): past {answers:,} answers a sample of "
        f"whole {unit}s, {why}; its intervals are the sample's"
    )


def _key(trial: TrialRow) -> tuple[str, ...]:
    """What matching compares: the questions in order, and the filler length when there is filler (the
    lengths of one sampled set are different trials; its answer orders are not)."""
    ids = tuple(trial.question_ids)
    return ids if not trial.filler_tokens else (*ids, f"filler:{trial.filler_tokens}")


def cluster_codes(values: Iterable[object]) -> Ints:
    """0..k-1 codes of `values` in order of first appearance: how clusters are numbered."""
    index: dict[object, int] = {}
    items = values.tolist() if isinstance(values, np.ndarray) else list(values)
    return np.array(
        [index.setdefault(v if not isinstance(v, list) else tuple(v), len(index)) for v in items],
        dtype=np.int64,
    )


def _sum_by(groups: Ints, values: Floats) -> Floats:
    if groups.size == values.shape[0] and np.array_equal(groups, np.arange(groups.size)):
        return values  # a cluster per trial, in order: the sums are the rows (read, never written)
    out = np.zeros((int(groups.max()) + 1 if groups.size else 0, values.shape[1]))
    np.add.at(out, groups, values)
    return out
