"""Integration fixtures.

Databases: one throwaway PostgreSQL server per session (`postgres_server` in tests/conftest.py; see
tests/support/postgres.py for what it needs), and a fresh database per test, copied from a template that was
migrated once, so every test starts from an empty store at the head revision. SQLite tests get a fresh file
per test the same way.

- `database_url`: a migrated, empty store; runs the test on SQLite and on PostgreSQL.
- `empty_database_url`: a database with no tables (for migration tests); both dialects.
- `postgres_url`: a migrated, empty PostgreSQL store only; `sqlite_url`: the same on SQLite only.
- `db`: an open `Database` on `database_url`.
- `make_job`, `answer`: submit a small job and build a worker's result for a leased shard.
- `ray_session` (tests/conftest.py): one local Ray for the session; `fast_settings(url)`: dispatcher
  settings with short polls, heartbeats and leases.

Helpers test modules import (they cannot import this file) are in tests/support: running a job to the end
(`job_runs`), reading its results back (`results`), waiting for a condition (`waiting`), free ports (`ports`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.postgres import PostgresServer

from posbias.schemas import (
    EngineInfo,
    EngineName,
    JobSpec,
    ModelInfo,
    ParseStatus,
    Question,
    QuestionPool,
    QuestionResult,
    ShardResult,
    ShardSpec,
    Submitted,
    TrialResult,
    TrialStatus,
)
from posbias.service.settings import Settings
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.work import jobs, planner

POSTGRES_TEMPLATE = "posbias_template"
DIALECTS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


# --- servers and databases ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_template(postgres_server: PostgresServer) -> str:
    """Name of a database on `postgres_server` migrated to head: tests copy it (CREATE DATABASE TEMPLATE)."""
    url = postgres_server.create_database(POSTGRES_TEMPLATE)
    migrate.upgrade(url)
    return POSTGRES_TEMPLATE


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head: tests copy it."""
    path = tmp_path_factory.mktemp("template") / "posbias.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture
def postgres_url(postgres_server: PostgresServer, postgres_template: str) -> Iterator[str]:
    """URL of a fresh PostgreSQL database migrated to head."""
    with postgres_server.scratch_database("test", template=postgres_template) as url:
        yield url


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """URL of a fresh SQLite store migrated to head, for a test that needs one dialect only."""
    path = tmp_path / "posbias.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=DIALECTS)
def database_url(request: pytest.FixtureRequest) -> str:
    """URL of a fresh store migrated to head: a test using it runs on SQLite (`sqlite_url`) and on PostgreSQL
    (`postgres_url`)."""
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
    return url


@pytest.fixture(params=DIALECTS)
def empty_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of a database with no tables yet (the SQLite file does not exist until something creates it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'posbias.db'}"
    else:
        with request.getfixturevalue("postgres_server").scratch_database("test") as url:
            yield url


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    """An open, checked store on `database_url`."""
    with database.connect(database_url) as opened:
        yield opened


# --- jobs and results --------------------------------------------------------------------------------


def question_pool(size: int = 60, *, varied: bool = False) -> QuestionPool:
    """`size` four-option questions over three subjects; the gold option is `i % 4`. All one length in
    tokens, or (`varied`) of 1 to 40 words more, as MMLU's vary: with one length, token distance is an exact
    function of position and answer slot, and explain cannot tell them apart."""
    subjects = ("anatomy", "astronomy", "virology")
    questions = tuple(
        sorted(
            (
                Question(
                    id=f"{subjects[i % 3]}/q{i:04d}",
                    subject=subjects[i % 3],
                    question=f"Question number {i}{' about' * (1 + i * 7 % 40) if varied else ''}?",
                    choices=(f"a{i}", f"b{i}", f"c{i}", f"d{i}"),
                    answer=i % 4,
                )
                for i in range(size)
            ),
            key=lambda q: q.id,
        )
    )
    return QuestionPool(questions=questions, subjects=subjects, source="test pool")


@pytest.fixture
def pool() -> QuestionPool:
    """The default `question_pool`."""
    return question_pool()


MakeJob = Callable[..., Submitted]


