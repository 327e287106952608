"""Every job a user can make opens in every view (issue 37): a matrix of job shapes against views, on SQLite
and on PostgreSQL.

Each shape (`SHAPES`, `STATES`, the migrated job) is built once per store (the module's `matrix` fixture: one
store, every job submitted, `posbias worker --until-empty`, then the jobs left queued, cancelled, failed
or half done through the queue, and one job written before a downgrade to the oldest revision and migrated
back); each view then runs against it in this process (`tests/support/in_process.py`), as a user runs it.
A cell passes when the view gives an answer, or one line that names why it does not apply, with the
README's exit code (0 or 1; never an internal error, an HTTP 500, a bare exception from Python, or NaN in
JSON), and when its counts agree with `status` and `export` (`n` counts every answer, parsed or not;
explain's `answers` the parsed ones). The cells and the views are `tests/support/view_cells.py`'s, which the
engines' matrices (tests/integration/engine/test_hf_view_matrix.py, test_served_view_matrix.py) run too.

The matrix: {shapes} shapes x ({views} views per shape + {store_views} views of every job, run once per
store), plus {pairs} compared pairs x {pair_views} views per pair, on 2 stores: {cells} cells.
`test_the_docstring_states_the_matrix` checks these figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import view_cells
from support.postgres import PostgresServer
from support.view_cells import PAIR_VIEWS, STORE_VIEWS, VIEWS, Store

import posbias
from posbias.schemas import ShardStatus, WorkerConfig
from posbias.service.store import database, migrate
from posbias.service.work import queue
from posbias.workers.loader import load_engine
from posbias.workers.shard import run_shard

FAKE = {"model": "fake/model", "engine": {"name": "fake"}, "seed": 3, "shard_size": 6}
"""Every shape's base: the fake engine (its accuracy rising from 25% to 55% over the positions)."""
SHAPES: dict[str, dict[str, Any]] = {
    "n1-alone": {"batch_sizes": [1], "iterations": 12},
    "n1-beside": {"batch_sizes": [1, 4], "iterations": 12},
    "n2": {"batch_sizes": [2], "iterations": 12},
    "n3": {"batch_sizes": [3], "iterations": 12},
    "iterations-1": {"batch_sizes": [1, 3], "iterations": 1},
    "iterations-2": {"batch_sizes": [3], "iterations": 2},
    "iterations-4": {"batch_sizes": [2, 4], "iterations": 4},
    "iterations-16": {"batch_sizes": [5], "iterations": 16},
    "reverse": {"batch_sizes": [4], "iterations": 12, "answer_order": "reverse"},
    "random-order": {"batch_sizes": [1, 4], "iterations": 12, "answer_order": "random"},
    "rotation": {"batch_sizes": [3], "iterations": 12, "design": "rotation"},
    "probe": {"batch_sizes": [3], "iterations": 12, "design": "probe"},
    "probe-n1": {"batch_sizes": [1, 2], "iterations": 12, "design": "probe"},
    "filler-end-sweep": {"batch_sizes": [3], "iterations": 12, "filler": {"tokens": [0, 40]}},
    "filler-before": {"batch_sizes": [1, 3], "iterations": 12, "filler": {"tokens": [30], "where": "before"}},
    "filler-after": {
        "batch_sizes": [4],
        "iterations": 12,
        "filler": {"tokens": [0, 30], "where": "after", "position": 2},
    },
    "shuffled": {"batch_sizes": [4], "iterations": 12, "shuffle_choices": True},
    "constrained": {"batch_sizes": [1, 4], "iterations": 12, "answer_mode": "constrained"},
    "combined": {
        "batch_sizes": [1, 3],
        "iterations": 12,
        "design": "rotation",
        "answer_order": "random",
        "answer_mode": "constrained",
        "shuffle_choices": True,
        "filler": {"tokens": [0, 30], "where": "end"},
    },
    "probe-combined": {
        "batch_sizes": [2, 3],
        "iterations": 12,
        "design": "probe",
        "answer_mode": "constrained",
        "shuffle_choices": True,
        "filler": {"tokens": [0, 20], "where": "after", "position": 1},
    },
    "window": {
        "batch_sizes": [1, 4],
        "iterations": 12,
        "answer_order": "random",
        "filler": {"tokens": [0, 60]},
        "fake": {"depends_on": "token-distance", "first": 0.7, "last": 0.3, "window": 120},
    },
    "collapse": {
        "batch_sizes": [4],
        "iterations": 12,
        "shuffle_choices": True,
        "fake": {"collapse": {"option": 4, "positions": [1, 2]}},
    },
    "quick-look": {"batch_sizes": [1, 4], "iterations": 20, "limit": 2},
    "variants": {
        "batch_sizes": [1, 3],
        "iterations": 12,
        "variants": ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}],
    },
    "all-wrong": {"batch_sizes": [1, 2, 3], "iterations": 12, "fake": {"first": 0.0, "last": 0.0}},
    "all-right": {"batch_sizes": [2], "iterations": 12, "fake": {"first": 1.0, "last": 1.0}},
    "parse-none": {"batch_sizes": [1, 3], "iterations": 12, "fake": {"malformed": 1.0}},
    "parse-half": {"batch_sizes": [1, 3], "iterations": 12, "fake": {"malformed": 0.5}},
}
"""Jobs the worker runs to the end."""
STATES: dict[str, dict[str, Any]] = {
    "queued": {"batch_sizes": [1, 4], "iterations": 12},
    "cancelled": {"batch_sizes": [1, 4], "iterations": 12},
    "cancelled-half": {"batch_sizes": [1, 4], "iterations": 12},
    "failed": {"batch_sizes": [1, 4], "iterations": 12},
    "failed-half": {"batch_sizes": [1, 4], "iterations": 12},
    "running-half": {"batch_sizes": [1, 4], "iterations": 12},
}
"""Jobs left unfinished: queued, cancelled (before or halfway), failed (every shard, or half), half done."""
MIGRATED = {"migrated": {"batch_sizes": [1, 4], "iterations": 12}}
"""A job run at the oldest revision's schema's era: written at head, the store taken down to 0001 and up."""
ALL = {**MIGRATED, **SHAPES, **STATES}
PAIRS = [
    ("n1-beside", "constrained"),
    ("n1-beside", "random-order"),
    ("n1-alone", "parse-none"),
    ("n3", "rotation"),
    ("n3", "probe"),
    ("reverse", "shuffled"),
    ("iterations-1", "iterations-2"),
    ("quick-look", "n1-beside"),
    ("variants", "variants:late-drop"),
    ("parse-half", "parse-none"),
    ("all-wrong", "all-right"),
    ("filler-end-sweep", "n3"),
    ("migrated", "n1-beside"),
    ("failed-half", "running-half"),
    ("cancelled", "queued"),
]
"""Compared pairs, each in every one of `view_cells.PAIR_VIEWS`."""


