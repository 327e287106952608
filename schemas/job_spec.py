"""What a user submits: the job spec, one evaluation of a model over a dataset at several batch sizes.

A `JobSpec` is stored verbatim (as JSON) with its job, so every result can be traced back to exactly how it
was produced. Its parts live in modules of their own (`dataset.py`, `prompt.py`, `sampling.py`,
`filler_spec.py`, `engine_spec.py`, `fake_spec.py`, the choices in `modes.py`, the limits in `bounds.py`);
reading a spec file is `spec_file.py`. Everything here validates on construction; nothing does I/O but
`JobSpec.from_file`.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from enum import StrEnum
from pathlib import Path
from typing import Any, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from posbias.schemas.bounds import (
    FINITE,
    INT32_MAX,
    INT64_MAX,
    MAX_BATCH_SIZE,
    Int,
    check_texts,
    integer_list,
)
from posbias.schemas.dataset import DatasetSpec
from posbias.schemas.engine_spec import EngineName, EngineOptions
from posbias.schemas.errors import PosbiasError
from posbias.schemas.errors import RotationCostWarning as RotationCostWarning
from posbias.schemas.fake_spec import FakeSpec
from posbias.schemas.filler_spec import FillerPlace, FillerSpec
from posbias.schemas.modes import AnswerMode, AnswerOrder, ChatTemplateUse, Design
from posbias.schemas.prompt import PromptTemplate
from posbias.schemas.record import Record
from posbias.schemas.sampling import SamplingSpec
from posbias.schemas.spec_file import describe_validation_error, merge_overrides, read_spec_file
from posbias.schemas.variant import BASELINE, MAX_VARIANTS, InterventionKind, Variant

ROTATION_WARN_BATCH_SIZE = 20
"""Batch sizes above this make the rotation design warn of its cost (`RotationCostWarning`)."""


class JobSpec(Record):
    """One evaluation: a model, a dataset, and the batch sizes to measure it at."""

    model_config = FINITE

    model: str = Field(
        min_length=1,
        max_length=500,
        description="Hugging Face id, local model folder, or a .gguf file (then give `tokenizer`); for "
        "engine `openai`, the model's name (curves group by it; the endpoint may name it `engine.model`). "
        "In a spec file, a folder or file starting with `./` or `../` is read from the spec file's folder.",
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
        "`probe`: each prompt shows N questions and asks for the answer to one; each sampled set is "
        "shown N times, asking for each position once (N prompts that differ only in their last line).",
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
    limit: Int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="A quick look: only the first `limit` trials of each batch size of the planned job "
        "(per variant). Stored as a job of its own, marked as a quick look: a model's curves leave it out "
        "unless asked (`posbias curve --job` shows it).",
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
        check_texts(data)
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
        return integer_list(value, what="batch sizes", example="1,5,10")

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
        _check_variants_fit_engine(self)
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
        fake = self.fake
        if variant.fake:
            changes = dict(variant.fake)
            mechanism = changes.pop("mechanism", None)
            merged = {**fake.model_dump(), **changes}
            if isinstance(mechanism, dict) and fake.mechanism is not None:
                merged["mechanism"] = {**fake.mechanism.model_dump(), **mechanism}
            elif mechanism is not None:
                merged["mechanism"] = mechanism
            fake = FakeSpec.model_validate(merged)
        return _fake_intervention(fake, variant)

    @model_validator(mode="after")
    def _check_design(self) -> Self:
        _check_design_fits_batch_sizes(self)
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
        # A rotation shows each set N times, rotated; a probe asks each position in a prompt of its own.
        rotations = batch_size if self.design in (Design.rotation, Design.probe) else 1
        planned = self.iterations * rotations * len(self.filler_lengths)
        return planned if self.limit is None else min(planned, self.limit)

    @property
    def quick_look(self) -> bool:
        """True for a quick look (`limit`): a few trials of a bigger job, kept out of a model's curves."""
        return self.limit is not None

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
        _drop_later_defaults(data)
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
            _drop_later_defaults(fake, within=("fake",))
            ident.append(fake)
        if variant.hf_overrides or variant.expect is not None:
            expect = None if variant.expect is None else variant.expect.model_dump(mode="json")
            ident.append({"hf_overrides": variant.hf_overrides, "expect": expect})
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> JobSpec:
        """Load a spec from YAML or JSON; `overrides` (e.g. CLI flags) replace the file's values."""
        data = read_spec_file(path)
        return cls.build(merge_overrides(data, overrides), source=str(path))

    @classmethod
    def build(cls, data: dict[str, Any], *, source: str = "spec") -> JobSpec:
        """Validate `data`, turning pydantic's report into one line that names the field to fix. A new spec
        is also refused what its engine would silently ignore (stored specs, read with `model_validate`,
        keep loading as they were stored)."""
        try:
            spec = cls.model_validate(data)
        except ValidationError as exc:
            raise PosbiasError(f"invalid {source}: {describe_validation_error(exc)}") from None
        return spec.checked_as_new(source=source)

    def checked_as_new(self, *, source: str = "spec") -> JobSpec:
        """This spec, unless it sets what its engine would silently ignore: refused for a spec about to be
        submitted (`build`, and the API for a `JobSpec` given as it is), never for one read back."""
        if self.engine.extra and self.engine.name in (EngineName.fake, EngineName.hf):
            raise PosbiasError(
                f"invalid {source}: engine.extra: keyword arguments for vllm.LLM, which engine "
                f"{self.engine.name} does not read; remove them, or set engine.name: vllm"
            )
        return self


