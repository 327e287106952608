"""Typed view of `service/schedules/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.schedules.checkpoints import FolderSource as FolderSource
from posbias.service.schedules.checkpoints import HubSource as HubSource
from posbias.service.schedules.checkpoints import Source as Source
from posbias.service.schedules.schedule_rows import CheckpointRecord as CheckpointRecord
from posbias.service.schedules.schedule_rows import ScheduleRecord as ScheduleRecord
from posbias.service.schedules.schedule_rows import ScheduleSpecError as ScheduleSpecError
from posbias.service.schedules.schedule_rows import checkpoint_records as checkpoint_records
from posbias.service.schedules.schedule_rows import get_schedule as get_schedule
from posbias.service.schedules.schedule_rows import list_checkpoints as list_checkpoints
from posbias.service.schedules.schedule_rows import template_spec as template_spec
from posbias.service.schedules.scheduler import TickReport as TickReport

from . import schedule_rows as schedule_rows
from . import scheduler as scheduler

__all__ = [
    "CheckpointRecord",
    "FolderSource",
    "HubSource",
    "ScheduleRecord",
    "ScheduleSpecError",
    "Source",
    "TickReport",
    "checkpoint_records",
    "get_schedule",
    "list_checkpoints",
    "schedule_rows",
    "scheduler",
    "template_spec",
]
