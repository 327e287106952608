"""`posbias diagnose` end to end on the tiny random Gemma 2 (on SQLite) and Gemma 3 (on PostgreSQL), from
tests/support/tinymodels.py: the battery is planned from each model's config at the batch size its
4,096-token context holds, submitted through the API, its shards run through the queue on the real engines
(vLLM on CPU for the behaviour job and the intervention's baseline, global-only and rope-base:x4; hf for the
mechanism jobs), and the same command then reads it into a diagnosis, its JSON and its page.

The models' weights are random, so what they show is noise: the tests check what a user checks (every job
done, a verdict for every suspect from every line, the verdicts the config decides, the JSON and the page),
not the findings. Engines are loaded once per model and variant; a model's are closed before the next
model's load."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from support.in_process import run_cli

import posbias
from posbias.schemas import JobStatus, PosbiasError, ShardResult, ShardSpec, WorkerConfig
from posbias.schemas.attention import LayerKind
from posbias.schemas.diagnosis import Call, DiagnoseOutcome, Line, Suspect
from posbias.service.diagnose import mechanism, model_facts, plan_battery
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.work import jobs, queue
from posbias.workers.engine import Engine
from posbias.workers.loader import ShardRunners, load_engine

pytestmark = pytest.mark.vllm


def least_budget(model: Path, *, settings: Settings) -> int:
    """The least `--budget` the model's battery takes (16 sampled sets a job: the plan refuses less)."""
    facts = model_facts(None, str(model), engine="vllm", fake=None, settings=settings)
    low, high = 1, 4096  # refused, accepted
    while high - low > 1:
        middle = (low + high) // 2
        try:
            plan_battery(facts, budget=middle)
        except PosbiasError:
            low = middle
        else:
            high = middle
    return high


class Engines:
    """The engines of one model at a time, by model key, as a worker's actors hold them."""

    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.model: str | None = None
        self.loaded: dict[str, Engine] = {}

    def run(self, shard: ShardSpec) -> ShardResult:
        """`shard` answered by its engine (loaded on first need, the previous model's closed first)."""
        if shard.model != self.model:
            self.close()
            self.model = shard.model
        if shard.model_key not in self.loaded:
            self.loaded[shard.model_key] = load_engine(shard, config=self.config)
        return ShardRunners(self.loaded[shard.model_key]).one(shard)

    def close(self) -> None:
        for engine in reversed(self.loaded.values()):
            engine.close()
        self.loaded.clear()


@pytest.fixture(scope="module")
def engines(worker_config: WorkerConfig) -> Iterator[Engines]:
    held = Engines(worker_config)
    yield held
    held.close()


def _run_queue(db: Database, engines: Engines) -> None:
    """Every queued shard leased, answered and written back, as `posbias worker --until-empty` does."""
    while leases := queue.lease(db, owner="test", limit=4, lease_seconds=900):
        results = [engines.run(lease.shard) for lease in leases]
        assert all(w.written for w in queue.complete(db, results, owner="test"))


