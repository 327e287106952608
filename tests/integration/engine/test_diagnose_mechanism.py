"""The mechanism line of `posbias diagnose` on a real model: the tiny Gemma 2 (a 64-token window on layers 0
and 2), its battery's three mechanism jobs (hf, hf with a position gap, and the same trials answered on
vLLM) run through the queue in this process, read by `mechanism.gather` and called by `mechanism.finding`.
Whatever the random model shows, the calls must rest on the numbers the store holds."""

from __future__ import annotations

from itertools import groupby
from pathlib import Path

import pytest
import sqlalchemy as sa
from engine_helpers import GEMMA2_WINDOW

from posbias.schemas import WorkerConfig
from posbias.schemas.attention import LayerKind
from posbias.schemas.diagnosis import Call, Line, Suspect
from posbias.service.diagnose import mechanism, plan_battery
from posbias.service.diagnose.group import submit
from posbias.service.settings import Settings
from posbias.service.store import database
from posbias.service.work import queue
from posbias.workers.actor import ShardActor
from posbias.workers.models import local_model_info

pytestmark = pytest.mark.vllm


def test_the_mechanism_line_reads_the_window_and_the_gap_from_hf_jobs_of_a_tiny_gemma2(
    sqlite_url: str, tiny_gemma2_dir: Path, worker_config: WorkerConfig, mmlu_dir: Path, tmp_path: Path
) -> None:
    settings = Settings(mmlu_dir=mmlu_dir, cache_dir=tmp_path / "cache")
    facts = local_model_info(str(tiny_gemma2_dir), cache_dir=settings.cache_dir)
    assert facts is not None and facts.sliding_window == GEMMA2_WINDOW
    # Eight questions a prompt: ten of the tiny tokenizer's (855 tokens) do not fit its 4,096-token context.
    battery = plan_battery(facts, engine="vllm", budget=2000, batch_size=8)
    planned = [job for job in battery.jobs if job.line is Line.mechanism]
    assert [str(job.spec.engine.name) for job in planned] == ["hf", "hf", "vllm"]
    with database.connect(sqlite_url) as db:
        states = submit(db, battery.model_copy(update={"jobs": tuple(planned)}), settings=settings)
        ids = {s.key: s.job_id for s in states}
        plain, gapped, scored = (ids[job.key] for job in planned)
        leases = queue.lease(db, owner="test", limit=10_000, lease_seconds=3600, job_ids=list(ids.values()))
        leases.sort(key=lambda lease: lease.shard.model_key)
        for _, group in groupby(leases, key=lambda lease: lease.shard.model_key):
            shards = [lease.shard for lease in group]
            actor = ShardActor(shards[0], config=worker_config)
            try:
                outcomes = actor.run_many(shards)
            finally:
                actor.close()
            assert all(o.written for o in queue.complete(db, outcomes, owner="test"))  # type: ignore[arg-type]
        evidence = mechanism.gather(db, battery, ids)
        with db.read() as session:
            stored = session.execute(
                sa.text(
                    "SELECT avg(own_mean), count(*) FROM attention "
                    "WHERE job_id = :j AND layer_kind = 'global'"
                ),
                {"j": plain},
            ).one()
            answered = session.execute(
                sa.text("SELECT count(*) FROM results WHERE job_id = :j AND predicted IS NOT NULL"),
                {"j": scored},
            ).scalar_one()
    assert evidence is not None and evidence.attention is not None
    attention, gap = evidence.attention, evidence.gap
    trials = planned[0].spec.total_trials

    # The window: the mask leaves the sliding layers nothing beyond it, and their attention is scored
    # against what vLLM answered on the same trials (not the hf job's teacher-forced sheet).
    assert attention.window == GEMMA2_WINDOW and attention.sliding_beyond_max == 0.0
    assert attention.scored_job_id == scored and answered > 0
    (sliding,) = [a for a in attention.aurocs if a.layer_kind is LayerKind.sliding]
    assert sliding.trials == trials and sliding.low is not None and sliding.high is not None
    window = mechanism.finding(Suspect.window, evidence, window=GEMMA2_WINDOW)
    assert window.line is Line.mechanism and window.unit == "AUROC"
    assert window.job_ids == (plain, scored)
    assert window.effect is not None
    assert (window.effect.estimate, window.effect.low, window.effect.high) == (
        sliding.auroc,
        sliding.low,
        sliding.high,
    )
    expected = (
        Call.ruled_out
        if max(abs(sliding.low - 0.5), abs(sliding.high - 0.5)) <= mechanism.AUROC_BOUND
        else Call.implicated
        if sliding.low > 0.5
        else Call.cannot_tell
    )
    assert window.call is expected, window

    # RoPE: the gap job against the plain one, paired over every (trial, position, global layer).
    assert gap is not None and gap.trials == trials
    assert gap.pairs == stored[1]
    assert abs(gap.plain - stored[0]) < 1e-9
    assert gap.low is not None and gap.high is not None and gap.low <= gap.change <= gap.high
    rope = mechanism.finding(Suspect.rope, evidence, window=GEMMA2_WINDOW)
    assert rope.unit == "%" and rope.job_ids == (plain, gapped)
    assert rope.effect is not None and rope.effect.estimate == gap.change
    if max(abs(gap.low), abs(gap.high)) <= mechanism.GAP_BOUND:
        assert rope.call is Call.ruled_out
    else:
        assert rope.call is (Call.implicated if gap.high < 0 else Call.cannot_tell)
    assert gap.gapped != gap.plain  # the gap moved RoPE: the global layers' attention changed
