"""How long the `posbias` command takes to say a usage error, side by side with a bare Python start and
with a command that reads the store (the heavy imports): median wall and CPU seconds of a few runs each.

    python benchmarks/cli_startup.py [--runs 7]

A usage error is parsed before the API, the store's drivers and numpy-heavy analysis are imported
(`posbias/cli/common.py`'s `SettingsLoader`), so it costs about the interpreter plus typer and the schemas.
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

CASES = {
    "python -c pass (the interpreter alone)": [sys.executable, "-c", "pass"],
    "posbias submit --bogus (usage error)": [sys.executable, "-m", "posbias.cli", "submit", "--bogus"],
    "posbias status --limit 0 (bad value)": [sys.executable, "-m", "posbias.cli", "status", "--limit", "0"],
    "posbias run --dry-run (pointer to submit)": [sys.executable, "-m", "posbias.cli", "run", "--dry-run"],
    "posbias --help": [sys.executable, "-m", "posbias.cli", "--help"],
    "posbias db current (reads the store)": [sys.executable, "-m", "posbias.cli", "db", "current"],
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
    with tempfile.TemporaryDirectory() as folder:
        print(f"{'command':<45} {'wall s (median)':>16} {'cpu s (median)':>15}   runs: {runs}")
        for name, argv in CASES.items():
            _time(argv, folder=folder)  # warm the file cache
            found = [_time(argv, folder=folder) for _ in range(runs)]
            wall = statistics.median(w for w, _ in found)
            cpu = statistics.median(c for _, c in found)
            print(f"{name:<45} {wall:>16.3f} {cpu:>15.3f}")


if __name__ == "__main__":
    main()
