"""Typed view of `service/reports/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.reports.export import OutputExists as OutputExists
from posbias.service.reports.report import MAX_TRIALS as MAX_TRIALS
from posbias.service.reports.report import ReportFile as ReportFile
from posbias.service.reports.report import check_out as check_out
from posbias.service.reports.report import write_report as write_report
from posbias.service.reports.schedule_report import ScheduleReport as ScheduleReport
from posbias.service.reports.trial_view import trial_detail as trial_detail
from posbias.service.reports.viewer import Viewer as Viewer
from posbias.service.reports.viewer import open_read_only as open_read_only

from . import curves as curves
from . import export as export
from . import plot as plot
from . import schedule_report as schedule_report

__all__ = [
    "MAX_TRIALS",
    "OutputExists",
    "ReportFile",
    "ScheduleReport",
    "Viewer",
    "check_out",
    "curves",
    "export",
    "open_read_only",
    "plot",
    "schedule_report",
    "trial_detail",
    "write_report",
]
