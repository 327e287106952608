"""Lease owners as processes: who this dispatcher is, and whether a registered one is still alive.

A dispatcher registers its host, its process id and the process's start time (`queue.register`). Another
dispatcher on the same machine can then tell at once that it died (its pid is gone, or now belongs to a
process that started later) and reclaim its leases without waiting for them to lapse. "The same machine"
is the same kernel boot and the same PID namespace: containers on one host each have their own namespace,
and a pid means nothing across them.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path


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
