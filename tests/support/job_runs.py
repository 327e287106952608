"""Running a submitted job to the end in tests: on the dispatcher in this process (`dispatch`), as the
`posbias worker` command users run (`worker_process`, then `summary_of`), or with no engine at all, through
the queue with results the test builds (`answer_every_shard`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posbias.schemas import DispatchSummary, ShardResult
from posbias.service.dispatch.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.work import queue


def dispatch(db: Database, settings: Settings, **run: Any) -> DispatchSummary:
    """Run a dispatcher on `db` until there is no unfinished work (`Dispatcher.run` takes `run`), then close
    it."""
    dispatcher = Dispatcher(db, settings=settings)
    try:
        return dispatcher.run(until_empty=True, **run)
    finally:
        dispatcher.close()


def worker_process(
    url: str,
    folder: Path,
    *args: str,
    ray_address: str = "local",
    lease_seconds: int = 4,
    new_session: bool = True,
    niceness: int = 0,
    **env: str,
) -> subprocess.Popen[str]:
    """`posbias worker --ray-address RAY_ADDRESS --json ARGS` on the store at `url`, with short polls and
    heartbeats, leases of `lease_seconds` and its cache in `folder`; `env` adds to its environment.
    `new_session` starts it in a process group of its own, so that a test can kill the driver and the Ray it
    started together (`os.killpg`). `niceness` starts it as `nice -n NICENESS posbias worker` would."""
    environment = {
        **os.environ,
        "POSBIAS_DATABASE_URL": url,
        "POSBIAS_CACHE_DIR": str(folder / "cache"),
        "POSBIAS_POLL_SECONDS": "0.05",
        "POSBIAS_HEARTBEAT_SECONDS": "1",
        "POSBIAS_LEASE_SECONDS": str(lease_seconds),
        "RAY_ADDRESS": "",
        **env,
    }
    nice = ["nice", "-n", str(niceness)] if niceness else []
    return subprocess.Popen(
        [*nice, sys.executable, "-m", "posbias.cli", "worker", "--ray-address", ray_address, "--json", *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )


def summary_of(process: subprocess.Popen[str], *, timeout: float = 240) -> dict[str, Any]:
    """The JSON summary a `posbias worker --json` process prints once it exits, which it must do cleanly
    within `timeout` seconds."""
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 0, stderr[-3000:]
    data: dict[str, Any] = json.loads(stdout)
    return data


def answer_every_shard(db: Database, job_id: int, answer: Callable[..., ShardResult], **how: Any) -> None:
    """Lease every shard of `job_id` and write `answer(shard, **how)` for each, one at a time through the
    queue as a worker would; each must be written."""
    while leases := queue.lease(db, owner="test", limit=100, lease_seconds=60, job_ids=[job_id]):
        for lease in leases:
            assert queue.complete(db, [answer(lease.shard, **how)], owner="test")[0].written
