"""What a user submits: the job spec and its parts.

A `JobSpec` is stored verbatim (as JSON) with its job, so every result can be traced back to exactly how it
was produced. Everything here validates on construction; nothing does I/O.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import numpy as np
import yaml
from pydantic import Field, JsonValue, ValidationError, field_validator, model_validator

from posbias.schemas.errors import PosbiasError, one_line
from posbias.schemas.record import Record
from posbias.schemas.variant import BASELINE, MAX_VARIANTS, InterventionKind, Variant, check_overrides

MAX_BATCH_SIZE = 200
ROTATION_WARN_BATCH_SIZE = 20

RESERVED_ENGINE_ARGUMENTS = frozenset(
    {
        "model",
        "tokenizer",
        "revision",
        "dtype",
        "tensor_parallel_size",
        "max_model_len",
        "gpu_memory_utilization",
        "hf_overrides",
        "worker_extension_cls",
        "language_model_only",
    }
)
"""`vllm.LLM` arguments `engine.extra` may not set: each has a field of its own, or posbias needs its value
(the worker extension reports what ran; prompts are token ids, so no vision tower)."""


class Design(StrEnum):
    """How questions are assigned to positions across iterations."""

    random = "random"
    rotation = "rotation"


class AnswerMode(StrEnum):
    """How the model is made to answer."""

    free = "free"
    constrained = "constrained"


class ChatTemplateUse(StrEnum):
    """Whether the prompt is wrapped in the model's chat template."""

    auto = "auto"
    on = "on"
    off = "off"


class EngineName(StrEnum):
    """Which engine answers the prompts."""

    vllm = "vllm"
    fake = "fake"


class DatasetSpec(Record):
    """Where the questions come from."""

    name: str = Field(
        "cais/mmlu",
        description="Hugging Face dataset id; `cais/mmlu` (the default) also loads from a local MMLU copy.",
    )
    path: str | None = Field(
        None,
        description="Local folder or file to read instead of the hub (MMLU CSV/JSONL layouts, or any "
        "CSV/JSON/JSONL/Parquet file with the columns below). Defaults to POSBIAS_MMLU_DIR for MMLU.",
    )
    split: str = Field("test", description="Dataset split to sample questions from.")
    subjects: tuple[str, ...] | None = Field(
        None, description="Subjects to sample from; all subjects when empty."
    )
    question_column: str = Field("question", description="Column holding the question text.")
    choices_column: str = Field("choices", description="Column holding the list of options.")
    answer_column: str = Field(
        "answer", description="Column holding the gold option: a 0-based index or a letter (A, B, ...)."
    )
    subject_column: str | None = Field(
        "subject", description="Column holding the subject; None when the data has no subjects."
    )

    @field_validator("subjects", mode="before")
    @classmethod
    def _split_subjects(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple) and not value:
            return None
        return value

    @property
    def is_mmlu(self) -> bool:
        """True for MMLU, which has a known local layout and subject list."""
        return self.name in {"cais/mmlu", "mmlu"}


class PromptTemplate(Record):
    """The text around the questions. The default is the seed experiment's format, word for word."""

    instructions: str = Field(
        "Read the following multiple choice questions and answer them one by one. Your answer for each "
        "question should be in following format: <question number>. <the index of the correct option "
        "({options})>",
        description="First paragraph. `{options}` becomes e.g. `1, 2, 3, or 4` for four options.",
    )
    question: str = Field(
        "{number}. Question: {question}\n   Choices:\n{choices}",
        description="One question block. Placeholders: `{number}` (position), `{question}`, `{choices}`.",
    )
    choice: str = Field(
        "   {index}. {text}", description="One option line. Placeholders: `{index}` (1-based), `{text}`."
    )
    answer_intro: str = Field(
        "Here are the answers to the multiple-choice questions, one index per line:",
        description="Last paragraph, after the questions.",
    )
    separator: str = Field("\n\n", description="Text between paragraphs and between questions.")


class SamplingSpec(Record):
    """Decoding settings. Greedy by default, so a job's results are reproducible."""

    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int | None = Field(
        None, ge=1, description="Output token limit; derived from the batch size when not set."
    )
    seed: int | None = Field(None, description="Sampling seed for non-greedy decoding.")

    def max_tokens_for(self, batch_size: int, *, answer_mode: AnswerMode) -> int:
        """The output budget for one prompt of `batch_size` questions.

        An answer line `k. i` is about 4-6 tokens; free-form output gets room for some chatter.
        """
        if self.max_tokens is not None:
            return self.max_tokens
        if answer_mode is AnswerMode.constrained:
            return 8 * batch_size + 8
        return 16 * batch_size + 64


