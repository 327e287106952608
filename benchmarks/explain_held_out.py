"""Explain's false causes in issue 41's held-out family, at thousands of jobs a setting: the job's rate of
naming a cause the truth does not hold, and each null cause's own p-values.

The held-out family (`benchmarks/coverage.py`, `HELD_OUT`): a step of 15 to 30 points at a sliding window and
nothing else, random answer order, filler at the end at 0 and a share of the window, N = 10 or 20, 200 (or 16
to 80) sampled sets. `coverage.py` runs each setting 200 times with every interval's coverage; at 200 jobs a
rate of 5% is known to +/-3 points, too coarse to tell 5% from 6%. This program runs the same simulated jobs
(the same `design_layout`, `truth_answers` and `explain_curve` as the coverage program) many more times and
keeps only what the tests decide, so a job costs a few hundredths of a second: the step's location interval is
drawn from 2 resamples here, which touches no test and no call (only that interval is resampled).

For each setting it prints the job-level criterion, "any false cause named (the job)" (position or slot
named, or a group without distance), with its Wilson 95% interval; each null cause's rate of being named
(after Holm's graph); and each null cause's raw (single) p-value tail, P(p < 0.01, 0.025, 0.05, 0.10), which
under a true null is the level itself, with a Kolmogorov-Smirnov test of uniformity; then the same pooled over
the settings.

    python benchmarks/explain_held_out.py --reps 1000              # every setting: about 5 minutes
    python benchmarks/explain_held_out.py --reps 100 --only 'w600*'
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

sys.path.insert(0, str(Path(__file__).resolve().parent))
import coverage as cov

from posbias.schemas import ModelInfo
from posbias.service.stats import explain

NULLS = ("position", "answer slot")
"""The causes the held-out truth does not hold (it steps with token distance only)."""
TAILS = (0.01, 0.025, 0.05, 0.10)

SETTINGS = {
    f"w{window}-f{ratio:g}-n{n}-j{round(100 * jump)}"
    + ("" if lengths == "mmlu" else f"-{lengths}")
    + ("" if sets == 200 else f"-s{sets}"): (window, ratio, n, jump, lengths, sets)
    for window, ratio, n, jump, lengths, sets in [
        (600, 0.8, 10, 0.3, "mmlu", 200),
        (300, 0.8, 10, 0.3, "mmlu", 200),
        (1000, 0.8, 10, 0.3, "mmlu", 200),
        (2000, 0.8, 10, 0.3, "mmlu", 200),
        (1000, 0.8, 20, 0.3, "mmlu", 200),
        (600, 0.8, 10, 0.15, "mmlu", 200),
        (600, 0.5, 10, 0.3, "mmlu", 200),
        (600, 1.5, 10, 0.3, "mmlu", 200),
        (2000, 0.8, 20, 0.2, "mmlu", 200),
        (4096, 0.8, 10, 0.3, "mmlu", 200),
        (1000, 0.8, 10, 0.3, "wide", 200),
        (1000, 0.8, 10, 0.3, "mmlu", 40),
        (600, 0.8, 10, 0.3, "mmlu", 16),
        (600, 0.8, 10, 0.3, "mmlu", 40),
        (1000, 0.8, 10, 0.3, "mmlu", 80),
        (2000, 0.8, 10, 0.2, "mmlu", 40),
    ]
}
"""coverage.py's `explain-held-*` settings: window, filler / window, N, step, question lengths, sampled sets
(each set at both filler lengths; diagnose's battery takes 16 at its least)."""


def job(
    window: int,
    ratio: float,
    n: int,
    jump: float,
    lengths: str,
    sets: int,
    *,
    rep: int,
    rng: np.random.Generator,
) -> dict[str, object]:
    """One simulated job of the setting, explained: each null cause's raw p, whether it was named, and
    whether the job named any false cause."""
    truth = cov.Truth(base=0.5, step=(window, -jump), distance=lambda d: np.full(np.shape(d), jump / 2))
    info = ModelInfo(name="sim", num_layers=4, sliding_window=window, sliding_window_layers=(0, 2))
    layout = cov.design_layout(
        n=n,
        iterations=sets,
        lengths=cov.LENGTHS[lengths](rng),
        rng=rng,
        order="random",
        filler=(0, round(ratio * window)),
    )
    data = cov.truth_answers(truth, layout, cov.World.draw(rng, prompts=sets), rng=rng)
    found = explain.explain_curve(data, model="sim", info=info, resamples=2, seed=rep)
    effects = {e.name: e for e in found.effects if e.status == "estimated"}
    row: dict[str, object] = {}
    for name in NULLS:
        effect = effects.get(name)
        separable = effect is not None and effect.separable and effect.p_single is not None
        row[f"{name} p"] = effect.p_single if separable and effect is not None else None
        row[f"{name} named"] = bool(effect is not None and effect.distinguishable)
    row["false"] = any(bool(row[f"{name} named"]) for name in NULLS) or any(
        c.moves_curve and not truth.causes & set(c.effects) for c in found.confounds
    )
    return row


def summary(label: str, rows: list[dict[str, object]]) -> list[str]:
    """The setting's (or the pool's) lines."""
    jobs = len(rows)
    false = sum(bool(r["false"]) for r in rows)
    low, high = proportion_confint(false, jobs, method="wilson")
    lines = [f"{label}: {jobs:,} jobs; any false cause named {false / jobs:.4f} [{low:.4f}-{high:.4f}]"]
    for name in NULLS:
        named = sum(bool(r[f"{name} named"]) for r in rows) / jobs
        ps = np.array([r[f"{name} p"] for r in rows if r[f"{name} p"] is not None], dtype=float)
        if not ps.size:
            lines.append(f"    {name:12} named {named:.4f}; never separable (judged in a group)")
            continue
        tails = " ".join(f"<{level:g} {np.mean(ps < level):.4f}" for level in TAILS)
        uniform = stats.kstest(ps, "uniform").pvalue
        over = f"raw p over {ps.size:,} separable jobs"
        lines.append(f"    {name:12} named {named:.4f}; {over}: {tails}; KS p {uniform:.3f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=1000, help="Jobs per setting (default 1,000).")
    parser.add_argument("--only", help="Comma-separated setting names or patterns (default: all).")
    parser.add_argument("--seed", type=int, default=1, help="Seed (coverage.py's table used 0).")
    args = parser.parse_args(argv)
    patterns = args.only.split(",") if args.only else ["*"]
    wanted = [name for name in SETTINGS if any(fnmatch.fnmatch(name, p) for p in patterns)]
    if not wanted:
        print(f"no setting matches; settings: {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    print(f"explain's held-out family: {args.reps} jobs a setting, seed {args.seed}")
    pooled: list[dict[str, object]] = []
    by_n: dict[int, list[dict[str, object]]] = defaultdict(list)
    by_sets: dict[int, list[dict[str, object]]] = defaultdict(list)
    for name in wanted:
        window, ratio, n, jump, lengths, sets = SETTINGS[name]
        keys = [args.seed, window, n, round(100 * ratio), round(100 * jump), len(lengths), sets]
        rng = np.random.default_rng(keys)
        started = time.perf_counter()
        rows = [job(window, ratio, n, jump, lengths, sets, rep=rep, rng=rng) for rep in range(args.reps)]
        print("\n".join(summary(name, rows)) + f"  ({time.perf_counter() - started:.0f} s)", flush=True)
        pooled += rows
        by_n[n] += rows
        by_sets[sets] += rows
    if len(wanted) > 1:
        for n, rows in sorted(by_n.items()):
            print("\n".join(summary(f"pooled, N = {n}", rows)))
        for sets, rows in sorted(by_sets.items()):
            print("\n".join(summary(f"pooled, {sets} sets", rows)))
        print("\n".join(summary("pooled", pooled)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
