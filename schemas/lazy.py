"""A package face that loads what it exports on first use: `posbias`, `posbias.schemas` and each service
package's `__init__.py` name what they export once (`_HOMES`: name -> the module that defines it; `_MODULES`:
modules other packages use as namespaces), and this turns that into `__all__`, `__getattr__` and `__dir__`.

Lazy, so that importing one name does not import a whole package: a Ray worker imports `posbias.workers` and
must not pull in the store's SQLAlchemy, a command loads only the part of the API it calls, and a record
imports no plots. The faces' `__init__.pyi` (written by `scripts/faces.py`) is what mypy and editors read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple


class LazyFace(NamedTuple):
    """What a face's module assigns: `__all__, __getattr__, __dir__ = lazy_face(...)`."""

    names: list[str]
    load: Callable[[str], Any]
    listing: Callable[[], list[str]]


def lazy_face(
    package: str, namespace: dict[str, Any], homes: Mapping[str, str], modules: Sequence[str] = ()
) -> LazyFace:
    """The face of `package` (its `__name__`), whose module globals are `namespace`: each name in `homes`
    loaded from its module, each of `modules` imported as `package.module`, on first use, then kept."""
    names = sorted([*homes, *modules])

    def load(name: str) -> Any:
        if name in homes:
            value = getattr(importlib.import_module(homes[name]), name)
        elif name in modules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted({*namespace, *names})

    return LazyFace(names, load, listing)
