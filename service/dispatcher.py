"""The dispatcher: a Ray driver that feeds shards from the SQL queue to model pools and writes the results.

One loop, no threads: recover expired leases, lease shards (preferring models already loaded), send them to
actors (several shards to one engine call, see `service/pools.py`), wait on Ray, write each result through
`queue.complete`, heartbeat what is in flight. On SIGTERM or Ctrl-C it stops leasing, lets in-flight
shards finish (up to a grace period), releases the rest, and exits. Several dispatchers can share one
PostgreSQL queue: leases make every shard one dispatcher's at a time, and the store writes a shard only while
its lease is held.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import ray

from posbias.schemas import DispatchSummary, PosbiasError, ShardFailure, ShardResult, one_line
from posbias.service import jobs, queue
from posbias.service.database import Database
from posbias.service.pools import ModelPools
from posbias.service.settings import Settings

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A shard sent to an actor and not yet collected."""

    lease: queue.Lease
    started: float


@dataclass
class Tally:
    """What a dispatcher run has done so far; returned as a `DispatchSummary` when the run ends."""

    owner: str
    shards_written: int = 0
    shards_failed: int = 0
    shards_discarded: int = 0
    trials_done: int = 0
    loads: dict[str, int] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds the actors spent loading each model in this run, by model key (from their load reports)."""
    jobs_finished: list[int] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False


def default_owner(settings: Settings) -> str:
    """This dispatcher's lease owner name: unique per process even on one host."""
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


RAY_CLIENT_ATTEMPTS = 3
"""Tries at a Ray Client connection that the cluster answers but cannot set up (see `init_ray`)."""


def init_ray(settings: Settings, *, num_cpus: int | None = None) -> None:
    """Connect to the Ray cluster named by `settings.ray_address` (`local` starts one in this process)."""
    if ray.is_initialized():
        return
    for attempt in range(1, RAY_CLIENT_ATTEMPTS + 1):
        try:
            if settings.ray_address == "local":
                ray.init(
                    address="local",
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=settings.debug,
                    configure_logging=False,
                )
            else:
                ray.init(address=settings.ray_address, log_to_driver=settings.debug, configure_logging=False)
            return
        except ConnectionAbortedError as exc:
            # Ray Client's server answered but could not start this client's session: on a head that has
            # just started, its runtime-env agent may not be up yet (seen under load, and what compose
            # does when it starts the head and a worker together). Worth another try; a wrong address or
            # token (a plain ConnectionError) is not.
            reason = one_line(exc)
            if attempt == RAY_CLIENT_ATTEMPTS:
                raise PosbiasError(
                    f"the Ray cluster at {settings.ray_address!r} refused {attempt} sessions ({reason}); "
                    "see ray_client_server*.err in the head's Ray logs"
                ) from None
            log.warning(
                "Ray Client session refused (%s); trying again (%d of %d)",
                reason,
                attempt + 1,
                RAY_CLIENT_ATTEMPTS,
            )
        except ConnectionError as exc:
            raise PosbiasError(
                f"cannot reach the Ray cluster at {settings.ray_address!r} ({one_line(exc, typed=True)}); "
                "start it with `ray start --head`, or use --ray-address local"
            ) from None