def _docstring_figures() -> dict[str, int]:
    shapes = len(ALL)
    return {
        "shapes": shapes,
        "views": len(VIEWS),
        "pairs": len(PAIRS),
        "pair_views": len(PAIR_VIEWS),
        "store_views": len(STORE_VIEWS),
        "cells": 2 * (shapes * (len(VIEWS) + len(STORE_VIEWS)) + len(PAIRS) * len(PAIR_VIEWS)),
    }


__doc__ = __doc__.format(**_docstring_figures())


# --- building the store -----------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def matrix(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, mmlu_dir: Path
) -> Iterator[Store]:
    """A store holding every shape (see the module's docstring), on each dialect."""
    request.getfixturevalue("ray_session")
    folder = tmp_path_factory.mktemp(f"matrix-{request.param}")
    if request.param == "sqlite":
        store = _build(Store(url=f"sqlite:///{folder / 'posbias.db'}", folder=folder, mmlu_dir=mmlu_dir))
        yield store
    else:
        server: PostgresServer = request.getfixturevalue("postgres_server")
        with server.scratch_database("matrix") as url:
            store = _build(Store(url=url, folder=folder, mmlu_dir=mmlu_dir))
            yield store
    store.write_refusals()


def _build(m: Store) -> Store:
    migrate.upgrade(m.url)
    for name, fields in MIGRATED.items():
        m.submit(name, {**FAKE, **fields})
    m.work()
    migrate.downgrade(m.url, "0001")
    migrate.upgrade(m.url)
    for name, fields in SHAPES.items():
        m.submit(name, {**FAKE, **fields})
    m.work()
    for name, fields in STATES.items():
        m.submit(name, {**FAKE, **fields})
    with database.connect(m.url) as db:
        held = _leave_unfinished(m, db)
        for name in ("failed", "failed-half"):
            for shard_id in held[name]:
                _kill(db, shard_id, job_id=m.jobs[name])
    return m


