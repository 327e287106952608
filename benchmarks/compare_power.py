"""Power and false-alarm rate of `posbias compare`, by simulation.

Two checkpoints of one model answer the same trials (matched, as a schedule's do): question difficulty and
prompt effects shared, each its own noise (`posbias.workers.fake_engine.latent_correct`, the fake engine's
rule). The candidate is the baseline with a drop of `--drop` points at positions 1 to `--width`, optionally
with its answers at the end of the sheet no longer parsing. Each replication runs
`service/stats/comparison.compare`, what the command runs, and counts:

- any marked different: a position or block marked, either direction (the false-alarm rate, with no change);
- caught (family): a position or a block of positions marked different with B below A (what `compare`
  marks now: positions and blocks in one max-|t| family, the schedule verdict's);
- caught (positions only): a position marked different by the max-|t| band over positions alone (what
  `compare` marked before blocks joined the family);
- McNemar (pointwise, p < 0.05 anywhere), McNemar (Holm), for reference;
- parse collapse shown: the parse-rate family marks a drop.

    python benchmarks/compare_power.py                    # 200 replications of each setting
    python benchmarks/compare_power.py --reps 100 --iterations 100

Prints one table: per setting, each rate with its binomial 95% interval (Wilson).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import numpy as np

from posbias.schemas import FakeSpec
from posbias.service.stats import comparison
from posbias.service.stats.bootstrap import max_t_band
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


def simulate(
    setting: Setting, *, n: int, iterations: int, rng: np.random.Generator
) -> tuple[TrialData, TrialData]:
    """The baseline's and the candidate's answers on the same trials."""
    questions = np.array([rng.choice(POOL, size=n, replace=False) for _ in range(iterations)])
    difficulty = rng.standard_normal(POOL)[questions]
    prompts = rng.standard_normal(iterations)[:, None]
    truth = np.array([BASE.accuracy(p, n) for p in range(1, n + 1)])
    lowered = truth.copy()
    lowered[: setting.width] -= setting.drop
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


def rates(setting: Setting, *, n: int, iterations: int, reps: int, seed: int) -> dict[str, int]:
    """How often each thing happened over `reps` replications."""
    counts = {
        "any marked different": 0,
        "caught (family)": 0,
        "caught (positions only)": 0,
        "McNemar pointwise": 0,
        "McNemar Holm": 0,
    }
    counts["parse drop shown"] = 0
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep])
        a, b = simulate(setting, n=n, iterations=iterations, rng=rng)
        found = comparison.compare(a, b, labels=("baseline", "candidate"), seed=rep)
        members = [*found.points, *found.blocks]
        counts["any marked different"] += any(m.different for m in members)
        counts["caught (family)"] += any(m.different and (m.diff or 0) < 0 for m in members)
        matching, ra, rb = comparison.resample_pair(a, b, seed=rep)
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
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200, help="Replications per setting (default 200).")
    parser.add_argument("--batch-size", type=int, default=50, help="N (default 50).")
    parser.add_argument("--iterations", type=int, default=100, help="Trials per job (default 100).")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    settings = [
        Setting("no change", drop=0.0, width=0),
        Setting("10-point drop at positions 1-10", drop=0.10, width=10),
        Setting("parse collapse 100% -> 9% at the last fifth", drop=0.0, width=0, parse_collapse=True),
    ]
    print(
        f"posbias compare: N = {args.batch_size}, {args.iterations} matched trials, {args.reps} "
        f"replications per setting (seed {args.seed})"
    )
    print(f"{'setting':<46} {'rate':<26} {'share':>6}  95% interval")
    for setting in settings:
        started = time.perf_counter()
        counts = rates(setting, n=args.batch_size, iterations=args.iterations, reps=args.reps, seed=args.seed)
        for what, k in counts.items():
            interval = wilson_interval(k, args.reps)
            print(
                f"{setting.name:<46} {what:<26} {k / args.reps:>6.2f}  {interval.low:.2f}-{interval.high:.2f}"
            )
        print(f"  ({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
