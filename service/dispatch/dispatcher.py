"""The dispatcher: a Ray driver that feeds shards from the SQL queue to model pools and writes the results.

One loop, no threads: recover expired leases (and those of dispatchers on this machine whose process is gone),
lease shards (preferring models already loaded), send them to actors (several shards to one engine call, see
`service/dispatch/pools.py`), wait on Ray, write each result through `queue.complete`, heartbeat what is in
flight (`service/dispatch/writeback.py`). On SIGTERM or Ctrl-C it stops leasing, lets in-flight shards finish
(up to a grace period), releases the rest, and exits. Several dispatchers can share one PostgreSQL queue:
leases make every shard one dispatcher's at a time, and the store writes a shard only while its lease is held.

A store that fails is waited out (`service/dispatch/writeback.py`): the dispatcher leases nothing until the
store takes a write again, and exits with one line if it stays unusable for `store_outage_seconds`.
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
from types import FrameType
from typing import Any

import ray

from posbias.schemas import DispatchSummary, ShardResult
from posbias.service.dispatch import owners
from posbias.service.dispatch.pools import ModelPools
from posbias.service.dispatch.writeback import InFlight, Tally, WriteBack
from posbias.service.settings import Settings
from posbias.service.store import STORE_ERRORS, Database, store_errors
from posbias.service.work import jobs, queue

log = logging.getLogger(__name__)


def default_owner(settings: Settings) -> str:
    """This dispatcher's lease owner name: unique per process even on one host."""
    return settings.worker_id or f"{socket.gethostname()[:150]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


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
        self.writes = WriteBack(db, owner=self.owner, settings=settings, pools=self.pools)
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
        return self.writes.store_down

    @property
    def outages(self) -> int:
        """Times the store failed and came back during this dispatcher's runs."""
        return self.writes.outages

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
        tally = Tally(owner=self.owner)
        started = time.monotonic()
        last_recover = 0.0
        last_heartbeat = time.monotonic()
        try:
            reclaimed = owners.register(self.db, self.owner, identity=self.identity)
        except STORE_ERRORS as exc:
            raise store_errors.explain(exc, url=self.db.url) from exc
        if reclaimed:
            log.info("reclaimed %d shards of dispatchers on this machine that are gone", reclaimed)
        # Everything alive now (Ray, SQLAlchemy, the caller's plan) lives as long as the loop: out of the
        # collector's sight, a full collection scans only what the loop made. Each shard makes about a
        # thousand objects, and with the full heap in view collections cost about as much as leasing
        # (benchmarks/dispatch.py).
        gc.freeze()
        with _stop_on_signals(self.request_stop):
            try:
                while True:
                    now = time.monotonic()
                    if self.writes.store_down:
                        self.writes.retry_store()
                    if not self.writes.store_down:
                        try:
                            if now - last_recover >= self.settings.poll_seconds * 5:
                                owners.reclaim_dead(self.db, machine=self.identity.machine)
                                queue.recover_expired(self.db)
                                last_recover = now
                            if not self.stopping:
                                self._lease_and_submit()
                            if self._should_exit(until_empty=until_empty, max_jobs=max_jobs, tally=tally):
                                break
                            if time.monotonic() - last_heartbeat >= self.settings.heartbeat_seconds:
                                self.writes.heartbeat()
                                last_heartbeat = time.monotonic()
                        except STORE_ERRORS as exc:
                            self.writes.store_failed(exc)
                    if self.stopping and self._drain_expired():
                        break
                    self._collect(tally, timeout=self.settings.poll_seconds, on_written=on_written)
                    if not self.writes.store_down:
                        try:
                            self._check_placement()
                        except STORE_ERRORS as exc:
                            self.writes.store_failed(exc)
            finally:
                self.writes.leave()
                tally.interrupted = self.stopping
                tally.loads = dict(self.pools.loads)
                tally.load_seconds = dict(self._load_seconds)
                self._load_seconds.clear()
                tally.seconds = time.monotonic() - started
                gc.unfreeze()
        return tally.summary()

    def close(self) -> None:
        """Kill the actors this dispatcher started."""
        self.pools.shutdown()

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
                    self.writes.give_back([lease.shard_id for lease in leases])
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
                    self.writes.fail_job(shard.job_id, error)
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
            self.writes.give_back(giveback)
        started = time.monotonic()
        for group in by_key.values():
            flights = {lease.shard_id: InFlight(lease=lease, started=started) for lease in group}
            for call in self.pools.submit([lease.shard for lease in group]):
                self.writes.sent(call.ref, [flights[shard.shard_id] for shard in call.shards])
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
        self, tally: Tally, *, timeout: float, on_written: Callable[[ShardResult], None] | None
    ) -> None:
        refs = self.writes.refs() + self.pools.load_refs()
        if not refs:
            time.sleep(timeout)
            return
        ready, _ = ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            if self.writes.holds(ref):
                self._blocked = False
                self.writes.finish(ref, tally, on_written=on_written)
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
            self.writes.give_back_model(event.model_key, reason=event.retry)
            self._blocked = False
        if event.error is not None:
            # The model cannot load: every job waiting on it fails with the loader's error, once, and the
            # dispatcher carries on with other models.
            for flight in self.writes.flights():
                if flight.lease.shard.model_key == event.model_key:
                    self.writes.fail_job(flight.lease.shard.job_id, event.error)
            self.pools.release(event.model_key)
            self._blocked = False

    def _check_placement(self) -> None:
        """Once a poll interval while some model waits for a node: make room by releasing models with no work
        left, and give back the shards of actors that waited past the placement timeout."""
        now = time.monotonic()
        if now - self._last_placement_check < self.settings.poll_seconds or not self.pools.waiting_keys():
            return
        self._last_placement_check = now
        self.pools.release_idle(keep=queue.pending_model_keys(self.db) | self.pools.busy_keys())
        for stuck in self.pools.unplaced():
            self.writes.give_back_calls(stuck.refs, reason=stuck.reason)
            self._blocked = False

    def _should_exit(self, *, until_empty: bool, max_jobs: int | None, tally: Tally) -> bool:
        if self.writes.busy:
            return False
        if self.stopping:
            return True
        if self.job_ids is not None and all(jobs.finished(self.db, j) for j in self.job_ids):
            return True
        if max_jobs is not None:
            finished = [j for j in sorted(self._touched_jobs) if jobs.finished(self.db, j)]
            tally.jobs_finished = finished
            if len(finished) >= max_jobs:
                return True
        return until_empty and not queue.pending_model_keys(self.db, job_ids=self.job_ids)

    def _drain_expired(self) -> bool:
        assert self._stopping_since is not None
        return self._stop_requests > 1 or time.monotonic() - self._stopping_since > self.drain_seconds


@contextmanager
def _stop_on_signals(request_stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM call `request_stop` (in the main thread only: elsewhere the
    caller stops the dispatcher with `request_stop()` itself)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        log.warning("received %s: finishing in-flight shards", signal.Signals(signum).name)
        request_stop()

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
