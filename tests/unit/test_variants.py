"""Variants as a user writes them: names, job specs, what each becomes for a model's config, and the plan
that gives every variant the same trials. (Loading them in vLLM: tests/integration/engine.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from pydantic import ValidationError

import posbias
from posbias.schemas import JobSpec, LayerConfig, PosbiasError, QuestionPool, Variant, parse_intervention
from posbias.service.work import planner
from posbias.workers import variants

PoolFactory = Callable[..., QuestionPool]

FAKE = {"engine": {"name": "fake"}}


def spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"model": "some/model", "batch_sizes": (2,), "iterations": 3, **fields})


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("Global-Only", "global-only"),
        ("window:512", "window:512"),
        ("pattern:5:1", "pattern:5:1"),
        ("rope-base:1e6", "rope-base:1000000"),
        ("rope-base:x2.0", "rope-base:x2"),
    ],
)
def test_named_variants_are_spelt_one_way(written: str, canonical: str) -> None:
    assert Variant.model_validate(written).name == canonical


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ("window:abc", "give the window in tokens, e.g. window:2048"),
        ("pattern:5", "give sliding and global layers per group, e.g. pattern:5:1"),
        ("rope-base:0", "give a positive RoPE base or factor"),
        ("win:3", "is not a variant: use baseline, global-only, window:<tokens>"),
    ],
)
def test_a_misspelt_variant_says_how_to_write_it(written: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_intervention(written)


def test_variant_specs_are_refused_where_they_would_mislead() -> None:
    with pytest.raises(ValidationError, match="variant 'mine' changes nothing: give it hf_overrides"):
        spec(variants=["mine"])
    with pytest.raises(ValidationError, match="`baseline` is the model as published"):
        spec(variants=[{"name": "baseline", "hf_overrides": {"sliding_window": 8}}])
    with pytest.raises(ValidationError, match="variant names must differ: window:8 given twice"):
        spec(variants=["window:8", "WINDOW:8"])
    with pytest.raises(ValidationError, match=r"'sliding window' is not a config field name"):
        spec(variants=[{"name": "mine", "hf_overrides": {"sliding window": 8}}])
    with pytest.raises(ValidationError, match="the fake engine has no architecture to change"):
        spec(variants=["global-only"], **FAKE)
    with pytest.raises(ValidationError, match=r"variant late: fake\.last"):
        spec(variants=[{"name": "late", "fake": {"last": 2.0}}], **FAKE)
    with pytest.raises(ValidationError, match=r"max_model_len cannot go in engine\.extra"):
        spec(engine={"extra": {"max_model_len": 10}})


def test_engine_options_take_nested_values() -> None:
    engine = spec(
        engine={
            "hf_overrides": {"text_config": {"layer_types": ["full_attention"] * 2}},
            "extra": {"compilation_config": {"level": 0}, "enable_prefix_caching": True},
        }
    ).engine
    assert engine.hf_overrides == {"text_config": {"layer_types": ["full_attention"] * 2}}
    assert engine.extra["compilation_config"] == {"level": 0}


@pytest.mark.parametrize("engine", ["fake", "hf"])
def test_a_new_spec_with_extra_for_an_engine_that_ignores_it_is_refused(engine: str) -> None:
    # engine.extra is vllm.LLM's keyword arguments: the fake and hf engines never read them, so a new spec
    # that sets them would run without them and say nothing. A stored one still loads as it was stored.
    data = {"model": "m", "batch_sizes": [2], "engine": {"name": engine, "extra": {"k": [1]}}}
    with pytest.raises(
        PosbiasError, match=rf"engine\.extra: .* engine {engine} does not read; .*engine\.name: vllm"
    ):
        JobSpec.build(data)
    stored = JobSpec.model_validate(data)
    assert stored.engine.extra == {"k": [1]}
    with pytest.raises(PosbiasError, match=r"engine\.extra: "):
        posbias.dry_run(stored)  # the same spec given to the API as an object
    assert JobSpec.build({**data, "engine": {"name": "vllm", "extra": {"k": [1]}}}).engine.extra == {"k": [1]}


def test_each_variant_is_its_own_model_and_a_job_without_variants_keeps_its_key() -> None:
    plain = spec(**FAKE)
    late = {"name": "late", "fake": {"last": 0.1}}
    both = spec(variants=["baseline", late], **FAKE)
    assert both.model_key(both.variant("baseline")) == plain.model_key()
    assert both.model_key(both.variant("late")) != plain.model_key()
    assert both.names == ("baseline", "late") and both.total_trials == 2 * plain.total_trials


def test_every_variant_answers_the_same_trials_in_shards_of_its_own(make_pool: PoolFactory) -> None:
    job = spec(variants=["baseline", {"name": "late", "fake": {"last": 0.1}}], shard_size=2, **FAKE)
    plan = planner.plan(job, pool=make_pool(20))
    base = [t for t in plan.trials if t.variant == "baseline"]
    late = [t for t in plan.trials if t.variant == "late"]
    assert len(base) == len(late) == 3
    assert [(t.question_ids, t.choice_orders) for t in base] == [
        (t.question_ids, t.choice_orders) for t in late
    ]
    assert [t.index for t in plan.trials] == list(range(6))
    for shard in plan.shards:
        assert {plan.trials[i].variant for i in shard.trial_indices} == {shard.variant}


# --- what a variant becomes for a model's config ---------------------------------------------------------


def gemma3_multimodal() -> Any:
    """A Gemma 3 4B-style config: the layers are described under text_config."""
    from transformers import Gemma3Config

    return Gemma3Config(
        text_config={
            "num_hidden_layers": 6,
            "sliding_window": 32,
            "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
        }
    )


def test_a_multimodal_gemma3_is_changed_under_its_text_config() -> None:
    [window, rope] = variants.resolve(
        [Variant(name="window:16"), Variant(name="rope-base:x2")], gemma3_multimodal()
    )
    assert window.hf_overrides == {"text_config": {"sliding_window": 16}}
    assert window.expect == LayerConfig(windows=(16,) * 5 + (None,), rope_theta=(1e4,) * 5 + (1e6,))
    full = rope.hf_overrides["text_config"]["rope_parameters"]["full_attention"]  # type: ignore[index,call-overload]
    assert full["rope_theta"] == 2_000_000.0


def test_a_raw_override_must_name_a_field_of_the_config() -> None:
    with pytest.raises(
        PosbiasError, match=r"variant typo\.text_config: sliding_windw is not a field of gemma3_text's config"
    ):
        variants.resolve(
            [Variant.model_validate({"name": "typo", "hf_overrides": {"text_config": {"sliding_windw": 8}}})],
            gemma3_multimodal(),
        )
    with pytest.raises(
        PosbiasError, match="the layers are described under text_config: put the change there"
    ):
        variants.resolve(
            [Variant.model_validate({"name": "top", "hf_overrides": {"sliding_window": 8}})],
            gemma3_multimodal(),
        )
