"""What `posbias explain` says: which of position, answer slot and token distance moves a job's curve, and
whether the model's sliding window puts a step in it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from posbias.schemas.curve import Interval
from posbias.schemas.record import Record, records_frame

if TYPE_CHECKING:
    import pandas as pd


class Effect(Record):
    """One candidate cause, fitted flexibly and together with the others."""

    name: str = Field(description="`position`, `answer slot` or `token distance`.")
    unit: str = Field(description="What `effect` measures, e.g. `first to last` or `per 1,000 tokens`.")
    status: str = Field(
        description="`estimated`; `held fixed` (the design does not vary it: a probe's slot); or `not "
        "estimable` (the design moves it in lockstep with another, e.g. slot and position in forward order)."
    )
    effect: Interval | None = Field(
        None,
        description="The cause's summary change in accuracy (a fraction), with its 95% interval: the "
        "fitted curve's last minus first (position, slot), or its smooth part's average change per 1,000 "
        "tokens over `span` (distance); least squares with errors clustered by trial (or sampled set), t "
        "with clusters - 1 degrees of freedom.",
    )
    bend: Interval | None = Field(
        None,
        description="Position and slot: the fitted curve at the middle (`bend_at`) minus the mean of its "
        "two ends, with its 95% interval (negative: a U, lowest in the middle).",
    )
    bend_at: tuple[float, ...] | None = Field(
        None,
        description="Position and slot: the relative values (0 first, 1 last) the bend's middle is taken at: "
        "the observed one or two nearest 0.5.",
    )
    span: tuple[float, float] | None = Field(
        None, description="Token distance: the distances (5th to 95th percentile) `effect` is measured over."
    )
    terms: int | None = Field(
        None,
        description="Terms of the cause in the fit, tested together (the Wald test's degrees of freedom).",
    )
    p: float | None = Field(
        None,
        description="p-value of the joint test that none of the cause's terms moves the curve (clustered "
        "Wald, F with `terms` and clusters - 1 degrees of freedom), Holm-adjusted over the causes and groups "
        "tested.",
    )
    p_single: float | None = Field(None, description="The joint test's p-value before Holm's adjustment.")
    distinguishable: bool = Field(
        False,
        description="The joint test rejects at 5% (Holm-adjusted) and the design separates the cause from "
        "the others: it moves the curve.",
    )
    information: float | None = Field(
        None,
        description="Share of the cause's variation (its terms') that the other causes do not explain "
        "(geometric mean over its terms; 1: a design that varies it alone, 0: in lockstep).",
    )
    separable: bool = Field(
        True, description="`information` is at or above the threshold explain uses (`Explanation.threshold`)."
    )
    rules_out: float | None = Field(
        None,
        description="For a cause that does not move the curve: the largest change its 95% intervals allow "
        "(in `unit`, or points for the bend): effects beyond +/- this are ruled out.",
    )
    reading: str = Field(
        "",
        description="What the table says of it: `moves the curve`, `no effect larger than +/-X`, `cannot "
        "tell`, `not separable from ...`, `held fixed`, `not estimable` (the verdict says the same).",
    )
    range_covered: tuple[float, float] | None = Field(
        None, description="The smallest and largest value of this variable among the answers fitted."
    )
    note: str | None = Field(None, description="Why it is held fixed or not estimable.")


class Confound(Record):
    """Candidate causes this design does not separate (each has too little variation of its own), so that it
    cannot say which of them acts."""

    effects: tuple[str, ...] = Field(description="The causes that move together.")
    correlation: float | None = Field(
        None, description="Correlation of two of them over the answers fitted (the largest pair, for three)."
    )
    information: float | None = Field(None, description="The smallest `Effect.information` among them.")
    terms: int | None = Field(
        None, description="Terms tested together (the joint test's degrees of freedom)."
    )
    joint_p: float | None = Field(
        None,
        description="p-value of the joint test that none of them moves the curve (clustered Wald), "
        "Holm-adjusted with the causes' tests.",
    )
    moves_curve: bool = Field(False, description="The joint test rejects at 5%.")
    fix: str = Field(description="A design that would separate them.")

    @property
    def named(self) -> str:
        """The causes as a sentence names them: "a and b", "a, b and c"."""
        return listed(self.effects)


def listed(names: Sequence[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 2 else " and ".join(names)


class WindowStep(Record):
    """A step in accuracy at the model's sliding window, on the token-distance axis, beyond a smooth
    decay: a term of the token distance in the joint fit."""

    window: int = Field(description="The model's sliding window, in tokens.")
    sliding_layers: tuple[int, ...] | None = Field(None, description="The layers that use it (0-based).")
    num_layers: int | None = Field(None, description="The model's layers.")
    answers_inside: int = Field(description="Parsed answers whose question is inside the window.")
    answers_beyond: int = Field(description="Parsed answers whose question is beyond it.")
    tested: bool = Field(description="False when the design's distances do not straddle the window.")
    jump: Interval | None = Field(
        None,
        description="Accuracy just beyond the window minus just inside it, over the smooth decay of the "
        "joint fit (a natural spline in distance, with position, slot and question difficulty), with its 95% "
        "interval (clustered).",
    )
    p: float | None = Field(
        None,
        description="p-value of no step at the window (its term's clustered Wald test), adjusted in the "
        "causes' Holm family, where it is tested after the token distance with distance's share of the "
        "level.",
    )
    found: bool = Field(
        False,
        description="A step: p < 0.05 and the token distance moves the curve (its joint test, step included, "
        "rejects), so that the step is never reported for a cause the verdict clears.",
    )
    direction: str | None = Field(
        None, description="`down` (worse beyond the window, as a window would do) or `up`, when found."
    )
    rules_out: float | None = Field(
        None, description="When tested and not found: the largest step (points) its 95% interval allows."
    )
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
    informative: bool | None = Field(
        None,
        description="`break_interval` is narrow against the window (at most half of it wide), so that it can "
        "say whether the step is at the window.",
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
    cluster_unit: str = Field(description="`trial`, or `sampled set` (rotation, filler sweeps, probes).")
    answers: int = Field(description="Parsed answers fitted.")
    difficulty_adjusted: bool = Field(
        description="Question difficulty entered as a covariate (left out when the design balances it)."
    )
    threshold: float | None = Field(
        None, description="The `Effect.information` below which a cause is reported as not separable."
    )
    effects: tuple[Effect, ...] = Field(description="Position, answer slot, token distance.")
    confounds: tuple[Confound, ...] = Field(description="Causes this design cannot tell apart.")
    window: WindowStep | None = Field(None, description="The step test; None for a model without a window.")
    verdict: str = Field(description="What moves the curve, in one or two sentences.")
    left_out: str | None = Field(
        None,
        description="What explain left out of the jobs' batch sizes and why, e.g. `batch size 1 has no "
        "position to explain: ...` (on the first explanation only).",
    )
    sample: str | None = Field(
        None,
        description="Set when the fit ran on a random sample of whole clusters (jobs past 300,000 parsed "
        "answers at one batch size): how many of how many, and why.",
    )

    def to_pandas(self) -> pd.DataFrame:
        """One row per candidate cause (`Effect`, intervals as `effect_estimate`, `effect_low`, ...), with
        the model, revision and batch size as columns."""
        same = {"model": self.model, "revision": self.revision, "batch_size": self.batch_size}
        return records_frame(self.effects, same=same)