class Dispatcher:
    """Leases shards, runs them on Ray actors, writes their results."""

    def __init__(
        self,
        db: Database,
        *,
        settings: Settings,
        pools: ModelPools | None = None,
        owner: str | None = None,
        job_ids: Collection[int] | None = None,
        drain_seconds: float | None = None,
    ) -> None:
        """`job_ids` limits the dispatcher to those jobs (`posbias run` waits on its own job only)."""
        self.db = db
        self.settings = settings
        self.owner = owner or default_owner(settings)
        self.pools = pools or ModelPools(
            config=settings.worker_config(), actors_per_model=settings.actors_per_model
        )
        self.job_ids = set(job_ids) if job_ids is not None else None
        self.drain_seconds = settings.lease_seconds if drain_seconds is None else drain_seconds
        self._in_flight: dict[Any, list[InFlight]] = {}
        """The shards of every call sent to an actor and not yet collected, by the call's ref."""
        self._stop_requests = 0
        self._stopping_since: float | None = None
        self._blocked = False
        self._last_discovery = 0.0
        self._touched_jobs: set[int] = set()
        self._load_seconds: dict[str, float] = {}

    def request_stop(self) -> None:
        """Stop leasing; in-flight shards finish (or, on a second request, are released now)."""
        self._stop_requests += 1
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

    @property
    def stopping(self) -> bool:
        return self._stop_requests > 0

    def run(
        self,
        *,
        until_empty: bool = False,
        max_jobs: int | None = None,
        on_written: Callable[[ShardResult], None] | None = None,
    ) -> DispatchSummary:
        """Dispatch until stopped, until there is no unfinished work (`until_empty`), or until `max_jobs`
        jobs this dispatcher worked on have finished."""
        summary = Tally(owner=self.owner)
        started = time.monotonic()
        last_recover = 0.0
        last_heartbeat = time.monotonic()
        # Everything alive now (Ray, SQLAlchemy, the caller's plan) lives as long as the loop: out of the
        # collector's sight, a full collection scans only what the loop made. Each shard makes about a
        # thousand objects, and with the full heap in view collections cost about as much as leasing
        # (benchmarks/dispatch.py).
        gc.freeze()
        with self._signals():
            try:
                while True:
                    now = time.monotonic()
                    if now - last_recover >= self.settings.poll_seconds * 5:
                        queue.recover_expired(self.db)
                        last_recover = now
                    if not self.stopping:
                        self._lease_and_submit()
                    if self._should_exit(until_empty=until_empty, max_jobs=max_jobs, summary=summary):
                        break
                    if self.stopping and self._drain_expired():
                        break
                    self._collect(summary, timeout=self.settings.poll_seconds, on_written=on_written)
                    if time.monotonic() - last_heartbeat >= self.settings.heartbeat_seconds:
                        self._heartbeat()
                        last_heartbeat = time.monotonic()
            finally:
                self._release_in_flight()
                summary.interrupted = self.stopping
                summary.loads = dict(self.pools.loads)
                summary.load_seconds = dict(self._load_seconds)
                self._load_seconds.clear()
                summary.seconds = time.monotonic() - started
                gc.unfreeze()
        return DispatchSummary(
            owner=summary.owner,
            shards_written=summary.shards_written,
            shards_failed=summary.shards_failed,
            shards_discarded=summary.shards_discarded,
            trials_done=summary.trials_done,
            loads=summary.loads,
            load_seconds=summary.load_seconds,
            jobs_finished=tuple(summary.jobs_finished),
            seconds=summary.seconds,
            interrupted=summary.interrupted,
        )

    def close(self) -> None:
        """Kill the actors this dispatcher started."""
        self.pools.shutdown()

    # --- the loop's steps -----------------------------------------------------------------------------

    def _lease_and_submit(self) -> None:
        slots = self.pools.free_slots()
        open_keys = sorted(key for key, free in slots.items() if free > 0)
        wanted = sum(slots[key] for key in open_keys)
        leases = self._lease(limit=wanted, model_keys=open_keys) if wanted else []
        # Shards of models not loaded here, one at a time: when the loaded models' queue is short, when
        # nothing is loaded, and otherwise once a poll interval (a lease that finds nothing is a write
        # transaction, too dear to run for every collected call).
        now = time.monotonic()
        if not self._blocked and (
            len(leases) < wanted or not slots or now - self._last_discovery >= self.settings.poll_seconds
        ):
            self._last_discovery = now
            leases += self._lease(limit=1, exclude_model_keys=self.pools.loaded_keys())
        if not leases:
            return

        by_key: dict[str, list[queue.Lease]] = {}
        giveback: list[int] = []
        for lease in leases:
            shard = lease.shard
            key = shard.model_key
            if key not in slots:
                keep = queue.pending_model_keys(self.db) | self.pools.busy_keys()
                keep.discard(key)
                if not self.pools.ensure(shard, keep=keep):
                    self._blocked = True
                    giveback.append(shard.shard_id)
                    continue
                error = self.pools.pool_error(key)
                if error is not None:
                    self._fail_job(shard.job_id, error)
                    continue
                slots = self.pools.free_slots()
            if slots.get(key, 0) <= 0:
                giveback.append(shard.shard_id)
                continue
            slots[key] -= 1
            by_key.setdefault(key, []).append(lease)
        if giveback:
            queue.release(self.db, giveback, owner=self.owner)
        started = time.monotonic()
        for group in by_key.values():
            flights = {lease.shard_id: InFlight(lease=lease, started=started) for lease in group}
            for call in self.pools.submit([lease.shard for lease in group]):
                self._in_flight[call.ref] = [flights[shard.shard_id] for shard in call.shards]
            self._touched_jobs.update(lease.shard.job_id for lease in group)

    def _lease(
        self,
        *,
        limit: int,
        model_keys: Collection[str] | None = None,
        exclude_model_keys: Collection[str] = (),
    ) -> list[queue.Lease]:
        return queue.lease(
            self.db,
            owner=self.owner,
            limit=limit,
            lease_seconds=self.settings.lease_seconds,
            prefer_model_keys=tuple(self.pools.loaded_keys()),
            job_ids=self.job_ids,
            model_keys=model_keys,
            exclude_model_keys=exclude_model_keys,
        )

    def _collect(
        self, summary: Tally, *, timeout: float, on_written: Callable[[ShardResult], None] | None
    ) -> None:
        refs = list(self._in_flight) + self.pools.load_refs()
        if not refs:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if ref in self._in_flight:
                self._finish(ref, summary, on_written=on_written)
            else:
                self._loaded(ref)

    def _loaded(self, ref: Any) -> None:
        event = self.pools.load_finished(ref)
        if event.report is not None:
            log.info("loaded %s in %.1fs", event.report.model.name, event.report.seconds)
            seconds = self._load_seconds.get(event.model_key, 0.0)
            self._load_seconds[event.model_key] = seconds + event.report.seconds
        if event.error is not None:
            # The model cannot load: every job waiting on it fails with the loader's error, once, and the
            # dispatcher carries on with other models.
            for flight in self._flights():
                if flight.lease.shard.model_key == event.model_key:
                    self._fail_job(flight.lease.shard.job_id, event.error)
            self.pools.release(event.model_key)
            self._blocked = False

    def _finish(self, ref: Any, summary: Tally, *, on_written: Callable[[ShardResult], None] | None) -> None:
        flights = self._in_flight.pop(ref)
        try:
            outcomes: list[ShardResult | ShardFailure] = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            self.pools.done(ref, actor_failed=False)
            self._blocked = False
            for flight in flights:
                shard = flight.lease.shard
                error = self.pools.pool_error(shard.model_key)
                if error is not None:
                    self._fail_job(shard.job_id, error)
                else:
                    queue.fail(self.db, shard.shard_id, owner=self.owner, error=one_line(exc, typed=True))
                summary.shards_failed += 1
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self.pools.done(ref, actor_failed=True)
            self._blocked = False
            for flight in flights:
                queue.fail(
                    self.db,
                    flight.lease.shard.shard_id,
                    owner=self.owner,
                    error=f"worker died: {one_line(exc, typed=True)}",
                )
                summary.shards_failed += 1
            return
        self.pools.done(ref, actor_failed=False)
        self._blocked = False
        results: list[ShardResult] = []
        for outcome in outcomes:
            if isinstance(outcome, ShardFailure):
                if outcome.stop_job:  # its cost guard: nothing of the job may run any more
                    job_id = next(
                        f.lease.shard.job_id for f in flights if f.lease.shard_id == outcome.shard_id
                    )
                    jobs.fail(self.db, job_id, error=outcome.error)
                else:
                    queue.fail(self.db, outcome.shard_id, owner=self.owner, error=outcome.error)
                summary.shards_failed += 1
            else:
                results.append(outcome)
        if not results:
            return
        for result, written in zip(results, queue.complete(self.db, results, owner=self.owner), strict=True):
            if written.written:
                summary.shards_written += 1
                summary.trials_done += len(result.trials)
                if on_written is not None:
                    on_written(result)
            else:
                summary.shards_discarded += 1
                log.info("shard %s discarded: %s", result.shard_id, written.reason)

    def _fail_job(self, job_id: int, error: str) -> None:
        jobs.fail(self.db, job_id, error=f"model failed to load: {error}")

    def _flights(self) -> list[InFlight]:
        return [flight for call in self._in_flight.values() for flight in call]

    def _heartbeat(self) -> None:
        ids = [flight.lease.shard.shard_id for flight in self._flights()]
        if ids:
            queue.heartbeat(self.db, ids, owner=self.owner, lease_seconds=self.settings.lease_seconds)

    def _should_exit(self, *, until_empty: bool, max_jobs: int | None, summary: Tally) -> bool:
        if self._in_flight:
            return False
        if self.stopping:
            return True
        if self.job_ids is not None and all(jobs.finished(self.db, j) for j in self.job_ids):
            return True
        if max_jobs is not None:
            finished = [j for j in sorted(self._touched_jobs) if jobs.finished(self.db, j)]
            summary.jobs_finished = finished
            if len(finished) >= max_jobs:
                return True
        return until_empty and not queue.pending_model_keys(self.db, job_ids=self.job_ids)

    def _drain_expired(self) -> bool:
        assert self._stopping_since is not None
        return self._stop_requests > 1 or time.monotonic() - self._stopping_since > self.drain_seconds

    def _release_in_flight(self) -> None:
        if self._in_flight:
            ids = [flight.lease.shard.shard_id for flight in self._flights()]
            queue.release(self.db, ids, owner=self.owner)
            self._in_flight.clear()

    @contextmanager
    def _signals(self) -> Iterator[None]:
        def handler(signum: int, frame: FrameType | None) -> None:
            log.warning("received %s: finishing in-flight shards", signal.Signals(signum).name)
            self.request_stop()

        try:
            previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:  # not the main thread: the caller stops us with request_stop()
            yield
            return
        try:
            yield
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)
