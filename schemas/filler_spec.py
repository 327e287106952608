"""Filler: neutral text of controlled token lengths that moves questions away from their answers."""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, field_validator, model_validator

from posbias.schemas.bounds import integer_list
from posbias.schemas.choices import FillerPlace as FillerPlace
from posbias.schemas.record import Record

MAX_FILLER_TOKENS = 1_000_000
"""Filler tokens in one prompt at most."""
MAX_FILLER_FILE_BYTES = 4_000_000
"""Size of a filler `source` file at most."""
BUILTIN_FILLER = "builtin"
"""The `source` that names posbias's own neutral text."""


class FillerSpec(Record):
    """Neutral text of a controlled length, in the model's own tokens, placed in every prompt to move
    questions away from their answers (or from the prompt's start) without changing their positions."""

    tokens: tuple[Annotated[int, Field(ge=0, le=MAX_FILLER_TOKENS)], ...] = Field(
        min_length=1,
        description="Filler lengths in the model's tokens; several sweep length x position: every sampled "
        "set is shown at each length (0 is the control without filler).",
    )
    where: FillerPlace = Field(
        FillerPlace.end,
        description="`before` the questions, `after` question `position`, or at the `end`, between the "
        "questions and the answer request. Filler never splits a question.",
    )
    position: int | None = Field(
        None, ge=1, description="With `where: after`: the question the filler follows (k; below every N)."
    )
    source: str = Field(
        BUILTIN_FILLER,
        description="`builtin` (plain, repetitive, content-free sentences written for posbias) or a UTF-8 "
        "text file, read at submit and stored with the job (`text`); a relative path in a spec file is read "
        "from the spec file's folder. Each prompt's filler starts at a "
        "sentence drawn from the job's seed, the same at every length of one sampled set.",
    )
    text: str | None = Field(
        None,
        description="The text of `source` when it is a file, as read at submit; leave it unset (posbias "
        "fills it in).",
    )

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: Any) -> Any:
        return integer_list(value, what="filler tokens", example="0,1000,4000")

    @field_validator("tokens")
    @classmethod
    def _distinct_tokens(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _position_with_after(self) -> Self:
        if self.where is FillerPlace.after and self.position is None:
            raise ValueError("filler where `after` needs the question it follows: set filler.position (k)")
        if self.where is not FillerPlace.after and self.position is not None:
            raise ValueError("filler.position is only for `where: after`")
        return self

    @property
    def builtin(self) -> bool:
        """True for the built-in neutral text."""
        return self.source == BUILTIN_FILLER
