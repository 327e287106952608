"""What the `hf` engine measures of attention: per (trial, position, layer) where an answer line looks, the
mask canary of the model it built, and what keeping those figures cost.

An answer line's attention is split over the prompt by region; the regions cover every key once, so the
five masses of one head sum to 1 (up to rounding):

- `own`: the question's own token span (`question_token_start` to `question_token_end`);
- `sink`: the first token and the chat template's prefix (every token before the user's text);
- `other`: the other questions' spans;
- `instructions`: the rest of the prompt (instructions, the answer request, filler, the template's suffix);
- `answers`: the answer sheet so far (earlier answer lines and this line's own tokens).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from posbias.schemas.bounds import JobId
from posbias.schemas.record import Record


class LayerKind(StrEnum):
    """What an attention layer attends over."""

    sliding = "sliding"
    """The last `window` tokens only."""
    global_ = "global"
    """Every earlier token."""


class AnswerSheet(StrEnum):
    """What the `hf` engine teacher-forces as the model's answers."""

    gold = "gold"
    """The correct option of every question (the default)."""
    fixed = "fixed"
    """Option 1 everywhere: the same text whatever the questions, so attention is compared on equal
    answers."""
    job = "job"
    """What another job of the same trials answered (`engine.answer_sheet: {job: N}`; a position it did not
    parse gets the gold answer). Recorded, never written as a bare `job`."""


class SheetFromJob(Record):
    """`engine.answer_sheet: {job: N}`: teacher-force the answers job N (a done job of the same trials, e.g.
    on vLLM) gave, so that attention pairs with what the model actually answered."""

    job: JobId = Field(description="The job whose answers are teacher-forced.")


class AttentionRow(Record):
    """The attention of one answer line in one layer: masses averaged over the line's query tokens; `_mean`
    averaged over heads, `_max` the largest head."""

    trial_index: int = Field(ge=0, description="Trial index within the job.")
    position: int = Field(ge=1, description="1-based position of the question answered.")
    layer: int = Field(ge=0, description="0-based layer index.")
    layer_kind: LayerKind = Field(description="Whether the layer slides or is global, as built.")
    token_distance: int | None = Field(
        None, description="Tokens from the question's end to its answer token (as in results)."
    )
    query_tokens: int = Field(ge=1, description="Tokens of the answer line whose attention is averaged.")
    own_mean: float = Field(description="Mass on the question's own span, head mean.")
    own_max: float = Field(description="Mass on the question's own span, largest head.")
    sink_mean: float = Field(description="Mass on the first token and the chat template's prefix, head mean.")
    sink_max: float = Field(description="Mass on the sink, largest head.")
    other_mean: float = Field(description="Mass on the other questions' spans, head mean.")
    other_max: float = Field(description="Mass on the other questions, largest head.")
    instructions_mean: float = Field(description="Mass on the rest of the prompt, head mean.")
    instructions_max: float = Field(description="Mass on the rest of the prompt, largest head.")
    answers_mean: float = Field(description="Mass on the answer sheet so far, head mean.")
    beyond_window_mean: float | None = Field(
        None,
        description="Mass on keys `window` or more tokens before the query (head mean); exactly 0 in a "
        "sliding layer; None when the model has no window.",
    )
    beyond_window_max: float | None = Field(None, description="The same, largest head.")


class LayerCheck(Record):
    """One layer of the mask canary: a prompt longer than the window, read back from the attention weights."""

    layer: int = Field(ge=0, description="0-based layer index.")
    kind: LayerKind = Field(description="The layer's kind as the built model states it.")
    window: int | None = Field(None, description="The layer's window in tokens; None for a global layer.")
    rope_theta: float | None = Field(None, description="The layer's RoPE base, from the built config.")
    beyond_mass: float = Field(
        description="Largest mass any head of any query put on keys `window` or more tokens back."
    )
    edge_mass: float = Field(
        description="Smallest, over queries, of the largest head's mass on the key `window - 1` tokens back "
        "(the window's last visible key): above 0 when the window is not narrower than stated."
    )
    passed: bool = Field(
        description="Sliding: beyond_mass is exactly 0 and edge_mass above 0; global: beyond_mass above 0."
    )


class MaskCanary(Record):
    """The mask canary of a built model: what each layer attends over, measured, not assumed."""

    window: int | None = Field(None, description="The sliding window checked against (None: no window).")
    prompt_tokens: int = Field(ge=1, description="Length of the canary prompt.")
    layers: tuple[LayerCheck, ...] = Field(description="One check per layer, in order.")
    position_gap_safe: bool | None = Field(
        None,
        description="True when adding a gap to the position ids left every sliding layer's mask where it "
        "was (the position-gap design may run); None when not checked.",
    )

    @property
    def passed(self) -> bool:
        """Every layer attends over what its kind says."""
        return all(check.passed for check in self.layers)


