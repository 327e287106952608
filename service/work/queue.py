"""The SQL job queue: a shard's whole life, and the only module that assigns a shard's status.

A shard moves `queued -> leased -> done`; a failed attempt or a lapsed lease sends it back to `queued`, or
to `dead` once it has used its budget; cancelling its job makes it `cancelled`. Each transition that changes
what a job has left to run settles the job's status in the same transaction (`job_status.settle`).

Two budgets, because they count different things. `attempts` count what the shard did: its engine call
failed, or its worker died running it (`fail`); after `max_attempts` the shard is dead. `lapses` count what
happened to its dispatcher: the lease lapsed, or its dispatcher's process is gone (`recover_expired`,
`lapse_leases_of` for `owners.reclaim_dead`); a preempted node or an OOM-killed driver is not the shard's
fault, so only `MAX_LAPSES`, a much larger budget, catches a shard that keeps killing whatever runs it.
`waits` count what the cluster did not do: its model's actor waited past the placement timeout, or was
refused GPU memory (`wait_again`); the dispatcher's `POSBIAS_PLACEMENT_WAITS` bounds them, so a job that can
never be placed fails with the reason instead of waiting forever.

Claims are row locks: PostgreSQL leases with `SELECT ... FOR UPDATE SKIP LOCKED`, so several dispatchers share
one queue without waiting on each other; SQLite serialises writers with `BEGIN IMMEDIATE` (one host). Every
transaction that touches both locks shards before their job, in id order, so two of them cannot deadlock.
Only the lease holder may finish a shard (`complete`) or fail it (`fail`): one check, `_lease_problem`.
Lease expiry uses the dispatchers' clocks (UTC), which must agree to well within `lease_seconds`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from posbias.schemas import JobSpec, Plan, ShardResult, ShardSpec, ShardStatus
from posbias.service.store import Database, Dispatcher, Shard, now_utc, rows
from posbias.service.work import job_status, shards
from posbias.service.work.job_status import ACTIVE

MAX_LAPSES = 30
"""Leases of one shard that may lapse (its dispatchers died) before it is dead: ten times the default
`max_attempts`, so that dispatchers on preemptible nodes can die again and again without a shard being lost,
while a shard that kills every dispatcher that runs it still ends."""


@dataclass(frozen=True)
class Lease:
    """A leased shard: the self-contained work, and which attempt this is."""

    shard: ShardSpec
    attempt: int
    """The attempt this lease is: 1 + the failed attempts so far; a shard is dead after `max_attempts`
    failed attempts (lapsed leases are not attempts)."""
    expires_at: datetime
    """When the lease lapses without a heartbeat."""

    @property
    def shard_id(self) -> int:
        """The leased shard's id."""
        return self.shard.shard_id


@dataclass(frozen=True)
class WriteOutcome:
    """What `complete` did with one shard's result."""

    written: bool
    reason: str | None = None
    """Why the result was discarded (nothing was written), e.g. the lease was lost or the job cancelled."""
    results: int = 0
    """Result rows written."""


# --- entering the queue -------------------------------------------------------------------------------


def enqueue(session: Session, *, job_id: int, spec: JobSpec, plan: Plan) -> dict[int, int]:
    """Insert a new job's planned shards, queued, in the caller's transaction, each with the model key of
    its variant's engine. Returns shard id by index."""
    keys = {variant.name: spec.model_key(variant) for variant in spec.runs}
    session.execute(
        insert(Shard),
        [
            {
                "job_id": job_id,
                "index": shard.index,
                "status": ShardStatus.queued,
                "attempts": 0,
                "max_attempts": spec.max_attempts,
                "trial_count": len(shard.trial_indices),
                "model_key": keys[shard.variant],
                "priority": spec.priority,
                "variant": shard.variant,
            }
            for shard in plan.shards
        ],
    )
    return dict(session.execute(select(Shard.index, Shard.id).where(Shard.job_id == job_id)).all())


# --- leasing ------------------------------------------------------------------------------------------


