"""Position curves: what the analysis returns and the CLI prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from posbias.schemas.choices import BASELINE
from posbias.schemas.choices import CurveAxis as CurveAxis
from posbias.schemas.record import Record

if TYPE_CHECKING:
    import pandas as pd


class CurvePoint(Record):
    """Accuracy at one position (or one token-distance bin) for one batch size.

    An answer *parsed* when the parser read exactly one valid option for it (status `ok`); every other
    status (missing, duplicate, out of range, unparseable) is a parse failure and is never correct.
    `accuracy` (the headline) is among parsed answers; `accuracy_strict` counts failures as wrong, as the seed
    notebook did; `parse_rate` is judged apart.
    """

    batch_size: int = Field(description="N, questions per prompt.")
    position: int = Field(
        description="1-based position; or the answer slot, the token-distance bin's start or the filler "
        "length, for curves by those."
    )
    x: float = Field(
        description="Where the point is plotted: the position (slot, filler length), or the token-distance "
        "bin's centre."
    )
    n: int = Field(ge=0, description="Answers here, parsed or not.")
    n_parsed: int = Field(ge=0, description="Answers that parsed (status ok).")
    n_correct: int = Field(ge=0, description="Correct answers (all of them parsed).")
    accuracy: float | None = Field(
        description="n_correct / n_parsed: accuracy among parsed answers; None if none."
    )
    ci_low: float | None = Field(
        description="Pointwise 95% interval of `accuracy`, lower bound: Wilson's, widened by the design "
        "effect when one cluster (trial, or sampled set under rotation) gives several answers here."
    )
    ci_high: float | None = Field(description="Pointwise 95% interval of `accuracy`, upper bound.")
    band_low: float | None = Field(
        None,
        description="Simultaneous 95% band over every point of the curve, lower bound (max-|t| cluster "
        "bootstrap); None when not asked for.",
    )
    band_high: float | None = Field(None, description="Simultaneous 95% band, upper bound.")
    parse_rate: float | None = Field(description="n_parsed / n.")
    accuracy_strict: float | None = Field(
        description="n_correct / n: failed parses counted as wrong (the seed's scoring)."
    )
    mean_gold_prob: float | None = Field(
        None, description="Mean probability of the gold option, where recorded."
    )


class Interval(Record):
    """An estimate with a 95% interval."""

    estimate: float | None = Field(description="Point estimate.")
    low: float | None = Field(description="Lower bound of the 95% interval.")
    high: float | None = Field(description="Upper bound of the 95% interval.")


class Curve(Record):
    """One curve: one model (and revision) under one variant at one batch size, over one or more jobs.

    Answers of one prompt are not independent, and neither are the rotations of one sampled set: every
    interval treats a *cluster* (a trial, or under rotation a sampled set) as the unit of sampling.
    """

    model: str = Field(description="Model name.")
    revision: str | None = Field(None, description="Model revision.")
    job_ids: tuple[int, ...] = Field(description="Jobs whose results make up the curve.")
    variant: str = Field(BASELINE, description="The engine configuration that answered (`baseline`, ...).")
    batch_size: int = Field(description="N.")
    by: str = Field(
        "position", description="`position`, `answer-slot`, `token-distance` or `filler-length`: the x axis."
    )
    filler_tokens: int | None = Field(
        None,
        description="The filler length of the trials behind the curve, when they all have one (a filler "
        "sweep gives one curve per length: the rows of its length x position grid); None without filler, "
        "or pooled over lengths.",
    )
    points: tuple[CurvePoint, ...] = Field(description="One point per position (or bin), in order.")
    trials: int = Field(0, description="Distinct trials the curve is made of.")
    clusters: int = Field(0, description="Independent clusters among them (trials, or sampled sets).")
    cluster_unit: str = Field("trial", description="`trial`, or `sampled set` when a job used rotation.")
    duplicate_trials: int = Field(
        0,
        description="Trials left out because an earlier job of the pool showed the same questions in the "
        "same order and options: pooled jobs count each distinct trial once.",
    )
    chance: float | None = Field(
        None, description="Accuracy of guessing: the mean over questions of 1 / number of options."
    )
    contrast: Interval | None = Field(
        None,
        description="Last minus first position's accuracy (the headline contrast), cluster-bootstrap "
        "percentile interval.",
    )
    first_last_ratio: Interval | None = Field(
        None,
        description="Last over first position's accuracy, cluster-bootstrap percentile interval; None unless "
        "the first position's accuracy is bounded away from zero (its interval's lower bound at least 0.1).",
    )
    ratio_note: str | None = Field(None, description="Why there is no ratio, or how many resamples hit 0.")
    slope: Interval | None = Field(
        None,
        description="Accuracy change per position: least squares of correctness on position with errors "
        "clustered, adjusted for question difficulty.",
    )
    position_effect: Interval | None = Field(
        None,
        description="The same fit as the change from the first position to the last, comparable across "
        "batch sizes.",
    )
    shape_p: float | None = Field(
        None,
        description="p-value of the test that accuracy does not depend on position at all (positions "
        "permuted within each cluster; valid under the random and rotation designs).",
    )
    shape_method: str | None = Field(
        None,
        description="How `shape_p` was found: `permutation` (999 permutations within clusters) or "
        "`large-sample` (the permutation distribution's chi-squared form, for jobs past 50,000 answers and "
        "500 clusters).",
    )
    note: str | None = Field(
        None,
        description="What the reader must know, e.g. that some jobs' token offsets are unknown (a served "
        "model without a tokenizer), so their token distances are null, or that its clusters are too few "
        "for the bootstrap's intervals to hold their level.",
    )

    def to_pandas(self) -> pd.DataFrame:
        """One row per point, with the curve's model, revision, variant and batch size as columns."""
        return _frame(
            [
                {
                    "model": self.model,
                    "revision": self.revision,
                    "variant": self.variant,
                    "filler_tokens": self.filler_tokens,
                    **p.model_dump(),
                }
                for p in self.points
            ],
            columns=["model", "revision", "variant", "filler_tokens", *CurvePoint.model_fields],
        )


