"""Variants on the real vLLM CPU engine with the tiny Gemma 2, Gemma 3 and Llama: each is resolved from the
model's config as at submit, loaded with its hf_overrides, and checked against what vLLM built, layer by
layer; the canary shows that a changed window changes how the model reads a text longer than the window and
nothing shorter; a job of two variants runs from submit to a paired comparison on SQLite and PostgreSQL.

Every variant is an engine of its own (a load costs a few seconds once the architecture has been seen), so
each test loads only the variants it needs and closes them; the published tiny Gemma 2 and Llama are the
session's engines, which stay open around them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from engine_helpers import GEMMA2_MAX_MODEL_LEN, GEMMA2_WINDOW, GEMMA3_WINDOW, quiz_prompt

from posbias.schemas import (
    CurveQuery,
    EngineOptions,
    JobSpec,
    JobStatus,
    LayerConfig,
    PosbiasError,
    ShardResult,
    Variant,
    WorkerConfig,
)
from posbias.service.reports import curves
from posbias.service.settings import Settings
from posbias.service.stats import queries
from posbias.service.store import rows
from posbias.service.store.database import Database
from posbias.service.work import jobs, queue, submission
from posbias.workers import variants
from posbias.workers.engine import Engine
from posbias.workers.loader import load_engine
from posbias.workers.shard import run_shard
from posbias.workers.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

OPTIONS = EngineOptions(max_model_len=GEMMA2_MAX_MODEL_LEN)
SAME = 1e-3
"""Prompt log-probabilities closer than this read the same (float32 kernels, other summation orders)."""


def resolved(folder: Path, *specs: str | dict[str, Any], cache_dir: Path) -> list[Variant]:
    """The variants as submit fills them in from the model's config."""
    config = variants.read_config(str(folder), cache_dir=cache_dir)
    return list(variants.resolve([Variant.model_validate(s) for s in specs], config))


def load(folder: Path, variant: Variant, *, config: WorkerConfig) -> VllmEngine:
    return VllmEngine(str(folder), variant=variant, options=OPTIONS, config=config)


def canary(engine: VllmEngine, *, tokens: int) -> list[float]:
    """The prompt log-probabilities of the first `tokens` tokens of a long quiz (the first has none)."""
    ids = engine.tokenizer.encode(quiz_prompt(12, seed=3), add_special_tokens=True).ids[:tokens]
    assert len(ids) == tokens
    return [value for value in engine.prompt_logprobs(ids)[1:] if value is not None]


def first_change(a: Sequence[float], b: Sequence[float]) -> int | None:
    """The first token (1-based, as in the prompt) whose log-probability differs, None if none does."""
    return next((i + 1 for i, (x, y) in enumerate(zip(a, b, strict=True)) if abs(x - y) > SAME), None)


class Reading(NamedTuple):
    """What the published model built, and how it reads the canary texts."""

    layers: LayerConfig | None
    short: list[float]
    long: list[float]


@pytest.fixture(scope="module")
def gemma2_baseline(gemma2_engine: VllmEngine) -> Reading:
    """The published tiny Gemma 2, read once: the session's engine, which is the baseline variant (no config
    changes) with this module's context."""
    assert gemma2_engine.max_model_len == OPTIONS.max_model_len
    short, long = canary(gemma2_engine, tokens=20), canary(gemma2_engine, tokens=4 * GEMMA2_WINDOW)
    return Reading(gemma2_engine.layers, short, long)


