"""Views benchmark: the time and peak memory of every analysis view of a fake job of 200,000, 1,000,000 and
5,000,000 results, on SQLite and PostgreSQL, side by side in one run, against issue 39's targets.

    python benchmarks/views.py --keep /tmp/views-stores              # every size; builds the stores once
    python benchmarks/views.py --sizes 200000 --stores sqlite        # a quick look
    python benchmarks/views.py --sizes 1000000 --views curve,trial --keep /tmp/views-stores
    python benchmarks/views.py --at HEAD --keep /tmp/views-stores    # the code of a commit, not the tree

`--at REF` runs the whole program again on the code of commit REF (`git archive` of its package folders,
laid out as the build installs them, in a folder of the temporary directory named by the commit, first on
PYTHONPATH): a working tree that others are editing is not what gets measured.

The stores. Each size gets a store of its own per database, holding two jobs of model `fake` at batch size
50 (as `posbias submit --engine fake --model fake --batch-sizes 50 --iterations K` makes them, seed 0): the
job measured, of K = size / 50 trials (4,000, 20,000, 100,000), and a second job of 4,000 trials with a
steeper fake curve (`--fake-last 0.65`) for `compare`; having the same seed, it shows the same questions as
the first 4,000 trials of the first job, so the two compare paired (as a schedule's checkpoints do). Every
result is a real fake-engine answer: each shard is run by the worker's own code (`workers/shard.py`'s
`run_shards` on the fake engine, in this process, no Ray) and written through `queue.complete`, 8 shards a
transaction, as the dispatcher writes them. The plan of a larger job begins with the plan of a smaller one
(the planner draws trials in order from the seed), so each shard is answered once and written into every store
whose job has it. The fake engine's tokenizer is wrapped in a cache of token ids (the same ids, checked on
the first shard against the engine the worker loads): tokenizing prompts is most of a fake shard's time.
Answering ran at about 1,700 results a second on the shared 2-core development machine (load average 9: 1M
results in 10 minutes, so 5M in about 50), and each store took 25 s a million to write. `--keep DIR` keeps
the stores (a SQLite file per size, one PostgreSQL cluster) for the next run, and brings a kept store to the
schema of the code measured (`posbias db upgrade`) when that code has moved on.

The views. Each one is a `posbias` command run as a process of its own with POSBIAS_DATABASE_URL set, in a
scratch folder: its wall time from start to exit, and the peak memory (RSS) of its process tree, sampled
every 20 ms and never below the kernel's maximum for the command's process (GNU time's %M). The PostgreSQL
server's own memory is not counted. The package measured is compiled to bytecode first (`compile_code`), as
an installed one is. A view that runs past `--timeout` seconds (600) is stopped and shown as
timed out; one whose memory passes `--memory-cap` MB (10,000, so that a view cannot take the shared machine
down) is stopped and shown as over the cap. `posbias view` is started once per store and timed on two GETs of
the job's page (the first builds it, the second shows whether the viewer keeps it) and one of a trial as a
click asks for it (`/api/trial/JOB/TRIAL`, where the code serves it); the server's peak covers its start-up
and the requests so far. `start-up` is `posbias db current`: what any command that opens the store costs
before its view does anything. MB are 10^6 bytes; the target of 1 GB is 1,000 MB.

The targets (issue 39): at 1M results `curve` (of the job, and of the model over its jobs) at most 2 s and
500 MB, `explain` at most 10 s, `report` at most 10 s and a page of at most 10 MB, `export` at most 5 s,
`trial` at most 0.5 s; at 5M results every view under 1 GB.

Each view but the viewer runs `--repeat` times (3) in a row: the table shows the run of median wall time
(the largest peak of the runs), the notes every run's time. The first run on a PostgreSQL store just started
reads its pages cold (2.33 s for `curve --job` at 1M, where the next runs took 1.8-1.9 s, 2026-12-05).
"""

from __future__ import annotations

import argparse
import contextlib
import html
import json
import os
import pwd
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import psutil
import sqlalchemy as sa

# tests/support (throwaway PostgreSQL, free ports) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import postgres as throwaway_postgres
from support.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from recorded import Guard

REPO = Path(__file__).resolve().parents[1]
BATCH_SIZE = 50
SIZES = (200_000, 1_000_000, 5_000_000)
STORES = ("sqlite", "postgresql")
OTHER_TRIALS = 4_000
"""Trials of the second job, the one `compare` compares with (200,000 results)."""
OTHER_FAKE = {"last": 0.65}
SPEC: dict[str, Any] = {"model": "fake", "engine": {"name": "fake"}, "batch_sizes": [BATCH_SIZE], "seed": 0}
OWNER = "views-benchmark"
SAMPLE_SECONDS = 0.02
MB = 1e6

# Durability off (the stores are scratch, or kept only for the next run), with the memory a server that
# holds millions of results would be given.
POSTGRES_SETTINGS = {
    **throwaway_postgres.FAST_SETTINGS,
    "shared_buffers": "1GB",
    "max_wal_size": "8GB",
    "work_mem": "64MB",
}


# --- the views ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreJobs:
    """A built store: where it is, and the ids a view asks for."""

    database: str
    """`sqlite` or `postgresql`."""
    size: int
    """Results of the job measured."""
    url: str
    job: int
    """The job measured (`size` results)."""
    other: int
    """The second job, for `compare`."""
    trial: int
    """A trial of `job` (its middle one), for `trial`."""


@dataclass(frozen=True)
class View:
    """One view: its name for `--views`, the rows it prints, and its command."""

    name: str
    label: str
    args: Callable[[StoreJobs], list[str]]


