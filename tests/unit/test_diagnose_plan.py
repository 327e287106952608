"""`posbias diagnose`'s plan: from a model's config facts alone, the jobs that separate the suspects."""

from __future__ import annotations

import pytest

from posbias.schemas import FakeSpec, ModelInfo, PosbiasError
from posbias.schemas.diagnosis import Line
from posbias.service.diagnose import battery as battery_rules
from posbias.service.diagnose import plan_battery, stored_battery

GEMMA2 = ModelInfo(
    name="google/gemma-2-2b-it",
    num_layers=26,
    sliding_window=4096,
    sliding_window_layers=tuple(range(0, 26, 2)),
    rope_theta=10000.0,
    context_length=8192,
    num_parameters=2_600_000_000,
)
LLAMA = ModelInfo(name="llama", num_layers=16, rope_theta=500000.0, context_length=131072)


def test_a_model_with_a_window_gets_filler_on_both_sides_of_it_and_global_only() -> None:
    battery = plan_battery(GEMMA2, budget=4000)
    lines = [job.line for job in battery.jobs]
    assert lines == [Line.behaviour, Line.intervention, Line.mechanism, Line.mechanism, Line.mechanism]
    behaviour = battery.jobs[0].spec
    assert behaviour.answer_order.value == "random"
    assert behaviour.filler is not None and behaviour.filler.tokens == (0, 3277)
    assert battery.jobs[1].spec.names == ("baseline", "global-only", "rope-base:x4")
    assert battery.jobs[1].spec.seed != behaviour.seed  # independent trials for an independent line
    hf = [job.spec.engine for job in battery.jobs[2:4]]
    assert [e.name for e in hf] == ["hf", "hf"] and [e.position_gap for e in hf] == [None, 2048]
    # The attention is scored against answers of the same trials that the model gave (not a sheet).
    plain, scored = battery.jobs[2].spec, battery.jobs[4].spec
    assert scored.engine.name == "vllm" and scored.seed == plain.seed
    assert scored.iterations == plain.iterations and scored.filler == plain.filler
    assert battery.total_trials <= 4000


def test_a_model_without_a_window_gets_no_global_only_and_a_far_filler() -> None:
    battery = plan_battery(LLAMA, budget=2000)
    assert battery.jobs[1].spec.names == ("baseline", "rope-base:x4")
    filler = battery.jobs[0].spec.filler
    assert filler is not None and filler.tokens == (0, 4096)


def test_the_plan_is_the_same_for_the_same_facts_and_budget() -> None:
    a, b = plan_battery(GEMMA2, budget=4000), plan_battery(GEMMA2, budget=4000)
    assert [j.key for j in a.jobs] == [j.key for j in b.jobs]
    assert [j.key for j in plan_battery(GEMMA2, budget=5000).jobs] != [j.key for j in a.jobs]


def test_a_budget_too_small_names_the_least_that_works() -> None:
    with pytest.raises(PosbiasError, match=r"give --budget [\d,]+ or more"):
        plan_battery(GEMMA2, budget=100)


def test_the_fake_gets_its_mechanism_variants_and_no_hf_job() -> None:
    fake = FakeSpec.model_validate({"window": 1000, "mechanism": {"window_step": 0.3}})
    from posbias.workers.fake_engine import fake_model_info

    battery = plan_battery(fake_model_info(fake, model="fake/w"), engine="fake", budget=600, fake=fake)
    assert [job.line for job in battery.jobs] == [Line.behaviour, Line.intervention]
    assert battery.jobs[1].spec.names == ("baseline", "global-only", "rope-base:x4", "gap-4096")
    spec = battery.jobs[1].spec
    assert (
        spec.fake_for(spec.variant("global-only")).accuracy_of(position=1, batch_size=2, distance=2000) == 0.7
    )
    assert spec.fake_for(spec.variant("baseline")).accuracy_of(
        position=1, batch_size=2, distance=2000
    ) == pytest.approx(0.4)
    assert "records no attention" in battery.notes[0]


def test_a_fake_without_a_mechanism_cannot_take_a_named_intervention() -> None:
    from posbias.schemas import JobSpec

    with pytest.raises(PosbiasError, match="no architecture to change"):
        JobSpec.build({"model": "f", "engine": {"name": "fake"}, "variants": ["baseline", "global-only"]})


def test_a_fresh_plan_that_differs_says_how_and_replan_keys_only_what_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What `posbias diagnose` prints when a newer planner would plan the stored battery's command otherwise
    (issue 41), and the keys `--replan` gives: a job the two plans share keeps its key."""
    stored = plan_battery(GEMMA2, budget=4000)
    monkeypatch.setattr(battery_rules, "MECHANISM_SHARE", 31)  # a newer rule: the mechanism jobs take more
    fresh = plan_battery(GEMMA2, budget=4000)
    change = stored_battery.plan_change(stored, fresh)
    assert change is not None
    named = dict(part.split(": ", 1) for part in change.split("; "))
    assert set(named) == {"behaviour", "intervention", "mechanism", "mechanism-gap", "mechanism-scored"}
    assert named["mechanism"] == f"iterations {fresh.jobs[2].spec.iterations}, not 64"
    assert stored_battery.plan_change(stored, stored) is None

    keep = {"behaviour": stored.jobs[0].key}
    replanned = stored_battery.rekeyed(fresh, keep=keep)
    assert replanned.jobs[0].key == stored.jobs[0].key
    others = {job.key for job in replanned.jobs[1:]}
    assert not others & {job.key for job in stored.jobs}
    assert all(key.startswith(f"diagnose/{fresh.digest}-") for key in others)
    assert stored_battery.rekeyed(fresh, keep=keep) == replanned, "the same replan twice: the same keys"
