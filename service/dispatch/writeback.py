"""What a dispatcher owes the store for the shards it sent to Ray actors, and waiting out a failing store.

The dispatcher's calls out on actors are held here by their Ray refs, with the leases of their shards
(heartbeated while they run). A finished call is collected here: its results are written through
`queue.complete`, its failures through `queue.fail` (or `jobs.fail`, when a job cannot go on), and shards
the dispatcher cannot run go back to the queue.

Every one of those writes is owed, in order, until the store takes it. A store that fails (a PostgreSQL
restart, a full disk, a read-only store) is waited out: the dispatcher stops leasing, keeps the results of
what was in flight, and tries the store again with a growing pause; once the store takes a write it carries
on. If it stays unusable for `store_outage_seconds`, the dispatcher exits with one line; the leases it held
lapse and any dispatcher reruns those shards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import ray
from sqlalchemy.exc import SQLAlchemyError

from posbias.schemas import DispatchSummary, ShardFailure, ShardResult, one_line
from posbias.service.dispatch import owners
from posbias.service.dispatch.pools import ModelPools
from posbias.service.settings import Settings
from posbias.service.store import STORE_ERRORS, Database, DriverError, StoreError, store_errors
from posbias.service.work import jobs, queue

log = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A shard sent to an actor and not yet collected."""

    lease: queue.Lease
    started: float


@dataclass
class Owed:
    """A write the dispatcher owes the store (results, a failure, a release), kept while the store is down."""

    write: Callable[[], object]
    shards: int
    """Shards it is about, for the message if the store never takes it."""


@dataclass
class Outage:
    """The store has been failing since `since` (monotonic seconds)."""

    since: float
    reason: str
    retry_at: float
    pause: float


OUTAGE_FIRST_PAUSE = 0.5
OUTAGE_MAX_PAUSE = 10.0
"""Seconds between tries at a failing store: doubling from the first to the most."""


@dataclass
class Tally:
    """What a dispatcher run has done so far; returned as a `DispatchSummary` when the run ends."""

    owner: str
    shards_written: int = 0
    shards_failed: int = 0
    shards_discarded: int = 0
    trials_done: int = 0
    results_written: int = 0
    engine_seconds: float = 0.0
    """The written shards' time in their engine calls (each shard's share of its call, summed over actors)."""
    store_seconds: float = 0.0
    """Time in the store's result writes (`queue.complete`)."""
    loads: dict[str, int] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds the actors spent loading each model in this run, by model key (from their load reports)."""
    jobs_finished: list[int] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False

    def summary(self) -> DispatchSummary:
        """The run's record, as the API returns it."""
        return DispatchSummary(
            owner=self.owner,
            shards_written=self.shards_written,
            shards_failed=self.shards_failed,
            shards_discarded=self.shards_discarded,
            trials_done=self.trials_done,
            results_written=self.results_written,
            engine_seconds=self.engine_seconds,
            store_seconds=self.store_seconds,
            loads=self.loads,
            load_seconds=self.load_seconds,
            jobs_finished=tuple(self.jobs_finished),
            seconds=self.seconds,
            interrupted=self.interrupted,
        )


