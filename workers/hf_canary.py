"""The mask canary of a model built in transformers: what each attention layer attends over, read back from
its attention weights on a prompt longer than the window, rather than assumed from the config.

A sliding layer must give exactly zero weight to every key `window` or more tokens back and some weight to
the key `window - 1` back; a global layer must give weight beyond the window. The position-gap check runs
the prompt again with a gap in the position ids: the design may run only if no layer's mask moved (a
transformers that reads position ids as packed-sequence boundaries, or counts the window in positions,
would move it): per head and row, the first and last key with weight and how many have any must be the same.

Every row's weights are read, a block of rows at a time, and reduced as they come (`Recorder.blocks`): the
canary prompt of a 4096-token window is 12,288 tokens, whose whole maps for every layer of a large model
would not fit in memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
    """Every layer's attention map `(heads, queries, keys)` for `ids` (a short prompt only: the maps are
    kept).

    `explicit_mask`: pass an all-ones attention mask, as the engine does. Without one, transformers 5
    reads a jump in the position ids as the start of a packed sequence and masks across it, so a position
    gap would cut the prompt in two."""
    recorder = Recorder(raw={})
    device = model.get_input_embeddings().weight.device
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
    backs = [own if own is not None else reference for own in windows]
    stats = read_layers(model, ids, backs=backs, patterns=gap is not None)
    checks = []
    for layer, (own, theta) in enumerate(zip(windows, rope_theta, strict=True)):
        beyond_mass, edge_mass = stats[layer].beyond, stats[layer].edge
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
        moved = read_layers(model, ids, backs=backs, positions=positions, patterns=True)
        safe = all(bool(torch.equal(stats[i].pattern, moved[i].pattern)) for i in stats)
    return MaskCanary(window=window, prompt_tokens=length, layers=tuple(checks), position_gap_safe=safe)


@dataclass
class LayerStats:
    """What the canary reads from one layer's whole map."""

    back: int
    """The distance checked: the layer's window, or the canary's reference for a global layer."""
    length: int
    patterns: bool = False
    """Whether to keep `pattern` (for the position-gap check; it costs a few passes over each map)."""
    heads: int = 0
    beyond: float = 0.0
    """The largest mass one head of one row puts on keys `back` or more tokens before it."""
    edge: float = math.inf
    """Over the rows that have one, the smallest of the largest weight the heads give the key `back - 1`
    tokens before the row."""
    pattern: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    """(heads, rows, 3): per head and row, the first and the last key with weight, and how many have any
    (empty unless `patterns`)."""

    def take(self, start: int, weights: torch.Tensor) -> None:
        """Fold in the weights `(heads, rows, keys)` of the rows from `start` on."""
        heads, count, keys = weights.shape
        self.heads = heads
        rows = torch.arange(start, start + count, device=weights.device)
        reach = start + count - self.back  # keys from here on are less than `back` before every row
        if reach > 0:
            far = rows.view(-1, 1) - torch.arange(reach, device=weights.device).view(1, -1) >= self.back
            self.beyond = max(self.beyond, float((weights[..., :reach] * far).sum(dim=-1).max()))
        has_edge = rows >= self.back - 1
        if bool(has_edge.any()):
            at = rows[has_edge]
            edge = weights[:, has_edge.nonzero().view(-1), at - (self.back - 1)]  # (heads, rows)
            self.edge = min(self.edge, float(edge.max(dim=0).values.min()))
        if not self.patterns:
            return
        if self.pattern.numel() == 0:
            self.pattern = torch.zeros((heads, self.length, 3), dtype=torch.long)
        attended = (weights != 0).to(torch.uint8)
        first = attended.argmax(dim=-1)
        last = keys - 1 - attended.flip(-1).argmax(dim=-1)
        self.pattern[:, start : start + count] = torch.stack(
            (first, last, attended.sum(dim=-1, dtype=torch.long)), dim=-1
        ).cpu()


def read_layers(
    model: Any,
    ids: Sequence[int],
    *,
    backs: Sequence[int],
    positions: Sequence[int] | None = None,
    patterns: bool = False,
) -> dict[int, LayerStats]:
    """`LayerStats` of every layer for `ids` (with `positions`, else 0, 1, ...), the layer's maps read a
    block of rows at a time and dropped, with an explicit all-ones attention mask as the engine passes."""
    stats = {
        layer: LayerStats(back=back, length=len(ids), patterns=patterns) for layer, back in enumerate(backs)
    }

    def take(layer: int, start: int, weights: torch.Tensor) -> None:
        stats[layer].take(start, weights)

    _forward(model, ids, positions=positions, blocks=take)
    return stats


def _forward(
    model: Any,
    ids: Sequence[int],
    *,
    positions: Sequence[int] | None,
    blocks: Callable[[int, int, torch.Tensor], None],
) -> None:
    recorder = Recorder(blocks=blocks)
    device = model.get_input_embeddings().weight.device
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=device)
    position_ids = None
    if positions is not None:
        position_ids = torch.tensor([list(positions)], dtype=torch.long, device=device)
    with torch.inference_mode(), recording(model, recorder):
        model(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=1,
        )


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
