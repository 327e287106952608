"""The store's answers as columns, and the `TrialData` built from them without a Python object per answer:
the path every analysis reads a job by (`service.stats.queries.trial_data` reads the columns).
`TrialData.pool` is the same rule on rows; the two give the same data for the same answers
(tests/integration/test_trial_columns.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from posbias.service.stats.trial_data import DistanceRow, Floats, Ints, TrialData, cluster_codes

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TrialColumns:
    """Trials as the store has them, as columns (one entry per trial, in job and then trial id order): what
    `build` reads. The JSON columns stay texts: they are compared, not read."""

    trial_id: Ints
    job_id: Ints
    iteration: Ints
    probe: Ints
    """The probe design's asked position; 0 for none."""
    filler: Ints
    by_set: npt.NDArray[np.bool_]
    """True where the trial's job shows each sampled set again (rotation, sweep, probe): the set clusters."""
    questions: Sequence[bytes]
    """A digest of each trial's stored question ids (what matching compares)."""
    content: Sequence[bytes]
    """A digest of each trial's content: questions, option orders, answer order, probe, filler (what
    pooling compares)."""
    answer_order: Sequence[str]
    """The stored text of each trial's answer order; "" for forward order."""
    jobs: tuple[int, ...] = ()

    @classmethod
    def read(cls, batches: Iterable[pa.RecordBatch], *, by_set: Collection[int]) -> TrialColumns:
        """From the store's trials as Arrow batches (`trial_id`, `job_id`, `iteration`, `probe`,
        `filler_tokens`, `question_ids`, `choice_orders`, `answer_order`); `by_set`: the jobs whose sets
        are their clusters. Its `jobs` are those with trials. The JSON texts are kept as 16-byte digests
        (BLAKE2b), a batch at a time: a job of 100,000 trials of 50 questions holds 170 MB of them."""
        parts: dict[str, list[Any]] = {name: [] for name in ("ids", "job", "iteration", "probe", "filler")}
        questions: list[bytes] = []
        content: list[bytes] = []
        orders: list[str] = []
        for batch in batches:
            probe, filler = _integers(batch, "probe"), _integers(batch, "filler_tokens")
            for name, column in (("ids", "trial_id"), ("job", "job_id"), ("iteration", "iteration")):
                parts[name].append(_integers(batch, column))
            parts["probe"].append(probe)
            parts["filler"].append(filler)
            order = [_no_null(text) for text in _texts(batch, "answer_order")]
            for ids, choices, answers, p, f in zip(
                _texts(batch, "question_ids"),
                _texts(batch, "choice_orders"),
                order,
                probe.tolist(),
                filler.tolist(),
                strict=True,
            ):
                questions.append(_digest(ids))
                content.append(_digest("\x1f".join((ids, choices, answers, str(p), str(f)))))
            orders += order

        def joined(name: str) -> Ints:
            return np.concatenate(parts[name]) if parts[name] else np.zeros(0, dtype=np.int64)

        job = joined("job")
        return cls(
            trial_id=joined("ids"),
            job_id=job,
            iteration=joined("iteration"),
            probe=joined("probe"),
            filler=joined("filler"),
            by_set=np.isin(job, sorted(by_set)),
            questions=questions,
            content=content,
            answer_order=orders,
            jobs=tuple(sorted(set(job.tolist()))),
        )


@dataclass(frozen=True)
class DistanceColumns:
    """Answers for curves by token distance, as columns: per answer its trial, batch size, distance (NaN
    where none was recorded), whether it parsed and is right, and the gold option's probability (NaN)."""

    trial_id: Ints
    batch_size: Ints
    token_distance: Floats
    parsed: npt.NDArray[np.bool_]
    correct: npt.NDArray[np.bool_]
    gold_prob: Floats

    @classmethod
    def from_rows(cls, rows: Iterable[DistanceRow]) -> DistanceColumns:
        """From `DistanceRow`s (simulations, tests)."""
        found = list(rows)

        def column(index: int, kind: type, missing: float = np.nan) -> npt.NDArray[Any]:
            return np.array([missing if r[index] is None else r[index] for r in found], dtype=kind)

        return cls(
            trial_id=column(0, np.int64),
            batch_size=column(1, np.int64),
            token_distance=column(2, np.float64),
            parsed=column(3, bool),
            correct=column(4, bool),
            gold_prob=column(5, np.float64),
        )

    @classmethod
    def read(cls, batch: pa.RecordBatch) -> DistanceColumns:
        """From a batch of the store's columns (`queries.token_distance_rows`)."""
        return cls(
            trial_id=_integers(batch, "trial_id"),
            batch_size=_integers(batch, "batch_size"),
            token_distance=_missing(batch, "token_distance", NO_INT),
            parsed=_integers(batch, "parsed").astype(bool),
            correct=_integers(batch, "correct").astype(bool),
            gold_prob=_missing(batch, "gold_prob", NO_FLOAT),
        )

    @classmethod
    def concatenate(cls, batches: Iterable[DistanceColumns]) -> DistanceColumns:
        parts = list(batches)
        names = ("trial_id", "batch_size", "token_distance", "parsed", "correct", "gold_prob")
        if not parts:
            return cls.from_rows([])
        return cls(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in names})


