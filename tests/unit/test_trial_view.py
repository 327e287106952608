"""`posbias trial` and `posbias.trial`: a fake-engine job's trial shown as the engine was sent it (the token
ids it received, recorded as it generated), each question's span and window where the worker measured them,
the raw output and every answer as stored; a stored figure the rebuilt prompt does not reproduce is shown as
a difference; the command shows variant names and question text verbatim (Rich markup not eaten).

The real vLLM engine's token ids: tests/integration/engine/test_trial_view_vllm.py."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from support.in_process import run_cli

import posbias
from posbias.schemas import (
    JobSpec,
    NotFoundError,
    ParseStatus,
    Question,
    QuestionPool,
    ShardSpec,
    TrialView,
)
from posbias.service.reports.trial_view import trial_detail
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.work import jobs, planner, queue
from posbias.workers.engine import Generation, GenerationRequest
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

WINDOW = 120
VARIANTS = ["baseline", {"name": "late-drop", "fake": {"last": 0.1}}]


class RecordingFake(FakeEngine):
    """The fake engine, keeping the token ids of every prompt it was sent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[int, ...]] = []

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        self.sent += [tuple(r.prompt_token_ids) for r in requests]
        return super().generate(requests, temperature=temperature, top_p=top_p, seed=seed)


def _pool() -> QuestionPool:
    questions = tuple(
        sorted(
            (
                Question(
                    id=f"s/q{i:03d}",
                    subject="s",
                    question=f"Which [bold]tag[/bold] is number {i}?",
                    choices=(f"a{i}", f"b{i}", f"c{i}", f"d{i}"),
                    answer=i % 4,
                )
                for i in range(40)
            ),
            key=lambda q: q.id,
        )
    )
    return QuestionPool(questions=questions, subjects=("s",), source="test")


def _engine(shard: ShardSpec) -> RecordingFake:
    seed = shard.fake.seed if shard.fake.seed is not None else shard.seed
    return RecordingFake(shard.fake, seed=seed, model=shard.model)


