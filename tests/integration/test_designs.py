"""Every design end to end on the fake engine (a real local Ray, the dispatcher, SQLite and PostgreSQL): the
prompts rebuilt from the store, checked position by position against what was stored; answer slots,
filler spans and window fields; curves on every axis, the SQL views, and `explain` naming the cause of
fakes driven by each one at 200 trials."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from posbias.schemas import ChatTemplateUse, CurveAxis, CurveQuery, JobSpec, JobStatus, ParseStatus, Submitted
from posbias.service import curves, database, jobs, shards
from posbias.service.database import Database
from posbias.service.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.tables import Result, Shard, Trial
from posbias.workers.filler import BUILTIN_TEXT
from posbias.workers.prompts import answer_regex, render
from posbias.workers.testing import FakeTokenizer

pytestmark = pytest.mark.usefixtures("ray_session")

WINDOW = 100
FAKE = {"first": 0.3, "last": 0.6, "window": WINDOW, "question_effect": 0.2}
DESIGNS: dict[str, dict[str, Any]] = {
    "reverse, constrained": {"answer_order": "reverse", "answer_mode": "constrained"},
    "random order, filler after 2 (sweep), free": {
        "answer_order": "random",
        "filler": {"tokens": [0, 60], "where": "after", "position": 2},
    },
    "probe, filler before, constrained": {
        "design": "probe",
        "answer_mode": "constrained",
        "filler": {"tokens": [40], "where": "before"},
    },
    "random order, filler at the end (sweep), constrained": {
        "answer_order": "random",
        "answer_mode": "constrained",
        "filler": {"tokens": [0, 80]},
    },
}


def _dispatch(db: Database, settings: Settings) -> None:
    dispatcher = Dispatcher(db, settings=settings)
    try:
        dispatcher.run(until_empty=True)
    finally:
        dispatcher.close()


def test_every_design_runs_and_stores_what_its_prompts_asked(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    submitted = {
        name: make_job(db, batch_sizes=(4,), iterations=4, fake=FAKE, **fields).job_id
        for name, fields in DESIGNS.items()
    }
    _dispatch(db, fast_settings(db.url))  # one fake model: one actor answers every job

    tokenizer = FakeTokenizer()  # what the fake engine's worker rendered with
    for name, job_id in submitted.items():
        job = jobs.get(db, job_id)
        assert job.status is JobStatus.done, (name, job.error)
        spec = job.spec
        with db.read() as session:
            shard_ids = list(session.scalars(select(Shard.id).where(Shard.job_id == job_id)))
            stored = {
                row.index: row
                for row in session.execute(select(Trial).where(Trial.job_id == job_id)).scalars()
            }
            results = {
                (r.trial_id, r.position): r
                for r in session.execute(select(Result).where(Result.job_id == job_id)).scalars()
            }
        rebuilt = [t for spec_ in shards.from_store(db, shard_ids).values() for t in spec_.trials]
        assert len(rebuilt) == spec.total_trials == len(stored)
        questions = shards.from_store(db, shard_ids)[shard_ids[0]].questions | {
            qid: q for s in shards.from_store(db, shard_ids).values() for qid, q in s.questions.items()
        }
        for trial in rebuilt:
            row = stored[trial.index]
            _check_trial(name, spec, trial, row, results, questions, tokenizer)


def _check_trial(
    name: str,
    spec: JobSpec,
    trial: Any,
    row: Any,
    results: dict[tuple[int, int], Any],
    questions: dict[str, Any],
    tokenizer: FakeTokenizer,
) -> None:
    prompt = render(
        trial,
        questions=questions,
        template=spec.prompt,
        chat_template=ChatTemplateUse.auto,
        tokenizer=tokenizer,
        filler=spec.filler,
        seed=spec.seed,
    )
    assert row.prompt_tokens == prompt.prompt_tokens, name
    encoding = tokenizer.encode(prompt.text, add_special_tokens=False)
    offsets = encoding.offsets

    def span_text(start: int, end: int) -> str:
        return prompt.text[offsets[start][0] : offsets[end - 1][1]]

    # The design as stored, and as the prompt says it.
    paragraphs = prompt.user_text.split("\n\n")
    if trial.probe is not None:
        assert (
            row.probe_position == trial.probe
            and paragraphs[-1] == f"Answer question {trial.probe} only, on one line:"
        )
    elif trial.answer_order is not None:
        assert row.answer_order == list(trial.answer_order)
        assert (
            paragraphs[1] == f"Answer the questions in this order: {', '.join(map(str, trial.answer_order))}."
        )
    else:
        assert row.answer_order is None and "in this order" not in prompt.user_text
    assert row.filler_tokens == trial.filler_tokens
    if trial.filler_tokens:
        # The filler the model saw: exactly the asked length in its tokens, where the design puts it.
        assert (row.filler_token_start, row.filler_token_end) == prompt.filler_tokens
        assert row.filler_token_end - row.filler_token_start == trial.filler_tokens
        shown = " ".join(span_text(row.filler_token_start, row.filler_token_end).split())
        assert shown in " ".join((BUILTIN_TEXT + " " + BUILTIN_TEXT).split())
        before = prompt.text[: offsets[row.filler_token_start][0]]
        where = spec.filler.where.value  # type: ignore[union-attr]
        if where == "before":
            assert "1. Question:" not in before
        elif where == "after":
            assert f"{spec.filler.position}. Question:" in before  # type: ignore[union-attr]
            assert f"{spec.filler.position + 1}. Question:" not in before  # type: ignore[union-attr]
        else:
            assert f"{trial.batch_size}. Question:" in before
    else:
        assert row.filler_token_start is None and row.filler_token_end is None

    # The answers: one per position asked, each on the line the output has it, the constrained output the
    # design's pattern.
    output = row.output_text or ""
    if spec.answer_mode.value == "constrained":
        assert re.fullmatch(answer_regex(prompt.n_options, asked=prompt.asked), output), (name, output)
    lines = [int(line.split(".")[0]) for line in output.splitlines() if re.match(r"\d+\.", line)]
    asked = set(prompt.asked)
    for position in range(1, trial.batch_size + 1):
        result = results.get((row.id, position))
        if position not in asked:
            assert result is None, (name, position)
            continue
        assert result is not None, (name, position)
        placed = prompt.questions[position - 1]
        # The stored token span is the question's block in the prompt, position by position.
        assert (result.question_token_start, result.question_token_end) == (
            placed.token_start,
            placed.token_end,
        )
        block = span_text(result.question_token_start, result.question_token_end)
        assert block.startswith(
            f"{position}. Question: {questions[trial.question_ids[position - 1]].question}"
        )
        if result.parse_status is ParseStatus.missing:
            assert result.answer_slot is None and position not in lines
            continue
        assert result.answer_slot == lines.index(position) + 1
        assert (
            result.token_distance == row.prompt_tokens - result.question_token_end + result.answer_token_index
        )
        assert result.in_window == (result.token_distance < WINDOW)
        assert result.visible_layers == (4 if result.in_window else 2)


def test_curves_on_every_axis_and_the_views_for_a_sweep(
    db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    job = make_job(
        db,
        **DESIGNS["random order, filler at the end (sweep), constrained"],
        batch_sizes=(5,),
        iterations=20,
        fake=FAKE,
    ).job_id
    _dispatch(db, fast_settings(db.url))
    query = CurveQuery(job_id=job)

    by_position = curves.curves(db, query, resamples=200)
    assert [(c.filler_tokens, [p.position for p in c.points]) for c in by_position] == [
        (0, [1, 2, 3, 4, 5]),
        (80, [1, 2, 3, 4, 5]),
    ]
    assert all(p.n == 20 for c in by_position for p in c.points)
    by_slot = curves.curves(db, query, by=CurveAxis.answer_slot, resamples=200)
    assert [p.position for p in by_slot[0].points] == [1, 2, 3, 4, 5] and by_slot[0].by == "answer-slot"
    (by_filler,) = curves.curves(db, query, by=CurveAxis.filler_length, resamples=200)
    assert [(p.position, p.n) for p in by_filler.points] == [(0, 100), (80, 100)]
    assert by_filler.contrast is not None and by_filler.clusters == 20  # a set is one cluster
    (by_distance,) = curves.curves(db, query, by=CurveAxis.token_distance, bin_width=50, resamples=200)
    assert sum(p.n for p in by_distance.points) == 200

    with db.read() as session:
        slots = session.execute(
            text("SELECT answer_slot, n FROM slot_curve WHERE job_id = :j ORDER BY 1"), {"j": job}
        ).all()
        grid = session.execute(
            text(
                "SELECT filler_tokens, position, n, accuracy, ci_low, ci_high "
                "FROM filler_curve WHERE job_id = :j"
            ),
            {"j": job},
        ).all()
        window = session.execute(
            text("SELECT in_window, visible_layers, n FROM window_curve WHERE job_id = :j ORDER BY 1"),
            {"j": job},
        ).all()
    assert [tuple(row) for row in slots] == [(s, 40) for s in range(1, 6)]
    assert len(grid) == 10 and all(row.n == 20 and row.ci_low <= row.accuracy <= row.ci_high for row in grid)
    assert {(bool(r.in_window), r.visible_layers) for r in window} <= {(False, 2), (True, 4)}
    assert sum(r.n for r in window) == 200

    (explained,) = curves.explain(db, [job], resamples=100)
    assert explained.window is not None and explained.window.window == WINDOW
    assert {e.name for e in explained.effects} == {"position", "answer slot", "token distance"}


# --- explain attributes each fake to its cause, at 200 trials -------------------------------------------


@pytest.fixture
def sqlite_db(sqlite_template: Path, tmp_path: Path) -> Iterator[Database]:
    """One dialect is enough for the statistics: a fresh SQLite store."""
    path = tmp_path / "explain.db"
    shutil.copyfile(sqlite_template, path)
    with database.connect(f"sqlite:///{path}") as opened:
        yield opened


STEP_WINDOW = 300
CAUSES: dict[str, dict[str, Any]] = {
    "answer slot": {
        "fake": {"first": 0.3, "last": 0.65, "depends_on": "answer-slot", "question_effect": 0.2}
    },
    "token distance": {
        "fake": {"first": 0.7, "last": 0.3, "depends_on": "token-distance", "window": STEP_WINDOW},
        "filler": {"tokens": [0, 300]},
    },
    "position": {
        "fake": {"first": 0.3, "last": 0.65, "window": STEP_WINDOW, "question_effect": 0.2},
        "filler": {"tokens": [0, 300]},
    },
}


def test_explain_names_the_cause_of_each_fake(
    sqlite_db: Database, make_job: Callable[..., Submitted], fast_settings: Callable[..., Settings]
) -> None:
    submitted = {
        cause: make_job(
            sqlite_db,
            model=f"fake/{cause.replace(' ', '-')}",  # its own `models` row: the window is the model's
            batch_sizes=(10,),
            iterations=200,
            shard_size=100,
            pool_size=2000,
            answer_order="random",
            answer_mode="constrained",
            **fields,
        ).job_id
        for cause, fields in CAUSES.items()
    }
    _dispatch(sqlite_db, fast_settings(sqlite_db.url))
    for cause, job in submitted.items():
        (found,) = curves.explain(sqlite_db, [job], resamples=300)
        moving = {e.name for e in found.effects if e.distinguishable}
        assert moving == {cause}, (cause, found.verdict)
        if cause == "answer slot":
            assert found.window is None  # the fake has no window
            continue
        step = found.window
        assert step is not None and step.tested, found.verdict
        if cause == "token distance":
            assert step.found and step.break_interval is not None and step.window_in_interval, found.verdict
            assert step.break_interval[0] < STEP_WINDOW <= step.break_interval[1]
        else:
            assert not step.found and step.break_interval is None, found.verdict
