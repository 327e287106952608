"""Coverage of every 95% interval posbias prints, and the error rates and power of its tests, by simulation.

Each replication simulates a job's answers with the fake engine's model of a model (`FakeSpec`: a known
accuracy curve; answers correlated through question difficulty and a prompt effect, decided by
`posbias.workers.fake_engine.latent_correct`, the fake engine's own rule), then runs the analysis functions
the CLI runs (`service/stats/position_curve.py`, `service/stats/comparison.py`,
`service/schedules/verdicts.py`, `service/stats/explain.py`) and checks them against the truth. The engine
itself (rendering, parsing) and the store are left out so that hundreds of replications run in minutes; the
integration tests check that the store feeds the analysis these same arrays. The `explain-*` settings plan
each design as the planner does and measure token distances as the worker does (`design_layout`). The
`auroc-*` settings check explain's attention AUROC (`service/stats/attention_explain.py`) against a truth
computed by quadrature (`within_auroc`), with a reference interval (clustered DeLong) on the same draws.

    python benchmarks/coverage.py                       # every setting, 500 replications each
    python benchmarks/coverage.py --reps 100 --only pointwise-effects,verdict-power
    python benchmarks/coverage.py --list

Prints one table: per setting and statistic, the coverage (or rate) with its binomial 95% interval and the
target. Figures and the command are in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri
from scipy.stats import t as student_t

from posbias.schemas import FakeAxis, FakeSpec, ModelInfo
from posbias.schemas.schedule import RegressionRule
from posbias.service.schedules import verdicts
from posbias.service.stats import attention_explain, comparison, position_curve
from posbias.service.stats.bootstrap import BOOTSTRAP_RESAMPLES, MIN_CLUSTERS
from posbias.service.stats.explain import explain_curve
from posbias.service.stats.intervals import wilson_interval
from posbias.service.stats.shape_test import PERMUTATIONS
from posbias.service.stats.trial_data import DistanceRow, TrialData
from posbias.workers.fake_engine import latent_correct

POOL = 2000
"""Questions to sample from (MMLU has 14,042; a smaller pool makes questions recur, as in long runs)."""
QUESTION_TOKENS = 90
"""Tokens per rendered MMLU question block, for the simulated token distances."""

Floats = npt.NDArray[np.float64]


# --- simulated jobs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which questions each trial shows (codes into the pool), and each trial's cluster."""

    questions: npt.NDArray[np.int64]
    clusters: npt.NDArray[np.int64]
    prompt_keys: npt.NDArray[np.int64]
    """Per trial, which prompt latent it has (rotations of one set share one)."""


def plan(*, n: int, iterations: int, rotation: bool, rng: np.random.Generator) -> Plan:
    """Random design: N distinct questions per trial. Rotation: N per set, shown at every rotation."""
    questions, clusters, keys = [], [], []
    for iteration in range(iterations):
        chosen = rng.choice(POOL, size=n, replace=False)
        for r in range(n if rotation else 1):
            questions.append(np.roll(chosen, -r))
            clusters.append(iteration)
            keys.append(iteration)
    return Plan(np.array(questions), np.array(clusters), np.array(keys))


@dataclass(frozen=True)
class World:
    """The latent parts two checkpoints of one model share: question difficulties, prompt effects."""

    questions: Floats
    prompts: Floats

    @classmethod
    def draw(cls, rng: np.random.Generator, *, prompts: int) -> World:
        return cls(questions=rng.standard_normal(POOL), prompts=rng.standard_normal(prompts))


def answers(
    spec: FakeSpec,
    layout: Plan,
    world: World,
    *,
    rng: np.random.Generator,
    accuracy: Floats | None = None,
    missing_after: int | None = None,
) -> TrialData:
    """One job's answers: correct by the fake's rule; failed parses at `spec.malformed` (at random) and,
    with `missing_after`, every position after it missing (a truncated answer sheet)."""
    trials, n = layout.questions.shape
    acc = accuracy if accuracy is not None else np.array([spec.accuracy(p, n) for p in range(1, n + 1)])
    correct = latent_correct(
        np.broadcast_to(acc, (trials, n)),
        question=world.questions[layout.questions],
        prompt=world.prompts[layout.prompt_keys][:, None],
        noise=rng.standard_normal((trials, n)),
        question_effect=spec.question_effect,
        prompt_effect=spec.prompt_effect,
    )
    parsed = rng.random((trials, n)) >= spec.malformed
    if missing_after is not None:
        parsed[:, missing_after:] = False
    return TrialData.from_arrays(
        correct.astype(np.float64),
        parsed=parsed.astype(np.float64),
        cluster=layout.clusters,
        questions=layout.questions,
        keys=[tuple(map(str, row)) for row in layout.questions],
    )


# --- simulated designs --------------------------------------------------------------------------------

SEPARATOR_TOKENS = 1
"""Tokens of the blank line between paragraphs."""
REQUEST_TOKENS = 15
"""Tokens of the answer request and the chat template's close, after the last paragraph."""
LINE_TOKENS = 4
"""Tokens of one answer line `k. i` and its newline: the answer of slot s is (s - 1) x 4 + 2 tokens in."""


@dataclass(frozen=True)
class DesignLayout:
    """A simulated job of some design: who sits where, what is asked on which line, and how far each
    question is from its answer in tokens, as the worker would record it."""

    questions: npt.NDArray[np.int64]
    """Trials x positions: question codes."""
    clusters: npt.NDArray[np.int64]
    prompt_keys: npt.NDArray[np.int64]
    answered: Floats
    """Trials x positions: 1 where an answer is asked (all, or a probe's one)."""
    slot: Floats
    """Trials x positions: the line it is asked on (NaN where not asked)."""
    lines: Floats
    distance: Floats
    """Trials x positions: tokens from the question's end to its answer."""
    filler: Floats
    """Per trial: its filler length."""


