"""The `hf` engine (transformers, teacher forcing, attention from the answer rows) on the tiny Gemma 2 and
Gemma 3: the same prompts as vLLM token for token, the same option probabilities on the same trials, the same
masses and probabilities as transformers' eager attention gives, a mask canary that sees the windows,
variants and the position gap, and a job from submit through the queue and Ray into the
store (Gemma 2 into SQLite, Gemma 3 into PostgreSQL), read back as `attention_curve` by layer kind."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_helpers import GEMMA2_MAX_MODEL_LEN, GEMMA2_WINDOW, GEMMA3_WINDOW
from sqlalchemy import text
from support.attention_memory import MASSES
from support.eager_attention import eager
from support.in_process import run_cli
from support.job_runs import dispatch

from posbias.schemas import (
    EngineOptions,
    JobSpec,
    JobStatus,
    LayerKind,
    PosbiasError,
    ShardSpec,
    Submitted,
    WorkerConfig,
)
from posbias.service.settings import Settings
from posbias.service.store.database import Database
from posbias.service.work import jobs, planner
from posbias.service.work.shards import shard_spec
from posbias.workers import variants
from posbias.workers.hf_canary import attention_maps, canary_ids, run_canary
from posbias.workers.hf_engine import HfEngine
from posbias.workers.prompts import render_trial
from posbias.workers.shard import run_shards
from posbias.workers.vllm_engine import VllmEngine

TOLERANCE = 1e-5
"""Largest difference allowed between an option probability of `hf` and of `vllm` (both float32 on CPU;
measured: 1.1e-7 on the tiny Gemma 2)."""


@pytest.fixture(scope="module")
def hf_gemma2(tiny_gemma2_dir: Path, worker_config: WorkerConfig) -> Iterator[HfEngine]:
    engine = HfEngine(str(tiny_gemma2_dir), options=EngineOptions(name="hf"), config=worker_config)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_gemma3(tiny_gemma3_dir: Path, worker_config: WorkerConfig) -> Iterator[HfEngine]:
    engine = HfEngine(str(tiny_gemma3_dir), options=EngineOptions(name="hf"), config=worker_config)
    yield engine
    engine.close()


def shards_of(model: Path, pool: Any, **fields: Any) -> list[ShardSpec]:
    values: dict[str, Any] = {
        "model": str(model),
        "batch_sizes": (3, 8),
        "iterations": 2,
        "shard_size": 4,
        "answer_mode": "constrained",
        **fields,
    }
    spec = JobSpec.model_validate(values)
    plan = planner.plan(spec, pool=pool)
    return [
        shard_spec(
            spec,
            job_id=1,
            shard_id=planned.index,
            trials=[plan.trials[i] for i in planned.trial_indices],
            questions=plan.questions,
        )
        for planned in plan.shards
    ]


# --- the same prompts and the same probabilities as vLLM ---------------------------------------------


@pytest.mark.vllm
def test_prompts_are_vllms_token_for_token_and_the_option_probabilities_agree(
    gemma2_engine: VllmEngine, hf_gemma2: HfEngine, tiny_gemma2_dir: Path, pool: Any
) -> None:
    vllm_engine = {"name": "vllm", "max_model_len": GEMMA2_MAX_MODEL_LEN}
    on_vllm = shards_of(tiny_gemma2_dir, pool, engine=vllm_engine)
    on_hf = shards_of(tiny_gemma2_dir, pool, engine={"name": "hf"})
    for shard in on_hf:
        for trial in shard.trials:
            a = render_trial(trial, spec=shard, questions=shard.questions, tokenizer=gemma2_engine.tokenizer)
            b = render_trial(trial, spec=shard, questions=shard.questions, tokenizer=hf_gemma2.tokenizer)
            assert a.token_ids == b.token_ids and a.token_ids
            assert [(q.token_start, q.token_end) for q in a.questions] == [
                (q.token_start, q.token_end) for q in b.questions
            ]

    answered = run_shards(on_vllm, engine=gemma2_engine)
    # The sheet teacher-forced is what vLLM answered, so both read the same context at every slot.
    sheets = {
        trial.trial_index: {
            int(k): int(i) for k, i in re.findall(r"(?m)^(\d+)\. (\d+)", trial.output_text or "")
        }
        for result in answered
        for trial in result.trials
    }
    scored = hf_gemma2.run_shards(on_hf, answers=sheets)
    compared = 0
    for a, b in zip(answered, scored, strict=True):
        assert [(r.trial_index, r.position, r.predicted) for r in a.results] == [
            (r.trial_index, r.position, r.predicted) for r in b.results
        ]
        for ra, rb in zip(a.results, b.results, strict=True):
            assert ra.option_probs is not None and rb.option_probs is not None
            assert ra.token_distance == rb.token_distance
            assert max(abs(x - y) for x, y in zip(ra.option_probs, rb.option_probs, strict=True)) < TOLERANCE
            compared += 1
    assert compared == 2 * (3 + 8)


def test_a_shards_answers_are_the_sheet_and_a_missing_position_is_gold(
    hf_gemma2: HfEngine, tiny_gemma2_dir: Path, pool: Any
) -> None:
    # `engine.answer_sheet: {job: N}` puts job N's answers on each leased shard
    # (service/work/answer_sheets.py); the engine teacher-forces them, and the gold answer where job N did not
    # parse one.
    [shard] = shards_of(tiny_gemma2_dir, pool, engine={"name": "hf", "answer_sheet": {"job": 1}})[:1]
    trial = shard.trials[0]
    gold = [shard.questions[q].answer for q in trial.question_ids]
    given = {p: (g + 1) % 4 + 1 for p, g in enumerate(gold, start=1) if p != 2}
    [result] = hf_gemma2.run_shards([shard.model_copy(update={"answers": {trial.index: given}})])
    predicted = {r.position: r.predicted for r in result.results if r.trial_index == trial.index}
    assert predicted == {p: given[p] - 1 if p in given else gold[p - 1] for p in predicted}
    assert result.attention is not None and result.attention.answer_sheet.value == "gold"


# --- the answer rows against transformers' eager attention ---------------------------------------------


def test_a_jobs_masses_and_probabilities_are_eagers_from_the_answer_rows(
    hf_gemma2: HfEngine, hf_gemma3: HfEngine, tiny_gemma2_dir: Path, tiny_gemma3_dir: Path, pool: Any
) -> None:
    # The same engine, the same shards, the same layouts: once with the answer-rows attention, once with
    # transformers' eager attention holding every layer's whole map (the engine's reduction before).
    for engine, folder, heads in ((hf_gemma2, tiny_gemma2_dir, 2), (hf_gemma3, tiny_gemma3_dir, 2)):
        shards = shards_of(folder, pool, engine={"name": "hf"}, batch_sizes=(3, 8), iterations=1)
        ours = engine.run_shards(shards)
        with eager(engine._model):
            theirs = engine.run_shards(shards)
        compared = 0
        for a, b in zip(ours, theirs, strict=True):
            assert a.attention is not None and b.attention is not None
            assert len(a.attention.rows) == len(b.attention.rows) > 0
            for x, y in zip(a.attention.rows, b.attention.rows, strict=True):
                assert (x.trial_index, x.position, x.layer, x.layer_kind, x.query_tokens) == (
                    y.trial_index,
                    y.position,
                    y.layer,
                    y.layer_kind,
                    y.query_tokens,
                )
                for name in MASSES:
                    mine, reference = getattr(x, name), getattr(y, name)
                    assert (mine is None) == (reference is None), name
                    assert mine is None or abs(mine - reference) < TOLERANCE, (name, mine, reference)
                compared += 1
            for ra, rb in zip(a.results, b.results, strict=True):
                assert ra.option_probs is not None and rb.option_probs is not None
                assert (
                    max(abs(p - q) for p, q in zip(ra.option_probs, rb.option_probs, strict=True)) < TOLERANCE
                )
            # What was held: the answer rows' weights (heads x rows x keys), a small part of eager's map.
            assert 0 < a.attention.map_bytes_peak < b.attention.map_bytes_peak / 4
            longest = max(t.prompt_tokens or 0 for t in a.trials)
            assert b.attention.map_bytes_peak >= heads * longest**2 * 4
        assert compared == (3 + 8) * len(engine.canary.layers)


# --- the mask canary, variants and the position gap --------------------------------------------------


def test_the_canary_finds_the_windows_and_fails_on_misstated_ones(
    hf_gemma2: HfEngine, hf_gemma3: HfEngine
) -> None:
    for engine, window, sliding in (
        (hf_gemma2, GEMMA2_WINDOW, (0, 2)),
        (hf_gemma3, GEMMA3_WINDOW, (0, 1, 2, 3, 4)),
    ):
        canary = engine.canary
        assert canary.passed and canary.window == window
        assert tuple(c.layer for c in canary.layers if c.kind is LayerKind.sliding) == sliding
        assert engine.model_info.sliding_window_layers == sliding
        for check in canary.layers:
            if check.kind is LayerKind.sliding:
                assert check.beyond_mass == 0.0 and check.edge_mass > 0.0
            else:
                assert check.beyond_mass > 0.1
    # Stating the layers the other way round: the weights say otherwise, layer by layer.
    layers = hf_gemma2.model_info.layers
    assert layers is not None
    swapped = [None if w is not None else GEMMA2_WINDOW for w in layers.windows]
    wrong = run_canary(
        hf_gemma2._model, windows=swapped, rope_theta=layers.rope_theta, vocab_size=256, first=None
    )
    assert not any(check.passed for check in wrong.layers)


def test_a_global_only_variant_is_built_global_and_checked_on_hf(
    tiny_gemma3_dir: Path, worker_config: WorkerConfig, cache_dir: Path
) -> None:
    config = variants.read_config(str(tiny_gemma3_dir), cache_dir=cache_dir)
    spec = JobSpec.model_validate(
        {"model": str(tiny_gemma3_dir), "engine": {"name": "hf"}, "variants": ["baseline", "global-only"]}
    )
    [_, variant] = variants.resolve(spec.runs, config)
    engine = HfEngine(str(tiny_gemma3_dir), options=spec.engine, variant=variant, config=worker_config)
    try:
        assert engine.model_info.sliding_window_layers is None
        assert all(c.kind is LayerKind.global_ and c.beyond_mass > 0.0 for c in engine.canary.layers)
        # Every layer global takes the global layers' RoPE base, as on vLLM.
        assert {c.rope_theta for c in engine.canary.layers} == {1_000_000.0}
    finally:
        engine.close()
    stale = variant.model_copy(update={"hf_overrides": {}})  # expects global layers, asks for nothing
    with pytest.raises(PosbiasError, match="transformers built"):
        HfEngine(str(tiny_gemma3_dir), options=spec.engine, variant=stale, config=worker_config)


def test_a_position_gap_moves_rope_not_the_mask(
    tiny_gemma3_dir: Path, hf_gemma3: HfEngine, worker_config: WorkerConfig, pool: Any
) -> None:
    model = hf_gemma3._model
    ids = canary_ids(3 * GEMMA3_WINDOW, vocab_size=256, first=None)
    gapped = [i if i < len(ids) // 2 else i + 5000 for i in range(len(ids))]
    # The check can fail here: without an explicit mask this transformers cuts the prompt at the gap.
    plain, cut = (
        attention_maps(model, ids, explicit_mask=False),
        attention_maps(model, ids, positions=gapped, explicit_mask=False),
    )
    assert not torch.equal(plain[5] == 0, cut[5] == 0)

    gap = HfEngine(
        str(tiny_gemma3_dir), options=EngineOptions(name="hf", position_gap=5000), config=worker_config
    )
    try:
        assert gap.canary.position_gap_safe is True
        shards = shards_of(tiny_gemma3_dir, pool, engine={"name": "hf"}, batch_sizes=(8,))
        near, far = hf_gemma3.run_shards(shards)[0], gap.run_shards(shards)[0]
    finally:
        gap.close()
    assert near.attention is not None and far.attention is not None
    # Same tokens, same window: the sliding layers see exactly the same keys; RoPE distance changed what the
    # global layer and the answers read.
    for a, b in zip(near.attention.rows, far.attention.rows, strict=True):
        assert (a.layer_kind, a.own_mean == 0.0) == (b.layer_kind, b.own_mean == 0.0)
        assert a.beyond_window_max == b.beyond_window_max == 0.0 or a.layer_kind is LayerKind.global_
    assert any(a.option_probs != b.option_probs for a, b in zip(near.results, far.results, strict=True))


# --- a job through the queue and Ray into the store ----------------------------------------------------


@pytest.mark.usefixtures("ray_session")
def test_an_hf_job_runs_through_the_queue_and_ray_into_the_store(
    db: Database,
    make_job: Callable[..., Submitted],
    fast_settings: Callable[..., Settings],
    tiny_gemma2_dir: Path,
    tiny_gemma3_dir: Path,
    tmp_path: Path,
) -> None:
    settings = fast_settings(db.url, lease_seconds=120.0)
    # Both tiny models into each store, in one dispatch (an actor each); explain reads one of them per store.
    models = {"gemma2": (tiny_gemma2_dir, GEMMA2_WINDOW, 4), "gemma3": (tiny_gemma3_dir, GEMMA3_WINDOW, 6)}
    explained_model = "gemma2" if db.url.startswith("sqlite") else "gemma3"
    submitted = {}
    for name, (folder, _, _) in models.items():
        spec = {"model": str(folder), "engine": {"name": "hf"}, "answer_mode": "constrained"}
        submitted[name] = make_job(db, batch_sizes=(3, 8), iterations=2, shard_size=2, **spec).job_id
    # A fake-engine job of the same trials: explain pairs it with the hf job and scores its answers.
    folder = models[explained_model][0]
    paired = make_job(db, batch_sizes=(3, 8), iterations=2, shard_size=2, model=str(folder)).job_id
    dispatch(db, settings)

    with db.read() as session:
        for name, (_, window, layers) in models.items():
            job = submitted[name]
            assert jobs.get(db, job).status is JobStatus.done
            count = session.execute(text("SELECT count(*) FROM attention WHERE job_id = :j"), {"j": job})
            assert count.scalar_one() == 2 * (3 + 8) * layers
            # Sliding layers: zero mass on anything a window or more back; so an own question whose last
            # token is that far from every query row of its line gets exactly none; global layers see it.
            rows = session.execute(
                text(
                    "SELECT layer_kind, own_mean, own_max, beyond_window_max FROM attention "
                    "WHERE job_id = :j AND token_distance - query_tokens + 1 >= :w"
                ),
                {"j": job, "w": window},
            ).all()
            kinds = {kind for kind, *_ in rows}
            assert kinds == {"sliding", "global"}
            for kind, own_mean, own_max, beyond in rows:
                if kind == "sliding":
                    assert own_mean == own_max == beyond == 0.0
                else:
                    assert own_mean > 0.0 and beyond > 0.0
            curve = session.execute(
                text(
                    "SELECT layer_kind, n, "
                    "own_mean + sink_mean + other_mean + instructions_mean + answers_mean "
                    "FROM attention_curve WHERE job_id = :j AND batch_size = 8 AND position = 1"
                ),
                {"j": job},
            ).all()
            sliding = 2 if name == "gemma2" else 5
            assert {(kind, n) for kind, n, _ in curve} == {
                ("sliding", 2 * sliding),
                ("global", 2 * (layers - sliding)),
            }
            assert all(abs(total - 1.0) < 1e-4 for *_, total in curve)
            canary = session.execute(
                text("SELECT kind, passed FROM attention_layers WHERE job_id = :j ORDER BY layer"), {"j": job}
            ).all()
            assert [kind for kind, _ in canary].count("sliding") == sliding and all(p for _, p in canary)
            run = session.execute(
                text(
                    "SELECT answer_sheet, state_bytes_per_trial, map_bytes_peak FROM attention_runs "
                    "WHERE job_id = :j"
                ),
                {"j": job},
            ).one()
            assert run[0] == "gold" and run[1] > 0 and run[2] > 0

    job = submitted[explained_model]
    shown = run_cli(
        [
            "curve",
            "--metric",
            "attention",
            "--job",
            str(job),
            "--by",
            "token-distance",
            "--format",
            "json",
        ],
        env={"POSBIAS_DATABASE_URL": db.url},
        folder=tmp_path,
    )
    assert shown.code == 0, shown.stderr
    curves = json.loads(shown.stdout)
    assert {(c["batch_size"], c["layer_kind"]) for c in curves} == {
        (3, "sliding"),
        (3, "global"),
        (8, "sliding"),
        (8, "global"),
    }

    # explain's attention section, from the paired job: the bands by layer kind, the mask's zero beyond the
    # window, and the AUROC against the paired job's answers (or why there is none).
    explained = run_cli(["explain", str(paired)], env={"POSBIAS_DATABASE_URL": db.url}, folder=tmp_path)
    assert explained.code == 0, explained.stderr
    said = " ".join(explained.stdout.split())
    assert f"hf job {job}" in said
    assert "wholly beyond the window: own-question attention, largest head 0 global" in said
    assert f"predict correctness (job {paired})" in said or f"job {paired} has no position with both" in said
