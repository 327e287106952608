"""The face of `posbias.service.schedules`.

Regression schedules: schedules as stored, checkpoints, the scheduler's tick, verdicts and the webhook.

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
    "CheckpointRecord": "posbias.service.schedules.schedule_rows",
    "FolderSource": "posbias.service.schedules.checkpoints",
    "HubSource": "posbias.service.schedules.checkpoints",
    "ScheduleRecord": "posbias.service.schedules.schedule_rows",
    "ScheduleSpecError": "posbias.service.schedules.schedule_rows",
    "Source": "posbias.service.schedules.checkpoints",
    "TickReport": "posbias.service.schedules.scheduler",
    "checkpoint_records": "posbias.service.schedules.schedule_rows",
    "get_schedule": "posbias.service.schedules.schedule_rows",
    "list_checkpoints": "posbias.service.schedules.schedule_rows",
    "template_spec": "posbias.service.schedules.schedule_rows",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = (
    "schedule_rows",
    "scheduler",
)
"""The modules other packages use as namespaces (`from posbias.service.schedules import schedule_rows`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
