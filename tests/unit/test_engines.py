"""Engines as plug-ins: each declares what the control plane needs (`posbias.workers.engines`), and the
control plane asks the declaration, never naming an engine. A toy engine from outside posbias
(`support/toy_engine`, one folder) runs once it is registered."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import toy_engine

from posbias.schemas import EngineName, JobSpec, PosbiasError, QuestionPool, WorkerConfig
from posbias.service.dispatch.placement import Placer
from posbias.service.settings import Settings
from posbias.service.work.planner import plan
from posbias.service.work.shards import shard_spec
from posbias.service.work.submission import prepare
from posbias.workers import engines
from posbias.workers.engines.registry import BUILT_IN
from posbias.workers.loader import load_engine
from posbias.workers.shard import run_shard

REPO = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"\bEngineName\.[A-Za-z_]\w*")


@pytest.fixture
def toy() -> Iterator[engines.EngineDeclaration]:
    """The toy engine, registered for the test."""
    yield engines.register(toy_engine.DECLARATION)
    engines.unregister(toy_engine.NAME)


def test_the_control_plane_never_names_an_engine() -> None:
    named = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sorted((REPO / "service").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if NAMED.search(line)
    ]
    assert named == [], "ask the engine's declaration (posbias.workers.engines.declared) instead"


def test_every_built_in_engine_is_declared_in_a_folder_of_its_name() -> None:
    assert set(BUILT_IN) == set(EngineName)
    for name in EngineName:
        assert engines.declared(name).name == name
        assert (REPO / "workers" / "engines" / name / "__init__.py").is_file()


def test_a_spec_may_name_a_plug_in_engine_but_submit_refuses_one_not_registered(
    make_pool: Callable[..., QuestionPool], tmp_path: Path
) -> None:
    spec = JobSpec.model_validate({"model": "toy/model", "engine": {"name": "no-such-engine"}})
    assert spec.engine.name == "no-such-engine"
    settings = Settings(cache_dir=tmp_path)
    with pytest.raises(PosbiasError, match="no engine is named 'no-such-engine': the engines are fake, hf"):
        prepare(spec, settings=settings, pools={"mmlu": make_pool(60)})
    with pytest.raises(ValueError, match="a plug-in engine's name"):
        JobSpec.model_validate({"model": "m", "engine": {"name": "Not A Name"}})


def test_a_registered_toy_engine_is_placed_built_and_answers(
    toy: engines.EngineDeclaration, make_pool: Callable[..., QuestionPool], tmp_path: Path
) -> None:
    spec = JobSpec.model_validate(
        {"model": "toy/model", "engine": {"name": toy.name, "tensor_parallel_size": 2}, "batch_sizes": [3]}
    )
    planned = plan(spec, pool=make_pool(60))
    shard = shard_spec(spec, job_id=1, shard_id=1, trials=planned.trials[:2], questions=planned.questions)

    on_gpus = Placer(device="gpu").placement(shard)
    assert (on_gpus.num_gpus, on_gpus.num_cpus, on_gpus.grows) == (2, 1, True), "it declared the device"
    assert Placer(device="cpu").placement(shard).num_gpus == 0

    result = run_shard(shard, engine=load_engine(shard, config=WorkerConfig(cache_dir=str(tmp_path))))
    assert [r.predicted for r in result.results] == [0] * 6, "the first option, every position"
    assert result.engine.name == toy.name