class Store:
    def __init__(self, url: str, db: Database, job_id: int, sent: list[tuple[int, ...]]) -> None:
        self.url, self.db, self.job_id, self.sent = url, db, job_id, sent


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A SQLite store with one finished fake job: two variants, reverse order, filler after question 2, a
    sliding window of 120 tokens (its prompts are longer); every prompt the engines were sent recorded."""
    folder = tmp_path_factory.mktemp("trial-view")
    url = f"sqlite:///{folder / 'posbias.db'}"
    migrate.upgrade(url)
    spec = JobSpec.model_validate(
        {
            "model": "fake/model",
            "engine": {"name": "fake"},
            "batch_sizes": [4],
            "iterations": 3,
            "shard_size": 2,
            "answer_order": "reverse",
            "filler": {"tokens": [30], "where": "after", "position": 2},
            "fake": {"window": WINDOW, "first": 0.3, "last": 0.9},
            "variants": VARIANTS,
        }
    )
    sent: list[tuple[int, ...]] = []
    with database.connect(url) as db:
        job_id = jobs.submit(db, spec, planner.plan(spec, pool=_pool())).job_id
        while leases := queue.lease(db, owner="test", limit=10, lease_seconds=60, job_ids=[job_id]):
            for lease in leases:
                engine = _engine(lease.shard)
                result = run_shard(lease.shard, engine=engine)
                assert queue.complete(db, [result], owner="test")[0].written
                sent += engine.sent
        yield Store(url, db, job_id, sent)


def _trial_ids(store: Store, variant: str = "baseline") -> list[int]:
    with store.db.read() as session:
        return list(
            session.scalars(
                sa.text("SELECT id FROM trials WHERE job_id = :j AND variant = :v ORDER BY id"),
                {"j": store.job_id, "v": variant},
            )
        )


def _view(store: Store, trial_id: int, **how: Any) -> TrialView:
    with store.db.read() as session:
        return trial_detail(session, store.job_id, trial_id, **how)


def test_every_trials_prompt_is_token_for_token_what_the_engine_was_sent(store: Store) -> None:
    views = [_view(store, t, variant=v) for v in ("baseline", "late-drop") for t in _trial_ids(store)]
    assert sorted(tuple(v.prompt_token_ids or ()) for v in views) == sorted(store.sent)
    assert len(store.sent) == 6
    for view in views:
        assert view.check.matches is True, view.check
        assert view.check.compared == 1 + 2 + 2 * view.batch_size  # length, filler span, every question
        assert view.token_offsets is not None and len(view.token_offsets) == len(view.prompt_token_ids or ())


def test_spans_answers_and_windows_are_where_the_worker_measured_them(store: Store) -> None:
    trial_id = _trial_ids(store)[0]
    view = _view(store, trial_id)
    with store.db.read() as session:
        stored = {
            r.position: r
            for r in session.execute(
                sa.text("SELECT * FROM results WHERE trial_id = :t"), {"t": trial_id}
            ).mappings()
        }
        output = session.scalar(sa.text("SELECT output_text FROM trials WHERE id = :t"), {"t": trial_id})
    assert view.output_text == output and output
    assert [a.position for a in view.answers] == [1, 2, 3, 4]
    assert view.variants == ["baseline", "late-drop"]
    assert view.answer_order == [4, 3, 2, 1] and view.sliding_window == WINDOW
    assert view.filler_span is not None and view.filler_tokens == 30
    prompt_tokens = len(view.prompt_token_ids or ())
    for span, answer in zip(view.spans, view.answers, strict=True):
        row = stored[span.position]
        assert (span.start_token, span.end_token) == (row["question_token_start"], row["question_token_end"])
        assert "tag" in view.prompt_text[span.start_char : span.end_char]
        assert answer.parse_status is ParseStatus(row["parse_status"])
        assert answer.prediction == row["predicted"] and answer.gold == row["gold"]
        assert answer.correct == bool(row["correct"])
        assert answer.option_probs == pytest.approx(json.loads(row["option_probs"]))
        assert answer.token_distance == row["token_distance"]
        # The window's first token is inside it exactly when the worker found the question inside.
        assert span.window_start_token == max(0, prompt_tokens + (span.answer_token or 0) - WINDOW)
        inside = span.end_token is not None and span.end_token - 1 >= span.window_start_token
        assert inside == bool(row["in_window"])
        assert view.token_offsets is not None
        assert span.window_start_char == view.token_offsets[span.window_start_token][0]
    assert {bool(r["in_window"]) for r in stored.values()} == {True, False}, "some in, some beyond"
    frame = view.to_pandas()
    assert list(frame.position) == [1, 2, 3, 4] and set(frame.trial_id) == {trial_id}
    assert list(frame.correct) == [a.correct for a in view.answers]
    assert list(frame.window_start_token) == [s.window_start_token for s in view.spans]


def test_a_variant_shows_the_same_prompt_with_its_own_answers(store: Store) -> None:
    base = _view(store, _trial_ids(store)[1])
    other = _view(store, base.trial_id, variant="late-drop")
    assert other.variant == "late-drop" and other.trial_id != base.trial_id
    assert other.trial_id in _trial_ids(store, "late-drop")
    assert other.prompt_token_ids == base.prompt_token_ids
    with pytest.raises(NotFoundError, match="no variant 'nope'; its variants: baseline, late-drop"):
        _view(store, base.trial_id, variant="nope")
    with pytest.raises(NotFoundError, match=f"job {store.job_id} has no trial 999999"):
        _view(store, 999_999)


def test_a_stored_figure_the_rebuilt_prompt_misses_is_shown_as_a_difference(store: Store) -> None:
    trial_id = _trial_ids(store)[2]
    with store.db.write() as session:
        session.execute(
            sa.text("UPDATE trials SET prompt_tokens = prompt_tokens + 1 WHERE id = :t"), {"t": trial_id}
        )
    try:
        view = _view(store, trial_id)
        assert view.check.matches is False
        assert view.check.differences[0].startswith("prompt length: stored ")
    finally:
        with store.db.write() as session:
            session.execute(
                sa.text("UPDATE trials SET prompt_tokens = prompt_tokens - 1 WHERE id = :t"), {"t": trial_id}
            )


def _statements(store: Store, trial_id: int, **how: Any) -> list[tuple[str, Any]]:
    """Every statement `trial_detail` runs for one view, with its parameters."""
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    sa.event.listen(store.db.engine, "before_cursor_execute", record)
    try:
        _view(store, trial_id, **how)
    finally:
        sa.event.remove(store.db.engine, "before_cursor_execute", record)
    return seen


def test_a_trial_is_read_by_index_whatever_the_job_size(store: Store) -> None:
    # What a view reads does not grow with the job: each statement finds its rows by a key (SQLite's plan
    # SEARCHes an index or the primary key), never SCANs a table nor SEARCHes all of the job's rows (by
    # job_id alone: the maximum trial index is read from the end of a covering index), and their number is
    # the same for every trial of the job.
    counts = set()
    for trial_id in _trial_ids(store):
        for how in ({}, {"variant": "late-drop"}):
            statements = _statements(store, trial_id, **how)
            counts.add(len(statements))
            with store.db.read() as session:
                connection = session.connection().connection.driver_connection
                assert connection is not None
                for statement, parameters in statements:
                    if not statement.startswith("SELECT"):
                        continue  # BEGIN, PRAGMA
                    plan = [
                        row[-1] for row in connection.execute(f"EXPLAIN QUERY PLAN {statement}", parameters)
                    ]
                    assert plan and all(step.startswith("SEARCH") for step in plan), (statement, plan)
                    assert not any(re.search(r" USING INDEX \S+ \(job_id=\?\)$", s) for s in plan), plan
    assert len(counts) == 2


def test_a_variant_laid_out_otherwise_is_still_found(store: Store) -> None:
    # A job whose variants' trials are not where the planner puts them (here: the other variant's moved on
    # by 1,000) is searched, and gives the same trial.
    base = _trial_ids(store)[1]
    expected = _view(store, base, variant="late-drop")
    moved = 'UPDATE trials SET "index" = "index" + :by WHERE job_id = :j AND variant = :v'
    with store.db.write() as session:
        session.execute(sa.text(moved), {"by": 1000, "j": store.job_id, "v": "late-drop"})
    try:
        found = _view(store, base, variant="late-drop")
        assert found.trial_id == expected.trial_id and found.answers == expected.answers
        assert _view(store, base).variants == ["baseline", "late-drop"]
    finally:
        with store.db.write() as session:
            session.execute(sa.text(moved), {"by": -1000, "j": store.job_id, "v": "late-drop"})


def test_the_command_marks_the_prompt_and_shows_names_verbatim(store: Store, tmp_path: Path) -> None:
    env = {"POSBIAS_DATABASE_URL": store.url, "COLUMNS": "200"}
    trial_id = _trial_ids(store)[0]
    shown = run_cli(
        ["trial", str(store.job_id), str(trial_id), "--variant", "late-drop"], env=env, folder=tmp_path
    )
    assert shown.code == 0, shown.stderr
    assert "variant late-drop" in shown.stdout
    assert "Which [bold]tag[/bold] is number" in shown.stdout  # markup in a question is text
    assert "«q1 tokens " in shown.stdout and "«/q4»" in shown.stdout
    assert "«window of answer" in shown.stdout
    assert "identical to what was sent" in shown.stdout
    assert (
        "rebuilt with the model's tokenizer" in shown.stdout
    )  # the text leaves the token ids out, not the check

    one = run_cli(
        ["trial", str(store.job_id), str(trial_id), "--position", "3", "--json"], env=env, folder=tmp_path
    )
    assert one.code == 0, one.stderr
    data = json.loads(one.stdout)
    assert [s["position"] for s in data["spans"]] == [3] and [a["position"] for a in data["answers"]] == [3]
    assert data["prompt_token_ids"] == _view(store, trial_id).prompt_token_ids

    bad = run_cli(["trial", str(store.job_id), str(trial_id), "--position", "9"], env=env, folder=tmp_path)
    assert (
        bad.code == 2
        and bad.stderr.strip() == "error: --position must be 1 to 4, the trial's batch size (got 9)"
    )


def test_the_api_reads_a_trial_from_the_settings_store(store: Store, tmp_path: Path) -> None:
    settings = posbias.Settings(database_url=store.url, cache_dir=tmp_path)
    view = posbias.trial(store.job_id, _trial_ids(store)[0], settings=settings)
    assert view.check.matches is True
    bare = posbias.trial(store.job_id, _trial_ids(store)[0], tokens=False, settings=settings)
    assert bare.prompt_token_ids is None and bare.token_offsets is None
    assert bare.model_copy(update={"prompt_token_ids": None, "token_offsets": None}) == view.model_copy(
        update={"prompt_token_ids": None, "token_offsets": None}
    )
    with pytest.raises(posbias.UsageError, match="trial id"):
        posbias.trial(store.job_id, 0, settings=settings)


def test_curve_tables_and_plots_name_the_variants(store: Store, tmp_path: Path) -> None:
    env = {"POSBIAS_DATABASE_URL": store.url, "COLUMNS": "200"}
    job = str(store.job_id)
    shown = run_cli(["curve", "--job", job, "--plot", "c.svg", "--band"], env=env, folder=tmp_path)
    assert shown.code == 0, shown.stderr
    assert "fake/model [late-drop] - batch size 4" in shown.stdout  # not eaten as Rich markup
    assert "95% band (simultaneous)" in shown.stdout
    svg = (tmp_path / "c.svg").read_text()
    assert "late-drop" in svg and "baseline" in svg and "light: simultaneous 95% band" in svg

    as_json = run_cli(["curve", "--job", job, "--json"], env=env, folder=tmp_path)
    assert as_json.code == 0 and {c["variant"] for c in json.loads(as_json.stdout)} == {
        "baseline",
        "late-drop",
    }

    distance = run_cli(
        ["curve", "--job", job, "--by", "token-distance", "--bin-width", "400", "--plot", "d.svg"],
        env=env,
        folder=tmp_path,
    )
    assert distance.code == 0, distance.stderr
    assert "chance (4 options)" in (tmp_path / "d.svg").read_text()

    # The format is refused before the store is opened: this store does not exist.
    missing = {**env, "POSBIAS_DATABASE_URL": f"sqlite:///{tmp_path / 'none.db'}"}
    bad = run_cli(["curve", "--job", job, "--plot", "c.jpg"], env=missing, folder=tmp_path)
    assert bad.code == 2 and bad.stderr.startswith("error: --plot: a plot is a .png, .pdf or .svg file")