class AttentionShard(Record):
    """A shard's attention figures, carried on its `ShardResult` (engine `hf` only)."""

    rows: tuple[AttentionRow, ...] = Field(description="Per (trial, position, layer) of the done trials.")
    canary: MaskCanary = Field(description="The mask canary of the engine that ran the shard.")
    answer_sheet: AnswerSheet = Field(description="What was teacher-forced as the answers.")
    state_bytes_per_trial: int = Field(
        ge=0, description="Bytes of the reductions kept per trial (the largest trial of the shard)."
    )
    map_bytes_peak: int = Field(
        ge=0, description="Bytes of the largest one-layer attention map held while reducing."
    )
    peak_memory_bytes: int | None = Field(
        None, description="Peak memory of the process (CPU: resident set; GPU: allocated) after the shard."
    )


class AttentionCurvePoint(Record):
    """One point of an attention curve: the masses averaged over trials and the layers of one kind."""

    x: float = Field(description="Position, or the token-distance bin's centre.")
    n: int = Field(ge=0, description="(trial, layer) rows averaged.")
    trials: int = Field(ge=0, description="Distinct trials.")
    token_distance: float | None = Field(None, description="Mean token distance of the rows.")
    own_mean: float = Field(description="Own question, head mean.")
    own_max: float = Field(description="Own question, largest head.")
    sink_mean: float = Field(description="Sink, head mean.")
    other_mean: float = Field(description="Other questions, head mean.")
    instructions_mean: float = Field(description="The rest of the prompt, head mean.")
    answers_mean: float = Field(description="The answer sheet so far, head mean.")
    beyond_window_mean: float | None = Field(None, description="Mass beyond the window, head mean.")
    beyond_window_max: float | None = Field(None, description="Largest head's mass beyond the window.")


class AttentionCurve(Record):
    """Own-question attention (and the rest) of one job, variant, batch size and layer kind, by position or
    by token distance."""

    model: str = Field(description="Model as submitted.")
    job_id: int = Field(description="The `hf` job.")
    variant: str = Field(description="Variant name.")
    batch_size: int = Field(description="N.")
    layer_kind: LayerKind = Field(description="Sliding or global layers.")
    by: str = Field(description="`position` or `token-distance`.")
    bin_width: int | None = Field(None, description="Token-distance bin width (by token distance).")
    points: tuple[AttentionCurvePoint, ...] = Field(description="In order of x.")


class AttentionBand(Record):
    """Own-question attention of one layer kind in one band of token distance (relative to the window)."""

    layer_kind: LayerKind = Field(description="Sliding or global layers.")
    low: int = Field(ge=0, description="Token distance from (inclusive).")
    high: int | None = Field(None, description="Token distance to (exclusive); None: no upper end.")
    n: int = Field(ge=0, description="(trial, position, layer) rows averaged.")
    trials: int = Field(ge=0, description="Distinct trials.")
    own_mean: float = Field(description="Own question, head mean.")
    own_max: float = Field(description="Own question, largest head.")


class AttentionAuroc(Record):
    """Whether own-question attention predicts correctness at a fixed position: the AUROC within each
    (batch size, position), pooled over them (every correct/wrong pair of one position counts once; 0.5 is
    no prediction), with a 95% bootstrap-by-trial interval."""

    layer_kind: LayerKind = Field(description="The score: own-question attention averaged over these layers.")
    strata: int = Field(ge=0, description="(batch size, position) cells with both correct and wrong answers.")
    trials: int = Field(ge=0, description="Trials scored (the bootstrap's clusters).")
    correct: int = Field(ge=0, description="Correct answers in those cells.")
    wrong: int = Field(ge=0, description="Wrong answers in those cells.")
    auroc: float | None = Field(None, description="Pooled within-position AUROC; None when no cell has both.")
    low: float | None = Field(
        None, description="95% interval, low (bootstrap by trial); None with fewer than 16 trials."
    )
    high: float | None = Field(None, description="95% interval, high.")


class AttentionExplanation(Record):
    """The attention section of `explain`: where an `hf` job's answer lines look by token distance, per layer
    kind, and whether that attention predicts what a paired job (same trials) answered correctly."""

    model: str = Field(description="Model as submitted.")
    job_id: int = Field(description="The `hf` job with the attention rows.")
    scored_job_id: int | None = Field(
        None, description="The job whose correctness is predicted (same trials, not teacher-forced)."
    )
    variant: str = Field(description="Variant name.")
    window: int | None = Field(None, description="The sliding window as the canary built it (None: none).")
    bands: tuple[AttentionBand, ...] = Field(description="Per layer kind, by token distance.")
    decay_within_window: float | None = Field(
        None,
        description="Sliding layers: own-question attention in the window's far half over that in its near "
        "half (below 1: a decay within the window).",
    )
    global_beyond: float | None = Field(
        None,
        description="Global layers: own-question attention (head mean) of the answer lines wholly beyond "
        "the window (every query token a window or more past the question's last token).",
    )
    sliding_beyond_max: float | None = Field(
        None,
        description="Sliding layers: the largest head's own-question attention of those lines (0: the mask).",
    )
    aurocs: tuple[AttentionAuroc, ...] = Field(default=(), description="Per layer kind.")
    note: str | None = Field(None, description="Why there is no AUROC, when there is none.")
