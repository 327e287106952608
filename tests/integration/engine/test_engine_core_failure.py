"""An engine core that fails to start in its own process (as on every GPU: vLLM's multiprocessing client)
names its root cause in the load's error, which is the job's error, with where its full log is.

The CPU build runs the engine core in-process (`workers/vllm_start.py`); here it is made a subprocess, as
vLLM runs it on GPUs, by turning `VLLM_ENABLE_V1_MULTIPROCESSING` back on after posbias sets the
environment. The model is the tiny Llama with a head size that its attention cannot have."""

from __future__ import annotations

import gc
import json
import shutil
import warnings
from pathlib import Path

import pytest

from posbias.schemas import EngineOptions, PosbiasError, WorkerConfig
from posbias.workers import vllm_start
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


@pytest.mark.timeout(600)
def test_a_subprocess_engine_core_failing_to_start_names_its_root_cause(
    tiny_llama_dir: Path, worker_config: WorkerConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "llama-head-size-36"
    shutil.copytree(tiny_llama_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    # 36 x 2 heads = 72 != hidden size 64: the weights cannot be what the config says.
    config["head_dim"] = 36
    (broken / "config.json").write_text(json.dumps(config))

    set_environment = vllm_start._set_vllm_environment

    def as_on_gpus(config: WorkerConfig, *, on_cpu: bool) -> None:
        set_environment(config, on_cpu=on_cpu)
        monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")

    monkeypatch.setattr(vllm_start, "_set_vllm_environment", as_on_gpus)
    with pytest.raises(PosbiasError) as refused:
        VllmEngine(str(broken), options=EngineOptions(max_model_len=256), config=worker_config)
    error = str(refused.value)
    # vLLM's client leaves the failed start's zmq context to the collector, which warns when it closes it;
    # collected here (the traceback that holds it dropped first), that warning would otherwise fail
    # whichever test happens to collect it next.
    del refused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert "\n" not in error
    assert error.startswith(f"cannot load model {broken}: ")
    cause = error.removeprefix(f"cannot load model {broken}: ")
    # The root cause the worker process logged (72 = 2 heads x 36 rows of a weight that has 64), not vLLM's
    # "See root cause above." alone.
    assert cause.startswith("RuntimeError: start (0) + length (72) exceeds dimension size (64)."), error
    assert "Engine core initialization failed; the full log is the Ray worker log of process" in error