class EngineOptions(Record):
    """How the engine is started. Only `name` matters to the fake engine."""

    name: EngineName = Field(EngineName.vllm, description="`vllm` (GPU or CPU build) or `fake` (tests).")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs one engine spans; the actor reserves this many GPUs."
    )
    dtype: str = Field(
        "auto",
        description="Weights/activations dtype. `auto`: the model's on GPU, float32 on CPU.",
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        description="Context length. Unset at submit, vLLM jobs get the longest prompt plus its answer "
        "budget, rounded up to a power of two (never above the model's own).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory vLLM may use."
    )
    hf_overrides: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Changes to the model's Hugging Face config for every variant of the job, as vLLM's "
        "`hf_overrides` takes them (nested mappings and lists, e.g. `{text_config: {sliding_window: 512}}`); "
        "checked against the model vLLM builds, like a variant's.",
    )
    extra: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="Further keyword arguments for `vllm.LLM`, any JSON value (e.g. `enable_prefix_caching: "
        "true`, `compilation_config: {level: 0}`); vLLM checks their names when the engine starts.",
    )

    @field_validator("hf_overrides")
    @classmethod
    def _check_hf_overrides(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_overrides(value)
        return value

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_overrides(value, where="extra")
        taken = sorted(RESERVED_ENGINE_ARGUMENTS & set(value))
        if taken:
            raise ValueError(
                f"{', '.join(taken)} cannot go in engine.extra: use its own engine field (hf_overrides for "
                "config changes), or leave it to posbias"
            )
        return value


class FakeSpec(Record):
    """The fake engine's behaviour: a model whose accuracy by position is known, with the dependence
    between answers a real model shows.

    The accuracy at each position follows `curve` (or the line from `first` to `last`), and that is the true
    marginal accuracy there whatever the effects below. Answers are correlated as a model's are: every
    answer is correct when a latent score falls below the position's threshold, and the score is a sum of a
    part shared by every answer to the same question (`question_effect`: some questions are hard), a part
    shared by the answers of one prompt (`prompt_effect`: some prompts go badly; prompts showing the same
    questions, such as the rotations of one set, share it) and noise of the fake's own (`seed`). The
    question and prompt parts depend only on the content, so two fakes with different seeds answer the same
    trials with correlated answers, as two checkpoints of one model do.
    """

    first: float = Field(0.25, ge=0.0, le=1.0, description="Probability of a correct answer at position 1.")
    last: float = Field(0.55, ge=0.0, le=1.0, description="Probability of a correct answer at position N.")
    curve: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] | None = Field(
        None,
        min_length=2,
        description="Accuracy at evenly spaced points from the first position to the last, interpolated "
        "linearly (e.g. [0.6, 0.3, 0.6] is a U); replaces `first` and `last` when given.",
    )
    question_effect: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of the latent variance shared by answers to one question."
    )
    prompt_effect: float = Field(
        0.0, ge=0.0, lt=1.0, description="Share of the latent variance shared by the answers of one prompt."
    )
    seed: int | None = Field(
        None, description="Seed of the fake's own noise; the job's seed when not set (see the class)."
    )
    malformed: float = Field(0.0, ge=0.0, le=1.0, description="Rate of unparseable answer lines.")
    delay_s: float = Field(0.0, ge=0.0, description="Seconds the fake engine sleeps per prompt.")
    as_gpu: bool = Field(
        False,
        description="Reserve for the fake's actor what a vLLM engine on GPUs reserves "
        "(`engine.tensor_parallel_size` GPUs on one node), for placement and autoscaling tests on simulated "
        "GPU nodes; the fake itself uses none.",
    )
    events_file: str | None = Field(
        None,
        description="A file the fake engine appends `load` and `close` lines to (with its process id), so a "
        "test can see that an engine was closed before its actor ended.",
    )

    @model_validator(mode="after")
    def _effects_leave_noise(self) -> Self:
        if self.question_effect + self.prompt_effect >= 1.0:
            raise ValueError("question_effect + prompt_effect must be below 1 (the rest is the fake's noise)")
        return self

    def accuracy(self, position: int, batch_size: int) -> float:
        """True probability of a correct answer at 1-based `position` in a prompt of `batch_size`."""
        where = 0.0 if batch_size <= 1 else (position - 1) / (batch_size - 1)
        points = self.curve if self.curve is not None else (self.first, self.last)
        if batch_size <= 1:
            return points[0]
        return float(np.interp(where, np.linspace(0.0, 1.0, len(points)), points))