def lease(
    db: Database,
    *,
    owner: str,
    limit: int,
    lease_seconds: float,
    prefer_model_keys: Collection[str] = (),
    job_ids: Collection[int] | None = None,
    model_keys: Collection[str] | None = None,
    exclude_model_keys: Collection[str] = (),
) -> list[Lease]:
    """Lease up to `limit` queued shards for `owner`, for `lease_seconds`.

    Order: shards of `prefer_model_keys` (models the caller has loaded) first, then higher priority, then
    older jobs, then shard order. `job_ids` restricts leasing to those jobs, `model_keys` to those models,
    and `exclude_model_keys` leaves those models out. A lease marks its job running; it charges no attempt
    (only a failure does, `fail`).
    """
    if limit <= 0 or (model_keys is not None and not model_keys):
        return []
    now = now_utc()
    expires = now + timedelta(seconds=lease_seconds)
    prefer = sorted(set(prefer_model_keys))
    with db.write() as session:
        base = [Shard.status == ShardStatus.queued]
        if job_ids is not None:
            base.append(Shard.job_id.in_(sorted(set(job_ids))))
        if model_keys is not None:
            base.append(Shard.model_key.in_(sorted(set(model_keys))))
        if exclude_model_keys:
            base.append(Shard.model_key.not_in(sorted(set(exclude_model_keys))))
        chosen: list[int] = []
        if prefer:
            chosen += _claimable(session, [*base, Shard.model_key.in_(prefer)], limit=limit)
        if len(chosen) < limit:
            others = [*base, Shard.model_key.not_in(prefer)] if prefer else base
            chosen += _claimable(session, others, limit=limit - len(chosen))
        if not chosen:
            return []
        leased = session.execute(
            update(Shard)
            .where(Shard.id.in_(chosen), Shard.status == ShardStatus.queued)
            .values(
                status=ShardStatus.leased,
                lease_owner=owner,
                leased_at=now,
                lease_expires_at=expires,
            )
            .returning(Shard.id, Shard.job_id, Shard.attempts)
            .execution_options(synchronize_session=False)
        ).all()
        job_status.mark_started(session, {row.job_id for row in leased}, now=now)
    attempts = {row.id: row.attempts + 1 for row in leased}
    order = [shard_id for shard_id in chosen if shard_id in attempts]
    specs = shards.from_store(db, order)
    return [Lease(shard=specs[i], attempt=attempts[i], expires_at=expires) for i in order]


def _claimable(session: Session, where: list[Any], *, limit: int) -> list[int]:
    query = (
        select(Shard.id)
        .where(*where)
        .order_by(Shard.priority.desc(), Shard.job_id, Shard.index)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(query))


def heartbeat(db: Database, shard_ids: Iterable[int], *, owner: str, lease_seconds: float) -> set[int]:
    """Extend `owner`'s leases on `shard_ids` by `lease_seconds` from now, and its registration (see
    `owners.register`); return the ids still held (a shard missing from the answer was recovered, cancelled or
    finished: stop working on it)."""
    ids = sorted(set(shard_ids))
    now = now_utc()
    expires = now + timedelta(seconds=lease_seconds)
    with db.write() as session:
        session.execute(
            update(Dispatcher)
            .where(Dispatcher.owner == owner)
            .values(heartbeat_at=now)
            .execution_options(synchronize_session=False)
        )
        if not ids:
            return set()
        held = _lock_held(session, ids, owner=owner)
        if held:
            session.execute(
                update(Shard)
                .where(Shard.id.in_(held))
                .values(lease_expires_at=expires)
                .execution_options(synchronize_session=False)
            )
    return set(held)


def _lock_held(session: Session, ids: Sequence[int], *, owner: str) -> list[int]:
    """Lock, in id order, those of `ids` that `owner` holds."""
    return [shard.id for shard in _lock(session, ids) if _lease_problem(shard, owner=owner) is None]


