"""The face of `posbias.service.stats`.

The statistics: trial data as columns, intervals, the cluster bootstrap, regressions, the shape test, position
curves, comparisons, `explain` with its causes and window step, options by position, attention statistics.

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
    "BLOCK_FRACTIONS": "posbias.service.stats.comparison",
    "BOOTSTRAP_RESAMPLES": "posbias.service.stats.bootstrap",
    "BREAK_RESAMPLES": "posbias.service.stats.window_step",
    "DIFF": "posbias.service.stats.bootstrap",
    "DIFF_OF_DIFFS": "posbias.service.stats.bootstrap",
    "DistanceColumns": "posbias.service.stats.trial_columns",
    "Floats": "posbias.service.stats.trial_data",
    "TrialData": "posbias.service.stats.trial_data",
    "blocks": "posbias.service.stats.comparison",
    "diff_band": "posbias.service.stats.bootstrap",
    "explain_curve": "posbias.service.stats.explain",
    "percentile": "posbias.service.stats.bootstrap",
    "plan_keys": "posbias.service.stats.attention_explain",
    "resample_pair": "posbias.service.stats.comparison",
    "trial_keys": "posbias.service.stats.attention_explain",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = (
    "attention_curve",
    "attention_explain",
    "attention_gap",
    "bootstrap",
    "comparison",
    "options",
    "position_curve",
    "queries",
)
"""The modules other packages use as namespaces (`from posbias.service.stats import attention_curve`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
