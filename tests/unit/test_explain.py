"""`posbias explain`'s analysis on simulated jobs of each design (benchmarks/coverage.py's simulation, the
fake engine's rule): each fake is attributed to its cause at 200 trials, a window step is located within its
interval, a position-driven fake gets no step, and what a design cannot separate is said."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from posbias.schemas import FakeSpec, ModelInfo
from posbias.schemas.explanation import Explanation
from posbias.service.explain import explain_curve

EFFECTS = {"question_effect": 0.3, "prompt_effect": 0.15}
WINDOWED = ModelInfo(name="sim", num_layers=4, sliding_window=600, sliding_window_layers=(0, 2))


def _explain(
    coverage: ModuleType, fake: FakeSpec, *, seed: int, info: ModelInfo | None = None, **design: object
) -> Explanation:
    rng = np.random.default_rng(seed)
    layout = coverage.design_layout(
        n=10, iterations=200, lengths=coverage.block_lengths(rng), rng=rng, **design
    )
    data = coverage.design_answers(fake, layout, coverage.World.draw(rng, prompts=200), rng=rng)
    return explain_curve(data, model="sim", info=info, resamples=300)


def _moving(explanation: Explanation) -> set[str]:
    return {e.name for e in explanation.effects if e.distinguishable}


def test_a_fake_driven_by_the_answer_slot_is_attributed_to_it(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, depends_on="answer-slot", **EFFECTS)
    found = _explain(coverage, fake, seed=1, order="random")
    assert _moving(found) == {"answer slot"}
    slot = next(e for e in found.effects if e.name == "answer slot")
    assert slot.effect is not None and slot.effect.low is not None and slot.effect.high is not None
    assert slot.effect.low <= 0.3 <= slot.effect.high
    assert found.verdict.startswith("Moves the curve: answer slot")


def test_a_fake_with_a_step_at_its_window_is_attributed_to_distance_and_the_step_located(
    coverage: ModuleType,
) -> None:
    fake = FakeSpec(first=0.7, last=0.3, depends_on="token-distance", window=600, **EFFECTS)
    found = _explain(coverage, fake, seed=2, info=WINDOWED, order="random", filler=(0, 800))
    assert _moving(found) == {"token distance"}
    step = found.window
    assert step is not None and step.tested and step.found and step.jump is not None
    assert (
        step.jump.low is not None and step.jump.high is not None and step.jump.low <= -0.4 <= step.jump.high
    )
    assert step.break_interval is not None and step.window_in_interval
    assert step.break_interval[0] < 600 <= step.break_interval[1]
    assert (
        "A step at the sliding window (600 tokens)" in found.verdict
        and "which includes the window" in found.verdict
    )


def test_a_fake_driven_by_position_alone_gets_no_distance_step(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, window=600, **EFFECTS)
    found = _explain(coverage, fake, seed=3, info=WINDOWED, order="random", filler=(0, 800))
    assert _moving(found) == {"position"}
    assert found.window is not None and found.window.tested and not found.window.found
    assert found.window.break_interval is None
    assert "No step at the sliding window" in found.verdict


def test_forward_order_cannot_separate_slot_from_position_and_says_how_to(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    found = _explain(coverage, fake, seed=4, order="forward")
    slot = next(e for e in found.effects if e.name == "answer slot")
    assert slot.status == "not estimable" and slot.effect is None
    (confound,) = [c for c in found.confounds if "answer slot" in c.effects]
    assert set(confound.effects) >= {"position", "answer slot"} and confound.moves_curve
    assert "--answer-order random" in confound.fix
    assert "cannot say which" in found.verdict


def test_without_filler_position_and_distance_move_together_in_short_prompts(coverage: ModuleType) -> None:
    # Blocks of nearly one length: the distance is the position, to within a few tokens.
    rng = np.random.default_rng(5)
    lengths = np.full(coverage.POOL, 90.0) + rng.integers(0, 3, coverage.POOL)
    layout = coverage.design_layout(n=10, iterations=100, lengths=lengths, rng=rng, order="random")
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    data = coverage.design_answers(fake, layout, coverage.World.draw(rng, prompts=100), rng=rng)
    found = explain_curve(data, model="sim", resamples=100)
    (confound,) = found.confounds
    assert set(confound.effects) == {"position", "token distance"}
    assert confound.correlation is not None and confound.correlation < -0.95
    assert "--filler-tokens" in confound.fix


def test_the_probe_design_holds_the_slot_fixed(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    found = _explain(coverage, fake, seed=6, probe=True)
    slot = next(e for e in found.effects if e.name == "answer slot")
    assert slot.status == "held fixed"
    assert found.answers == 200


def test_a_window_no_answer_reaches_is_not_tested(coverage: ModuleType) -> None:
    fake = FakeSpec(first=0.3, last=0.6, **EFFECTS)
    far = ModelInfo(name="sim", num_layers=4, sliding_window=100_000, sliding_window_layers=(0, 2))
    found = _explain(coverage, fake, seed=7, info=far, order="random")
    assert found.window is not None and not found.window.tested
    assert found.window.note is not None and "do not straddle the window" in found.window.note
