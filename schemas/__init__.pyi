"""Typed view of `schemas/__init__.py`, written by scripts/faces.py: do not edit."""

from posbias.schemas.attention import AnswerSheet as AnswerSheet
from posbias.schemas.attention import AttentionAuroc as AttentionAuroc
from posbias.schemas.attention import AttentionBand as AttentionBand
from posbias.schemas.attention import AttentionCurve as AttentionCurve
from posbias.schemas.attention import AttentionCurvePoint as AttentionCurvePoint
from posbias.schemas.attention import AttentionExplanation as AttentionExplanation
from posbias.schemas.attention import AttentionRow as AttentionRow
from posbias.schemas.attention import AttentionShard as AttentionShard
from posbias.schemas.attention import LayerCheck as LayerCheck
from posbias.schemas.attention import LayerKind as LayerKind
from posbias.schemas.attention import MaskCanary as MaskCanary
from posbias.schemas.attention import SheetFromJob as SheetFromJob
from posbias.schemas.choices import BASELINE as BASELINE
from posbias.schemas.choices import CurveAxis as CurveAxis
from posbias.schemas.choices import EndpointApi as EndpointApi
from posbias.schemas.choices import EngineName as EngineName
from posbias.schemas.choices import FakeAxis as FakeAxis
from posbias.schemas.choices import FillerPlace as FillerPlace
from posbias.schemas.curve import BlockDiff as BlockDiff
from posbias.schemas.curve import Comparison as Comparison
from posbias.schemas.curve import Curve as Curve
from posbias.schemas.curve import CurvePoint as CurvePoint
from posbias.schemas.curve import CurveQuery as CurveQuery
from posbias.schemas.curve import DiffPoint as DiffPoint
from posbias.schemas.curve import Interval as Interval
from posbias.schemas.curve import OptionPoint as OptionPoint
from posbias.schemas.curve import OptionsView as OptionsView
from posbias.schemas.dataset import NAMED_DATASETS as NAMED_DATASETS
from posbias.schemas.dataset import DatasetInfo as DatasetInfo
from posbias.schemas.dataset import DatasetSpec as DatasetSpec
from posbias.schemas.dataset import NamedDataset as NamedDataset
from posbias.schemas.endpoint import Constraint as Constraint
from posbias.schemas.endpoint import EndpointCapabilities as EndpointCapabilities
from posbias.schemas.endpoint import EndpointReport as EndpointReport
from posbias.schemas.endpoint import ServedMode as ServedMode
from posbias.schemas.endpoint import TokenSource as TokenSource
from posbias.schemas.engine_spec import EngineOptions as EngineOptions
from posbias.schemas.errors import ConflictError as ConflictError
from posbias.schemas.errors import ModelNotCheckedWarning as ModelNotCheckedWarning
from posbias.schemas.errors import NotFoundError as NotFoundError
from posbias.schemas.errors import PosbiasError as PosbiasError
from posbias.schemas.errors import RetryableError as RetryableError
from posbias.schemas.errors import RotationCostWarning as RotationCostWarning
from posbias.schemas.errors import UsageError as UsageError
from posbias.schemas.errors import foreign_problem as foreign_problem
from posbias.schemas.errors import one_line as one_line
from posbias.schemas.fake_spec import FakeCollapse as FakeCollapse
from posbias.schemas.fake_spec import FakeMechanism as FakeMechanism
from posbias.schemas.fake_spec import FakeSpec as FakeSpec
from posbias.schemas.filler_spec import FillerSpec as FillerSpec
from posbias.schemas.job_records import FINISHED_JOB_STATUSES as FINISHED_JOB_STATUSES
from posbias.schemas.job_records import BatchSizeEstimate as BatchSizeEstimate
from posbias.schemas.job_records import DesignEstimate as DesignEstimate
from posbias.schemas.job_records import DispatchSummary as DispatchSummary
from posbias.schemas.job_records import DryRun as DryRun
from posbias.schemas.job_records import EngineContext as EngineContext
from posbias.schemas.job_records import ExportSummary as ExportSummary
from posbias.schemas.job_records import JobChange as JobChange
from posbias.schemas.job_records import JobProgress as JobProgress
from posbias.schemas.job_records import JobRecord as JobRecord
from posbias.schemas.job_records import JobStatus as JobStatus
from posbias.schemas.job_records import RunOutcome as RunOutcome
from posbias.schemas.job_records import ShardRecord as ShardRecord
from posbias.schemas.job_records import ShardStatus as ShardStatus
from posbias.schemas.job_records import Submitted as Submitted
from posbias.schemas.job_records import VariantRun as VariantRun
from posbias.schemas.job_spec import JobSpec as JobSpec
from posbias.schemas.modes import AnswerMode as AnswerMode
from posbias.schemas.modes import AnswerOrder as AnswerOrder
from posbias.schemas.modes import ChatTemplateUse as ChatTemplateUse
from posbias.schemas.modes import Design as Design
from posbias.schemas.prompt import PromptTemplate as PromptTemplate
from posbias.schemas.record import Record as Record
from posbias.schemas.sampling import SamplingSpec as SamplingSpec
from posbias.schemas.shard_work import CloseReport as CloseReport
from posbias.schemas.shard_work import EngineInfo as EngineInfo
from posbias.schemas.shard_work import LoadReport as LoadReport
from posbias.schemas.shard_work import ModelInfo as ModelInfo
from posbias.schemas.shard_work import ParseStatus as ParseStatus
from posbias.schemas.shard_work import Plan as Plan
from posbias.schemas.shard_work import PlannedShard as PlannedShard
from posbias.schemas.shard_work import Question as Question
from posbias.schemas.shard_work import QuestionPool as QuestionPool
from posbias.schemas.shard_work import QuestionResult as QuestionResult
from posbias.schemas.shard_work import ResultColumns as ResultColumns
from posbias.schemas.shard_work import ShardFailure as ShardFailure
from posbias.schemas.shard_work import ShardResult as ShardResult
from posbias.schemas.shard_work import ShardSpec as ShardSpec
from posbias.schemas.shard_work import Trial as Trial
from posbias.schemas.shard_work import TrialResult as TrialResult
from posbias.schemas.shard_work import TrialStatus as TrialStatus
from posbias.schemas.shard_work import WorkerConfig as WorkerConfig
from posbias.schemas.trial import AnswerView as AnswerView
from posbias.schemas.trial import PromptCheck as PromptCheck
from posbias.schemas.trial import PromptSource as PromptSource
from posbias.schemas.trial import QuestionSpan as QuestionSpan
from posbias.schemas.trial import TrialView as TrialView
from posbias.schemas.variant import Intervention as Intervention
from posbias.schemas.variant import InterventionKind as InterventionKind
from posbias.schemas.variant import LayerConfig as LayerConfig
from posbias.schemas.variant import Variant as Variant
from posbias.schemas.variant import parse_intervention as parse_intervention

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
    "FakeMechanism",
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
