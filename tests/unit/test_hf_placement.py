"""Where the `hf` engine puts a model on CUDA, checked without a GPU (torch's CUDA queries stand in): the one
GPU whole, or its layers spread by accelerate over the `tensor_parallel_size` GPUs its actor reserved, each
capped at `gpu_memory_utilization`; nothing offloaded to the CPU or disk; the dtype `auto` picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from posbias.schemas import PosbiasError
from posbias.workers import hf_build

GIB = 2**30


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)


@pytest.mark.usefixtures("two_gpus")
def test_one_gpu_takes_the_model_whole_and_more_take_its_layers_spread() -> None:
    assert hf_build._placement("cpu", gpus=1, share=0.9) == {}
    assert hf_build._placement("cuda", gpus=1, share=0.9) == {"device_map": {"": 0}}
    spread = hf_build._placement("cuda", gpus=2, share=0.5)
    assert spread == {"device_map": "auto", "max_memory": {0: 40 * GIB, 1: 40 * GIB}}
    with pytest.raises(PosbiasError, match="tensor_parallel_size is 4, but this worker sees 2 GPU"):
        hf_build._placement("cuda", gpus=4, share=0.9)


def test_cuda_without_a_gpu_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(PosbiasError, match="torch sees no GPU"):
        hf_build._placement("cuda", gpus=1, share=0.9)


def test_a_model_partly_offloaded_is_not_on_the_gpus() -> None:
    spread = SimpleNamespace(
        hf_device_map={"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1}
    )
    assert hf_build._gpus_used(spread, device="cuda") == 2
    offloaded = SimpleNamespace(hf_device_map={"model.layers.0": 0, "model.layers.1": "cpu"})
    assert hf_build._gpus_used(offloaded, device="cuda") is None
    assert hf_build._gpus_used(SimpleNamespace(), device="cpu") == 0


@pytest.mark.usefixtures("two_gpus")
def test_auto_runs_a_float32_checkpoint_in_bfloat16_on_a_gpu_and_float32_on_the_cpu() -> None:
    stored_in = {name: SimpleNamespace(dtype=name) for name in ("float32", "bfloat16", "float16")}
    assert hf_build._dtype("auto", config=stored_in["float32"], device="cuda") == "bfloat16"
    assert hf_build._dtype("auto", config=stored_in["float16"], device="cuda") == "float16"
    assert hf_build._dtype("auto", config=stored_in["bfloat16"], device="cpu") == "float32"
    assert hf_build._dtype("float32", config=stored_in["bfloat16"], device="cuda") == "float32"
    assert hf_build._dtype("bfloat16", config=stored_in["float32"], device="cpu") == "bfloat16"
