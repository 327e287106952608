"""The `hf` engine: transformers, teacher-forced, recording the attention of the answer rows
(`workers/hf_engine.py`).

Its actor holds the dispatcher's engine device as a vLLM engine's does: on a GPU cluster it reserves
`tensor_parallel_size` GPUs, so that Ray shows it those GPUs and transformers runs there, not on the CPU.
For hf that number means "spread over that many GPUs": one GPU holds the whole model, more hold its layers
split by accelerate's `device_map="auto"` (`workers/hf_build.py`), for a model larger than one GPU.
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
