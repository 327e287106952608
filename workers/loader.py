"""Building the engine a job or a shard asks for: `load_engine` asks the engine's declaration
(`workers/engines/`) to build it.

Each engine is imported only when it is built: importing vLLM takes seconds that a worker running another
engine need not spend.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from posbias.schemas import JobSpec, ShardResult, ShardSpec, WorkerConfig
from posbias.workers.engine import Engine
from posbias.workers.engines import EngineDeclaration, declared


def load_engine(
    spec: ShardSpec | JobSpec, *, config: WorkerConfig, declaration: EngineDeclaration | None = None
) -> Engine:
    """The engine `spec` asks for, with the spec's model, options and variant (a job spec's first), built by
    `declaration` (default: the one registered under the spec's `engine.name`).

    A model that cannot be loaded raises `PosbiasError` whose message is the loader's error on one line
    (the dispatcher fails the job's shards with it).
    """
    declaration = declaration or declared(spec.engine.name)
    return declaration.load(spec, config)


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
