"""How long the `posbias` command takes to say a usage error, side by side with a bare Python start and
with a command that reads the store (the heavy imports): median wall and CPU seconds of a few runs each, and
the load average before and after (the figures move with it).

    python benchmarks/cli_startup.py [--runs 7]

A command's flags are parsed before its work's imports: `posbias/cli/app.py` imports only the module of the
command asked for, the command modules import the records (`posbias.schemas`, lazily re-exported) and the
API inside their functions, and the choices and bounds a flag offers come from pydantic-free modules
(`schemas/choices.py`, `schemas/limits.py`). A usage error so costs about the interpreter plus typer (which
checks values with pydantic) and rich; `db current` pays for the API and the store's drivers.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _posbias(*args: str) -> list[str]:
    return [sys.executable, "-m", "posbias.cli", *args]


CASES = {
    "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
    "posbias submit --bogus (usage error)": _posbias("submit", "--bogus"),
    "posbias status --limit 0 (bad value)": _posbias("status", "--limit", "0"),
    "posbias status --limit x (not an integer)": _posbias("status", "--limit", "x"),
    "posbias curve --by nope (unknown choice)": _posbias("curve", "--by", "nope"),
    "posbias curve --help": _posbias("curve", "--help"),
    "posbias run --dry-run (pointer to submit)": _posbias("run", "--dry-run"),
    "posbias --help": _posbias("--help"),
    "posbias db current (reads the store)": _posbias("db", "current"),
    "posbias curve --job 1 (no such job)": _posbias("curve", "--job", "1"),
}


def _time(argv: list[str], *, folder: str) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=folder, capture_output=True, check=False, env={**os.environ, "COLUMNS": "100"})
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    _compile()
    print(f"load average before: {_load()}")
    with tempfile.TemporaryDirectory() as folder:
        print(f"{'command':<45} {'wall s (median)':>16} {'cpu s (median)':>15}   runs: {runs}")
        for name, argv in CASES.items():
            _time(argv, folder=folder)  # warm the file cache
            found = [_time(argv, folder=folder) for _ in range(runs)]
            wall = statistics.median(w for w, _ in found)
            cpu = statistics.median(c for _, c in found)
            print(f"{name:<45} {wall:>16.3f} {cpu:>15.3f}")
    print(f"load average after: {_load()}")


def _compile() -> None:
    """The package's modules compiled to bytecode first, as an installed posbias's are: where
    PYTHONDONTWRITEBYTECODE is set (this machine's sessions), each run would compile them from source."""
    import compileall
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    for folder in ("posbias", "schemas", "service", "workers", "migrations"):
        compileall.compile_dir(repo / folder, quiet=1)


def _load() -> str:
    """The 1, 5 and 15 minute load averages, and the CPUs they are out of."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} CPUs)"


if __name__ == "__main__":
    main()
