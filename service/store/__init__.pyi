"""Typed view of `service/store/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.store.database import IN_CHUNK as IN_CHUNK
from posbias.service.store.database import Database as Database
from posbias.service.store.database import create_db_engine as create_db_engine
from posbias.service.store.database import dialect_insert as dialect_insert
from posbias.service.store.database import now_utc as now_utc
from posbias.service.store.database_url import check_sqlite_file as check_sqlite_file
from posbias.service.store.database_url import normalise_url as normalise_url
from posbias.service.store.database_url import sqlite_path as sqlite_path
from posbias.service.store.migrate import RevisionError as RevisionError
from posbias.service.store.schema_version import check_schema as check_schema
from posbias.service.store.store_errors import STORE_ERRORS as STORE_ERRORS
from posbias.service.store.store_errors import DriverError as DriverError
from posbias.service.store.store_errors import StoreError as StoreError
from posbias.service.store.store_errors import explain as explain
from posbias.service.store.store_errors import not_found as not_found
from posbias.service.store.tables import AttentionLayer as AttentionLayer
from posbias.service.store.tables import AttentionPoint as AttentionPoint
from posbias.service.store.tables import BatteryRow as BatteryRow
from posbias.service.store.tables import Checkpoint as Checkpoint
from posbias.service.store.tables import CurvePoint as CurvePoint
from posbias.service.store.tables import Dispatcher as Dispatcher
from posbias.service.store.tables import Job as Job
from posbias.service.store.tables import JobVariant as JobVariant
from posbias.service.store.tables import Model as Model
from posbias.service.store.tables import Result as Result
from posbias.service.store.tables import Schedule as Schedule
from posbias.service.store.tables import Shard as Shard
from posbias.service.store.tables import Trial as Trial

from . import columns as columns
from . import database as database
from . import database_url as database_url
from . import migrate as migrate
from . import rows as rows
from . import schema_version as schema_version
from . import store_errors as store_errors
from . import tables as tables

__all__ = [
    "IN_CHUNK",
    "STORE_ERRORS",
    "AttentionLayer",
    "AttentionPoint",
    "BatteryRow",
    "Checkpoint",
    "CurvePoint",
    "Database",
    "Dispatcher",
    "DriverError",
    "Job",
    "JobVariant",
    "Model",
    "Result",
    "RevisionError",
    "Schedule",
    "Shard",
    "StoreError",
    "Trial",
    "check_schema",
    "check_sqlite_file",
    "columns",
    "create_db_engine",
    "database",
    "database_url",
    "dialect_insert",
    "explain",
    "migrate",
    "normalise_url",
    "not_found",
    "now_utc",
    "rows",
    "schema_version",
    "sqlite_path",
    "store_errors",
    "tables",
]