class DiffPoint(Record):
    """Difference in accuracy (B - A) at one position."""

    position: int = Field(description="1-based position.")
    accuracy_a: float | None = Field(description="Accuracy of A (among parsed answers).")
    accuracy_b: float | None = Field(description="Accuracy of B (among parsed answers).")
    diff: float | None = Field(description="accuracy_b - accuracy_a.")
    ci_low: float | None = Field(
        description="Pointwise 95% interval of the difference, lower bound (cluster bootstrap; paired over "
        "matched trials)."
    )
    ci_high: float | None = Field(description="Pointwise 95% interval of the difference, upper bound.")
    band_low: float | None = Field(
        None, description="Simultaneous 95% band over all positions, lower bound (max-|t| bootstrap)."
    )
    band_high: float | None = Field(None, description="Simultaneous 95% band, upper bound.")
    different: bool = Field(False, description="The simultaneous band excludes zero.")
    mcnemar_p: float | None = Field(
        None,
        description="Exact McNemar p-value over matched trials where both parsed (paired comparisons only; "
        "pointwise, not adjusted for the number of positions).",
    )
    mcnemar_holm: float | None = Field(
        None,
        description="`mcnemar_p` adjusted over the positions (Holm): below 0.05 at a position is a "
        "difference at 5% over all positions. Never used for `different`, which the band decides.",
    )


class BlockDiff(Record):
    """A difference (B - A) over a block of consecutive positions pooled, or at one position, within a
    family whose band holds over all its members at once."""

    first_position: int = Field(description="1-based first position of the block.")
    last_position: int = Field(description="1-based last position of the block (the first, for one).")
    a: float | None = Field(description="A's value (accuracy among parsed answers, or parse rate).")
    b: float | None = Field(description="B's value.")
    diff: float | None = Field(description="b - a.")
    band_low: float | None = Field(
        None, description="Simultaneous 95% band over the family, lower bound (max-|t| cluster bootstrap)."
    )
    band_high: float | None = Field(None, description="Simultaneous 95% band, upper bound.")
    different: bool = Field(False, description="The family's band excludes zero here.")

    @property
    def where(self) -> str:
        """`position 7` or `positions 1-10`."""
        if self.first_position == self.last_position:
            return f"position {self.first_position}"
        return f"positions {self.first_position}-{self.last_position}"


class Comparison(Record):
    """Two curves at one batch size, position by position."""

    a: str = Field(description="Label of curve A (job id or model).")
    b: str = Field(description="Label of curve B.")
    batch_size: int = Field(description="N.")
    method: str = Field(
        "unpaired",
        description="`paired` (every trial of each side has its match: same questions at the same "
        "positions), `unpaired` (none has), or `partly paired` (matched trials paired, the rest unpaired, "
        "in one bootstrap).",
    )
    matched_trials: int = Field(0, description="Trials of A with a match in B.")
    trials_a: int = Field(0, description="Distinct trials of A.")
    trials_b: int = Field(0, description="Distinct trials of B.")
    points: tuple[DiffPoint, ...] = Field(description="One entry per position.")
    contrast_diff: Interval | None = Field(
        None, description="B's last-minus-first contrast minus A's (cluster bootstrap)."
    )
    slope_diff: Interval | None = Field(
        None, description="B's least-squares slope of accuracy on position minus A's (cluster bootstrap)."
    )
    contrast_a: Interval | None = Field(None, description="A's last-minus-first contrast.")
    contrast_b: Interval | None = Field(None, description="B's last-minus-first contrast.")
    blocks: tuple[BlockDiff, ...] = Field(
        (),
        description="Accuracy difference over blocks of positions (a tenth, a fifth, a half of the prompt, "
        "all of it), in one family with the positions: `different` where the family's simultaneous band "
        "excludes zero (the schedule verdict's family; a drop spread over several positions shows here). "
        "Blocks of each width at every start.",
    )
    located: BlockDiff | None = Field(
        None,
        description="Of the positions and blocks marked different, the one that best fits the difference: "
        "the largest difference in bootstrap standard errors (a uniform change is best fitted by the whole "
        "curve, a change at some positions by the block nearest them). None when nothing is marked.",
    )
    parse: tuple[BlockDiff, ...] = Field(
        (),
        description="Parse-rate difference at every position and block, with its own simultaneous band "
        "(positions where answers stopped parsing show here, whatever their accuracy).",
    )
    warning: str | None = Field(
        None, description="Why the intervals cannot be read at their level: too few clusters for the method."
    )

    def to_pandas(self) -> pd.DataFrame:
        """One row per position: both accuracies, the difference, its intervals and the band."""
        return _frame(
            [
                {"a": self.a, "b": self.b, "batch_size": self.batch_size, **p.model_dump()}
                for p in self.points
            ],
            columns=["a", "b", "batch_size", *DiffPoint.model_fields],
        )


