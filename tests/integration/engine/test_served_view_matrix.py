"""Jobs of the served engine (`openai`, against a real `vllm serve`) in every view of the view matrix
(issue 37; the cells are tests/support/view_cells.py's).

Two jobs of the same trials sent to the session's tiny Llama server (`llama_server`,
tests/integration/engine/conftest.py), run by `posbias worker` through the session's Ray: free answers (a
random model's text, which does not parse) and constrained ones (every answer parsed). Each is shown in
every view, and in every attention view, which refuses in one line (only `hf` records attention); the two
are compared as a pair; both are listed.

SQLite only: the views' store-dependent paths are the fake engine's matrix's, on both stores
(tests/e2e/test_view_matrix.py); these cells add what this engine writes (the endpoint's record, its
tokenizer's offsets, outputs that do not parse).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import view_cells
from support.view_cells import ATTENTION_VIEWS, PAIR_VIEWS, STORE_VIEWS, VIEWS, Store
from support.vllmserve import VllmServer

import posbias
from posbias.service.store import migrate

pytestmark = pytest.mark.vllm

JOBS: dict[str, dict[str, Any]] = {
    "served-free": {"answer_mode": "free"},
    "served-constrained": {"answer_mode": "constrained"},
}
"""The jobs, by name: what each adds to `BASE`."""
BASE = {
    "seed": 5,
    "batch_sizes": [1, 3],
    "iterations": 3,
    "shard_size": 3,
    "dataset": {"subjects": ["anatomy", "astronomy"]},
}


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory, mmlu_dir: Path, llama_server: VllmServer, ray_session: None
) -> Iterator[Store]:
    """A SQLite store holding `JOBS`, run to their end."""
    folder = tmp_path_factory.mktemp("served-views")
    m = Store(url=f"sqlite:///{folder / 'posbias.db'}", folder=folder, mmlu_dir=mmlu_dir)
    migrate.upgrade(m.url)
    engine = {"name": "openai", "base_url": llama_server.base_url}
    for name, fields in JOBS.items():
        m.submit(name, {"model": llama_server.served_model, **BASE, **fields, "engine": engine})
    m.work()
    yield m
    m.write_refusals()


def test_the_jobs_ran_on_the_server(store: Store) -> None:
    for name, job_id in store.jobs.items():
        job = posbias.job(job_id, settings=store.settings)
        assert job.status.value == "done" and job.progress.trials_done == 2 * 3, (name, job.error)
        assert job.engine is not None and job.engine.name == "openai" and job.endpoint is not None
    answers = store.fact(store.jobs["served-constrained"])["answers"]
    assert set(answers["parse_status"]) == {"ok"}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("job", list(JOBS))
def test_every_served_job_opens_in_every_view(store: Store, job: str, view: str) -> None:
    view_cells.view(store, job, view)


@pytest.mark.parametrize("view", ATTENTION_VIEWS)
@pytest.mark.parametrize("job", list(JOBS))
def test_a_served_job_has_no_attention_to_show(store: Store, job: str, view: str) -> None:
    view_cells.attention(store, job, view)


@pytest.mark.parametrize("view", PAIR_VIEWS)
def test_free_compares_with_constrained(store: Store, view: str) -> None:
    view_cells.pair(store, "served-free", "served-constrained", view)


@pytest.mark.parametrize("view", STORE_VIEWS)
def test_every_served_job_is_listed(store: Store, view: str) -> None:
    view_cells.listed(store, view)
