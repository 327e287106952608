"""A seeded diagnosis is the same whatever order its shards are written in: the worker's order (which of the
battery's jobs and variants finishes first) changes only when each answer reaches the store, not what it
says. docs/diagnose.md's worked example once called the behaviour line's window differently in 1 of 4 runs:
the fake's `global-only` variant reported a model with no window under the same model identity as the
baseline, so the behaviour job read whichever build was written first."""

from __future__ import annotations

import shutil
from pathlib import Path

from posbias.schemas import FakeSpec, WorkerConfig
from posbias.schemas.diagnosis import Diagnosis
from posbias.service.diagnose import plan_battery, read_diagnosis
from posbias.service.diagnose.group import submit
from posbias.service.settings import Settings
from posbias.service.stats import queries
from posbias.service.store import database
from posbias.service.work import queue
from posbias.workers.engines import fake as fake_engine
from posbias.workers.fake_engine import fake_model_info
from posbias.workers.shard import run_shard

FAKE = FakeSpec.model_validate({"window": 1000, "mechanism": {"window_step": 0.3}})


def _diagnose(url: str, settings: Settings, *, global_only_first: bool) -> Diagnosis:
    """The worked example's battery, every shard answered by the fake in this process, the `global-only`
    variant's shards written first or last."""
    battery = plan_battery(fake_model_info(FAKE, model="fake/window"), engine="fake", budget=400, fake=FAKE)
    with database.connect(url) as db:
        states = submit(db, battery, settings=settings)
        leases = queue.lease(db, owner="test", limit=10_000, lease_seconds=600)
        leases.sort(key=lambda lease: (lease.shard.variant.name != "global-only") == global_only_first)
        for lease in leases:
            engine = fake_engine.load(lease.shard, WorkerConfig(cache_dir=str(settings.cache_dir)))
            assert queue.complete(db, [run_shard(lease.shard, engine=engine)], owner="test")[0].written
        built = queries.job_model(db, states[0].job_id)  # the behaviour job's model, as built
        assert built is not None and built.sliding_window == 1000, built
        return read_diagnosis(db, battery, {s.key: s.job_id for s in states})


def test_a_seeded_diagnosis_does_not_depend_on_the_order_its_shards_are_written(
    sqlite_url: str, tmp_path: Path, mmlu_dir: Path
) -> None:
    other = tmp_path / "other.db"
    shutil.copyfile(sqlite_url.removeprefix("sqlite:///"), other)
    settings = Settings(mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")
    last = _diagnose(sqlite_url, settings, global_only_first=False)
    first = _diagnose(f"sqlite:///{other}", settings, global_only_first=True)
    assert first.model_dump() == last.model_dump()
    window = next(v for v in first.suspects if v.suspect.value == "sliding window")
    assert [f.call.value for f in window.findings[:2]] == ["implicated", "implicated"], window
