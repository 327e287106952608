"""Dispatch benchmark: how many trials per second one dispatcher moves when the engine costs nothing, so only
the queue, Ray and the store remain. Side by side in one run: 1, 2 and 4 actors, on SQLite and PostgreSQL.

    python benchmarks/dispatch.py                    # about 5 minutes on 2 cores
    python benchmarks/dispatch.py --trials 5000 --actors 1 --databases sqlite   # a quick look
    python benchmarks/dispatch.py --profile          # also: the dispatcher's profile (cProfile, 1 actor)

The job: MMLU questions (POSBIAS_MMLU_DIR, or ../shared/data/mmlu), batch size 10, the planner's default
shard size (500 // 10 = 50 trials, 500 results a shard), the fake engine with no delay (`delay_s = 0`). Each
configuration gets a fresh dispatcher whose actors are started and warmed by a small job first; the timed run
goes from `queue.submit` to the commit of the last shard's results (`Dispatcher.run(on_written=...)`).

Where the time goes is measured on the dispatcher's one thread by wrapping what it calls: submitting the job
(`queue.submit`), leasing (the lease transaction and building the shard specs), sending calls to actors
(`.remote`, which pickles the shards), waiting on Ray (`ray.wait`: idle while the actors work), fetching
results (`ray.get`), writing them (`queue.complete`), heartbeats, other queue calls (recovery,
releases, is-the-job-done checks), and the loop itself (the rest). Garbage collection happens inside those
and is shown on its own. The dispatcher's capacity is trials per second of its busy time: all but waiting on
Ray and submitting the job, i.e. what it would move if actors on other machines never kept it waiting.

The actors' own work per shard (render, fake answers, parse, build the result) is timed separately in this
process on the same shards: the fake engine is free of delay, not of work (its tokenizer is Python), and
here the actors share the machine's cores with the dispatcher, Ray and the database.

SQLite is a file in a temporary folder (WAL, synchronous=NORMAL); PostgreSQL is a throwaway server started
here (tests/support/postgres.py) with durable settings (fsync and synchronous commit on). Ray is started
with 4 logical CPUs (the fake engine's actors reserve none, so 4 of them fit on any machine).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import ray

from posbias.schemas import JobSpec, ShardResult
from posbias.service.dispatch.dispatcher import Dispatcher
from posbias.service.settings import Settings
from posbias.service.store import database, migrate
from posbias.service.store.database import Database
from posbias.service.work import jobs, queue, submission
from posbias.service.work.shards import shard_spec
from posbias.workers.fake_engine import FakeEngine
from posbias.workers.shard import run_shard

# tests/support (throwaway PostgreSQL, tiny models) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import postgres as throwaway_postgres

REPO = Path(__file__).resolve().parents[1]
BATCH_SIZE = 10
GOAL = 2000.0
"""Trials per second one dispatcher should move, so dispatch never limits a GPU cluster."""

# Durable: the server's own defaults for fsync and synchronous_commit (on).
POSTGRES_SETTINGS = {"shared_buffers": "256MB"}

PARTS = ("submit", "lease", "send", "wait", "fetch", "write", "heartbeat", "other", "gc", "loop")


class Timers:
    """Wall time of the dispatcher's thread by part, measured by wrapping what the dispatcher calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, name: str, part: str, stack: ExitStack) -> None:
        """Replace `owner.name` with a timed version for the life of `stack`."""
        original = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - started
                self.calls[part] += 1

        setattr(owner, name, timed)
        stack.callback(setattr, owner, name, original)


@contextmanager
def timing(dispatcher: Dispatcher) -> Iterator[Timers]:
    """Time the dispatcher's calls into the queue, the store and Ray while the block runs."""
    timers = Timers()
    collecting: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collecting.append(time.perf_counter())
        elif collecting:
            took = time.perf_counter() - collecting.pop()
            timers.seconds["gc"] += took
            timers.calls[f"gc{info['generation']}"] += 1
            timers.seconds[f"gc{info['generation']}"] += took

    gc.callbacks.append(on_gc)
    with ExitStack() as stack:
        stack.callback(gc.callbacks.remove, on_gc)
        timers.wrap(jobs, "submit", "submit", stack)
        timers.wrap(queue, "lease", "lease", stack)
        timers.wrap(queue, "heartbeat", "heartbeat", stack)
        for name in ("recover_expired", "release", "fail", "pending_model_keys"):
            timers.wrap(queue, name, "other", stack)
        timers.wrap(jobs, "finished", "other", stack)
        timers.wrap(jobs, "fail", "other", stack)
        timers.wrap(queue, "complete", "write", stack)
        timers.wrap(ray, "wait", "wait", stack)
        timers.wrap(ray, "get", "fetch", stack)
        timers.wrap(dispatcher.pools, "submit", "send", stack)
        yield timers


