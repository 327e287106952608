"""posbias: how an LLM's accuracy depends on where a question sits in a long prompt.

The public API, exported here, runs the experiment and reads its curves from Python: `posbias/api.py` (jobs,
curves, comparisons, plots), `posbias/schedules_api.py` (regression schedules), `posbias/store_api.py` (the
store's schema version) and `posbias/settings_api.py` (the settings).

    import posbias

    outcome = posbias.run({"model": "demo", "batch_sizes": [1, 10], "iterations": 4})
    for curve in posbias.curves(outcome.job.id):
        print(curve.to_pandas())

The subpackages are the parts of the service: `posbias.schemas` (the records), `posbias.workers` (the data
plane: engines, prompts, parsing, the Ray actor), `posbias.service` (the control plane: store, queue,
dispatcher, analysis, schedules), `posbias.migrations`, and `posbias.cli`, the `posbias` command, which
calls this API and renders what it returns.
"""

from __future__ import annotations

from posbias.schemas.lazy import lazy_face

_HOMES: dict[str, str] = {
    "cancel": "posbias.api",
    "compare": "posbias.api",
    "curves": "posbias.api",
    "dataset_source": "posbias.api",
    "dispatch": "posbias.api",
    "dry_run": "posbias.api",
    "explain": "posbias.api",
    "export_format": "posbias.api",
    "export_results": "posbias.api",
    "job": "posbias.api",
    "jobs": "posbias.api",
    "load_questions": "posbias.api",
    "models": "posbias.api",
    "plan": "posbias.api",
    "plot_curves": "posbias.api",
    "plot_heatmap": "posbias.api",
    "progress": "posbias.api",
    "retry": "posbias.api",
    "run": "posbias.api",
    "shards": "posbias.api",
    "submit": "posbias.api",
    "unchecked_overrides": "posbias.api",
    "diagnose": "posbias.diagnose_api",
    "write_diagnosis": "posbias.diagnose_api",
    "attention_curves": "posbias.attention_api",
    "attention_explanations": "posbias.attention_api",
    "plot_attention": "posbias.attention_api",
    "plot_format": "posbias.frames",
    "results": "posbias.frames",
    "trial": "posbias.frames",
    "trials": "posbias.frames",
    "options_by_position": "posbias.options_api",
    "report": "posbias.reports_api",
    "viewer": "posbias.reports_api",
    "ScheduleState": "posbias.schedules_api",
    "add_schedule": "posbias.schedules_api",
    "list_schedules": "posbias.schedules_api",
    "pause_schedule": "posbias.schedules_api",
    "remove_schedule": "posbias.schedules_api",
    "resume_schedule": "posbias.schedules_api",
    "schedule": "posbias.schedules_api",
    "schedule_report": "posbias.schedules_api",
    "tick_schedules": "posbias.schedules_api",
    "PosbiasError": "posbias.schemas",
    "UsageError": "posbias.schemas",
    "OutputExists": "posbias.service.reports",
    "ScheduleReport": "posbias.service.reports",
    "CheckpointRecord": "posbias.service.schedules",
    "FolderSource": "posbias.service.schedules",
    "HubSource": "posbias.service.schedules",
    "ScheduleRecord": "posbias.service.schedules",
    "ScheduleSpecError": "posbias.service.schedules",
    "TickReport": "posbias.service.schedules",
    "Settings": "posbias.service.settings",
    "RevisionError": "posbias.service.store",
    "load_settings": "posbias.settings_api",
    "StoreVersion": "posbias.store_api",
    "downgrade_store": "posbias.store_api",
    "store_problem": "posbias.store_api",
    "store_version": "posbias.store_api",
    "upgrade_store": "posbias.store_api",
    "build_tiny_model": "posbias.toolbox",
    "install_model": "posbias.toolbox",
    "named_datasets": "posbias.toolbox",
    "serve_command": "posbias.toolbox",
}
"""Every public name, once: the name -> the module it is loaded from. `__all__` and `__getattr__` follow
from it, and `__init__.pyi`, the view mypy and editors read, is written from it by `scripts/faces.py`
(tests/unit/test_faces.py fails when the two differ)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES)
