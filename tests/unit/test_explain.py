"""`posbias explain`'s analysis on simulated jobs (benchmarks/coverage.py's simulation and its `Truth`s, the
fake engine's rule), checked by rate over many seeds, not on one: with the truth set in every setting, a true
cause is named, a cause the truth does not depend on is named no more often than 5%, every interval explain
prints holds its truth, no window step is reported where there is none, a step at the window is found and
located; and the table and the verdict say the same thing, including what a design cannot separate.

How each rate test is sized (tests/support/power.py, binomial: one Bernoulli per replication and count; 100
sampled sets of N = 10 each, a random answer order with filler 0/800 at the end unless said):

- **A false cause named** (its joint test rejects and the design separates it), **a step reported where there
  is none**: nominal 5%, broken 10%: R = 346, pass while <= 27 (P(pass | 5%) = 0.991, P(fail | 10%) = 0.901).
  (Holm's adjustment over the causes, the step tested after distance in their family, keeps each under 5%,
  and a one-cause truth named alone in 95% of jobs.) The broken explain: each cause's joint test alone at
  10% (`p_single` < 0.10), no adjustment; the step's own test unadjusted, ungated, its interval 30% narrower.
- **The true cause named**: a correct explain names it in at least 95% of jobs here, a broken one in 90% or
  fewer: the same R = 346, pass while missed in <= 27. The broken explain reports each cause's test under
  the next cause's name.
- **Every printed interval holds its truth** (each cause's summary and bend, the step's jump): at the same R,
  misses <= 27 per interval (P(pass | 5%) = 0.991; one 30% too narrow, missing 17%, fails with probability
  > 0.999). The broken explain: every interval 30% narrower around its estimate.
- **A step at the window** (issue 22's fake: 65% inside a 600-token window, 35% beyond): found, and its
  location interval holding the window, in at least 90% of jobs against 75% or fewer: R = 346 at the
  10% cut-off (`at(346, 0.10, 0.25)`). Measured in the suite run of 2026-12-02: missed in 28 of 346 (8.1%),
  so issue 22's wish of 98% is not met and stays open. The broken location: the best split alone, with no
  interval.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import numpy as np
import pytest
from support.power import DOUBLED, NARROW, Sizing, at

from posbias.schemas import FakeSpec, Interval, ModelInfo
from posbias.schemas.explanation import Effect, Explanation
from posbias.service.stats.explain import explain_curve

EFFECTS = {"question_effect": 0.3, "prompt_effect": 0.15}
WINDOW = 600
REPS = DOUBLED.replications
ITERATIONS = 100
"""Sampled sets per simulated job: half the benchmark's 200, so that 346 replications of a setting take
seconds."""
RESAMPLES = 20
"""Bootstrap resamples of the step's location: few (the benchmark uses 200, the CLI 1,000); the interval of
20 is the range of the middle 19, wider than a 95% one, so that the location's check is conservative here."""
NARROWER = 0.3
LOCATED = at(REPS, 0.10, 0.25)
SWEEP: dict[str, object] = {"order": "random", "filler": (0, 800)}
NAMES = ("position", "answer slot", "token distance")


@dataclass(frozen=True)
class Case:
    """A truth, the design it is simulated in, and whether the model states a window."""

    truth: str
    design: dict[str, object]
    window: int | None = WINDOW


CASES = {
    "position": Case("position", SWEEP),
    "answer slot": Case("slot", {"order": "random"}, window=None),
    "token distance": Case("decay-steep", SWEEP),
    "step": Case("step", SWEEP),
}
"""The settings (their truths are benchmarks/coverage.py's `TRUTHS`; `decay-steep` is this file's: the
benchmark's slope twice over, so that 100 sets name it in nearly every job)."""


def _truths(coverage: ModuleType) -> dict[str, object]:
    truths = dict(coverage.TRUTHS)
    truths["decay-steep"] = coverage.Truth(distance=lambda d: -0.15 * (np.asarray(d) / 1000.0 - 1.0))
    return truths


