"""Served jobs through a real `vllm serve` (the CPU build, on 127.0.0.1): a tiny random Llama and the demo
model, free and constrained, end to end through the dispatcher and Ray into SQLite and PostgreSQL. Every
answer matches the in-process engine's on the same prompts (greedy): parse, prediction, token offsets, token
distance, option probabilities, the output itself.

Each server starts once (its start-up, about a minute here, is the cost): the tiny Llama's is the session's,
as are the in-process engines (tests/integration/engine/conftest.py); the demo model's is this module's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from engine_helpers import Conversion
from support.vllmserve import VllmServer, vllm_serve

import posbias.api as api
from posbias.schemas import EngineName, JobSpec, JobStatus, TrialResult
from posbias.service.reports import export
from posbias.service.settings import Settings
from posbias.service.store import database
from posbias.service.work.shards import shard_spec
from posbias.workers.shard import run_shard
from posbias.workers.vllm_engine import VllmEngine

pytestmark = [pytest.mark.vllm, pytest.mark.usefixtures("ray_session")]

SUBJECTS = ["anatomy", "astronomy", "virology"]
DEMO_CONTEXT = 8192


@pytest.fixture(scope="module")
def demo_server(
    demo_conversion: Conversion, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    """The demo model served from the folder its GGUF file was converted into for the in-process engine."""
    log = tmp_path_factory.mktemp("vllm-serve") / "demo.log"
    with vllm_serve(
        demo_conversion.resolved.model,
        cache_dir=cache_dir,
        log=log,
        served_model="demo",
        max_model_len=DEMO_CONTEXT,
    ) as server:
        yield server


@pytest.fixture
def settings(
    database_url: str, fast_settings: Callable[..., Settings], mmlu_dir: Path, cache_dir: Path
) -> Settings:
    return fast_settings(database_url, mmlu_dir=mmlu_dir, cache_dir=cache_dir, lease_seconds=120.0)


def local_spec(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "seed": 7, "dataset": {"subjects": SUBJECTS}, **fields}


def served(spec: dict[str, Any], server: VllmServer) -> dict[str, Any]:
    return {**spec, "engine": {"name": "openai", "base_url": server.base_url}}


_ANSWERED: dict[str, dict[int, Any]] = {}
"""In-process answers by spec: the same on SQLite and PostgreSQL, so computed once."""


def in_process(spec: dict[str, Any], *, engine: VllmEngine, settings: Settings) -> dict[int, Any]:
    """What the in-process engine answers to the job's trials: trial results and results by trial index."""
    job = JobSpec.model_validate(spec)
    if job.spec_hash() in _ANSWERED:
        return _ANSWERED[job.spec_hash()]
    plan = api.plan(job, settings=settings)
    answers: dict[int, Any] = {}
    for planned in plan.shards:
        trials = [plan.trials[i] for i in planned.trial_indices]
        shard = shard_spec(job, job_id=0, shard_id=planned.index, trials=trials, questions=plan.questions)
        result = run_shard(shard, engine=engine)
        for trial in result.trials:
            answers[trial.trial_index] = (
                trial,
                [r for r in result.results if r.trial_index == trial.trial_index],
            )
    _ANSWERED[job.spec_hash()] = answers
    return answers


def stored(url: str, job_id: int) -> dict[int, Any]:
    """The job's stored trial outcomes and results, by trial index."""
    with database.connect(url) as db:
        rows = [SimpleNamespace(**row) for row in export.results_table(db, job_id).to_pylist()]
        with db.read() as session:
            trials = session.execute(
                sa.text(
                    'SELECT "index", status, prompt_tokens, output_tokens, output_text FROM trials '
                    "WHERE job_id = :job"
                ),
                {"job": job_id},
            ).all()
    return {
        index: (
            TrialResult(
                trial_index=index,
                status=status,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                output_text=output_text,
            ),
            [r for r in rows if r.trial_index == index],
        )
        for index, status, prompt_tokens, output_tokens, output_text in trials
    }


