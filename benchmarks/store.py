"""Store benchmark: result ingest into PostgreSQL and SQLite, and a curve query from the aggregates vs a raw
scan of the results, side by side in one run.

    python benchmarks/store.py                      # 1M rows ingested, curve at 10M rows
    python benchmarks/store.py --rows 100000 --curve-rows 1000000   # a quick look
    python benchmarks/store.py --profile            # also: where ingest time goes, on each database

Ingest goes through `queue.complete` (lease held, COPY / executemany, curve totals, job status), with
realistic shards: batch size 50, 20 trials per shard (1,000 results a shard), written two ways: one shard per
transaction, and the shards of one engine call (`service.dispatch.pools.SHARDS_PER_CALL`) per transaction, as
the dispatcher writes them. Building each worker result is not timed; writing it is.

The curve table is built in SQL (generate_series on PostgreSQL, a recursive CTE on SQLite), since going
through ingest for 10M rows would only re-measure ingest.

It starts its own throwaway PostgreSQL server (tests/support/postgres.py; durable settings: fsync and
synchronous commit on) and a SQLite file in a temporary folder (WAL, synchronous=NORMAL).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import sqlalchemy as sa

from posbias.schemas import (
    EngineInfo,
    JobSpec,
    ModelInfo,
    ParseStatus,
    Question,
    QuestionPool,
    QuestionResult,
    ResultColumns,
    ShardResult,
    ShardSpec,
    TrialResult,
    TrialStatus,
)
from posbias.service.dispatch.pools import SHARDS_PER_CALL
from posbias.service.stats import queries
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.work import jobs, planner, queue

# tests/support (throwaway PostgreSQL, tiny models) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import postgres as throwaway_postgres

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import Guard

BATCH_SIZE = 50
TRIALS_PER_SHARD = 20
CURVE_JOBS = 10
"""The curve table holds this many jobs of equal size, half of them of the model that is queried."""
CURVE_REPEATS = 20

# Durable (fsync, synchronous_commit on, the defaults), with the memory and WAL room a bulk load wants.
POSTGRES_SETTINGS = {"shared_buffers": "1GB", "max_wal_size": "8GB", "work_mem": "64MB"}


@dataclass(frozen=True)
class Ingest:
    """What one ingest run measured."""

    rows: int
    shards: int
    per_write: int
    """Shards written per transaction."""
    seconds: float
    """Time inside `queue.complete` only."""

    @property
    def rows_per_second(self) -> float:
        """Result rows written per second."""
        return self.rows / self.seconds


@dataclass(frozen=True)
class CurveTimes:
    """Median time of one curve query, from the aggregates and from the raw results."""

    rows: int
    build_seconds: float
    aggregate_ms: float
    scan_ms: float


def question_pool(size: int = 2000) -> QuestionPool:
    """Synthetic four-option questions."""
    questions = tuple(
        Question(
            id=f"bench/q{i:05d}",
            subject=f"subject{i % 57}",
            question=f"q{i}?",
            choices=("a", "b", "c", "d"),
            answer=i % 4,
        )
        for i in range(size)
    )
    return QuestionPool(
        questions=questions, subjects=tuple(sorted({q.subject for q in questions})), source="bench"
    )


ENGINE = EngineInfo(name="fake", version="0", dtype="bfloat16", attention_backend="FLASH_ATTN", device="cuda")


def fake_result(shard: ShardSpec, rng: random.Random) -> ShardResult:
    """What a worker returns for `shard`: accuracy rising with position, a few unparsed answers, token
    offsets, the answer's slot and window, and option probabilities at every position, as the worker sends
    them (columns)."""
    trials = []
    columns: dict[str, list[object]] = {name: [] for name in QuestionResult.model_fields}
    for trial in shard.trials:
        n = trial.batch_size
        trials.append(
            TrialResult(
                trial_index=trial.index,
                status=TrialStatus.done,
                prompt_tokens=120 * n,
                output_tokens=5 * n,
                output_text="\n".join(f"{p}. 1" for p in range(1, n + 1)),
            )
        )
        for position, qid in enumerate(trial.question_ids, start=1):
            gold = shard.questions[qid].answer
            parsed = rng.random() > 0.02
            right = parsed and rng.random() < 0.25 + 0.3 * position / n
            probs = [rng.random() for _ in range(4)]
            total = sum(probs)
            probs = [p / total for p in probs]
            distance = 120 * (n - position) + 5 * (position - 1) + 2
            fields = {
                "trial_index": trial.index,
                "position": position,
                "question_id": qid,
                "subject": shard.questions[qid].subject,
                "gold": gold,
                "predicted": gold if right else (gold + 1) % 4 if parsed else None,
                "correct": right,
                "parse_status": ParseStatus.ok if parsed else ParseStatus.missing,
                "question_token_start": 120 * (position - 1) + 40,
                "question_token_end": 120 * position + 40,
                "answer_slot": position if parsed else None,
                "answer_token_index": 5 * (position - 1) + 2,
                "token_distance": distance,
                "rope_distance": distance,
                "in_window": distance < 4096,
                "visible_layers": 26 if distance < 4096 else 13,
                "option_probs": tuple(probs),
                "gold_prob": probs[gold],
            }
            for name, value in fields.items():
                columns[name].append(value)
    return ShardResult(
        job_id=shard.job_id,
        shard_id=shard.shard_id,
        trials=tuple(trials),
        answers=ResultColumns.model_validate(columns),
        model=ModelInfo(
            name=shard.model, architecture="Gemma2ForCausalLM", num_layers=26, sliding_window=4096
        ),
        engine=ENGINE,
        generate_seconds=1.0,
    )


def ingest(url: str, *, rows: int, per_write: int, profile: cProfile.Profile | None = None) -> Ingest:
    """Submit a job of `rows` results, lease every shard, and write a result for each, `per_write` shards
    per transaction."""
    migrate.upgrade(url)
    spec = JobSpec.model_validate(
        {
            "model": "bench/ingest",
            "batch_sizes": [BATCH_SIZE],
            "iterations": rows // BATCH_SIZE,
            "shard_size": TRIALS_PER_SHARD,
            "engine": {"name": "fake"},
        }
    )
    rng = random.Random(0)
    written = shards = 0
    seconds = 0.0
    with database.connect(url) as db:
        jobs.submit(db, spec, planner.plan(spec, pool=question_pool()))
        while leases := queue.lease(db, owner="bench", limit=per_write * 8, lease_seconds=3600):
            for start in range(0, len(leases), per_write):
                results = [fake_result(lease.shard, rng) for lease in leases[start : start + per_write]]
                if profile is not None:
                    profile.enable()
                started = time.perf_counter()
                outcomes = queue.complete(db, results, owner="bench")
                seconds += time.perf_counter() - started
                if profile is not None:
                    profile.disable()
                for outcome in outcomes:
                    assert outcome.written, outcome.reason
                    written += outcome.results
                shards += len(results)
    return Ingest(rows=written, shards=shards, per_write=per_write, seconds=seconds)


# --- the curve table ----------------------------------------------------------------------------------

POSTGRES_BUILD = [
    "SET synchronous_commit = off",
    """INSERT INTO jobs (id, spec, spec_hash, model, model_key, status, priority, created_at, trials_total,
        shards_total)
       SELECT j, '{}', 'bench', CASE WHEN j % 2 = 1 THEN 'bench/a' ELSE 'bench/b' END, 'k', 'done', 0, now(),
        :trials, 1 FROM generate_series(1, :jobs) AS j""",
    """INSERT INTO shards (id, job_id, index, status, attempts, max_attempts, trial_count, model_key,
        priority)
       SELECT j, j, 0, 'done', 1, 3, :trials, 'k', 0 FROM generate_series(1, :jobs) AS j""",
    """INSERT INTO trials (id, job_id, index, shard_id, batch_size, iteration, rotation, question_ids,
        status)
       SELECT (j - 1) * :trials + t + 1, j, t, j, :n, t, 0, '[]', 'done'
       FROM generate_series(1, :jobs) AS j, generate_series(0, :trials - 1) AS t""",
    """INSERT INTO results (trial_id, position, job_id, batch_size, question_id, subject, gold, predicted,
        correct, parse_status, question_token_start, question_token_end, answer_token_index, token_distance,
        gold_prob, option_probs)
       SELECT t.id, p, t.job_id, :n, 'bench/q' || ((t.id * 31 + p) % 2000), 'subject' || (p % 57), p % 4,
        p % 4, (t.id * 2654435761 + p * 40503) % 1000 < 250 + 6 * p, 'ok', 120 * p, 120 * p + 100, 5 * p,
        120 * (:n - p) + 5 * p, 0.25 + p / 200.0, '[0.1, 0.2, 0.3, 0.4]'
       FROM trials AS t, generate_series(1, :n) AS p""",
    """INSERT INTO curve_points (job_id, batch_size, position, n, n_correct, n_parsed, gold_prob_sum,
        n_gold_prob)
       SELECT job_id, batch_size, position, count(*), sum(correct::int), sum((parse_status = 'ok')::int),
        coalesce(sum(gold_prob), 0), count(gold_prob)
       FROM results GROUP BY job_id, batch_size, position""",
]

SQLITE_BUILD = [
    "CREATE TEMP TABLE seq (x INTEGER PRIMARY KEY)",
    """INSERT INTO seq WITH RECURSIVE s(x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < :trials)
       SELECT x FROM s""",
    """INSERT INTO jobs (id, spec, spec_hash, model, model_key, status, priority, created_at, trials_total,
        shards_total)
       SELECT x, '{}', 'bench', CASE WHEN x % 2 = 1 THEN 'bench/a' ELSE 'bench/b' END, 'k', 'done', 0,
        '2026-01-01 00:00:00.000000', :trials, 1 FROM seq WHERE x BETWEEN 1 AND :jobs""",
    """INSERT INTO shards (id, job_id, "index", status, attempts, max_attempts, trial_count, model_key,
        priority)
       SELECT x, x, 0, 'done', 1, 3, :trials, 'k', 0 FROM seq WHERE x BETWEEN 1 AND :jobs""",
    """INSERT INTO trials (id, job_id, "index", shard_id, batch_size, iteration, rotation, question_ids,
        status)
       SELECT (j.x - 1) * :trials + t.x + 1, j.x, t.x, j.x, :n, t.x, 0, '[]', 'done'
       FROM seq AS j, seq AS t WHERE j.x BETWEEN 1 AND :jobs AND t.x < :trials""",
    """INSERT INTO results (trial_id, position, job_id, batch_size, question_id, subject, gold, predicted,
        correct, parse_status, question_token_start, question_token_end, answer_token_index, token_distance,
        gold_prob, option_probs)
       SELECT t.id, p.x, t.job_id, :n, 'bench/q' || ((t.id * 31 + p.x) % 2000), 'subject' || (p.x % 57),
        p.x % 4, p.x % 4, (t.id * 2654435761 + p.x * 40503) % 1000 < 250 + 6 * p.x, 'ok', 120 * p.x,
        120 * p.x + 100, 5 * p.x, 120 * (:n - p.x) + 5 * p.x, 0.25 + p.x / 200.0, '[0.1, 0.2, 0.3, 0.4]'
       FROM trials AS t, seq AS p WHERE p.x BETWEEN 1 AND :n ORDER BY t.id, p.x""",
    """INSERT INTO curve_points (job_id, batch_size, position, n, n_correct, n_parsed, gold_prob_sum,
        n_gold_prob)
       SELECT job_id, batch_size, position, count(*), sum(correct), sum(parse_status = 'ok'),
        coalesce(sum(gold_prob), 0), count(gold_prob)
       FROM results GROUP BY job_id, batch_size, position""",
]

RAW_CURVE = {
    "postgresql": """SELECT r.position, count(*), sum(r.correct::int) FROM results AS r JOIN jobs AS j ON
        j.id = r.job_id WHERE j.model = :model AND r.batch_size = :n
        GROUP BY r.position ORDER BY r.position""",
    "sqlite": """SELECT r.position, count(*), sum(r.correct) FROM results AS r JOIN jobs AS j ON
        j.id = r.job_id WHERE j.model = :model AND r.batch_size = :n
        GROUP BY r.position ORDER BY r.position""",
}


def build_curve_table(db: Database, *, rows: int) -> float:
    """Fill an empty store with `rows` results over `CURVE_JOBS` jobs of two models, and their totals."""
    trials = rows // BATCH_SIZE // CURVE_JOBS
    params = {"jobs": CURVE_JOBS, "trials": trials, "n": BATCH_SIZE}
    started = time.perf_counter()
    with db.engine.begin() as connection:
        for statement in POSTGRES_BUILD if db.dialect == "postgresql" else SQLITE_BUILD:
            text = sa.text(statement)
            connection.execute(text, {k: v for k, v in params.items() if f":{k}" in statement})
    with db.engine.connect() as connection:
        # Fresh statistics and visibility map, as autovacuum would leave a settled table.
        connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            "VACUUM ANALYZE" if db.dialect == "postgresql" else "ANALYZE"
        )
    return time.perf_counter() - started


def _median_ms(call: Callable[[], object], repeats: int) -> float:
    call()  # warm: the first call pays for statement compilation and a cold cache
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def curve_times(url: str, *, rows: int) -> CurveTimes:
    """Build the curve table at `url`, then time the curve of model `bench/a` at batch size 50 both ways."""
    migrate.upgrade(url)
    with database.connect(url) as db:
        build = build_curve_table(db, rows=rows)

        def from_aggregates() -> list[tuple[int, int, int]]:
            counts = queries.curve_counts(db, model="bench/a", batch_size=BATCH_SIZE)
            return [(c.position, c.n, c.n_correct) for c in counts]

        def from_results() -> list[tuple[int, int, int]]:
            with db.read() as session:
                query = sa.text(RAW_CURVE[db.dialect])
                return [tuple(row) for row in session.execute(query, {"model": "bench/a", "n": BATCH_SIZE})]

        assert from_aggregates() == from_results(), "the aggregates disagree with the results"
        aggregate = _median_ms(from_aggregates, CURVE_REPEATS)
        scan = _median_ms(from_results, 3)
    return CurveTimes(rows=rows, build_seconds=build, aggregate_ms=aggregate, scan_ms=scan)


def print_guard(done: dict[tuple[str, int], Ingest], curves: dict[str, CurveTimes], *, rows: int) -> None:
    """Now beside what benchmarks/README.md last recorded (recorded.py): the ingest rates, and the curve
    from the aggregates (recorded at 10M rows: the time does not grow with them)."""
    guard = Guard.read("Store")
    print(
        f"\nagainst the figures recorded in benchmarks/README.md ({os.getloadavg()[0]:.1f} load average now)"
    )
    for (name, per_write), figures in done.items():
        then = guard.store_ingest(name, per_write)
        print(
            guard.line(
                f"{name} ingest, {per_write} per transaction, rows/s", now=figures.rows_per_second, then=then
            )
        )
    for name, c in curves.items():
        then = guard.store_curve_ms(name)
        print(
            guard.line(
                f"{name} curve from the aggregates, ms", now=c.aggregate_ms, then=then, higher_is_better=False
            )
        )
    if rows < 1_000_000:
        print(
            f"   (ingest recorded at 1,000,000 rows, measured now at {rows:,}: smaller tables write faster)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000, help="result rows to ingest per database")
    parser.add_argument(
        "--curve-rows", type=int, default=10_000_000, help="result rows under the curve query"
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile ingest (1 shard per transaction) on both databases"
    )
    args = parser.parse_args()

    print(f"store benchmark, {date.today()}, {os.cpu_count()} CPUs")
    with (
        throwaway_postgres.running(settings=POSTGRES_SETTINGS) as server,
        tempfile.TemporaryDirectory() as tmp,
    ):

        def urls(name: str) -> dict[str, str]:
            return {"postgresql": server.create_database(name), "sqlite": f"sqlite:///{Path(tmp) / name}.db"}

        # One shard per transaction is profiled, so the dispatcher's way (8) keeps its figures.
        profiles = {name: cProfile.Profile() for name in ("postgresql", "sqlite")} if args.profile else {}
        done: dict[tuple[str, int], Ingest] = {}
        for per_write in (1, SHARDS_PER_CALL):
            targets = urls(f"ingest{per_write}")
            for name, url in targets.items():
                done[name, per_write] = ingest(
                    url,
                    rows=args.rows,
                    per_write=per_write,
                    profile=profiles.get(name) if per_write == 1 else None,
                )
        some = done["postgresql", 1]
        print(
            f"\ningest through write_shard_results: {some.rows:,} rows in {some.shards:,} shards of "
            f"{some.rows // some.shards:,}, 1 shard per transaction or {SHARDS_PER_CALL} (one engine call's, "
            "as the dispatcher writes)"
        )
        print(f"  {'':12}{'shards/txn':>11}{'rows/s':>10}{'seconds':>9}{'ms/shard':>10}")
        for (name, per_write), figures in done.items():
            print(
                f"  {name:12}{per_write:11}{figures.rows_per_second:10,.0f}{figures.seconds:9.2f}"
                f"{figures.seconds / figures.shards * 1000:10.2f}"
            )
        for per_write in (1, SHARDS_PER_CALL):
            ratio = done["postgresql", per_write].rows_per_second / done["sqlite", per_write].rows_per_second
            print(f"  postgresql / sqlite, {per_write} per transaction: {ratio:.2f}x")
        for name in ("postgresql", "sqlite"):
            gain = done[name, SHARDS_PER_CALL].rows_per_second / done[name, 1].rows_per_second
            print(f"  {name}: {SHARDS_PER_CALL} shards per transaction / 1: {gain:.2f}x")

        curves = {name: curve_times(url, rows=args.curve_rows) for name, url in urls("curve").items()}
        print(
            f"\ncurve of one model at batch size {BATCH_SIZE} ({args.curve_rows:,} result rows, "
            f"{CURVE_JOBS} jobs, half of them the model's)"
        )
        print(f"  {'':12}{'aggregates ms':>15}{'raw scan ms':>13}{'scan/agg':>10}{'build s':>9}")
        for name, c in curves.items():
            print(
                f"  {name:12}{c.aggregate_ms:15.2f}{c.scan_ms:13.1f}{c.scan_ms / c.aggregate_ms:10.0f}"
                f"{c.build_seconds:9.1f}"
            )
        pg_curve, lite_curve = curves["postgresql"], curves["sqlite"]
        print(
            f"  postgresql / sqlite time: aggregates {pg_curve.aggregate_ms / lite_curve.aggregate_ms:.2f}x, "
            f"raw scan {pg_curve.scan_ms / lite_curve.scan_ms:.2f}x"
        )
        print_guard(done, curves, rows=args.rows)

    for name, profile in profiles.items():
        print(f"\n{name} ingest profile (1 shard per transaction, inside queue.complete, by own time):")
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