def _run(coverage: ModuleType, case: Case, *, reps: int, seed: int) -> list[tuple[object, Explanation]]:
    truth = _truths(coverage)[case.truth]
    info = (
        ModelInfo(name="sim", num_layers=4, sliding_window=case.window, sliding_window_layers=(0, 2))
        if case.window is not None
        else None
    )
    rng = np.random.default_rng(seed)
    found = []
    for rep in range(reps):
        layout = coverage.design_layout(
            n=10, iterations=ITERATIONS, lengths=coverage.block_lengths(rng), rng=rng, **case.design
        )
        data = coverage.truth_answers(truth, layout, coverage.World.draw(rng, prompts=ITERATIONS), rng=rng)
        found.append((truth, explain_curve(data, model="sim", info=info, resamples=RESAMPLES, seed=rep)))
    return found


@pytest.fixture(scope="module")
def explained(coverage: ModuleType) -> Callable[[str], list[tuple[object, Explanation]]]:
    """Each setting's REPS explanations with their truth, run once for its tests and broken companions."""
    done: dict[str, list[tuple[object, Explanation]]] = {}

    def get(name: str) -> list[tuple[object, Explanation]]:
        if name not in done:
            done[name] = _run(coverage, CASES[name], reps=REPS, seed=sum(map(ord, name)))
        return done[name]

    return get


def _effect(explanation: Explanation, name: str) -> Effect:
    return next(e for e in explanation.effects if e.name == name)


def _narrowed(found: Interval | None) -> Interval | None:
    """The interval with each side 30% closer to its estimate: explain broken on purpose."""
    if found is None or found.estimate is None or found.low is None or found.high is None:
        return None
    e = found.estimate
    return Interval(
        estimate=e, low=e - (1 - NARROWER) * (e - found.low), high=e + (1 - NARROWER) * (found.high - e)
    )


def _holds(found: Interval | None, truth: float) -> bool:
    return (
        found is not None
        and found.low is not None
        and found.high is not None
        and found.low <= truth <= found.high
    )


ROTATED = {"position": "answer slot", "answer slot": "token distance", "token distance": "position"}


def _named(explanation: Explanation, name: str, *, broken: bool = False) -> bool:
    if broken:  # each cause's test reported under the next cause's name
        name = next(k for k, v in ROTATED.items() if v == name)
    return _effect(explanation, name).distinguishable


def _check(sized: Sizing, wrong: int, *, what: str, broken: bool) -> None:
    if broken:
        assert not sized.passes(wrong), f"{what} (broken on purpose): {sized.describe(wrong)}"
    else:
        assert sized.passes(wrong), f"{what}: {sized.describe(wrong)}"


BROKEN = pytest.mark.parametrize("broken", [False, True], ids=["as it is", "broken on purpose"])
TRUE = [("position", "position"), ("answer slot", "answer slot"), ("token distance", "token distance")]
TRUE += [("step", "token distance")]
FALSE = [(case, other) for case, cause in TRUE for other in NAMES if other != cause]


@BROKEN
@pytest.mark.parametrize(("case", "cause"), TRUE, ids=[f"{c} truth" for c, _ in TRUE])
def test_the_true_cause_is_named(
    explained: Callable[[str], list], case: str, cause: str, broken: bool
) -> None:
    missed = sum(not _named(e, cause, broken=broken) for _, e in explained(case))
    _check(DOUBLED, missed, what=f"{cause} not named ({case} truth)", broken=broken)


@BROKEN
@pytest.mark.parametrize(("case", "other"), FALSE, ids=[f"{c} truth, {o}" for c, o in FALSE])
def test_a_cause_the_truth_does_not_depend_on_is_rarely_named(
    explained: Callable[[str], list], case: str, other: str, broken: bool
) -> None:
    runs = [e for _, e in explained(case)]
    effects = [_effect(e, other) for e in runs]
    if broken:
        # The broken explain: each cause's own test at 10% (its group's where the design does not separate
        # it, as for the slot truth: there p_single is None, and only the group is tested), unadjusted.
        tests = [f.p_single if f.p_single is not None else f.p for f in effects]
        called = sum(p is not None and p < 0.10 for p in tests)
    else:
        called = sum(f.distinguishable for f in effects)
    _check(DOUBLED, called, what=f"{other} named for a {case} truth", broken=broken)