class WriteBack:
    """A dispatcher's calls in flight, and the writes it owes the store for them."""

    def __init__(self, db: Database, *, owner: str, settings: Settings, pools: ModelPools) -> None:
        """`owner` holds the leases; `pools` are told when a call is collected, and say why a model cannot
        run."""
        self.db = db
        self.owner = owner
        self.settings = settings
        self.pools = pools
        self._in_flight: dict[Any, list[InFlight]] = {}
        """The shards of every call sent to an actor and not yet collected, by the call's ref."""
        self._owed: list[Owed] = []
        """Writes the store has not taken yet, oldest first."""
        self._outage: Outage | None = None
        self.outages = 0
        """Times the store failed and came back."""

    @property
    def store_down(self) -> bool:
        """True while the store is failing and the dispatcher waits it out."""
        return self._outage is not None

    @property
    def busy(self) -> bool:
        """Calls are out on actors, or writes are owed."""
        return bool(self._in_flight or self._owed)

    # --- calls in flight ------------------------------------------------------------------------------

    def sent(self, ref: Any, flights: list[InFlight]) -> None:
        """Hold the shards of a call sent to an actor until it is collected (`finish`)."""
        self._in_flight[ref] = flights

    def holds(self, ref: Any) -> bool:
        """`ref` is a call in flight (not a load)."""
        return ref in self._in_flight

    def refs(self) -> list[Any]:
        """The calls in flight."""
        return list(self._in_flight)

    def flights(self) -> list[InFlight]:
        """Every shard in flight."""
        return [flight for call in self._in_flight.values() for flight in call]

    def heartbeat(self) -> None:
        """Extend the leases of every shard in flight."""
        ids = [flight.lease.shard.shard_id for flight in self.flights()]
        queue.heartbeat(self.db, ids, owner=self.owner, lease_seconds=self.settings.lease_seconds)

    def finish(self, ref: Any, tally: Tally, *, on_written: Callable[[ShardResult], None] | None) -> None:
        """Collect a finished call: free its actor's slot and write what it answered. A failed call fails
        its shards (or their job, when the model's pool cannot run); a dead actor is reloaded by the pools."""
        flights = self._in_flight.pop(ref)
        try:
            outcomes: list[ShardResult | ShardFailure] = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            self.pools.done(ref, actor_failed=False)
            for flight in flights:
                shard = flight.lease.shard
                error = self.pools.pool_error(shard.model_key)
                if error is not None:
                    self.fail_job(shard.job_id, error)
                else:
                    self._fail(shard.shard_id, one_line(exc, typed=True))
                tally.shards_failed += 1
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self.pools.done(ref, actor_failed=True)
            for flight in flights:
                self._fail(flight.lease.shard.shard_id, f"worker died: {one_line(exc, typed=True)}")
                tally.shards_failed += 1
            return
        self.pools.done(ref, actor_failed=False)
        results: list[ShardResult] = []
        for outcome in outcomes:
            if isinstance(outcome, ShardFailure):
                if outcome.stop_job:  # its cost guard: nothing of the job may run any more
                    job_id = next(
                        f.lease.shard.job_id for f in flights if f.lease.shard_id == outcome.shard_id
                    )
                    self.fail_job(job_id, outcome.error)
                else:
                    self._fail(outcome.shard_id, outcome.error)
                tally.shards_failed += 1
            else:
                results.append(outcome)
        if results:
            self._owe(lambda: self._complete(results, tally, on_written=on_written), shards=len(results))

    def _complete(
        self, results: list[ShardResult], tally: Tally, *, on_written: Callable[[ShardResult], None] | None
    ) -> None:
        started = time.perf_counter()
        outcomes = queue.complete(self.db, results, owner=self.owner)
        tally.store_seconds += time.perf_counter() - started
        for result, written in zip(results, outcomes, strict=True):
            if written.written:
                tally.shards_written += 1
                tally.trials_done += len(result.trials)
                tally.results_written += written.results
                tally.engine_seconds += result.generate_seconds
                if on_written is not None:
                    on_written(result)
            else:
                tally.shards_discarded += 1
                log.info("shard %s discarded: %s", result.shard_id, written.reason)

    def give_back(self, shard_ids: list[int], *, reason: str | None = None) -> None:
        """Release `shard_ids` to the queue, charging nothing, as soon as the store takes it."""
        if shard_ids:
            self._owe(lambda: queue.release(self.db, shard_ids, owner=self.owner, reason=reason), shards=0)

    def give_back_calls(self, refs: Collection[Any], *, reason: str) -> None:
        """Return the shards of the calls `refs` (of actors that waited past the placement timeout, now
        ended) to the queue with `reason`, each charged a wait (`wait_again`)."""
        flights = [flight for ref in refs for flight in self._in_flight.pop(ref, [])]
        self.wait_again([flight.lease.shard.shard_id for flight in flights], reason=reason)

    def give_back_model(self, model_key: str, *, reason: str) -> None:
        """Return the in-flight shards of `model_key` (its load was refused GPU memory) to the queue with
        `reason`, each charged a wait (`wait_again`)."""
        ids = []
        for ref, flights in list(self._in_flight.items()):
            if flights and flights[0].lease.shard.model_key == model_key:
                ids += [flight.lease.shard.shard_id for flight in self._in_flight.pop(ref)]
        self.wait_again(ids, reason=reason)

    def wait_again(self, shard_ids: list[int], *, reason: str) -> None:
        """Release `shard_ids` with `reason`, charging each a wait; a job whose shard has waited
        `placement_waits` times fails with the reason, as soon as the store takes it."""
        budget = self.settings.placement_waits

        def write() -> None:
            for job_id in queue.wait_again(
                self.db, shard_ids, owner=self.owner, reason=reason, budget=budget
            ):
                error = f"{reason}; gave up after {budget} waits (POSBIAS_PLACEMENT_WAITS)"
                jobs.fail(self.db, job_id, error=error)

        if shard_ids:
            self._owe(write, shards=0)

    def _fail(self, shard_id: int, error: str) -> None:
        self._owe(lambda: queue.fail(self.db, shard_id, owner=self.owner, error=error), shards=1)

    def fail_job(self, job_id: int, error: str) -> None:
        """Fail the whole job with `error`, as soon as the store takes it."""
        self._owe(lambda: jobs.fail(self.db, job_id, error=error), shards=0)

    def leave(self) -> None:
        """On the way out: write what is owed, give back what is in flight, and deregister. With the store
        down none of it can be done; the leases then lapse."""
        ids = [flight.lease.shard.shard_id for flight in self.flights()]
        self._in_flight.clear()
        try:
            if self._outage is None:
                self._pay()
            if ids:
                queue.release(self.db, ids, owner=self.owner)
            owners.deregister(self.db, self.owner)
        except (*STORE_ERRORS, StoreError) as exc:
            # The caller reports why the store failed; these leases lapse on their own.
            error = exc if isinstance(exc, StoreError) else store_errors.explain(exc, url=self.db.url)
            log.info("could not release %d shards: %s", len(ids), error)
        self._owed.clear()

    # --- the store, and waiting it out ----------------------------------------------------------------

    def _owe(self, write: Callable[[], object], *, shards: int) -> None:
        """Do `write` now, or as soon as the store takes it (keeping the order of writes)."""
        self._owed.append(Owed(write=write, shards=shards))
        if self._outage is None:
            try:
                self._pay()
            except STORE_ERRORS as exc:
                self.store_failed(exc)

    def _pay(self) -> None:
        """Write what is owed, oldest first; stops at the first store error (raised)."""
        while self._owed:
            self._owed[0].write()
            self._owed.pop(0)

    def store_failed(self, exc: SQLAlchemyError | DriverError) -> None:
        """The store failed: wait it out when it may recover, else stop with its error."""
        error = store_errors.explain(exc, url=self.db.url)
        if not error.transient:
            raise error from exc
        now = time.monotonic()
        if self._outage is None:
            log.warning("the store failed (%s); not leasing until it works again", error)
            self._outage = Outage(since=now, reason=str(error), retry_at=now + OUTAGE_FIRST_PAUSE, pause=1.0)
            return
        pause = min(self._outage.pause * 2, OUTAGE_MAX_PAUSE)
        self._outage = Outage(since=self._outage.since, reason=str(error), retry_at=now + pause, pause=pause)

    def retry_store(self) -> None:
        """When the pause is over, try the store again: what is owed first, then a heartbeat (which also
        shows the store is back). Raises `StoreError` once the outage has lasted too long."""
        outage = self._outage
        assert outage is not None
        now = time.monotonic()
        if now - outage.since > self.settings.store_outage_seconds:
            unwritten = sum(owed.shards for owed in self._owed) + len(self.flights())
            self._owed.clear()
            raise StoreError(
                f"gave up on the store after {now - outage.since:.0f} s: {outage.reason}; the results of "
                f"{unwritten} shards were not written (their leases lapse and a dispatcher reruns them)",
                problem=store_errors.Problem.unreachable,
            )
        if now < outage.retry_at:
            return
        try:
            self._pay()
            self.heartbeat()
        except STORE_ERRORS as exc:
            self.store_failed(exc)
            return
        log.warning("the store works again after %.0f s", now - outage.since)
        self._outage = None
        self.outages += 1
