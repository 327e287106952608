"""The face of `posbias.service.diagnose`.

A diagnosis: the battery of jobs planned from a model's config facts (behaviour, intervention, mechanism),
submitted as a group of ordinary jobs, and read back into one verdict per suspect and line of evidence.

This is the package's face: the API imports from here, never from its modules (modules inside the package
import each other directly). `_HOMES` says where each name it exports is defined and `_MODULES` which of its
modules are used as namespaces; `__all__` and the lazy `__getattr__` follow from them, and `__init__.pyi`
(written by `scripts/faces.py`) is the same view for mypy and editors. It comes last among the service's
packages: store <- stats <- work <- schedules <- reports <- diagnose.
"""

from __future__ import annotations

from posbias.schemas.lazy import lazy_face

_HOMES: dict[str, str] = {
    "DEFAULT_BUDGET": "posbias.service.diagnose.battery",
    "Evidence": "posbias.service.diagnose.suspects",
    "costs": "posbias.service.diagnose.group",
    "diagnose": "posbias.service.diagnose.group",
    "diagnosis_page": "posbias.service.diagnose.diagnosis_page",
    "fitted_battery": "posbias.service.diagnose.group",
    "gather": "posbias.service.diagnose.suspects",
    "judge": "posbias.service.diagnose.suspects",
    "model_facts": "posbias.service.diagnose.group",
    "plan_battery": "posbias.service.diagnose.battery",
    "read_diagnosis": "posbias.service.diagnose.suspects",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = ()
"""The modules other packages use as namespaces (none)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