INTERVALS = [(case, name, part) for case in CASES for name in NAMES for part in ("effect", "bend")]
INTERVALS = [(c, n, p) for c, n, p in INTERVALS if not (n == "token distance" and p == "bend")]
INTERVALS += [(c, "step", "jump") for c in CASES if CASES[c].window is not None]
UNSEPARATED = {"answer slot": ("position", "token distance")}
"""Causes a setting's design never separates (a random order with no filler moves position and distance
together): they get no interval of their own (`test_a_cause_not_separable_gets_no_interval_of_its_own`)."""
INTERVALS = [(c, n, p) for c, n, p in INTERVALS if n not in UNSEPARATED.get(c, ())]


@BROKEN
@pytest.mark.parametrize(("case", "name", "part"), INTERVALS, ids=[f"{c}: {n} {p}" for c, n, p in INTERVALS])
def test_every_printed_interval_holds_its_truth(
    explained: Callable[[str], list], case: str, name: str, part: str, broken: bool
) -> None:
    missed = 0
    for truth, e in explained(case):
        if name == "step":
            assert e.window is not None and e.window.tested
            step = truth.step  # type: ignore[attr-defined]
            found, true = e.window.jump, (step[1] if step is not None else 0.0)
        else:
            effect = _effect(e, name)
            found = effect.effect if part == "effect" else effect.bend
            true = truth.summaries(effect)[part]  # type: ignore[attr-defined]
        missed += not _holds(_narrowed(found) if broken else found, true)
    _check(at(REPS, 0.05, NARROW.broken), missed, what=f"{case}: {name} {part} interval", broken=broken)


def test_a_cause_not_separable_gets_no_interval_of_its_own(explained: Callable[[str], list]) -> None:
    """Position and distance in a random order without filler: the fit could only extrapolate each (past
    +-100 points at times), so neither gets a summary; the table reads "not separable", a group is named."""
    for case, names in UNSEPARATED.items():
        for _, e in explained(case):
            for name in names:
                effect = _effect(e, name)
                assert effect.effect is None and effect.bend is None, (case, name, effect)
                assert (effect.reading or "").startswith("not separable from"), effect.reading
            assert any(set(names) <= set(c.effects) for c in e.confounds), e.confounds


@BROKEN
@pytest.mark.parametrize("case", ["position", "token distance"])
def test_no_step_is_reported_where_there_is_none(
    explained: Callable[[str], list], case: str, broken: bool
) -> None:
    steps = [e.window for _, e in explained(case)]
    assert all(s is not None and s.tested for s in steps), "every job straddles the window"
    if broken:
        # The broken explain: the step's own test outside the causes' family and too liberal (its interval
        # 30% narrower, about 17% two-sided), and not gated by the token distance's joint test.
        found = sum(not _holds(_narrowed(s.jump), 0.0) for s in steps if s is not None)
    else:
        found = sum(s.found for s in steps if s is not None)
    _check(DOUBLED, found, what=f"a step reported for a {case} truth", broken=broken)


@BROKEN
def test_a_step_at_the_window_is_found_located_and_signed(
    explained: Callable[[str], list], broken: bool
) -> None:
    located = 0
    for _, e in explained("step"):
        step = e.window
        assert step is not None
        if not step.found:
            continue
        assert (
            step.direction == "down" and f"A step down at the sliding window ({WINDOW} tokens)" in e.verdict
        )
        assert step.break_interval is not None and step.break_low is not None and step.break_high is not None
        low, high = step.break_interval
        if broken:
            low, high = step.break_low, step.break_high
        located += low < WINDOW <= high
    _check(LOCATED, REPS - located, what="the step not found at the window", broken=broken)


