"""The fake engine's behaviour: a model whose accuracy by position (or answer slot, or token distance) is
known, for tests and for checking the estimators against a truth."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, model_validator

from posbias.schemas.bounds import FINITE
from posbias.schemas.choices import FakeAxis as FakeAxis
from posbias.schemas.record import Record

# numpy is imported by the methods that compute: settings load this module, and most commands need no numpy.


class FakeCollapse(Record):
    """An option prior at some positions: the fake's answer probabilities there are its belief times a
    prior favouring one option (renormalised), and it writes the most probable. A strong prior collapses
    its answers onto that option while its belief still knows the answer (what removing the prior, PriDe,
    recovers)."""

    model_config = FINITE

    option: int = Field(ge=1, le=26, description="The favoured option, 1-based as displayed (4 = the 4th).")
    positions: tuple[int, int] = Field(
        description="First and last 1-based positions where the prior applies (e.g. [1, 8])."
    )
    prior: float = Field(
        0.9,
        gt=0.0,
        lt=1.0,
        description="The prior's probability of the favoured option (the other options share the rest).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if not 1 <= self.positions[0] <= self.positions[1]:
            raise ValueError("collapse positions must be [first, last] with 1 <= first <= last")
        return self

    def applies(self, position: int) -> bool:
        """Whether the prior applies at 1-based `position`."""
        return self.positions[0] <= position <= self.positions[1]

    def weights(self, n_options: int) -> list[float]:
        """The prior over `n_options` shown options (uniform when the favoured one is not among them)."""
        if self.option > n_options or n_options < 2:
            return [1.0 / n_options] * n_options
        rest = (1.0 - self.prior) / (n_options - 1)
        return [self.prior if i == self.option - 1 else rest for i in range(n_options)]


class FakeMechanism(Record):
    """A cause of the fake's curve that responds to a variant as the mechanism would (`posbias diagnose`
    is checked on it): a step at the sliding window that vanishes when every layer is global, and a decay
    with RoPE distance that follows that distance, which a position gap lengthens and a larger RoPE base
    shortens; and two causes no variant acts on, a drop by position and a drop by answer slot. The
    intervention fields are set by a job's variants (`global-only`, `rope-base:x<f>`, a variant `{name,
    fake: {mechanism: {position_gap: G}}}`), not by hand."""

    model_config = FINITE

    accuracy: float = Field(0.7, ge=0.0, le=1.0, description="Accuracy where no mechanism takes any away.")
    window_step: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Accuracy lost by an answer whose question is at or beyond the fake's `window` (needs "
        "`window`); none under `global_only`.",
    )
    rope_decay: float = Field(
        0.0, ge=0.0, le=1.0, description="Accuracy lost at a RoPE distance of `rope_span`, linearly from 0."
    )
    rope_span: int = Field(
        4096, ge=1, description="RoPE distance (tokens) where the decay reaches `rope_decay` (flat beyond)."
    )
    rope_theta: float = Field(10000.0, gt=0.0, description="The RoPE base the fake reports as its model's.")
    global_only: bool = Field(False, description="Every layer global (variant `global-only`): no step.")
    rope_factor: float = Field(
        1.0, gt=0.0, description="RoPE base multiplier (variant `rope-base:x<f>`): distances shrink by it."
    )
    position_gap: int = Field(
        0, ge=0, description="Position ids added after the last question (as the hf engine's gap)."
    )
    position_drop: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Accuracy lost at the first position, linearly to none at the last (position as such: "
        "no variant changes it).",
    )
    slot_drop: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Accuracy lost on the first answer line, linearly to none on the last (the answer's "
        "slot: no variant changes it).",
    )

    def accuracy_at(
        self,
        distance: Any,
        *,
        window: int | None,
        position: Any = 1,
        batch_size: int = 1,
        slot: Any = 1,
        answers: int = 1,
    ) -> Any:
        """True accuracy at token `distance`, 1-based `position` of `batch_size` and answer `slot` of
        `answers` lines (numbers or arrays alike)."""
        import numpy as np

        d = np.asarray(distance, dtype=np.float64)
        rope = (d + self.position_gap) / (self.rope_factor * self.rope_span)
        found = self.accuracy - self.rope_decay * np.minimum(rope, 1.0)
        if window is not None and not self.global_only:
            found = found - self.window_step * (d >= window)
        for drop, at, count in ((self.position_drop, position, batch_size), (self.slot_drop, slot, answers)):
            if drop:
                early = 1.0 - (np.asarray(at, dtype=np.float64) - 1) / (count - 1) if count > 1 else 1.0
                found = found - drop * early
        found = np.clip(found, 0.0, 1.0)
        return float(found) if found.ndim == 0 else found


class FakeSpec(Record):
    """The fake engine's behaviour: a model whose accuracy by position is known, with the dependence
    between answers a real model shows.

    The accuracy at each position follows `curve` (or the line from `first` to `last`), and that is the true
    marginal accuracy there whatever the effects below. Answers are correlated as a model's are: every
    answer is correct when a latent score falls below the position's threshold, and the score is a sum of a
    part shared by every answer to the same question (`question_effect`: some questions are hard), a part
    shared by the answers of one prompt (`prompt_effect`: some prompts go badly; prompts showing the same
    questions, such as the rotations of one set, share it) and noise of the fake's own (`seed`). The
    question and prompt parts depend only on the content, so two fakes with different seeds answer the same
    trials with correlated answers, as two checkpoints of one model do.
    """

    model_config = FINITE

    first: float = Field(0.25, ge=0.0, le=1.0, description="Probability of a correct answer at position 1.")
    last: float = Field(0.55, ge=0.0, le=1.0, description="Probability of a correct answer at position N.")
    curve: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] | None = Field(
        None,
        min_length=2,
        description="Accuracy at evenly spaced points from the first position to the last, interpolated "
        "linearly (e.g. [0.6, 0.3, 0.6] is a U); replaces `first` and `last` when given.",
    )
    depends_on: FakeAxis = Field(
        FakeAxis.position,
        description="What the accuracy is a function of: the question's `position`, its `answer-slot` (the "
        "line it is answered on; `first` is slot 1), or its `token-distance` to its answer (`first` at "
        "distance 0 or inside `window`, `last` at `distance_span` or beyond `window`).",
    )
    window: int | None = Field(
        None,
        ge=1,
        description="A sliding window in tokens, reported as a real model's is (layers 0 and 2 of 4 slide); "
        "with depends_on token-distance the accuracy steps there, from `first` inside to `last` beyond.",
    )
    distance_span: int = Field(
        4096,
        ge=1,
        description="With depends_on token-distance and no window: the distance (tokens) over which the "
        "curve runs from its first point to its last (constant beyond).",
    )
    question_effect: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of the latent variance shared by answers to one question."
    )
    prompt_effect: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of the latent variance shared by the answers of one prompt."
    )
    seed: int | None = Field(
        None, description="Seed of the fake's own noise; the job's seed when not set (see the class)."
    )
    malformed: float = Field(0.0, ge=0.0, le=1.0, description="Rate of unparseable answer lines.")
    collapse: FakeCollapse | None = Field(
        None,
        description="An option prior at some positions (see FakeCollapse): e.g. {option: 4, positions: "
        "[1, 8]} answers option 4 there whatever the question.",
    )
    mechanism: FakeMechanism | None = Field(
        None,
        description="A mechanism behind the curve that variants act on (see FakeMechanism); replaces "
        "`curve`, `first`, `last` and `depends_on` when given.",
    )
    delay_s: float = Field(0.0, ge=0.0, le=60.0, description="Seconds the fake engine sleeps per prompt.")
    as_gpu: bool = Field(
        False,
        description="Reserve for the fake's actor what a vLLM engine on GPUs reserves "
        "(`engine.tensor_parallel_size` GPUs on one node), for placement and autoscaling tests on simulated "
        "GPU nodes; the fake itself uses none.",
    )
    events_file: str | None = Field(
        None,
        description="A file the fake engine appends `load` and `close` lines to (with its process id), so a "
        "test can see that an engine was closed before its actor ended.",
    )

    @model_validator(mode="after")
    def _effects_leave_noise(self) -> Self:
        if self.question_effect + self.prompt_effect >= 1.0:
            raise ValueError("question_effect + prompt_effect must be below 1 (the rest is the fake's noise)")
        return self

    def accuracy(self, position: int, batch_size: int) -> float:
        """True probability of a correct answer at 1-based `position` in a prompt of `batch_size` (for a
        fake that depends on position; `accuracy_of` for any)."""
        import numpy as np

        where = 0.0 if batch_size <= 1 else (position - 1) / (batch_size - 1)
        points = self.curve if self.curve is not None else (self.first, self.last)
        if batch_size <= 1:
            return points[0]
        return float(np.interp(where, np.linspace(0.0, 1.0, len(points)), points))

    def accuracy_of(
        self,
        *,
        position: Any,
        batch_size: int,
        slot: Any = None,
        answers: int | None = None,
        distance: Any = None,
    ) -> Any:
        """True probability of a correct answer, by `depends_on`: at `position` of `batch_size`, at answer
        `slot` of `answers` lines, or at token `distance`. Takes numbers or numpy arrays alike."""
        import numpy as np

        if self.mechanism is not None:
            if distance is None:
                raise ValueError("a fake with a mechanism needs each answer's distance")
            return self.mechanism.accuracy_at(
                distance,
                window=self.window,
                position=position,
                batch_size=batch_size,
                slot=1 if slot is None else slot,
                answers=1 if answers is None else answers,
            )
        points = np.asarray(self.curve if self.curve is not None else (self.first, self.last))
        if self.depends_on is FakeAxis.position:
            along, count = position, batch_size
        elif self.depends_on is FakeAxis.answer_slot:
            if slot is None or answers is None:
                raise ValueError("a fake that depends on the answer slot needs each answer's slot")
            along, count = slot, answers
        else:
            if distance is None:
                raise ValueError("a fake that depends on token distance needs each answer's distance")
            d = np.asarray(distance, dtype=np.float64)
            if self.window is not None:
                found = np.where(d < self.window, points[0], points[-1])
            else:
                found = np.interp(d / self.distance_span, np.linspace(0.0, 1.0, len(points)), points)
            return float(found) if found.ndim == 0 else found
        x = np.asarray(along, dtype=np.float64)
        where = np.zeros_like(x) if count <= 1 else (x - 1) / (count - 1)
        found = np.interp(where, np.linspace(0.0, 1.0, len(points)), points)
        return float(found) if found.ndim == 0 else found
