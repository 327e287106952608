"""The dispatcher: a Ray driver that feeds shards from the SQL queue to model pools and writes the results.

One loop, no threads: recover expired leases (and those of dispatchers on this machine whose process is
gone), lease shards (preferring models already loaded), send them to actors (several shards to one engine
call, see `service/pools.py`), wait on Ray, write each result through `queue.complete`, heartbeat what is in
flight. On SIGTERM or Ctrl-C it stops leasing, lets in-flight shards finish (up to a grace period), releases
the rest, and exits. Several dispatchers can share one PostgreSQL queue: leases make every shard one
dispatcher's at a time, and the store writes a shard only while its lease is held.

A store that fails (a PostgreSQL restart, a full disk, a read-only store) is waited out: the dispatcher stops
leasing, keeps the results of what was in flight, and tries the store again with a growing pause; once the
store takes a write it carries on. If it stays unusable for `store_outage_seconds`, the dispatcher exits with
one line; the leases it held lapse and any dispatcher reruns those shards.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any
from urllib.parse import urlparse

import ray
from sqlalchemy.exc import SQLAlchemyError

from posbias.schemas import DispatchSummary, PosbiasError, ShardFailure, ShardResult, one_line
from posbias.service import database, jobs, owners, queue, reaper
from posbias.service.database import STORE_ERRORS, Database, DriverError, StoreError
from posbias.service.pools import ModelPools
from posbias.service.settings import Settings

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
    loads: dict[str, int] = field(default_factory=dict)
    load_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds the actors spent loading each model in this run, by model key (from their load reports)."""
    jobs_finished: list[int] = field(default_factory=list)
    seconds: float = 0.0
    interrupted: bool = False


def default_owner(settings: Settings) -> str:
    """This dispatcher's lease owner name: unique per process even on one host."""
    return settings.worker_id or f"{socket.gethostname()[:150]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


RAY_CLIENT_ATTEMPTS = 3
"""Tries at a Ray Client connection that the cluster answers but cannot set up (see `init_ray`)."""
RAY_PROBE_SECONDS = 5.0
"""How long the TCP connection to a Ray address may take before it counts as unreachable."""
RAY_HINT = "start it with `ray start --head`, or use --ray-address local"


def init_ray(settings: Settings, *, num_cpus: int | None = None) -> None:
    """Connect to the Ray cluster named by `settings.ray_address` (`local` starts one in this process),
    within `settings.ray_connect_seconds`.

    An address is first reached over TCP, so one that nothing listens on is an error at once, not a wait:
    Ray itself retries a GCS address for as long as it is given. The Ray processes a local start creates
    are handed to a reaper (`service/reaper.py`), so they do not outlive this process however it ends.
    """
    if ray.is_initialized():
        return
    address = settings.ray_address
    if address not in {"local", "auto"}:
        _probe(address, seconds=min(RAY_PROBE_SECONDS, settings.ray_connect_seconds))
    deadline = time.monotonic() + settings.ray_connect_seconds
    for attempt in range(1, RAY_CLIENT_ATTEMPTS + 1):
        try:
            if address == "local":
                before = set(reaper.children())
                ray.init(
                    address="local",
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=settings.debug,
                    configure_logging=False,
                )
                reaper.watch([pid for pid in reaper.children() if pid not in before])
            elif address == "auto" or address.startswith("ray://"):
                # Ray Client has its own connection timeout; `auto` finds a node on this machine or fails.
                ray.init(address=address, log_to_driver=settings.debug, configure_logging=False)
            else:
                _within(
                    lambda: ray.init(address=address, log_to_driver=settings.debug, configure_logging=False),
                    seconds=deadline - time.monotonic(),
                    address=address,
                )
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
                f"{RAY_HINT}"
            ) from None
        except (ValueError, RuntimeError) as exc:  # a malformed address, or a cluster Ray cannot join
            raise PosbiasError(
                f"cannot connect to the Ray cluster at {settings.ray_address!r} "
                f"({one_line(exc, typed=True)}); {RAY_HINT}"
            ) from None


def _probe(address: str, *, seconds: float) -> None:
    """Raise `PosbiasError` unless a TCP connection to the Ray `address` (`host:port` or `ray://host:port`)
    opens within `seconds`."""
    url = urlparse(address if "://" in address else f"ray://{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise PosbiasError(
            f"{address[:200]!r} is not a Ray address: give local, auto, host:port or ray://host:port"
        )
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc, typed=True)
        raise PosbiasError(f"cannot reach the Ray cluster at {address!r} ({reason}); {RAY_HINT}") from None