class JobSpec(Record):
    """One evaluation: a model, a dataset, and the batch sizes to measure it at."""

    model: str = Field(
        description="Hugging Face id, local model folder, or a .gguf file (then give `tokenizer`)."
    )
    revision: str | None = Field(None, description="Model revision (branch, tag or commit) on the hub.")
    tokenizer: str | None = Field(
        None, description="Tokenizer id or folder, when it is not the model's own (GGUF files)."
    )
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Where the questions come from.")
    batch_sizes: tuple[int, ...] = Field(
        (1, 5, 10, 20, 50), description=f"Questions per prompt (N), each 1..{MAX_BATCH_SIZE}."
    )
    iterations: int = Field(
        100, ge=1, le=1_000_000, description="Trials per batch size (sets of questions sampled)."
    )
    seed: int = Field(0, description="Seed for sampling questions; the same spec gives the same trials.")
    design: Design = Field(
        Design.random,
        description="`random`: each trial samples N distinct questions. `rotation`: each sampled set is "
        "shown N times, rotated so every question sits at every position once (N times the cost).",
    )
    answer_mode: AnswerMode = Field(
        AnswerMode.free,
        description="`free`: the model writes freely and a tolerant parser reads it. `constrained`: "
        "decoding is restricted to exactly N lines `k. i`.",
    )
    shuffle_choices: bool = Field(
        False, description="Shuffle each question's options per trial; the permutation is stored."
    )
    prompt: PromptTemplate = Field(default_factory=PromptTemplate, description="The prompt's wording.")
    chat_template: ChatTemplateUse = Field(
        ChatTemplateUse.auto,
        description="Wrap the prompt in the model's chat template: `auto` when it has one.",
    )
    sampling: SamplingSpec = Field(default_factory=SamplingSpec, description="Decoding settings.")
    engine: EngineOptions = Field(default_factory=EngineOptions, description="Engine settings.")
    fake: FakeSpec = Field(default_factory=FakeSpec, description="Fake engine behaviour (engine `fake`).")
    priority: int = Field(0, description="Higher runs first.")
    max_attempts: int = Field(3, ge=1, le=100, description="Tries per shard before it is dead.")
    shard_size: int | None = Field(
        None, ge=1, description="Trials per shard; chosen from the batch size when not set."
    )
    variants: tuple[Variant, ...] = Field(
        (),
        description="Engine configurations of the model that each answer every trial: `baseline` (the "
        "model as published) and interventions such as `global-only`, `window:<tokens>`, "
        "`pattern:<local>:<global>`, `rope-base:<value>`, `rope-base:x<factor>`, or `{name, hf_overrides}`. "
        "Empty: the baseline alone.",
        max_length=MAX_VARIANTS,
    )

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _parse_batch_sizes(cls, value: Any) -> Any:
        if isinstance(value, int):
            return (value,)
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.split(",") if part.strip())
            except ValueError:
                raise ValueError(
                    f"batch sizes must be comma-separated integers, e.g. 1,5,10 (got {value!r})"
                ) from None
        return value

    @field_validator("batch_sizes")
    @classmethod
    def _check_batch_sizes(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value:
            raise ValueError("give at least one batch size, e.g. --batch-sizes 1,5,10")
        bad = [n for n in value if not 1 <= n <= MAX_BATCH_SIZE]
        if bad:
            raise ValueError(f"batch sizes must be between 1 and {MAX_BATCH_SIZE} (got {bad})")
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _warn_rotation_cost(self) -> Self:
        if self.design is Design.rotation:
            big = [n for n in self.batch_sizes if n > ROTATION_WARN_BATCH_SIZE]
            if big:
                warnings.warn(
                    f"rotation presents each sampled set N times: batch sizes {big} cost "
                    f"{', '.join(f'{n}x' for n in big)} the prompts of the random design",
                    RotationCostWarning,
                    stacklevel=2,
                )
        return self

    @model_validator(mode="after")
    def _check_variants(self) -> Self:
        names = [variant.name for variant in self.variants]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"variant names must differ: {', '.join(repeated)} given twice")
        fake = self.engine.name is EngineName.fake
        for variant in self.variants:
            kind = variant.intervention.kind if variant.intervention is not None else None
            if fake and (variant.hf_overrides or kind not in (None, InterventionKind.baseline)):
                raise ValueError(
                    f"variant {variant.name}: the fake engine has no architecture to change; give fake "
                    "variants as {name: NAME, fake: {last: 0.4}}"
                )
            if variant.fake:
                if not fake:
                    raise ValueError(f"variant {variant.name}: `fake` settings are for engine `fake` only")
                try:
                    self.fake_for(variant)
                except ValidationError as exc:
                    raise ValueError(
                        f"variant {variant.name}: fake.{describe_validation_error(exc)}"
                    ) from None
        if fake and self.engine.hf_overrides:
            raise ValueError("engine.hf_overrides: the fake engine has no config to change")
        return self

    @property
    def runs(self) -> tuple[Variant, ...]:
        """The variants that run: `variants`, or the baseline alone when none are given."""
        return self.variants or (Variant(name=BASELINE),)

    @property
    def names(self) -> tuple[str, ...]:
        """The names of the variants that run, in order."""
        return tuple(variant.name for variant in self.runs)

    def variant(self, name: str) -> Variant:
        """The variant called `name`. Raises `KeyError` when the spec has none of that name."""
        for variant in self.runs:
            if variant.name == name:
                return variant
        raise KeyError(name)

    def fake_for(self, variant: Variant) -> FakeSpec:
        """The fake engine's behaviour under `variant`: the job's `fake` with the variant's changes."""
        if not variant.fake:
            return self.fake
        return FakeSpec.model_validate({**self.fake.model_dump(), **variant.fake})

    def trials_per_batch_size(self, batch_size: int) -> int:
        """Prompts this spec renders at one batch size, for each variant."""
        return self.iterations * (batch_size if self.design is Design.rotation else 1)

    @property
    def total_trials(self) -> int:
        """Prompts this spec renders in all, every variant's."""
        return len(self.runs) * sum(self.trials_per_batch_size(n) for n in self.batch_sizes)

    def spec_hash(self) -> str:
        """A short stable digest of the spec: the same spec gives the same hash on any machine."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def model_key(self, variant: Variant | None = None) -> str:
        """Identity of the loaded engine of `variant` (default: the first that runs): shards with the same key
        can share one actor. A variant's overrides and what it expects vLLM to build are part of it."""
        variant = variant or self.runs[0]
        engine = self.engine.model_dump(mode="json")
        if not engine["hf_overrides"]:
            del engine["hf_overrides"]  # so jobs stored before the field existed keep their key
        ident: list[object] = [self.model, self.revision, self.tokenizer, engine]
        if self.engine.name is EngineName.fake:
            ident.append(
                self.fake_for(variant).model_dump(mode="json")
            )  # the fake's behaviour is its "weights"
        if variant.hf_overrides or variant.expect is not None:
            expect = None if variant.expect is None else variant.expect.model_dump(mode="json")
            ident.append({"hf_overrides": variant.hf_overrides, "expect": expect})
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> JobSpec:
        """Load a spec from YAML or JSON; `overrides` (e.g. CLI flags) replace the file's values."""
        file = Path(path)
        try:
            text = file.read_text()
        except OSError as exc:
            raise PosbiasError(f"cannot read spec file {file}: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text) if file.suffix.lower() != ".json" else json.loads(text)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise PosbiasError(f"spec file {file} is not valid YAML/JSON: {one_line(exc)}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise PosbiasError(f"spec file {file} must hold a mapping of fields, e.g. `model: ...`")
        return cls.build(_merge(data, overrides), source=str(file))

    @classmethod
    def build(cls, data: dict[str, Any], *, source: str = "spec") -> JobSpec:
        """Validate `data`, turning pydantic's report into one line that names the field to fix."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PosbiasError(f"invalid {source}: {describe_validation_error(exc)}") from None


class RotationCostWarning(UserWarning):
    """The rotation design multiplies the number of prompts by the batch size."""


def describe_validation_error(exc: ValidationError) -> str:
    """One line for the first problem pydantic found, e.g. `batch_sizes: must be between 1 and 200`."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "spec"
    message = str(first["msg"]).removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field (check its spelling in the spec reference: posbias submit --help)"
    more = len(exc.errors()) - 1
    return f"{where}: {message}" + (f" (and {more} more)" if more else "")


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged
