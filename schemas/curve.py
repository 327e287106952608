"""Position curves: what the analysis returns and the CLI prints."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import Field

from posbias.schemas.record import Record

if TYPE_CHECKING:
    import pandas as pd


class CurvePoint(Record):
    """Accuracy at one position (or one token-distance bin) for one batch size."""

    batch_size: int = Field(description="N, questions per prompt.")
    position: int = Field(description="1-based position (or bin start, for token-distance curves).")
    n: int = Field(ge=0, description="Answers at this position.")
    n_correct: int = Field(ge=0, description="Correct answers.")
    n_parsed: int = Field(ge=0, description="Answers that parsed (status ok).")
    accuracy: float | None = Field(description="n_correct / n; None when n is 0.")
    ci_low: float | None = Field(description="Wilson 95% interval, lower bound.")
    ci_high: float | None = Field(description="Wilson 95% interval, upper bound.")
    parse_rate: float | None = Field(description="n_parsed / n.")
    mean_gold_prob: float | None = Field(
        None, description="Mean probability of the gold option, where recorded."
    )


class Interval(Record):
    """An estimate with a 95% interval."""

    estimate: float | None = Field(description="Point estimate.")
    low: float | None = Field(description="Lower bound of the 95% interval.")
    high: float | None = Field(description="Upper bound of the 95% interval.")


class Curve(Record):
    """One position curve: one model (and revision) at one batch size, over one or more jobs."""

    model: str = Field(description="Model name.")
    revision: str | None = Field(None, description="Model revision.")
    job_ids: tuple[int, ...] = Field(description="Jobs whose results make up the curve.")
    batch_size: int = Field(description="N.")
    by: str = Field("position", description="`position` or `token-distance`.")
    points: tuple[CurvePoint, ...] = Field(description="One point per position, in order.")
    first_last_ratio: Interval | None = Field(
        None, description="Accuracy at the last position over the first, cluster-bootstrapped over trials."
    )
    slope: Interval | None = Field(
        None, description="Least-squares accuracy change per position, cluster-bootstrapped over trials."
    )
    note: str | None = Field(
        None,
        description="What the reader must know, e.g. that some jobs' token offsets are unknown (a served "
        "model without a tokenizer), so their token distances are null.",
    )

    def to_pandas(self) -> pd.DataFrame:
        """One row per point, with the curve's model, revision and batch size as columns."""
        return _frame(
            [{"model": self.model, "revision": self.revision, **p.model_dump()} for p in self.points],
            columns=["model", "revision", *CurvePoint.model_fields],
        )


class DiffPoint(Record):
    """Difference in accuracy (B - A) at one position."""

    position: int = Field(description="1-based position.")
    accuracy_a: float | None = Field(description="Accuracy of A.")
    accuracy_b: float | None = Field(description="Accuracy of B.")
    diff: float | None = Field(description="accuracy_b - accuracy_a.")
    ci_low: float | None = Field(description="95% interval of the difference, lower bound (Newcombe).")
    ci_high: float | None = Field(description="95% interval of the difference, upper bound.")


class Comparison(Record):
    """Two curves at one batch size, position by position."""

    a: str = Field(description="Label of curve A (job id or model).")
    b: str = Field(description="Label of curve B.")
    batch_size: int = Field(description="N.")
    points: tuple[DiffPoint, ...] = Field(description="One entry per position.")
    ratio_a: Interval | None = Field(None, description="First-vs-last ratio of A.")
    ratio_b: Interval | None = Field(None, description="First-vs-last ratio of B.")

    def to_pandas(self) -> pd.DataFrame:
        """One row per position: both accuracies, the difference and its interval."""
        return _frame(
            [
                {"a": self.a, "b": self.b, "batch_size": self.batch_size, **p.model_dump()}
                for p in self.points
            ],
            columns=["a", "b", "batch_size", *DiffPoint.model_fields],
        )


class CurveAxis(StrEnum):
    """What a curve's x axis is."""

    position = "position"
    token_distance = "token-distance"


class CurveQuery(Record):
    """Which results make up a curve: a model (and revision) or a job, optionally one batch size."""

    model: str | None = Field(None, description="Model name as submitted (every job of it).")
    revision: str | None = Field(None, description="Only the jobs of this model revision.")
    batch_size: int | None = Field(None, description="Only this batch size (default: every one).")
    job_id: int | None = Field(None, description="One job instead of a model's jobs.")

    def describe(self) -> str:
        """The query in words, for messages."""
        parts = [f"model {self.model}" if self.model else "", f"job {self.job_id}" if self.job_id else ""]
        parts += [f"revision {self.revision}" if self.revision else ""]
        parts += [f"batch size {self.batch_size}" if self.batch_size else ""]
        return ", ".join(p for p in parts if p)


def _frame(rows: list[dict[str, Any]], *, columns: list[str]) -> pd.DataFrame:
    import pandas as pd  # only notebooks need it, and importing it costs a second

    return pd.DataFrame(rows, columns=columns)
