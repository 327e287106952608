"""Pools of `ShardActor`s, one pool per loaded model, placed where Ray and its autoscaler can see them.

Shards go to an actor in calls of up to `shards_per_call`, each answered in one engine call: vLLM batches
only within a call, so one shard per call (about 500 questions) leaves a GPU's batch half empty and pays the
decode tail of every call (benchmarks/throughput.py). Each actor holds `depth` calls, so the next one is
queued while the last one's results travel back and are written.

Growth. What an actor reserves, and whether any node can hold it, is decided in
`service/dispatch/placement.py`. While every placed actor of a GPU model is busy, one more waits for a node
(up to `MAX_GPU_ACTORS`), so the cluster grows with the work: a pending actor is the demand Ray's autoscaler
scales up for. (`ray.autoscaler.sdk.request_resources` is not used: it is one standing request per cluster,
the last caller's, which several dispatchers would overwrite and a crashed one would leave in force.) An actor
that waits past the placement timeout is ended and its shards go back to the queue with the reason.

Teardown. Models stay loaded while they have queued work; a model with no queued or running work is released
when another model needs its GPUs (or CPUs, for the CPU build). Releasing asks each actor to close its engine
(vLLM stops its engine-core and worker processes, which frees their GPU memory) and only then ends the actor;
`ray.kill` alone can leave those processes holding the GPUs the next model needs. Actor restarts are
bounded, and a shard whose actor dies is reported to the caller, which fails it back to the queue: it is
never retried inside Ray.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from posbias.schemas import LoadReport, PosbiasError, RetryableError, ShardSpec, WorkerConfig, one_line
from posbias.service.dispatch.placement import Placement, Placer, fits_now
from posbias.service.settings import Settings
from posbias.workers.actor import ShardActor
from posbias.workers.engines import declared

log = logging.getLogger(__name__)

MAX_ACTOR_RESTARTS = 3
SHARDS_PER_CALL = 8
"""Shards per engine call at most: about 4,000 questions at the planner's shard size (400 prompts at N = 10,
80 at N = 50), enough to fill a GPU's batch; more would only delay results and lose more to a dead actor."""
MAX_GPU_ACTORS = 16
"""Actors of one GPU model at most, when `POSBIAS_ACTORS_PER_MODEL` does not say: more than one dispatcher
keeps busy, and each waiting one asks the autoscaler for a node."""
CLOSE_SECONDS = 60.0
"""How long releasing a model waits for its actors to close their engines before ending them anyway."""


def engine_template(shard: ShardSpec) -> ShardSpec:
    """`shard` as an actor's constructor argument: what its engine is built from, without the shard's own
    work (trials, questions, answer sheet), which come with each call. A whole shard can pass Ray's 100 KB
    limit for inline arguments (a fake job's first shard at N = 50 pickles to 325 KB, this to 2.4 KB): the
    arguments then go through the object store, where a restarted actor may no longer find them, and Ray's
    core worker says so in a native error line on the driver's terminal."""
    return shard.model_copy(update={"trials": (), "questions": {}, "answers": None})


@dataclass
class Member:
    """One actor of a pool."""

    handle: Any
    created: float
    """When it was created (monotonic clock): it may wait for a node from then on."""
    in_flight: int = 0
    """Calls sent to it and not yet collected."""
    placed: bool = False
    """Its process is up on a node (its first call answered)."""
    spare: bool = False
    """Started as demand for one more node; it takes shards once placed."""
    reloads: int = 0
    """Loads sent again because Ray was still restarting its process."""


@dataclass
class Pool:
    """The actors holding one model."""

    model_key: str
    template: ShardSpec
    placement: Placement
    members: list[Member] = field(default_factory=list)
    loading: dict[Any, Member] = field(default_factory=dict)
    """Outstanding `load()` calls, by object ref."""
    probes: dict[Any, Member] = field(default_factory=dict)
    """Outstanding `pid()` calls, by object ref: the first call an actor answers, once it is placed."""
    error: str | None = None
    """Set when the model cannot load or cannot be placed; the pool takes no more work."""
    full: bool = False
    """A spare waited past the placement timeout: the cluster has no room for more of this model now."""

    @property
    def in_flight(self) -> int:
        """Calls in flight on the pool's actors."""
        return sum(m.in_flight for m in self.members)

    @property
    def waiting(self) -> bool:
        """Some actor of the pool waits for a node."""
        return any(not m.placed for m in self.members)