OWNER = "matrix"


def _leave_unfinished(m: Store, db: database.Database) -> dict[str, list[int]]:
    """Lease every shard of the unfinished shapes, answer half of the half-done ones with the fake engine (as
    a worker would), and cancel the cancelled ones. The shards still held, by shape."""
    held: dict[str, list[int]] = {}
    for name in STATES:
        job_id = m.jobs[name]
        if name == "queued":  # submitted after the worker ran: it waits, as a job nobody has run yet
            continue
        leases = queue.lease(db, owner=OWNER, limit=1000, lease_seconds=3600, job_ids=[job_id])
        if name.endswith("-half"):
            half = len(leases) // 2
            for lease in leases[:half]:
                engine = load_engine(lease.shard, config=WorkerConfig(cache_dir=str(m.folder / "cache")))
                result = run_shard(lease.shard, engine=engine)
                assert queue.complete(db, [result], owner=OWNER)[0].written
            leases = leases[half:]
        held[name] = [lease.shard_id for lease in leases]
        if name.startswith("cancelled"):
            posbias.cancel(job_id, settings=m.settings)
    return held


def _kill(db: database.Database, shard_id: int, *, job_id: int) -> None:
    """Fail a held shard until it is dead (its attempts used up), as an engine that keeps failing does."""
    while queue.fail(db, shard_id, owner=OWNER, error="the engine ran out of memory") is ShardStatus.queued:
        queue.lease(db, owner=OWNER, limit=1000, lease_seconds=3600, job_ids=[job_id])


# --- the matrix ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("shape", list(ALL))
def test_every_shape_opens_in_every_view(matrix: Store, shape: str, view: str) -> None:
    view_cells.view(matrix, shape, view)


@pytest.mark.parametrize("view", PAIR_VIEWS)
@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_every_pair_compares(matrix: Store, a: str, b: str, view: str) -> None:
    view_cells.pair(matrix, a, b, view)


@pytest.mark.parametrize("view", STORE_VIEWS)
def test_every_job_is_listed(matrix: Store, view: str) -> None:
    view_cells.listed(matrix, view)


def test_the_docstring_states_the_matrix() -> None:
    figures = _docstring_figures()
    assert f"{figures['cells']} cells" in (__doc__ or "")
    per_store = len(ALL) * (len(VIEWS) + len(STORE_VIEWS)) + len(PAIRS) * len(PAIR_VIEWS)
    assert figures["cells"] == 2 * per_store


def test_the_states_are_what_they_say(matrix: Store) -> None:
    status = {name: matrix.fact(matrix.jobs[name])["status"]["status"] for name in ALL}
    assert status["queued"] == "queued"
    assert status["cancelled"] == status["cancelled-half"] == "cancelled"
    assert status["failed"] == status["failed-half"] == "failed"
    assert status["running-half"] == "running"
    assert {status[name] for name in (*SHAPES, *MIGRATED)} == {"done"}
    assert matrix.fact(matrix.jobs["cancelled-half"])["status"]["trials_done"] > 0
    assert matrix.fact(matrix.jobs["failed-half"])["status"]["trials_done"] > 0
