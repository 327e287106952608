"""Position curves: what the analysis returns and the CLI prints."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    """Base for analysis outputs."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class CurvePoint(Frozen):
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


class Interval(Frozen):
    """An estimate with a 95% interval."""

    estimate: float | None = Field(description="Point estimate.")
    low: float | None = Field(description="Lower bound of the 95% interval.")
    high: float | None = Field(description="Upper bound of the 95% interval.")


class Curve(Frozen):
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


class DiffPoint(Frozen):
    """Difference in accuracy (B - A) at one position."""

    position: int = Field(description="1-based position.")
    accuracy_a: float | None = Field(description="Accuracy of A.")
    accuracy_b: float | None = Field(description="Accuracy of B.")
    diff: float | None = Field(description="accuracy_b - accuracy_a.")
    ci_low: float | None = Field(description="95% interval of the difference, lower bound (Newcombe).")
    ci_high: float | None = Field(description="95% interval of the difference, upper bound.")


class Comparison(Frozen):
    """Two curves at one batch size, position by position."""

    a: str = Field(description="Label of curve A (job id or model).")
    b: str = Field(description="Label of curve B.")
    batch_size: int = Field(description="N.")
    points: tuple[DiffPoint, ...] = Field(description="One entry per position.")
    ratio_a: Interval | None = Field(None, description="First-vs-last ratio of A.")
    ratio_b: Interval | None = Field(None, description="First-vs-last ratio of B.")
