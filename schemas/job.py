"""What a user submits: the job spec and its parts.

A `JobSpec` is stored verbatim (as JSON) with its job, so every result can be traced back to exactly how it
was produced. Everything here validates on construction; nothing does I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import warnings
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import numpy as np
import yaml
from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    field_validator,
    model_validator,
)

from posbias.schemas.endpoint import EndpointApi
from posbias.schemas.errors import PosbiasError, one_line
from posbias.schemas.record import Record
from posbias.schemas.variant import BASELINE, MAX_VARIANTS, InterventionKind, Variant, check_overrides

MAX_BATCH_SIZE = 200
ROTATION_WARN_BATCH_SIZE = 20

# What both stores can hold: PostgreSQL's INTEGER columns are 32 bits (priority, counts), ids and JSON
# numbers 64; a spec that SQLite would take must not fail on PostgreSQL.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_TEXT = 100_000
"""Characters in any one text of a spec at most (a prompt template is the longest, a few hundred)."""
MAX_SPEC_BYTES = 1 << 20
"""Size of a spec file at most: a spec is a few hundred bytes; a larger file is a mistake."""
MAX_SPEC_DEPTH = 16
"""Nesting of a spec's mappings and lists at most (a spec nests three deep)."""
MAX_SPEC_VALUES = 100_000
"""Values in a spec at most, counting each use of a YAML alias (so an alias bomb is refused, not expanded)."""
DTYPES = ("auto", "float32", "float", "float16", "half", "bfloat16")
"""The dtypes vLLM takes."""


def _not_bool(value: Any) -> Any:
    # pydantic's lax mode reads `true` as 1; in a spec that is always a mistake (`batch_sizes: true`).
    if isinstance(value, bool):
        raise ValueError("expected an integer, not true/false")
    return value


Int = Annotated[int, BeforeValidator(_not_bool)]
"""An integer that is not a boolean."""
FINITE = ConfigDict(allow_inf_nan=False)
"""Numbers in a spec are finite: `inf` or `nan` is refused where it is given, not met by the engine."""


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
    """How questions are assigned to positions across iterations, and how many of them are asked."""

    random = "random"
    rotation = "rotation"
    probe = "probe"


class AnswerOrder(StrEnum):
    """The order in which a prompt asks for its answers."""

    forward = "forward"
    reverse = "reverse"
    random = "random"


class FillerPlace(StrEnum):
    """Where filler goes in a prompt."""

    before = "before"
    """Between the instructions and the first question: every question moves away from the prompt's start,
    none from its answer."""
    after = "after"
    """After question k (`FillerSpec.position`): questions 1..k move away from their answers, their
    positions unchanged."""
    end = "end"
    """Between the last question and the answer request: every question moves away from its answer."""


