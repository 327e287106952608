"""How many replications a statistical test needs, and where its pass mark sits, so that it can tell a correct
estimator from a broken one (binomial arithmetic, scipy.stats.binom).

A test counts the replications that went wrong (an interval that missed its truth, identical things called
different, a true cause not named) and passes while the count is at most `most`. With R independent
replications the count is Binomial(R, rate); a correct estimator goes wrong at its nominal rate, a broken one
at a higher rate. `sizing` finds the smallest R and the cut-off for which a correct estimator passes with
probability at least `pass_correct` (0.99) and a broken one fails with probability at least `fail_broken`
(0.90). The two broken estimators the suite guards against:

- a 95% interval 30% too narrow: it covers when |Z| < 1.96 x 0.7, so it misses at `narrowed_miss()` = 0.170;
  against the nominal 0.05 that needs R = 81, pass while misses <= 9;
- a false-call rate twice the nominal 5% (10%): R = 346, pass while false calls <= 27.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import binom, norm

PASS_CORRECT = 0.99
"""The least chance that a correct estimator passes."""
FAIL_BROKEN = 0.90
"""The least chance that a broken one fails."""


@dataclass(frozen=True)
class Sizing:
    """A binomial test: out of `replications`, pass while at most `most` went wrong."""

    replications: int
    most: int
    correct: float
    """The rate at which a correct estimator goes wrong (nominal)."""
    broken: float
    """The rate at which the broken one goes wrong."""

    @property
    def pass_correct(self) -> float:
        """P(pass | correct): P(Binomial(R, correct) <= most)."""
        return float(binom.cdf(self.most, self.replications, self.correct))

    @property
    def fail_broken(self) -> float:
        """P(fail | broken): P(Binomial(R, broken) > most)."""
        return float(binom.sf(self.most, self.replications, self.broken))

    def passes(self, wrong: int) -> bool:
        return wrong <= self.most

    def describe(self, wrong: int) -> str:
        return (
            f"{wrong} of {self.replications} went wrong (pass mark <= {self.most}: a correct estimator, "
            f"wrong at {self.correct:.3f}, passes with probability {self.pass_correct:.3f}; one wrong at "
            f"{self.broken:.3f} fails with probability {self.fail_broken:.3f})"
        )


def narrowed_miss(*, level: float = 0.95, narrower: float = 0.3) -> float:
    """The miss rate of a normal `level` interval whose half-width is `narrower` too small."""
    z = float(norm.isf((1 - level) / 2))
    return float(2 * norm.sf(z * (1 - narrower)))


def cutoff(replications: int, correct: float, *, pass_correct: float = PASS_CORRECT) -> int:
    """The smallest `most` with P(Binomial(replications, correct) <= most) >= pass_correct."""
    most = max(0, int(binom.ppf(pass_correct, replications, correct)))
    while binom.cdf(most, replications, correct) < pass_correct:  # ppf's floating-point edge
        most += 1
    while most > 0 and binom.cdf(most - 1, replications, correct) >= pass_correct:
        most -= 1
    return most


def sizing(
    correct: float,
    broken: float,
    *,
    pass_correct: float = PASS_CORRECT,
    fail_broken: float = FAIL_BROKEN,
    at_most: int = 10_000,
) -> Sizing:
    """The smallest R (and its cut-off) at which a correct estimator passes with probability >= `pass_correct`
    and a broken one fails with probability >= `fail_broken`. At each R the cut-off is the lowest that keeps
    the correct one's chance; a higher one would only help the broken one pass, so no other R below is
    missed (the conditions are not monotone in R: each is checked in turn)."""
    if not 0 <= correct < broken <= 1:
        raise ValueError(
            f"need 0 <= correct < broken <= 1, got correct={correct}, broken={broken}: "
            "give the rates at which each goes wrong"
        )
    for replications in range(1, at_most + 1):
        found = Sizing(
            replications, cutoff(replications, correct, pass_correct=pass_correct), correct, broken
        )
        if found.fail_broken >= fail_broken:
            return found
    raise ValueError(f"no R up to {at_most} separates {correct} from {broken}: raise at_most")


def at(replications: int, correct: float, broken: float, *, pass_correct: float = PASS_CORRECT) -> Sizing:
    """The test at a given R (replications run for another count already): the cut-off that keeps a correct
    estimator's chance of passing at `pass_correct`."""
    return Sizing(replications, cutoff(replications, correct, pass_correct=pass_correct), correct, broken)


NARROW = sizing(0.05, narrowed_miss())
"""A 95% interval against one 30% too narrow: R = 81, pass while misses <= 9."""
DOUBLED = sizing(0.05, 0.10)
"""A 5% false-call rate against 10%: R = 346, pass while false calls <= 27."""
