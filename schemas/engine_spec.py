"""How a job's engine is started: which engine, its vLLM arguments, and the `openai` engine's endpoint.

The endpoint fields are checked here, at the edge: a base URL carries no credentials, and a key is named by
the environment variable that holds it, never given.
"""

from __future__ import annotations

import re
from typing import Any, Self

from pydantic import Field, JsonValue, field_validator, model_validator

from posbias.schemas.attention import AnswerSheet, SheetFromJob
from posbias.schemas.bounds import FINITE, INT32_MAX, INT64_MAX, Int
from posbias.schemas.choices import EngineName as EngineName
from posbias.schemas.endpoint import EndpointApi
from posbias.schemas.record import Record
from posbias.schemas.variant import check_overrides

DTYPES = ("auto", "float32", "float", "float16", "half", "bfloat16")
"""The dtypes vLLM takes."""
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


class EngineOptions(Record):
    """How the engine is started. Only `name` matters to the fake engine; the `openai` engine takes the
    endpoint fields below (each None unless it is the `openai` engine) and `max_model_len`."""

    model_config = FINITE

    name: EngineName | str = Field(
        EngineName.vllm,
        union_mode="left_to_right",
        description="`vllm` (GPU or CPU build), `openai` (an OpenAI-compatible endpoint), `hf` "
        "(transformers, teacher-forced, records attention), `fake` (tests), or the name of "
        "a plug-in engine (checked at submit against the engines the workers know).",
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
    trust_remote_code: bool = Field(
        False,
        description="Run the model's own Python (the modules its config's `auto_map` names) when the workers "
        "load it; never at submit. Only for a model whose code you trust.",
    )

    # --- engine `hf` ------------------------------------------------------------------------------------
    answer_sheet: AnswerSheet | SheetFromJob | None = Field(
        None,
        description="hf: what is teacher-forced as the answers: `gold` (the default), `fixed` (option 1 "
        "everywhere) or `{job: N}` (what done job N, of the same trials, answered).",
    )
    position_gap: Int | None = Field(
        None,
        ge=0,
        le=INT32_MAX,
        description="hf: add this many positions to the position ids of every token after the last "
        "question (before the answer request): RoPE distance grows, tokens and the window do not. Refused "
        "when the installed transformers moves the sliding mask with the position ids.",
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
        None, description="openai: `chat`, `completions`, or `auto` (the default; see docs/served-models.md)."
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

    @field_validator("name", mode="before")
    @classmethod
    def _check_name(cls, value: object) -> object:
        # A built-in name is always the enum member; any other is a plug-in's, whose registration the
        # service checks at submit (schemas cannot see the workers' registry).
        if isinstance(value, str) and value in {name.value for name in EngineName}:
            return EngineName(value)
        if not isinstance(value, str) or not _PLUGIN_NAME.fullmatch(value):
            raise ValueError(
                f"must be one of {', '.join(EngineName)} or a plug-in engine's name (lowercase letters, "
                "digits, - and _)"
            )
        return value

    @field_validator("answer_sheet")
    @classmethod
    def _check_answer_sheet(
        cls, value: AnswerSheet | SheetFromJob | None
    ) -> AnswerSheet | SheetFromJob | None:
        if value is AnswerSheet.job:
            raise ValueError("answer_sheet job needs the job's id: write answer_sheet: {job: N}")
        return value

    @field_validator("hf_overrides")
    @classmethod
    def _check_hf_overrides(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_overrides(value)
        return value

    @field_validator("extra")
    @classmethod
    def _check_extra(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        check_overrides(value, where="extra")
        if "trust_remote_code" in value:
            raise ValueError(
                "trust_remote_code cannot go in engine.extra: it runs the model's own code on the workers, "
                "so it is a field of its own (engine.trust_remote_code: true)"
            )
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
        hf_given = [name for name in HF_FIELDS if getattr(self, name) is not None]
        if hf_given and self.name is not EngineName.hf:
            raise ValueError(f"{hf_given[0]} is an option of engine hf (set engine.name: hf)")
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
        """The options as stored and hashed: the `openai` fields, `hf_overrides` and `trust_remote_code`
        only when set, so a spec written before they existed keeps its hash (and its idempotency keys) and
        its model key."""
        data = self.model_dump(mode="json")
        for name in (*OPENAI_FIELDS, *HF_FIELDS):
            if data[name] is None:
                del data[name]
        if not data["hf_overrides"]:
            del data["hf_overrides"]  # so jobs stored before the field existed keep their hash and key
        if not data["trust_remote_code"]:
            del data["trust_remote_code"]
        return data


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLUGIN_NAME = re.compile(r"[a-z][a-z0-9_-]{0,39}")
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
HF_FIELDS = ("answer_sheet", "position_gap")
"""The `EngineOptions` fields of the `hf` engine (stored and hashed only when set)."""


def _check_base_url(url: str) -> None:
    from urllib.parse import urlsplit

    if any(char.isspace() or not char.isprintable() for char in url):
        # A CR/LF would end the request line (header injection); httpx refuses it only when it is sent.
        raise ValueError(
            "base_url must not hold spaces or control characters (CR, LF, tab); give the URL alone, e.g. "
            "http://127.0.0.1:8000/v1"
        )
    example = "e.g. http://127.0.0.1:8000/v1"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number, or not in 0..65535
        raise ValueError(f"base_url has a port that is not a number from 1 to 65535, {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url must be an http(s) URL, {example}")
    if port == 0:
        raise ValueError(f"base_url has a port that is not a number from 1 to 65535, {example}")
    # Neither is ever needed, and either could carry a key into the stored spec.
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ValueError(
            "base_url must not carry credentials or a query; put the key in an environment variable and name "
            "it in api_key_env"
        )
