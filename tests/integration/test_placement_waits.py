"""A job that can never be placed does not wait forever, on the session's local Ray (no GPUs): on a cluster
known to be fixed (compose's one machine) it fails at once naming the largest node; on one that might grow,
each wait past the placement timeout is charged, and past `POSBIAS_PLACEMENT_WAITS` the job fails with what
was waited for, and an `--until-empty` dispatcher exits."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.job_runs import dispatch

from posbias.schemas import Submitted
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.store.tables import JobStatus
from posbias.service.work import jobs

pytestmark = pytest.mark.usefixtures("ray_session")

GPU_FAKE = {"engine": {"name": "fake"}, "fake": {"as_gpu": True}, "batch_sizes": (2,), "iterations": 2}


def test_on_a_fixed_cluster_a_gpu_job_with_no_gpu_there_fails_at_once(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(db, model="fake/gpu-on-fixed", **GPU_FAKE).job_id
    # As compose's dispatcher sees its head: through an address, with POSBIAS_FIXED_CLUSTER set.
    summary = dispatch(db, fast_settings(db.url, ray_address="auto", fixed_cluster=True))

    failed = jobs.get(db, job)
    assert failed.status is JobStatus.failed and failed.error is not None and "\n" not in failed.error
    assert "needs 1 GPUs on one node" in failed.error and "the largest node of this cluster has no GPUs" in (
        failed.error
    )
    assert summary.shards_written == 0


def test_a_job_whose_actor_is_never_placed_fails_after_its_waits_with_what_was_waited_for(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(db, model="fake/gpu-never-placed", **GPU_FAKE).job_id
    settings = fast_settings(db.url, ray_address="auto", placement_timeout_seconds=1.0, placement_waits=2)
    dispatch(db, settings)  # returns: until-empty ends once the job has failed

    failed = jobs.get(db, job)
    assert failed.status is JobStatus.failed and failed.error is not None and "\n" not in failed.error
    assert "no Ray node took the model's actor within 1 s" in failed.error
    assert "it needs 1 GPU on one node and no node up has them" in failed.error
    assert failed.error.endswith("gave up after 2 waits (POSBIAS_PLACEMENT_WAITS)")
    # Waiting is not failing: no attempt was used.
    assert all(s.attempts == 0 for s in jobs.shards(db, job))
