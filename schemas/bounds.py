"""The limits every job spec is held to, and the two checks that apply them to a spec's raw data.

Numbers and texts are bounded by what both stores can hold, so a spec that SQLite would take never fails on
PostgreSQL; a spec's size and nesting are bounded so a mistaken or hostile file is refused, not expanded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, Any

from pydantic import BeforeValidator, ConfigDict, Field

from posbias.schemas.errors import UsageError
from posbias.schemas.ids import parse_id
from posbias.schemas.limits import INT32_MAX as INT32_MAX
from posbias.schemas.limits import INT64_MAX as INT64_MAX
from posbias.schemas.limits import MAX_BATCH_SIZE as MAX_BATCH_SIZE
from posbias.schemas.record import Record

MAX_TEXT = 100_000
"""Characters in any one text of a spec at most (a prompt template is the longest, a few hundred)."""
MAX_SPEC_BYTES = 1 << 20
"""Size of a spec file at most: a spec is a few hundred bytes; a larger file is a mistake."""
MAX_SPEC_DEPTH = 16
"""Nesting of a spec's mappings and lists at most (a spec nests three deep)."""
MAX_SPEC_VALUES = 100_000
"""Values in a spec at most, counting each use of a YAML alias (so an alias bomb is refused, not expanded)."""


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads `true` as 1; in a spec that is always a mistake (`batch_sizes: true`).
    if isinstance(value, bool):
        raise ValueError("expected an integer, not true/false")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
"""An integer that is not a boolean."""


def _job_id(value: Any) -> Any:
    # Text is read as the command reads a job id (`schemas.ids`): `1_0`, ` 2` or a full-width 2 is no id.
    if isinstance(value, str):
        try:
            return parse_id(value)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected a job id, a whole number written in the digits 0-9")
    return value


JobId = Annotated[int, BeforeValidator(_job_id), Field(ge=1, le=INT64_MAX)]
"""A job id in a spec: a whole number from 1 to the stores' largest, or its ASCII digits."""
FINITE = ConfigDict(allow_inf_nan=False)
"""Numbers in a spec are finite: `inf` or `nan` is refused where it is given, not met by the engine."""


def check_shape(data: Any) -> str | None:
    """Why `data` (parsed YAML or JSON) is too deep or too large to be a spec; None when it is not."""
    budget = MAX_SPEC_VALUES
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            return f"more than {MAX_SPEC_VALUES:,} values (a YAML alias counts each time it is used)"
        if isinstance(value, dict | list | tuple):
            if depth >= MAX_SPEC_DEPTH:
                return f"nests more than {MAX_SPEC_DEPTH} levels deep"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                stack.append((key, depth + 1))
                stack.append((item, depth + 1))
    return None


def _texts(value: Any, where: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Every text in `value` (keys too) with where it sits (`dataset.name`)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, where)]
    seen = 0
    while stack and seen <= MAX_SPEC_VALUES:
        item, at = stack.pop()
        seen += 1
        if isinstance(item, str):
            yield ".".join(at), item
        elif isinstance(item, dict):
            for key, inner in item.items():
                name = str(key)[:40]
                if isinstance(key, str):
                    yield ".".join((*at, name)), key
                stack.append((inner, (*at, name)))
        elif isinstance(item, list | tuple):
            stack.extend((inner, (*at, str(number))) for number, inner in enumerate(item))
        elif isinstance(item, Record):
            stack.append((item.model_dump(), at))


def check_texts(data: Any) -> None:
    """Refuse any text in `data` (keys too, wherever it sits) that a store cannot hold: PostgreSQL refuses NUL
    in text and JSON, and SQLite would keep it, so a spec SQLite takes would fail on PostgreSQL. Raises
    `ValueError` naming where the text sits."""
    for where, text in _texts(data, ()):
        if "\x00" in text:
            raise ValueError(f"{where or 'spec'}: text holds a NUL character (\\x00); remove it")
        if len(text) > MAX_TEXT:
            raise ValueError(f"{where or 'spec'}: text longer than {MAX_TEXT:,} characters")


def integer_list(value: Any, *, what: str, example: str) -> Any:
    """A `before` validator's reading of a list of integers given as one integer or a comma-separated text
    (a flag's value); anything else is left to the field's own type. ASCII digits only: `int()` would read
    `٣` as 3 and `1_000` as 1000."""
    if isinstance(value, int):
        return (value,)
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if not all(part.isascii() and part.isdecimal() for part in parts):
            raise ValueError(f"{what} must be comma-separated integers, e.g. {example} (got {value[:80]!r})")
        return tuple(int(part) for part in parts)
    return value
