"""Pools of `ShardActor`s, one pool per loaded model, sized to what the Ray cluster has free.

Shards go to an actor in calls of up to `shards_per_call`, each answered in one engine call: vLLM batches
only within a call, so one shard per call (about 500 questions) leaves a GPU's batch half empty and pays the
decode tail of every call (benchmarks/throughput.py). Each actor holds `depth` calls, so the next one is
queued while the last one's results travel back and are written.

Models stay loaded while they have queued work; a model with no queued or running work is released when
another model needs its GPUs (or CPUs, for the CPU build). Actor restarts are bounded, and a shard whose actor
dies is reported to the caller, which fails it back to the queue: it is never retried inside Ray.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from posbias.schemas import EngineName, LoadReport, ShardSpec, WorkerConfig, one_line
from posbias.workers.actor import ShardActor

MAX_ACTOR_RESTARTS = 3
SHARDS_PER_CALL = 8
"""Shards per engine call at most: about 4,000 questions at the planner's shard size (400 prompts at N = 10,
80 at N = 50), enough to fill a GPU's batch; more would only delay results and lose more to a dead actor."""


@dataclass
class Member:
    """One actor of a pool."""

    handle: Any
    in_flight: int = 0
    """Calls sent to it and not yet collected."""


@dataclass
class Pool:
    """The actors holding one model."""

    model_key: str
    template: ShardSpec
    members: list[Member] = field(default_factory=list)
    loading: dict[Any, Member] = field(default_factory=dict)
    """Outstanding `load()` calls, by object ref."""
    error: str | None = None
    """Set when the model failed to load; the pool takes no more work."""

    @property
    def in_flight(self) -> int:
        """Calls in flight on the pool's actors."""
        return sum(m.in_flight for m in self.members)


@dataclass(frozen=True)
class Placement:
    """Ray resources for one actor of a model, and how many such actors to start."""

    num_cpus: float
    num_gpus: float
    actors: int


@dataclass(frozen=True)
class Call:
    """Shards sent to one actor together, answered in one engine call."""

    ref: Any
    """The object ref of the actor's `run_many`: a list of `ShardResult` or `ShardFailure`, in order."""
    shards: tuple[ShardSpec, ...]


@dataclass(frozen=True)
class LoadEvent:
    """A finished `load()` call: its report, or the loader's error."""

    model_key: str
    report: LoadReport | None
    error: str | None


