"""The answer-rows attention (`workers/hf_attention.py`) against transformers' eager attention, on tiny random
models built in memory that carry what the real ones do: Gemma 2's logit softcapping (made strong here, so
a softcap ignored would show) and `query_pre_attn_scalar`, Gemma 3's query/key norms and two RoPE bases,
sliding windows, grouped-query heads (4 query heads on 2 or 1 key heads), a position gap, and a
packed-sequence split that transformers reads from the position ids when no mask is given. The weights, the
masses and the logits must match eager's in float32; the map held is the answer rows', not the whole
sequence's; the mask canary, which reads every row, reads them a block at a time and finds what the whole
maps say."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from support.eager_attention import eager

from posbias.workers.hf_attention import Recorder, layout, recording, register

TOLERANCE = 1e-5
"""Largest difference allowed with eager, float32 on CPU (measured: 0 on Gemma 2, whose softcapped layers
are computed as eager computes them; about 5e-7 elsewhere, where torch's fused attention gives the layer
outputs)."""

LENGTH = 96
WINDOW = 16


def tiny(architecture: str) -> Any:
    from transformers import AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig

    common: dict[str, Any] = {
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 4096,
    }
    if architecture == "gemma2":
        config: Any = Gemma2Config(
            **common,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * 2,
            query_pre_attn_scalar=24,
            attn_logit_softcapping=1.0,
        )
    elif architecture == "gemma3":
        config = Gemma3TextConfig(
            **common | {"num_key_value_heads": 1},
            sliding_window=WINDOW,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            query_pre_attn_scalar=32,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            },
        )
    else:
        config = LlamaConfig(**common | {"num_key_value_heads": 1})
    config._attn_implementation = register()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random weights this small give near-uniform attention; larger query and key weights make it peaked, so
    # a wrong mask, scale or softcap moves the masses by far more than the tolerance.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(8.0)
            layer.self_attn.k_proj.weight.mul_(8.0)
    return model.eval()


def run(
    model: Any, *, reference: bool, positions: list[int] | None, explicit_mask: bool
) -> tuple[Recorder, torch.Tensor]:
    """Every layer's whole map (`raw`), the masses of three answer lines, and the logits."""
    where = layout(
        LENGTH,
        sink_end=2,
        questions=[(4, 20), (20, 50), (50, 70)],
        answers_start=80,
        lines=[(1, range(80, 84)), (2, range(84, 90)), (3, range(90, 96))],
        window=WINDOW,
    )
    recorder = Recorder(layout=where, raw={})
    ids = torch.randint(0, 128, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode(), recording(model, recorder), eager(model) if reference else nullcontext():
        output = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids) if explicit_mask else None,
            position_ids=None if positions is None else torch.tensor([positions]),
            use_cache=False,
        )
    return recorder, output.logits[0]


@pytest.mark.parametrize("architecture", ["gemma2", "gemma3", "llama"])
@pytest.mark.parametrize(
    ("gap", "explicit_mask"), [(None, True), (1000, True), (1000, False)], ids=["plain", "gap", "packed"]
)
def test_the_answer_rows_weigh_as_eager_attention_does(
    architecture: str, gap: int | None, explicit_mask: bool
) -> None:
    model = tiny(architecture)
    positions = None if gap is None else [i if i < 60 else i + gap for i in range(LENGTH)]
    ours, logits = run(model, reference=False, positions=positions, explicit_mask=explicit_mask)
    theirs, expected = run(model, reference=True, positions=positions, explicit_mask=explicit_mask)
    assert float((logits - expected).abs().max()) < TOLERANCE
    assert ours.raw is not None and theirs.raw is not None and ours.raw.keys() == theirs.raw.keys()
    for layer in ours.raw:
        assert ours.raw[layer].shape == theirs.raw[layer].shape
        assert float((ours.raw[layer] - theirs.raw[layer]).abs().max()) < TOLERANCE, layer
    for layer, masses in ours.layers.items():
        other = theirs.layers[layer]
        assert float((masses.regions - other.regions).abs().max()) < TOLERANCE
        assert masses.beyond is not None and other.beyond is not None
        assert float((masses.beyond - other.beyond).abs().max()) < TOLERANCE
    if architecture != "llama":
        # The sliding layers give exactly nothing beyond the window, in both.
        assert float(ours.layers[0].beyond.abs().max()) == 0.0  # type: ignore[union-attr]
    if not explicit_mask:
        # Without a mask transformers reads the jump as a new sequence: both cut the prompt there.
        assert float(ours.raw[3][:, 70, :60].sum()) == 0.0


def test_only_the_answer_rows_are_held() -> None:
    model = tiny("gemma3")
    where = layout(
        LENGTH, sink_end=1, questions=[(4, 40)], answers_start=80, lines=[(1, range(80, 86))], window=WINDOW
    )
    ids = torch.randint(0, 128, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    held = {}
    for name in ("rows", "eager"):
        recorder = Recorder(layout=where)
        with (
            torch.inference_mode(),
            recording(model, recorder),
            eager(model) if name == "eager" else nullcontext(),
        ):
            model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
        held[name] = recorder.map_bytes_peak
    # 4 heads x 6 answer rows x 96 keys in float32, against eager's 4 x 96 x 96.
    assert held == {"rows": 4 * 6 * LENGTH * 4, "eager": 4 * LENGTH * LENGTH * 4}


def test_the_canary_reads_the_whole_map_a_block_of_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from posbias.workers import hf_attention
    from posbias.workers.hf_canary import attention_maps, canary_ids, read_layers

    model = tiny("gemma2")
    ids = canary_ids(3 * WINDOW, vocab_size=128, first=None)
    maps = attention_maps(model, ids)  # whole maps, kept: a short prompt only
    monkeypatch.setattr(hf_attention, "CHUNK_BYTES", 4 * 4 * 3 * WINDOW * 5)  # blocks of 5 rows
    backs = [WINDOW, 2 * WINDOW, WINDOW, 2 * WINDOW]
    stats = read_layers(model, ids, backs=backs, patterns=True)
    rows, keys = torch.arange(3 * WINDOW).view(-1, 1), torch.arange(3 * WINDOW).view(1, -1)
    for layer, weights in maps.items():
        back = backs[layer]
        beyond = float((weights * (rows - keys >= back)).sum(dim=-1).max())
        edge_rows = torch.arange(back - 1, 3 * WINDOW)
        edge = float(weights[:, edge_rows, edge_rows - (back - 1)].max(dim=0).values.min())
        assert stats[layer].beyond == pytest.approx(beyond, abs=TOLERANCE)
        assert stats[layer].edge == pytest.approx(edge, abs=TOLERANCE)
        attended = weights != 0
        assert torch.equal(stats[layer].pattern[..., 2], attended.sum(dim=-1))
    assert stats[0].beyond == 0.0 and stats[1].beyond > 0.0  # sliding, then global
