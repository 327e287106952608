"""Lease owners as processes: who this dispatcher is, its registration in the store, whether a registered
one is still alive, and reclaiming the leases of one that is not.

A dispatcher registers its host, its process id and the process's start time (`register`) and heartbeats
its registration with its leases (`queue.heartbeat`). Another dispatcher on the same machine can then tell at
once that it died (its pid is gone, or now belongs to a process that started later) and reclaim its leases
without waiting for them to lapse (`reclaim_dead`). "The same machine" is the same kernel boot and the same
PID namespace: containers on one host each have their own namespace, and a pid means nothing across them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import delete, select

from posbias.schemas import PosbiasError
from posbias.service.store import Database, Dispatcher, now_utc
from posbias.service.work import queue


@dataclass(frozen=True)
class Identity:
    """Where a process runs and which process it is."""

    host: str
    """The host name (for people: `posbias status` shows owners by it)."""
    machine: str
    """The kernel boot and PID namespace the pid belongs to; empty when this system cannot say."""
    pid: int
    started: int | None
    """The process's start time in clock ticks since boot (Linux), so a reused pid is told apart."""


def this_process() -> Identity:
    """This process's identity."""
    pid = os.getpid()
    return Identity(host=socket.gethostname()[:255], machine=_machine(), pid=pid, started=_started(pid))


def alive(identity: Identity) -> bool | None:
    """True while the process `identity` names runs; False once it is visibly gone; None when this process
    cannot tell (another machine, or a system without /proc)."""
    here = _machine()
    if not here or identity.machine != here:
        return None
    started = _started(identity.pid)
    if started is None:
        return False  # no such process
    return identity.started is None or started == identity.started


def register(db: Database, owner: str, *, identity: Identity) -> int:
    """Record that `owner` runs as the process `identity`, first reclaiming the leases of dispatchers on
    this machine whose process is gone (`reclaim_dead`). Returns how many shards were reclaimed.

    `PosbiasError` when another live process on this machine is registered under the same name (two
    dispatchers with one POSBIAS_WORKER_ID would take each other's leases for their own).
    """
    reclaimed = reclaim_dead(db, machine=identity.machine)
    now = now_utc()
    with db.write() as session:
        row = session.get(Dispatcher, owner, with_for_update=True)
        if row is not None:
            other = _identity(row)
            if other != identity and alive(other):
                raise PosbiasError(
                    f"another dispatcher (pid {row.pid} on {row.host}) is running as {owner!r}: give this "
                    "one another POSBIAS_WORKER_ID, or leave it unset"
                )
            session.delete(row)
            session.flush()
        session.add(
            Dispatcher(
                owner=owner,
                host=identity.host,
                machine=identity.machine,
                pid=identity.pid,
                process_started=identity.started,
                started_at=now,
                heartbeat_at=now,
            )
        )
    return reclaimed


def deregister(db: Database, owner: str) -> None:
    """Forget `owner` (it is exiting and has released its leases)."""
    with db.write() as session:
        session.execute(delete(Dispatcher).where(Dispatcher.owner == owner))


def reclaim_dead(db: Database, *, machine: str) -> int:
    """Put the leases of dispatchers registered on `machine` whose process is gone back in the queue (a
    lapse each, no attempt), and forget those dispatchers. Returns how many shards were reclaimed.

    Only this machine's dispatchers can be seen to be dead; elsewhere a lease lapses after its
    `lease_seconds` (`queue.recover_expired`).
    """
    if not machine:
        return 0
    with db.read() as session:
        rows = list(session.scalars(select(Dispatcher).where(Dispatcher.machine == machine)))
    dead = {row.owner: row for row in rows if alive(_identity(row)) is False}
    if not dead:
        return 0
    whys = {
        owner: f"its dispatcher {row.owner} (pid {row.pid} on {row.host}) exited while holding it"
        for owner, row in dead.items()
    }
    now = now_utc()
    with db.write() as session:
        reclaimed = queue.lapse_leases_of(session, whys, now=now)
        session.execute(delete(Dispatcher).where(Dispatcher.owner.in_(sorted(dead))))
    return reclaimed


def _identity(row: Dispatcher) -> Identity:
    return Identity(host=row.host, machine=row.machine, pid=row.pid, started=row.process_started)


def _machine() -> str:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"[:255]


def _started(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22, counted after the command name, which is in parentheses and may hold spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    if fields[:1] == ["Z"]:
        return None  # a zombie has exited; only its parent has not collected it yet
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None
