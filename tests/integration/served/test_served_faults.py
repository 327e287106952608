"""Served jobs against a misbehaving endpoint (`support.fakeendpoint`), through the real dispatcher, Ray
actors and store: faults are retried and every trial is paid for and written exactly once, or the job
fails with a one-line reason; rate limits hold at the server; the cost guard stops a job before its tokens
are spent; the API key appears in nothing posbias writes."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.fakeendpoint import KEY_ENV, MODEL, FakeEndpoint, estimated_tokens, serve

import posbias.api as api
from posbias.schemas import JobStatus, PosbiasError
from posbias.service.settings import Settings
from posbias.service.store import database

pytestmark = pytest.mark.usefixtures("ray_session")

SUBJECTS = ["anatomy", "astronomy"]
sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
"""For what does not touch the store differently on PostgreSQL (the test suite's time is dear)."""


@pytest.fixture
def settings(database_url: str, fast_settings: Callable[..., Settings], mmlu_dir: Path) -> Settings:
    return fast_settings(database_url, mmlu_dir=mmlu_dir)


@pytest.fixture
def endpoint(endpoint_key: str) -> Iterator[FakeEndpoint]:
    with serve(FakeEndpoint(key=endpoint_key)) as running:
        yield running


def served_spec(endpoint: FakeEndpoint, **engine: Any) -> dict[str, Any]:
    """A small job on the fake endpoint; `engine` adds endpoint options."""
    return {
        "model": MODEL,
        "batch_sizes": [1, 3],
        "iterations": 6,
        "shard_size": 3,
        "max_attempts": 3,
        "dataset": {"subjects": SUBJECTS},
        "engine": {"name": "openai", "base_url": endpoint.url, "api_key_env": KEY_ENV, **engine},
    }


def result_keys(url: str, job_id: int) -> list[tuple[int, int]]:
    with database.connect(url) as db, db.read() as session:
        rows = session.execute(
            sa.text(
                'SELECT t."index", r.position FROM results r JOIN trials t ON t.id = r.trial_id '
                "WHERE r.job_id = :job"
            ),
            {"job": job_id},
        ).all()
    return [(int(a), int(b)) for a, b in rows]


def test_faults_are_retried_and_every_trial_is_paid_for_and_written_once(
    endpoint: FakeEndpoint, settings: Settings, database_url: str
) -> None:
    kinds = ["429-retry-after", "429", "500", "truncated", "slow", "drop", None]
    assigned: dict[str, str | None] = {}
    stubborn: list[str] = []

    def faults(prompt: str, attempt: int) -> str | None:
        if prompt not in assigned:
            assigned[prompt] = kinds[len(assigned) % len(kinds)]
            if len(assigned) == 2:
                stubborn.append(prompt)  # fails every try of the shard's first attempt
        if prompt in stubborn and attempt <= 6:  # two runs of three tries: the shared call's and its own
            return "500"
        return assigned[prompt] if attempt == 1 else None

    endpoint.faults = faults
    # A `slow` answer comes only after the client hangs up, so the timeout can be generous: a proper answer
    # from this server takes milliseconds, and 5 s leaves a loaded machine room not to time one out (which
    # would rightly retry and pay for it twice).
    endpoint.slow_s = 60.0
    spec = served_spec(endpoint, timeout_s=5.0, max_retries=2)
    outcome = api.run(spec, settings=settings)

    job = outcome.job
    assert job.status is JobStatus.done, job.error
    trials = 6 + 6
    assert job.progress.trials_done == trials
    keys = result_keys(database_url, job.id)
    assert len(keys) == len(set(keys)) == 6 * 1 + 6 * 3
    # Each prompt was answered (and paid for) once: the stubborn prompt's shard ran twice, and its second
    # attempt took the other prompts' answers from the worker's cache.
    answered = endpoint.answered()
    assert set(answered.values()) == {1} and len(answered) >= trials - 2  # a repeated prompt is cached
    assert max(s.attempts for s in api.shards(job.id, settings=settings)) >= 1  # its failed first run
    # Retry-After: 1 was honoured: the retry came no sooner than a second later.
    for prompt, kind in assigned.items():
        tries = [r for r in endpoint.requests if r.prompt == prompt]
        if kind == "429-retry-after" and prompt not in stubborn:
            assert tries[1].at - tries[0].at >= 1.0
    assert job.engine is not None and job.engine.name == "openai" and job.engine.served_model == MODEL
    assert job.endpoint is not None and job.endpoint.mode.token_offsets.value == "none"


@sqlite_only
def test_a_job_that_keeps_failing_fails_with_a_one_line_reason(
    endpoint: FakeEndpoint, settings: Settings
) -> None:
    endpoint.faults = lambda prompt, attempt: "500"
    spec = served_spec(endpoint, max_retries=1) | {"batch_sizes": [2], "iterations": 3, "max_attempts": 2}
    job = api.run(spec, settings=settings).job

    assert job.status is JobStatus.failed
    assert job.error is not None and "\n" not in job.error
    assert "HTTP 500" in job.error and "after 2 tries" in job.error, job.error
    # Two attempts of one shard, two tries each: nothing was retried beyond the bounds.
    assert len(endpoint.job_requests()) == 3 * 2 * 2


@sqlite_only
def test_rate_limits_hold_at_the_server(endpoint: FakeEndpoint, settings: Settings) -> None:
    per_second, tokens_per_second = 20.0, 2500.0
    spec = served_spec(
        endpoint,
        max_concurrency=8,
        requests_per_minute=per_second * 60,
        tokens_per_minute=tokens_per_second * 60,
    ) | {"batch_sizes": [1], "iterations": 40, "shard_size": 10}
    job = api.run(spec, settings=settings).job
    assert job.status is JobStatus.done, job.error

    arrivals = endpoint.job_requests()
    assert len(arrivals) >= 30  # a question drawn twice makes one prompt twice: the cache answers it
    # Starts are spaced by the limiter; arrivals also carry the loopback's jitter, hence the 10% slack.
    window = 1.0
    biggest = max(estimated_tokens(r.prompt) + r.max_tokens for r in arrivals)
    for first in arrivals:
        inside = [r for r in arrivals if first.at <= r.at < first.at + window]
        assert len(inside) <= per_second * window * 1.1 + 1
        tokens = sum(estimated_tokens(r.prompt) + r.max_tokens for r in inside)
        assert tokens <= tokens_per_second * window * 1.1 + biggest


@sqlite_only
def test_the_cost_guard_stops_a_job_before_its_tokens_are_spent(
    endpoint: FakeEndpoint, settings: Settings, database_url: str
) -> None:
    # The endpoint counts each prompt at 1.6 times posbias's estimate (posbias has no tokenizer for it).
    endpoint.usage_factor = 1.6
    spec = served_spec(endpoint, max_concurrency=1) | {"sampling": {"max_tokens": 8}}
    dry = api.dry_run(spec, settings=settings)
    assert dry.endpoint is not None
    bound = dry.endpoint.token_bound

    too_tight = {**spec, "engine": {**spec["engine"], "max_job_tokens": bound // 2}}
    with pytest.raises(PosbiasError, match=r"over its cost guard engine\.max_job_tokens"):
        api.submit(too_tight, settings=settings)
    assert api.jobs(settings=settings) == []

    guard = math.ceil(bound * 1.1)
    spec["engine"]["max_job_tokens"] = guard
    job = api.run(spec, settings=settings).job

    assert job.status is JobStatus.failed
    assert job.error is not None and "cost guard" in job.error and "\n" not in job.error
    spent = sum(r.tokens for r in endpoint.requests if "Question:" in r.prompt)
    assert spent <= guard
    assert len(endpoint.answered()) < 12  # it was stopped: not every trial was paid for


def test_the_api_key_is_in_nothing_posbias_writes(
    endpoint: FakeEndpoint,
    endpoint_key: str,
    settings: Settings,
    database_url: str,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Prompts of three questions are refused by a server that quotes the key it got.
    endpoint.faults = lambda prompt, attempt: "echo-key" if "3. Question:" in prompt else None
    spec = served_spec(endpoint) | {"max_attempts": 2}
    job = api.run(spec, settings=settings).job
    assert job.status is JobStatus.failed and job.error is not None and "HTTP 400" in job.error
    assert {r.authorization for r in endpoint.requests} == {f"Bearer {endpoint_key}"}
    assert any(endpoint_key in str(r.authorization) for r in endpoint.job_requests())

    exported = tmp_path / "results.csv"
    assert api.export_results(job.id, out=exported, settings=settings).rows == 6
    written = [exported.read_text(), job.model_dump_json()]
    with database.connect(database_url) as db, db.read() as session:
        for table in sa.inspect(session.get_bind()).get_table_names():
            rows = session.execute(sa.text(f'SELECT * FROM "{table}"')).all()
            written.append(repr(rows))
    written.append(_ray_logs())
    captured = capfd.readouterr()
    written += [captured.out, captured.err]
    fragment = endpoint_key[-12:]
    for text in written:
        assert endpoint_key not in text and fragment not in text


def _ray_logs() -> str:
    """Everything the session's Ray processes logged (the actors' stdout and stderr included)."""
    import ray._private.worker

    node = ray._private.worker._global_node
    folder = Path(node.get_logs_dir_path())
    return "\n".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())
