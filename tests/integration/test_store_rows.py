"""The result rows the store writes are, field for field, what the worker answered: the columnar path
(`ResultColumns`, one COPY / executemany per transaction) stores exactly what one record per answer did."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from posbias.schemas import ParseStatus, QuestionResult, ResultColumns, ShardResult, Submitted
from posbias.service.store import database, migrate, rows
from posbias.service.store.database import Database
from posbias.service.work import queue

MakeJob = Callable[..., Submitted]
Answer = Callable[..., ShardResult]

FIELDS = [name for name in QuestionResult.model_fields if name not in ("trial_index", "option_probs")]


def _varied(result: ShardResult) -> ShardResult:
    """`result` with every kind of value a worker sends: missing token offsets and slots, windows in and
    out, three and four options, no probabilities."""
    records = []
    for number, r in enumerate(result.results):
        kind = number % 4
        update: dict[str, Any] = {
            "answer_slot": None if kind == 3 else r.position,
            "in_window": (None, True, False, None)[kind],
            "visible_layers": (None, 4, 2, 4)[kind],
        }
        if kind == 2:
            update["option_probs"] = (0.123456789, 1 / 3, 0.5432101234)
            update["gold_prob"] = None
        if kind == 3:
            update.update(
                option_probs=None,
                gold_prob=None,
                predicted=None,
                correct=False,
                parse_status=ParseStatus.duplicate,
                question_token_start=None,
                question_token_end=None,
                answer_token_index=None,
                token_distance=None,
            )
        records.append(r.model_copy(update=update))
    return result.model_copy(update={"answers": ResultColumns.from_results(records)})


def _stored(db: Database, job_id: int) -> dict[tuple[int, int], dict[str, Any]]:
    """Every result row of the job, by (trial index, position), with option_probs as its stored text."""
    with db.read() as session:
        rows = session.execute(
            sa.text(
                'SELECT t."index" AS trial_index, t.batch_size AS trial_size, t.variant AS trial_variant, '
                "r.*, CAST(r.option_probs AS TEXT) AS probs_text "
                "FROM results AS r JOIN trials AS t ON t.id = r.trial_id WHERE r.job_id = :job"
            ),
            {"job": job_id},
        ).mappings()
        return {(row["trial_index"], row["position"]): dict(row) for row in rows}


def test_every_stored_field_is_what_the_worker_answered(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    job_id = make_job(db).job_id
    leases = queue.lease(db, owner="w1", limit=10, lease_seconds=60)
    sent = [_varied(answer(lease.shard)) for lease in leases]
    # Several shards in one transaction, as the dispatcher writes an engine call's.
    assert all(outcome.written for outcome in queue.complete(db, sent, owner="w1"))

    stored = _stored(db, job_id)
    expected = [r for result in sent for r in result.results]
    assert len(stored) == len(expected) == 4 * 2 + 4 * 3
    for r in expected:
        row = stored[r.trial_index, r.position]
        assert {name: row[name] for name in FIELDS} == {
            name: getattr(r, name).value if name == "parse_status" else getattr(r, name) for name in FIELDS
        }
        assert (row["job_id"], row["batch_size"], row["variant"]) == (
            job_id,
            row["trial_size"],
            row["trial_variant"],
        )
        # JSON text with 8 significant digits per probability, as the store has always written it.
        probs = None if r.option_probs is None else "[" + ",".join(f"{p:.8g}" for p in r.option_probs) + "]"
        assert row["probs_text"] == probs


def test_results_given_as_records_or_as_columns_are_the_same_result(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    make_job(db, iterations=1, batch_sizes=(3,))
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=60)
    built = answer(lease.shard)
    records = built.results

    as_records = ShardResult.model_validate(
        {**built.model_dump(exclude={"answers"}), "results": [r.model_dump() for r in records]}
    )
    assert as_records == built
    assert as_records.results == records
    assert len(built.answers) == 3 and built.answers.position == (1, 2, 3)


def test_the_store_still_refuses_a_parse_status_it_does_not_know_after_writing_results(
    db: Database, make_job: MakeJob, answer: Answer
) -> None:
    # SQLite's results insert skips the parse_status check (its values come from the enum); the check must
    # be back on for the next statement of the same connection, as any other writer would run it.
    make_job(db, iterations=1, batch_sizes=(3,))
    (lease,) = queue.lease(db, owner="w1", limit=1, lease_seconds=60)
    result = answer(lease.shard)
    with db.write() as session:
        written = rows.write_results(session, {result.shard_id: result})
        trial_id = next(iter(written.trials[result.shard_id].values())).id
        with pytest.raises(sa.exc.IntegrityError), session.begin_nested():
            session.execute(
                sa.text(
                    "INSERT INTO results (trial_id, position, job_id, batch_size, question_id, subject, "
                    "gold, correct, parse_status) VALUES (:t, 99, :j, 3, 'q', 's', 0, false, 'bogus')"
                ),
                {"t": trial_id, "j": result.job_id},
            )


def test_migration_0012_fills_each_answers_rope_distance_from_its_jobs_gap(
    database_url: str, make_job: MakeJob, answer: Answer
) -> None:
    """Results written before `rope_distance` existed get it on upgrade: the token distance, plus the
    position gap of a job that had one."""
    with database.connect(database_url) as db:
        plain, gapped = make_job(db).job_id, make_job(db, seed=9).job_id
        leases = queue.lease(db, owner="w1", limit=20, lease_seconds=60)
        assert all(
            o.written for o in queue.complete(db, [answer(lease.shard) for lease in leases], owner="w1")
        )
    migrate.downgrade(database_url, "0011")
    engine = database.create_db_engine(database_url, create=False)
    try:
        with engine.begin() as connection:
            spec = connection.execute(
                sa.text("SELECT spec FROM jobs WHERE id = :j"), {"j": gapped}
            ).scalar_one()
            spec = json.loads(spec) if isinstance(spec, str) else spec
            spec["engine"]["position_gap"] = 4096  # as an hf job with a gap would have stored it
            connection.execute(
                sa.text("UPDATE jobs SET spec = :s WHERE id = :j"), {"s": json.dumps(spec), "j": gapped}
            )
    finally:
        engine.dispose()
    migrate.upgrade(database_url)
    with database.connect(database_url) as db, db.read() as session:
        rows = session.execute(sa.text("SELECT job_id, token_distance, rope_distance FROM results")).all()
    assert {job for job, _, _ in rows} == {plain, gapped}
    for job, token, rope in rows:
        assert rope == token + (4096 if job == gapped else 0)