VIEWS: tuple[View, ...] = (
    View("curve", "curve --job", lambda s: ["curve", "--job", str(s.job)]),
    View(
        "curve-distance",
        "curve --job --by token-distance",
        lambda s: ["curve", "--job", str(s.job), "--by", "token-distance"],
    ),
    View("curve-model", "curve --model", lambda s: ["curve", "--model", "fake"]),
    View("explain", "explain", lambda s: ["explain", str(s.job)]),
    View("compare", "compare", lambda s: ["compare", str(s.job), str(s.other)]),
    View("report", "report", lambda s: ["report", str(s.job), "--out", "r.html", "--force"]),
    View("export", "export", lambda s: ["export", str(s.job), "--out", "x.parquet", "--force"]),
    View("view", "view, first GET", lambda s: ["view", "--port", "0", "--quiet"]),
    View("trial", "trial", lambda s: ["trial", str(s.job), str(s.trial)]),
    View("startup", "start-up (db current)", lambda s: ["db", "current"]),
)
PAGE_ROW = "report page"
VIEWER_GETS = (
    ("view, first GET", "/job/{job}"),
    ("view, second GET", "/job/{job}"),
    ("view, a trial", "/api/trial/{job}/{trial}"),
)
"""What the viewer is asked, in order: the job's page twice (built, then as the viewer keeps it), and one
trial as a click on it asks (served from the store on demand)."""


@dataclass
class Measured:
    """What one view cost: wall seconds and peak MB, or why there is no figure."""

    seconds: float
    peak_mb: float
    problem: str | None = None
    """`timed out`, `over the memory cap`, or `error`; None when the view ran to its end."""
    detail: str | None = None
    """The error's last lines, or other facts worth printing under the table."""
    page_mb: float | None = None
    """The report page's size (report), or None."""
    also: dict[str, Measured] = field(default_factory=dict)
    """Rows of their own that the same run measured (the viewer's later GETs)."""
    cpu: float | None = None
    """CPU seconds of the command (user and system, GNU time's), beside its wall time: on a shared machine
    the wall time grows with the load, the CPU time much less; None where not measured (the viewer)."""

    def cell(self) -> str:
        """The table's cell: `seconds s (cpu s CPU), MB MB`, or the problem (never two spaces in a row)."""
        if self.problem == "error":
            return "error"
        if self.problem is not None:
            return f"{self.problem} at {self.seconds:.0f} s, {self.peak_mb:,.0f} MB"
        cpu = f" ({self.cpu:.2f} s CPU)" if self.cpu is not None else ""
        return f"{self.seconds:.2f} s{cpu}, {self.peak_mb:,.0f} MB"


class Sampler:
    """The peak RSS of a process and its descendants, sampled every `SAMPLE_SECONDS` in a thread; calls
    `over` once if it passes `cap` bytes."""

    def __init__(self, pid: int, *, cap: float, over: Callable[[], None]) -> None:
        self.process = psutil.Process(pid)
        self.cap = cap
        self.over = over
        self.peak = 0
        self.capped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        """The tree's RSS now (0 once it is gone)."""
        total = 0
        try:
            processes = [self.process, *self.process.children(recursive=True)]
        except psutil.Error:
            return 0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            if self.peak > self.cap and not self.capped:
                self.capped = True
                self.over()
            self._stop.wait(SAMPLE_SECONDS)

    def stop(self) -> int:
        """Stop sampling; the peak in bytes."""
        self._stop.set()
        self._thread.join()
        return self.peak


