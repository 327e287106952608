"""The one base of every posbias record."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Any, get_args

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    import pandas as pd


class Record(BaseModel):
    """Base of every record posbias stores, sends between the driver and a worker, or returns from its API.

    Unknown keys are errors, so a typo in a spec file or a stale field never passes silently; values are
    immutable, so a record that has been validated stays valid.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)


def records_frame(rows: Sequence[Record], *, same: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """`rows` as a DataFrame, one row per record and one column per field, after the columns of `same` (the
    values every row shares, e.g. the model); a nested record's fields become `field_subfield` columns (an
    interval: `effect_estimate`, `effect_low`, `effect_high`, missing together when it is None). What every
    `to_pandas()` is built on."""
    import pandas as pd  # only notebooks need it, and importing it costs a second

    return pd.DataFrame([{**(same or {}), **_flat(row)} for row in rows])


def _flat(record: Record, prefix: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, field in type(record).model_fields.items():
        value = getattr(record, name)
        nested = _record_type(field.annotation)
        if isinstance(value, Record):
            found.update(_flat(value, prefix=f"{prefix}{name}_"))
        elif value is None and nested is not None:
            found.update(_missing(nested, prefix=f"{prefix}{name}_"))
        else:
            found[f"{prefix}{name}"] = value.value if isinstance(value, Enum) else value
    return found


def _missing(kind: type[Record], *, prefix: str) -> dict[str, Any]:
    """The columns of a record of type `kind` that is not there, all None."""
    found: dict[str, Any] = {}
    for name, field in kind.model_fields.items():
        nested = _record_type(field.annotation)
        if nested is not None:
            found.update(_missing(nested, prefix=f"{prefix}{name}_"))
        else:
            found[f"{prefix}{name}"] = None
    return found


def _record_type(annotation: Any) -> type[Record] | None:
    """The record type an optional field holds (`Interval | None`), if it holds one."""
    for option in (annotation, *get_args(annotation)):
        if isinstance(option, type) and issubclass(option, Record):
            return option
    return None