@dataclass(frozen=True)
class Measured:
    """One timed run of the job."""

    actors: int
    trials: int
    shards: int
    seconds: float
    parts: dict[str, float]

    @property
    def trials_per_second(self) -> float:
        return self.trials / self.seconds

    @property
    def busy_seconds(self) -> float:
        """The dispatcher's thread at work: everything but waiting on Ray and submitting the job."""
        return sum(seconds for part, seconds in self.parts.items() if part not in ("wait", "submit", "gc"))

    @property
    def capacity(self) -> float:
        """Trials per second the dispatcher would move if the actors never kept it waiting."""
        return self.trials / self.busy_seconds


def job_spec(trials: int) -> JobSpec:
    """The benchmark's job: batch size 10, `trials` trials, the fake engine at zero cost."""
    return JobSpec.model_validate(
        {
            "model": "bench/dispatch",
            "batch_sizes": [BATCH_SIZE],
            "iterations": trials,
            "engine": {"name": "fake"},
            "fake": {"delay_s": 0.0},
        }
    )


def measure(
    db: Database,
    prepared: submission.Prepared,
    warmup: submission.Prepared,
    *,
    settings: Settings,
    actors: int,
    profile: cProfile.Profile | None,
) -> Measured:
    """Warm a fresh dispatcher with `actors` actors on a small job, then time `prepared` through it."""
    dispatcher = Dispatcher(db, settings=settings.model_copy(update={"actors_per_model": actors}))
    try:
        jobs.submit(db, warmup.spec, warmup.plan)
        dispatcher.run(until_empty=True)

        last_commit = 0.0
        shards = 0

        def written(result: ShardResult) -> None:
            nonlocal last_commit, shards
            last_commit = time.perf_counter()
            shards += 1

        with timing(dispatcher) as timers:
            if profile is not None:
                profile.enable()
            started = time.perf_counter()
            jobs.submit(db, prepared.spec, prepared.plan)
            summary = dispatcher.run(until_empty=True, on_written=written)
            ended = time.perf_counter()
            if profile is not None:
                profile.disable()
    finally:
        dispatcher.close()
    seconds = last_commit - started
    parts = {part: timers.seconds.get(part, 0.0) for part in PARTS if part != "loop"}
    # Collections happen inside the other parts; "loop" is what no part accounts for.
    parts["loop"] = (ended - started) - sum(seconds for part, seconds in parts.items() if part != "gc")
    return Measured(actors=actors, trials=summary.trials_done, shards=shards, seconds=seconds, parts=parts)


@dataclass(frozen=True)
class ActorWork:
    """What an actor spends on one shard, timed in this process."""

    seconds: float
    tokenizer_seconds: float
    """Of which in the fake engine's tokenizer (Python): the prompts, and the fake's own answers."""


