"""Typed view of `service/work/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.service.work.context import ContextError as ContextError
from posbias.service.work.datasets import check_pool as check_pool
from posbias.service.work.datasets import load_questions as load_questions
from posbias.service.work.model_names import check_model_name as check_model_name
from posbias.service.work.stored_spec import load_spec as load_spec

from . import dataset_catalog as dataset_catalog
from . import datasets as datasets
from . import jobs as jobs
from . import queue as queue
from . import submission as submission

__all__ = [
    "ContextError",
    "check_model_name",
    "check_pool",
    "dataset_catalog",
    "datasets",
    "jobs",
    "load_questions",
    "load_spec",
    "queue",
    "submission",
]
