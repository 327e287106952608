"""How few clusters the cluster bootstrap's intervals can stand, and the coverage of the debiased accuracy,
by simulation.

`clusters`: for each number of trials (clusters) C, simulate a curve and a matched comparison with the fake
engine's rule (`latent_correct`: question and prompt effects), and measure the coverage of the intervals a
user reads: the last-minus-first contrast, the paired difference at each position (pointwise) and its
simultaneous band. The smallest C from which every coverage's binomial interval reaches 93% is what
`service/bootstrap.MIN_CLUSTERS` says; below it curves and comparisons carry a warning.

`debiased`: a model with an option prior at the first positions (the fake engine's `collapse`, whose
observed probabilities are its belief times the prior), options shuffled per trial; PriDe's debiased
accuracy (`service/options.debiased_accuracy`) at each position against the truth (the accuracy of the
model's belief, which the prior hides), its interval's coverage and the estimate's bias.

    python benchmarks/intervals.py clusters --reps 200
    python benchmarks/intervals.py debiased --reps 200

Prints one table per program: per setting and statistic, the coverage with its binomial 95% interval.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from posbias.schemas import FakeCollapse, FakeSpec
from posbias.service import comparison, options, position_curve
from posbias.service.intervals import wilson_interval
from posbias.service.trial_data import TrialData
from posbias.workers.fake_engine import latent_correct, option_probs, with_prior

POOL = 2000
SPEC = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.15)
RESAMPLES = 1000


def _row(name: str, what: str, hits: float, reps: int, target: str) -> None:
    interval = wilson_interval(hits, reps)
    print(f"{name:<28} {what:<36} {hits / reps:>6.3f}  {interval.low:.3f}-{interval.high:.3f}  {target}")


def _job(
    questions: np.ndarray,
    difficulty: np.ndarray,
    prompts: np.ndarray,
    accuracy: np.ndarray,
    rng: np.random.Generator,
) -> TrialData:
    correct = latent_correct(
        np.broadcast_to(accuracy, questions.shape),
        question=difficulty,
        prompt=prompts,
        noise=rng.standard_normal(questions.shape),
        question_effect=SPEC.question_effect,
        prompt_effect=SPEC.prompt_effect,
    )
    return TrialData.from_arrays(correct, questions=questions, keys=[tuple(map(str, r)) for r in questions])


def clusters(reps: int, *, n: int, counts: list[int], seed: int) -> None:
    """Coverage of the contrast, the paired difference and its band against the number of clusters."""
    truth = np.array([SPEC.accuracy(p, n) for p in range(1, n + 1)])
    other = np.clip(truth - 0.05, 0, 1)
    print(
        f"clusters: N = {n}, {SPEC.first:.0%} -> {SPEC.last:.0%}, effects q 0.3 p 0.15, {reps} replications"
    )
    for c in counts:
        started = time.perf_counter()
        hits = {"contrast": 0, "difference, pointwise": 0.0, "difference, band": 0}
        for rep in range(reps):
            rng = np.random.default_rng([seed, c, rep])
            questions = np.array([rng.choice(POOL, size=n, replace=False) for _ in range(c)])
            difficulty = rng.standard_normal(POOL)[questions]
            prompts = rng.standard_normal(c)[:, None]
            a = _job(questions, difficulty, prompts, truth, rng)
            b = _job(questions, difficulty, prompts, other, rng)
            curve = position_curve.build_curve(a, model="sim", resamples=RESAMPLES, permutations=1, seed=rep)
            k = curve.contrast
            hits["contrast"] += bool(
                k is not None and k.low is not None and k.low <= truth[-1] - truth[0] <= k.high
            )
            found = comparison.compare(a, b, labels=("a", "b"), resamples=RESAMPLES, seed=rep)
            d = other - truth
            inside = [
                p.ci_low is not None and p.ci_low <= d[p.position - 1] <= p.ci_high for p in found.points
            ]
            hits["difference, pointwise"] += float(np.mean(inside))
            hits["difference, band"] += all(
                p.band_low is not None and p.band_low <= d[p.position - 1] <= p.band_high
                for p in found.points
            )
        for what, h in hits.items():
            _row(f"{c} clusters", what, h, reps, "0.93-0.97")
        print(f"  ({time.perf_counter() - started:.0f} s)")


def debiased(reps: int, *, n: int, trials: int, seed: int) -> None:
    """Coverage and bias of the debiased accuracy under a known option prior at positions 1 to n/2."""
    accuracy = 0.6
    collapse = FakeCollapse(option=4, positions=(1, n // 2), prior=0.9)
    k = 4
    print(
        f"debiased: N = {n}, {trials} trials, options shuffled, prior {collapse.prior} on option 4 at "
        f"positions {collapse.positions[0]}-{collapse.positions[1]}, belief accuracy {accuracy}, "
        f"{reps} replications"
    )
    started = time.perf_counter()
    covered = {"collapsed positions": [0.0, 0.0], "other positions": [0.0, 0.0]}
    estimates = {name: [] for name in covered}
    for rep in range(reps):
        rng = np.random.default_rng([seed, rep])
        gold = rng.integers(0, k, size=(trials, n))
        questions = np.array([rng.choice(POOL, size=n, replace=False) for _ in range(trials)])
        right = latent_correct(
            np.full((trials, n), accuracy),
            question=rng.standard_normal(POOL)[questions],
            prompt=rng.standard_normal(trials)[:, None],
            noise=rng.standard_normal((trials, n)),
            question_effect=SPEC.question_effect,
            prompt_effect=SPEC.prompt_effect,
        )
        wrong = (gold + rng.integers(1, k, size=(trials, n))) % k
        intended = np.where(right, gold, wrong)
        probs = np.empty((trials, n, k))
        for t in range(trials):
            for j in range(n):
                p = option_probs(k, chosen=int(intended[t, j]), gold=int(gold[t, j]), accuracy=accuracy)
                probs[t, j] = with_prior(p, collapse.weights(k)) if collapse.applies(j + 1) else p
        data = options.OptionData(
            batch_size=n,
            gold=gold,
            predicted=probs.argmax(axis=2),
            probs=probs,
            shuffled=np.ones(trials, dtype=bool),
            cluster=np.arange(trials),
        )
        view = options.view(data, model="sim", seed=rep)
        for point in view.points:
            name = "collapsed positions" if collapse.applies(point.position) else "other positions"
            d = point.debiased_accuracy
            assert d is not None and d.low is not None and d.high is not None and d.estimate is not None
            covered[name][0] += d.low <= accuracy <= d.high
            covered[name][1] += 1
            estimates[name].append(d.estimate)
    for name, (h, m) in covered.items():
        _row(name, "debiased accuracy covers the truth", h, int(m), "0.93-0.97")
        print(f"{'':<28} mean estimate {np.mean(estimates[name]):.3f} (truth {accuracy})")
    print(f"  ({time.perf_counter() - started:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("program", choices=["clusters", "debiased"])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--counts", default="4,8,12,16,20,30,50", help="clusters: trial counts to try.")
    parser.add_argument("--trials", type=int, default=100, help="debiased: trials per job.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"{'setting':<28} {'statistic':<36} {'rate':>6}  95% CI       target")
    if args.program == "clusters":
        clusters(
            args.reps, n=args.batch_size, counts=[int(c) for c in args.counts.split(",")], seed=args.seed
        )
    else:
        debiased(args.reps, n=args.batch_size, trials=args.trials, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