@pytest.mark.parametrize("case", list(CASES))
def test_the_table_and_the_verdict_say_the_same(explained: Callable[[str], list], case: str) -> None:
    for _, e in explained(case):
        for effect in e.effects:
            if effect.reading == "moves the curve":
                assert effect.distinguishable and f"{effect.name} (" in e.verdict.split(". ")[0], e.verdict
            elif effect.reading.startswith(("no effect", "cannot tell")):
                assert not effect.distinguishable and effect.rules_out is not None
                assert f"{effect.name}: {effect.reading}".lower() in e.verdict.lower(), e.verdict
            if effect.reading.startswith("no effect"):
                assert effect.rules_out is not None and effect.rules_out < 0.10
        step = e.window
        if step is not None and step.tested and not step.found:
            assert step.break_interval is None and "No step at the sliding window" in e.verdict
        if step is not None and step.found:
            # A step is a claim about the token distance: never made unless distance (or its group) moves
            # the curve, and never on less evidence than that (its adjusted p is at least distance's).
            distance = _effect(e, "token distance")
            holder = [c.joint_p for c in e.confounds if "token distance" in c.effects and c.moves_curve]
            if distance.distinguishable and distance.p is not None:
                holder.append(distance.p)
            assert holder and step.p is not None and step.p >= min(holder), (step.p, holder)


def test_a_u_shape_is_named(coverage: ModuleType) -> None:
    # A smooth U, 25 points lower in the middle, at the benchmark's 200 sets: named with its bend in at
    # least 80% (benchmark: see benchmarks/README.md). 32 replications, pass while named in >= 28: a correct
    # explain named in 99% passes with P = 0.996; one named in 80% fails with P = 0.907.
    sized = at(32, 0.01, 0.20)
    truth = coverage.TRUTHS["position-u"]
    rng = np.random.default_rng(23)
    missed = 0
    for rep in range(sized.replications):
        layout = coverage.design_layout(
            n=10, iterations=200, lengths=coverage.block_lengths(rng), rng=rng, **SWEEP
        )
        data = coverage.truth_answers(truth, layout, coverage.World.draw(rng, prompts=200), rng=rng)
        found = explain_curve(data, model="sim", resamples=RESAMPLES, seed=rep)
        position = _effect(found, "position")
        named = position.distinguishable and position.bend is not None and (position.bend.high or 0) < 0
        missed += not named
        if named:
            assert "a U, lowest in the middle" in found.verdict
    assert sized.passes(missed), sized.describe(missed)


def test_forward_order_without_filler_cannot_separate_and_says_so(coverage: ModuleType) -> None:
    # Issue 22: with distance the true cause in the seed's design, the three causes are reported together, in
    # the table and in the verdict: the slot is the position here (not estimable apart), and distance is too
    # close to position to be told apart; never one of them as "not distinguishable" alone.
    fake = FakeSpec(first=0.65, last=0.35, depends_on="token-distance", distance_span=2000, **EFFECTS)
    rng = np.random.default_rng(4)
    layout = coverage.design_layout(n=10, iterations=200, lengths=coverage.block_lengths(rng), rng=rng)
    data = coverage.design_answers(fake, layout, coverage.World.draw(rng, prompts=200), rng=rng)
    found = explain_curve(data, model="sim", resamples=RESAMPLES)
    slot = _effect(found, "answer slot")
    assert slot.status == "not estimable" and slot.effect is None
    (group,) = found.confounds
    assert group.effects == ("position", "answer slot", "token distance") and group.moves_curve
    assert _effect(found, "position").reading == "not separable from answer slot and token distance"
    assert _effect(found, "token distance").reading == "not separable from position and answer slot"
    assert group.fix == "a random answer order with filler at several lengths"
    assert "Position, answer slot and token distance together move the curve" in found.verdict
    assert "Moves the curve:" not in found.verdict


@pytest.mark.parametrize("order", ["forward", "random"])
def test_a_cause_in_lockstep_is_judged_with_the_one_fitted_for_it(coverage: ModuleType, order: str) -> None:
    # Issue 22: all questions one length, so token distance is an exact function of position in forward
    # and random order (and the slot of position in forward order). Only position is fitted; a step in
    # distance at the window must not read as position moving the curve: position is judged with what it
    # stands in for, and the window's step is not tested.
    truth = coverage.TRUTHS["step"]
    rng = np.random.default_rng(1)
    layout = coverage.design_layout(
        n=10, iterations=200, lengths=coverage.LENGTHS["fixed"](rng), rng=rng, order=order
    )
    data = coverage.truth_answers(truth, layout, coverage.World.draw(rng, prompts=200), rng=rng)
    info = ModelInfo(name="sim", num_layers=4, sliding_window=WINDOW, sliding_window_layers=(0, 2))
    found = explain_curve(data, model="sim", info=info, resamples=RESAMPLES)
    distance, position = _effect(found, "token distance"), _effect(found, "position")
    assert distance.status == "not estimable" and "in lockstep with the position" in (distance.note or "")
    assert not position.separable and not position.distinguishable and position.effect is None
    (group,) = [c for c in found.confounds if "token distance" in c.effects]
    assert "position" in group.effects and group.moves_curve, found.confounds
    assert "filler" in group.fix and "Moves the curve:" not in found.verdict
    assert found.window is not None and not found.window.tested
    assert "in lockstep with the position" in (found.window.note or "")