@dataclass(frozen=True)
class Call:
    """Shards sent to one actor together, answered in one engine call."""

    ref: Any
    """The object ref of the actor's `run_many`: a list of `ShardResult` or `ShardFailure`, in order."""
    shards: tuple[ShardSpec, ...]


@dataclass(frozen=True)
class LoadEvent:
    """A finished `load()` call: its report, the loader's error, or a reason to try again later."""

    model_key: str
    report: LoadReport | None
    error: str | None
    retry: str | None = None
    """The load failed in a way a later attempt may not (GPU memory still held): the pool was released,
    and its shards go back to the queue with this reason; the job is not failed."""


@dataclass(frozen=True)
class Unplaced:
    """Actors of a model that waited for a node past the placement timeout, now ended."""

    model_key: str
    refs: tuple[Any, ...]
    """Calls that had been sent to them: their shards go back to the queue with `reason`."""
    reason: str


class ModelPools:
    """Every pool this dispatcher holds; the dispatcher's only door to Ray actors."""

    def __init__(
        self,
        *,
        config: WorkerConfig,
        placer: Placer | None = None,
        depth: int = 2,
        shards_per_call: int = SHARDS_PER_CALL,
    ) -> None:
        """`placer`: what each model's actors reserve (by default as `Placer()` decides); `depth`: calls
        queued per actor, so the engine starts the next one while the last is written; `shards_per_call`:
        shards one call (one engine call) may hold."""
        self._config = config
        self.placer = placer or Placer()
        self._depth = depth
        self._shards_per_call = shards_per_call
        self._pools: dict[str, Pool] = {}
        self._owners: dict[Any, tuple[str, Member]] = {}
        """The pool and actor of every outstanding call, by its ref."""
        self.loads: Counter[str] = Counter()
        """Model loads requested, by model key (restarts included)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelPools:
        """Pools as `settings` configure them."""
        return cls(config=settings.worker_config(), placer=Placer.from_settings(settings))

    # --- capacity -------------------------------------------------------------------------------------

    def free_slots(self) -> dict[str, int]:
        """Shards each healthy model can take now: the free call slots of its actors (spares only once
        placed)."""
        return {
            key: sum(self._depth - m.in_flight for m in pool.members if m.placed or not m.spare)
            * self._shards_per_call
            for key, pool in self._pools.items()
            if pool.error is None and pool.members
        }

    def loaded_keys(self) -> set[str]:
        """Model keys with a pool."""
        return set(self._pools)

    def busy_keys(self) -> set[str]:
        """Model keys with shards in flight."""
        return {key for key, pool in self._pools.items() if pool.in_flight}

    def waiting_keys(self) -> set[str]:
        """Model keys with an actor waiting for a node."""
        return {key for key, pool in self._pools.items() if pool.error is None and pool.waiting}

    # --- lifecycle ------------------------------------------------------------------------------------

    def ensure(self, template: ShardSpec, *, keep: Collection[str]) -> bool:
        """Start a pool for `template`'s model unless one exists, releasing idle models not in `keep` when
        its actors need what they hold. Returns False when the model cannot run: `pool_error` says why (no
        node can hold its actor, or its loader failed)."""
        if template.model_key in self._pools:
            return self._pools[template.model_key].error is None
        try:
            placement = self.placer.placement(template)
        except PosbiasError as exc:  # no engine of that name here (a plug-in the submitter had)
            unplaceable = Placement(num_cpus=0, num_gpus=0, actors=0, grows=False)
            pool = Pool(model_key=template.model_key, template=template, placement=unplaceable)
            pool.error = str(exc)
            self._pools[template.model_key] = pool
            return False
        pool = Pool(model_key=template.model_key, template=template, placement=placement)
        self._pools[template.model_key] = pool
        if placement.num_gpus:
            pool.error = self.placer.infeasible(placement)
            if pool.error is not None:
                return False
        if not fits_now(placement):
            self.release_idle(keep={*keep, template.model_key})
        for _ in range(placement.actors):
            self._start(pool, spare=False)
        return True

    def _start(self, pool: Pool, *, spare: bool) -> None:
        placement = pool.placement
        remote = ray.remote(ShardActor).options(
            num_cpus=placement.num_cpus,
            num_gpus=placement.num_gpus,
            max_restarts=MAX_ACTOR_RESTARTS,
            max_task_retries=0,
        )
        # The actor is handed the engine's declaration: one registered only in this process builds there too.
        declaration = declared(pool.template.engine.name)
        handle = remote.remote(engine_template(pool.template), config=self._config, engine=declaration)
        member = Member(handle=handle, created=time.monotonic(), spare=spare)
        pool.members.append(member)
        # Calls run in order: `pid` answers as soon as the actor is up on a node, before the load.
        pool.probes[member.handle.pid.remote()] = member
        self._load(pool, member)

    def _load(self, pool: Pool, member: Member) -> None:
        # Several calls of one dead actor each report its death: it is reloaded once.
        if member in pool.loading.values():
            return
        pool.loading[member.handle.load.remote()] = member
        self.loads[pool.model_key] += 1

    def _grow(self, pool: Pool) -> None:
        """One more actor waits for a node when every placed one is busy, so the autoscaler sees the work
        this model has beyond what its actors hold."""
        if not pool.placement.grows or pool.full or pool.error is not None or pool.waiting:
            return
        if len(pool.members) >= MAX_GPU_ACTORS:
            return
        if all(m.in_flight >= self._depth for m in pool.members):
            self._start(pool, spare=True)

    def release_idle(self, *, keep: Collection[str]) -> list[str]:
        """Release every model not in `keep` that has nothing in flight."""
        released = [key for key, pool in self._pools.items() if key not in keep and not pool.in_flight]
        for key in released:
            self.release(key)
        return released

    def release(self, model_key: str) -> list[Any]:
        """Close the engines of a model's actors (each waits at most `CLOSE_SECONDS`), end the actors and
        forget the pool. Returns the refs of calls still outstanding on them, which will never answer."""
        pool = self._pools.pop(model_key, None)
        if pool is None:
            return []
        closing = [m.handle.close.remote() for m in pool.members if m.placed]
        if closing:
            _, late = ray.wait(closing, num_returns=len(closing), timeout=CLOSE_SECONDS)
            if late:
                log.warning("%d actor(s) of %s did not close their engine in time", len(late), model_key)
        for member in pool.members:
            ray.kill(member.handle, no_restart=True)
        orphans = [ref for ref, (key, _) in self._owners.items() if key == model_key]
        for ref in orphans:
            del self._owners[ref]
        return orphans

    def shutdown(self) -> None:
        """Release every model."""
        for key in list(self._pools):
            self.release(key)

    def unplaced(self, *, now: float | None = None) -> list[Unplaced]:
        """End the actors that have waited for a node longer than the placement timeout and say which
        calls they held. A spare's wait ends the pool's growth; a pool left with no actor is released."""
        now = time.monotonic() if now is None else now
        events: list[Unplaced] = []
        for key, pool in list(self._pools.items()):
            stuck = [m for m in pool.members if not m.placed and now - m.created > self.placer.timeout]
            if not stuck:
                continue
            reason = self.placer.timed_out(pool.placement)
            refs: list[Any] = []
            for member in stuck:
                pool.full = pool.full or member.spare
                pool.members.remove(member)
                for table in (pool.probes, pool.loading):
                    for ref in [r for r, m in table.items() if m is member]:
                        del table[ref]
                calls = [ref for ref, (_, owner) in self._owners.items() if owner is member]
                for ref in calls:
                    del self._owners[ref]
                refs += calls
                ray.kill(member.handle, no_restart=True)
            log.warning("%s: %d actor(s) ended: %s", key, len(stuck), reason)
            if not pool.members:
                self._pools.pop(key)
            events.append(Unplaced(model_key=key, refs=tuple(refs), reason=reason))
        return events

    # --- work -----------------------------------------------------------------------------------------

    def submit(self, shards: Sequence[ShardSpec]) -> list[Call]:
        """Send `shards` (of one model, at most its free slots) to its actors and return the calls made.

        As few calls as `shards_per_call` allows, but one for each idle actor while there are shards enough;
        idle actors first, then round robin. Shards stay in order, so a call holds neighbouring shards.
        """
        if not shards:
            return []
        pool = self._pools[shards[0].model_key]
        members = [m for m in pool.members if m.placed or not m.spare]
        # One entry per free call slot; sorting by the calls the actor would then hold spreads the shards.
        slots = sorted(
            (
                (m.in_flight + k, number, m)
                for number, m in enumerate(members)
                for k in range(self._depth - m.in_flight)
            ),
            key=lambda slot: (slot[0], slot[1]),
        )
        idle = sum(1 for m in members if m.in_flight == 0)
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
        self._grow(pool)
        return sent

    def done(self, ref: Any, *, actor_failed: bool) -> None:
        """Account for a finished call; after an actor failure, reload it (Ray restarts the process)."""
        owner = self._owners.pop(ref, None)
        if owner is None:  # its pool was released or its actor ended while the call was out
            return
        key, member = owner
        member.in_flight -= 1
        pool = self._pools.get(key)
        if actor_failed and pool is not None and member in pool.members:
            self._load(pool, member)

    def load_refs(self) -> list[Any]:
        """Outstanding load calls, and the calls that tell when an actor has been placed."""
        return [ref for pool in self._pools.values() for ref in (*pool.probes, *pool.loading)]

    def load_finished(self, ref: Any) -> LoadEvent:
        """Collect a finished load (or placement) call. A loader error marks the pool broken; a refused load
        that a later attempt may not meet releases the pool; a dead actor leaves it."""
        for pool in self._pools.values():
            if ref in pool.probes:
                member = pool.probes.pop(ref)
                member.placed = True
                self._grow(pool)
                return LoadEvent(model_key=pool.model_key, report=None, error=None)
            if ref in pool.loading:
                member = pool.loading.pop(ref)
                try:
                    report: LoadReport = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    if isinstance(getattr(exc, "cause", None), RetryableError):
                        reason = one_line(exc)
                        self.release(pool.model_key)
                        return LoadEvent(model_key=pool.model_key, report=None, error=None, retry=reason)
                    pool.error = f"model failed to load: {one_line(exc, typed=True)}"
                    return LoadEvent(model_key=pool.model_key, report=None, error=pool.error)
                except ray.exceptions.ActorUnavailableError:
                    # Ray is restarting the process (a bounded number of times): load it again when it is up.
                    if member in pool.members and member.reloads < MAX_ACTOR_RESTARTS:
                        member.reloads += 1
                        self._load(pool, member)
                        return LoadEvent(model_key=pool.model_key, report=None, error=None)
                    if member in pool.members:
                        pool.members.remove(member)
                    if not pool.members:
                        pool.error = "model failed to load: every worker for this model kept restarting"
                    # With no member left, the reason fails the jobs waiting on the model (None till then).
                    return LoadEvent(model_key=pool.model_key, report=None, error=pool.error)
                except ray.exceptions.RayActorError as exc:
                    if member in pool.members:
                        pool.members.remove(member)
                    if not pool.members:
                        died = one_line(exc, typed=True)
                        pool.error = f"model failed to load: every worker for this model died: {died}"
                    return LoadEvent(model_key=pool.model_key, report=None, error=pool.error)
                return LoadEvent(model_key=pool.model_key, report=report, error=None)
        raise KeyError(ref)

    def pool_error(self, model_key: str) -> str | None:
        """Why a model's pool cannot run (its loader failed, or no node can hold its actor)."""
        pool = self._pools.get(model_key)
        return pool.error if pool else None

    def actor_pids(self, model_key: str) -> list[int]:
        """Process ids of a model's actors (for fault-injection tests)."""
        pool = self._pools[model_key]
        return [ray.get(m.handle.pid.remote()) for m in pool.members]
