"""posbias.schemas: the pydantic records every part of posbias shares. No I/O happens here.

Each name is imported from its module on first use (`__getattr__`), so that what needs one record, or only
the command's choices (`choices.py`) and errors, does not import pydantic and numpy for all of them.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES: dict[str, str] = {
    "AnswerSheet": "posbias.schemas.attention",
    "AttentionAuroc": "posbias.schemas.attention",
    "AttentionBand": "posbias.schemas.attention",
    "AttentionCurve": "posbias.schemas.attention",
    "AttentionCurvePoint": "posbias.schemas.attention",
    "AttentionExplanation": "posbias.schemas.attention",
    "AttentionRow": "posbias.schemas.attention",
    "AttentionShard": "posbias.schemas.attention",
    "LayerCheck": "posbias.schemas.attention",
    "LayerKind": "posbias.schemas.attention",
    "MaskCanary": "posbias.schemas.attention",
    "SheetFromJob": "posbias.schemas.attention",
    "BASELINE": "posbias.schemas.choices",
    "CurveAxis": "posbias.schemas.choices",
    "EndpointApi": "posbias.schemas.choices",
    "EngineName": "posbias.schemas.choices",
    "FakeAxis": "posbias.schemas.choices",
    "FillerPlace": "posbias.schemas.choices",
    "BlockDiff": "posbias.schemas.curve",
    "Comparison": "posbias.schemas.curve",
    "Curve": "posbias.schemas.curve",
    "CurvePoint": "posbias.schemas.curve",
    "CurveQuery": "posbias.schemas.curve",
    "DiffPoint": "posbias.schemas.curve",
    "Interval": "posbias.schemas.curve",
    "OptionPoint": "posbias.schemas.curve",
    "OptionsView": "posbias.schemas.curve",
    "DatasetInfo": "posbias.schemas.dataset",
    "DatasetSpec": "posbias.schemas.dataset",
    "NAMED_DATASETS": "posbias.schemas.dataset",
    "NamedDataset": "posbias.schemas.dataset",
    "Constraint": "posbias.schemas.endpoint",
    "EndpointCapabilities": "posbias.schemas.endpoint",
    "EndpointReport": "posbias.schemas.endpoint",
    "ServedMode": "posbias.schemas.endpoint",
    "TokenSource": "posbias.schemas.endpoint",
    "EngineOptions": "posbias.schemas.engine_spec",
    "ConflictError": "posbias.schemas.errors",
    "ModelNotCheckedWarning": "posbias.schemas.errors",
    "NotFoundError": "posbias.schemas.errors",
    "PosbiasError": "posbias.schemas.errors",
    "RetryableError": "posbias.schemas.errors",
    "RotationCostWarning": "posbias.schemas.errors",
    "UsageError": "posbias.schemas.errors",
    "foreign_problem": "posbias.schemas.errors",
    "one_line": "posbias.schemas.errors",
    "FakeCollapse": "posbias.schemas.fake_spec",
    "FakeSpec": "posbias.schemas.fake_spec",
    "FillerSpec": "posbias.schemas.filler_spec",
    "BatchSizeEstimate": "posbias.schemas.job_records",
    "DesignEstimate": "posbias.schemas.job_records",
    "DispatchSummary": "posbias.schemas.job_records",
    "DryRun": "posbias.schemas.job_records",
    "EngineContext": "posbias.schemas.job_records",
    "ExportSummary": "posbias.schemas.job_records",
    "FINISHED_JOB_STATUSES": "posbias.schemas.job_records",
    "JobChange": "posbias.schemas.job_records",
    "JobProgress": "posbias.schemas.job_records",
    "JobRecord": "posbias.schemas.job_records",
    "JobStatus": "posbias.schemas.job_records",
    "RunOutcome": "posbias.schemas.job_records",
    "ShardRecord": "posbias.schemas.job_records",
    "ShardStatus": "posbias.schemas.job_records",
    "Submitted": "posbias.schemas.job_records",
    "VariantRun": "posbias.schemas.job_records",
    "JobSpec": "posbias.schemas.job_spec",
    "AnswerMode": "posbias.schemas.modes",
    "AnswerOrder": "posbias.schemas.modes",
    "ChatTemplateUse": "posbias.schemas.modes",
    "Design": "posbias.schemas.modes",
    "PromptTemplate": "posbias.schemas.prompt",
    "Record": "posbias.schemas.record",
    "SamplingSpec": "posbias.schemas.sampling",
    "CloseReport": "posbias.schemas.shard_work",
    "EngineInfo": "posbias.schemas.shard_work",
    "LoadReport": "posbias.schemas.shard_work",
    "ModelInfo": "posbias.schemas.shard_work",
    "ParseStatus": "posbias.schemas.shard_work",
    "Plan": "posbias.schemas.shard_work",
    "PlannedShard": "posbias.schemas.shard_work",
    "Question": "posbias.schemas.shard_work",
    "QuestionPool": "posbias.schemas.shard_work",
    "QuestionResult": "posbias.schemas.shard_work",
    "ResultColumns": "posbias.schemas.shard_work",
    "ShardFailure": "posbias.schemas.shard_work",
    "ShardResult": "posbias.schemas.shard_work",
    "ShardSpec": "posbias.schemas.shard_work",
    "Trial": "posbias.schemas.shard_work",
    "TrialResult": "posbias.schemas.shard_work",
    "TrialStatus": "posbias.schemas.shard_work",
    "WorkerConfig": "posbias.schemas.shard_work",
    "AnswerView": "posbias.schemas.trial",
    "PromptCheck": "posbias.schemas.trial",
    "PromptSource": "posbias.schemas.trial",
    "QuestionSpan": "posbias.schemas.trial",
    "TrialView": "posbias.schemas.trial",
    "Intervention": "posbias.schemas.variant",
    "InterventionKind": "posbias.schemas.variant",
    "LayerConfig": "posbias.schemas.variant",
    "Variant": "posbias.schemas.variant",
    "parse_intervention": "posbias.schemas.variant",
}
"""Every public name, once: the name -> the module it is loaded from. `__all__` and `__getattr__` follow
from it, and `__init__.pyi`, the view mypy and editors read, is written from it by `scripts/faces.py`
(tests/unit/test_faces.py fails when the two differ)."""

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    # Loaded on first use: what needs one record, or only the choices and errors, imports no more.
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'posbias.schemas' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
