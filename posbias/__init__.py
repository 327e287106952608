"""posbias: how an LLM's accuracy depends on where a question sits in a long prompt.

The public API (`posbias.api`, re-exported here) runs the experiment and reads its curves from Python:

    import posbias

    outcome = posbias.run({"model": "demo", "batch_sizes": [1, 10], "iterations": 4})
    for curve in posbias.curves(outcome.job.id):
        print(curve.to_pandas())

The subpackages are the parts of the service: `posbias.schemas` (the records), `posbias.workers` (the data
plane: engines, prompts, parsing, the Ray actor), `posbias.service` (the control plane: store, queue,
dispatcher, analysis, CLI) and `posbias.migrations`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posbias.api import (
        cancel,
        compare,
        curves,
        dispatch,
        dry_run,
        explain,
        export_results,
        job,
        jobs,
        load_questions,
        models,
        plan,
        progress,
        retry,
        run,
        shards,
        submit,
    )
    from posbias.schemas import PosbiasError
    from posbias.service.settings import Settings

__all__ = [
    "PosbiasError",
    "Settings",
    "cancel",
    "compare",
    "curves",
    "dispatch",
    "dry_run",
    "explain",
    "export_results",
    "job",
    "jobs",
    "load_questions",
    "models",
    "plan",
    "progress",
    "retry",
    "run",
    "shards",
    "submit",
]

_HOMES = {"PosbiasError": "posbias.schemas", "Settings": "posbias.service.settings"}


def __getattr__(name: str) -> Any:
    # Loaded on first use: a Ray worker imports `posbias.workers` and must not pull in the service's
    # dependencies (SQLAlchemy, the store) that importing the API would.
    if name in __all__:
        value = getattr(importlib.import_module(_HOMES.get(name, "posbias.api")), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'posbias' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