def test_the_probe_design_holds_the_slot_fixed_and_asks_every_position_of_a_set(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    rng = np.random.default_rng(6)
    layout = coverage.design_layout(
        n=10, iterations=200, lengths=coverage.block_lengths(rng), rng=rng, probe=True
    )
    data = coverage.design_answers(fake, layout, coverage.World.draw(rng, prompts=200), rng=rng)
    found = explain_curve(data, model="sim", resamples=RESAMPLES)
    slot = _effect(found, "answer slot")
    assert slot.status == "held fixed" and slot.reading == "held fixed"
    # Each of the 200 sets is asked at every position, one prompt each: a cluster of 10 answers.
    assert (found.answers, found.clusters, found.cluster_unit) == (2000, 200, "sampled set")
    # Without filler, position and distance move together; their group moves the curve (30 points).
    (group,) = found.confounds
    assert set(group.effects) == {"position", "token distance"} and group.moves_curve


def test_a_window_no_answer_reaches_is_not_tested(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    far = ModelInfo(name="sim", num_layers=4, sliding_window=100_000, sliding_window_layers=(0, 2))
    rng = np.random.default_rng(7)
    layout = coverage.design_layout(
        n=10, iterations=200, lengths=coverage.block_lengths(rng), rng=rng, order="random"
    )
    data = coverage.design_answers(fake, layout, coverage.World.draw(rng, prompts=200), rng=rng)
    found = explain_curve(data, model="sim", info=far, resamples=RESAMPLES)
    assert found.window is not None and not found.window.tested
    assert found.window.note is not None and "do not straddle the window" in found.window.note
    assert "not tested" in found.verdict


def test_the_graph_procedure_with_holms_graph_is_holm() -> None:
    """explain adjusts its family (the causes, and the step after distance) by a graph of weighted Bonferroni
    tests; with equal weights and each share split evenly among the rest it must be statsmodels' Holm.
    (A few cases per family size: `multipletests` costs about 25 ms a call here.)"""
    from statsmodels.stats.multitest import multipletests

    from posbias.service.stats.explain import _graph_adjusted

    rng = np.random.default_rng(0)
    for m in (1, 2, 3, 4):
        graph = (np.ones((m, m)) - np.eye(m)) / max(m - 1, 1)
        cases = [rng.uniform(0, 0.2, size=m) ** rng.uniform(1, 4) for _ in range(6)]
        cases += [np.full(m, 0.01), np.linspace(0.001, 0.9, m)]  # ties, and one past every threshold
        for p in cases:
            expected = multipletests(p, method="holm")[1]
            assert _graph_adjusted(p, np.full(m, 1.0 / m), graph) == pytest.approx(expected, abs=1e-12), p


def test_an_interval_that_leaves_out_zero_for_a_cause_not_named_says_why() -> None:
    """The table's row for a cause whose summary's interval excludes 0 while its joint test (all its terms,
    Holm-adjusted) is not significant says so, rather than leaving the two to contradict each other."""
    from posbias.service.stats.explain_reading import read

    def effect(low: float, high: float) -> Effect:
        return Effect(
            name="position",
            unit="first to last",
            status="estimated",
            effect=Interval(estimate=(low + high) / 2, low=low, high=high),
            terms=3,
            p=0.12,
            p_single=0.04,
            distinguishable=False,
            information=0.9,
            separable=True,
        )

    excluding = read(effect(0.005, 0.04), []).reading
    assert excluding.startswith("no effect larger than +/-4.0 points")
    assert "leaves out 0, but the joint test of its 3 terms is not significant (p 0.12" in excluding
    assert "leaves out 0" not in read(effect(-0.01, 0.03), []).reading
