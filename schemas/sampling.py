"""Decoding settings: how a job's answers are sampled, and their output budget."""

from __future__ import annotations

from pydantic import Field

from posbias.schemas.bounds import FINITE, INT32_MAX, INT64_MAX, Int
from posbias.schemas.modes import AnswerMode
from posbias.schemas.record import Record


class SamplingSpec(Record):
    """Decoding settings. Greedy by default, so a job's results are reproducible."""

    model_config = FINITE

    temperature: float = Field(0.0, ge=0.0, le=100.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: Int | None = Field(
        None, ge=1, le=INT32_MAX, description="Output token limit; derived from the batch size when not set."
    )
    seed: Int | None = Field(None, ge=0, le=INT64_MAX, description="Sampling seed for non-greedy decoding.")

    def max_tokens_for(self, answers: int, *, answer_mode: AnswerMode) -> int:
        """The output budget for one prompt that asks for `answers` answers (its batch size, or 1 for a
        probe).

        An answer line `k. i` is about 4-6 tokens; free-form output gets room for some chatter.
        """
        if self.max_tokens is not None:
            return self.max_tokens
        if answer_mode is AnswerMode.constrained:
            return 8 * answers + 8
        return 16 * answers + 64