@dataclass(frozen=True)
class ResultColumns:
    """A batch of answers as columns (any order), for `build`."""

    trial_id: Ints
    position: Ints
    parsed: npt.NDArray[np.bool_]
    correct: npt.NDArray[np.bool_]
    gold_prob: Floats
    """NaN where not recorded."""
    answer_slot: Floats
    """NaN where not recorded (then the line the design asked it on)."""
    token_distance: Floats
    """NaN where not recorded."""
    question: Ints
    """An integer code per question (the same question, the same code, across batches)."""
    inverse_options: Floats | None = None
    """1 / the question's options (for the chance line); None when not known."""


NO_INT = -2_147_483_648
"""What a NULL integer (answer slot, token distance) is read as: no slot or distance is negative."""
NO_FLOAT = -1.0
"""What a NULL probability is read as."""


class QuestionCodes:
    """Integer codes for question ids across batches, and each question's 1 / options (the chance line)."""

    def __init__(self, options: Callable[[set[str]], Mapping[str, int]]) -> None:
        """`options`: the number of options of each of a set of questions (a question it omits has one)."""
        self.options = options
        self.codes: dict[str, int] = {}
        self.inverse: list[float] = []

    def batch(self, batch: pa.RecordBatch) -> ResultColumns:
        import pyarrow as pa
        import pyarrow.compute as pc

        from posbias.service.store import columns

        ids = pc.dictionary_encode(batch.column("question_id").cast(pa.string()))
        names = ids.dictionary.to_pylist()  # the batch's distinct questions
        new = [name for name in names if name not in self.codes]
        if new:
            options = self.options(set(new))
            for name in new:
                self.codes[name] = len(self.codes)
                self.inverse.append(1.0 / (options.get(name, 0) or 1))
        local = np.array([self.codes[name] for name in names], dtype=np.int64)
        question = local[columns.to_numpy(ids.indices)] if names else np.zeros(0, np.int64)
        return ResultColumns(
            trial_id=_integers(batch, "trial_id"),
            position=_integers(batch, "position"),
            parsed=_integers(batch, "parsed").astype(bool),
            correct=_integers(batch, "correct").astype(bool),
            gold_prob=_missing(batch, "gold_prob", NO_FLOAT),
            answer_slot=_missing(batch, "answer_slot", NO_INT),
            token_distance=_missing(batch, "token_distance", NO_INT),
            question=question,
            inverse_options=np.asarray(self.inverse)[question] if question.size else np.zeros(0),
        )


def _integers(data: pa.Table | pa.RecordBatch, name: str) -> npt.NDArray[np.int64]:
    column = data.column(name)
    if len(column) == 0:
        return np.zeros(0, dtype=np.int64)
    from posbias.service.store import columns  # Arrow's import only where columns are read

    return columns.to_numpy(column).astype(np.int64)


def _missing(batch: pa.RecordBatch, name: str, sentinel: float) -> npt.NDArray[np.float64]:
    """Column `name` with `sentinel` read as NaN; all NaN when the batch does not have it (a read that left
    out answer slots and token distances: `queries.trial_data(placement=False)`)."""
    if name not in batch.schema.names:
        return np.full(batch.num_rows, np.nan)
    from posbias.service.store import columns

    values = np.asarray(columns.to_numpy(batch.column(name)), dtype=np.float64)
    return np.where(values == sentinel, np.nan, values)


def _texts(data: pa.Table, name: str) -> list[str]:
    return [str(text) for text in data.column(name).to_pylist()] if len(data.column(name)) else []


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _no_null(text: str) -> str:
    return "" if text.strip() == "null" else text


