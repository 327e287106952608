"""diagnose's mechanism line on built records (explain's attention section, a position gap's change), and
what a `cannot tell` says would settle it, at what cost."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from posbias.schemas import FakeSpec, Interval, ModelInfo
from posbias.schemas.attention import AttentionAuroc, AttentionExplanation, LayerKind
from posbias.schemas.diagnosis import Call, Diagnosis, Finding, Line, Suspect, SuspectVerdict
from posbias.service.diagnose import diagnosis_page, mechanism, plan_battery, settle
from posbias.service.stats.attention_gap import gap_change
from posbias.workers.fake_engine import fake_model_info

GEMMA2 = ModelInfo(
    name="google/gemma-2-2b-it",
    num_layers=26,
    sliding_window=4096,
    sliding_window_layers=tuple(range(0, 26, 2)),
    rope_theta=10000.0,
    context_length=8192,
    num_parameters=2_600_000_000,
)
WINDOW = 4096


def _attention(
    auroc: float | None, low: float | None, high: float | None, *, beyond: float | None = 0.0
) -> AttentionExplanation:
    return AttentionExplanation(
        model="m",
        job_id=3,
        scored_job_id=5,
        variant="baseline",
        window=WINDOW,
        bands=(),
        sliding_beyond_max=beyond,
        aurocs=(
            AttentionAuroc(
                layer_kind=LayerKind.sliding,
                strata=10,
                trials=32,
                correct=150,
                wrong=170,
                auroc=auroc,
                low=low,
                high=high,
            ),
        ),
    )


def _window(attention: AttentionExplanation) -> Finding:
    evidence = mechanism.MechanismEvidence(plain_job=3, attention=attention)
    return mechanism.finding(Suspect.window, evidence, window=WINDOW)


def test_attention_the_sliding_layers_lose_that_predicts_correctness_implicates_the_window() -> None:
    found = _window(_attention(0.62, 0.56, 0.68))
    assert found.call is Call.implicated and found.unit == "AUROC"
    assert found.effect == Interval(estimate=0.62, low=0.56, high=0.68)
    assert found.job_ids == (3, 5)
    assert "beyond the 4,096-token window" in found.reason


def test_attention_that_predicts_nothing_rules_the_window_out_within_its_bound() -> None:
    found = _window(_attention(0.51, 0.45, 0.57))
    assert found.call is Call.ruled_out and found.bound == pytest.approx(0.07)
    wide = _window(_attention(0.52, 0.38, 0.66))
    assert wide.call is Call.cannot_tell
    against = _window(_attention(0.40, 0.33, 0.47))
    assert against.call is Call.cannot_tell and "not what a window does" in against.reason


def test_no_answer_beyond_the_window_is_a_design_to_change_not_a_budget() -> None:
    found = _window(_attention(0.6, 0.55, 0.65, beyond=None))
    assert found.call is Call.cannot_tell and found.settle is not None and "filler" in found.settle
    battery = plan_battery(GEMMA2, budget=2000)
    kept = settle.settled(found, battery=battery, tokens=3000.0, bounds={}, more=".")
    assert kept.settle == found.settle and "--budget" not in (kept.settle or "")


def test_a_sliding_layer_that_attends_past_its_window_is_no_mask_to_call() -> None:
    found = _window(_attention(0.7, 0.6, 0.8, beyond=0.2))
    assert found.call is Call.cannot_tell and "not the mask the config states" in found.reason


def _gap(
    ratio: float, *, trials: int = 32, spread: float = 0.3, seed: int = 0
) -> mechanism.MechanismEvidence:
    """Own-question attention of 8 positions on 2 global layers per trial, varying by trial, and the gap's
    copy scaled by `ratio` with noise of its own."""
    rng = np.random.default_rng(seed)
    plain, gapped = {}, {}
    for trial in range(trials):
        level = rng.lognormal(-3.0, 0.5)
        for position in range(1, 9):
            for layer in (1, 3):
                value = level * rng.lognormal(0.0, 0.3)
                plain[trial, position, layer] = value
                gapped[trial, position, layer] = value * ratio * rng.lognormal(0.0, spread)
    change = gap_change(plain, gapped)
    return mechanism.MechanismEvidence(plain_job=3, attention=None, gap_job=4, gap=change, position_gap=4096)


def test_a_gap_that_takes_attention_off_the_question_implicates_rope_and_is_read_as_summed() -> None:
    evidence = _gap(0.5)
    gap = evidence.gap
    assert gap is not None and gap.trials == 32 and gap.pairs == 32 * 8 * 2
    assert gap.change == pytest.approx(100 * (gap.gapped / gap.plain - 1))
    assert gap.low is not None and gap.high is not None and gap.low < gap.change < gap.high < 0
    found = mechanism.finding(Suspect.rope, evidence, window=WINDOW)
    assert found.call is Call.implicated and found.unit == "%" and found.job_ids == (3, 4)
    assert "4,096 tokens" in found.reason


def test_a_gap_that_changes_nothing_rules_rope_out_and_too_few_trials_give_no_interval() -> None:
    found = mechanism.finding(Suspect.rope, _gap(1.0, trials=200, spread=0.05), window=WINDOW)
    assert found.call is Call.ruled_out and found.bound is not None and found.bound <= mechanism.GAP_BOUND
    # A change that is surely there and surely too small to matter (the tiny random Gemma 2's gap: -0.04%,
    # -0.07% to -0.001%) is ruled out, not implicated.
    slight = _gap(0.97, trials=200, spread=0.01)
    assert slight.gap is not None and slight.gap.high is not None and slight.gap.high < 0
    assert mechanism.finding(Suspect.rope, slight, window=WINDOW).call is Call.ruled_out
    few = _gap(0.5, trials=10)
    assert few.gap is not None and few.gap.low is None
    assert mechanism.finding(Suspect.rope, few, window=WINDOW).call is Call.cannot_tell
    raised = mechanism.finding(Suspect.rope, _gap(1.5), window=WINDOW)
    assert raised.call is Call.cannot_tell and "not what a decay does" in raised.reason


def test_attention_has_no_lever_on_slot_position_or_collapse_and_the_fake_records_none() -> None:
    evidence = _gap(0.5)
    for suspect in (Suspect.slot, Suspect.position, Suspect.collapse):
        assert mechanism.finding(suspect, evidence, window=WINDOW).call is Call.not_tested
    assert mechanism.finding(Suspect.window, None, window=WINDOW).call is Call.not_tested


def _budget(text: str) -> int:
    found = re.search(r"--budget (\d+)", text)
    assert found is not None, text
    return int(found.group(1))


@pytest.mark.parametrize(
    ("effect", "bound", "target"),
    [
        (Interval(estimate=1.0, low=-11.0, high=13.0), 10.0, 9.0),  # ruled out once +/-9 wide
        (Interval(estimate=-7.0, low=-19.0, high=5.0), 10.0, 7.0),  # implicated once +/-7 wide
    ],
)
def test_cannot_tell_names_the_budget_that_narrows_the_interval_enough_to_decide(
    effect: Interval, bound: float, target: float
) -> None:
    battery = plan_battery(GEMMA2, budget=2000)
    more = "more iterations (a larger --budget) would narrow it"
    finding = Finding(
        line=Line.behaviour,
        call=Call.cannot_tell,
        measure="position, first to last (explain)",
        effect=effect,
        reason=f"effects up to +/-13.0 points fit the data: {more}",
    )
    done = settle.settled(finding, battery=battery, tokens=3000.0, bounds={Line.behaviour: bound}, more=more)
    assert done.reason == "effects up to +/-13.0 points fit the data"
    assert done.settle is not None and done.settle.startswith(
        "`posbias diagnose google/gemma-2-2b-it --budget "
    )
    budget = _budget(done.settle)
    # Half-widths shrink as 1/sqrt(trials), and trials grow with the budget: the budget named reaches the
    # target, and rounding (two significant figures) adds at most 10% to the least that does.
    half = (effect.high - effect.low) / 2  # type: ignore[operator]
    assert half * math.sqrt(2000 / budget) <= target
    assert budget <= 1.1 * 2000 * (half / target) ** 2
    more_trials = battery.total_trials * (budget / 2000 - 1)
    assert f"about {round(more_trials):,} more trials" in done.settle
    assert f"~{more_trials * 3000 / 1e6:.1f}M prompt tokens" in done.settle


def test_the_fake_s_command_carries_its_settings_and_a_decided_finding_keeps_its_reason() -> None:
    fake = FakeSpec.model_validate({"window": 1000, "mechanism": {"window_step": 0.3}})
    battery = plan_battery(fake_model_info(fake, model="fake/w"), engine="fake", budget=400, fake=fake)
    text = settle.by_budget(half=12.0, off=0.0, bound=10.0, battery=battery, tokens=None, unit="points")
    assert text.startswith(
        '`posbias diagnose fake/w --engine fake --fake \'{"window": 1000, "mechanism": '
        '{"window_step": 0.3}}\' --budget 580`'
    )
    decided = Finding(line=Line.behaviour, call=Call.implicated, measure="m", reason="r")
    assert settle.settled(decided, battery=battery, tokens=None, bounds={}, more="x") == decided


def test_the_page_shows_what_would_settle_a_cannot_tell_and_the_unit_of_a_number() -> None:
    findings = (
        Finding(
            line=Line.mechanism,
            call=Call.cannot_tell,
            measure="sliding AUROC",
            effect=Interval(estimate=0.52, low=0.38, high=0.66),
            unit="AUROC",
            reason="AUROCs from 0.38 to 0.66 fit the data",
            settle="`posbias diagnose m --budget 4000` (about 2,000 more trials)",
            job_ids=(3, 5),
        ),
    )
    verdict = SuspectVerdict(
        suspect=Suspect.window, call=Call.cannot_tell, agreement="no line decides", findings=findings
    )
    diagnosis = Diagnosis(model="m", batch_size=10, job_ids=(3, 5), suspects=(verdict,), summary="s.")
    page = diagnosis_page(diagnosis)
    assert "+0.52 (+0.38 to +0.66) AUROC" in page
    assert "to settle:</i> `posbias diagnose m --budget 4000` (about 2,000 more trials)" in page


def test_a_mechanism_line_that_cannot_tell_names_a_budget_in_its_own_unit() -> None:
    battery = plan_battery(GEMMA2, budget=2000)
    wide = _window(_attention(0.56, 0.40, 0.72))  # half-width 0.16 against 0.5 +/- 0.1: off 0.06
    assert wide.call is Call.cannot_tell and wide.settle is None
    done = settle.settled(wide, battery=battery, tokens=None, bounds={}, more=".")
    assert done.settle is not None and done.settle.endswith("would narrow it to +/-0.06 AUROC")
    assert 0.16 * math.sqrt(2000 / _budget(done.settle)) <= 0.06