def _kill_tree(pid: int) -> None:
    """Kill the process group `pid` leads (every view starts a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


GNU_TIME = Path("/usr/bin/time")


def _with_peak(command: list[str], cwd: Path) -> list[str]:
    """`command` under GNU time, which writes its largest resident set (KiB) to `cwd/peak.txt`: the kernel's
    own figure, which sampling can miss at a short peak. (Not Python's `os.wait4`: a child forked from this
    process starts with this process's pages counted, and the kernel keeps that maximum across `exec`.)"""
    if not GNU_TIME.exists():
        return command
    return [str(GNU_TIME), "-f", "%M %U %S", "-o", str(cwd / "peak.txt"), *command]


def _peak(sampled: int, cwd: Path) -> float:
    """MB: the larger of the sampled peak (bytes) and GNU time's."""
    kib = _gnu_time(cwd)[0]
    return max(sampled, kib * 1024) / MB


def _cpu(cwd: Path) -> float | None:
    """The command's CPU seconds (user + system) as GNU time wrote them; None without them."""
    return _gnu_time(cwd)[1]


def _gnu_time(cwd: Path) -> tuple[int, float | None]:
    """GNU time's last line in `cwd/peak.txt`: the largest resident set (KiB) and the CPU seconds."""
    try:
        kib, user, system = (cwd / "peak.txt").read_text().split()[-3:]
        return int(kib), float(user) + float(system)
    except (OSError, ValueError):
        return 0, None


def run_command(
    command: list[str], *, env: dict[str, str], cwd: Path, timeout: float, cap_mb: float
) -> Measured:
    """Run `command` to its end (or `timeout`, or `cap_mb`) and measure it."""
    err_path = cwd / "stderr.txt"
    with open(os.devnull, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        process = subprocess.Popen(
            _with_peak(command, cwd), env=env, cwd=cwd, stdout=out, stderr=err, start_new_session=True
        )
        sampler = Sampler(process.pid, cap=cap_mb * MB, over=lambda: _kill_tree(process.pid))
        try:
            process.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_tree(process.pid)
            process.wait()
        seconds = time.perf_counter() - started
    peak = _peak(sampler.stop(), cwd)
    if timed_out:
        return Measured(seconds, peak, problem="timed out")
    if sampler.capped:
        return Measured(seconds, peak, problem="over the memory cap")
    if process.returncode != 0:
        lines = [
            line
            for line in err_path.read_text(errors="replace").strip().splitlines()
            if not line.startswith("Command exited with non-zero status")  # GNU time's own line
        ]
        return Measured(
            seconds, peak, problem="error", detail=f"exit {process.returncode}: " + " | ".join(lines[-3:])
        )
    return Measured(seconds, peak, cpu=_cpu(cwd))


def run_viewer(
    command: list[str], *, store: StoreJobs, env: dict[str, str], cwd: Path, timeout: float, cap_mb: float
) -> Measured:
    """Start the viewer, GET the job's page twice and one trial as a click asks for it, stop the viewer:
    each GET's time, and the server's peak up to it (its start-up included). The first GET's figures, with
    the others as rows of their own (`also`)."""
    with open(cwd / "stderr.txt", "wb") as err:
        process = subprocess.Popen(
            _with_peak(command, cwd),
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,
            text=True,
        )
        sampler = Sampler(process.pid, cap=cap_mb * MB, over=lambda: _kill_tree(process.pid))
        started = time.perf_counter()
        gets: dict[str, Measured] = {}
        try:
            gets = _viewer_gets(process, store=store, timeout=timeout, sampler=sampler, started=started)
        finally:
            # Ctrl-C, how a viewer is stopped, to its process group (GNU time ignores it).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _kill_tree(process.pid)
                process.wait()
            peak = _peak(sampler.stop(), cwd)
            if process.stdout is not None:
                process.stdout.close()
    if not gets:
        lines = (cwd / "stderr.txt").read_text(errors="replace").strip().splitlines()
        detail = "the viewer did not start: " + " | ".join(lines[-3:])
        return Measured(time.perf_counter() - started, peak, problem="error", detail=detail)
    items = list(gets.items())
    items[-1][1].peak_mb = max(items[-1][1].peak_mb, peak)
    first = items[0][1]
    first.also = dict(items[1:])
    return first


def _viewer_gets(
    process: subprocess.Popen[str], *, store: StoreJobs, timeout: float, sampler: Sampler, started: float
) -> dict[str, Measured]:
    """Wait for the viewer's address, then GET what `VIEWER_GETS` names, stopping at a failed GET. A trial
    the viewer does not serve (404: code from before it served trials on demand) has no row."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    first_line = process.stdout.readline() if ready else ""  # "posbias view: http://127.0.0.1:PORT/ (..."
    found = re.search(r"(http://\S+?)/?\s", first_line)
    if found is None:
        return {}
    start_up = time.perf_counter() - started
    gets: dict[str, Measured] = {}
    for label, path in VIEWER_GETS:
        asked = path.format(job=store.job, trial=store.trial)
        url = found.group(1) + asked
        began = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as answer:
                body = answer.read()
        except Exception as exc:
            seconds = time.perf_counter() - began
            if isinstance(exc, urllib.error.HTTPError) and exc.code == 404 and "{trial}" in path:
                continue
            problem = "error"
            if sampler.capped:
                problem = "over the memory cap"
            elif seconds >= timeout:
                problem = "timed out"
            detail = f"GET {asked}: {_http_error(exc)}"
            gets[label] = Measured(seconds, sampler.peak / MB, problem=problem, detail=detail)
            break
        seconds = time.perf_counter() - began
        detail = f"GET {asked}: {len(body) / MB:.2f} MB"
        if not gets:
            detail = f"viewer start-up {start_up:.2f} s; {detail}"
        gets[label] = Measured(seconds, sampler.peak / MB, detail=detail)
    return gets


def _http_error(exc: Exception) -> str:
    """What a failed GET says: for an error page, its status and the viewer's message."""
    if not isinstance(exc, urllib.error.HTTPError):
        return str(exc)
    page = exc.read().decode(errors="replace")
    message = re.search(r"<p>(.*?)</p>", page, re.DOTALL)
    return f"{exc.code} {exc.reason}" + (f": {html.unescape(message.group(1)).strip()}" if message else "")


def measure(
    view: View, store: StoreJobs, *, env: dict[str, str], scratch: Path, timeout: float, cap_mb: float
) -> Measured:
    """Run `view` on `store` in a fresh scratch folder."""
    cwd = scratch / f"{store.database}-{store.size}-{view.name}"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    env = {**env, "POSBIAS_DATABASE_URL": store.url}
    command = [posbias_command(), *view.args(store)]
    try:
        if view.name == "view":
            return run_viewer(command, store=store, env=env, cwd=cwd, timeout=timeout, cap_mb=cap_mb)
        measured = run_command(command, env=env, cwd=cwd, timeout=timeout, cap_mb=cap_mb)
        page = cwd / "r.html"
        if view.name == "report" and page.exists():
            measured.page_mb = page.stat().st_size / MB
        exported = cwd / "x.parquet"
        if view.name == "export" and exported.exists():
            measured.detail = f"{exported.stat().st_size / MB:.1f} MB of Parquet"
        return measured
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def measure_repeated(view: View, store: StoreJobs, *, repeat: int, **how: Any) -> Measured:
    """`view` run `repeat` times on `store` (the viewer once: it is timed on its own GETs): the run of median
    wall time, with the largest peak of them all and every run's time in its notes. The first run after a
    store's server starts reads cold pages (PostgreSQL's shared buffers fill on first use); the median is what
    a user's second and later views cost."""
    runs = [measure(view, store, **how) for _ in range(1 if view.name == "view" else repeat)]
    if len(runs) == 1 or any(run.problem is not None for run in runs):
        return next((run for run in runs if run.problem is not None), runs[0])
    chosen = sorted(runs, key=lambda run: run.seconds)[len(runs) // 2]
    chosen.peak_mb = max(run.peak_mb for run in runs)
    times = ", ".join(f"{run.seconds:.2f}" for run in runs)
    runs_note = f"{len(runs)} runs in order: {times} s (median shown)"
    chosen.detail = "; ".join(filter(None, [chosen.detail, runs_note]))
    return chosen


def posbias_command() -> str:
    """The `posbias` script of this environment."""
    script = Path(sys.executable).with_name("posbias")
    return str(script) if script.exists() else shutil.which("posbias") or "posbias"


# --- the stores -----------------------------------------------------------------------------------------


@dataclass
class Build:
    """What building one store cost (the answers it shares with other stores are timed apart)."""

    submit_seconds: float = 0.0
    """Planning and writing its two jobs (`posbias.submit`)."""
    write_seconds: float = 0.0
    """Its share of `queue.complete`: its results written, 8 shards a transaction."""
    analyze_seconds: float = 0.0
    """Fresh planner statistics at the end (ANALYZE; VACUUM ANALYZE on PostgreSQL)."""

    @property
    def seconds(self) -> float:
        """The store's own time."""
        return self.submit_seconds + self.write_seconds + self.analyze_seconds


@dataclass
class Target:
    """A store being built."""

    database: str
    size: int
    url: str
    job: int = 0
    other: int = 0
    build: Build = field(default_factory=Build)

    @property
    def trials(self) -> int:
        """Trials of the job measured."""
        return self.size // BATCH_SIZE


def _spec(trials: int, fake: dict[str, float] | None = None) -> dict[str, Any]:
    return {**SPEC, "iterations": trials, **({"fake": fake} if fake else {})}


def answering_engine(shard: Any, *, settings: Any) -> Any:
    """The fake engine the worker would load for `shard`, with its tokenizer's token ids cached; checked on
    `shard` against the engine `load_engine` builds (the same answers, token offsets and probabilities)."""
    from posbias.workers.fake_engine import FakeEngine, FakeTokenizer
    from posbias.workers.loader import load_engine
    from posbias.workers.shard import run_shard

    class CachedTokenizer(FakeTokenizer):
        """The fake tokenizer, remembering the id of each piece (a CRC of its text, the same every time)."""

        def __init__(self) -> None:
            super().__init__()
            self._ids: dict[str, int] = {}

        def token_id(self, piece: str) -> int:
            found = self._ids.get(piece)
            if found is None:
                found = self._ids[piece] = FakeTokenizer.token_id(piece)
            return found

    worker_engine = load_engine(shard, config=settings.worker_config())
    fake = shard.fake
    engine = FakeEngine(
        fake,
        seed=fake.seed if fake.seed is not None else shard.seed,
        model=shard.model,
        tokenizer=CachedTokenizer(),
    )
    expected, got = run_shard(shard, engine=worker_engine), run_shard(shard, engine=engine)
    if (expected.trials, expected.answers) != (got.trials, got.answers):
        raise RuntimeError("the cached tokenizer's engine answers differently from the worker's fake engine")
    return engine


def fill(
    targets: Sequence[Target],
    *,
    job_of: Callable[[Target], int],
    trials_of: Callable[[Target], int],
    label: str,
) -> float:
    """Answer the shards of each target's job (`job_of`) once, in shard order, and write each into every
    target whose job has it; returns the seconds spent answering. The targets' jobs share a seed, so the plan
    of a smaller one is the beginning of a larger one's."""
    from posbias.service.dispatch.pools import SHARDS_PER_CALL
    from posbias.service.settings import Settings
    from posbias.service.store import database
    from posbias.service.work import queue
    from posbias.workers.shard import run_shards

    largest = max(targets, key=trials_of)
    total = trials_of(largest) * BATCH_SIZE
    answering = 0.0
    engine = None
    done = 0
    next_note = time.perf_counter() + 30
    with contextlib.ExitStack() as stack:
        dbs = {id(t): stack.enter_context(database.connect(t.url)) for t in targets}
        settings = Settings(database_url=largest.url)
        while leases := queue.lease(
            dbs[id(largest)],
            owner=OWNER,
            limit=SHARDS_PER_CALL,
            lease_seconds=3600,
            job_ids=[job_of(largest)],
        ):
            shards = [lease.shard for lease in leases]
            if engine is None:
                engine = answering_engine(shards[0], settings=settings)
            started = time.perf_counter()
            results = run_shards(shards, engine=engine)
            answering += time.perf_counter() - started
            by_trials = {tuple(t.trial_index for t in r.trials): r for r in results}
            for target in targets:
                db = dbs[id(target)]
                if target is largest:
                    mine = results
                else:
                    wanted = sum(1 for r in results if r.trials[0].trial_index < trials_of(target))
                    if not wanted:
                        continue
                    theirs = queue.lease(
                        db, owner=OWNER, limit=wanted, lease_seconds=3600, job_ids=[job_of(target)]
                    )
                    mine = []
                    for lease in theirs:
                        key = tuple(t.index for t in lease.shard.trials)
                        if key not in by_trials:
                            raise RuntimeError(
                                f"shard {lease.shard_id} of {target.database} {target.size:,} holds trials "
                                f"{key[0]}-{key[-1]}, which the largest job's shards do not: the plans differ"
                            )
                        mine.append(
                            by_trials[key].model_copy(
                                update={"job_id": job_of(target), "shard_id": lease.shard_id}
                            )
                        )
                started = time.perf_counter()
                outcomes = queue.complete(db, mine, owner=OWNER)
                target.build.write_seconds += time.perf_counter() - started
                for outcome in outcomes:
                    if not outcome.written:
                        raise RuntimeError(f"a shard was not written: {outcome.reason}")
            done += sum(len(r.answers.position) for r in results)
            if time.perf_counter() > next_note:
                next_note = time.perf_counter() + 30
                print(f"    {label}: {done:,} of {total:,} results answered ({answering:.0f} s)", flush=True)
    return answering


def build(targets: Sequence[Target]) -> dict[str, float]:
    """Submit both jobs to every target, answer and write them, and settle the planner's statistics;
    returns the seconds spent answering, by job."""
    import posbias
    from posbias.service.store import database, migrate

    for target in targets:
        started = time.perf_counter()
        migrate.upgrade(target.url)
        settings = posbias.Settings(database_url=target.url)
        target.job = posbias.submit(_spec(target.trials), settings=settings).job_id
        target.other = posbias.submit(_spec(OTHER_TRIALS, OTHER_FAKE), settings=settings).job_id
        target.build.submit_seconds = time.perf_counter() - started
        print(
            f"    {target.database} {target.size:,}: jobs submitted ({target.build.submit_seconds:.1f} s)",
            flush=True,
        )
    answering = {
        "measured": fill(
            targets, job_of=lambda t: t.job, trials_of=lambda t: t.trials, label="the job measured"
        ),
        "other": fill(
            targets, job_of=lambda t: t.other, trials_of=lambda t: OTHER_TRIALS, label="the second job"
        ),
    }
    for target in targets:
        started = time.perf_counter()
        with database.connect(target.url) as db, db.engine.connect() as connection:
            connection.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM ANALYZE" if db.dialect == "postgresql" else "ANALYZE"
            )
        target.build.analyze_seconds = time.perf_counter() - started
    return answering


def upgrade_kept(url: str) -> str | None:
    """Bring a kept store to the schema of the code measured, as `posbias db upgrade` would (the code may
    have moved on since it was built); what was done, or None when it was already there."""
    from posbias.service.store import migrate

    before = migrate.current(url)
    started = time.perf_counter()
    migrate.upgrade(url)
    after = migrate.current(url)
    if before == after:
        return None
    return f"upgraded from schema {before} to {after} in {time.perf_counter() - started:.1f} s"


def middle_trial(url: str, job: int) -> int:
    """The id of the middle trial of `job`, in plan order."""
    from posbias.service.store import Trial, database

    with database.connect(url) as db, db.read() as session:
        count = session.scalar(sa.select(sa.func.count()).select_from(Trial).where(Trial.job_id == job))
        query = sa.select(Trial.id).where(Trial.job_id == job).order_by(Trial.index).offset((count or 0) // 2)
        found = session.scalar(query.limit(1))
    if found is None:
        raise RuntimeError(f"job {job} has no trials")
    return int(found)


# --- where the stores live -----------------------------------------------------------------------------


class Stores:
    """The stores of one run: a SQLite file per size and a database per size on one PostgreSQL server, in a
    temporary folder, or kept in `keep` for the next run with a manifest of what is built."""

    def __init__(self, stack: contextlib.ExitStack, *, keep: Path | None, databases: Sequence[str]) -> None:
        self.keep = keep
        self.folder = keep if keep is not None else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.manifest_path = self.folder / "stores.json"
        self.manifest: dict[str, dict[str, Any]] = (
            json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else {}
        )
        self.server = stack.enter_context(postgres_server(keep)) if "postgresql" in databases else None

    def url(self, database: str, size: int) -> str:
        """Where the store of `database` at `size` is."""
        if database == "sqlite":
            return f"sqlite:///{self.folder / f'views-{size}.db'}"
        assert self.server is not None
        return self.server.url(f"views_{size}")

    def built(self, database: str, size: int) -> StoreJobs | None:
        """The store, if a run built it completely."""
        entry = self.manifest.get(f"{database} {size}")
        if entry is None:
            return None
        return StoreJobs(
            database=database,
            size=size,
            url=self.url(database, size),
            job=entry["job"],
            other=entry["other"],
            trial=entry["trial"],
        )

    def fresh(self, database: str, size: int) -> str:
        """An empty store of `database` at `size` (removing what an unfinished build left): its URL."""
        self.manifest.pop(f"{database} {size}", None)
        if database == "sqlite":
            path = self.folder / f"views-{size}.db"
            for leftover in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
                leftover.unlink(missing_ok=True)
            return self.url(database, size)
        assert self.server is not None
        self.server.drop_database(f"views_{size}")
        return self.server.create_database(f"views_{size}")

    def record(self, store: StoreJobs, build: Build, *, commit: str) -> None:
        """Note `store` as built (written to the manifest when the stores are kept)."""
        self.manifest[f"{store.database} {store.size}"] = {
            "job": store.job,
            "other": store.other,
            "trial": store.trial,
            "built": str(date.today()),
            "commit": commit,
            "seconds": round(build.seconds, 1),
        }
        if self.keep is not None:
            self.manifest_path.write_text(json.dumps(self.manifest, indent=1) + "\n")


@contextlib.contextmanager
def postgres_server(keep: Path | None) -> Iterator[throwaway_postgres.PostgresServer]:
    """A throwaway PostgreSQL server; with `keep`, one whose cluster lives in `keep/postgresql` and is
    stopped, not deleted, at the end (it is made once by tests/support/postgres.py, then moved there)."""
    if keep is None:
        with throwaway_postgres.running(settings=POSTGRES_SETTINGS) as server:
            yield server
        return
    root = (keep / "postgresql").resolve()
    run_as = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    if not (root / "data").is_dir():
        made = throwaway_postgres.start(settings=POSTGRES_SETTINGS)
        made.halt()
        root.mkdir(parents=True, exist_ok=True)
        if run_as is not None:
            os.chown(root, run_as.pw_uid, run_as.pw_gid)
        shutil.move(made.data_dir, root / "data")
        with contextlib.suppress(Exception):  # its folder is deleted; its data has moved
            made.stop()
    port = free_port()
    options = [f"-p {port}", "-c listen_addresses=127.0.0.1", f"-c unix_socket_directories={root}"]
    options += [f"-c {key}={value}" for key, value in POSTGRES_SETTINGS.items()]
    server = throwaway_postgres.PostgresServer(
        bindir=throwaway_postgres.find_bindir(),
        root=root,
        port=port,
        run_as=run_as,
        options=" ".join(options),
    )
    with contextlib.suppress(Exception):  # a server a killed run left on this cluster (none: pg_ctl says so)
        server.halt()
    try:
        server.resume()
    except Exception as exc:
        raise SystemExit(
            f"PostgreSQL did not start in {root} ({exc}); its log is {server.log_file}. Under root the "
            "postgres user must be able to enter every folder above it."
        ) from None
    try:
        yield server
    finally:
        server.halt()


# --- the code measured ----------------------------------------------------------------------------------

AT_COMMIT = "POSBIAS_VIEWS_AT"
"""Set when this program runs again on the code of `--at`'s commit (the value: that commit)."""
CODE_FOLDERS = {
    "posbias": "",
    "schemas": "schemas",
    "service": "service",
    "workers": "workers",
    "migrations": "migrations",
}
"""The repository's folders, and where each goes inside the `posbias` package (pyproject's package-dir)."""


def code_at(ref: str) -> tuple[Path, str]:
    """The package `posbias` as commit `ref` has it, laid out as the build installs it, in a folder of the
    temporary directory named by the commit (made once, reused by later runs): that folder and the commit."""
    import io
    import tarfile

    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    folder = Path(tempfile.gettempdir()) / f"posbias-views-{commit[:12]}"
    if (folder / "posbias" / "__init__.py").exists():
        return folder, commit
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, *CODE_FOLDERS], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(part, filter="data")
    for name, inside in CODE_FOLDERS.items():
        if inside:
            (part / name).rename(part / "posbias" / inside)
    part.rename(folder)
    return folder, commit


def code_measured() -> str:
    """Which code runs: `--at`'s commit, or the working tree's commit and whether it has changes."""
    at = os.environ.get(AT_COMMIT)
    if at:
        return f"commit {at[:10]} (--at), from {_package_folder()}"
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short=10", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    changed = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return f"the working tree at {head}" + (" with uncommitted changes" if changed else "")


def _package_folder() -> str:
    import posbias

    return str(Path(posbias.__file__).resolve().parent)


def compile_code() -> None:
    """The measured package's modules compiled to bytecode before any view runs, as an installed posbias's
    are (pip compiles them): where PYTHONDONTWRITEBYTECODE is set (as in this machine's sessions) every
    command would otherwise compile them from source again, a tenth of a second or more of each view's
    start that no user pays. Python checks each file's bytecode against its source, so a module edited
    since is compiled again, as it would be anyway."""
    import compileall

    if os.environ.get(AT_COMMIT):
        folders = [Path(_package_folder())]
    else:
        folders = [REPO / name for name in CODE_FOLDERS]
    for folder in folders:
        compileall.compile_dir(folder, quiet=1)


# --- what is printed ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Goal:
    """One of issue 39's targets: a row of the table at a size, at most `seconds` and `megabytes` (of the
    page, for the report page's row)."""

    row: str
    size: int
    seconds: float | None = None
    megabytes: float | None = None


ALL_ROWS = "every view"
GOALS: tuple[Goal, ...] = (
    Goal("curve --job", 1_000_000, seconds=2, megabytes=500),
    Goal("curve --model", 1_000_000, seconds=2, megabytes=500),
    Goal("explain", 1_000_000, seconds=10),
    Goal("report", 1_000_000, seconds=10),
    Goal(PAGE_ROW, 1_000_000, megabytes=10),
    Goal("export", 1_000_000, seconds=5),
    Goal("trial", 1_000_000, seconds=0.5),
    Goal(ALL_ROWS, 5_000_000, megabytes=1_000),
)
LABEL_WIDTH = 34
CELL_WIDTH = 36


def rows_of(measured: dict[str, Measured]) -> dict[str, Measured]:
    """The table's rows from the views' figures: the report's page and the viewer's later GETs get rows of
    their own."""
    rows: dict[str, Measured] = {}
    for label, figures in measured.items():
        rows[label] = figures
        if label == "report":
            rows[PAGE_ROW] = figures
        rows.update(figures.also)
    return rows


def cell(label: str, figures: Measured | None) -> str:
    """A cell of `label`'s row."""
    if figures is None:
        return "-"
    if label == PAGE_ROW:
        return f"{figures.page_mb:.1f} MB" if figures.page_mb is not None else figures.cell()
    return figures.cell()


def print_table(database: str, sizes: Sequence[int], rows: dict[int, dict[str, Measured]]) -> None:
    """One store's table: a row per view, a column per size (`Guard.views` reads it back)."""
    print(
        f"\n{database}: seconds (CPU seconds) and peak MB of each command's process tree (the viewer: its "
        "server's)"
    )
    header = "".join(f"{f'{size:,} results':<{CELL_WIDTH}}" for size in sizes)
    print(f"  {'view':<{LABEL_WIDTH}}{header}".rstrip())
    labels = list(dict.fromkeys(label for size in sizes for label in rows.get(size, {})))
    for label in labels:
        cells = "".join(f"{cell(label, rows.get(size, {}).get(label)):<{CELL_WIDTH}}" for size in sizes)
        print(f"  {label:<{LABEL_WIDTH}}{cells}".rstrip())


def _verdict(now: float, goal: float, unit: str, *, over: bool = False) -> str:
    ratio = now / goal
    shown = f"{now:,.2f} s" if unit == "s" else f"{now:,.1f} MB" if now < 100 else f"{now:,.0f} MB"
    limit = f"{goal:g} s" if unit == "s" else f"{goal:,g} MB"
    met = "met" if ratio <= 1 and not over else "missed"
    return f"{'over ' if over else ''}{shown} for {limit}: {met} ({'>' if over else ''}{ratio:.2f}x)"


def print_goals(database: str, rows: dict[int, dict[str, Measured]]) -> None:
    """Each of issue 39's targets for `database`: met or missed, and measured / target."""
    lines = []
    for goal in GOALS:
        at = rows.get(goal.size)
        if not at:
            continue
        labels = [label for label in at if label != PAGE_ROW] if goal.row == ALL_ROWS else [goal.row]
        for label in labels:
            figures = at.get(label)
            if figures is None:
                continue
            where = f"  {label} at {goal.size:,}: "
            if figures.problem == "error":
                lines.append(where + "error, not measured")
                continue
            over_time = figures.problem == "timed out"
            over_memory = figures.problem == "over the memory cap"
            parts = []
            if goal.seconds is not None:
                parts.append(_verdict(figures.seconds, goal.seconds, "s", over=over_time))
            if goal.megabytes is not None:
                megabytes = figures.page_mb if label == PAGE_ROW else figures.peak_mb
                if megabytes is None:
                    parts.append("no page written")
                else:
                    parts.append(_verdict(megabytes, goal.megabytes, "MB", over=over_memory))
            lines.append(where + "; ".join(parts))
    if lines:
        print(f"\n{database} against issue 39's targets (measured / target):")
        print("\n".join(lines))


def print_guard(
    databases: Sequence[str], sizes: Sequence[int], found: dict[tuple[str, int], dict[str, Measured]]
) -> None:
    """Now beside what benchmarks/README.md last recorded (recorded.py), for every figure of both."""
    guard = Guard.read("Views")
    print(
        f"\nagainst the figures recorded in benchmarks/README.md ({os.getloadavg()[0]:.1f} load average now)"
    )
    for database in databases:
        recorded = guard.views(database)
        if not recorded:
            print(f"   {database}: nothing recorded in benchmarks/README.md ({guard.section}) yet")
            continue
        for size in sizes:
            for label, figures in rows_of(found.get((database, size), {})).items():
                then = recorded.get((label, size))
                if figures.problem is not None:
                    continue
                name = f"{database} {label} at {size:,}"
                if label == PAGE_ROW:
                    if figures.page_mb is not None:
                        mb = then.megabytes if then else None
                        print(guard.line(f"{name}, MB", now=figures.page_mb, then=mb, higher_is_better=False))
                    continue
                seconds = then.seconds if then else None
                print(
                    guard.line(f"{name}, seconds", now=figures.seconds, then=seconds, higher_is_better=False)
                )
                mb = then.megabytes if then else None
                print(guard.line(f"{name}, peak MB", now=figures.peak_mb, then=mb, higher_is_better=False))


def print_builds(
    built: list[tuple[StoreJobs, Build]],
    answering: dict[str, float],
    kept: list[tuple[StoreJobs, dict[str, Any]]],
) -> None:
    """How long each store took to build, and what was answered once for all of them."""
    if built:
        print(
            "\nstores built (the fake engine in this process; results written through queue.complete, "
            "8 shards a transaction)"
        )
        columns = f"{'job':>5}{'other':>7}{'submit s':>10}{'write s':>10}{'analyze s':>11}{'total s':>9}"
        print(f"  {'store':<24}{columns}")
        for store, b in built:
            name = f"{store.database} {store.size:,}"
            print(
                f"  {name:<24}{store.job:>5}{store.other:>7}{b.submit_seconds:10.1f}{b.write_seconds:10.1f}"
                f"{b.analyze_seconds:11.1f}{b.seconds:9.1f}"
            )
        print(
            f"  answered once for every store: the job measured {answering.get('measured', 0):.1f} s, "
            f"the second job {answering.get('other', 0):.1f} s"
        )
    for store, entry in kept:
        upgrade = entry.get("upgrade")
        print(
            f"  {store.database} {store.size:,}: kept, built {entry.get('built')} at {entry.get('commit')} "
            f"in {entry.get('seconds')} s of its own (jobs {store.job} and {store.other})"
            + (f"; {upgrade}" if upgrade else "")
        )


# --- the run --------------------------------------------------------------------------------------------


def _numbers(text: str) -> list[int]:
    return [int(part.replace("_", "").replace(",", "")) for part in text.split(",") if part.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", default=",".join(map(str, SIZES)), help="results of the job measured, e.g. 200000,1000000"
    )
    parser.add_argument("--stores", default=",".join(STORES), help="sqlite, postgresql or both")
    parser.add_argument(
        "--views",
        default=",".join(v.name for v in VIEWS),
        help=f"which views: {', '.join(v.name for v in VIEWS)}",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the stores in this folder, and reuse those built there"
    )
    parser.add_argument("--at", help="run on the code of this commit (e.g. HEAD), not the working tree")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a view may take (default 600)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="runs of each view; shown: the median wall time, the largest peak (default 3; viewer once)",
    )
    parser.add_argument(
        "--memory-cap",
        type=float,
        default=10_000.0,
        help="MB a view may hold before it is stopped (default 10,000)",
    )
    args = parser.parse_args(argv)
    args.sizes = _numbers(args.sizes)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    args.views = [v.strip() for v in args.views.split(",") if v.strip()]
    if args.repeat < 1:
        parser.error("--repeat: at least 1 run of each view")
    for size in args.sizes:
        if size <= 0 or size % BATCH_SIZE:
            parser.error(f"--sizes: {size:,} is not a whole number of trials of {BATCH_SIZE} results")
    for database in args.stores:
        if database not in STORES:
            parser.error(f"--stores: {database!r} is not one of {', '.join(STORES)}")
    known = {v.name for v in VIEWS}
    for name in args.views:
        if name not in known:
            parser.error(f"--views: {name!r} is not one of {', '.join(sorted(known))}")
    return args


def main() -> None:
    args = parse_args()
    # Stopped with SIGTERM (or SIGINT, which a shell's background job ignores): unwind, so that a kept
    # PostgreSQL cluster is shut down rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.at and not os.environ.get(AT_COMMIT):
        # Again, on that commit's code: the stores are built and the views run by the same code.
        folder, commit = code_at(args.at)
        path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path, AT_COMMIT: commit}
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]], env)

    views = [v for v in VIEWS if v.name in args.views]
    code = code_measured()
    print(
        f"views benchmark, {date.today()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}, "
        f"{psutil.virtual_memory().available / 1e9:.1f} GB free; {code}"
    )
    commit = os.environ.get(AT_COMMIT, "")[:10] or code
    found: dict[tuple[str, int], dict[str, Measured]] = {}
    with contextlib.ExitStack() as stack:
        stores = Stores(stack, keep=args.keep, databases=args.stores)
        ready: dict[tuple[str, int], StoreJobs] = {}
        kept: list[tuple[StoreJobs, dict[str, Any]]] = []
        targets: list[Target] = []
        for database in args.stores:
            for size in args.sizes:
                store = stores.built(database, size)
                if store is not None:
                    ready[database, size] = store
                    entry = stores.manifest[f"{database} {size}"]
                    entry["upgrade"] = upgrade_kept(store.url)
                    kept.append((store, entry))
                else:
                    targets.append(Target(database=database, size=size, url=stores.fresh(database, size)))
        answering: dict[str, float] = {}
        built: list[tuple[StoreJobs, Build]] = []
        if targets:
            print(f"building {', '.join(f'{t.database} {t.size:,}' for t in targets)}", flush=True)
            answering = build(targets)
            for target in targets:
                store = StoreJobs(
                    database=target.database,
                    size=target.size,
                    url=target.url,
                    job=target.job,
                    other=target.other,
                    trial=middle_trial(target.url, target.job),
                )
                stores.record(store, target.build, commit=commit)
                ready[target.database, target.size] = store
                built.append((store, target.build))
        print_builds(built, answering, kept)

        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="posbias-views-")))
        env = {k: v for k, v in os.environ.items() if k != "POSBIAS_DATABASE_URL"}
        compile_code()
        limits = f"timeout {args.timeout:.0f} s, memory cap {args.memory_cap:,.0f} MB"
        print(f"\nviews (each a `posbias` process; {limits})")
        details: list[str] = []
        for database in args.stores:
            for size in args.sizes:
                store = ready[database, size]
                measured: dict[str, Measured] = {}
                for view in views:
                    figures = measure_repeated(
                        view,
                        store,
                        repeat=args.repeat,
                        env=env,
                        scratch=scratch,
                        timeout=args.timeout,
                        cap_mb=args.memory_cap,
                    )
                    measured[view.label] = figures
                    shown = f"{figures.cell()}" + (
                        f", a {figures.page_mb:.1f} MB page" if figures.page_mb else ""
                    )
                    for label, more in figures.also.items():
                        shown += f"; {label.removeprefix('view, ')} {more.cell()}"
                    print(f"  {database} {size:,} {view.label}: {shown}", flush=True)
                    for label, note in [(view.label, figures.detail)] + [
                        (label, more.detail) for label, more in figures.also.items()
                    ]:
                        if note:
                            details.append(f"  {database} {size:,} {label}: {note}")
                found[database, size] = measured

    for database in args.stores:
        rows = {size: rows_of(found[database, size]) for size in args.sizes}
        print_table(database, args.sizes, rows)
    if details:
        print("\nnotes (errors, page sizes, start-up):")
        print("\n".join(dict.fromkeys(details)))
    for database in args.stores:
        print_goals(database, {size: rows_of(found[database, size]) for size in args.sizes})
    print_guard(args.stores, args.sizes, found)
    print(f"\nload average at the end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
