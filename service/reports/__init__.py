"""The face of `posbias.service.reports`.

What is read and shown: curves (the analysis a user asks for), export, plots, one trial, the HTML report with
its assets, the schedule report, the viewer.

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
    "MAX_TRIALS": "posbias.service.reports.report",
    "OutputExists": "posbias.service.reports.export",
    "ReportFile": "posbias.service.reports.report",
    "ScheduleReport": "posbias.service.reports.schedule_report",
    "Viewer": "posbias.service.reports.viewer",
    "check_out": "posbias.service.reports.report",
    "open_read_only": "posbias.service.reports.viewer",
    "trial_detail": "posbias.service.reports.trial_view",
    "write_report": "posbias.service.reports.report",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = (
    "curves",
    "export",
    "plot",
    "schedule_report",
)
"""The modules other packages use as namespaces (`from posbias.service.reports import curves`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