def _lock(session: Session, ids: Sequence[int]) -> list[Shard]:
    """The shards `ids` (those that exist), locked in id order and read afresh."""
    return list(
        session.scalars(
            select(Shard)
            .where(Shard.id.in_(ids))
            .order_by(Shard.id)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
    )


def _lease_problem(shard: Shard, *, owner: str) -> str | None:
    """Why `owner` may not finish, fail or extend `shard`; None when it holds the shard's lease."""
    if shard.status is ShardStatus.leased and shard.lease_owner == owner:
        return None
    if shard.status is ShardStatus.cancelled:
        return f"shard {shard.id} was cancelled with its job"
    if shard.status is ShardStatus.done:
        return f"shard {shard.id} is already done"
    holder = f" by {shard.lease_owner}" if shard.status is ShardStatus.leased else ""
    return f"the lease on shard {shard.id} was lost: it is {shard.status}{holder}"


# --- ending an attempt --------------------------------------------------------------------------------


def complete(db: Database, results: Sequence[ShardResult], *, owner: str) -> list[WriteOutcome]:
    """Write the results of shards `owner` holds and mark those shards done, in one transaction; one
    outcome per result, in order.

    A result whose shard `owner` no longer holds (lease lost, shard cancelled or already done) is discarded,
    and its outcome says why, so a re-delivered result changes nothing. Several shards in one transaction (the
    shards of one engine call) save each a commit and the statements about its job, about half the time of a
    shard's write (benchmarks/dispatch.py). Raises `ValueError` when a result does not match its shard's
    trials (a worker bug); then nothing is written.
    """
    now = now_utc()
    outcomes: list[WriteOutcome | None] = [None] * len(results)
    with db.write() as session:
        locked = {shard.id: shard for shard in _lock(session, sorted({r.shard_id for r in results}))}
        accepted: dict[int, ShardResult] = {}
        for number, result in enumerate(results):
            shard = locked.get(result.shard_id)
            if shard is None:
                reason: str | None = f"shard {result.shard_id} does not exist"
            elif shard.job_id != result.job_id:
                reason = f"shard {shard.id} belongs to job {shard.job_id}, not job {result.job_id}"
            elif result.shard_id in accepted:
                reason = f"shard {result.shard_id} is already done"
            else:
                reason = _lease_problem(shard, owner=owner)
            if reason is not None:
                outcomes[number] = WriteOutcome(written=False, reason=reason)
            else:
                accepted[result.shard_id] = result
        if accepted:
            written = rows.write_results(session, accepted)
            # Locked after the rows went in: the job's row lock serialises only the curve increments of
            # concurrent writers of one job, not their inserts.
            job_rows = {
                job_id: job_status.locked_job(session, job_id)
                for job_id in sorted({r.job_id for r in accepted.values()})
            }
            rows.add_to_jobs(session, written, jobs=job_rows, now=now)
            for shard_id in accepted:
                shard = locked[shard_id]
                shard.status = ShardStatus.done
                shard.finished_at = now
                shard.lease_expires_at = None
            session.flush()
            job_status.settle(session, {r.job_id for r in accepted.values()}, now=now)
    return [
        outcome or WriteOutcome(written=True, results=len(result.answers))
        for outcome, result in zip(outcomes, results, strict=True)
    ]


def fail(db: Database, shard_id: int, *, owner: str, error: str) -> ShardStatus | None:
    """Record a failed attempt by the lease holder (the shard ran and failed, or its worker died running
    it): it goes back to the queue, or is dead once it has used `max_attempts` (its job then fails when
    nothing else is left). Returns the shard's new status, or None when `owner` does not hold it (nothing
    changes)."""
    now = now_utc()
    with db.write() as session:
        found = _lock(session, [shard_id])
        if not found or _lease_problem(found[0], owner=owner) is not None:
            return None
        shard = found[0]
        shard.attempts += 1
        _end_lease(shard, error=error, dead=shard.attempts >= shard.max_attempts, now=now)
        job_status.settle(session, [shard.job_id], now=now)
        return shard.status


def _end_lease(shard: Shard, *, error: str, dead: bool, now: datetime) -> None:
    shard.last_error = error
    shard.lease_owner = None
    shard.lease_expires_at = None
    if dead:
        shard.status = ShardStatus.dead
        shard.finished_at = now
    else:
        shard.status = ShardStatus.queued


def _lapse(shard: Shard, *, why: str, now: datetime) -> None:
    """A lease that ended without a result, through no doing of the shard's: back to the queue with no
    attempt charged, unless the shard has used `MAX_LAPSES`."""
    shard.lapses += 1
    error = f"{why} (lease lapse {shard.lapses} of {MAX_LAPSES}; {shard.attempts} failed attempts)"
    _end_lease(shard, error=error, dead=shard.lapses >= MAX_LAPSES, now=now)


def release(db: Database, shard_ids: Iterable[int], *, owner: str, reason: str | None = None) -> int:
    """Give `owner`'s leases on `shard_ids` back to the queue, charging nothing (a graceful shutdown, or a
    shard the caller cannot run now); `reason`, when given, is kept as the shard's last error (e.g. no node
    took its model's actor). Returns how many were released."""
    ids = sorted(set(shard_ids))
    if not ids:
        return 0
    with db.write() as session:
        held = _lock_held(session, ids, owner=owner)
        if held:
            session.execute(
                update(Shard)
                .where(Shard.id.in_(held))
                .values(
                    status=ShardStatus.queued,
                    lease_owner=None,
                    lease_expires_at=None,
                    **({"last_error": reason} if reason is not None else {}),
                )
                .execution_options(synchronize_session=False)
            )
    return len(held)


def wait_again(db: Database, shard_ids: Iterable[int], *, owner: str, reason: str, budget: int) -> set[int]:
    """Give `owner`'s leases on `shard_ids` back to the queue with `reason` (their model's actor waited past
    the placement timeout, or was refused GPU memory), charging each a wait: no attempt, since the shard
    did nothing, but bounded, so a job that can never be placed does not wait forever. Returns the ids of
    the jobs with a shard that has now waited `budget` times: the caller fails each whole job with the
    reason (`jobs.fail`), rather than leave its other shards to wait out their own budgets."""
    ids = sorted(set(shard_ids))
    if not ids:
        return set()
    now = now_utc()
    spent: set[int] = set()
    with db.write() as session:
        held = [shard for shard in _lock(session, ids) if _lease_problem(shard, owner=owner) is None]
        for shard in held:
            shard.waits += 1
            error = f"{reason} (wait {shard.waits} of {budget})"
            _end_lease(shard, error=error, dead=False, now=now)
            if shard.waits >= budget:
                spent.add(shard.job_id)
    return spent


def recover_expired(db: Database, *, now: datetime | None = None) -> int:
    """Send shards whose lease has lapsed (`now` defaults to the clock) back to the queue, with a lapse
    counted and no attempt charged (dead only after `MAX_LAPSES`); the error says whose lease expired.
    Returns how many were recovered."""
    now = now or now_utc()
    with db.write() as session:
        expired = list(
            session.scalars(
                select(Shard)
                .where(Shard.status == ShardStatus.leased, Shard.lease_expires_at < now)
                .order_by(Shard.id)
                .with_for_update(skip_locked=True)
                .execution_options(populate_existing=True)
            )
        )
        for shard in expired:
            assert shard.lease_expires_at is not None
            why = (
                f"lease expired at {shard.lease_expires_at.isoformat(timespec='seconds')} (owner "
                f"{shard.lease_owner})"
            )
            _lapse(shard, why=why, now=now)
        job_status.settle(session, [shard.job_id for shard in expired], now=now)
    return len(expired)


# --- leases of dispatchers that are gone --------------------------------------------------------------


def lapse_leases_of(session: Session, whys: Mapping[str, str], *, now: datetime) -> int:
    """In the caller's transaction, put the shards leased by the owners in `whys` back in the queue (a
    lapse each, no attempt charged), each with its owner's `why` as its error, and settle their jobs.
    Shards another transaction has locked are left for later. Returns how many were lapsed."""
    held = list(
        session.scalars(
            select(Shard)
            .where(Shard.status == ShardStatus.leased, Shard.lease_owner.in_(sorted(whys)))
            .order_by(Shard.id)
            .with_for_update(skip_locked=True)
            .execution_options(populate_existing=True)
        )
    )
    for shard in held:
        _lapse(shard, why=whys[str(shard.lease_owner)], now=now)
    job_status.settle(session, [shard.job_id for shard in held], now=now)
    return len(held)


# --- a job's shards together (in the transaction of a job-level operation) ----------------------------


def lock_job_shards(session: Session, job_id: int, statuses: Sequence[ShardStatus]) -> list[int]:
    """Lock, in id order, the shards of `job_id` in `statuses`; returns their ids. Call before locking the
    job itself (shards before jobs, the queue's locking order)."""
    return list(
        session.scalars(
            select(Shard.id)
            .where(Shard.job_id == job_id, Shard.status.in_(statuses))
            .order_by(Shard.id)
            .with_for_update()
        )
    )


def cancel(session: Session, shard_ids: Sequence[int], *, now: datetime) -> None:
    """Cancel locked shards (their job was cancelled): a late result for one is discarded."""
    if shard_ids:
        session.execute(
            update(Shard)
            .where(Shard.id.in_(shard_ids))
            .values(status=ShardStatus.cancelled, finished_at=now, lease_expires_at=None)
            .execution_options(synchronize_session=False)
        )


def requeue(session: Session, shard_ids: Sequence[int]) -> None:
    """Put locked dead shards back in the queue with fresh attempts, lapses and waits (their last error is
    kept)."""
    if shard_ids:
        session.execute(
            update(Shard)
            .where(Shard.id.in_(shard_ids))
            .values(status=ShardStatus.queued, attempts=0, lapses=0, waits=0, finished_at=None)
            .execution_options(synchronize_session=False)
        )


def kill(session: Session, shard_ids: Sequence[int], *, error: str, now: datetime) -> None:
    """Make locked queued or leased shards dead with `error`, without running them (their job cannot run
    at all, e.g. its model does not load); `posbias retry` can requeue them."""
    if shard_ids:
        session.execute(
            update(Shard)
            .where(Shard.id.in_(shard_ids))
            .values(
                status=ShardStatus.dead,
                last_error=error,
                finished_at=now,
                lease_owner=None,
                lease_expires_at=None,
            )
            .execution_options(synchronize_session=False)
        )


# --- reading ------------------------------------------------------------------------------------------


def pending_model_keys(db: Database, *, job_ids: Collection[int] | None = None) -> set[str]:
    """Model keys with queued or leased shards (of `job_ids`, when given): what the dispatcher must keep
    or load."""
    query = select(Shard.model_key).where(Shard.status.in_(ACTIVE)).distinct()
    if job_ids is not None:
        query = query.where(Shard.job_id.in_(sorted(set(job_ids))))
    with db.read() as session:
        return set(session.scalars(query))