def _diagnose_end_to_end(
    model: Path, *, db: Database, settings: Settings, engines: Engines, folder: Path
) -> DiagnoseOutcome:
    """`posbias diagnose MODEL --budget B` (from Python), the jobs run, then the same command from the CLI
    with `--json --html PATH`: the outcome it prints, after checking the plan, the jobs and the page."""
    budget = least_budget(model, settings=settings)
    first = posbias.diagnose(str(model), settings=settings, budget=budget)
    battery = first.battery
    assert first.diagnosis is None and all(job.created for job in first.jobs)
    assert [job.line for job in first.jobs][:2] == [Line.behaviour, Line.intervention]
    assert battery.batch_size < 10  # 10 questions of the tiny vocabulary do not fit 4,096 tokens
    (intervention,) = [job.spec for job in battery.jobs if job.line is Line.intervention]
    assert intervention.names == ("baseline", "global-only", "rope-base:x4")
    assert "hf" in {str(job.spec.engine.name) for job in battery.jobs if job.line is Line.mechanism}

    _run_queue(db, engines)
    env = {
        "POSBIAS_DATABASE_URL": settings.database_url,
        "POSBIAS_MMLU_DIR": str(settings.mmlu_dir),
        "POSBIAS_CACHE_DIR": str(settings.cache_dir),
    }
    page = folder / "diagnosis.html"
    args = ["diagnose", str(model), "--budget", str(budget), "--json", "--html", str(page)]
    read = run_cli(args, env=env, folder=folder)
    assert read.code == 0, read.stderr
    outcome = DiagnoseOutcome.model_validate(json.loads(read.stdout))
    assert [j.key for j in outcome.jobs] == [j.key for j in first.jobs]  # found again, not doubled
    assert not any(j.created for j in outcome.jobs)
    assert all(jobs.get(db, j.job_id).status is JobStatus.done for j in outcome.jobs)
    assert outcome.diagnosis is not None
    html = page.read_text()
    for verdict in outcome.diagnosis.suspects:
        assert f">{verdict.suspect.value}<" in html
    for job in outcome.jobs:
        assert f'/job/{job.job_id}"' in html
    return outcome


def _check_verdicts(outcome: DiagnoseOutcome) -> None:
    """A verdict for every suspect from every line, each tested one citing jobs of the battery; and the
    calls the config decides: both models slide and state a RoPE base, so the window and RoPE are tested by
    the intervention (global-only, rope-base:x4) and by the mechanism (hf ran), never ruled out unseen."""
    diagnosis = outcome.diagnosis
    assert diagnosis is not None
    ids = {j.job_id for j in outcome.jobs}
    assert set(diagnosis.job_ids) == ids
    assert [v.suspect for v in diagnosis.suspects] == list(Suspect)
    for verdict in diagnosis.suspects:
        assert [f.line for f in verdict.findings] == list(Line), verdict.suspect
        for finding in verdict.findings:
            assert finding.reason
            if finding.call is not Call.not_tested:
                assert finding.job_ids and set(finding.job_ids) <= ids
        decided = {f.call for f in verdict.findings} - {Call.not_tested, Call.cannot_tell}
        if len(decided) == 1:
            assert verdict.call in decided
        elif len(decided) > 1:
            assert verdict.call is Call.cannot_tell  # lines that disagree
    by_suspect = {v.suspect: {f.line: f for f in v.findings} for v in diagnosis.suspects}
    for suspect, variant in ((Suspect.window, "global-only"), (Suspect.rope, "rope-base:x4")):
        found = by_suspect[suspect]
        assert found[Line.intervention].call is not Call.not_tested
        assert found[Line.intervention].variant == variant
        assert found[Line.mechanism].call is not Call.not_tested
        assert found[Line.behaviour].call is not Call.not_tested


# One store a model: what differs between the stores is the store's part, the same for both models, and each
# diagnosis takes two to three minutes here (the gemma2's also checks the mechanism line's reading).
@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_tiny_gemma2_is_diagnosed_end_to_end(
    db: Database,
    database_url: str,
    tiny_gemma2_dir: Path,
    cache_dir: Path,
    mmlu_dir: Path,
    engines: Engines,
    tmp_path: Path,
) -> None:
    settings = Settings(database_url=database_url, mmlu_dir=mmlu_dir, cache_dir=cache_dir)
    outcome = _diagnose_end_to_end(
        tiny_gemma2_dir, db=db, settings=settings, engines=engines, folder=tmp_path
    )
    _check_verdicts(outcome)
    assert outcome.battery.facts.sliding_window_layers == (0, 2)
    _check_mechanism(db, outcome)


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_tiny_gemma3_is_diagnosed_end_to_end(
    db: Database,
    database_url: str,
    tiny_gemma3_dir: Path,
    cache_dir: Path,
    mmlu_dir: Path,
    engines: Engines,
    tmp_path: Path,
) -> None:
    settings = Settings(database_url=database_url, mmlu_dir=mmlu_dir, cache_dir=cache_dir)
    outcome = _diagnose_end_to_end(
        tiny_gemma3_dir, db=db, settings=settings, engines=engines, folder=tmp_path
    )
    _check_verdicts(outcome)
    assert outcome.battery.facts.sliding_window_layers == (0, 1, 2, 3, 4)


