"""What `posbias explain` says: which of position, answer slot and token distance moves a job's curve, and
whether the model's sliding window puts a step in it."""

from __future__ import annotations

from pydantic import Field

from posbias.schemas.curve import Interval
from posbias.schemas.record import Record


class Effect(Record):
    """One candidate cause, fitted together with the others."""

    name: str = Field(description="`position`, `answer slot` or `token distance`.")
    unit: str = Field(description="What the estimate measures, e.g. `first to last` or `per 1,000 tokens`.")
    status: str = Field(
        description="`estimated`; `held fixed` (the design does not vary it: a probe's slot); or `not "
        "estimable` (the design moves it in lockstep with another, e.g. slot and position in forward order)."
    )
    effect: Interval | None = Field(
        None,
        description="Change in accuracy (points as a fraction) over the unit, with its 95% interval: least "
        "squares with errors clustered by trial (or sampled set), t with clusters - 1 degrees of freedom.",
    )
    p: float | None = Field(None, description="Two-sided p-value of no effect.")
    distinguishable: bool = Field(False, description="The 95% interval excludes zero.")
    range_covered: tuple[float, float] | None = Field(
        None, description="The smallest and largest value of this variable among the answers fitted."
    )
    note: str | None = Field(None, description="Why it is held fixed or not estimable.")


class Confound(Record):
    """Candidate causes this design moves together, so that it cannot say which of them acts."""

    effects: tuple[str, ...] = Field(description="The causes that move together.")
    correlation: float | None = Field(
        None, description="Correlation of the two over the answers fitted (the largest pair, for three)."
    )
    joint_p: float | None = Field(
        None, description="p-value of the joint test that none of them moves the curve (clustered Wald)."
    )
    moves_curve: bool = Field(False, description="The joint test rejects at 5%.")
    fix: str = Field(description="A design that would separate them.")


class WindowStep(Record):
    """A step in accuracy at the model's sliding window, on the token-distance axis, beyond a smooth
    decay."""

    window: int = Field(description="The model's sliding window, in tokens.")
    sliding_layers: tuple[int, ...] | None = Field(None, description="The layers that use it (0-based).")
    num_layers: int | None = Field(None, description="The model's layers.")
    answers_inside: int = Field(description="Parsed answers whose question is inside the window.")
    answers_beyond: int = Field(description="Parsed answers whose question is beyond it.")
    tested: bool = Field(description="False when the design's distances do not straddle the window.")
    jump: Interval | None = Field(
        None,
        description="Accuracy just beyond the window minus just inside it, over a smooth decay (position, "
        "slot, distance and distance squared, question difficulty), with its 95% interval (clustered).",
    )
    p: float | None = Field(
        None,
        description="p-value of no step at the window (clustered Wald test, the robust equivalent of "
        "a likelihood-ratio test of the step model against the smooth one).",
    )
    found: bool = Field(False, description="p < 0.05: a step at the window.")
    break_low: int | None = Field(
        None,
        description="Where the data put the step, when one is found: it lies after this distance ...",
    )
    break_high: int | None = Field(None, description="... and at or before this one (the best split).")
    break_interval: tuple[float, float] | None = Field(
        None,
        description="95% interval of the step's location (cluster bootstrap of the best split over every "
        "observed distance, trimmed 5% each side).",
    )
    window_in_interval: bool | None = Field(
        None, description="The window lies inside `break_interval`: the step is where the window is."
    )
    note: str | None = Field(None, description="Why it was not tested, or what the test cannot tell.")


class Explanation(Record):
    """Which candidate causes move one batch size's accuracy, fitted together."""

    model: str = Field(description="Model name.")
    revision: str | None = Field(None, description="Model revision.")
    job_ids: tuple[int, ...] = Field(description="Jobs pooled (each distinct trial once).")
    batch_size: int = Field(description="N.")
    design: str = Field(description="The jobs' designs in words.")
    trials: int = Field(description="Distinct trials.")
    clusters: int = Field(description="Independent clusters among them.")
    cluster_unit: str = Field(description="`trial`, or `sampled set` (rotation, filler sweeps).")
    answers: int = Field(description="Parsed answers fitted.")
    difficulty_adjusted: bool = Field(
        description="Question difficulty entered as a covariate (left out when the design balances it)."
    )
    effects: tuple[Effect, ...] = Field(description="Position, answer slot, token distance.")
    confounds: tuple[Confound, ...] = Field(description="Causes this design cannot tell apart.")
    window: WindowStep | None = Field(None, description="The step test; None for a model without a window.")
    verdict: str = Field(description="What moves the curve, in one or two sentences.")
