"""Building the engine a job or a shard asks for: `load_engine`, the one place that knows every engine.

It stands above the engines (`workers/vllm_engine.py`, `workers/openai_engine.py`, `workers/fake_engine.py`),
which stand on the interface in `workers/engine.py`. Each engine is imported only when it is built: importing
vLLM takes seconds that a worker running another engine need not spend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from posbias.schemas import EngineName, JobSpec, ShardResult, ShardSpec, WorkerConfig
from posbias.workers.engine import Engine


def load_engine(spec: ShardSpec | JobSpec, *, config: WorkerConfig) -> Engine:
    """The engine `spec` asks for: vLLM with the spec's model, options and variant (a job spec's first),
    transformers (`hf`, the same), an OpenAI-compatible endpoint, or the fake engine.

    A model that cannot be loaded raises `PosbiasError` whose message is the loader's error on one line
    (the dispatcher fails the job's shards with it).
    """
    if spec.engine.name is EngineName.fake:
        from posbias.workers.fake_engine import FakeEngine

        # A shard's `fake` carries its variant's changes already; a job spec's first variant is what runs.
        fake = spec.fake if isinstance(spec, ShardSpec) else spec.fake_for(spec.runs[0])
        seed = fake.seed if fake.seed is not None else spec.seed
        return FakeEngine(fake, seed=seed, model=spec.model)
    if spec.engine.name is EngineName.openai:
        from posbias.workers.openai_engine import OpenAIEngine

        return OpenAIEngine(spec, config=config)
    variant = spec.variant if isinstance(spec, ShardSpec) else spec.runs[0]
    if spec.engine.name is EngineName.hf:
        from posbias.workers.hf_engine import HfEngine

        return HfEngine(
            spec.model,
            revision=spec.revision,
            tokenizer=spec.tokenizer,
            options=spec.engine,
            variant=variant,
            config=config,
        )
    from posbias.workers.vllm_engine import VllmEngine

    return VllmEngine(
        spec.model,
        revision=spec.revision,
        tokenizer=spec.tokenizer,
        options=spec.engine,
        variant=variant,
        config=config,
    )


class ShardRunners:
    """How shards run on one engine: `workers/shard.py`'s functions, or the engine's own (the `hf` engine
    adds its attention figures to each result)."""

    def __init__(self, engine: Engine) -> None:
        from posbias.workers import shard

        own_one = getattr(engine, "run_shard", None)
        own_many = getattr(engine, "run_shards", None)
        self.one: Callable[[ShardSpec], ShardResult] = own_one or (
            lambda s: shard.run_shard(s, engine=engine)
        )
        self.many: Callable[[Sequence[ShardSpec]], list[ShardResult]] = own_many or (
            lambda s: shard.run_shards(s, engine=engine)
        )