class FakeAxis(StrEnum):
    """What the fake engine's accuracy is a function of."""

    position = "position"
    answer_slot = "answer-slot"
    token_distance = "token-distance"


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

    model_config = FINITE

    name: str = Field(
        "cais/mmlu",
        min_length=1,
        max_length=500,
        description="Hugging Face dataset id; `cais/mmlu` (the default) also loads from a local MMLU copy.",
    )
    path: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Local folder or file to read instead of the hub (MMLU CSV/JSONL layouts, or any "
        "CSV/JSON/JSONL/Parquet file with the columns below). Defaults to POSBIAS_MMLU_DIR for MMLU.",
    )
    split: str = Field(
        "test", min_length=1, max_length=200, description="Dataset split to sample questions from."
    )
    subjects: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] | None = Field(
        None, max_length=10_000, description="Subjects to sample from; all subjects when empty."
    )
    question_column: str = Field(
        "question", min_length=1, max_length=200, description="Column holding the question text."
    )
    choices_column: str = Field(
        "choices",
        min_length=1,
        max_length=1000,
        description="Column holding the options: a list of texts, or a mapping of labels to texts (then "
        "the answer is a label); for a CSV, the option columns, e.g. `A,B,C,D`.",
    )
    answer_column: str = Field(
        "answer",
        min_length=1,
        max_length=200,
        description="Column holding the gold option: a 0-based index or a letter (A, B, ...), or a label.",
    )
    subject_column: str | None = Field(
        "subject",
        min_length=1,
        max_length=200,
        description="Column holding the subject; None when the data has no subjects.",
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

    model_config = ConfigDict(str_max_length=MAX_TEXT)

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
    order_instruction: str = Field(
        "Answer the questions in this order: {order}.",
        description="Paragraph after the instructions when the answer order is not forward. `{order}` "
        "becomes the question numbers in the order asked, e.g. `3, 1, 2`.",
    )
    probe_instructions: str = Field(
        "Read the following multiple choice questions. You will be asked to answer one of them, in the "
        "following format: <question number>. <the index of the correct option ({options})>",
        description="First paragraph of the probe design, in place of `instructions`.",
    )
    probe_request: str = Field(
        "Answer question {number} only, on one line:",
        description="Last paragraph of the probe design, in place of `answer_intro`. `{number}` is the "
        "position asked.",
    )


class SamplingSpec(Record):
    """Decoding settings. Greedy by default, so a job's results are reproducible."""

    model_config = FINITE

    temperature: float = Field(0.0, ge=0.0, le=100.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: Int | None = Field(
        None, ge=1, le=INT32_MAX, description="Output token limit; derived from the batch size when not set."
    )
    seed: Int | None = Field(None, ge=0, le=INT64_MAX, description="Sampling seed for non-greedy decoding.")

    def max_tokens_for(self, answers: int, *, answer_mode: AnswerMode) -> int:
        """The output budget for one prompt that asks for `answers` answers (its batch size, or 1 for a
        probe).

        An answer line `k. i` is about 4-6 tokens; free-form output gets room for some chatter.
        """
        if self.max_tokens is not None:
            return self.max_tokens
        if answer_mode is AnswerMode.constrained:
            return 8 * answers + 8
        return 16 * answers + 64


MAX_FILLER_TOKENS = 1_000_000
MAX_FILLER_FILE_BYTES = 4_000_000
BUILTIN_FILLER = "builtin"


class FillerSpec(Record):
    """Neutral text of a controlled length, in the model's own tokens, placed in every prompt to move
    questions away from their answers (or from the prompt's start) without changing their positions."""

    tokens: tuple[Annotated[int, Field(ge=0, le=MAX_FILLER_TOKENS)], ...] = Field(
        min_length=1,
        description="Filler lengths in the model's tokens; several sweep length x position: every sampled "
        "set is shown at each length (0 is the control without filler).",
    )
    where: FillerPlace = Field(
        FillerPlace.end,
        description="`before` the questions, `after` question `position`, or at the `end`, between the "
        "questions and the answer request. Filler never splits a question.",
    )
    position: int | None = Field(
        None, ge=1, description="With `where: after`: the question the filler follows (k; below every N)."
    )
    source: str = Field(
        BUILTIN_FILLER,
        description="`builtin` (plain, repetitive, content-free sentences written for posbias) or a UTF-8 "
        "text file, read at submit and stored with the job (`text`). Each prompt's filler starts at a "
        "sentence drawn from the job's seed, the same at every length of one sampled set.",
    )
    text: str | None = Field(
        None,
        description="The text of `source` when it is a file, as read at submit; leave it unset (posbias "
        "fills it in).",
    )

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: Any) -> Any:
        if isinstance(value, int):
            return (value,)
        if isinstance(value, str):
            try:
                return tuple(int(part) for part in value.split(",") if part.strip())
            except ValueError:
                raise ValueError(
                    f"filler tokens must be comma-separated integers, e.g. 0,1000,4000 (got {value!r})"
                ) from None
        return value

    @field_validator("tokens")
    @classmethod
    def _distinct_tokens(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _position_with_after(self) -> Self:
        if self.where is FillerPlace.after and self.position is None:
            raise ValueError("filler where `after` needs the question it follows: set filler.position (k)")
        if self.where is not FillerPlace.after and self.position is not None:
            raise ValueError("filler.position is only for `where: after`")
        return self

    @property
    def builtin(self) -> bool:
        """True for the built-in neutral text."""
        return self.source == BUILTIN_FILLER


class EngineOptions(Record):
    """How the engine is started. Only `name` matters to the fake engine; the `openai` engine takes the
    endpoint fields below (each None unless it is the `openai` engine) and `max_model_len`."""

    model_config = FINITE

    name: EngineName = Field(
        EngineName.vllm,
        description="`vllm` (GPU or CPU build), `openai` (an OpenAI-compatible endpoint) or `fake` (tests).",
    )
    tensor_parallel_size: Int = Field(
        1, ge=1, le=64, description="GPUs one engine spans; the actor reserves this many GPUs."
    )
    dtype: str = Field(
        "auto",
        description="Weights/activations dtype. `auto`: the model's on GPU, float32 on CPU.",
    )
    max_model_len: Int | None = Field(
        None,
        ge=16,
        le=INT32_MAX,
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
        max_length=100,
        description="Further keyword arguments for `vllm.LLM`, any JSON value (e.g. `enable_prefix_caching: "
        "true`, `compilation_config: {level: 0}`); vLLM checks their names when the engine starts.",
    )

    # --- engine `openai` ---------------------------------------------------------------------------------
    base_url: str | None = Field(
        None,
        max_length=4096,
        description="openai: the endpoint's base URL, e.g. `http://127.0.0.1:8000/v1` (no credentials).",
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="openai: the name the endpoint serves the model under; the job's `model` if unset.",
    )
    api_key_env: str | None = Field(
        None,
        max_length=200,
        description="openai: the environment variable holding the API key (e.g. `OPENAI_API_KEY`), read "
        "where the job is submitted and on the workers; never the key itself. None: no key is sent.",
    )
    api: EndpointApi | None = Field(
        None, description="openai: `chat`, `completions`, or `auto` (the default; see the README)."
    )
    max_concurrency: Int | None = Field(
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
    max_retries: Int | None = Field(
        None,
        ge=0,
        le=50,
        description="openai: retries of a request after 429, 5xx, a timeout or a dropped connection "
        "(default 6).",
    )
    max_job_tokens: Int | None = Field(
        None,
        ge=1,
        le=INT64_MAX,
        description="openai: the cost guard, tokens (prompt plus output) the whole job may spend; refused at "
        "submit when its upper bound is higher, and each shard is stopped before it would spend more than "
        "its share.",
    )
    option_probs: bool | None = Field(
        None,
        description="openai: record option probabilities (needs log-probabilities): true requires them, "
        "false never asks; unset: when the endpoint returns them.",
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
        if self.tensor_parallel_size != 1 or self.extra or self.hf_overrides:
            raise ValueError(
                "tensor_parallel_size, extra and hf_overrides are vLLM options; an endpoint's GPUs, settings "
                "and config are its own"
            )
        return self

    @field_validator("dtype")
    @classmethod
    def _check_dtype(cls, value: str) -> str:
        if value not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)} (got {value[:40]!r})")
        return value

    def identity(self) -> dict[str, Any]:
        """The options as stored and hashed: the `openai` fields and `hf_overrides` only when set, so a spec
        written before they existed keeps its hash (and its idempotency keys) and its model key."""
        data = self.model_dump(mode="json")
        for name in OPENAI_FIELDS:
            if data[name] is None:
                del data[name]
        if not data["hf_overrides"]:
            del data["hf_overrides"]  # so jobs stored before the field existed keep their hash and key
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

    model_config = FINITE

    first: float = Field(0.25, ge=0.0, le=1.0, description="Probability of a correct answer at position 1.")
    last: float = Field(0.55, ge=0.0, le=1.0, description="Probability of a correct answer at position N.")
    curve: tuple[Annotated[float, Field(ge=0.0, le=1.0)], ...] | None = Field(
        None,
        min_length=2,
        description="Accuracy at evenly spaced points from the first position to the last, interpolated "
        "linearly (e.g. [0.6, 0.3, 0.6] is a U); replaces `first` and `last` when given.",
    )
    depends_on: FakeAxis = Field(
        FakeAxis.position,
        description="What the accuracy is a function of: the question's `position`, its `answer-slot` (the "
        "line it is answered on; `first` is slot 1), or its `token-distance` to its answer (`first` at "
        "distance 0 or inside `window`, `last` at `distance_span` or beyond `window`).",
    )
    window: int | None = Field(
        None,
        ge=1,
        description="A sliding window in tokens, reported as a real model's is (layers 0 and 2 of 4 slide); "
        "with depends_on token-distance the accuracy steps there, from `first` inside to `last` beyond.",
    )
    distance_span: int = Field(
        4096,
        ge=1,
        description="With depends_on token-distance and no window: the distance (tokens) over which the "
        "curve runs from its first point to its last (constant beyond).",
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
    delay_s: float = Field(0.0, ge=0.0, le=60.0, description="Seconds the fake engine sleeps per prompt.")
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
        """True probability of a correct answer at 1-based `position` in a prompt of `batch_size` (for a
        fake that depends on position; `accuracy_of` for any)."""
        where = 0.0 if batch_size <= 1 else (position - 1) / (batch_size - 1)
        points = self.curve if self.curve is not None else (self.first, self.last)
        if batch_size <= 1:
            return points[0]
        return float(np.interp(where, np.linspace(0.0, 1.0, len(points)), points))

    def accuracy_of(
        self,
        *,
        position: Any,
        batch_size: int,
        slot: Any = None,
        answers: int | None = None,
        distance: Any = None,
    ) -> Any:
        """True probability of a correct answer, by `depends_on`: at `position` of `batch_size`, at answer
        `slot` of `answers` lines, or at token `distance`. Takes numbers or numpy arrays alike."""
        points = np.asarray(self.curve if self.curve is not None else (self.first, self.last))
        if self.depends_on is FakeAxis.position:
            along, count = position, batch_size
        elif self.depends_on is FakeAxis.answer_slot:
            if slot is None or answers is None:
                raise ValueError("a fake that depends on the answer slot needs each answer's slot")
            along, count = slot, answers
        else:
            if distance is None:
                raise ValueError("a fake that depends on token distance needs each answer's distance")
            d = np.asarray(distance, dtype=np.float64)
            if self.window is not None:
                found = np.where(d < self.window, points[0], points[-1])
            else:
                found = np.interp(d / self.distance_span, np.linspace(0.0, 1.0, len(points)), points)
            return float(found) if found.ndim == 0 else found
        x = np.asarray(along, dtype=np.float64)
        where = np.zeros_like(x) if count <= 1 else (x - 1) / (count - 1)
        found = np.interp(where, np.linspace(0.0, 1.0, len(points)), points)
        return float(found) if found.ndim == 0 else found


class JobSpec(Record):
    """One evaluation: a model, a dataset, and the batch sizes to measure it at."""

    model_config = FINITE

    model: str = Field(
        min_length=1,
        max_length=500,
        description="Hugging Face id, local model folder, or a .gguf file (then give `tokenizer`); for "
        "engine `openai`, the model's name (curves group by it; the endpoint may name it `engine.model`).",
    )
    revision: str | None = Field(
        None, min_length=1, max_length=200, description="Model revision (branch, tag or commit) on the hub."
    )
    tokenizer: str | None = Field(
        None,
        min_length=1,
        max_length=4096,
        description="Tokenizer id or folder, when it is not the model's own (GGUF files); for engine "
        "`openai` without a `/tokenize` endpoint, the tokenizer that gives token offsets.",
    )
    dataset: DatasetSpec = Field(default_factory=DatasetSpec, description="Where the questions come from.")
    batch_sizes: tuple[Int, ...] = Field(
        (1, 5, 10, 20, 50),
        max_length=MAX_BATCH_SIZE,
        description=f"Questions per prompt (N), each 1..{MAX_BATCH_SIZE}.",
    )
    iterations: Int = Field(
        100, ge=1, le=1_000_000, description="Trials per batch size (sets of questions sampled)."
    )
    seed: Int = Field(
        0,
        ge=-INT64_MAX,
        le=INT64_MAX,
        description="Seed for sampling questions; the same spec gives the same trials.",
    )
    design: Design = Field(
        Design.random,
        description="`random`: each trial samples N distinct questions. `rotation`: each sampled set is "
        "shown N times, rotated so every question sits at every position once (N times the cost). "
        "`probe`: each prompt shows N questions and asks for the answer to one, every position asked "
        "equally often (iterations a multiple of every batch size).",
    )
    answer_mode: AnswerMode = Field(
        AnswerMode.free,
        description="`free`: the model writes freely and a tolerant parser reads it. `constrained`: "
        "decoding is restricted to exactly N lines `k. i`.",
    )
    answer_order: AnswerOrder = Field(
        AnswerOrder.forward,
        description="The order the answers are asked in: `forward` (1..N, the seed's), `reverse` (N..1) or "
        "`random` (a per-set order drawn from the seed, stated in the instructions and stored with each "
        "trial). Constrained decoding follows it; every result stores its answer slot.",
    )
    filler: FillerSpec | None = Field(
        None, description="Neutral filler of controlled token lengths (see FillerSpec); none when unset."
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
    priority: Int = Field(0, ge=-INT32_MAX, le=INT32_MAX, description="Higher runs first.")
    max_attempts: Int = Field(
        3,
        ge=1,
        le=100,
        description="Failed tries per shard before it is dead (a try counts when the shard itself failed, "
        "not when its dispatcher died).",
    )
    shard_size: Int | None = Field(
        None, ge=1, le=1_000_000, description="Trials per shard; chosen from the batch size when not set."
    )
    variants: tuple[Variant, ...] = Field(
        (),
        description="Engine configurations of the model that each answer every trial: `baseline` (the "
        "model as published) and interventions such as `global-only`, `window:<tokens>`, "
        "`pattern:<local>:<global>`, `rope-base:<value>`, `rope-base:x<factor>`, or `{name, hf_overrides}`. "
        "Empty: the baseline alone.",
        max_length=MAX_VARIANTS,
    )

    @model_validator(mode="before")
    @classmethod
    def _check_texts(cls, data: Any) -> Any:
        # Every text, wherever it sits: PostgreSQL refuses NUL in text and JSON, and SQLite would keep it,
        # so a spec SQLite takes would fail on PostgreSQL.
        for where, text in _texts(data, ()):
            if "\x00" in text:
                raise ValueError(f"{where or 'spec'}: text holds a NUL character (\\x00); remove it")
            if len(text) > MAX_TEXT:
                raise ValueError(f"{where or 'spec'}: text longer than {MAX_TEXT:,} characters")
        return data

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("name a model (a hub id, a folder, a .gguf file or `demo`)")
        return value

    @field_validator("batch_sizes", mode="before")
    @classmethod
    def _parse_batch_sizes(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"batch sizes must be integers, e.g. [1, 5, 10] (got {value!r})")
        if isinstance(value, int):
            return (value,)
        if isinstance(value, str):
            parts = [part.strip() for part in value.split(",") if part.strip()]
            if not all(part.isascii() and part.isdecimal() for part in parts):
                raise ValueError(
                    f"batch sizes must be comma-separated integers, e.g. 1,5,10 (got {value[:80]!r})"
                )
            return tuple(int(part) for part in parts)
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
        served = self.engine.name is EngineName.openai
        for variant in self.variants:
            kind = variant.intervention.kind if variant.intervention is not None else None
            if served and (variant.hf_overrides or kind not in (None, InterventionKind.baseline)):
                raise ValueError(
                    f"variant {variant.name}: a served model's architecture is its server's; serve each "
                    "variant as its own endpoint (vllm serve --hf-overrides ...) and submit a job to each"
                )
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

    @model_validator(mode="after")
    def _check_design(self) -> Self:
        if self.design is Design.probe:
            if self.answer_order is not AnswerOrder.forward:
                raise ValueError("the probe design asks for one answer: leave answer_order forward")
            uneven = [n for n in self.batch_sizes if self.iterations % n]
            if uneven:
                raise ValueError(
                    f"the probe design asks every position equally often: iterations ({self.iterations}) "
                    f"must be a multiple of every batch size (not of {uneven}), e.g. {_lcm(self.batch_sizes)}"
                )
        if self.filler is not None and self.filler.position is not None:
            short = [n for n in self.batch_sizes if n <= self.filler.position]
            if short:
                raise ValueError(
                    f"filler after question {self.filler.position}: batch sizes {short} have no question "
                    "after it; lower filler.position or drop those batch sizes"
                )
        return self

    @property
    def filler_lengths(self) -> tuple[int, ...]:
        """The filler lengths every sampled set is shown at: (0,) without filler."""
        return self.filler.tokens if self.filler is not None else (0,)

    def describe_design(self) -> str:
        """The design in words, e.g. `random design, answers in random order, filler 0/512 tokens at the
        end (builtin)`."""
        words = [f"{self.design.value} design"]
        if self.answer_order is not AnswerOrder.forward:
            words.append(f"answers in {self.answer_order.value} order")
        if self.filler is not None:
            place = {
                FillerPlace.before: "before the questions",
                FillerPlace.after: f"after question {self.filler.position}",
                FillerPlace.end: "before the answer request",
            }[self.filler.where]
            lengths = "/".join(str(t) for t in self.filler.tokens)
            source = "built-in text" if self.filler.builtin else Path(self.filler.source).name
            words.append(f"filler {lengths} tokens {place} ({source})")
        return ", ".join(words)

    def trials_per_batch_size(self, batch_size: int) -> int:
        """Prompts this spec renders at one batch size, for each variant."""
        rotations = batch_size if self.design is Design.rotation else 1
        return self.iterations * rotations * len(self.filler_lengths)

    @property
    def total_trials(self) -> int:
        """Prompts this spec renders in all, every variant's."""
        return len(self.runs) * sum(self.trials_per_batch_size(n) for n in self.batch_sizes)

    def spec_hash(self) -> str:
        """A short stable digest of the spec: the same spec gives the same hash on any machine. Fields added
        after jobs were stored are left out while at their defaults, so a stored job's spec keeps its hash
        (its idempotency key still names it)."""
        data = self.model_dump(mode="json")
        data["engine"] = self.engine.identity()
        if not data["variants"]:
            del data["variants"]
        for path in _LATER_FIELDS:
            *parents, key = path
            where = data
            for part in parents:
                where = where[part]
            if where.get(key) == _default_at(path):
                del where[key]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def model_key(self, variant: Variant | None = None) -> str:
        """Identity of the loaded engine of `variant` (default: the first that runs): shards with the same key
        can share one actor. A variant's overrides and what it expects vLLM to build are part of it."""
        variant = variant or self.runs[0]
        engine = self.engine.identity()
        ident: list[object] = [self.model, self.revision, self.tokenizer, engine]
        if self.engine.name is EngineName.fake:
            # The fake's behaviour is its "weights"; its fields added later count only when set.
            fake = self.fake_for(variant).model_dump(mode="json")
            for path in _LATER_FIELDS:
                if path[0] == "fake" and fake.get(path[1]) == _default_at(path):
                    del fake[path[1]]
            ident.append(fake)
        if variant.hf_overrides or variant.expect is not None:
            expect = None if variant.expect is None else variant.expect.model_dump(mode="json")
            ident.append({"hf_overrides": variant.hf_overrides, "expect": expect})
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> JobSpec:
        """Load a spec from YAML or JSON; `overrides` (e.g. CLI flags) replace the file's values."""
        data = read_spec_file(path)
        return cls.build(_merge(data, overrides), source=str(path))

    @classmethod
    def build(cls, data: dict[str, Any], *, source: str = "spec") -> JobSpec:
        """Validate `data`, turning pydantic's report into one line that names the field to fix."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PosbiasError(f"invalid {source}: {describe_validation_error(exc)}") from None


def read_spec_file(path: str | Path, *, what: str = "spec file") -> dict[str, Any]:
    """The mapping a YAML or JSON spec file holds (`.json` is read as JSON, anything else as YAML).

    Only a regular file of at most `MAX_SPEC_BYTES` is read (a FIFO would block, a device never end), as
    UTF-8; YAML is read by the rules of YAML 1.2 (`1:30` is text, not 90; only `true`/`false` are booleans).
    Nesting beyond `MAX_SPEC_DEPTH` or more than `MAX_SPEC_VALUES` values are refused. Every problem is a
    `PosbiasError` naming the file.
    """
    file = Path(path)
    text = _read_text(file, what=what, limit=MAX_SPEC_BYTES)
    try:
        is_json = file.suffix.lower() == ".json"
        data = json.loads(text) if is_json else yaml.load(text, Loader=_SpecLoader)
    except (yaml.YAMLError, ValueError) as exc:
        raise PosbiasError(f"{what} {file} is not valid YAML/JSON: {one_line(exc)}") from None
    except RecursionError:
        raise PosbiasError(f"{what} {file} nests too deeply (at most {MAX_SPEC_DEPTH} levels)") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PosbiasError(f"{what} {file} must hold a mapping of fields, e.g. `model: ...`")
    problem = check_shape(data)
    if problem:
        raise PosbiasError(f"{what} {file}: {problem}")
    return data


def _read_text(file: Path, *, what: str, limit: int) -> str:
    try:
        # Non-blocking, so that opening a FIFO returns at once instead of waiting for a writer; the checks
        # are on the open file, so what is read is what was checked.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    except IsADirectoryError:
        raise PosbiasError(f"{what} {file} is a folder; give a YAML or JSON file") from None
    except OSError as exc:
        raise PosbiasError(f"cannot read {what} {file}: {exc.strerror or one_line(exc)}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PosbiasError(f"{what} {file} is a folder; give a YAML or JSON file")
        if not stat.S_ISREG(info.st_mode):
            raise PosbiasError(
                f"{what} {file} is not a regular file (a device or pipe); give a YAML or JSON file"
            )
        if info.st_size > limit:
            raise PosbiasError(f"{what} {file} is {info.st_size:,} bytes; a spec is at most {limit:,} bytes")
        with os.fdopen(fd, "rb") as handle:
            fd = -1  # the handle owns it now
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise PosbiasError(f"cannot read {what} {file}: {exc.strerror or one_line(exc)}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > limit:
        raise PosbiasError(f"{what} {file} is over {limit:,} bytes; a spec is at most {limit:,} bytes")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PosbiasError(
            f"{what} {file} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); save it "
            "as UTF-8"
        ) from None


def check_shape(data: Any) -> str | None:
    """Why `data` (parsed YAML or JSON) is too deep or too large to be a spec; None when it is not."""
    budget = MAX_SPEC_VALUES
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        budget -= 1
        if budget < 0:
            return f"more than {MAX_SPEC_VALUES:,} values (a YAML alias counts each time it is used)"
        if isinstance(value, dict | list | tuple):
            if depth >= MAX_SPEC_DEPTH:
                return f"nests more than {MAX_SPEC_DEPTH} levels deep"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                stack.append((key, depth + 1))
                stack.append((item, depth + 1))
    return None


def _texts(value: Any, where: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """Every text in `value` (keys too) with where it sits (`dataset.name`)."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, where)]
    seen = 0
    while stack and seen <= MAX_SPEC_VALUES:
        item, at = stack.pop()
        seen += 1
        if isinstance(item, str):
            yield ".".join(at), item
        elif isinstance(item, dict):
            for key, inner in item.items():
                name = str(key)[:40]
                if isinstance(key, str):
                    yield ".".join((*at, name)), key
                stack.append((inner, (*at, name)))
        elif isinstance(item, list | tuple):
            stack.extend((inner, (*at, str(number))) for number, inner in enumerate(item))
        elif isinstance(item, Record):
            stack.append((item.model_dump(), at))


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's core schema for plain scalars.

    PyYAML implements YAML 1.1, where `1:30` is the sexagesimal 90, `010` is octal 8 and `yes`/`on`/`no`/
    `off` are booleans: `iterations: 1:30` would silently run 90 iterations. YAML 1.2 (and every other
    modern parser) reads those as text or decimal.
    """


_BOOL, _INT, _FLOAT = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in {_BOOL, _INT, _FLOAT}]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_SpecLoader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")
)
_SpecLoader.add_implicit_resolver(
    _FLOAT,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if text.startswith(("0o", "0x")):
        return int(text, 0)
    return int(text, 10)


_SpecLoader.add_constructor(_INT, _yaml12_int)


_LATER_FIELDS: tuple[tuple[str, ...], ...] = (
    ("answer_order",),
    ("filler",),
    ("prompt", "order_instruction"),
    ("prompt", "probe_instructions"),
    ("prompt", "probe_request"),
    ("fake", "depends_on"),
    ("fake", "window"),
    ("fake", "distance_span"),
)
"""Fields (as paths in the dumped spec) added after jobs were first stored; see `JobSpec.spec_hash`."""


def _default_at(path: tuple[str, ...]) -> object:
    model: Any = JobSpec
    for part in path[:-1]:
        model = model.model_fields[part].default_factory
    default = model.model_fields[path[-1]].default
    return default.value if isinstance(default, StrEnum) else default


def _lcm(values: tuple[int, ...]) -> int:
    return math.lcm(*values)


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
