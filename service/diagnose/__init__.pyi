"""Typed view of `service/diagnose/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.diagnose.battery import DEFAULT_BUDGET as DEFAULT_BUDGET
from posbias.service.diagnose.battery import plan_battery as plan_battery
from posbias.service.diagnose.diagnosis_page import diagnosis_page as diagnosis_page
from posbias.service.diagnose.group import costs as costs
from posbias.service.diagnose.group import diagnose as diagnose
from posbias.service.diagnose.group import fitted_battery as fitted_battery
from posbias.service.diagnose.group import model_facts as model_facts
from posbias.service.diagnose.suspects import Evidence as Evidence
from posbias.service.diagnose.suspects import gather as gather
from posbias.service.diagnose.suspects import judge as judge
from posbias.service.diagnose.suspects import read_diagnosis as read_diagnosis

__all__ = [
    "DEFAULT_BUDGET",
    "Evidence",
    "costs",
    "diagnose",
    "diagnosis_page",
    "fitted_battery",
    "gather",
    "judge",
    "model_facts",
    "plan_battery",
    "read_diagnosis",
]