class OptionPoint(Record):
    """Which options a model answers at one position, against which options are right there."""

    position: int = Field(description="1-based position.")
    n: int = Field(description="Parsed answers here.")
    accuracy: float | None = Field(description="Accuracy among parsed answers.")
    predicted_share: tuple[float, ...] = Field(
        description="Per shown option (1st, 2nd, ...), the share of parsed answers that chose it."
    )
    gold_share: tuple[float, ...] = Field(
        description="Per shown option, the share of these answers whose gold option it is."
    )
    entropy: float | None = Field(
        None,
        description="Mean entropy of the option probabilities, in bits (2 bits: four options equally "
        "likely; 0: certain); None where no probabilities were recorded.",
    )
    confidence: float | None = Field(
        None, description="Mean probability of the most probable option (the model's confidence)."
    )
    debiased_accuracy: Interval | None = Field(
        None,
        description="Accuracy after removing the model's option prior at this position (PriDe: the prior "
        "estimated from trials with shuffled options, every answer re-chosen as the most probable option "
        "divided by the prior; cross-fitted, each fifth of the clusters debiased with the others' prior); "
        "cluster-bootstrap interval that re-estimates the prior. None without shuffled options or option "
        "probabilities.",
    )
    prior: tuple[float, ...] | None = Field(
        None, description="The estimated option prior at this position (sums to 1)."
    )
    reading: str | None = Field(
        None,
        description="`collapse onto option K` (one option chosen far more often than it is right), `a "
        "guess` (accuracy near chance, probabilities spread) or `confident and wrong` (accuracy near "
        "chance, the top option highly probable); None when accuracy is clear of chance.",
    )


class OptionsView(Record):
    """Options by position for one batch size of a job (or a model's jobs, pooled): why early answers sit
    at chance, when they do."""

    model: str = Field(description="Model name.")
    job_ids: tuple[int, ...] = Field(description="Jobs whose results make it up.")
    variant: str = Field(BASELINE, description="The variant.")
    batch_size: int = Field(description="N.")
    options: int = Field(description="Options per question (the most shown).")
    chance: float | None = Field(None, description="Accuracy of guessing.")
    trials: int = Field(0, description="Trials behind it.")
    prior_trials: int = Field(
        0,
        description="Trials with shuffled options used to estimate the option prior (left out of the rest).",
    )
    points: tuple[OptionPoint, ...] = Field(description="One per position.")
    readings: tuple[str, ...] = Field(
        (), description="Runs of positions with one reading, e.g. `positions 1-8: a collapse onto option 4`."
    )
    note: str | None = Field(None, description="What could not be computed, and why.")


class CurveQuery(Record):
    """Which results make up a curve: a model (and revision) or a job, optionally one variant and one
    batch size."""

    model: str | None = Field(None, description="Model name as submitted (every job of it).")
    revision: str | None = Field(None, description="Only the jobs of this model revision.")
    batch_size: int | None = Field(None, description="Only this batch size (default: every one).")
    job_id: int | None = Field(None, description="One job instead of a model's jobs.")
    variant: str | None = Field(
        None, description="Only this variant (default: every one, each its own curve; never pooled)."
    )

    def describe(self) -> str:
        """The query in words, for messages."""
        parts = [f"model {self.model}" if self.model else "", f"job {self.job_id}" if self.job_id else ""]
        parts += [f"revision {self.revision}" if self.revision else ""]
        parts += [f"variant {self.variant}" if self.variant else ""]
        parts += [f"batch size {self.batch_size}" if self.batch_size else ""]
        return ", ".join(p for p in parts if p)


def _frame(rows: list[dict[str, Any]], *, columns: list[str]) -> pd.DataFrame:
    import pandas as pd  # only notebooks need it, and importing it costs a second

    return pd.DataFrame(rows, columns=columns)