def actor_work_per_shard(prepared: submission.Prepared, *, shards: int = 20) -> ActorWork:
    """Median time of `run_shard` on the fake engine (render, fake answers, parse, build the result)."""
    spec, plan = prepared.spec, prepared.plan
    engine = FakeEngine(spec.fake, seed=spec.seed, model=spec.model)
    tokenizer = engine.tokenizer
    encode = tokenizer.encode
    in_tokenizer = 0.0

    def timed_encode(text: str, *, add_special_tokens: bool) -> Any:
        nonlocal in_tokenizer
        started = time.perf_counter()
        try:
            return encode(text, add_special_tokens=add_special_tokens)
        finally:
            in_tokenizer += time.perf_counter() - started

    tokenizer.encode = timed_encode  # type: ignore[method-assign]
    times, tokenizing = [], []
    for index, planned in enumerate(plan.shards[:shards]):
        shard = shard_spec(
            spec,
            job_id=1,
            shard_id=index,
            trials=[plan.trials[i] for i in planned.trial_indices],
            questions=plan.questions,
        )
        in_tokenizer = 0.0
        started = time.perf_counter()
        run_shard(shard, engine=engine)
        times.append(time.perf_counter() - started)
        tokenizing.append(in_tokenizer)
    return ActorWork(seconds=statistics.median(times), tokenizer_seconds=statistics.median(tokenizing))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20_000, help="trials in the timed job")
    parser.add_argument(
        "--actors", type=int, nargs="+", default=[1, 2, 4], help="actors per model, one run for each"
    )
    parser.add_argument(
        "--databases", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the dispatcher (1 actor, each db)")
    args = parser.parse_args()

    settings = Settings(mmlu_dir=Settings().mmlu_dir or REPO.parent / "shared" / "data" / "mmlu")
    prepared = submission.prepare(job_spec(args.trials), settings=settings)
    warmup = submission.prepare(job_spec(200), settings=settings)
    work = actor_work_per_shard(prepared)
    per_shard = work.seconds
    shard_trials = len(prepared.plan.shards[0].trial_indices)

    print(
        f"dispatch benchmark, {date.today()}, {os.cpu_count()} CPUs, load average "
        f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print(
        f"job: {args.trials:,} trials at batch size {BATCH_SIZE} ({prepared.pool.source}), "
        f"{len(prepared.plan.shards):,} shards of {shard_trials} trials, fake engine with no delay"
    )
    print(
        f"an actor's own work per shard (render, fake answers, parse, build the result), timed here: "
        f"{per_shard * 1000:.1f} ms, of which {work.tokenizer_seconds * 1000:.1f} ms in the fake engine's "
        "tokenizer (Python)"
    )

    ray.init(
        address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    results: dict[str, list[Measured]] = {}
    profiles: dict[str, cProfile.Profile] = {}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        server = None
        if "postgresql" in args.databases:
            server = stack.enter_context(throwaway_postgres.running(settings=POSTGRES_SETTINGS))
        for name in args.databases:
            results[name] = []
            for actors in args.actors:
                label = f"{name}-{actors}"
                if name == "postgresql":
                    assert server is not None
                    url = server.create_database(f"dispatch_{actors}")
                else:
                    url = f"sqlite:///{tmp / label}.db"
                migrate.upgrade(url)
                profile = cProfile.Profile() if args.profile and actors == args.actors[0] else None
                if profile is not None:
                    profiles[name] = profile
                with database.connect(url) as db:
                    results[name].append(
                        measure(
                            db,
                            prepared,
                            warmup,
                            settings=settings.model_copy(update={"database_url": url}),
                            actors=actors,
                            profile=profile,
                        )
                    )
                run = results[name][-1]
                print(f"  {name} {actors} actor(s): {run.trials_per_second:,.0f} trials/s", flush=True)
    ray.shutdown()

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    print(f"\ntrials/s through one dispatcher, end to end (goal {GOAL:,.0f}):")
    print(f"  {'':12}" + "".join(f"{f'{a} actor' + ('s' if a > 1 else ''):>12}" for a in args.actors))
    for name, runs in results.items():
        print(f"  {name:12}" + "".join(f"{run.trials_per_second:12,.0f}" for run in runs))
    print(
        f"  (the actors' own work alone, on all {cores} cores, allows at most "
        f"{cores / per_shard * shard_trials:,.0f} trials/s here)"
    )
    print(
        "\nthe dispatcher's capacity: trials per second of its thread's busy time (all but waiting on Ray "
        "and submitting the job):"
    )
    for name, runs in results.items():
        print(f"  {name:12}" + "".join(f"{run.capacity:12,.0f}" for run in runs))

    print(
        "\nwhere the dispatcher's time goes, ms per shard ('wait': idle, waiting on Ray; gc: within the rest)"
    )
    print(
        f"  {'':16}" + "".join(f"{part:>10}" for part in PARTS) + f"{'all':>8}{'busy':>8}{'actors busy':>13}"
    )
    for name, runs in results.items():
        for run in runs:
            label = f"{name} x{run.actors}"
            per = {part: run.parts[part] / run.shards * 1000 for part in PARTS}
            actors_busy = per_shard * run.shards / (run.seconds * run.actors)
            print(
                f"  {label:16}"
                + "".join(f"{per[part]:10.2f}" for part in PARTS)
                + f"{sum(v for part, v in per.items() if part != 'gc'):8.2f}"
                + f"{run.busy_seconds / run.shards * 1000:8.2f}{actors_busy:13.0%}"
            )
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")

    for (name, profile), sort in (
        (item, sort) for item in profiles.items() for sort in ("tottime", "cumtime")
    ):
        print(f"\n{name}, {args.actors[0]} actor(s): the dispatcher's profile, by {sort}")
        pstats.Stats(profile).sort_stats(sort).print_stats(25)


if __name__ == "__main__":
    main()
