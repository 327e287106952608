"""Fixtures for the vLLM engine tests: tiny models built once per session, each loaded once in the real
vLLM CPU build (in this process), and a fresh posbias cache folder.

torch compiles a sampler kernel with g++ the first time log-probabilities are requested (~35 s) and vLLM
inspects each new architecture in a subprocess (~10 s); both land in the cache folder. The session's cache
folder is fresh, so GGUF conversion really happens, but those two subfolders point at pytest's own cache,
so only the first run on a machine pays for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import GEMMA2_MAX_MODEL_LEN, GEMMA2_WINDOW, GEMMA3_WINDOW, KV_CACHE_GIB
from support.tinymodels import build_tiny_model

from posbias.schemas import EngineOptions, WorkerConfig
from posbias.workers.vllm_engine import VllmEngine


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """A fresh posbias cache folder whose compiled-kernel subfolders persist across test runs."""
    folder = tmp_path_factory.mktemp("posbias-cache")
    cache = getattr(pytestconfig, "cache", None)
    if cache is not None:
        for sub in ("inductor", "vllm"):
            (folder / sub).symlink_to(cache.mkdir(f"posbias-engine-{sub}"), target_is_directory=True)
    return folder


@pytest.fixture(scope="session")
def worker_config(cache_dir: Path) -> WorkerConfig:
    """What the dispatcher would hand a worker on this machine."""
    return WorkerConfig(cache_dir=str(cache_dir), cpu_kvcache_gib=KV_CACHE_GIB)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (full attention everywhere)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", architecture="llama")


@pytest.fixture(scope="session")
def tiny_gemma2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 2 (sliding window of 64 tokens on layers 0 and 2)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "gemma2", architecture="gemma2", sliding_window=GEMMA2_WINDOW
    )


@pytest.fixture(scope="session")
def tiny_gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 3: six layers, five sliding (window of 48 tokens, RoPE base 10000), then one
    global (layer 5, RoPE base 1000000)."""
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "gemma3",
        architecture="gemma3",
        num_layers=6,
        sliding_window=GEMMA3_WINDOW,
    )


@pytest.fixture(scope="session")
def llama_engine(tiny_llama_dir: Path, worker_config: WorkerConfig) -> Iterator[VllmEngine]:
    """The tiny Llama in vLLM, with the model's own context length."""
    engine = VllmEngine(str(tiny_llama_dir), config=worker_config)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def gemma2_engine(tiny_gemma2_dir: Path, worker_config: WorkerConfig) -> Iterator[VllmEngine]:
    """The tiny Gemma 2 in vLLM, with a context shorter than the model's (an engine option)."""
    engine = VllmEngine(
        str(tiny_gemma2_dir),
        options=EngineOptions(max_model_len=GEMMA2_MAX_MODEL_LEN),
        config=worker_config,
    )
    yield engine
    engine.close()


@pytest.fixture(params=["llama", "gemma2"])
def tiny_engine(request: pytest.FixtureRequest) -> VllmEngine:
    """Each tiny engine in turn."""
    engine: VllmEngine = request.getfixturevalue(f"{request.param}_engine")
    return engine