@pytest.mark.parametrize(
    ("name", "windows", "changes_after"),
    [("global-only", (None,) * 4, GEMMA2_WINDOW), ("window:24", (24, None, 24, None), 24)],
)
def test_gemma2_variant_is_built_as_asked_and_changes_only_what_lies_past_the_window(
    name: str,
    windows: tuple[int | None, ...],
    changes_after: int,
    tiny_gemma2_dir: Path,
    worker_config: WorkerConfig,
    cache_dir: Path,
    gemma2_baseline: Reading,
) -> None:
    # The published model, as vLLM built it: a window of 64 on layers 0 and 2 (read from the kernels).
    assert gemma2_baseline.layers == LayerConfig(windows=(64, None, 64, None), rope_theta=(10000.0,) * 4)
    [variant] = resolved(tiny_gemma2_dir, name, cache_dir=cache_dir)
    assert variant.expect == LayerConfig(windows=windows, rope_theta=(10000.0,) * 4)
    engine = load(tiny_gemma2_dir, variant, config=worker_config)
    try:
        built = engine.layers
        info = engine.model_info
        short, long = canary(engine, tokens=20), canary(engine, tokens=4 * GEMMA2_WINDOW)
    finally:
        engine.close()
    assert built == variant.expect
    # What the store records for the model: the layers as built, and the config changes that built them.
    assert info.layers == built and info.hf_overrides == variant.hf_overrides
    assert info.sliding_window_layers == ((0, 2) if windows[0] else None)
    # The canary: a text shorter than both windows reads the same; a longer one changes from where the
    # narrower window stops reaching back, and not before.
    assert first_change(gemma2_baseline.short, short) is None
    changed = first_change(gemma2_baseline.long, long)
    assert changed is not None and changes_after - 1 <= changed <= changes_after + 2, changed


def test_gemma3_variants_are_built_as_asked_and_a_silently_ignored_override_is_refused(
    tiny_gemma3_dir: Path, worker_config: WorkerConfig, cache_dir: Path
) -> None:
    local, full = 10_000.0, 1_000_000.0
    w = GEMMA3_WINDOW
    found = resolved(
        tiny_gemma3_dir,
        "baseline",
        "global-only",
        "window:16",
        "pattern:2:1",
        "rope-base:x4",
        # A flat rope_theta: transformers 5's Gemma 3 reads rope_parameters, so vLLM builds the old bases.
        {"name": "flat-theta", "hf_overrides": {"rope_theta": 50_000.0}},
        cache_dir=cache_dir,
    )
    expected = {
        "baseline": None,  # the model as published: recorded, not checked
        "global-only": LayerConfig(windows=(None,) * 6, rope_theta=(full,) * 6),
        "window:16": LayerConfig(windows=(16,) * 5 + (None,), rope_theta=(local,) * 5 + (full,)),
        "pattern:2:1": LayerConfig(
            windows=(w, w, None, w, w, None), rope_theta=(local, local, full, local, local, full)
        ),
        "rope-base:x4": LayerConfig(windows=(w,) * 5 + (None,), rope_theta=(local,) * 5 + (4 * full,)),
        "flat-theta": LayerConfig(windows=(w,) * 5 + (None,), rope_theta=(50_000.0,) * 6),
    }
    assert {v.name: v.expect for v in found} == expected
    built: dict[str, LayerConfig | None] = {}
    readings: dict[str, list[float]] = {}
    for variant in found[:-1]:
        engine = load(tiny_gemma3_dir, variant, config=worker_config)
        try:
            built[variant.name] = engine.layers
            if variant.name in ("baseline", "window:16"):
                readings[variant.name] = canary(engine, tokens=3 * w)
        finally:
            engine.close()
    assert built["baseline"] == LayerConfig(windows=(w,) * 5 + (None,), rope_theta=(local,) * 5 + (full,))
    assert {name: built[name] for name in expected if name not in ("baseline", "flat-theta")} == {
        name: layers for name, layers in expected.items() if name not in ("baseline", "flat-theta")
    }
    changed = first_change(readings["baseline"], readings["window:16"])
    assert changed is not None and 15 <= changed <= 18, changed

    with pytest.raises(PosbiasError) as refused:
        load(tiny_gemma3_dir, found[-1], config=worker_config)
    message = str(refused.value)
    assert message.startswith("variant flat-theta asked for window 48 on layers 0-4 of 6; RoPE base 50000")
    assert "vLLM built window 48 on layers 0-4 of 6; RoPE base 10000 on layers 0-4, 1000000 on layers 5" in (
        message
    )
    assert "layer 0: 10000 (asked 50000)" in message and "refusing to run it" in message


