"""Bad input, thousands of cases: every one must exit 1 or 2 with one line on stderr, no traceback, no hang,
and the store (and the working folder) unchanged.

The cases are the suite's (tests/support/fuzzcases.py: spec files and their fields, flags, job ids, database
URLs and foreign stores, settings and `.env` files, datasets, exports, schedules, Ray addresses), drawn from
a seed, against a SQLite store and a throwaway PostgreSQL server (loopback only). Most run in this process
through the command's real entry point and error mapping (`posbias.cli.app.run`); `--subprocess`
of them, and every case that must be a process of its own (Ray), run as the `posbias` command. Every case
run in this process that the Python API can be asked too (`Case.api`) is asked of it after the command: it
must raise a posbias error with the command's line (a `UsageError` where the command's flags refuse it). It
prints, per template and in all: cases, tracebacks, multi-line errors, hangs, wrong exit codes, internal
errors, changed stores and folders, API calls and the API's problems, then each problem found; each store's
rows and problems as soon as it is done. Exit code 1 when any.

    python benchmarks/fuzz.py                      # 3,000 cases per store, 150 of them as processes
    python benchmarks/fuzz.py --cases 200 --subprocess 10 --dialects sqlite   # a quick look
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from contextlib import ExitStack
from itertools import islice
from pathlib import Path

# tests/support (throwaway PostgreSQL, the fuzz cases) is shared with the tests; not part of the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support import fuzzcases
from support import postgres as throwaway_postgres
from support.ports import free_port

REPO = Path(__file__).resolve().parents[1]
COLUMNS = (
    "cases",
    "traceback",
    "multi-line",
    "hang",
    "exit code",
    "internal",
    "store changed",
    "folder changed",
    "api calls",
    "api problems",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=3000, help="Cases per store.")
    parser.add_argument("--subprocess", type=int, default=150, help="Of them, run as `posbias` processes.")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--dialects", default="sqlite,postgresql", help="Stores to run against.")
    parser.add_argument("--mmlu-dir", type=Path, default=REPO.parent / "shared" / "data" / "mmlu")
    parser.add_argument("--no-api", action="store_true", help="Do not ask the Python API the cases.")
    args = parser.parse_args()

    started = time.monotonic()
    counts: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    problems: list[str] = []
    slowest: list[tuple[float, str]] = []
    reported = 0
    first = args.dialects.split(",")[0]
    with ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="posbias-fuzz-")))
        silent = stack.enter_context(fuzzcases.silent_server())
        for dialect in args.dialects.split(","):
            if dialect == "postgresql":
                server = stack.enter_context(throwaway_postgres.running())
                url = server.create_database(f"fuzz_{uuid.uuid4().hex[:8]}")
                foreign = fuzzcases.foreign_postgres(server, f"foreign_{uuid.uuid4().hex[:8]}")
                port: int | None = server.port
            else:
                url, foreign, port = f"sqlite:///{root / 'store' / 'posbias.db'}", None, None
                (root / "store").mkdir()
            job = fuzzcases.prepare_store(url, mmlu_dir=args.mmlu_dir, cache_dir=root / "cache")
            context = fuzzcases.Context(
                store_url=url,
                dialect=dialect,
                job_id=job,
                closed_port=free_port(),
                silent_port=silent,
                postgres_port=port,
                foreign_postgres_url=foreign,
                store_sql=fuzzcases.store_sql(args.mmlu_dir),
            )
            cases = list(islice(fuzzcases.generate(args.seed, context), args.cases))
            every = max(1, len(cases) // max(args.subprocess, 1)) if args.subprocess else 0
            for number, case in enumerate(cases):
                folder = root / dialect / f"case{number:05d}"
                as_process = not case.in_process or (every and number % every == 0)
                run = fuzzcases.run_subprocess if as_process else fuzzcases.run_in_process
                outcome = run(case, context, folder=folder, cache_dir=root / "cache", mmlu_dir=args.mmlu_dir)
                tally = counts[(dialect, case.template)]
                tally["cases"] += 1
                found = outcome.problems
                tally["traceback"] += "traceback" in found
                tally["multi-line"] += any(p.endswith("lines on stderr") for p in found)
                tally["hang"] += "hang" in found
                tally["exit code"] += any(p.startswith("exit ") for p in found)
                tally["internal"] += "internal error" in found
                tally["store changed"] += "store changed" in found
                tally["folder changed"] += "working folder changed" in found
                tally["processes"] += bool(as_process)
                if found:
                    problems.append(f"{dialect}: {outcome.report()}")
                elif case.api is not None and not as_process and not args.no_api:
                    asked = fuzzcases.run_api(
                        case,
                        context,
                        folder=folder,
                        cache_dir=root / "cache",
                        mmlu_dir=args.mmlu_dir,
                        cli=outcome,
                    )
                    tally["api calls"] += 1
                    tally["api problems"] += bool(asked.problems)
                    if asked.problems:
                        problems.append(f"{dialect}: api: {asked.report()}")
                slowest.append((outcome.seconds, f"{dialect}: {case.describe()}"))
            # This store's rows as soon as it is done: a full run takes an hour a store.
            done = sum(tally["cases"] for (store, _), tally in counts.items() if store == dialect)
            print(f"{dialect}: {done:,} cases in {time.monotonic() - started:.0f} s", flush=True)
            _print_rows(counts, dialect, header=dialect == first)
            for line in problems[reported:]:
                print("problem:", line, flush=True)
            reported = len(problems)

    totals: Counter[str] = Counter()
    for tally in counts.values():
        totals.update(tally)
    print(f"{'all':<11}{'':<{WIDTH}}" + "".join(f"{totals[c]:>15,}" for c in COLUMNS))
    if slowest:
        print(
            f"{totals['cases']:,} cases ({totals['processes']:,} as processes) in "
            f"{time.monotonic() - started:.0f} s; slowest {max(slowest)[0]:.1f} s ({max(slowest)[1]})"
        )
    print(f"{len(problems)} problems" if problems else "no problems")
    return 1 if problems else 0


WIDTH = max(len(name) for name in fuzzcases.TEMPLATES) + 2
"""The template column's width: every template's name fits, whichever a run draws."""


def _print_rows(counts: dict[tuple[str, str], Counter[str]], dialect: str, *, header: bool) -> None:
    """The table's rows of one store (with the header when it is the first store)."""
    if header:
        print(f"{'store':<11}{'template':<{WIDTH}}" + "".join(f"{c:>15}" for c in COLUMNS))
    for (store, name), tally in sorted(counts.items()):
        if store == dialect:
            print(f"{store:<11}{name:<{WIDTH}}" + "".join(f"{tally[c]:>15,}" for c in COLUMNS), flush=True)


if __name__ == "__main__":
    sys.exit(main())
