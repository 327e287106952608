"""The `hf` engine: transformers with eager attention, teacher-forced, recording attention
(`workers/hf_engine.py`).

Its actor holds the dispatcher's engine device as a vLLM engine's does: on a GPU cluster it reserves
`tensor_parallel_size` GPUs, so that Ray shows it a GPU and transformers runs there, not on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posbias.workers.engines.declaration import DeviceUse, EngineDeclaration, always

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine


def load(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """transformers with the spec's model, options and variant (a job spec's first)."""
    from posbias.schemas import ShardSpec
    from posbias.workers.hf_engine import HfEngine

    return HfEngine(
        spec.model,
        revision=spec.revision,
        tokenizer=spec.tokenizer,
        options=spec.engine,
        variant=spec.variant if isinstance(spec, ShardSpec) else spec.runs[0],
        config=config,
    )


DECLARATION = EngineDeclaration(
    name="hf",
    load=load,
    device=always(DeviceUse.device),
    local_model=True,
    records_attention=True,
    answer_sheets=True,
)