def build(
    trials: TrialColumns, results: Iterable[ResultColumns], *, batch_size: int, placement: bool = True
) -> TrialData:
    """From the store's columns (`service.stats.queries.trial_data` reads them): the same data as
    `from_rows` gives for the same rows (pooled alike, clusters numbered alike), built from arrays,
    batch by batch, with no Python object per answer; its memory is the trials x positions arrays.
    Keys are the stored texts of each trial's content, not tuples of ids (they compare alike)."""
    n = batch_size
    content = trials.content
    keep = np.zeros(len(content), dtype=bool)
    seen: set[bytes] = set()
    for index, text in enumerate(content):  # in (job, trial id) order, as `pool` goes
        if text not in seen:
            seen.add(text)
            keep[index] = True
    kept = np.flatnonzero(keep)
    t = kept.size
    trial_ids = trials.trial_id[kept]
    by_set = trials.by_set[kept]
    probe = trials.probe[kept]
    orders = [trials.answer_order[i] for i in kept]
    correct = np.zeros((t, n))
    parsed = np.zeros((t, n))
    answered = np.zeros((t, n))
    gold = np.full((t, n), np.nan)
    slot = np.full((t, n) if placement else (0, 0), np.nan)
    distance = np.full((t, n) if placement else (0, 0), np.nan)
    questions = np.zeros((t, n), dtype=np.int64)
    inverse_options = 0.0
    counted = 0
    sorted_order = np.argsort(trial_ids, kind="stable")
    sorted_ids = trial_ids[sorted_order]
    for batch in results:
        found = np.searchsorted(sorted_ids, batch.trial_id)
        inside = found < t
        inside[inside] = sorted_ids[found[inside]] == batch.trial_id[inside]
        inside &= (batch.position >= 1) & (batch.position <= n)
        row = sorted_order[found[inside]]
        col = batch.position[inside] - 1
        answered[row, col] = 1.0
        ok = batch.parsed[inside].astype(np.float64)
        parsed[row, col] = ok
        correct[row, col] = ok * batch.correct[inside]
        gold[row, col] = batch.gold_prob[inside]
        if placement:
            distance[row, col] = batch.token_distance[inside]
        questions[row, col] = batch.question[inside]
        if placement:
            slot[row, col] = _slots(batch.answer_slot[inside], row, col + 1, probe=probe, orders=orders)
        if batch.inverse_options is not None:
            inverse_options += float(batch.inverse_options[inside].sum())
            counted += int(inside.sum())
    cluster_keys = [
        (int(job), int(iteration), -1) if flag else (int(job), -1, int(trial))
        for job, iteration, trial, flag in zip(
            trials.job_id[kept].tolist(),
            trials.iteration[kept].tolist(),
            trial_ids.tolist(),
            by_set.tolist(),
            strict=True,
        )
    ]
    lines = np.array(
        [1.0 if p >= 1 else float(_length(o) or n) for p, o in zip(probe.tolist(), orders, strict=True)]
    ).reshape(t)
    filler = trials.filler[kept].astype(np.float64)
    return TrialData(
        batch_size=n,
        correct=correct,
        parsed=parsed,
        answered=answered,
        cluster=cluster_codes(cluster_keys),
        keys=tuple(
            (trials.questions[i].hex(),)
            if not trials.filler[i]
            else (trials.questions[i].hex(), f"filler:{trials.filler[i]}")
            for i in kept.tolist()
        ),
        questions=questions,
        gold_prob=gold,
        jobs=trials.jobs,
        duplicates=len(content) - t,
        cluster_unit="sampled set" if bool(by_set.any()) else "trial",
        chance=inverse_options / counted if counted else None,
        slot=slot if placement else None,
        distance=distance if placement else None,
        filler=filler if filler.any() else None,
        lines=lines,
    )


def _length(order: str) -> int | None:
    """Entries of a stored JSON list of numbers (None for none)."""
    text = order.strip()
    if text in ("", "null", "[]"):
        return None
    return text.count(",") + 1


def _slots(stored: Floats, rows: Ints, positions: Ints, *, probe: Ints, orders: Sequence[str]) -> Floats:
    """Each answer's line: as stored, or where none was, the line the design asked it on (`pool`'s rule)."""
    out = stored.copy()
    for i in np.flatnonzero(np.isnan(out)).tolist():
        row, position = int(rows[i]), int(positions[i])
        if probe[row] >= 1:
            out[i] = 1.0 if position == probe[row] else np.nan
        elif _length(orders[row]) is None:
            out[i] = float(position)
        else:
            asked = [int(v) for v in orders[row].strip("[] ").split(",")]
            out[i] = float(asked.index(position) + 1) if position in asked else np.nan
    return out
