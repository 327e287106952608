"""The `fake` engine: answers whose accuracy follows the spec's `fake` block (`workers/fake_engine.py`), with
a tokenizer of its own.

Its actor holds nothing, unless the spec declares it a GPU model (`fake.as_gpu`): then it reserves
`tensor_parallel_size` GPUs, as a vLLM engine does, to test GPU placement.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posbias.workers.engines.declaration import DeviceUse, EngineDeclaration

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine, Tokenizer


def load(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """The fake engine of the spec's `fake` block (a job spec's first variant's)."""
    from posbias.schemas import ShardSpec
    from posbias.workers.fake_engine import FakeEngine

    # A shard's `fake` carries its variant's changes already.
    fake = spec.fake if isinstance(spec, ShardSpec) else spec.fake_for(spec.runs[0])
    seed = fake.seed if fake.seed is not None else spec.seed
    return FakeEngine(fake, seed=seed, model=spec.model)


def device(spec: ShardSpec) -> DeviceUse:
    """GPUs when the spec declares it a GPU model, else nothing."""
    return DeviceUse.gpus if spec.fake.as_gpu else DeviceUse.none


def tokenizer(spec: JobSpec) -> Tokenizer:
    """The fake engine's own tokenizer."""
    from posbias.workers.fake_engine import FakeTokenizer

    return FakeTokenizer()


def sliding_window(spec: JobSpec) -> int | None:
    """The window the `fake` block sets."""
    return spec.fake.window


DECLARATION = EngineDeclaration(
    name="fake",
    load=load,
    device=device,
    tokenizer=tokenizer,
    sliding_window=sliding_window,
    reads_fake=True,
)