_LATER_FIELDS: tuple[tuple[str, ...], ...] = (
    ("limit",),
    ("answer_order",),
    ("filler",),
    ("prompt", "order_instruction"),
    ("prompt", "probe_instructions"),
    ("prompt", "probe_request"),
    ("fake", "depends_on"),
    ("fake", "window"),
    ("fake", "distance_span"),
    ("fake", "collapse"),
    ("fake", "mechanism"),
)
"""Fields (as paths in the dumped spec) added after jobs were first stored; see `JobSpec.spec_hash`."""


def _check_variants_fit_engine(spec: JobSpec) -> None:
    """Refuse variants the spec's engine cannot run, or that share a name."""
    names = [variant.name for variant in spec.variants]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"variant names must differ: {', '.join(repeated)} given twice")
    fake = spec.engine.name is EngineName.fake
    served = spec.engine.name is EngineName.openai
    for variant in spec.variants:
        kind = variant.intervention.kind if variant.intervention is not None else None
        if served and (variant.hf_overrides or kind not in (None, InterventionKind.baseline)):
            raise ValueError(
                f"variant {variant.name}: a served model's architecture is its server's; serve each "
                "variant as its own endpoint (vllm serve --hf-overrides ...) and submit a job to each"
            )
        if fake and (
            variant.hf_overrides or kind not in (None, InterventionKind.baseline, *_fake_acts(spec))
        ):
            raise ValueError(
                f"variant {variant.name}: the fake engine has no architecture to change; give fake "
                "variants as {name: NAME, fake: {last: 0.4}}"
            )
        if variant.fake:
            if not fake:
                raise ValueError(f"variant {variant.name}: `fake` settings are for engine `fake` only")
            try:
                spec.fake_for(variant)
            except ValidationError as exc:
                raise ValueError(f"variant {variant.name}: fake.{describe_validation_error(exc)}") from None
    if fake and spec.engine.hf_overrides:
        raise ValueError("engine.hf_overrides: the fake engine has no config to change")


def _fake_acts(spec: JobSpec) -> tuple[InterventionKind, ...]:
    """The named interventions a fake with a mechanism answers to (`FakeMechanism`)."""
    if spec.fake.mechanism is None:
        return ()
    return (InterventionKind.global_only, InterventionKind.rope_base)


def _fake_intervention(fake: FakeSpec, variant: Variant) -> FakeSpec:
    """`fake` under a named intervention its mechanism answers to: every layer global, or the RoPE base
    multiplied (a base given as a value multiplies the fake's own)."""
    intervention = variant.intervention
    if fake.mechanism is None or intervention is None:
        return fake
    mechanism = fake.mechanism
    if intervention.kind is InterventionKind.global_only:
        mechanism = mechanism.model_copy(update={"global_only": True})
    elif intervention.kind is InterventionKind.rope_base:
        factor = intervention.factor or (intervention.value or mechanism.rope_theta) / mechanism.rope_theta
        mechanism = mechanism.model_copy(update={"rope_factor": mechanism.rope_factor * factor})
    else:
        return fake
    return fake.model_copy(update={"mechanism": mechanism})


def _check_design_fits_batch_sizes(spec: JobSpec) -> None:
    """Refuse a probe design or a filler position that some batch size cannot honour."""
    if spec.design is Design.probe and spec.answer_order is not AnswerOrder.forward:
        raise ValueError("the probe design asks for one answer: leave answer_order forward")
    if spec.filler is not None and spec.filler.position is not None:
        short = [n for n in spec.batch_sizes if n <= spec.filler.position]
        if short:
            raise ValueError(
                f"filler after question {spec.filler.position}: batch sizes {short} have no question "
                "after it; lower filler.position or drop those batch sizes"
            )


def _drop_later_defaults(data: dict[str, Any], *, within: tuple[str, ...] = ()) -> None:
    """Delete from `data`, the dumped spec (or its part at `within`), each later field at its default."""
    for path in _LATER_FIELDS:
        if path[: len(within)] != within:
            continue
        *parents, key = path[len(within) :]
        where = data
        for part in parents:
            where = where[part]
        if where.get(key) == _default_at(path):
            del where[key]


def _default_at(path: tuple[str, ...]) -> object:
    model: Any = JobSpec
    for part in path[:-1]:
        model = model.model_fields[part].default_factory
    default = model.model_fields[path[-1]].default
    return default.value if isinstance(default, StrEnum) else default
