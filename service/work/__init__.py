"""The face of `posbias.service.work`.

The work: datasets, model names, the planner, submission (context and costs), jobs and their status, shards,
answer sheets and the queue.

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
    "ContextError": "posbias.service.work.context",
    "check_model_name": "posbias.service.work.model_names",
    "check_pool": "posbias.service.work.datasets",
    "load_questions": "posbias.service.work.datasets",
    "load_spec": "posbias.service.work.stored_spec",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = (
    "dataset_catalog",
    "datasets",
    "jobs",
    "queue",
    "submission",
)
"""The modules other packages use as namespaces (`from posbias.service.work import dataset_catalog`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
