"""The report file and the viewer, looked at in a real headless chromium (tests/support/browser.py) on
jobs the fake engine answered, on SQLite and PostgreSQL: the pages load with no console error and ask
nothing of any other machine; a point opens its trials and a trial its prompt and output; the variant and
band toggles change what is drawn; the viewer writes nothing. Screenshots go to build/screenshots/."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text
from support import browser as chromium
from support.in_process import run_cli

import posbias
from posbias.schemas import JobSpec, ShardResult
from posbias.schemas.attention import (
    AnswerSheet,
    AttentionRow,
    AttentionShard,
    LayerCheck,
    LayerKind,
    MaskCanary,
)
from posbias.schemas.schedule import RegressionRule
from posbias.service.schedules import schedule_rows, scheduler
from posbias.service.schedules.checkpoints import FolderSource
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.store.tables import Job, Result, Shard, Trial
from posbias.service.work import jobs, planner, queue
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

pytestmark = pytest.mark.skipif(chromium.missing() is not None, reason=chromium.missing() or "")

VARIANTS = {"variants": ["baseline", {"name": "late-rise", "fake": {"last": 0.95}}]}
SWEEP = {**VARIANTS, "answer_order": "random", "filler": {"tokens": [0, 120], "where": "end"}}


@pytest.fixture(scope="module")
def page() -> Iterator[chromium.Browser]:
    """One browser for the module's tests."""
    with chromium.browser() as opened:
        yield opened


def _dialect(url: str) -> str:
    return "postgresql" if url.startswith("postgresql") else "sqlite"


def _point_n(page: chromium.Browser, css: str) -> int:
    """The n a chart point's tooltip gives."""
    title = page.driver.execute_script(
        "return document.querySelector(arguments[0]).textContent", f"{css} title"
    )
    found = re.search(r"\(n = (\d+)\)", title)
    assert found, title
    return int(found[1])


def _opens_its_trials(page: chromium.Browser, point: str, *, batch_size: int) -> None:
    """Clicking `point` lists one trial per answer at it; the first opens with its prompt and output."""
    n = _point_n(page, point)
    page.click(point)
    page.wait_for("#point-trials .trial-link")
    assert page.count("#point-trials .trial-link") == n
    page.click("#point-trials .trial-link")
    page.wait_for("#trial pre.prompt")
    assert page.count("#trial .prompt .question") == batch_size  # every question's span outlined
    assert page.count("#trial .answers-table tbody tr") == batch_size
    output = page.driver.execute_script("return document.querySelector('#trial pre.output').textContent")
    assert re.search(r"^\d+\. [1-4]$", output, re.MULTILINE), output  # the raw output, constrained lines


def test_the_report_file_draws_every_view_offline(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path
) -> None:
    sweep = chromium.run_fake_job(db, SWEEP)
    other = chromium.run_fake_job(db, {"seed": 1})
    out = tmp_path / "report.html"
    done = run_cli(
        ["report", str(sweep), str(other), "--out", str(out)],
        env={"POSBIAS_DATABASE_URL": database_url, "POSBIAS_CACHE_DIR": str(tmp_path / "cache")},
        folder=tmp_path,
    )
    assert done.code == 0, done.stderr
    assert f"wrote {out}" in done.stdout
    html = out.read_text()
    assert "\\u003c/script\\u003e" in html and "<b>bold" not in html  # questions' markup, as data

    page.load(out.as_uri())
    assert page.console_errors() == []
    assert page.leaving() == set()
    # Every view the sweep's design has: answer slot (random order), token distance, filler, heatmap,
    # explain; and the comparison of the two jobs.
    for axis in ("position", "answer-slot", "token-distance", "filler-length"):
        assert page.count(f"#job-{sweep} svg.chart[data-axis='{axis}']") > 0, axis
    assert page.count(f"#job-{sweep} svg.heatmap") == 2  # one per variant at N = 4
    assert page.count(f"#job-{sweep} table.explain-table") == 2
    assert page.count("#comparison svg.chart") == 1

    # The band toggle: pointwise intervals shaded first, then the simultaneous band instead.
    pointwise = page.count("polygon.shade.pointwise")
    assert pointwise > 0 and page.count("polygon.shade.band") == 0
    page.click("input[name=shade][value=band]")
    assert page.count("polygon.shade.pointwise") == 0
    assert page.count("polygon.shade.band") > 0
    # The variant toggle: the second variant's points go, the baseline's stay.
    late = "circle.point[data-variant='late-rise']"
    baseline = page.count("circle.point[data-variant='baseline']")
    assert page.count(late) > 0
    page.click("#variant-toggle input[value='late-rise']")
    assert page.count(late) == 0
    assert page.count("circle.point[data-variant='baseline']") == baseline
    page.click("#variant-toggle input[value='late-rise']")
    assert page.count(late) > 0
    page.screenshot(f"report-{_dialect(database_url)}")

    # A point by position (filler 120, position 2) and one by token distance lead to their trials.
    _opens_its_trials(
        page,
        f"#job-{sweep} circle.point[data-axis='position'][data-filler='120'][data-pos='2']",
        batch_size=4,
    )
    page.screenshot(f"report-trial-{_dialect(database_url)}")
    _opens_its_trials(page, f"#job-{sweep} circle.point[data-axis='token-distance']", batch_size=4)
    assert page.count("b") == 0  # markup in a question is shown as text
    assert page.console_errors() == []
    assert page.leaving() == set()

    # A file that shows a sample of a job's trials says so, and a point lists the sample's answers there.
    sampled = tmp_path / "sampled.html"
    done = run_cli(
        ["report", str(other), "--out", str(sampled), "--max-trials", "2"],
        env={"POSBIAS_DATABASE_URL": database_url, "POSBIAS_CACHE_DIR": str(tmp_path / "cache")},
        folder=tmp_path,
    )
    assert done.code == 0, done.stderr
    page.load(sampled.as_uri())
    assert "2 of 6 trials shown" in page.driver.find_element("css selector", "header .sample").text
    page.click(f"#job-{other} circle.point[data-axis='position'][data-pos='1']")
    page.wait_for("#point-trials .trial-link")
    assert page.count("#point-trials .trial-link") == 2
    said = page.driver.find_element("css selector", "#point-trials p").text
    assert "of the 2 trials this file shows (of 6; the point counts 6 answers" in said, said
    assert page.console_errors() == []


