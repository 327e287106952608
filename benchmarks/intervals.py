"""How few clusters the cluster bootstrap's intervals can stand, and the coverage of the debiased accuracy,
by simulation.

`clusters`: for each number of trials (clusters) C, simulate a curve and a matched comparison with the fake
engine's rule (`latent_correct`: question and prompt effects), and measure the coverage of the intervals a
user reads: the last-minus-first contrast, the paired difference at each position (pointwise) and its
simultaneous band. The smallest C from which every coverage's binomial interval reaches 93% is what
`service/stats/bootstrap.MIN_CLUSTERS` says; below it curves and comparisons carry a warning.

`debiased`: a model with an option prior at the first positions (the fake engine's `collapse`, whose
observed probabilities are its belief times the prior), options shuffled per trial; PriDe's debiased
accuracy (`service/stats/options.debiased_accuracy`) at each position against the truth (the accuracy of the
model's belief, which the prior hides), its interval's coverage and the estimate's bias.

`explain`: for each number of trials C, simulate jobs of the explain grid's designs with a known truth
(`benchmarks/coverage.py`: a line in position under a random order, a decay and a step under a filler sweep,
no effect), and measure what `posbias explain` would print: every interval's coverage, the share of intervals
outside what is possible (a change of more than 100 points over the range it summarizes) and the rate of false
causes. The smallest C from which coverage holds is `service/stats/explain.MIN_CLUSTERS`; below it explain
fits nothing and says how many trials it needs.

`shape`: the shape test's large-sample form (`service/stats/shape_test.py`, used past 50,000 answers with at
least 500 clusters) against its 999 permutations on the same data, and its false-positive rate with no
position effect (flat accuracy, question and prompt effects), for each number of trials C at N = 50: the
rate of p < 0.05 under no effect, the rate under an effect of 4 points first to last, and the largest
difference between the two p-values.

    python benchmarks/intervals.py shape --reps 200 --batch-size 50 --counts 400,1000,4000
    python benchmarks/intervals.py clusters --reps 200
    python benchmarks/intervals.py debiased --reps 200
    python benchmarks/intervals.py explain --reps 200 --counts 4,8,12,16,24,32

Prints one table per program: per setting and statistic, the coverage with its binomial 95% interval.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from posbias.schemas import FakeCollapse, FakeSpec, Interval, ModelInfo
from posbias.schemas.explanation import Effect
from posbias.service.stats import comparison, options, position_curve
from posbias.service.stats.intervals import wilson_interval
from posbias.service.stats.trial_data import TrialData
from posbias.workers.fake_engine import latent_correct, option_probs, with_prior

sys.path.insert(0, str(Path(__file__).resolve().parent))
import coverage  # benchmarks/coverage.py: the explain grid's designs and truths

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


EXPLAIN_TRUTHS = {
    "position, random order": ("position", "random"),
    "decay, filler sweep": ("decay", "sweep"),
    "step, filler sweep": ("step", "sweep"),
    "none, filler sweep": ("none", "sweep"),
}
"""The truths and designs of `explain`: each names one cause the design separates, or none."""


def _possible(effect: Effect, interval: Interval, *, stepped: bool) -> bool:
    """Whether `interval` stays within a change of 100 points over what it summarizes. Distance's is the
    smooth part's change over its span, which with a step in the fit may reach 200 (a curve within [0, 1]
    that jumps by up to 100 points at the window)."""
    scale, limit = 1.0, 1.0
    if effect.span is not None:  # per 1,000 tokens over the span
        scale = (effect.span[1] - effect.span[0]) / 1000.0
        limit = 2.0 if stepped else 1.0
    return all(v is None or abs(v) * scale <= limit + 1e-9 for v in (interval.low, interval.high))


def explain(reps: int, *, n: int, counts: list[int], seed: int) -> None:
    """Coverage, possibility and false causes of explain's printed figures against the number of trials."""
    from posbias.service.stats.explain import MIN_CLUSTERS, explain_curve

    print(f"explain: N = {n}, window 600 tokens, MMLU-like lengths, {reps} replications per count and truth")
    print(f"  (service/stats/explain.MIN_CLUSTERS is {MIN_CLUSTERS}; below it explain fits nothing)")
    info = ModelInfo(name="sim", num_layers=4, sliding_window=600, sliding_window_layers=(0, 2))
    for c in counts:
        started = time.perf_counter()
        covered = possible = intervals = false = judged = fitted = 0
        for label, (truth_name, design) in EXPLAIN_TRUTHS.items():
            truth = coverage.TRUTHS[truth_name]
            for rep in range(reps):
                rng = np.random.default_rng([seed, c, rep, len(label)])
                lengths = coverage.block_lengths(rng)
                layout = coverage.design_layout(
                    n=n, iterations=c, lengths=lengths, rng=rng, **coverage.DESIGNS[design]
                )
                world = coverage.World.draw(rng, prompts=c)
                data = coverage.truth_answers(truth, layout, world, rng=rng)
                found = explain_curve(data, model="sim", info=info, resamples=100, seed=rep, minimum=1)
                fitted += bool(found.effects)
                stepped = found.window is not None and found.window.jump is not None
                for effect in found.effects:
                    if effect.status != "estimated":
                        continue
                    if effect.name not in truth.causes:
                        false += effect.distinguishable
                        judged += 1
                    if effect.effect is None:  # not separable: no summary of its own
                        continue
                    true = truth.summaries(effect)
                    for part, interval in (("effect", effect.effect), ("bend", effect.bend)):
                        if interval is None or interval.low is None or interval.high is None:
                            continue
                        intervals += 1
                        covered += interval.low <= true[part] <= interval.high
                        possible += _possible(effect, interval, stepped=stepped)
                step = found.window
                if step is not None and step.tested and step.jump is not None and step.jump.low is not None:
                    jump = truth.step[1] if truth.step is not None else 0.0
                    intervals += 1
                    covered += step.jump.low <= jump <= (step.jump.high or 0.0)
                    possible += abs(step.jump.low) <= 1 and abs(step.jump.high or 0.0) <= 1
        _row(f"{c} trials", "every interval covers the truth", covered, intervals, "0.93-0.97")
        _row(f"{c} trials", "interval possible", possible, intervals, "1")
        _row(f"{c} trials", "false cause named", false, judged, "<= 0.05")
        print(f"  ({fitted} fits, {time.perf_counter() - started:.0f} s)")


