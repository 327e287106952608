"""What a user submits: the job spec and its parts.

A `JobSpec` is stored verbatim (as JSON) with its job, so every result can be traced back to exactly how it
was produced. Everything here validates on construction; nothing does I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from posbias.schemas.endpoint import EndpointApi
from posbias.schemas.errors import PosbiasError, one_line
from posbias.schemas.record import Record

MAX_BATCH_SIZE = 200
ROTATION_WARN_BATCH_SIZE = 20

ExtraValue = str | int | float | bool | None


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
    openai = "openai"
    """An OpenAI-compatible endpoint: `vllm serve`, SGLang, llama.cpp's server, a hosted API."""


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
    """How the engine is started. Only `name` matters to the fake engine; the `openai` engine takes the
    endpoint fields below (each None unless it is the `openai` engine) and `max_model_len`."""

    name: EngineName = Field(
        EngineName.vllm,
        description="`vllm` (GPU or CPU build), `openai` (an OpenAI-compatible endpoint) or `fake` (tests).",
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="GPUs one engine spans; the actor reserves this many GPUs."
    )
    dtype: str = Field(
        "auto",
        description="Weights/activations dtype. `auto`: the model's on GPU, float32 on CPU.",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context length; the model's own when not set."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0.0, le=1.0, description="Fraction of each GPU's memory vLLM may use."
    )
    extra: dict[str, ExtraValue] = Field(
        default_factory=dict,
        description="Further keyword arguments for `vllm.LLM` (e.g. `enable_prefix_caching: true`).",
    )
    # --- engine `openai` ---------------------------------------------------------------------------------
    base_url: str | None = Field(
        None, description="openai: the endpoint's base URL, e.g. `http://127.0.0.1:8000/v1` (no credentials)."
    )
    model: str | None = Field(
        None, description="openai: the name the endpoint serves the model under; the job's `model` if unset."
    )
    api_key_env: str | None = Field(
        None,
        description="openai: the environment variable holding the API key (e.g. `OPENAI_API_KEY`), read "
        "where the job is submitted and on the workers; never the key itself. None: no key is sent.",
    )
    api: EndpointApi | None = Field(
        None, description="openai: `chat`, `completions`, or `auto` (the default; see the README)."
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=1024, description="openai: requests in flight at once per worker (default 8)."
    )
    requests_per_minute: float | None = Field(
        None, gt=0, description="openai: requests started per minute at most, per worker (default: no limit)."
    )
    tokens_per_minute: float | None = Field(
        None,
        gt=0,
        description="openai: tokens (prompt plus output budget) sent per minute at most, per worker.",
    )
    timeout_s: float | None = Field(
        None, gt=0, description="openai: seconds one request may take before it is retried (default 600)."
    )
    max_retries: int | None = Field(
        None,
        ge=0,
        le=50,
        description="openai: retries of a request after 429, 5xx, a timeout or a dropped connection "
        "(default 6).",
    )
    max_job_tokens: int | None = Field(
        None,
        ge=1,
        description="openai: the cost guard, tokens (prompt plus output) the whole job may spend; refused at "
        "submit when its upper bound is higher, and each shard is stopped before it would spend more than "
        "its share.",
    )
    option_probs: bool | None = Field(
        None,
        description="openai: record option probabilities (needs log-probabilities): true requires them, "
        "false never asks; unset: when the endpoint returns them.",
    )

    @field_validator("api_key_env")
    @classmethod
    def _check_api_key_env(cls, value: str | None) -> str | None:
        # The message never repeats the value: it may be a key pasted in the wrong place.
        if value is not None and not _ENV_NAME.fullmatch(value):
            raise ValueError(
                "must name an environment variable that holds the key (e.g. OPENAI_API_KEY), not the key "
                "itself"
            )
        return value

    @model_validator(mode="after")
    def _check_engine_fields(self) -> Self:
        given = [name for name in OPENAI_FIELDS if getattr(self, name) is not None]
        if self.name is not EngineName.openai:
            if given:
                raise ValueError(f"{given[0]} is an option of engine openai (set engine.name: openai)")
            return self
        if self.base_url is None:
            raise ValueError("engine openai needs base_url, e.g. http://127.0.0.1:8000/v1")
        _check_base_url(self.base_url)
        if self.tensor_parallel_size != 1 or self.extra:
            raise ValueError(
                "tensor_parallel_size and extra are vLLM options; an endpoint's GPUs and settings are its own"
            )
        return self

    def identity(self) -> dict[str, Any]:
        """The options as stored and hashed: the `openai` fields only when set, so a spec written before
        they existed keeps its hash (and its idempotency keys) and its model key."""
        data = self.model_dump(mode="json")
        for name in OPENAI_FIELDS:
            if data[name] is None:
                del data[name]
        return data


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPENAI_FIELDS = (
    "base_url",
    "model",
    "api_key_env",
    "api",
    "max_concurrency",
    "requests_per_minute",
    "tokens_per_minute",
    "timeout_s",
    "max_retries",
    "max_job_tokens",
    "option_probs",
)
"""The `EngineOptions` fields of the `openai` engine."""


