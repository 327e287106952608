"""What a user submits: the job spec and its parts.

A `JobSpec` is stored verbatim (as JSON) with its job, so every result can be traced back to exactly how it
was produced. Everything here validates on construction; nothing does I/O.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

import numpy as np
import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from posbias.schemas.errors import PosbiasError, one_line
from posbias.schemas.record import Record

MAX_BATCH_SIZE = 200
ROTATION_WARN_BATCH_SIZE = 20

ExtraValue = str | int | float | bool | None


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

    temperature: float = Field(0.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    max_tokens: int | None = Field(
        None, ge=1, description="Output token limit; derived from the batch size when not set."
    )
    seed: int | None = Field(None, description="Sampling seed for non-greedy decoding.")

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
    extra: dict[str, ExtraValue] = Field(
        default_factory=dict,
        description="Further keyword arguments for `vllm.LLM` (e.g. `enable_prefix_caching: true`).",
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
        """Prompts this spec renders at one batch size."""
        rotations = batch_size if self.design is Design.rotation else 1
        return self.iterations * rotations * len(self.filler_lengths)

    @property
    def total_trials(self) -> int:
        """Prompts this spec renders in all."""
        return sum(self.trials_per_batch_size(n) for n in self.batch_sizes)

    def spec_hash(self) -> str:
        """A short stable digest of the spec: the same spec gives the same hash on any machine. Fields added
        after jobs were stored are left out while at their defaults, so a stored job's spec keeps its hash
        (its idempotency key still names it)."""
        data = self.model_dump(mode="json")
        for path in _LATER_FIELDS:
            *parents, key = path
            where = data
            for part in parents:
                where = where[part]
            if where.get(key) == _default_at(path):
                del where[key]
        canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def model_key(self) -> str:
        """Identity of the loaded engine: shards with the same key can share one actor."""
        engine = self.engine.model_dump(mode="json")
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
