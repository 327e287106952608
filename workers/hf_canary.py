"""The mask canary of a model built in transformers: what each attention layer attends over, read back from
its attention weights on a prompt longer than the window, rather than assumed from the config.

A sliding layer must give exactly zero weight to every key `window` or more tokens back and some weight to
the key `window - 1` back; a global layer must give weight beyond the window. The position-gap check runs
the prompt again with a gap in the position ids: the design may run only if no layer's mask moved (a
transformers that reads position ids as packed-sequence boundaries, or counts the window in positions,
would move it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posbias.schemas.attention import LayerCheck, LayerKind, MaskCanary
from posbias.workers.hf_attention import Recorder, recording


def canary_ids(length: int, *, vocab_size: int, first: int | None, seed: int = 0) -> list[int]:
    """A fixed pseudo-random prompt of `length` tokens (the first one `first`, e.g. BOS)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(low=0, high=vocab_size, size=(length,), generator=generator).tolist()
    if first is not None:
        ids[0] = first
    return [int(i) for i in ids]


def attention_maps(
    model: Any, ids: Sequence[int], *, positions: Sequence[int] | None = None, explicit_mask: bool = True
) -> dict[int, Any]:
    """Every layer's attention map `(heads, queries, keys)` for `ids` (a short prompt only).

    `explicit_mask`: pass an all-ones attention mask, as the engine does. Without one, transformers 5
    reads a jump in the position ids as the start of a packed sequence and masks across it, so a position
    gap would cut the prompt in two."""
    recorder = Recorder(raw={})
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
    position_ids = None
    if positions is not None:
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=device)
    with torch.inference_mode(), recording(model, recorder):
        model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids) if explicit_mask else None,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=1,
        )
    assert recorder.raw is not None
    return recorder.raw


def run_canary(
    model: Any,
    *,
    windows: Sequence[int | None],
    rope_theta: Sequence[float | None],
    vocab_size: int,
    first: int | None,
    gap: int | None = None,
) -> MaskCanary:
    """Check every layer of `model` against `windows` (per layer, None for global) on a prompt three times
    the sliding window long (128 tokens without a window); with `gap`, also check the mask stays put when the
    position ids after the middle are moved by `gap`."""
    stated = [w for w in windows if w is not None]
    window = max(stated) if stated else None
    reference = window if window is not None else 64
    length = 3 * reference
    ids = canary_ids(length, vocab_size=vocab_size, first=first)
    maps = attention_maps(model, ids)
    checks = []
    for layer, (own, theta) in enumerate(zip(windows, rope_theta, strict=True)):
        weights = maps[layer]
        back = own if own is not None else reference
        queries = torch.arange(length).view(-1, 1)
        keys = torch.arange(length).view(1, -1)
        beyond = (queries - keys >= back).to(weights.dtype)
        beyond_mass = float((weights * beyond).sum(dim=-1).max())
        rows = torch.arange(back - 1, length)
        edge = weights[:, rows, rows - (back - 1)].max(dim=0).values
        edge_mass = float(edge.min())
        sliding = own is not None
        passed = beyond_mass == 0.0 and edge_mass > 0.0 if sliding else beyond_mass > 0.0
        checks.append(
            LayerCheck(
                layer=layer,
                kind=LayerKind.sliding if sliding else LayerKind.global_,
                window=own,
                rope_theta=theta,
                beyond_mass=beyond_mass,
                edge_mass=edge_mass,
                passed=passed,
            )
        )
    safe = None
    if gap is not None:
        half = length // 2
        positions = [i if i < half else i + gap for i in range(length)]
        moved = attention_maps(model, ids, positions=positions)
        safe = all(bool(torch.equal(maps[i] == 0, moved[i] == 0)) for i in maps)
    return MaskCanary(window=window, prompt_tokens=length, layers=tuple(checks), position_gap_safe=safe)


def describe_failure(canary: MaskCanary) -> str:
    """The layers that failed, in words."""
    failed = [check for check in canary.layers if not check.passed]
    parts = []
    for check in failed:
        if check.kind is LayerKind.sliding:
            parts.append(
                f"layer {check.layer} (sliding, window {check.window}): mass {check.beyond_mass:.3g} beyond "
                f"the window, {check.edge_mass:.3g} at its edge"
            )
        else:
            parts.append(f"layer {check.layer} (global): no mass beyond {canary.window} tokens")
    return "; ".join(parts)
