"""The edge of the public API: what every public function checks of its arguments, and the one error type
it raises.

A public function (`posbias/api.py`, `posbias/schedules_api.py`, `posbias/store_api.py`) refuses what the
command refuses, before anything is opened: an id, a batch size or a limit out of the bounds the command's
flags have, a value of the wrong type, a name that is no choice. Each is a `UsageError` (the command's exit
code 2). What fails later, a store, a file, the disk, is raised as a `PosbiasError` with the line the command
prints for it (`public`). Nothing else escapes but a bug, an interrupt, or the caller's own callback's
exception. Its settings and its store come from here too (`resolve_settings`, `open_store`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from pydantic import ValidationError

from posbias import startup
from posbias.schemas import DatasetSpec, PosbiasError, UsageError, foreign_problem
from posbias.schemas.bounds import INT64_MAX, MAX_BATCH_SIZE
from posbias.service.settings import Settings, load_settings

if TYPE_CHECKING:
    from posbias.service.store import Database

SPEC_KINDS = "a JobSpec, a mapping of its fields or the path of a spec file"
"""What a job spec argument may be, in words."""
P = ParamSpec("P")
R = TypeVar("R")
E = TypeVar("E", bound=Enum)


def public(function: Callable[P, R]) -> Callable[P, R]:
    """`function` as the public API gives it: a failure of the store (SQLAlchemy's, the drivers' errors), of
    a file or the disk (`OSError`), input nested too deeply or no memory left is raised as a `PosbiasError`
    with the one line the command prints for it (`schemas.errors.foreign_problem`, `store_errors.explain`).
    Exceptions of the caller's own callbacks pass as they are."""

    @functools.wraps(function)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except PosbiasError:
            raise
        except Exception as exc:
            # Imported here: the drivers' error types cost an import that most calls never need.
            from posbias.service.store import STORE_ERRORS, explain

            if isinstance(exc, STORE_ERRORS):
                raise explain(exc, url=_store_url(kwargs.get("settings"))) from exc
            foreign = foreign_problem(exc)
            if foreign is None:
                raise
            raise PosbiasError(foreign) from exc

    return guarded


def resolve_settings(settings: Settings | None) -> Settings:
    """The settings a public function runs with: `settings`, or when None this process's (`POSBIAS_*`
    variables, then `.env`); `UsageError` for anything but a `Settings`."""
    if settings is None:
        return load_settings()
    given: Settings = typed(settings, Settings, what="settings", kind="a posbias.Settings")
    return given


@contextmanager
def open_store(settings: Settings, *, read_only: bool = False) -> Iterator[Database]:
    """The store of `settings`, open for the block. Here rather than in `posbias/api.py`, whose imports
    (every analysis) a function that only opens the store (`trial`, `store_version`) does not need."""
    from posbias.service.store import database

    db = database.connect(settings.database_url, read_only=read_only)
    startup.over()
    try:
        yield db
    finally:
        db.close()


def _store_url(settings: object) -> str | None:
    if isinstance(settings, Settings):
        url: str = settings.database_url
        return url
    try:
        found: str = load_settings().database_url
        return found
    except PosbiasError:  # the settings cannot be read: the line names no store
        return None


def typed(value: Any, types: Any, *, what: str, kind: str) -> Any:
    """`value` when it is one of `types` (a class, a tuple or a union; a bool is no number); `UsageError`
    naming `kind` otherwise."""
    if isinstance(value, types) and (types is bool or not isinstance(value, bool)):
        return value
    raise UsageError(f"{what} must be {kind} (got {type(value).__name__} {short(value)})")


def short(value: object) -> str:
    """`value`'s repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def whole(value: Any, *, what: str, low: int, high: int) -> int:
    """A whole number from `low` to `high` (the bounds the command's flags have); `UsageError` otherwise."""
    number: int = typed(value, int, what=what, kind="a whole number")
    if not low <= number <= high:
        raise UsageError(f"{what} {str(number)[:30]} is out of range ({low} to {high})")
    return number


def seconds(value: Any, *, what: str) -> float:
    """A finite number of seconds, at least 0."""
    number = float(typed(value, int | float, what=what, kind="a number of seconds"))
    if not math.isfinite(number) or number < 0:
        raise UsageError(f"{what} must be a finite number of seconds, at least 0 (got {short(value)})")
    return number


def job_id(value: Any) -> int:
    """A job id: 1 to the stores' 64-bit largest."""
    return whole(value, what="job id", low=1, high=INT64_MAX)


def batch_size(value: Any) -> int | None:
    """None, or a batch size from 1 to `MAX_BATCH_SIZE`."""
    return None if value is None else whole(value, what="batch size", low=1, high=MAX_BATCH_SIZE)


def text(value: Any, *, what: str) -> str:
    """A str."""
    found: str = typed(value, str, what=what, kind="text")
    return found


def path(value: Any, *, what: str) -> Path:
    """A path given as a str or a `Path`."""
    return Path(typed(value, str | Path, what=what, kind="a path (str or Path)"))


def format_name(value: Any) -> str | None:
    """None, or an export format's name as text."""
    return None if value is None else text(value, what="format")


def choice(kind: type[E], value: Any, *, what: str) -> E:
    """A member of the enum `kind`, or its value; `UsageError` naming the choices otherwise."""
    try:
        return kind(value)
    except ValueError:
        shown = ", ".join(str(member.value) for member in kind)
        raise UsageError(f"{what} must be one of {shown} (got {short(value)})") from None


def dataset(value: Any) -> DatasetSpec:
    """A dataset spec from a `DatasetSpec`, a mapping of its fields or None (MMLU)."""
    if isinstance(value, DatasetSpec):
        return value
    given = typed(value or {}, Mapping, what="dataset", kind="a DatasetSpec or a mapping of its fields")
    try:
        return DatasetSpec.model_validate(dict(given))
    except ValidationError as exc:
        # Here rather than above: the module brings YAML's parser, which no command's start needs.
        from posbias.schemas.spec_file import describe_validation_error

        raise UsageError(f"invalid dataset: {describe_validation_error(exc)}") from None
