"""posbias: how an LLM's accuracy depends on where a question sits in a long prompt.

The public API, exported here, runs the experiment and reads its curves from Python: `posbias/api.py` (jobs,
curves, comparisons, plots, settings), `posbias/schedules.py` (regression schedules) and `posbias/store.py`
(the store's schema version).

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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posbias.api import (
        cancel,
        compare,
        curves,
        dataset_source,
        dispatch,
        dry_run,
        explain,
        export_format,
        export_results,
        job,
        jobs,
        load_questions,
        load_settings,
        models,
        plan,
        plot_curves,
        plot_heatmap,
        progress,
        retry,
        run,
        shards,
        submit,
        unchecked_overrides,
    )
    from posbias.attention import attention_curves, attention_explanations, plot_attention
    from posbias.frames import plot_format, results, trial, trials
    from posbias.options import options_by_position
    from posbias.reports import report, viewer
    from posbias.schedules import (
        ScheduleState,
        add_schedule,
        list_schedules,
        pause_schedule,
        remove_schedule,
        resume_schedule,
        schedule,
        schedule_report,
        tick_schedules,
    )
    from posbias.schemas import PosbiasError, UsageError
    from posbias.service.checkpoints import FolderSource, HubSource
    from posbias.service.export import OutputExists
    from posbias.service.migrate import RevisionError
    from posbias.service.schedule_report import ScheduleReport
    from posbias.service.scheduler import TickReport
    from posbias.service.schedules import CheckpointRecord, ScheduleRecord, ScheduleSpecError
    from posbias.service.settings import Settings
    from posbias.store import StoreVersion, downgrade_store, store_problem, store_version, upgrade_store
    from posbias.toolbox import build_tiny_model, install_model, named_datasets, serve_command

__all__ = [
    "CheckpointRecord",
    "FolderSource",
    "HubSource",
    "OutputExists",
    "PosbiasError",
    "RevisionError",
    "ScheduleRecord",
    "ScheduleReport",
    "ScheduleSpecError",
    "ScheduleState",
    "Settings",
    "StoreVersion",
    "TickReport",
    "UsageError",
    "add_schedule",
    "attention_curves",
    "attention_explanations",
    "build_tiny_model",
    "cancel",
    "compare",
    "curves",
    "dataset_source",
    "dispatch",
    "downgrade_store",
    "dry_run",
    "explain",
    "export_format",
    "export_results",
    "install_model",
    "job",
    "jobs",
    "list_schedules",
    "load_questions",
    "load_settings",
    "models",
    "named_datasets",
    "options_by_position",
    "pause_schedule",
    "plan",
    "plot_attention",
    "plot_curves",
    "plot_format",
    "plot_heatmap",
    "progress",
    "remove_schedule",
    "report",
    "results",
    "resume_schedule",
    "retry",
    "run",
    "schedule",
    "schedule_report",
    "serve_command",
    "shards",
    "store_problem",
    "store_version",
    "submit",
    "tick_schedules",
    "trial",
    "trials",
    "unchecked_overrides",
    "upgrade_store",
    "viewer",
]

_HOMES = {
    **dict.fromkeys(
        [
            "ScheduleState",
            "add_schedule",
            "list_schedules",
            "pause_schedule",
            "remove_schedule",
            "resume_schedule",
            "schedule",
            "schedule_report",
            "tick_schedules",
        ],
        "posbias.schedules",
    ),
    **dict.fromkeys(
        ["StoreVersion", "downgrade_store", "store_problem", "store_version", "upgrade_store"],
        "posbias.store",
    ),
    **dict.fromkeys(
        ["build_tiny_model", "install_model", "named_datasets", "serve_command"], "posbias.toolbox"
    ),
    **dict.fromkeys(["plot_format", "results", "trial", "trials"], "posbias.frames"),
    "options_by_position": "posbias.options",
    **dict.fromkeys(["attention_curves", "attention_explanations", "plot_attention"], "posbias.attention"),
    **dict.fromkeys(["report", "viewer"], "posbias.reports"),
    # The records and errors the API returns and raises, where they are defined.
    "CheckpointRecord": "posbias.service.schedules",
    "FolderSource": "posbias.service.checkpoints",
    "HubSource": "posbias.service.checkpoints",
    "OutputExists": "posbias.service.export",
    "PosbiasError": "posbias.schemas",
    "UsageError": "posbias.schemas",
    "RevisionError": "posbias.service.migrate",
    "ScheduleRecord": "posbias.service.schedules",
    "ScheduleReport": "posbias.service.schedule_report",
    "ScheduleSpecError": "posbias.service.schedules",
    "Settings": "posbias.service.settings",
    "TickReport": "posbias.service.scheduler",
}
"""Where each exported name is defined, when not in `posbias.api`."""


def __getattr__(name: str) -> Any:
    # Loaded on first use: a Ray worker imports `posbias.workers` and must not pull in the service's
    # dependencies (SQLAlchemy, the store) that importing the API would, and a command loads only the part
    # of the API it calls.
    if name in __all__:
        value = getattr(importlib.import_module(_HOMES.get(name, "posbias.api")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'posbias' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
