"""The face of `posbias.service.dispatch`.

The dispatch: the dispatcher and its write-back, lease owners, model pools, placement on devices, the Ray
connection and its reaper.

This is the package's face: the API and the other service packages import from here, never from its modules
(modules inside the package import each other directly). `_HOMES` says where each name it exports is defined
and `_MODULES` which of its modules are used as namespaces (`jobs.get`); `__all__` and the lazy
`__getattr__` follow from them, and `__init__.pyi` (written by `scripts/faces.py`, checked by
tests/unit/test_faces.py) is the same view for mypy and editors. Order between the packages (each imports
only those before it): store <- stats <- work <- dispatch; work <- schedules <- reports.
"""

from __future__ import annotations

from posbias.schemas.lazy import lazy_face

_HOMES: dict[str, str] = {
    "Dispatcher": "posbias.service.dispatch.dispatcher",
    "engine_device": "posbias.service.dispatch.placement",
    "init_ray": "posbias.service.dispatch.ray_connect",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = ()
"""The modules other packages use as namespaces (`from posbias.service.dispatch import Dispatcher`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
