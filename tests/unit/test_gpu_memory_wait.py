"""The GPU-memory wait before a vLLM engine starts (`workers/vllm_start.start_llm`), decided on readings the
test gives: wait while a GPU is short, back off, try again after vLLM's refusal for memory, give up past the
bound with a `RetryableError`, and never wait for a model that is simply broken. No GPU and no vLLM: the
platform, `vllm.LLM`, the NVML reading and the clock are stand-ins, so the waits are counted, not timed."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from posbias.schemas import EngineOptions, PosbiasError, RetryableError, WorkerConfig
from posbias.workers import vllm_start
from posbias.workers.models import ResolvedModel

MODEL = ResolvedModel(
    source="org/model", model="org/model", tokenizer=None, revision=None, converted=False, local_dir=None
)
SHORT = "GPU 0: 1.0 of 80.0 GiB free"
REFUSAL = ValueError(
    "Free memory on device (1.0/80.0 GiB) on startup is less than desired GPU memory utilization"
)


@dataclass
class Clock:
    """`time` as `start_llm` uses it: `sleep` moves `now` on and is recorded."""

    now: float = 0.0
    sleeps: list[float] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@dataclass
class Machine:
    """What the engine start sees: a reading per look at the GPUs, and vLLM's outcome per start."""

    readings: list[list[str]]
    outcomes: list[BaseException | None]
    clock: Clock = field(default_factory=Clock)
    looks: list[float] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[Machine]:
    found = Machine(readings=[], outcomes=[])

    def short_gpus(count: int, *, need: float) -> list[str]:
        found.looks.append(found.clock.now)
        return found.readings.pop(0) if len(found.readings) > 1 else found.readings[0]

    class LLM:
        def __init__(self, model: str, **kwargs: object) -> None:
            found.starts.append(found.clock.now)
            outcome = found.outcomes.pop(0)
            if outcome is not None:
                raise outcome

    platform = types.SimpleNamespace(
        is_cpu=lambda: False, is_cuda=lambda: True, is_cuda_alike=lambda: True, device_type="cuda"
    )
    vllm = types.ModuleType("vllm")
    vllm.LLM = LLM  # type: ignore[attr-defined]
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform  # type: ignore[attr-defined]
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_ENABLE_V1_MULTIPROCESSING = False  # type: ignore[attr-defined]
    vllm.envs = envs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    monkeypatch.setattr(vllm_start, "_short_gpus", short_gpus)
    monkeypatch.setattr(vllm_start, "_set_vllm_environment", lambda config, *, on_cpu: None)
    monkeypatch.setattr(vllm_start, "time", found.clock)
    yield found


def start(*, wait: float) -> str:
    _, device = vllm_start.start_llm(
        MODEL,
        options=EngineOptions(),
        config=WorkerConfig(cache_dir="/nowhere", gpu_memory_wait_seconds=wait),
        hf_overrides={},
    )
    return device


def test_a_short_gpu_is_waited_for_with_backoff_and_vllm_starts_once_it_has_the_memory(
    machine: Machine,
) -> None:
    machine.readings = [[SHORT], [SHORT], [SHORT], []]
    machine.outcomes = [None]
    assert start(wait=120) == "cuda"
    assert machine.clock.sleeps == [2.0, 4.0, 8.0]
    assert machine.starts == [14.0]  # vLLM is asked once, when the memory is there


def test_memory_that_stays_short_ends_in_a_retryable_error_at_the_bound(machine: Machine) -> None:
    machine.readings = [[SHORT]]
    machine.outcomes = [REFUSAL]
    with pytest.raises(RetryableError) as raised:
        start(wait=10)
    assert machine.clock.sleeps == [2.0, 4.0, 4.0]  # the last wait is cut to the bound
    assert machine.starts == [10.0]  # one try at the bound, refused
    assert str(raised.value) == (
        f"the GPUs did not have the memory vLLM asks for within 10 s ({SHORT}); "
        "another engine may still hold it"
    )


def test_a_refusal_for_memory_is_tried_again_after_a_pause(machine: Machine) -> None:
    # NVML saw enough memory, but vLLM measured less (another engine was still freeing it).
    machine.readings = [[]]
    machine.outcomes = [RuntimeError("Engine core initialization failed"), None]
    machine.outcomes[0].__cause__ = REFUSAL
    assert start(wait=120) == "cuda"
    assert machine.starts == [0.0, 2.0]
    assert machine.clock.sleeps == [2.0]


def test_a_broken_model_with_the_memory_there_fails_at_once_without_waiting(machine: Machine) -> None:
    machine.readings = [[]]
    machine.outcomes = [OSError("config.json not found")]
    with pytest.raises(
        PosbiasError, match=r"^cannot load model org/model: .*config.json not found"
    ) as raised:
        start(wait=120)
    assert not isinstance(raised.value, RetryableError)
    assert machine.starts == [0.0] and machine.clock.sleeps == []


def test_no_wait_at_all_tries_vllm_once_and_gives_up_on_its_refusal(machine: Machine) -> None:
    machine.readings = [[SHORT]]
    machine.outcomes = [REFUSAL]
    with pytest.raises(RetryableError, match="within 0 s"):
        start(wait=0)
    assert machine.starts == [0.0] and machine.clock.sleeps == []
