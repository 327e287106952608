"""Power and false-alarm rate of `posbias compare`, by simulation.

Two checkpoints of one model answer the same trials (matched, as a schedule's do): question difficulty and
prompt effects shared, each its own noise (`posbias.workers.fake_engine.latent_correct`, the fake engine's
rule). The candidate is the baseline with a drop of `--drop` points at positions 1 to `--width`, optionally
with its answers at the end of the sheet no longer parsing. Each replication runs
`service/stats/comparison.compare`, what the command runs, and counts:

- any marked different: a position or block marked, either direction (the false-alarm rate, with no change);
- caught (family): a position or a block of positions marked different with B below A (what `compare`
  marks now: positions and blocks of each width at every start in one max-|t| family, the schedule
  verdict's);
- located at the drop: `compare`'s best fit (`Comparison.located`) has each end within one position of the
  drop's (at N = 16, a drop at positions 5-8 is located at 5-7 or 6-8: no block of width 4 is tested);
- the same three for the family before issue 41, each width's blocks tiling the prompt without overlap
  (`tiling`), its band and best fit computed side by side on the same resamples;
- caught (positions only): a position marked different by the max-|t| band over positions alone (what
  `compare` marked before blocks joined the family);
- McNemar (pointwise, p < 0.05 anywhere), McNemar (Holm), for reference;
- parse collapse shown: the parse-rate family marks a drop.

Each setting also prints the mean critical value of the two families' bands (max-|t| over more members is
wider).

    python benchmarks/compare_power.py                    # 200 replications of each setting
    python benchmarks/compare_power.py --reps 100 --iterations 100
    python benchmarks/compare_power.py --reps 100 --only 'no change,*5-8*'

Prints one table: per setting, each rate with its binomial 95% interval (Wilson).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import time
from dataclasses import dataclass

import numpy as np

from posbias.schemas import FakeSpec
from posbias.service.stats import comparison
from posbias.service.stats.bootstrap import Resampled, diff_band, max_t_band
from posbias.service.stats.intervals import wilson_interval
from posbias.service.stats.trial_data import TrialData
from posbias.workers.fake_engine import latent_correct

POOL = 2000
"""Questions sampled from (as in benchmarks/coverage.py)."""
BASE = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.1)
"""The baseline checkpoint: gemma-2-2b-it's shape at N = 50 (near chance first, about twice that last)."""


@dataclass(frozen=True)
class Setting:
    name: str
    drop: float
    width: int
    parse_collapse: bool = False
    first: int = 1
    """1-based first position of the drop."""
    batch_size: int | None = None
    """N, when not the program's `--batch-size`."""


def tiling(n: int) -> list[tuple[int, int]]:
    """The family before issue 41: each position, then each width's blocks without overlap."""
    family = [(p, p + 1) for p in range(n)]
    for fraction in comparison.BLOCK_FRACTIONS:
        width = max(2, round(n * fraction))
        family += [(s, s + width) for s in range(0, n - width + 1, width) if (s, s + width) not in family]
    return family


@dataclass(frozen=True)
class Found:
    """A family's band read off one comparison's resamples."""

    marked: list[tuple[int, int, float]]
    """(first, last, difference) of each member marked different."""
    located: tuple[int, int] | None
    critical: float


def family_band(family: list[tuple[int, int]], ra: Resampled, rb: Resampled, *, df: int) -> Found:
    """`compare`'s accuracy band and best fit over `family`: positions, and the blocks whose every position
    has `MIN_ANSWERS` parsed answers on both sides, as `compare` keeps them."""
    parsed = np.minimum(ra.parsed[0], rb.parsed[0])
    members = [
        range(a, b) for a, b in family if b - a == 1 or bool(np.all(parsed[a:b] >= comparison.MIN_ANSWERS))
    ]
    acc_a, acc_b = ra.accuracy(members), rb.accuracy(members)
    band = diff_band(acc_a, acc_b, counts=(ra.counts(members)[0], rb.counts(members)[0]), df=df)
    diff = acc_b - acc_a
    marked = (band.low > 0) | (band.high < 0)
    k = comparison.best_fit(diff, members, list(marked), se=band.se, df=df)
    return Found(
        marked=[(m.start + 1, m.stop, float(diff[0, i])) for i, m in enumerate(members) if marked[i]],
        located=None if k is None else (members[k].start + 1, members[k].stop),
        critical=band.critical,
    )


def at_the_drop(where: tuple[int, int] | None, setting: Setting, n: int) -> bool:
    """Each end within one position of the drop's."""
    last = min(n, setting.first + setting.width - 1)
    return where is not None and abs(where[0] - setting.first) <= 1 and abs(where[1] - last) <= 1


