"""`posbias trial` on the real vLLM CPU build: a demo-model job's trials, shown from the store, are token for
token the prompts vLLM itself reports having processed (`RequestOutput.prompt_token_ids`), rebuilt with the
tokenizer the view loads from the model's files (the GGUF file's conversion), chat template included."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from posbias.schemas import Submitted
from posbias.service.reports.trial_view import trial_detail
from posbias.service.store import database
from posbias.service.store.tables import Trial
from posbias.service.work import queue
from posbias.workers.shard import run_shards
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def test_a_demo_trials_prompt_is_what_vllm_processed(
    sqlite_url: str,
    make_job: Callable[..., Submitted],
    demo_engine: VllmEngine,
    cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm: Any = demo_engine._llm
    generate = llm.generate
    processed: list[list[int]] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        outputs = generate(*args, **kwargs)
        processed.extend([int(t) for t in output.prompt_token_ids] for output in outputs)
        return outputs

    monkeypatch.setattr(llm, "generate", recording)
    with database.connect(sqlite_url) as db:
        job_id = make_job(
            db,
            model="demo",
            engine={"name": "vllm"},
            answer_mode="constrained",
            batch_sizes=(3,),
            iterations=2,
            answer_order="reverse",
        ).job_id
        leases = queue.lease(db, owner="vllm-test", limit=10, lease_seconds=600, job_ids=[job_id])
        outcomes = queue.complete(
            db, run_shards([lease.shard for lease in leases], engine=demo_engine), owner="vllm-test"
        )
        assert leases and all(outcome.written for outcome in outcomes)
        with db.read() as session:
            ids = list(session.scalars(select(Trial.id).where(Trial.job_id == job_id).order_by(Trial.index)))
            views = [trial_detail(session, job_id, trial_id, cache_dir=cache_dir) for trial_id in ids]

    assert len(processed) == len(views) == 2
    assert [v.prompt_token_ids for v in views] == processed
    for view in views:
        assert view.chat_template_used and view.prompt_text.startswith("<|im_start|>")
        assert view.check.matches is True and view.check.compared == 1 + 2 * 3
        assert view.output_text and [a.position for a in view.answers] == [1, 2, 3]
        assert all(a.parsed and a.option_probs is not None for a in view.answers)
