"""A served job whose endpoint sends malformed answers (HTTP 200 without `choices`) among good ones: each is
retried like a broken answer, a bounded number of times, and one that stays malformed costs its trial (a parse
failure with the reason), never its shard or the job."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.fakeendpoint import KEY_ENV, MODEL, FakeEndpoint, serve

import posbias.api as api
from posbias.schemas import JobStatus
from posbias.service.settings import Settings
from posbias.service.store import database

pytestmark = [
    pytest.mark.usefixtures("ray_session"),
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]


@pytest.fixture
def settings(database_url: str, fast_settings: Callable[..., Settings], mmlu_dir: Path) -> Settings:
    return fast_settings(database_url, mmlu_dir=mmlu_dir)


@pytest.fixture
def endpoint(endpoint_key: str) -> Iterator[FakeEndpoint]:
    with serve(FakeEndpoint(key=endpoint_key)) as running:
        yield running


def test_malformed_answers_cost_their_trial_never_the_job(
    endpoint: FakeEndpoint, settings: Settings, database_url: str
) -> None:
    seen: list[str] = []

    def faults(prompt: str, attempt: int) -> str | None:
        if prompt not in seen:
            seen.append(prompt)
        kind = seen.index(prompt) % 3
        if kind == 0:
            return "no-choices"  # malformed on every try
        return "no-choices" if kind == 1 and attempt == 1 else None  # malformed once, then answered

    endpoint.faults = faults
    retries = 2
    spec = {
        "model": MODEL,
        "batch_sizes": [1, 3],
        "iterations": 6,
        "shard_size": 3,
        "max_attempts": 3,
        "dataset": {"subjects": ["anatomy", "astronomy"]},
        "engine": {
            "name": "openai",
            "base_url": endpoint.url,
            "api_key_env": KEY_ENV,
            "max_retries": retries,
        },
    }
    job = api.run(spec, settings=settings).job

    assert job.status is JobStatus.done, job.error
    assert job.progress.trials_done == 12
    assert all(s.attempts == 0 for s in api.shards(job.id, settings=settings))  # no shard failed
    with database.connect(database_url) as db, db.read() as session:
        trials = session.execute(
            sa.text("SELECT id, status, skip_reason, output_text FROM trials WHERE job_id = :job"),
            {"job": job.id},
        ).all()
        results = session.execute(
            sa.text("SELECT trial_id, position, parse_status FROM results WHERE job_id = :job"),
            {"job": job.id},
        ).all()
    assert len(trials) == 12 and {str(t.status) for t in trials} == {"done"}
    keys = [(r.trial_id, r.position) for r in results]
    assert len(keys) == len(set(keys)) == 6 * 1 + 6 * 3  # every trial written once, each position once
    failed = {t.id: t.skip_reason for t in trials if t.skip_reason is not None}
    assert failed, "some prompts were malformed on every try"
    for reason in failed.values():
        assert reason.startswith("/completions gave no readable answer in 3 tries")
        assert "the endpoint's answer has no choices" in reason and "\n" not in reason
    assert {str(r.parse_status) for r in results if r.trial_id in failed} == {"unparseable"}
    answered = [t for t in trials if t.id not in failed]
    assert answered and all(t.output_text for t in answered)
    # Retries are bounded: a prompt malformed on every try was sent 1 + max_retries times per request.
    always = [p for i, p in enumerate(seen) if i % 3 == 0]
    for prompt in always:
        tries = [r for r in endpoint.requests if r.prompt == prompt]
        assert len(tries) % (1 + retries) == 0 and tries


def test_retry_recovers_a_job_whose_answers_were_bad(
    endpoint: FakeEndpoint, settings: Settings, database_url: str
) -> None:
    endpoint.faults = lambda prompt, attempt: "500"  # the endpoint is down: the job fails
    spec = {
        "model": MODEL,
        "batch_sizes": [2],
        "iterations": 3,
        "max_attempts": 1,
        "dataset": {"subjects": ["anatomy", "astronomy"]},
        "engine": {"name": "openai", "base_url": endpoint.url, "api_key_env": KEY_ENV, "max_retries": 0},
    }
    job = api.run(spec, settings=settings).job
    assert job.status is JobStatus.failed

    first: list[str] = []

    def faults(prompt: str, attempt: int) -> str | None:
        first.extend([] if first else [prompt])
        return "no-choices" if prompt == first[0] else None  # back up, but one answer stays malformed

    endpoint.faults = faults
    api.retry(job.id, settings=settings)
    api.dispatch([job.id], settings=settings)
    job = api.job(job.id, settings=settings)
    assert job.status is JobStatus.done, job.error
    assert job.progress.trials_done == 3
    with database.connect(database_url) as db, db.read() as session:
        reasons = session.execute(
            sa.text("SELECT skip_reason FROM trials WHERE job_id = :job"), {"job": job.id}
        ).scalars()
        assert sorted(r is not None for r in reasons) == [False, False, True]