def _check_mechanism(db: Database, outcome: DiagnoseOutcome) -> None:
    """The mechanism line's calls rest on the numbers the store holds: the three mechanism jobs (hf, hf with
    a position gap, and the same trials answered on vLLM) read by `mechanism.gather`, called by
    `mechanism.finding`, whatever the random model shows."""
    battery = outcome.battery
    window_tokens = battery.facts.sliding_window
    ids = {j.key: j.job_id for j in outcome.jobs}
    planned = [job for job in battery.jobs if job.line is Line.mechanism]
    assert [str(job.spec.engine.name) for job in planned] == ["hf", "hf", "vllm"]
    plain, gapped, scored = (ids[job.key] for job in planned)
    evidence = mechanism.gather(db, battery, ids)
    with db.read() as session:
        stored = session.execute(
            sa.text(
                "SELECT avg(own_mean), count(*) FROM attention WHERE job_id = :j AND layer_kind = 'global'"
            ),
            {"j": plain},
        ).one()
        answered = session.execute(
            sa.text("SELECT count(*) FROM results WHERE job_id = :j AND predicted IS NOT NULL"), {"j": scored}
        ).scalar_one()
    assert evidence is not None and evidence.attention is not None
    attention, gap = evidence.attention, evidence.gap
    trials = planned[0].spec.total_trials

    # The window: the mask leaves the sliding layers nothing beyond it, and their attention is scored
    # against what vLLM answered on the same trials (not the hf job's teacher-forced sheet).
    assert attention.window == window_tokens and attention.sliding_beyond_max == 0.0
    assert attention.scored_job_id == scored and answered > 0
    (sliding,) = [a for a in attention.aurocs if a.layer_kind is LayerKind.sliding]
    assert sliding.trials == trials and sliding.low is not None and sliding.high is not None
    window = mechanism.finding(Suspect.window, evidence, window=window_tokens)
    assert window.line is Line.mechanism and window.unit == "AUROC"
    assert window.job_ids == (plain, scored)
    assert window.effect is not None
    assert (window.effect.estimate, window.effect.low, window.effect.high) == (
        sliding.auroc,
        sliding.low,
        sliding.high,
    )
    expected = (
        Call.ruled_out
        if max(abs(sliding.low - 0.5), abs(sliding.high - 0.5)) <= mechanism.AUROC_BOUND
        else Call.implicated
        if sliding.low > 0.5
        else Call.cannot_tell
    )
    assert window.call is expected, window

    # RoPE: the gap job against the plain one, paired over every (trial, position, global layer).
    assert gap is not None and gap.trials == trials
    assert gap.pairs == stored[1]
    assert abs(gap.plain - stored[0]) < 1e-9
    assert gap.low is not None and gap.high is not None and gap.low <= gap.change <= gap.high
    rope = mechanism.finding(Suspect.rope, evidence, window=window_tokens)
    assert rope.unit == "%" and rope.job_ids == (plain, gapped)
    assert rope.effect is not None and rope.effect.estimate == gap.change
    if max(abs(gap.low), abs(gap.high)) <= mechanism.GAP_BOUND:
        assert rope.call is Call.ruled_out
    else:
        assert rope.call is (Call.implicated if gap.high < 0 else Call.cannot_tell)
    assert gap.gapped != gap.plain  # the gap moved RoPE: the global layers' attention changed