def test_llama_takes_a_rope_base_and_refuses_window_variants_with_what_it_supports(
    tiny_llama_dir: Path, worker_config: WorkerConfig, cache_dir: Path, llama_engine: VllmEngine
) -> None:
    for name in ("global-only", "window:32", "pattern:5:1"):
        with pytest.raises(PosbiasError) as refused:
            resolved(tiny_llama_dir, name, cache_dir=cache_dir)
        assert str(refused.value).startswith(f"variant {name}: LlamaForCausalLM ")
        assert str(refused.value).endswith(
            "it supports baseline, rope-base:<value>, rope-base:x<factor>, a raw hf_overrides mapping"
        )
    [variant] = resolved(tiny_llama_dir, "rope-base:x2", cache_dir=cache_dir)
    assert variant.hf_overrides == {"rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0}}
    engine = VllmEngine(str(tiny_llama_dir), variant=variant, config=worker_config)
    try:
        built, info = engine.layers, engine.model_info
    finally:
        engine.close()
    # The published Llama has 500000 on every layer (as vLLM built it); the variant doubles it.
    assert llama_engine.layers == LayerConfig(windows=(None,) * 4, rope_theta=(500_000.0,) * 4)
    assert built == LayerConfig(windows=(None,) * 4, rope_theta=(1_000_000.0,) * 4)
    assert info.rope_theta == 1_000_000.0 and info.hf_overrides == variant.hf_overrides


# --- a job of two variants, from submit to a paired comparison ------------------------------------------


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, Engine]]:
    """Engines by model key, loaded from the first shard of each, as an actor loads its engine; shared by
    the SQLite and PostgreSQL runs of the same job spec, and closed together at the end of the module."""
    loaded: dict[str, Engine] = {}
    yield loaded
    for engine in loaded.values():
        engine.close()


def test_a_job_of_two_variants_runs_and_compares_paired(
    database_url: str,
    db: Database,
    tiny_gemma2_dir: Path,
    worker_config: WorkerConfig,
    cache_dir: Path,
    mmlu_dir: Path,
    engines: dict[str, Engine],
) -> None:
    settings = Settings(database_url=database_url, mmlu_dir=mmlu_dir, cache_dir=cache_dir)
    spec = JobSpec.model_validate(
        {
            "model": str(tiny_gemma2_dir),
            "batch_sizes": (3,),
            "iterations": 4,
            "answer_mode": "constrained",
            "variants": ["baseline", "global-only"],
        }
    )
    prepared = submission.prepare(spec, settings=settings)
    job = jobs.submit(db, prepared.spec, prepared.plan).job_id
    while leases := queue.lease(db, owner="test", limit=8, lease_seconds=600):
        results: list[ShardResult] = []
        for lease in leases:
            shard = lease.shard
            if shard.model_key not in engines:
                engines[shard.model_key] = load_engine(shard, config=worker_config)
            results.append(run_shard(shard, engine=engines[shard.model_key]))
        assert all(w.written for w in queue.complete(db, results, owner="test"))

    record = jobs.get(db, job)
    assert record.status is JobStatus.done
    runs = {v.name: v for v in record.variants}
    assert runs["baseline"].expected is None
    assert runs["baseline"].built == LayerConfig(windows=(64, None, 64, None), rope_theta=(10000.0,) * 4)
    assert runs["global-only"].expected == runs["global-only"].built
    assert runs["global-only"].built == LayerConfig(windows=(None,) * 4, rope_theta=(10000.0,) * 4)
    # The store keeps one model row per config: as published, and as global-only built it.
    models = {json_key(m.hf_overrides): m for m in queries.list_models(db) if m.name == str(tiny_gemma2_dir)}
    assert models[""].sliding_window_layers == (0, 2) and models[""].layers == runs["baseline"].built
    changed = models[json_key(runs["global-only"].hf_overrides)]
    assert changed.sliding_window is None and changed.layers == runs["global-only"].built

    comparison = curves.compare(
        db,
        CurveQuery(job_id=job, variant="baseline"),
        CurveQuery(job_id=job, variant="global-only"),
        batch_size=3,
    )
    assert comparison.method == "paired" and comparison.matched_trials == comparison.trials_a == 4
    assert len(comparison.points) == 3


def json_key(overrides: dict[str, Any]) -> str:
    return rows.overrides_key(overrides)
