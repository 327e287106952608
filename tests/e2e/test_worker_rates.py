"""`posbias worker` says at the end of a run how fast it went: trials/s, results written/s, and the time
in the engine against the time in the store; `--json` carries the same figures."""

from __future__ import annotations

from typing import Any

import pytest

Posbias = Any  # `cli`: run(*args, check=True, **env) -> Done (tests/e2e/conftest.py)

FAKE = ("--engine", "fake", "--fake-first", "0.2", "--fake-last", "0.8")


# One dialect: the figures are the dispatcher's tally, the same on both stores (test_store_rows.py checks
# the writes on both); each worker run costs an actor start.
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_worker_reports_its_rates(cli: Posbias) -> None:
    cli("db", "upgrade")
    cli("submit", *FAKE, "--batch-sizes", "3", "--iterations", "10")
    cli("submit", *FAKE, "--batch-sizes", "4", "--iterations", "5", "--seed", "7")

    worker = cli("worker", "--until-empty", "--json").json()

    assert worker["trials_done"] == 15 and worker["results_written"] == 10 * 3 + 5 * 4
    rates = worker["rates"]
    assert rates["trials_per_second"] > 0 and rates["results_per_second"] > 0
    assert rates["trials_per_second"] * worker["seconds"] == pytest.approx(15, rel=0.01)
    assert 0 < rates["store_seconds"] <= worker["seconds"] and rates["engine_seconds"] >= 0

    cli("submit", *FAKE, "--batch-sizes", "2", "--iterations", "3", "--seed", "8")
    said = cli("worker", "--until-empty").stdout
    assert "worker done: " in said and "(3 trials)" in said
    assert "trials/s" in said and "results written/s" in said
    assert "in the engine" in said and "in the store" in said