class _RayWorkerWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


def _within(connect: Callable[[], object], *, seconds: float, address: str) -> None:
    """Run `connect` (a `ray.init`), giving up after `seconds`: Ray keeps trying a GCS address that
    answers TCP but not as Ray for as long as it is let. The abandoned attempt stays in a daemon thread."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            connect()
            outcome.append(None)
        except BaseException as exc:  # handed to the calling thread
            outcome.append(exc)

    quiet = _RayWorkerWarnings()
    logger = logging.getLogger("ray._private.worker")
    logger.addFilter(quiet)
    try:
        thread = threading.Thread(target=attempt, name="ray-connect", daemon=True)
        thread.start()
        thread.join(max(seconds, 0.0))
    finally:
        logger.removeFilter(quiet)
    if not outcome:
        raise PosbiasError(
            f"the Ray cluster at {address!r} did not answer within {max(seconds, 0):.0f} s (is it a Ray GCS "
            f"address?); {RAY_HINT}, or raise POSBIAS_RAY_CONNECT_SECONDS"
        )
    if outcome[0] is not None:
        raise outcome[0]


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
        self.pools = pools or ModelPools.from_settings(settings)
        self.job_ids = set(job_ids) if job_ids is not None else None
        self.drain_seconds = settings.drain_seconds if drain_seconds is None else drain_seconds
        self.identity = owners.this_process()
        self._in_flight: dict[Any, list[InFlight]] = {}
        """The shards of every call sent to an actor and not yet collected, by the call's ref."""
        self._owed: list[Owed] = []
        """Writes the store has not taken yet, oldest first."""
        self._outage: Outage | None = None
        self._stop_requests = 0
        self._stopping_since: float | None = None
        self._blocked = False
        self._last_discovery = 0.0
        self._touched_jobs: set[int] = set()
        self._load_seconds: dict[str, float] = {}
        self._last_placement_check = 0.0
        self._loading: set[str] = set()
        """Models whose pool has no loaded actor yet: their engine cannot start anything soon, so nothing
        beyond the shard that started the load is leased for them (others may run those shards meanwhile)."""
        self.outages = 0
        """Times the store failed and came back during this dispatcher's runs."""

    def request_stop(self) -> None:
        """Stop leasing; in-flight shards finish (or, on a second request, are released now)."""
        self._stop_requests += 1
        if self._stopping_since is None:
            self._stopping_since = time.monotonic()

    @property
    def stopping(self) -> bool:
        return self._stop_requests > 0

    @property
    def store_down(self) -> bool:
        """True while the store is failing and the dispatcher waits it out."""
        return self._outage is not None

    def run(
        self,
        *,
        until_empty: bool = False,
        max_jobs: int | None = None,
        on_written: Callable[[ShardResult], None] | None = None,
    ) -> DispatchSummary:
        """Dispatch until stopped, until there is no unfinished work (`until_empty`), or until `max_jobs`
        jobs this dispatcher worked on have finished. `PosbiasError` when the store stays unusable for
        `settings.store_outage_seconds`."""
        summary = Tally(owner=self.owner)
        started = time.monotonic()
        last_recover = 0.0
        last_heartbeat = time.monotonic()
        try:
            reclaimed = queue.register(self.db, self.owner, identity=self.identity)
        except STORE_ERRORS as exc:
            raise database.explain(exc, url=self.db.url) from exc
        if reclaimed:
            log.info("reclaimed %d shards of dispatchers on this machine that are gone", reclaimed)
        # Everything alive now (Ray, SQLAlchemy, the caller's plan) lives as long as the loop: out of the
        # collector's sight, a full collection scans only what the loop made. Each shard makes about a
        # thousand objects, and with the full heap in view collections cost about as much as leasing
        # (benchmarks/dispatch.py).
        gc.freeze()
        with self._signals():
            try:
                while True:
                    now = time.monotonic()
                    if self._outage is not None:
                        self._retry_store(summary, on_written=on_written)
                    if self._outage is None:
                        try:
                            if now - last_recover >= self.settings.poll_seconds * 5:
                                queue.reclaim_dead(self.db, machine=self.identity.machine)
                                queue.recover_expired(self.db)
                                last_recover = now
                            if not self.stopping:
                                self._lease_and_submit()
                            if self._should_exit(until_empty=until_empty, max_jobs=max_jobs, summary=summary):
                                break
                            if time.monotonic() - last_heartbeat >= self.settings.heartbeat_seconds:
                                self._heartbeat()
                                last_heartbeat = time.monotonic()
                        except STORE_ERRORS as exc:
                            self._down(exc)
                    if self.stopping and self._drain_expired():
                        break
                    self._collect(summary, timeout=self.settings.poll_seconds, on_written=on_written)
                    if self._outage is None:
                        try:
                            self._check_placement()
                        except STORE_ERRORS as exc:
                            self._down(exc)
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

    # --- the store, and waiting it out ----------------------------------------------------------------

    def _owe(self, write: Callable[[], object], *, shards: int) -> None:
        """Do `write` now, or as soon as the store takes it (keeping the order of writes)."""
        self._owed.append(Owed(write=write, shards=shards))
        if self._outage is None:
            try:
                self._pay()
            except STORE_ERRORS as exc:
                self._down(exc)

    def _pay(self) -> None:
        """Write what is owed, oldest first; stops at the first store error (raised)."""
        while self._owed:
            self._owed[0].write()
            self._owed.pop(0)

    def _down(self, exc: SQLAlchemyError | DriverError) -> None:
        """The store failed: wait it out when it may recover, else stop with its error."""
        error = database.explain(exc, url=self.db.url)
        if not error.transient:
            raise error from exc
        now = time.monotonic()
        if self._outage is None:
            log.warning("the store failed (%s); not leasing until it works again", error)
            self._outage = Outage(since=now, reason=str(error), retry_at=now + OUTAGE_FIRST_PAUSE, pause=1.0)
            return
        pause = min(self._outage.pause * 2, OUTAGE_MAX_PAUSE)
        self._outage = Outage(since=self._outage.since, reason=str(error), retry_at=now + pause, pause=pause)

    def _retry_store(self, summary: Tally, *, on_written: Callable[[ShardResult], None] | None) -> None:
        """When the pause is over, try the store again: what is owed first, then a heartbeat (which also
        shows the store is back). Raises `StoreError` once the outage has lasted too long."""
        outage = self._outage
        assert outage is not None
        now = time.monotonic()
        if now - outage.since > self.settings.store_outage_seconds:
            unwritten = sum(owed.shards for owed in self._owed) + len(self._flights())
            self._owed.clear()
            raise StoreError(
                f"gave up on the store after {now - outage.since:.0f} s: {outage.reason}; the results of "
                f"{unwritten} shards were not written (their leases lapse and a dispatcher reruns them)",
                problem=database.Problem.unreachable,
            )
        if now < outage.retry_at:
            return
        try:
            self._pay()
            self._heartbeat()
        except STORE_ERRORS as exc:
            self._down(exc)
            return
        log.warning("the store works again after %.0f s", now - outage.since)
        self._outage = None
        self.outages += 1

    # --- the loop's steps -----------------------------------------------------------------------------

    def _lease_and_submit(self) -> None:
        slots = self.pools.free_slots()
        open_keys = sorted(key for key, free in slots.items() if free > 0 and key not in self._loading)
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
            try:
                leases += self._lease(limit=1, exclude_model_keys=self.pools.loaded_keys())
            except STORE_ERRORS:
                if leases:  # already ours: give them back before the error stops the loop
                    self._give_back([lease.shard_id for lease in leases])
                raise
        if not leases:
            return

        by_key: dict[str, list[queue.Lease]] = {}
        giveback: list[int] = []
        for lease in leases:
            shard = lease.shard
            key = shard.model_key
            if key not in slots:
                try:
                    keep = queue.pending_model_keys(self.db) | self.pools.busy_keys()
                except STORE_ERRORS:
                    keep = self.pools.busy_keys() | {lease.shard.model_key for lease in leases}
                keep.discard(key)
                placed = self.pools.ensure(shard, keep=keep)
                if placed:
                    self._loading.add(key)
                error = self.pools.pool_error(key)
                if error is not None:
                    self._fail_job(shard.job_id, error)
                    continue
                if not placed:
                    self._blocked = True
                    giveback.append(shard.shard_id)
                    continue
                slots = self.pools.free_slots()
            if slots.get(key, 0) <= 0:
                giveback.append(shard.shard_id)
                continue
            slots[key] -= 1
            by_key.setdefault(key, []).append(lease)
        if giveback:
            self._give_back(giveback)
        started = time.monotonic()
        for group in by_key.values():
            flights = {lease.shard_id: InFlight(lease=lease, started=started) for lease in group}
            for call in self.pools.submit([lease.shard for lease in group]):
                self._in_flight[call.ref] = [flights[shard.shard_id] for shard in call.shards]
            self._touched_jobs.update(lease.shard.job_id for lease in group)

    def _give_back(self, shard_ids: list[int], *, reason: str | None = None) -> None:
        """Release `shard_ids` to the queue, charging nothing, as soon as the store takes it."""
        if shard_ids:
            self._owe(lambda: queue.release(self.db, shard_ids, owner=self.owner, reason=reason), shards=0)

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
        if event.report is not None or event.error is not None or event.retry is not None:
            self._loading.discard(event.model_key)
        if event.report is not None:
            log.info("loaded %s in %.1fs", event.report.model.name, event.report.seconds)
            seconds = self._load_seconds.get(event.model_key, 0.0)
            self._load_seconds[event.model_key] = seconds + event.report.seconds
        if event.retry is not None:
            # A refusal a later attempt may not meet (GPU memory still held): the pool is gone, its shards
            # go back to the queue with the reason, and no job fails for it.
            self._give_back_model(event.model_key, reason=event.retry)
            self._blocked = False
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
                    self._fail(shard.shard_id, one_line(exc, typed=True))
                summary.shards_failed += 1
            return
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            self.pools.done(ref, actor_failed=True)
            self._blocked = False
            for flight in flights:
                self._fail(flight.lease.shard.shard_id, f"worker died: {one_line(exc, typed=True)}")
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
                    self._fail_job(job_id, outcome.error)
                else:
                    self._fail(outcome.shard_id, outcome.error)
                summary.shards_failed += 1
            else:
                results.append(outcome)
        if results:
            self._owe(lambda: self._complete(results, summary, on_written=on_written), shards=len(results))

    def _complete(
        self, results: list[ShardResult], summary: Tally, *, on_written: Callable[[ShardResult], None] | None
    ) -> None:
        for result, written in zip(results, queue.complete(self.db, results, owner=self.owner), strict=True):
            if written.written:
                summary.shards_written += 1
                summary.trials_done += len(result.trials)
                if on_written is not None:
                    on_written(result)
            else:
                summary.shards_discarded += 1
                log.info("shard %s discarded: %s", result.shard_id, written.reason)

    def _fail(self, shard_id: int, error: str) -> None:
        self._owe(lambda: queue.fail(self.db, shard_id, owner=self.owner, error=error), shards=1)

    def _fail_job(self, job_id: int, error: str) -> None:
        self._owe(lambda: jobs.fail(self.db, job_id, error=error), shards=0)

    def _check_placement(self) -> None:
        """Once a poll interval while some model waits for a node: make room by releasing models with no work
        left, and give back the shards of actors that waited past the placement timeout."""
        now = time.monotonic()
        if now - self._last_placement_check < self.settings.poll_seconds or not self.pools.waiting_keys():
            return
        self._last_placement_check = now
        self.pools.release_idle(keep=queue.pending_model_keys(self.db) | self.pools.busy_keys())
        for stuck in self.pools.unplaced():
            flights = [flight for ref in stuck.refs for flight in self._in_flight.pop(ref, [])]
            self._give_back([flight.lease.shard.shard_id for flight in flights], reason=stuck.reason)
            self._blocked = False

    def _give_back_model(self, model_key: str, *, reason: str) -> None:
        """Return the in-flight shards of `model_key` to the queue with `reason`, without an attempt."""
        ids = []
        for ref, flights in list(self._in_flight.items()):
            if flights and flights[0].lease.shard.model_key == model_key:
                ids += [flight.lease.shard.shard_id for flight in self._in_flight.pop(ref)]
        self._give_back(ids, reason=reason)

    def _flights(self) -> list[InFlight]:
        return [flight for call in self._in_flight.values() for flight in call]

    def _heartbeat(self) -> None:
        ids = [flight.lease.shard.shard_id for flight in self._flights()]
        queue.heartbeat(self.db, ids, owner=self.owner, lease_seconds=self.settings.lease_seconds)

    def _should_exit(self, *, until_empty: bool, max_jobs: int | None, summary: Tally) -> bool:
        if self._in_flight or self._owed:
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
        """On the way out: write what is owed, give back what is in flight, and deregister. With the store
        down none of it can be done; the leases then lapse."""
        ids = [flight.lease.shard.shard_id for flight in self._flights()]
        self._in_flight.clear()
        try:
            if self._outage is None:
                self._pay()
            if ids:
                queue.release(self.db, ids, owner=self.owner)
            queue.deregister(self.db, self.owner)
        except STORE_ERRORS as exc:
            # The caller reports why the store failed; these leases lapse on their own.
            log.info("could not release %d shards: %s", len(ids), database.explain(exc, url=self.db.url))
        self._owed.clear()

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
