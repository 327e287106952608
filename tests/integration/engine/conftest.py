"""Fixtures for the vLLM engine tests: tiny models built once per machine, each engine loaded once per session
in the real vLLM CPU build (in this process), and a fresh posbias cache folder.

Engines: the tiny Llama (`llama_engine`), the tiny Gemma 2 (`gemma2_engine`) and the demo model
(`demo_engine`) are each loaded the first time a test asks for one and stay open to the end of the session.
The tiny Llama served by a real `vllm serve` (`llama_server`, a subprocess) lives for one module: kept for
the session, beside the demo model's server and the session's engines, it took the machine past its 24 GiB
in the full suite (Ray's memory monitor killed a worker).
Any test may load and close engines of its own around them, in any order: an in-process engine closed while
another is open frees its memory and leaves the distributed state the engines of a process share alone, and
the last one closed shuts that state down, to be started afresh by the next engine
(workers/vllm_engine.py). The session's engines are closed last, in the reverse of the order they were
loaded in.

Compiled kernels: torch compiles a sampler kernel with g++ the first time log-probabilities are requested
(~35 s) and vLLM inspects each new architecture in a subprocess (~10 s); both land in the cache folder. The
session's cache folder is fresh, so GGUF conversion really happens, but those two subfolders point at the
suite's own cache (support.testcache), so only the first run on a machine pays for them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import (
    GEMMA2_MAX_MODEL_LEN,
    GEMMA2_WINDOW,
    GEMMA3_WINDOW,
    KV_CACHE_GIB,
    Conversion,
)
from support.testcache import posbias_cache
from support.tinymodels import tiny_model
from support.vllmserve import VllmServer, vllm_serve

from posbias.schemas import EngineOptions, WorkerConfig
from posbias.workers.models import demo_model_path, resolve_model
from posbias.workers.vllm_engine import VllmEngine


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh posbias cache folder whose compiled-kernel subfolders persist across test runs."""
    return posbias_cache(tmp_path_factory.mktemp("posbias-cache"))


@pytest.fixture(scope="session")
def worker_config(cache_dir: Path) -> WorkerConfig:
    """What the dispatcher would hand a worker on this machine."""
    return WorkerConfig(cache_dir=str(cache_dir), cpu_kvcache_gib=KV_CACHE_GIB)


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Path:
    """A tiny random Llama (full attention everywhere)."""
    return tiny_model(architecture="llama")


@pytest.fixture(scope="session")
def tiny_gemma2_dir() -> Path:
    """A tiny random Gemma 2 (sliding window of 64 tokens on layers 0 and 2)."""
    return tiny_model(architecture="gemma2", sliding_window=GEMMA2_WINDOW)


@pytest.fixture(scope="session")
def tiny_gemma3_dir() -> Path:
    """A tiny random Gemma 3: six layers, five sliding (window of 48 tokens, RoPE base 10000), then one
    global (layer 5, RoPE base 1000000)."""
    return tiny_model(architecture="gemma3", num_layers=6, sliding_window=GEMMA3_WINDOW)


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


@pytest.fixture(scope="session")
def demo_conversion(cache_dir: Path) -> Conversion:
    """The installed demo GGUF converted into the session's cache folder (the first resolve converts it)."""
    resolved = resolve_model(str(demo_model_path()), cache_dir=cache_dir)
    weights = next(Path(resolved.model).glob("*.safetensors")).stat()
    return Conversion(resolved=resolved, weights=weights)


@pytest.fixture(scope="session")
def demo_engine(demo_conversion: Conversion, worker_config: WorkerConfig) -> Iterator[VllmEngine]:
    """The demo model (SmolLM2-135M-Instruct) in vLLM, loaded from its GGUF file after `demo_conversion`."""
    engine = VllmEngine(str(demo_model_path()), config=worker_config)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def llama_server(
    tiny_llama_dir: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The tiny Llama behind `vllm serve` (the CPU build, on 127.0.0.1), with the model's own context."""
    log = tmp_path_factory.mktemp("vllm-serve") / "llama.log"
    with vllm_serve(tiny_llama_dir, cache_dir=cache_dir, log=log, max_model_len=4096) as server:
        yield server


@pytest.fixture(params=["llama", "gemma2"])
def tiny_engine(request: pytest.FixtureRequest) -> VllmEngine:
    """Each tiny engine in turn."""
    engine: VllmEngine = request.getfixturevalue(f"{request.param}_engine")
    return engine