class ModelPools:
    """Every pool this dispatcher holds; the dispatcher's only door to Ray actors."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        actors_per_model: int | None = None,
        depth: int = 2,
        shards_per_call: int = SHARDS_PER_CALL,
    ) -> None:
        """`depth`: calls queued per actor, so the engine starts the next one while the last is written;
        `shards_per_call`: shards one call (one engine call) may hold."""
        self._config = config
        self._actors_per_model = actors_per_model
        self._depth = depth
        self._shards_per_call = shards_per_call
        self._pools: dict[str, Pool] = {}
        self._owners: dict[Any, tuple[str, Member]] = {}
        """The pool and actor of every outstanding call, by its ref."""
        self.loads: Counter[str] = Counter()
        """Model loads requested, by model key (restarts included)."""

    # --- capacity -------------------------------------------------------------------------------------

    def placement(self, template: ShardSpec) -> Placement:
        """Resources and actor count for a model, from the cluster's free GPUs (or CPUs)."""
        engine = template.engine
        # An endpoint's actor only holds an HTTP client: one per endpoint, no GPU, no CPU reserved.
        if engine.name in (EngineName.fake, EngineName.openai):
            return Placement(num_cpus=0, num_gpus=0, actors=self._actors_per_model or 1)
        total_gpus = _resources(free=False).get("GPU", 0.0)
        if total_gpus <= 0:
            # The CPU build: one engine already uses every core of its node.
            return Placement(num_cpus=1, num_gpus=0, actors=self._actors_per_model or 1)
        tp = engine.tensor_parallel_size
        free = _resources(free=True).get("GPU", 0.0)
        fits = max(1, math.floor(free / tp)) if free >= tp else 0
        actors = min(self._actors_per_model, fits) if self._actors_per_model else fits
        return Placement(num_cpus=1, num_gpus=tp, actors=actors)

    def free_slots(self) -> dict[str, int]:
        """Shards each loaded, healthy model can take now."""
        return {
            key: sum(self._depth - m.in_flight for m in pool.members) * self._shards_per_call
            for key, pool in self._pools.items()
            if pool.error is None and pool.members
        }

    def loaded_keys(self) -> set[str]:
        """Model keys with a pool."""
        return set(self._pools)

    def busy_keys(self) -> set[str]:
        """Model keys with shards in flight."""
        return {key for key, pool in self._pools.items() if pool.in_flight}

    # --- lifecycle ------------------------------------------------------------------------------------

    def ensure(self, template: ShardSpec, *, keep: Collection[str]) -> bool:
        """Start a pool for `template`'s model unless one exists; release idle models not in `keep` to
        make room. Returns False when the model cannot be placed now (the cluster is busy)."""
        if template.model_key in self._pools:
            return self._pools[template.model_key].error is None
        placement = self.placement(template)
        if placement.actors == 0:
            self.release_idle(keep=keep)
            placement = self.placement(template)
            if placement.actors == 0:
                return False
        remote = ray.remote(ShardActor).options(
            num_cpus=placement.num_cpus,
            num_gpus=placement.num_gpus,
            max_restarts=MAX_ACTOR_RESTARTS,
            max_task_retries=0,
        )
        pool = Pool(model_key=template.model_key, template=template)
        for _ in range(placement.actors):
            member = Member(handle=remote.remote(template, config=self._config))
            pool.members.append(member)
            self._load(pool, member)
        self._pools[template.model_key] = pool
        return True

    def _load(self, pool: Pool, member: Member) -> None:
        pool.loading[member.handle.load.remote()] = member
        self.loads[pool.model_key] += 1

    def release_idle(self, *, keep: Collection[str]) -> list[str]:
        """Kill the actors of every model not in `keep` that has nothing in flight."""
        released = [key for key, pool in self._pools.items() if key not in keep and not pool.in_flight]
        for key in released:
            self.release(key)
        return released

    def release(self, model_key: str) -> None:
        """Kill a model's actors and forget the pool."""
        pool = self._pools.pop(model_key, None)
        if pool is None:
            return
        for member in pool.members:
            ray.kill(member.handle, no_restart=True)

    def shutdown(self) -> None:
        """Kill every actor."""
        for key in list(self._pools):
            self.release(key)

    # --- work -----------------------------------------------------------------------------------------

    def submit(self, shards: Sequence[ShardSpec]) -> list[Call]:
        """Send `shards` (of one model, at most its free slots) to its actors and return the calls made.

        As few calls as `shards_per_call` allows, but one for each idle actor while there are shards enough;
        idle actors first, then round robin. Shards stay in order, so a call holds neighbouring shards.
        """
        if not shards:
            return []
        pool = self._pools[shards[0].model_key]
        # One entry per free call slot; sorting by the calls the actor would then hold spreads the shards.
        slots = sorted(
            (
                (m.in_flight + k, number, m)
                for number, m in enumerate(pool.members)
                for k in range(self._depth - m.in_flight)
            ),
            key=lambda slot: (slot[0], slot[1]),
        )
        idle = sum(1 for m in pool.members if m.in_flight == 0)
        calls = max(math.ceil(len(shards) / self._shards_per_call), min(len(shards), idle))
        if calls > len(slots):
            raise ValueError(f"{len(shards)} shards do not fit the model's free slots")
        sent: list[Call] = []
        start = 0
        for number in range(calls):
            size = len(shards) // calls + (1 if number < len(shards) % calls else 0)
            batch = tuple(shards[start : start + size])
            start += size
            member = slots[number][2]
            member.in_flight += 1
            ref = member.handle.run_many.remote(batch)
            self._owners[ref] = (pool.model_key, member)
            sent.append(Call(ref=ref, shards=batch))
        return sent

    def done(self, ref: Any, *, actor_failed: bool) -> None:
        """Account for a finished call; after an actor failure, reload it (Ray restarts the process)."""
        key, member = self._owners.pop(ref)
        member.in_flight -= 1
        pool = self._pools.get(key)
        if actor_failed and pool is not None and member in pool.members:
            self._load(pool, member)

    def load_refs(self) -> list[Any]:
        """Outstanding load calls."""
        return [ref for pool in self._pools.values() for ref in pool.loading]

    def load_finished(self, ref: Any) -> LoadEvent:
        """Collect a finished load call. A loader error marks the pool broken; a dead actor leaves it."""
        for pool in self._pools.values():
            if ref in pool.loading:
                member = pool.loading.pop(ref)
                try:
                    report: LoadReport = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    pool.error = one_line(exc, typed=True)
                    return LoadEvent(model_key=pool.model_key, report=None, error=pool.error)
                except ray.exceptions.RayActorError as exc:
                    pool.members.remove(member)
                    if not pool.members:
                        pool.error = f"every worker for this model died: {one_line(exc, typed=True)}"
                    return LoadEvent(model_key=pool.model_key, report=None, error=None)
                return LoadEvent(model_key=pool.model_key, report=report, error=None)
        raise KeyError(ref)

    def pool_error(self, model_key: str) -> str | None:
        """The loader's error for a model whose pool broke."""
        pool = self._pools.get(model_key)
        return pool.error if pool else None

    def actor_pids(self, model_key: str) -> list[int]:
        """Process ids of a model's actors (for fault-injection tests)."""
        pool = self._pools[model_key]
        return [ray.get(m.handle.pid.remote()) for m in pool.members]


def _resources(*, free: bool) -> dict[str, float]:
    resources = ray.available_resources() if free else ray.cluster_resources()  # type: ignore[no-untyped-call]
    return dict(resources)