def design_layout(
    *,
    n: int,
    iterations: int,
    lengths: Floats,
    rng: np.random.Generator,
    order: str = "forward",
    filler: tuple[int, ...] = (0,),
    where: str = "end",
    after: int = 0,
    probe: bool = False,
) -> DesignLayout:
    """Plan like `service/work/planner.py` (each set at every filler length; a random order per set; a probe
    asks each position of a set in a prompt of its own) and measure distances like `workers/shard.py`, with
    question blocks of `lengths[code]` tokens."""
    questions, clusters, keys, answered, slots, lines, distances, fillers = [], [], [], [], [], [], [], []
    for iteration in range(iterations):
        chosen = rng.choice(POOL, size=n, replace=False)
        if order == "random":
            ways = [list(rng.permutation(n) + 1)]
        elif order == "reverse":
            ways = [list(range(n, 0, -1))]
        else:
            ways = [list(range(1, n + 1))]
        if probe:
            ways = [[position] for position in range(1, n + 1)]
        blocks = lengths[chosen] + SEPARATOR_TOKENS
        after_me = np.cumsum(blocks[::-1])[::-1] - blocks  # tokens of the blocks after each position
        for asked, length in itertools.product(ways, filler):
            slot = np.full(n, np.nan)
            for line, position in enumerate(asked, start=1):
                slot[position - 1] = line
            moved = np.zeros(n)
            if length and where == "end":
                moved[:] = length + SEPARATOR_TOKENS
            elif length and where == "after":
                moved[:after] = length + SEPARATOR_TOKENS
            distance = after_me + moved + REQUEST_TOKENS + (np.nan_to_num(slot) - 1) * LINE_TOKENS + 2
            questions.append(chosen)
            clusters.append(iteration)
            keys.append(iteration)
            answered.append(np.isfinite(slot).astype(np.float64))
            slots.append(slot)
            lines.append(float(len(asked)))
            distances.append(np.where(np.isfinite(slot), distance, np.nan))
            fillers.append(float(length))
    return DesignLayout(
        questions=np.array(questions),
        clusters=np.array(clusters),
        prompt_keys=np.array(keys),
        answered=np.array(answered),
        slot=np.array(slots),
        lines=np.array(lines),
        distance=np.array(distances),
        filler=np.array(fillers),
    )


def design_truth(spec: FakeSpec, layout: DesignLayout) -> Floats:
    """The fake's accuracy of every cell (NaN where nothing is asked): its marginal, by `depends_on`."""
    n = layout.questions.shape[1]
    position = np.broadcast_to(np.arange(1, n + 1, dtype=np.float64), layout.slot.shape)
    truth = np.empty(layout.slot.shape)
    for row in range(truth.shape[0]):
        truth[row] = spec.accuracy_of(
            position=position[row],
            batch_size=n,
            slot=np.nan_to_num(layout.slot[row], nan=1.0),
            answers=int(layout.lines[row]),
            distance=np.nan_to_num(layout.distance[row]),
        )
    return np.where(layout.answered > 0, truth, np.nan)


def design_answers(
    spec: FakeSpec, layout: DesignLayout, world: World, *, rng: np.random.Generator
) -> TrialData:
    """One job of the design answered by the fake's rule, as `queries.trial_data` would hand it over."""
    truth = design_truth(spec, layout)
    return _design_answers(
        np.nan_to_num(truth, nan=0.5),
        layout,
        world,
        rng=rng,
        question_effect=spec.question_effect,
        prompt_effect=spec.prompt_effect,
    )


def block_lengths(rng: np.random.Generator) -> Floats:
    """Tokens of each pool question's block: about MMLU's, QUESTION_TOKENS on average, some much longer."""
    return np.round(rng.lognormal(np.log(QUESTION_TOKENS) - 0.125, 0.5, POOL))


# --- tallies ------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Hits out of trials for one statistic of one setting."""

    target: str
    hits: float = 0.0
    trials: int = 0

    def add(self, hit: float) -> None:
        self.hits += hit
        self.trials += 1

    def rate(self) -> float:
        return self.hits / self.trials if self.trials else math.nan

    def interval(self) -> tuple[float, float]:
        w = wilson_interval(self.hits, self.trials)
        return (w.low or 0.0, w.high or 0.0)


Body = Callable[[int, np.random.Generator, dict[str, Tally]], None]
"""One replication of a setting: simulate with the generator, add what it checked to the tallies."""


@dataclass
class Setting:
    """One simulated situation and what it checks."""

    name: str
    about: str
    run: Body
    tallies: dict[str, Tally] = field(default_factory=dict)


def inside(low: float | None, value: float, high: float | None) -> bool:
    return low is not None and high is not None and low - 1e-12 <= value <= high + 1e-12


def curve_checks(
    spec: FakeSpec,
    *,
    n: int,
    iterations: int,
    rotation: bool = False,
    missing_after: int | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    permutations: int = PERMUTATIONS,
) -> Body:
    """A setting's body: simulate a curve and check its pointwise intervals, band, contrast, slope."""

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        layout = plan(n=n, iterations=iterations, rotation=rotation, rng=rng)
        world = World.draw(rng, prompts=iterations)
        data = answers(spec, layout, world, rng=rng, missing_after=missing_after)
        curve = position_curve.build_curve(
            data, model="sim", seed=rep, resamples=resamples, permutations=permutations
        )
        truth = np.array([spec.accuracy(p, n) for p in range(1, n + 1)])
        pts = [p for p in curve.points if p.accuracy is not None]
        t.setdefault("pointwise", Tally("0.93-0.97")).add(
            float(np.mean([inside(p.ci_low, truth[p.position - 1], p.ci_high) for p in pts]))
        )
        t.setdefault("band", Tally("0.93-0.97")).add(
            all(inside(p.band_low, truth[p.position - 1], p.band_high) for p in pts)
        )
        last = pts[-1].position
        if curve.contrast is not None:
            t.setdefault("contrast", Tally("0.93-0.97")).add(
                inside(curve.contrast.low, truth[last - 1] - truth[0], curve.contrast.high)
            )
        if curve.slope is not None:
            positions = np.array([p.position for p in pts], dtype=np.float64)
            slope = float(np.polyfit(positions, truth[positions.astype(int) - 1], 1)[0])
            t.setdefault("slope", Tally("0.93-0.97")).add(inside(curve.slope.low, slope, curve.slope.high))
        if curve.first_last_ratio is not None:
            t.setdefault("ratio", Tally("0.93-0.97")).add(
                inside(curve.first_last_ratio.low, truth[last - 1] / truth[0], curve.first_last_ratio.high)
            )
        if curve.shape_p is not None:
            flat = float(np.ptp(truth)) == 0.0
            name = "shape test: false positives" if flat else "shape test: power"
            t.setdefault(name, Tally("<= 0.05" if flat else "high")).add(curve.shape_p < 0.05)

    return run