def assert_same_answers(served_answers: dict[int, Any], local_answers: dict[int, Any]) -> None:
    assert sorted(served_answers) == sorted(local_answers)
    for index, (trial, rows) in served_answers.items():
        local_trial, local_rows = local_answers[index]
        assert trial == local_trial, f"trial {index}"
        assert len(rows) == len(local_rows)
        for row, local in zip(sorted(rows, key=lambda r: r.position), local_rows, strict=True):
            assert (row.position, row.question_id, row.gold, row.predicted, row.correct) == (
                local.position,
                local.question_id,
                local.gold,
                local.predicted,
                local.correct,
            )
            assert row.parse_status == local.parse_status.value
            assert (row.question_token_start, row.question_token_end) == (
                local.question_token_start,
                local.question_token_end,
            )
            assert (row.answer_token_index, row.token_distance) == (
                local.answer_token_index,
                local.token_distance,
            )
            if local.option_probs is None:
                assert row.option_probs is None
            else:
                assert row.option_probs == pytest.approx(list(local.option_probs), abs=1e-5)


def test_served_tiny_model_answers_as_the_in_process_engine(
    llama_server: VllmServer,
    llama_engine: VllmEngine,
    tiny_llama_dir: Path,
    settings: Settings,
    database_url: str,
) -> None:
    free = local_spec(str(tiny_llama_dir), batch_sizes=[1, 4], iterations=2, answer_mode="free")
    constrained = {**free, "answer_mode": "constrained"}
    # The chat API too: the server applies its chat template to the user's turn and offsets come from the
    # tokens' bytes; the prompt is the same tokens, so the answers are the same.
    chat = {**constrained, "seed": 8}
    dry = api.dry_run(served(free, llama_server), settings=settings)
    local_dry = api.dry_run(free, settings=settings)
    assert (dry.tokenizer, local_dry.tokenizer) == ("the endpoint's tokenizer", "the model's tokenizer")
    assert [b.mean_prompt_tokens for b in dry.batch_sizes] == [
        b.mean_prompt_tokens for b in local_dry.batch_sizes
    ]

    specs = [served(free, llama_server), served(constrained, llama_server), served(chat, llama_server)]
    specs[2]["engine"]["api"] = "chat"
    ids = [api.submit(spec, settings=settings).job_id for spec in specs]
    summary = api.dispatch(ids, settings=settings)
    assert summary.shards_failed == 0

    apis = ("completions", "completions", "chat")
    for job_id, spec, api_used in zip(ids, (free, constrained, chat), apis, strict=True):
        job = api.job(job_id, settings=settings)
        assert job.status is JobStatus.done, job.error
        assert job.engine is not None and job.engine.name == "openai" and job.engine.version
        assert job.endpoint is not None
        caps, mode = job.endpoint.capabilities, job.endpoint.mode
        assert caps.tokenize and caps.token_prompts and caps.regex_field == "structured_outputs"
        assert caps.max_model_len == 4096 and caps.completions_logprobs == 5
        assert (mode.api.value, mode.token_offsets.value, mode.option_probs) == (api_used, "server", True)
        assert_same_answers(
            stored(database_url, job_id), in_process(spec, engine=llama_engine, settings=settings)
        )
    # The constrained job answered every position; its probabilities are over the options.
    rows = stored(database_url, ids[1])
    assert all(r.parse_status == "ok" and r.option_probs is not None for _, rs in rows.values() for r in rs)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_served_demo_model_answers_as_the_in_process_engine(
    demo_server: VllmServer, demo_engine: VllmEngine, settings: Settings, database_url: str
) -> None:
    # A real tokenizer (SmolLM2's byte-level BPE): offsets from the server's /tokenize must still line up.
    # Constrained only, to keep the suite's time (free answers are compared on the tiny model).
    spec = local_spec("demo", batch_sizes=[2], iterations=2, answer_mode="constrained")
    job_id = api.submit(served(spec, demo_server), settings=settings).job_id
    api.dispatch([job_id], settings=settings)
    job = api.job(job_id, settings=settings)
    assert job.status is JobStatus.done, job.error
    assert job.engine is not None and job.engine.served_model == "demo"
    assert job.spec.engine.name is EngineName.openai
    assert job.endpoint is not None and job.endpoint.capabilities.max_model_len == DEMO_CONTEXT
    assert_same_answers(stored(database_url, job_id), in_process(spec, engine=demo_engine, settings=settings))