@pytest.fixture
def make_job() -> MakeJob:
    """Submit a job of the fake engine through the real planner: `make_job(db, key=None, **spec_fields)`
    (`varied=True`: questions of varied lengths, `question_pool`).

    Defaults: batch sizes 2 and 3, 4 iterations, 2 trials per shard (4 shards).
    """

    def submit(
        db: Database, *, key: str | None = None, pool_size: int = 60, varied: bool = False, **fields: Any
    ) -> Submitted:
        values: dict[str, Any] = {
            "model": "fake/model",
            "batch_sizes": (2, 3),
            "iterations": 4,
            "shard_size": 2,
            "engine": {"name": EngineName.fake},
        }
        values.update(fields)
        spec = JobSpec.model_validate(values)
        plan = planner.plan(spec, pool=question_pool(pool_size, varied=varied))
        return jobs.submit(db, spec, plan, idempotency_key=key)

    return submit


Answer = Callable[..., ShardResult]
ENGINE = EngineInfo(name="fake", version="0", dtype="float32", attention_backend=None, device="none")


def model_info(name: str = "fake/model", revision: str | None = None) -> ModelInfo:
    """What a worker reports about the fake model."""
    return ModelInfo(
        name=name,
        revision=revision,
        architecture="FakeForCausalLM",
        num_layers=4,
        sliding_window=8,
        sliding_window_layers=(0, 2),
        rope_theta=10000.0,
        context_length=4096,
        num_parameters=1234,
    )


def build_result(
    shard: ShardSpec,
    *,
    correct: Callable[[int, int], bool] = lambda trial, position: position % 2 == 0,
    skip: Callable[[int], bool] = lambda trial: False,
    unparsed: Callable[[int, int], bool] = lambda trial, position: False,
) -> ShardResult:
    """A worker's result for `shard`: `correct(trial index, position)` says which answers are right,
    `skip(trial index)` which trials were skipped (prompt too long), `unparsed(...)` which answers did not
    parse (they count as wrong). The gold probability is 0.9 for right answers and 0.1 for wrong ones."""
    trials: list[TrialResult] = []
    results: list[QuestionResult] = []
    for trial in shard.trials:
        if skip(trial.index):
            trials.append(
                TrialResult(
                    trial_index=trial.index, status=TrialStatus.skipped, skip_reason="prompt too long"
                )
            )
            continue
        trials.append(
            TrialResult(
                trial_index=trial.index,
                status=TrialStatus.done,
                prompt_tokens=100 * trial.batch_size,
                output_tokens=5 * trial.batch_size,
                output_text="\n".join(f"{p}. 1" for p in range(1, trial.batch_size + 1)),
            )
        )
        for position, qid in enumerate(trial.question_ids, start=1):
            question = shard.questions[qid]
            gold = question.answer
            failed = unparsed(trial.index, position)
            right = correct(trial.index, position) and not failed
            predicted = None if failed else (gold if right else (gold + 1) % len(question.choices))
            probs = tuple(0.9 if i == gold and right else 0.1 if i == gold else 0.0 for i in range(4))
            results.append(
                QuestionResult(
                    trial_index=trial.index,
                    position=position,
                    question_id=qid,
                    subject=question.subject,
                    gold=gold,
                    predicted=predicted,
                    correct=right,
                    parse_status=ParseStatus.unparseable if failed else ParseStatus.ok,
                    question_token_start=100 * (position - 1),
                    question_token_end=100 * position,
                    answer_token_index=5 * (position - 1) + 2,
                    token_distance=100 * (trial.batch_size - position) + 5 * (position - 1) + 2,
                    option_probs=probs,
                    gold_prob=probs[gold],
                )
            )
    return ShardResult(
        job_id=shard.job_id,
        shard_id=shard.shard_id,
        trials=tuple(trials),
        results=tuple(results),
        model=model_info(shard.model, shard.revision),
        engine=ENGINE,
        generate_seconds=0.01,
    )


@pytest.fixture
def answer() -> Answer:
    """`build_result` as a fixture (test modules cannot import conftest)."""
    return build_result


# --- dispatchers -------------------------------------------------------------------------------------


@pytest.fixture
def fast_settings(tmp_path: Path) -> Callable[..., Settings]:
    """Settings for a dispatcher under test: short polls, heartbeats and leases."""

    def build(url: str, **fields: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": url,
            "cache_dir": tmp_path / "cache",
            "poll_seconds": 0.05,
            "heartbeat_seconds": 1.0,
            "lease_seconds": 10.0,
            **fields,
        }
        return Settings(**values)

    return build