def simulate(
    setting: Setting, *, n: int, iterations: int, rng: np.random.Generator
) -> tuple[TrialData, TrialData]:
    """The baseline's and the candidate's answers on the same trials."""
    questions = np.array([rng.choice(POOL, size=n, replace=False) for _ in range(iterations)])
    difficulty = rng.standard_normal(POOL)[questions]
    prompts = rng.standard_normal(iterations)[:, None]
    truth = np.array([BASE.accuracy(p, n) for p in range(1, n + 1)])
    lowered = truth.copy()
    lowered[setting.first - 1 : setting.first - 1 + setting.width] -= setting.drop
    keys = [tuple(map(str, row)) for row in questions]

    def job(accuracy: np.ndarray, parsed: np.ndarray | None) -> TrialData:
        correct = latent_correct(
            np.broadcast_to(accuracy, questions.shape),
            question=difficulty,
            prompt=prompts,
            noise=rng.standard_normal(questions.shape),
            question_effect=BASE.question_effect,
            prompt_effect=BASE.prompt_effect,
        )
        return TrialData.from_arrays(correct, parsed=parsed, questions=questions, keys=keys)

    parsed = None
    if setting.parse_collapse:
        parsed = np.ones(questions.shape)
        tail = max(1, n // 5)
        parsed[:, n - tail :] = rng.random((iterations, tail)) < 0.09
    return job(truth, None), job(lowered, parsed)


def rates(
    setting: Setting, *, n: int, iterations: int, reps: int, seed: int
) -> tuple[dict[str, int], dict[str, float]]:
    """How often each thing happened over `reps` replications, and the families' mean critical values."""
    counts = {
        "any marked different": 0,
        "any marked, tiling (before)": 0,
        "caught (family)": 0,
        "caught (tiling, before)": 0,
    }
    if setting.width:
        counts["located at the drop"] = 0
        counts["located, tiling (before)"] = 0
    counts |= {"caught (positions only)": 0, "McNemar pointwise": 0, "McNemar Holm": 0, "parse drop shown": 0}
    critical = {"every start": 0.0, "tiling": 0.0}
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep])
        a, b = simulate(setting, n=n, iterations=iterations, rng=rng)
        found = comparison.compare(a, b, labels=("baseline", "candidate"), seed=rep)
        members = [*found.points, *found.blocks]
        counts["any marked different"] += any(m.different for m in members)
        counts["caught (family)"] += any(m.different and (m.diff or 0) < 0 for m in members)
        matching, ra, rb = comparison.resample_pair(a, b, seed=rep)
        now = family_band(comparison.blocks(n), ra, rb, df=matching.df)
        before = family_band(tiling(n), ra, rb, df=matching.df)
        critical["every start"] += now.critical / reps
        critical["tiling"] += before.critical / reps
        counts["any marked, tiling (before)"] += bool(before.marked)
        counts["caught (tiling, before)"] += any(d < 0 for _, _, d in before.marked)
        if setting.width:
            located = found.located
            where = None if located is None else (located.first_position, located.last_position)
            counts["located at the drop"] += at_the_drop(where, setting, n)
            counts["located, tiling (before)"] += at_the_drop(before.located, setting, n)
        diff = rb.accuracy() - ra.accuracy()
        alone = max_t_band(diff[0], diff[1:], df=matching.df, clip=(-1.0, 1.0))
        counts["caught (positions only)"] += bool(np.any(alone.high < 0))
        counts["McNemar pointwise"] += any(
            p.mcnemar_p is not None and p.mcnemar_p < 0.05 for p in found.points
        )
        counts["McNemar Holm"] += any(
            p.mcnemar_holm is not None and p.mcnemar_holm < 0.05 for p in found.points
        )
        counts["parse drop shown"] += any(d.different and (d.diff or 0) < 0 for d in found.parse)
    return counts, critical


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200, help="Replications per setting (default 200).")
    parser.add_argument("--batch-size", type=int, default=50, help="N (default 50).")
    parser.add_argument("--iterations", type=int, default=100, help="Trials per job (default 100).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", help="Comma-separated setting names or patterns (default: all).")
    args = parser.parse_args(argv)
    settings = [
        Setting("no change", drop=0.0, width=0),
        Setting("10-point drop at positions 1-10", drop=0.10, width=10),
        Setting("20-point drop at positions 5-8 of 16", drop=0.20, width=4, first=5, batch_size=16),
        Setting("uniform 8-point drop", drop=0.08, width=args.batch_size),
        Setting("parse collapse 100% -> 9% at the last fifth", drop=0.0, width=0, parse_collapse=True),
    ]
    if args.only:
        asked = args.only.split(",")
        settings = [s for s in settings if any(fnmatch.fnmatch(s.name, pattern) for pattern in asked)]
    print(
        f"posbias compare: N = {args.batch_size} unless named, {args.iterations} matched trials, {args.reps} "
        f"replications per setting (seed {args.seed})"
    )
    print(f"{'setting':<46} {'rate':<28} {'share':>6}  95% interval")
    for setting in settings:
        started = time.perf_counter()
        n = setting.batch_size or args.batch_size
        counts, critical = rates(setting, n=n, iterations=args.iterations, reps=args.reps, seed=args.seed)
        for what, k in counts.items():
            interval = wilson_interval(k, args.reps)
            print(
                f"{setting.name:<46} {what:<28} {k / args.reps:>6.2f}  {interval.low:.2f}-{interval.high:.2f}"
            )
        print(
            f"  (band's critical value, mean: every start {critical['every start']:.2f}, tiling "
            f"{critical['tiling']:.2f}; {time.perf_counter() - started:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
