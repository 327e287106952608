"""The Ray actor that holds one engine for one model and runs shards on it.

The actor is a function of its shards: it never touches the database and holds no credentials. It reserves
`num_gpus = tensor_parallel_size`; for TP > 1 vLLM's own multiprocessing executor spans those GPUs inside
the actor (never Ray placement groups nested in a Ray actor).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from posbias.schemas import (
    CloseReport,
    LoadReport,
    ShardFailure,
    ShardResult,
    ShardSpec,
    WorkerConfig,
    one_line,
)
from posbias.workers.engine import CostGuardError, Engine
from posbias.workers.engines import EngineDeclaration


class ShardActor:
    """Holds one engine; `run` answers one shard, `run_many` several in one engine call.

    Wrapped with `ray.remote` by `service/dispatch/pools.py`, which sets its resources. The engine is loaded
    by `load()` (so a loader error comes back as that call's error, not as a dead actor) and again lazily
    after Ray restarts a crashed actor process.
    """

    def __init__(
        self, template: ShardSpec, *, config: WorkerConfig, engine: EngineDeclaration | None = None
    ) -> None:
        """`engine`: the declaration that builds the template's engine (default: the one registered under
        its name in this process; the dispatcher hands its own, so an engine registered there runs here)."""
        self._template = template
        self._config = config
        self._declaration = engine
        self._engine: Engine | None = None
        self.loads = 0

    def load(self) -> LoadReport:
        """Load the model (once); returns its metadata and how long loading took."""
        from posbias.workers.loader import load_engine

        started = time.perf_counter()
        if self._engine is None:
            self._engine = load_engine(self._template, config=self._config, declaration=self._declaration)
            self.loads += 1
        return LoadReport(
            engine=self._engine.info,
            model=self._engine.model_info,
            seconds=time.perf_counter() - started,
            pid=os.getpid(),
        )

    def run(self, shard: ShardSpec) -> ShardResult:
        """Run every trial of `shard` in one engine call and return the parsed results."""
        from posbias.workers.loader import ShardRunners

        if self._engine is None:
            self.load()
        assert self._engine is not None
        return ShardRunners(self._engine).one(shard)

    def run_many(self, shards: Sequence[ShardSpec]) -> list[ShardResult | ShardFailure]:
        """Run `shards` (of this actor's model) in one engine call; one outcome per shard, in order.

        When the shared call raises, each shard is run again on its own, so that one bad shard fails alone;
        a single shard's error is raised as `run`'s is. A shard stopped by its job's cost guard comes back as
        a failure that stops the job.
        """
        from posbias.workers.loader import ShardRunners

        if self._engine is None:
            self.load()
        assert self._engine is not None
        runners = ShardRunners(self._engine)
        run_shard, run_shards = runners.one, runners.many
        if len(shards) == 1:
            try:
                return [run_shard(shards[0])]
            except CostGuardError as exc:
                return [ShardFailure(shard_id=shards[0].shard_id, error=one_line(exc), stop_job=True)]
        try:
            return list(run_shards(shards))
        except Exception:
            outcomes: list[ShardResult | ShardFailure] = []
            for shard in shards:
                try:
                    outcomes.append(run_shard(shard))
                except CostGuardError as exc:
                    outcomes.append(ShardFailure(shard_id=shard.shard_id, error=one_line(exc), stop_job=True))
                except Exception as exc:
                    error = one_line(exc, typed=True)
                    outcomes.append(ShardFailure(shard_id=shard.shard_id, error=error))
            return outcomes

    def close(self) -> CloseReport:
        """Close the engine, so its processes end and free their GPU memory before the actor is ended
        (`service/dispatch/pools.py` calls this, then `ray.kill`). A later call would load the model again."""
        started = time.perf_counter()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()
        return CloseReport(pid=os.getpid(), closed=engine is not None, seconds=time.perf_counter() - started)

    def pid(self) -> int:
        """The actor's process id: the first call an actor answers once it is placed (the pools wait on
        it), and what tests kill to simulate a crashed worker."""
        return os.getpid()