def _state(db: Database) -> list[Any]:
    """What a write would change: every job's status and progress, every shard's, the result count."""
    with db.read() as session:
        return [
            session.execute(select(Job.id, Job.status, Job.finished_at).order_by(Job.id)).all(),
            session.execute(select(Shard.id, Shard.status, Shard.attempts).order_by(Shard.id)).all(),
            session.execute(select(Trial.id, Trial.status).order_by(Trial.id)).all(),
            session.scalar(select(func.count()).select_from(Result)),
        ]


def _schedule(db: Database, settings: Settings, folder: Path) -> int:
    """A schedule over a folder of two checkpoints, ticked, its jobs run and ticked again (verdicts):
    the second checkpoint's job id."""
    for name in ("ckpt-1", "ckpt-2"):
        (folder / name).mkdir(parents=True)
        (folder / name / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
        (folder / name / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    template = {"engine": {"name": "fake"}, "batch_sizes": [3], "iterations": 10}
    schedule_rows.add_schedule(
        db,
        "nightly",
        source=FolderSource(path=folder),
        template=template,
        baseline="first",
        rule=RegressionRule(max_drop=5),
        settings=settings,
    )
    scheduler.tick(db, settings=settings)
    found = {c.name: c.job_id for c in schedule_rows.list_checkpoints(db, "nightly")}
    for job_id in found.values():
        assert job_id is not None
        chromium.finish_fake_job(db, job_id)
    scheduler.tick(db, settings=settings)
    second = found["ckpt-2"]
    assert second is not None
    return second


def test_the_viewer_serves_the_store_read_only(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path, mmlu_dir: Path
) -> None:
    sweep = chromium.run_fake_job(db, VARIANTS)
    other = chromium.run_fake_job(db, {"seed": 1})
    running = chromium.run_fake_job(db, {"seed": 2, "iterations": 9}, shards=1)  # 1 of 3 shards done
    settings = Settings(database_url=database_url, cache_dir=tmp_path / "cache", mmlu_dir=mmlu_dir)
    checkpoint = _schedule(db, settings, tmp_path / "run")
    dialect = _dialect(database_url)
    with posbias.viewer(settings=settings).start() as view:
        assert view.url.startswith("http://127.0.0.1:")
        page.load(view.url)
        assert page.count("table.job-list tbody tr") == 5
        bar = f".progress[data-job='{running}'] progress"
        assert page.driver.execute_script("return document.querySelector(arguments[0]).value", bar) == 3
        page.screenshot(f"viewer-list-{dialect}")

        page.load(f"{view.url}job/{sweep}")
        assert page.count("circle.point[data-variant='late-rise']") > 0
        assert page.count("polygon.shade.pointwise") > 0
        page.click("input[name=shade][value=band]")
        assert page.count("polygon.shade.pointwise") == 0
        assert page.count("polygon.shade.band") > 0
        _opens_its_trials(
            page, "circle.point[data-axis='position'][data-pos='1']", batch_size=4
        )  # fetched live
        page.screenshot(f"viewer-job-{dialect}")

        # A schedule's checkpoint shows the schedule as a strip, itself marked, each linking to its job.
        page.load(f"{view.url}job/{checkpoint}")
        assert page.count(".strip .checkpoint") == 2
        assert page.count(".strip .checkpoint.current") == 1
        assert page.count(f".strip a[href='/job/{checkpoint - 1}']") == 1
        page.screenshot(f"viewer-schedule-{dialect}")

        page.load(f"{view.url}compare?a={sweep}&b={other}")
        assert page.count("#comparison svg.chart") == 1
        page.screenshot(f"viewer-compare-{dialect}")
        assert page.console_errors() == []
        assert page.leaving() == set()
        assert {u for u in page.requested() if u.startswith(view.url + "api/trial/")}  # trials came live
        assert {u for u in page.requested() if u.startswith(view.url + "api/answers/")}  # and points' answers

        # Read-only: every other method is refused, nothing changed, and the connection cannot write.
        before = _state(db)
        for path in ("", f"job/{sweep}", "api/jobs", f"api/trial/{sweep}/1"):
            for method in ("POST", "PUT", "DELETE"):
                request = urllib.request.Request(view.url + path, data=b"status=cancelled", method=method)
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(request, timeout=30)
                assert refused.value.code == 405
        with pytest.raises(Exception, match=r"(?i)read-?only"), view.db.write() as session:
            session.execute(text("DELETE FROM results"))
        assert _state(db) == before

        # Progress is live: the running job finishes while its list is open.
        page.load(view.url)
        chromium.finish_fake_job(db, running)
        page.wait_for(f".progress[data-job='{running}'] progress[value='9']", timeout=30)


ATTENTION_WINDOW = 200
"""The sliding window of the simulated `hf` job's canary (tokens): the fake prompts' first questions lie
beyond it, the last ones inside."""


def _with_attention(result: ShardResult) -> ShardResult:
    """`result` as the `hf` engine returns it: attention rows for each answer in four layers (0 and 2
    sliding with `ATTENTION_WINDOW`, 1 and 3 global) and the canary that built them. Own-question attention
    falls with token distance; in a sliding layer it is exactly 0 a window or more back."""
    answers = result.answers
    rows = []
    for trial, position, distance in zip(
        answers.trial_index, answers.position, answers.token_distance, strict=True
    ):
        assert distance is not None
        for layer in range(4):
            sliding = layer % 2 == 0
            jitter = 0.001 * ((trial * 7 + position * 3) % 5)  # trials differ
            masked = sliding and distance >= ATTENTION_WINDOW
            own = 0.0 if masked else (0.5 - 0.1 * layer) * 50 / (50 + distance) + jitter
            rest = (1.0 - own) / 4
            rows.append(
                AttentionRow(
                    trial_index=trial,
                    position=position,
                    layer=layer,
                    layer_kind=LayerKind.sliding if sliding else LayerKind.global_,
                    token_distance=distance,
                    query_tokens=3,
                    **dict.fromkeys(["sink_mean", "other_mean", "instructions_mean", "answers_mean"], rest),
                    **dict.fromkeys(["sink_max", "other_max", "instructions_max"], 2 * rest),
                    own_mean=own,
                    own_max=min(1.0, 2 * own),
                    beyond_window_mean=0.0 if sliding else 0.1,
                    beyond_window_max=0.0 if sliding else 0.2,
                )
            )
    canary = MaskCanary(
        window=ATTENTION_WINDOW,
        prompt_tokens=2 * ATTENTION_WINDOW,
        layers=tuple(
            LayerCheck(
                layer=layer,
                kind=LayerKind.sliding if layer % 2 == 0 else LayerKind.global_,
                window=ATTENTION_WINDOW if layer % 2 == 0 else None,
                beyond_mass=0.0 if layer % 2 == 0 else 0.05,
                edge_mass=0.01,
                passed=True,
            )
            for layer in range(4)
        ),
    )
    attention = AttentionShard(
        rows=tuple(rows),
        canary=canary,
        answer_sheet=AnswerSheet.gold,
        state_bytes_per_trial=1000,
        map_bytes_peak=1000,
    )
    return result.model_copy(update={"attention": attention})


def _attention_job(db: Database) -> int:
    """A job answered by the fake engine whose shards come back with attention figures, written by the
    queue's own write path as an `hf` job's are (`queue.complete`, which writes the attention rows)."""
    values = {"model": "fake/gemma-like", "engine": {"name": "fake"}, "batch_sizes": [4], "iterations": 6}
    spec = JobSpec.model_validate({**values, "shard_size": 3, "answer_mode": "constrained", **VARIANTS})
    job_id = jobs.submit(db, spec, planner.plan(spec, pool=chromium.question_pool())).job_id
    while leases := queue.lease(db, owner="test", limit=1, lease_seconds=60, job_ids=[job_id]):
        shard = leases[0].shard
        engine = FakeEngine(
            shard.fake, seed=spec.seed if shard.fake.seed is None else shard.fake.seed, model=shard.model
        )
        result = _with_attention(run_shard(shard, engine=engine))
        assert queue.complete(db, [result], owner="test")[0].written
    return job_id


def _drawn(page: chromium.Browser, axis: str) -> dict[tuple[str, str, float], float]:
    """Own-question attention as the page's points carry it: (variant, layer kind, x) -> value."""
    points = page.driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((c) => [c.dataset.variant, c.dataset.kind, "
        "Number(c.dataset.pos), Number(c.dataset.own)])",
        f"svg.chart[data-axis='attention-{axis}'] circle.point",
    )
    return {(variant, kind, pos): own for variant, kind, pos, own in points}


def test_the_report_draws_an_hf_jobs_attention_as_the_curve_command_reads_it(
    page: chromium.Browser, db: Database, database_url: str, tmp_path: Path
) -> None:
    job = _attention_job(db)
    plain = chromium.run_fake_job(db, {"seed": 1})
    env = {"POSBIAS_DATABASE_URL": database_url, "POSBIAS_CACHE_DIR": str(tmp_path / "cache")}
    out = tmp_path / "report.html"
    done = run_cli(["report", str(job), str(plain), "--out", str(out)], env=env, folder=tmp_path)
    assert done.code == 0, done.stderr
    page.load(out.as_uri())
    assert page.console_errors() == []
    assert page.leaving() == set()
    # The job without attention shows no attention section; the hf job shows one, with the window marked.
    assert page.count(f"#job-{plain} section.attention") == 0
    assert page.count(f"#job-{job} section.attention svg.chart") == 2  # one N: by position, by distance
    distance_lines = (
        f"svg.chart[data-axis='attention-token-distance'] line.window-line[data-x='{ATTENTION_WINDOW}']"
    )
    assert page.count(distance_lines) == 1  # both variants: one window
    assert page.count("svg.chart[data-axis='attention-position'] line.window-line") == 1
    page.screenshot(f"report-attention-{_dialect(database_url)}")

    # Every point is what `posbias curve --metric attention --json` reads, by position and by distance.
    width = ATTENTION_WINDOW // 8
    for axis, flags in (("position", []), ("token-distance", ["--bin-width", str(width)])):
        read = run_cli(
            ["curve", "--job", str(job), "--metric", "attention", "--by", axis, *flags, "--json"],
            env=env,
            folder=tmp_path,
        )
        assert read.code == 0, read.stderr
        expected = {
            (c["variant"], c["layer_kind"], p["x"] if axis == "position" else p["x"] - width / 2): p[
                "own_mean"
            ]
            for c in json.loads(read.stdout)
            for p in c["points"]
        }
        assert len(expected) > 8
        assert _drawn(page, axis) == pytest.approx(expected, rel=1e-12)
        if axis == "position":  # the window's line: after the last position a window or more away
            far = [
                p["x"]
                for c in json.loads(read.stdout)
                for p in c["points"]
                if p["token_distance"] >= ATTENTION_WINDOW
            ]
            mark = "svg.chart[data-axis='attention-position'] line.window-line"
            assert page.driver.execute_script(
                "return document.querySelector(arguments[0]).dataset.x", mark
            ) == str(max(far) + 0.5)
    # Beyond the window the sliding layers' points are exactly 0 and the global layers' are not.
    beyond = {k: v for k, v in _drawn(page, "token-distance").items() if k[2] >= ATTENTION_WINDOW}
    assert beyond and all((v == 0.0) == (k[1] == "sliding") for k, v in beyond.items())

    # A point leads to its trials: position 1 of the baseline's global layers, one trial per answer.
    _opens_its_trials(
        page,
        f"#job-{job} svg.chart[data-axis='attention-position'] circle.point[data-variant='baseline']"
        "[data-kind='global'][data-pos='1']",
        batch_size=4,
    )
    assert page.console_errors() == []
