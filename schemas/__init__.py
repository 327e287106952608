"""posbias.schemas: the pydantic records every part of posbias shares. No I/O happens here.

Each name is imported from its module on first use (`__getattr__`), so that what needs one record, or only
the command's choices (`choices.py`) and errors, does not import pydantic and numpy for all of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posbias.schemas.attention import (
        AnswerSheet,
        AttentionAuroc,
        AttentionBand,
        AttentionCurve,
        AttentionCurvePoint,
        AttentionExplanation,
        AttentionRow,
        AttentionShard,
        LayerCheck,
        LayerKind,
        MaskCanary,
        SheetFromJob,
    )
    from posbias.schemas.choices import BASELINE, CurveAxis, EndpointApi, EngineName, FakeAxis, FillerPlace
    from posbias.schemas.curve import (
        BlockDiff,
        Comparison,
        Curve,
        CurvePoint,
        CurveQuery,
        DiffPoint,
        Interval,
        OptionPoint,
        OptionsView,
    )
    from posbias.schemas.dataset import NAMED_DATASETS, DatasetInfo, DatasetSpec, NamedDataset
    from posbias.schemas.endpoint import (
        Constraint,
        EndpointCapabilities,
        EndpointReport,
        ServedMode,
        TokenSource,
    )
    from posbias.schemas.engine import EngineOptions
    from posbias.schemas.errors import (
        ConflictError,
        ModelNotCheckedWarning,
        NotFoundError,
        PosbiasError,
        RetryableError,
        RotationCostWarning,
        UsageError,
        foreign_problem,
        one_line,
    )
    from posbias.schemas.fake import FakeCollapse, FakeSpec
    from posbias.schemas.filler import FillerSpec
    from posbias.schemas.job import JobSpec
    from posbias.schemas.jobs import (
        FINISHED_JOB_STATUSES,
        BatchSizeEstimate,
        DesignEstimate,
        DispatchSummary,
        DryRun,
        EngineContext,
        ExportSummary,
        JobChange,
        JobProgress,
        JobRecord,
        JobStatus,
        RunOutcome,
        ShardRecord,
        ShardStatus,
        Submitted,
        VariantRun,
    )
    from posbias.schemas.modes import AnswerMode, AnswerOrder, ChatTemplateUse, Design
    from posbias.schemas.prompt import PromptTemplate
    from posbias.schemas.record import Record
    from posbias.schemas.sampling import SamplingSpec
    from posbias.schemas.trial import AnswerView, PromptCheck, PromptSource, QuestionSpan, TrialView
    from posbias.schemas.variant import (
        Intervention,
        InterventionKind,
        LayerConfig,
        Variant,
        parse_intervention,
    )
    from posbias.schemas.work import (
        CloseReport,
        EngineInfo,
        LoadReport,
        ModelInfo,
        ParseStatus,
        Plan,
        PlannedShard,
        Question,
        QuestionPool,
        QuestionResult,
        ResultColumns,
        ShardFailure,
        ShardResult,
        ShardSpec,
        Trial,
        TrialResult,
        TrialStatus,
        WorkerConfig,
    )

__all__ = [
    "BASELINE",
    "FINISHED_JOB_STATUSES",
    "NAMED_DATASETS",
    "AnswerMode",
    "AnswerOrder",
    "AnswerSheet",
    "AnswerView",
    "AttentionAuroc",
    "AttentionBand",
    "AttentionCurve",
    "AttentionCurvePoint",
    "AttentionExplanation",
    "AttentionRow",
    "AttentionShard",
    "BatchSizeEstimate",
    "BlockDiff",
    "ChatTemplateUse",
    "CloseReport",
    "Comparison",
    "ConflictError",
    "Constraint",
    "Curve",
    "CurveAxis",
    "CurvePoint",
    "CurveQuery",
    "DatasetInfo",
    "DatasetSpec",
    "Design",
    "DesignEstimate",
    "DiffPoint",
    "DispatchSummary",
    "DryRun",
    "EndpointApi",
    "EndpointCapabilities",
    "EndpointReport",
    "EngineContext",
    "EngineInfo",
    "EngineName",
    "EngineOptions",
    "ExportSummary",
    "FakeAxis",
    "FakeCollapse",
    "FakeSpec",
    "FillerPlace",
    "FillerSpec",
    "Interval",
    "Intervention",
    "InterventionKind",
    "JobChange",
    "JobProgress",
    "JobRecord",
    "JobSpec",
    "JobStatus",
    "LayerCheck",
    "LayerConfig",
    "LayerKind",
    "LoadReport",
    "MaskCanary",
    "ModelInfo",
    "ModelNotCheckedWarning",
    "NamedDataset",
    "NotFoundError",
    "OptionPoint",
    "OptionsView",
    "ParseStatus",
    "Plan",
    "PlannedShard",
    "PosbiasError",
    "PromptCheck",
    "PromptSource",
    "PromptTemplate",
    "Question",
    "QuestionPool",
    "QuestionResult",
    "QuestionSpan",
    "Record",
    "ResultColumns",
    "RetryableError",
    "RotationCostWarning",
    "RunOutcome",
    "SamplingSpec",
    "ServedMode",
    "ShardFailure",
    "ShardRecord",
    "ShardResult",
    "ShardSpec",
    "ShardStatus",
    "SheetFromJob",
    "Submitted",
    "TokenSource",
    "Trial",
    "TrialResult",
    "TrialStatus",
    "TrialView",
    "UsageError",
    "Variant",
    "VariantRun",
    "WorkerConfig",
    "foreign_problem",
    "one_line",
    "parse_intervention",
]

_HOMES: dict[str, str] = {
    **dict.fromkeys(
        [
            "AnswerSheet",
            "AttentionAuroc",
            "AttentionBand",
            "AttentionCurve",
            "AttentionCurvePoint",
            "AttentionExplanation",
            "AttentionRow",
            "AttentionShard",
            "LayerCheck",
            "LayerKind",
            "MaskCanary",
            "SheetFromJob",
        ],
        "attention",
    ),
    **dict.fromkeys(
        ["BASELINE", "CurveAxis", "EndpointApi", "EngineName", "FakeAxis", "FillerPlace"], "choices"
    ),
    **dict.fromkeys(
        [
            "BlockDiff",
            "Comparison",
            "Curve",
            "CurvePoint",
            "CurveQuery",
            "DiffPoint",
            "Interval",
            "OptionPoint",
            "OptionsView",
        ],
        "curve",
    ),
    **dict.fromkeys(["DatasetInfo", "DatasetSpec", "NAMED_DATASETS", "NamedDataset"], "dataset"),
    **dict.fromkeys(
        ["Constraint", "EndpointCapabilities", "EndpointReport", "ServedMode", "TokenSource"], "endpoint"
    ),
    **dict.fromkeys(["EngineOptions"], "engine"),
    **dict.fromkeys(
        [
            "ConflictError",
            "ModelNotCheckedWarning",
            "NotFoundError",
            "PosbiasError",
            "RetryableError",
            "RotationCostWarning",
            "UsageError",
            "foreign_problem",
            "one_line",
        ],
        "errors",
    ),
    **dict.fromkeys(["FakeCollapse", "FakeSpec"], "fake"),
    **dict.fromkeys(["FillerSpec"], "filler"),
    **dict.fromkeys(["JobSpec"], "job"),
    **dict.fromkeys(
        [
            "BatchSizeEstimate",
            "DesignEstimate",
            "DispatchSummary",
            "DryRun",
            "EngineContext",
            "ExportSummary",
            "FINISHED_JOB_STATUSES",
            "JobChange",
            "JobProgress",
            "JobRecord",
            "JobStatus",
            "RunOutcome",
            "ShardRecord",
            "ShardStatus",
            "Submitted",
            "VariantRun",
        ],
        "jobs",
    ),
    **dict.fromkeys(["AnswerMode", "AnswerOrder", "ChatTemplateUse", "Design"], "modes"),
    **dict.fromkeys(["PromptTemplate"], "prompt"),
    **dict.fromkeys(["Record"], "record"),
    **dict.fromkeys(["SamplingSpec"], "sampling"),
    **dict.fromkeys(["AnswerView", "PromptCheck", "PromptSource", "QuestionSpan", "TrialView"], "trial"),
    **dict.fromkeys(
        ["Intervention", "InterventionKind", "LayerConfig", "Variant", "parse_intervention"], "variant"
    ),
    **dict.fromkeys(
        [
            "CloseReport",
            "EngineInfo",
            "LoadReport",
            "ModelInfo",
            "ParseStatus",
            "Plan",
            "PlannedShard",
            "Question",
            "QuestionPool",
            "QuestionResult",
            "ResultColumns",
            "ShardFailure",
            "ShardResult",
            "ShardSpec",
            "Trial",
            "TrialResult",
            "TrialStatus",
            "WorkerConfig",
        ],
        "work",
    ),
}
"""The module of `posbias.schemas` that defines each exported name."""


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'posbias.schemas' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"posbias.schemas.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