def distance_checks(spec: FakeSpec, *, n: int, iterations: int, bin_width: int = 512) -> Body:
    """Token-distance bins: several answers of one prompt per bin, intervals clustered by trial."""

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        layout = plan(n=n, iterations=iterations, rotation=False, rng=rng)
        data = answers(spec, layout, World.draw(rng, prompts=iterations), rng=rng)
        distance = [(n - p) * QUESTION_TOKENS + 4 * p for p in range(1, n + 1)]
        rows = [
            DistanceRow(trial, n, distance[c], bool(data.parsed[trial, c]), bool(data.correct[trial, c]))
            for trial in range(data.trials)
            for c in range(n)
        ]
        curve = position_curve.distance_curve(
            rows, bin_width=bin_width, clusters={}, model="sim", revision=None, job_ids=[], batch_size=n
        )
        truth = np.array([spec.accuracy(p, n) for p in range(1, n + 1)])
        bins: dict[int, list[float]] = {}
        for c in range(n):
            bins.setdefault(distance[c] // bin_width * bin_width, []).append(float(truth[c]))
        t.setdefault("token distance, pointwise", Tally("0.93-0.97")).add(
            float(
                np.mean([inside(p.ci_low, float(np.mean(bins[p.position])), p.ci_high) for p in curve.points])
            )
        )
        t.setdefault("token distance, band", Tally("0.93-0.97")).add(
            all(inside(p.band_low, float(np.mean(bins[p.position])), p.band_high) for p in curve.points)
        )

    return run


def paired_checks(
    a: FakeSpec,
    b: FakeSpec,
    *,
    n: int,
    iterations: int,
    matched: bool,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Body:
    """Two jobs of one model (two checkpoints): the same trials (`matched`) or independent ones."""

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        layout_a = plan(n=n, iterations=iterations, rotation=False, rng=rng)
        layout_b = layout_a if matched else plan(n=n, iterations=iterations, rotation=False, rng=rng)
        world = World.draw(rng, prompts=iterations)
        data_a = answers(a, layout_a, world, rng=rng)
        data_b = answers(b, layout_b, world, rng=rng)
        found = comparison.compare(data_a, data_b, labels=("a", "b"), seed=rep, resamples=resamples)
        truth = np.array([b.accuracy(p, n) - a.accuracy(p, n) for p in range(1, n + 1)])
        kind = "paired" if matched else "unpaired"
        assert found.method == kind, found.method
        if np.ptp(truth) == 0 and truth[0] == 0:
            t.setdefault(f"{kind}: identical called different", Tally("<= 0.05")).add(
                any(p.different for p in found.points)
            )
            # What the user sees marked: a position or a block (each width at every start, issue 41).
            t.setdefault(f"{kind}: identical called different, any member", Tally("<= 0.05")).add(
                any(m.different for m in (*found.points, *found.blocks))
            )
        t.setdefault(f"{kind} difference, pointwise", Tally("0.93-0.97")).add(
            float(np.mean([inside(p.ci_low, truth[p.position - 1], p.ci_high) for p in found.points]))
        )
        t.setdefault(f"{kind} difference, band", Tally("0.93-0.97")).add(
            all(inside(p.band_low, truth[p.position - 1], p.band_high) for p in found.points)
        )
        # The band holds over its whole family: a block's truth is its positions' mean (every position has
        # the same answers here).
        t.setdefault(f"{kind} difference, band over the family", Tally(">= 0.95")).add(
            all(inside(p.band_low, truth[p.position - 1], p.band_high) for p in found.points)
            and all(
                inside(d.band_low, float(truth[d.first_position - 1 : d.last_position].mean()), d.band_high)
                for d in found.blocks
            )
        )
        if found.contrast_diff is not None:
            t.setdefault(f"{kind} contrast difference", Tally("0.93-0.97")).add(
                inside(found.contrast_diff.low, truth[-1] - truth[0], found.contrast_diff.high)
            )

    return run


def verdict_checks(
    base: FakeSpec,
    *,
    n: int,
    iterations: int,
    drop: float,
    drop_positions: int,
    first: int = 1,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Body:
    """A schedule's checkpoint against its baseline, on the same trials: flagged how often, and whether the
    drop it cites (the flagged member that best fits) has each end within one position of the true drop's
    (positions `first` to `first + drop_positions - 1`)."""
    last = first + drop_positions - 1
    rule = RegressionRule(max_drop=5, max_shift=10)
    alpha = (1 - rule.confidence) / 3  # drop, shift and parse checks at one batch size

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        layout = plan(n=n, iterations=iterations, rotation=False, rng=rng)
        world = World.draw(rng, prompts=iterations)
        truth = np.array([base.accuracy(p, n) for p in range(1, n + 1)])
        lowered = truth.copy()
        lowered[first - 1 : last] -= drop
        data_b = answers(base, layout, world, rng=rng, accuracy=truth)
        data_c = answers(base, layout, world, rng=rng, accuracy=lowered)
        judged = verdicts.judge(data_b, data_c, rule=rule, alpha=alpha, seed=rep, resamples=resamples)
        flagged = judged.drop_flagged or judged.parse_flagged or bool(judged.shift and judged.shift.flagged)
        if drop == 0:
            t.setdefault("verdict: identical flagged", Tally("<= 0.05")).add(flagged)
        else:
            t.setdefault(
                f"verdict: {100 * drop:.0f}-point drop at positions {first}-{last} caught",
                Tally(">= 0.80"),
            ).add(judged.drop_flagged)
            cited = judged.worst_drop
            t.setdefault("verdict: the drop cited where it is", Tally("")).add(
                judged.drop_flagged
                and cited is not None
                and abs(cited.first_position - first) <= 1
                and abs(cited.last_position - last) <= 1
            )

    return run


@dataclass(frozen=True)
class Truth:
    """A simulated model whose accuracy is a sum of parts, each a function of one cause (what the fake
    engine cannot do: two causes at once, smooth U shapes, curved decays, a step over a decay): `base`, plus
    `position` and `slot` (functions of the relative position and slot, 0 first to 1 last), plus `distance`
    (of tokens) and a `step` (window, jump) beyond the window; answers correlated as the fake's are."""

    base: float = 0.5
    position: Callable[[Floats], Floats] | None = None
    slot: Callable[[Floats], Floats] | None = None
    distance: Callable[[Floats], Floats] | None = None
    step: tuple[int, float] | None = None
    question_effect: float = 0.3
    prompt_effect: float = 0.15

    @property
    def causes(self) -> set[str]:
        found = {n for n, f in (("position", self.position), ("answer slot", self.slot)) if f is not None}
        return found | ({"token distance"} if self.distance is not None or self.step is not None else set())

    def accuracy(self, position: Floats, slot: Floats, distance: Floats) -> Floats:
        found = np.full(np.shape(position), self.base)
        for part, x in ((self.position, position), (self.slot, slot), (self.distance, distance)):
            if part is not None:
                found = found + part(x)
        if self.step is not None:
            found = found + np.where(distance >= self.step[0], self.step[1], 0.0)
        return np.asarray(found, dtype=np.float64)

    def summaries(self, effect: Any) -> dict[str, float]:
        """The true value of each interval explain prints for `effect`, in its units."""
        zero = np.zeros(1)
        if effect.name == "token distance":
            low, high = effect.span
            f = self.distance
            change = 0.0 if f is None else float(f(np.array([high]))[0] - f(np.array([low]))[0])
            return {"effect": change * 1000.0 / (high - low)}
        f = self.position if effect.name == "position" else self.slot
        if f is None:
            return {"effect": 0.0, "bend": 0.0}
        at = f(np.array([0.0, 1.0])) + zero[0]
        middle = float(np.mean(f(np.array(effect.bend_at or (0.5,)))))
        return {"effect": float(at[1] - at[0]), "bend": middle - float(at[0] + at[1]) / 2}


def truth_answers(truth: Truth, layout: DesignLayout, world: World, *, rng: np.random.Generator) -> TrialData:
    """One job of the design answered by `truth` through the fake engine's rule (`latent_correct`)."""
    trials, n = layout.questions.shape
    position = np.broadcast_to(np.arange(n, dtype=np.float64) / max(n - 1, 1), (trials, n))
    lines = layout.lines[:, None]
    slot = np.where(lines > 1, (np.nan_to_num(layout.slot, nan=1.0) - 1) / np.maximum(lines - 1, 1), 0.0)
    accuracy = truth.accuracy(position, slot, np.nan_to_num(layout.distance))
    assert np.all((accuracy > 0) & (accuracy < 1)), "a truth's parts must keep accuracy inside (0, 1)"
    return _design_answers(
        np.where(layout.answered > 0, accuracy, 0.5),
        layout,
        world,
        rng=rng,
        question_effect=truth.question_effect,
        prompt_effect=truth.prompt_effect,
    )


def _design_answers(
    accuracy: np.ndarray,
    layout: DesignLayout,
    world: World,
    *,
    rng: np.random.Generator,
    question_effect: float,
    prompt_effect: float,
) -> TrialData:
    """Answers drawn at `accuracy` per (trial, position) for a design's layout, as `queries.trial_data`
    would hand them over: one sampled set a cluster when the set is shown several times (a filler sweep, a
    probe of each position), a trial otherwise."""
    trials, n = layout.questions.shape
    correct = latent_correct(
        accuracy,
        question=world.questions[layout.questions],
        prompt=world.prompts[layout.prompt_keys][:, None],
        noise=rng.standard_normal((trials, n)),
        question_effect=question_effect,
        prompt_effect=prompt_effect,
    )
    sweep = len(set(layout.clusters.tolist())) < trials
    return TrialData.from_arrays(
        correct.astype(np.float64) * layout.answered,
        answered=layout.answered,
        cluster=layout.clusters if sweep else None,
        questions=layout.questions,
        keys=[(*map(str, row), f"f{f}") for row, f in zip(layout.questions, layout.filler, strict=True)],
        slot=layout.slot,
        distance=layout.distance,
        filler=layout.filler,
        lines=layout.lines,
        cluster_unit="sampled set" if sweep else "trial",
    )


LENGTHS = {
    "mmlu": lambda rng: block_lengths(rng),
    "fixed": lambda rng: np.full(POOL, float(QUESTION_TOKENS)),
    "wide": lambda rng: np.round(rng.lognormal(np.log(QUESTION_TOKENS) - 0.5, 1.0, POOL)) + 10,
}
"""Question block lengths: about MMLU's (lognormal, sd 0.5 on the log scale), all one length, or widely
varying (sd 1.0: some ten times the median)."""


def explain_checks(
    truth: Truth,
    *,
    window: int | None,
    lengths: str = "mmlu",
    n: int = 10,
    iterations: int = 200,
    resamples: int = 100,
    **design: object,
) -> Body:
    """`posbias explain` on a simulated job of a design with `truth` set: how often each true cause is named
    and each false one is, a step reported, its location interval holding the window; the coverage of every
    interval it prints; and each cause's information (the share the others leave it)."""
    info = (
        ModelInfo(name="sim", num_layers=4, sliding_window=window, sliding_window_layers=(0, 2))
        if window is not None
        else None
    )

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        layout = design_layout(n=n, iterations=iterations, lengths=LENGTHS[lengths](rng), rng=rng, **design)  # type: ignore[arg-type]
        data = truth_answers(truth, layout, World.draw(rng, prompts=iterations), rng=rng)
        found = explain_curve(data, model="sim", info=info, resamples=resamples, seed=rep)
        for effect in found.effects:
            if effect.status == "not estimable" and effect.name in truth.causes:
                # In lockstep with a cause the fit keeps: judged with it, in its group.
                t.setdefault(f"{effect.name}: true cause not separable", Tally("share")).add(True)
            if effect.status != "estimated":
                continue
            if effect.name in truth.causes:
                # Named alone only where the design separates it (in the jobs it does); where it does not,
                # its group's row below is what counts, and this row says how often that was.
                t.setdefault(f"{effect.name}: true cause not separable", Tally("share")).add(
                    not effect.separable
                )
                if effect.separable:
                    t.setdefault(f"{effect.name}: true cause named", Tally(">= 0.90")).add(
                        effect.distinguishable
                    )
            else:
                t.setdefault(f"{effect.name}: false cause named", Tally("<= 0.05")).add(
                    effect.distinguishable
                )
            t.setdefault(f"{effect.name}: information", Tally("mean")).add(effect.information or 0.0)
            if effect.effect is None:  # not separable: no summary of its own
                continue
            true = truth.summaries(effect)
            for name, interval in (("effect", effect.effect), ("bend", effect.bend)):
                if interval is not None:
                    t.setdefault(f"{effect.name} {name}: interval", Tally("0.93-0.97")).add(
                        inside(interval.low, true[name], interval.high)
                    )
        for c in found.confounds:
            if truth.causes & set(c.effects):
                t.setdefault("not separable: group named", Tally("high")).add(c.moves_curve)
        # Explain's own criterion (Holm over the causes, the step in the family): a job names something the
        # truth does not support, a cause or a group with no true cause in it, at most 5% of the time.
        false = [e for e in found.effects if e.status == "estimated" and e.distinguishable]
        t.setdefault("any false cause named (the job)", Tally("<= 0.05")).add(
            any(e.name not in truth.causes for e in false)
            or any(c.moves_curve and not truth.causes & set(c.effects) for c in found.confounds)
        )
        step = found.window
        if step is None or not step.tested or step.jump is None:
            return
        jump = truth.step[1] if truth.step is not None and truth.step[0] == window else 0.0
        t.setdefault("step jump: interval", Tally("0.93-0.97")).add(
            inside(step.jump.low, jump, step.jump.high)
        )
        if jump:
            t.setdefault("step reported", Tally(">= 0.80")).add(step.found)
            if step.found and step.break_interval is not None:
                t.setdefault("location interval holds the window", Tally(">= 0.95")).add(
                    bool(step.window_in_interval)
                )
                t.setdefault("location informative", Tally("high")).add(bool(step.informative))
        else:
            t.setdefault("step reported (none there)", Tally("<= 0.05")).add(step.found)

    return run


def _line(first: float, last: float) -> Callable[[Floats], Floats]:
    return lambda x: (last - first) * (np.asarray(x) - 0.5)


def _u(depth: float) -> Callable[[Floats], Floats]:
    """A smooth U: `depth` points lower in the middle than at the ends (a cosine, not a spline's shape)."""
    return lambda x: -depth * (0.5 - 0.5 * np.cos(2 * np.pi * np.asarray(x))) + depth / 2


def _v(depth: float) -> Callable[[Floats], Floats]:
    """A V: `depth` points lower in the middle, a kink there (the fake engine's `curve` [0.6, 0.35, 0.6])."""
    return lambda x: depth * (np.abs(2 * np.asarray(x) - 1) - 0.5)


def _decay(per_1000: float) -> Callable[[Floats], Floats]:
    return lambda d: per_1000 * (np.asarray(d) / 1000.0 - 1.0)


def _convex(drop: float, scale: float) -> Callable[[Floats], Floats]:
    """A convex decay: `drop` points lost mostly over the first `scale` tokens."""
    return lambda d: drop * (np.exp(-np.asarray(d) / scale) - 0.5)


def _concave(drop: float, span: float) -> Callable[[Floats], Floats]:
    """A concave decay: flat near 0, `drop` points lost by `span` tokens (quadratic, constant beyond)."""
    return lambda d: drop * (0.5 - np.minimum(np.asarray(d) / span, 1.0) ** 2)


TRUTHS = {
    "none": Truth(),
    "position": Truth(position=_line(0.3, 0.6)),
    "position-u": Truth(position=_u(0.25)),
    "position-v": Truth(position=_v(0.25)),
    "slot": Truth(slot=_line(0.3, 0.6)),
    "slot-u": Truth(slot=_u(0.25)),
    "decay": Truth(distance=_decay(-0.075)),
    "convex": Truth(distance=_convex(0.35, 500.0)),
    "concave": Truth(distance=_concave(0.35, 2000.0)),
    "step": Truth(base=0.5, step=(600, -0.3), distance=lambda d: np.full(np.shape(d), 0.15)),
    "step-300": Truth(base=0.5, step=(300, -0.3), distance=lambda d: np.full(np.shape(d), 0.15)),
    "step-1000": Truth(base=0.5, step=(1000, -0.3), distance=lambda d: np.full(np.shape(d), 0.15)),
    "step-decay": Truth(base=0.5, step=(600, -0.2), distance=_decay(-0.05)),
    "position+decay": Truth(position=_line(0.4, 0.55), distance=_decay(-0.075)),
    "position+step": Truth(position=_line(0.4, 0.55), step=(600, -0.25), distance=lambda d: 0.1 + 0 * d),
    "slot+position-u": Truth(slot=_line(0.4, 0.55), position=_u(0.2)),
}
"""Truths of the explain grid (effects in accuracy points as fractions; steps of 25-30 points)."""
DESIGNS: dict[str, dict[str, object]] = {
    "forward": {"order": "forward"},
    "reverse": {"order": "reverse"},
    "random": {"order": "random"},
    "sweep": {"order": "random", "filler": (0, 800)},
    "forward-sweep": {"order": "forward", "filler": (0, 800)},
    "probe": {"probe": True},
    "probe-sweep": {"probe": True, "filler": (0, 800)},
}
"""Designs: answer orders, filler 0/800 tokens at the end (a sweep), and probes (one question asked a prompt,
each position of a set in turn)."""


def _explain_setting(truth: str, design: str, lengths: str = "mmlu", window: int | None = 600) -> Setting:
    step = TRUTHS[truth].step
    window = step[0] if step is not None else window
    where = f"window {window}" if window else "no window"
    return Setting(
        f"explain-{truth}-{design}" + ("" if lengths == "mmlu" else f"-{lengths}"),
        f"explain: {truth}, {design} design, {lengths} lengths, N=10, 200 sets, {where}",
        explain_checks(TRUTHS[truth], window=window, lengths=lengths, **DESIGNS[design]),
    )


EXPLAIN_GRID = [
    *(_explain_setting(truth, "sweep") for truth in TRUTHS),
    *(
        _explain_setting(truth, design, lengths)
        for design in ("forward", "reverse", "random", "forward-sweep", "probe", "probe-sweep")
        for truth in ("none", "position", "position-u", "convex", "step")
        for lengths in ("mmlu",)
    ),
    *(
        _explain_setting(truth, design, lengths)
        for lengths in ("fixed", "wide")
        for design in ("sweep", "random", "forward")
        for truth in ("none", "position", "convex", "step")
    ),
    _explain_setting("slot", "random", window=None),
]


def _held_out(
    window: int, *, ratio: float, n: int, jump: float, lengths: str = "mmlu", sets: int = 200
) -> Setting:
    """Issue 41's held-out family: a step of `jump` at the window and nothing else, random answer order,
    filler at the end at 0 and `ratio` x the window (diagnose's behaviour job uses 0.8), N = `n`, `sets`
    sampled sets (each at both filler lengths)."""
    filler = round(ratio * window)
    truth = Truth(base=0.5, step=(window, -jump), distance=lambda d: np.full(np.shape(d), jump / 2))
    return Setting(
        f"explain-held-w{window}-f{ratio:g}-n{n}-j{100 * jump:.0f}"
        + ("" if lengths == "mmlu" else f"-{lengths}")
        + ("" if sets == 200 else f"-s{sets}"),
        f"explain: a {100 * jump:.0f}-point step at window {window}, random order, filler 0/{filler} at the "
        f"end, N={n}, {sets} sets, {lengths} lengths",
        explain_checks(
            truth, window=window, lengths=lengths, n=n, iterations=sets, order="random", filler=(0, filler)
        ),
    )


HELD_OUT = [
    _held_out(600, ratio=0.8, n=10, jump=0.3),
    _held_out(300, ratio=0.8, n=10, jump=0.3),
    _held_out(1000, ratio=0.8, n=10, jump=0.3),
    _held_out(2000, ratio=0.8, n=10, jump=0.3),
    _held_out(1000, ratio=0.8, n=20, jump=0.3),
    _held_out(600, ratio=0.8, n=10, jump=0.15),
    _held_out(600, ratio=0.5, n=10, jump=0.3),
    _held_out(600, ratio=1.5, n=10, jump=0.3),
    _held_out(2000, ratio=0.8, n=20, jump=0.2),
    _held_out(4096, ratio=0.8, n=10, jump=0.3),
    _held_out(1000, ratio=0.8, n=10, jump=0.3, lengths="wide"),
    _held_out(1000, ratio=0.8, n=10, jump=0.3, sets=40),
    _held_out(600, ratio=0.8, n=10, jump=0.3, sets=16),
    _held_out(600, ratio=0.8, n=10, jump=0.3, sets=40),
    _held_out(1000, ratio=0.8, n=10, jump=0.3, sets=80),
    _held_out(2000, ratio=0.8, n=10, jump=0.2, sets=40),
]
"""Issue 41's family around its held-out check (a window step, filler at the end, random order): filler
lengths against the window, N and the step's size (benchmarks/README.md, "Explain's false causes")."""


# --- explain's attention AUROC ---------------------------------------------------------------------


def within_auroc(rho: float, accuracy: float, *, grid: int = 2000) -> float:
    """The true AUROC within one (batch size, position) cell when an answer is correct by the fake's rule
    (its latent L below `ndtri(accuracy)`) and its attention score is jointly normal with L, corr(score, -L)
    = `rho` (any monotone transform of the score has the same AUROC): P(score of a correct answer > score
    of a wrong one) = E[Phi(rho (L_w - L_c) / sqrt(2 (1 - rho^2)))], L_c ~ N(0, 1) below the threshold and
    L_w above it; a midpoint rule over both truncated normals' quantiles."""
    if rho == 0:
        return 0.5
    u = (np.arange(grid) + 0.5) / grid
    low = ndtri(u * accuracy)
    high = ndtri(accuracy + u * (1 - accuracy))
    spread = math.sqrt(2 * (1 - rho**2))
    return float(np.mean(ndtr(rho * (high[None, :] - low[:, None]) / spread)))


def auroc_truth(rho: float, accuracy: Floats) -> float:
    """The pooled within-position AUROC's target: each cell's AUROC weighted by its expected pairs,
    n^2 p (1 - p) (every cell has one answer per trial)."""
    weights = accuracy * (1 - accuracy)
    cells = np.array([within_auroc(rho, float(a)) for a in accuracy])
    return float(np.sum(weights * cells) / np.sum(weights))


@dataclass(frozen=True)
class AurocWorld:
    """Simulated trials for explain's attention AUROC: answers correct by the fake's rule (question and
    prompt effects), accuracy `first` to `last` by position; own-question attention the logistic of a
    normal score with corr `rho` with the answer's latent, a trial effect (`trial_share` of the rest: the
    prompts a model attends to more or less throughout) and a rise of `rise` logits from first to last
    position (attention and accuracy both rise with position: the confound an AUROC pooled over positions
    would fall for)."""

    n: int
    iterations: int
    rho: float
    first: float = 0.3
    last: float = 0.6
    trial_share: float = 0.5
    rise: float = 1.0
    question_effect: float = 0.3
    prompt_effect: float = 0.15

    @property
    def accuracy(self) -> Floats:
        return np.linspace(self.first, self.last, self.n)

    @property
    def truth(self) -> float:
        return auroc_truth(self.rho, self.accuracy)

    def explain(self, rng: np.random.Generator, *, resamples: int = 1000) -> tuple[Any, list[Any]]:
        """One job's attention rows and its paired job's correctness, drawn, through `summarise` (as
        `explain` runs it): the global layers' `AttentionAuroc`, and the answers it scored (`Scored`), for
        other intervals to be computed on the same draw."""
        n, trials, qe, pe = self.n, self.iterations, self.question_effect, self.prompt_effect
        layout = plan(n=n, iterations=trials, rotation=False, rng=rng)
        world = World.draw(rng, prompts=trials)
        question = world.questions[layout.questions]
        prompt = world.prompts[layout.prompt_keys][:, None]
        noise = rng.standard_normal((trials, n))
        latent = math.sqrt(qe) * question + math.sqrt(pe) * prompt + math.sqrt(1 - qe - pe) * noise
        correct = latent_correct(
            np.broadcast_to(self.accuracy, (trials, n)),
            question=question,
            prompt=prompt,
            noise=noise,
            question_effect=qe,
            prompt_effect=pe,
        )
        assert np.array_equal(correct, latent < ndtri(self.accuracy)), "the latent is the fake's own"
        share = self.trial_share
        rest = math.sqrt(share) * rng.standard_normal((trials, 1)) + math.sqrt(
            1 - share
        ) * rng.standard_normal((trials, n))
        score = (
            -self.rho * latent + math.sqrt(1 - self.rho**2) * rest + self.rise * np.arange(n) / max(n - 1, 1)
        )
        attention = 1 / (1 + np.exp(2.0 - score))
        rows = [
            {
                "trial": trial,
                "batch_size": n,
                "position": position + 1,
                "layer_kind": "global",
                "token_distance": (n - position) * QUESTION_TOKENS,
                "query_tokens": 3,
                "own_mean": float(attention[trial, position]),
                "own_max": float(attention[trial, position]),
            }
            for trial in range(trials)
            for position in range(n)
        ]
        marks = {(trial, p + 1): bool(correct[trial, p]) for trial in range(trials) for p in range(n)}
        found = attention_explain.summarise(
            rows,
            marks,
            model="sim",
            job_id=1,
            scored_job_id=2,
            variant="baseline",
            window=None,
            resamples=resamples,
        )
        [auroc] = [a for a in found.aurocs if a.layer_kind.value == "global"]
        assert auroc.auroc is not None
        scored = [
            attention_explain.Scored(trial, n, p + 1, bool(correct[trial, p]), float(attention[trial, p]))
            for trial in range(trials)
            for p in range(n)
        ]
        return auroc, scored


def clustered_interval(answers: Sequence[attention_explain.Scored]) -> tuple[float, float] | None:
    """A 95% interval of `pooled_auroc` from its variance by trial: Obuchowski's clustered form of DeLong's
    placement values (Biometrics 53:567, 1997). Each answer's placement (the share of the other class in
    its cell it is ordered rightly against, ties half) less the AUROC, summed over its trial's answers,
    is the trial's influence; the variance is their sum of squares times T / (T - 1), and the interval
    takes Student's t with T - 1 degrees of freedom, clipped to [0, 1]. None below `MIN_CLUSTERS` trials
    or without a cell holding both correct and wrong answers. The benchmark's reference method, computed
    on the same draws as the percentile bootstrap by trial that explain prints."""
    trials = sorted({a.trial for a in answers})
    if len(trials) < MIN_CLUSTERS:
        return None
    slot = {t: i for i, t in enumerate(trials)}
    grouped: dict[tuple[int, int], list[attention_explain.Scored]] = defaultdict(list)
    for answer in answers:
        grouped[answer.batch_size, answer.position].append(answer)
    parts = []
    u_sum = pairs = 0.0
    for cell in grouped.values():
        right = np.array([a.score for a in cell if a.correct])
        wrong = np.array([a.score for a in cell if not a.correct])
        if not len(right) or not len(wrong):
            continue
        below, upto = (
            np.searchsorted(np.sort(wrong), right, "left"),
            np.searchsorted(np.sort(wrong), right, "right"),
        )
        over, from_ = (
            np.searchsorted(np.sort(right), wrong, "right"),
            np.searchsorted(np.sort(right), wrong, "left"),
        )
        placed_right = below + 0.5 * (upto - below)  # wrong answers each correct one outscores
        placed_wrong = len(right) - over + 0.5 * (over - from_)  # correct answers outscoring each wrong one
        owners = [slot[a.trial] for a in cell if a.correct], [slot[a.trial] for a in cell if not a.correct]
        parts.append((placed_right, len(wrong), owners[0], placed_wrong, len(right), owners[1]))
        u_sum += float(placed_right.sum())
        pairs += len(right) * len(wrong)
    if not pairs:
        return None
    auroc = u_sum / pairs
    influence = np.zeros(len(trials))
    for placed_right, n_wrong, right_owners, placed_wrong, n_right, wrong_owners in parts:
        np.add.at(influence, right_owners, placed_right - auroc * n_wrong)
        np.add.at(influence, wrong_owners, placed_wrong - auroc * n_right)
    count = len(trials)
    spread = math.sqrt(count / (count - 1) * float(np.sum((influence / pairs) ** 2)))
    reach = float(student_t.ppf(0.975, count - 1)) * spread
    return max(0.0, auroc - reach), min(1.0, auroc + reach)


def auroc_checks(world: AurocWorld, *, resamples: int = 1000) -> Body:
    """`explain`'s attention AUROC (`service/stats/attention_explain.py`) on `world`'s trials: how often its
    by-trial interval holds the truth (`auroc_truth`)."""
    truth = world.truth

    def run(rep: int, rng: np.random.Generator, t: dict[str, Tally]) -> None:
        auroc, scored = world.explain(rng, resamples=resamples)
        t.setdefault(f"AUROC within position (truth {truth:.3f}): explain", Tally("0.93-0.97")).add(
            inside(auroc.low, truth, auroc.high)
        )
        # Both methods on the same draw: the one explain prints, and the other.
        for name, found in (
            ("clustered DeLong, t", clustered_interval(scored)),
            ("percentile bootstrap by trial", attention_explain.auroc_interval(scored, resamples=resamples)),
        ):
            assert found is not None
            t.setdefault(f"  {name}", Tally("0.93-0.97")).add(inside(found[0], truth, found[1]))

    return run


LINEAR = FakeSpec(first=0.25, last=0.55)
EFFECTS = FakeSpec(first=0.25, last=0.55, question_effect=0.3, prompt_effect=0.15)
U_SHAPE = FakeSpec(curve=(0.6, 0.35, 0.6), question_effect=0.3, prompt_effect=0.15)
FLAT = FakeSpec(first=0.4, last=0.4, question_effect=0.3, prompt_effect=0.15)
PARSE = FakeSpec(first=0.25, last=0.55, question_effect=0.3, prompt_effect=0.15, malformed=0.1)
LOWER = FakeSpec(first=0.3, last=0.5, question_effect=0.3, prompt_effect=0.15)

WINDOW = 600
"""The simulated model's sliding window: inside it are the last five or so questions of ten, and with 800
tokens of filler at the end none of them."""
WINDOWED = ModelInfo(name="sim", num_layers=4, sliding_window=WINDOW, sliding_window_layers=(0, 2))
SWEEP = {"order": "random", "filler": (0, 800)}
"""A random answer order and filler at two lengths at the end: position, slot and distance apart."""
BY_POSITION = FakeSpec(first=0.3, last=0.6, question_effect=0.3, prompt_effect=0.15)
BY_SLOT = FakeSpec(
    first=0.3, last=0.6, depends_on=FakeAxis.answer_slot, question_effect=0.3, prompt_effect=0.15
)
BY_DISTANCE = FakeSpec(
    first=0.65,
    last=0.35,
    depends_on=FakeAxis.token_distance,
    distance_span=4000,
    question_effect=0.3,
    prompt_effect=0.15,
)
"""Linear in distance from 65% at 0 to 35% at 4,000 tokens (past every simulated distance): a smooth decay."""
BY_STEP = FakeSpec(
    first=0.65,
    last=0.35,
    depends_on=FakeAxis.token_distance,
    window=WINDOW,
    question_effect=0.3,
    prompt_effect=0.15,
)

SETTINGS = [
    Setting(
        "pointwise-plain",
        "random design, N=50, 100 trials, 25%->55%, no effects",
        curve_checks(LINEAR, n=50, iterations=100),
    ),
    Setting(
        "pointwise-effects",
        "as above with question (0.3) and prompt (0.15) effects",
        curve_checks(EFFECTS, n=50, iterations=100),
    ),
    Setting(
        "u-shape", "U-shaped curve 60%-35%-60% with effects", curve_checks(U_SHAPE, n=50, iterations=100)
    ),
    Setting(
        "flat", "no position effect (40% everywhere) with effects", curve_checks(FLAT, n=20, iterations=100)
    ),
    Setting(
        "parse-failures",
        "10% failed parses and the sheet cut after position 40",
        curve_checks(PARSE, n=50, iterations=100, missing_after=40),
    ),
    Setting(
        "rotation",
        "rotation design, N=10, 60 sampled sets, effects",
        curve_checks(EFFECTS, n=10, iterations=60, rotation=True),
    ),
    Setting("small-n", "N=20, 30 trials, effects", curve_checks(EFFECTS, n=20, iterations=30)),
    Setting(
        "token-distance",
        "bins of 512 tokens, N=50, 100 trials, effects",
        distance_checks(EFFECTS, n=50, iterations=100),
    ),
    Setting(
        "paired-identical",
        "same trials, same curve, independent noise",
        paired_checks(EFFECTS, EFFECTS, n=30, iterations=100, matched=True),
    ),
    Setting(
        "unpaired-identical",
        "independent trials, same curve",
        paired_checks(EFFECTS, EFFECTS, n=30, iterations=100, matched=False),
    ),
    Setting(
        "paired-different",
        "same trials, 25%->55% against 30%->50%",
        paired_checks(EFFECTS, LOWER, n=30, iterations=100, matched=True),
    ),
    Setting(
        "verdict-identical",
        "a checkpoint as good as its baseline, same trials, N=50",
        verdict_checks(EFFECTS, n=50, iterations=100, drop=0.0, drop_positions=0),
    ),
    Setting(
        "verdict-power",
        "a 10-point drop at positions 1-10 of N=50, 100 iterations",
        verdict_checks(EFFECTS, n=50, iterations=100, drop=0.10, drop_positions=10),
    ),
    Setting(
        "verdict-local",
        "a 20-point drop at positions 5-8 of N=16, 100 iterations",
        verdict_checks(EFFECTS, n=16, iterations=100, drop=0.20, drop_positions=4, first=5),
    ),
    Setting(
        "verdict-uniform",
        "an 8-point drop at every position of N=50, 100 iterations",
        verdict_checks(EFFECTS, n=50, iterations=100, drop=0.08, drop_positions=50),
    ),
    Setting(
        "auroc",
        "explain's attention AUROC within position: N=10, 100 trials, corr 0.25, trial effects, confounded",
        auroc_checks(AurocWorld(n=10, iterations=100, rho=0.25)),
    ),
    Setting(
        "auroc-null",
        "as above, attention unrelated to correctness (AUROC 0.5)",
        auroc_checks(AurocWorld(n=10, iterations=100, rho=0.0)),
    ),
    Setting(
        "auroc-few",
        "as 'auroc' with 20 trials (16 is the least given an interval)",
        auroc_checks(AurocWorld(n=10, iterations=20, rho=0.25)),
    ),
    Setting(
        "auroc-strong",
        "N=20, 50 trials, corr 0.6 (AUROC about 0.8)",
        auroc_checks(AurocWorld(n=20, iterations=50, rho=0.6)),
    ),
    *EXPLAIN_GRID,
    *HELD_OUT,
]


def replications(setting: Setting, *, reps: int, seed: int) -> Iterator[int]:
    rng = np.random.default_rng([seed, sum(map(ord, setting.name))])
    for rep in range(reps):
        setting.run(rep, rng, setting.tallies)
        yield rep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=500, help="Replications per setting (default 500).")
    parser.add_argument(
        "--only", help="Comma-separated setting names or patterns, e.g. 'explain-*' (default: all; --list)."
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the simulation.")
    parser.add_argument("--list", action="store_true", help="List the settings and exit.")
    args = parser.parse_args(argv)
    if args.list:
        for s in SETTINGS:
            print(f"{s.name:20} {s.about}")
        return 0
    names = [s.name for s in SETTINGS]
    asked = args.only.split(",") if args.only else ["*"]
    wanted = {name for pattern in asked for name in fnmatch.filter(names, pattern)}
    unknown = [pattern for pattern in asked if not fnmatch.filter(names, pattern)]
    if unknown:
        print(f"unknown setting(s): {', '.join(sorted(unknown))}; see --list", file=sys.stderr)
        return 2
    print(f"{args.reps} replications per setting, seed {args.seed}; each interval 95%")
    print(f"{'setting':20} {'statistic':46} {'rate':>7} {'95% CI of rate':>16} {'target':>10}")
    for setting in SETTINGS:
        if setting.name not in wanted:
            continue
        started = time.perf_counter()
        for _ in replications(setting, reps=args.reps, seed=args.seed):
            pass
        seconds = time.perf_counter() - started
        for name, tally in setting.tallies.items():
            low, high = tally.interval()
            bounds = f"{low:.3f}-{high:.3f}"
            print(f"{setting.name:20} {name:46} {tally.rate():7.3f} {bounds:>16} {tally.target:>10}")
        print(f"{'':20} ({setting.about}; {seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
