"""The face of `posbias.service.store`.

The store: the database and its URL, errors, schema version and migrations; the tables; rows in (a shard's
results) and out (the queries the statistics read).

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
    "AttentionLayer": "posbias.service.store.tables",
    "AttentionPoint": "posbias.service.store.tables",
    "BatteryRow": "posbias.service.store.tables",
    "Checkpoint": "posbias.service.store.tables",
    "CurvePoint": "posbias.service.store.tables",
    "Database": "posbias.service.store.database",
    "Dispatcher": "posbias.service.store.tables",
    "DriverError": "posbias.service.store.store_errors",
    "IN_CHUNK": "posbias.service.store.database",
    "Job": "posbias.service.store.tables",
    "JobVariant": "posbias.service.store.tables",
    "Model": "posbias.service.store.tables",
    "Result": "posbias.service.store.tables",
    "RevisionError": "posbias.service.store.migrate",
    "STORE_ERRORS": "posbias.service.store.store_errors",
    "Schedule": "posbias.service.store.tables",
    "Shard": "posbias.service.store.tables",
    "StoreError": "posbias.service.store.store_errors",
    "Trial": "posbias.service.store.tables",
    "check_schema": "posbias.service.store.schema_version",
    "check_sqlite_file": "posbias.service.store.database_url",
    "create_db_engine": "posbias.service.store.database",
    "dialect_insert": "posbias.service.store.database",
    "explain": "posbias.service.store.store_errors",
    "normalise_url": "posbias.service.store.database_url",
    "not_found": "posbias.service.store.store_errors",
    "now_utc": "posbias.service.store.database",
    "sqlite_path": "posbias.service.store.database_url",
}
"""Each exported name -> the module that defines it."""

_MODULES: tuple[str, ...] = (
    "columns",
    "database",
    "database_url",
    "migrate",
    "rows",
    "schema_version",
    "store_errors",
    "tables",
)
"""The modules other packages use as namespaces (`from posbias.service.store import database`)."""

__all__, __getattr__, __dir__ = lazy_face(__name__, globals(), _HOMES, _MODULES)
