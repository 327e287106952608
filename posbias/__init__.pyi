"""Typed view of `posbias/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.api import cancel as cancel
from posbias.api import compare as compare
from posbias.api import curves as curves
from posbias.api import dataset_source as dataset_source
from posbias.api import dispatch as dispatch
from posbias.api import dry_run as dry_run
from posbias.api import explain as explain
from posbias.api import export_format as export_format
from posbias.api import export_results as export_results
from posbias.api import job as job
from posbias.api import jobs as jobs
from posbias.api import load_questions as load_questions
from posbias.api import models as models
from posbias.api import plan as plan
from posbias.api import plot_curves as plot_curves
from posbias.api import plot_heatmap as plot_heatmap
from posbias.api import progress as progress
from posbias.api import retry as retry
from posbias.api import run as run
from posbias.api import shards as shards
from posbias.api import submit as submit
from posbias.api import unchecked_overrides as unchecked_overrides
from posbias.attention_api import attention_curves as attention_curves
from posbias.attention_api import attention_explanations as attention_explanations
from posbias.attention_api import plot_attention as plot_attention
from posbias.diagnose_api import diagnose as diagnose
from posbias.diagnose_api import write_diagnosis as write_diagnosis
from posbias.frames import plot_format as plot_format
from posbias.frames import results as results
from posbias.frames import trial as trial
from posbias.frames import trials as trials
from posbias.options_api import options_by_position as options_by_position
from posbias.reports_api import report as report
from posbias.reports_api import viewer as viewer
from posbias.schedules_api import ScheduleState as ScheduleState
from posbias.schedules_api import add_schedule as add_schedule
from posbias.schedules_api import list_schedules as list_schedules
from posbias.schedules_api import pause_schedule as pause_schedule
from posbias.schedules_api import remove_schedule as remove_schedule
from posbias.schedules_api import resume_schedule as resume_schedule
from posbias.schedules_api import schedule as schedule
from posbias.schedules_api import schedule_report as schedule_report
from posbias.schedules_api import tick_schedules as tick_schedules
from posbias.schemas import PosbiasError as PosbiasError
from posbias.schemas import UsageError as UsageError
from posbias.service.reports import OutputExists as OutputExists
from posbias.service.reports import ScheduleReport as ScheduleReport
from posbias.service.schedules import CheckpointRecord as CheckpointRecord
from posbias.service.schedules import FolderSource as FolderSource
from posbias.service.schedules import HubSource as HubSource
from posbias.service.schedules import ScheduleRecord as ScheduleRecord
from posbias.service.schedules import ScheduleSpecError as ScheduleSpecError
from posbias.service.schedules import TickReport as TickReport
from posbias.service.settings import Settings as Settings
from posbias.service.store import RevisionError as RevisionError
from posbias.settings_api import load_settings as load_settings
from posbias.store_api import StoreVersion as StoreVersion
from posbias.store_api import downgrade_store as downgrade_store
from posbias.store_api import store_problem as store_problem
from posbias.store_api import store_version as store_version
from posbias.store_api import upgrade_store as upgrade_store
from posbias.toolbox import build_tiny_model as build_tiny_model
from posbias.toolbox import install_model as install_model
from posbias.toolbox import named_datasets as named_datasets
from posbias.toolbox import serve_command as serve_command

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
    "diagnose",
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
    "write_diagnosis",
]
