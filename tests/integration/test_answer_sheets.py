"""`engine.answer_sheet: {job: N}` for the `hf` engine, through the real submit and lease with fake results:
refused in one line unless job N is done and has the same trials; each leased shard carries job N's parsed
answers (1-based), a position it did not parse left to the gold answer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from support.job_runs import answer_every_shard

from posbias.schemas import EngineOptions, PosbiasError, ShardSpec, Submitted
from posbias.schemas.attention import SheetFromJob
from posbias.service.store.database import Database
from posbias.service.work import queue


def test_the_sheet_is_the_named_done_jobs_answers_and_is_refused_otherwise(
    db: Database, make_job: Callable[..., Submitted], answer: Callable[..., object]
) -> None:
    done = make_job(db).job_id
    # Trial 0's position 2 does not parse; every odd position is answered wrong (gold + 1).
    answer_every_shard(db, done, answer, unparsed=lambda trial, position: (trial, position) == (0, 2))
    running = make_job(db).job_id

    def hf(job: int, **fields: object) -> int:
        return make_job(db, engine={"name": "hf", "answer_sheet": {"job": job}}, **fields).job_id

    with pytest.raises(PosbiasError, match=f"names job {running}, which is queued, not done"):
        hf(running)
    with pytest.raises(PosbiasError, match="names job 999, which does not exist"):
        hf(999)
    with pytest.raises(PosbiasError, match=f"names job {done}, whose trials differ from this job's"):
        hf(done, seed=7)

    paired = hf(done)
    leases = queue.lease(db, owner="test", limit=100, lease_seconds=60, job_ids=[paired])
    assert leases
    shards: list[ShardSpec] = [lease.shard for lease in leases]
    gold = {
        (t.index, position): shard.questions[qid].answer
        for shard in shards
        for t in shard.trials
        for position, qid in enumerate(t.question_ids, start=1)
    }
    for shard in shards:
        assert isinstance(shard.engine.answer_sheet, SheetFromJob) and shard.answers is not None
        for t in shard.trials:
            # Even positions were answered right (gold), odd ones wrong (the next option); 1-based here.
            expected = {
                p: (gold[t.index, p] if p % 2 == 0 else (gold[t.index, p] + 1) % 4) + 1
                for p in range(1, t.batch_size + 1)
                if (t.index, p) != (0, 2)
            }
            assert shard.answers[t.index] == expected
    # A job without the sheet: its shards carry no answers.
    other = queue.lease(db, owner="test", limit=1, lease_seconds=60, job_ids=[running])
    assert other and all(lease.shard.answers is None for lease in other)
    assert EngineOptions(name="hf", answer_sheet={"job": 3}).answer_sheet == SheetFromJob(job=3)
    with pytest.raises(ValueError, match=r"write answer_sheet: \{job: N\}"):
        EngineOptions(name="hf", answer_sheet="job")
