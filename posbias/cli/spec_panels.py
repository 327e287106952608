"""How the job-spec flags of `posbias submit` and `posbias run` show in `--help`: in groups (`PANELS`), each
with the default a left-out flag means (the flags themselves default to None, so that a spec file's value
stands)."""

from __future__ import annotations

from typing import Any

PANELS: dict[str, tuple[str, ...]] = {
    "What to run": (
        "spec_file",
        "model",
        "revision",
        "tokenizer",
        "dataset",
        "subjects",
        "split",
        "batch_sizes",
        "iterations",
        "limit",
        "seed",
        "priority",
    ),
    "Design": (
        "design",
        "answer_mode",
        "answer_order",
        "filler_tokens",
        "filler_where",
        "filler_after",
        "filler_source",
        "shuffle_choices",
        "chat_template",
        "variant",
        "hf_overrides",
    ),
    "Engine": ("engine", "tensor_parallel_size", "max_model_len", "dtype"),
    "Endpoint (engine openai)": (
        "base_url",
        "endpoint_model",
        "api_key_env",
        "api",
        "max_concurrency",
        "requests_per_minute",
        "tokens_per_minute",
        "request_timeout",
        "max_retries",
        "max_job_tokens",
        "option_probs",
    ),
    "Fake engine (engine fake)": (
        "fake_first",
        "fake_last",
        "fake_malformed",
        "fake_depends_on",
        "fake_window",
    ),
}
"""The `--help` groups of the job-spec flags, in order; `submit` and `run` add an `Output` group."""


DEFAULTS: dict[str, str] = {
    "batch_sizes": "1,5,10,20,50",
    "iterations": "100",
    "seed": "0",
    "priority": "0",
    "design": "random",
    "answer_mode": "free",
    "answer_order": "forward",
    "filler_where": "end",
    "filler_source": "builtin",
    "filler_tokens": "no filler",
    "shuffle_choices": "no-shuffle-choices",
    "chat_template": "auto",
    "engine": "vllm",
    "tensor_parallel_size": "1",
    "dtype": "auto",
    "api": "auto",
    "fake_first": "0.25",
    "fake_last": "0.55",
    "fake_malformed": "0.0",
    "fake_depends_on": "position",
}
"""What a flag left out means: the spec's default, shown in `--help`. Written out rather than read from the
records so that `--help` and a usage error cost no import of pydantic; `spec_defaults` reads the records,
and tests/unit/test_cli_startup.py holds the two equal."""


def spec_defaults() -> dict[str, str]:
    """`DEFAULTS` as the records (`JobSpec`, `EngineOptions`, `FakeSpec`, `FillerSpec`) say them."""
    from posbias.schemas import EngineOptions, FakeSpec, FillerSpec, JobSpec

    spec, engine, fake = JobSpec.model_fields, EngineOptions.model_fields, FakeSpec.model_fields
    filler = FillerSpec.model_fields

    def text(value: Any) -> str:
        return str(getattr(value, "value", value))

    return {
        "batch_sizes": ",".join(map(str, spec["batch_sizes"].default)),
        "iterations": text(spec["iterations"].default),
        "seed": text(spec["seed"].default),
        "priority": text(spec["priority"].default),
        "design": text(spec["design"].default),
        "answer_mode": text(spec["answer_mode"].default),
        "answer_order": text(spec["answer_order"].default),
        "filler_where": text(filler["where"].default),
        "filler_source": text(filler["source"].default),
        "filler_tokens": "no filler",
        "shuffle_choices": "no-shuffle-choices",
        "chat_template": text(spec["chat_template"].default),
        "engine": text(engine["name"].default),
        "tensor_parallel_size": text(engine["tensor_parallel_size"].default),
        "dtype": text(engine["dtype"].default),
        "api": "auto",
        "fake_first": text(fake["first"].default),
        "fake_last": text(fake["last"].default),
        "fake_malformed": text(fake["malformed"].default),
        "fake_depends_on": text(fake["depends_on"].default),
    }


def dressed(flags: dict[str, Any]) -> dict[str, Any]:
    """`flags` with their `--help` group and the default a left-out flag means."""
    panel_of = {name: panel for panel, names in PANELS.items() for name in names}
    for name, annotation in flags.items():
        info = annotation.__metadata__[0]
        info.rich_help_panel = panel_of[name]
        if name in DEFAULTS and info.show_default is True:
            info.show_default = DEFAULTS[name]
    return flags