def shape(reps: int, *, n: int, counts: list[int], seed: int) -> None:
    """The shape test's large-sample form against its permutations, and its false-positive rate."""
    from posbias.service.stats import shape_test

    print(f"shape: N = {n}, flat 40% or 38% -> 42%, effects q 0.3 p 0.15, {reps} replications")
    for c in counts:
        started = time.perf_counter()
        calls = {"no effect": 0, "4 points": 0}
        largest = 0.0
        for rep in range(reps):
            rng = np.random.default_rng([seed, c, rep])
            questions = np.array([rng.choice(POOL, size=n, replace=False) for _ in range(c)])
            difficulty = rng.standard_normal(POOL)[questions]
            prompts = rng.standard_normal(c)[:, None]
            for name, accuracy in (("no effect", np.full(n, 0.4)), ("4 points", np.linspace(0.38, 0.42, n))):
                data = _job(questions, difficulty, prompts, accuracy, rng)
                correct, parsed, _ = data.cluster_sums()
                large = shape_test.large_sample_p(correct, parsed)
                assert large is not None
                calls[name] += large < 0.05
                if rep < 20:  # the permutations are the slow part: compared on the first 20
                    old = shape_test.PERMUTE_UP_TO
                    shape_test.PERMUTE_UP_TO = 10**12  # permute, whatever the size
                    try:
                        permuted = shape_test.shape_test(data, permutations=999, seed=rep)
                    finally:
                        shape_test.PERMUTE_UP_TO = old
                    if permuted is not None:
                        largest = max(largest, abs(permuted - large))
        _row(f"{c} trials", "p < 0.05, no effect (false call)", calls["no effect"], reps, "<= 0.05")
        _row(f"{c} trials", "p < 0.05, 4 points (power)", calls["4 points"], reps, "high")
        print(
            f"  (largest |large-sample p - permutation p| over 20 x 2 jobs: {largest:.3f}; "
            f"{time.perf_counter() - started:.0f} s)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("program", choices=["clusters", "debiased", "explain", "shape"])
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
    elif args.program == "shape":
        shape(args.reps, n=args.batch_size, counts=[int(c) for c in args.counts.split(",")], seed=args.seed)
    elif args.program == "explain":
        explain(args.reps, n=args.batch_size, counts=[int(c) for c in args.counts.split(",")], seed=args.seed)
    else:
        debiased(args.reps, n=args.batch_size, trials=args.trials, seed=args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
