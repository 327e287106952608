"""`posbias trial` (and with `--report`, `posbias report`) on a real model's job, the working tree against
the code of another commit, side by side in one run: median wall seconds and peak memory (GNU time's %M of
the command) of each, and their ratio.

    scripts/demo.sh                                     # a demo-model job in ./posbias.db, if none is there
    python benchmarks/trial_real.py --at cad66d1        # job 1's first trial, 5 runs each, alternating
    python benchmarks/trial_real.py --at cad66d1 --report --runs 3
    python benchmarks/trial_real.py --at cad66d1 --url sqlite:///other.db --job 3 --trial 17 --runs 9

A real model's trial, and each trial page of its report, rebuilds its prompt with the model's tokenizer.
Until 6c6cda5 that was transformers' own (its import imports torch); since, the folder's `tokenizer.json`
and chat template are read without it (`workers/light_tokenizer.py`). The fake engine's jobs, which
`benchmarks/views.py` measures at a million results, render with the fake engine's tokenizer and show
neither. The code of `--at` is laid out by `views.code_at` (a `git archive` of the package folders, first on
PYTHONPATH); both versions are compiled to bytecode first, as an installed package is, and run from a
scratch folder.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from views import CODE_FOLDERS, REPO, code_at


def _run(argv: list[str], *, env: dict[str, str], cwd: str) -> tuple[float, str]:
    """One run: wall seconds, and what it printed first (to check both versions show the same thing)."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, cwd=cwd)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[3:])} failed: {done.stderr.strip().splitlines()[-1:]}")
    return wall, done.stdout.splitlines()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--at", required=True, help="The commit to compare the working tree with.")
    parser.add_argument("--url", default=f"sqlite:///{REPO / 'posbias.db'}", help="The store (the demo's).")
    parser.add_argument("--job", type=int, default=1)
    parser.add_argument("--trial", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--report", action="store_true", help="Also `posbias report JOB` (a page of trials).")
    args = parser.parse_args()
    old, commit = code_at(args.at)
    for folder in [old, *(REPO / name for name in CODE_FOLDERS)]:
        compileall.compile_dir(str(folder), quiet=1)
    # Run from a scratch folder: the working folder comes first on sys.path, and the repository's holds the
    # working tree's package.
    scratch = tempfile.mkdtemp(prefix="trial-real-")
    base = {**os.environ, "POSBIAS_DATABASE_URL": args.url, "COLUMNS": "100"}
    versions = {
        f"commit {commit[:10]}": {**base, "PYTHONPATH": str(old)},
        "working tree": {k: v for k, v in base.items() if k != "PYTHONPATH"},
    }
    shown = [sys.executable, "-m", "posbias.cli", "trial", str(args.job), str(args.trial), "--no-marks"]
    print(f"job {args.job} on {args.url}, {args.runs} runs each, alternating; load {os.getloadavg()[0]:.2f}")
    _side_by_side(
        f"posbias trial {args.job} {args.trial}", shown, versions=versions, runs=args.runs, cwd=scratch
    )
    if args.report:
        page = [sys.executable, "-m", "posbias.cli", "report", str(args.job), "--out", "page.html", "--force"]
        _side_by_side(f"posbias report {args.job}", page, versions=versions, runs=args.runs, cwd=scratch)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


def _side_by_side(
    label: str, argv: list[str], *, versions: dict[str, dict[str, str]], runs: int, cwd: str
) -> None:
    """`argv` run by each version in turn, `runs` times; their medians, peaks and ratios."""
    walls: dict[str, list[float]] = {name: [] for name in versions}
    heads: dict[str, str] = {}
    for _ in range(runs):
        for name, env in versions.items():
            wall, head = _run(argv, env=env, cwd=cwd)
            walls[name].append(wall)
            heads[name] = head
    if len(set(heads.values())) != 1:
        raise SystemExit(f"the two versions print different things: {heads}")
    peaks = {}
    for name, env in versions.items():  # peak memory: GNU time's figure for one more run of each
        timed = subprocess.run(
            ["/usr/bin/time", "-f", "%M", *argv], capture_output=True, text=True, env=env, cwd=cwd
        )
        peaks[name] = int(timed.stderr.strip().splitlines()[-1]) / 1024
    print(label)
    for name in versions:
        print(
            f"  {name:<20} median {statistics.median(walls[name]):6.2f} s "
            f"(runs {min(walls[name]):.2f}-{max(walls[name]):.2f}), peak {peaks[name]:6.0f} MB"
        )
    first, second = (statistics.median(w) for w in walls.values())
    a, b = peaks.values()
    print(f"  working tree / commit: time {second / first:.2f}, peak memory {b / a:.2f}")


if __name__ == "__main__":
    main()