def _check_base_url(url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("base_url must be an http(s) URL, e.g. http://127.0.0.1:8000/v1")
    # Neither is ever needed, and either could carry a key into the stored spec.
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError(
            "base_url must not carry credentials or a query; put the key in an environment variable and name "
            "it in api_key_env"
        )


class FakeSpec(Record):
    """The fake engine's behaviour: accuracy rises linearly from `first` to `last` across positions."""

    first: float = Field(0.25, ge=0.0, le=1.0, description="Probability of a correct answer at position 1.")
    last: float = Field(0.55, ge=0.0, le=1.0, description="Probability of a correct answer at position N.")
    malformed: float = Field(0.0, ge=0.0, le=1.0, description="Rate of unparseable answer lines.")
    delay_s: float = Field(0.0, ge=0.0, description="Seconds the fake engine sleeps per prompt.")

    def accuracy(self, position: int, batch_size: int) -> float:
        """True probability of a correct answer at 1-based `position` in a prompt of `batch_size`."""
        if batch_size <= 1:
            return self.first
        return self.first + (self.last - self.first) * (position - 1) / (batch_size - 1)


class JobSpec(Record):
    """One evaluation: a model, a dataset, and the batch sizes to measure it at."""

    model: str = Field(
        description="Hugging Face id, local model folder, or a .gguf file (then give `tokenizer`); for "
        "engine `openai`, the model's name (curves group by it; the endpoint may name it `engine.model`)."
    )
    revision: str | None = Field(None, description="Model revision (branch, tag or commit) on the hub.")
    tokenizer: str | None = Field(
        None,
        description="Tokenizer id or folder, when it is not the model's own (GGUF files); for engine "
        "`openai` without a `/tokenize` endpoint, the tokenizer that gives token offsets.",
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

    def trials_per_batch_size(self, batch_size: int) -> int:
        """Prompts this spec renders at one batch size."""
        return self.iterations * (batch_size if self.design is Design.rotation else 1)

    @property
    def total_trials(self) -> int:
        """Prompts this spec renders in all."""
        return sum(self.trials_per_batch_size(n) for n in self.batch_sizes)

    def spec_hash(self) -> str:
        """A short stable digest of the spec: the same spec gives the same hash on any machine."""
        data = self.model_dump(mode="json")
        data["engine"] = self.engine.identity()
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def model_key(self) -> str:
        """Identity of the loaded engine: shards with the same key can share one actor."""
        engine = self.engine.identity()
        ident: list[object] = [self.model, self.revision, self.tokenizer, engine]
        if self.engine.name is EngineName.fake:
            ident.append(self.fake.model_dump(mode="json"))  # the fake's behaviour is its "weights"
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
