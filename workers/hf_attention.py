"""Attention reduced on the fly: forward hooks on every attention module of a transformers model turn each
layer's attention map into a few masses per answer line, and let the map go before the next layer runs.

With eager attention each attention module returns `(output, weights)`, the weights `(batch, heads,
queries, keys)` after the mask and the softmax (Gemma 2's logit softcapping included). A hook sees them
once, keeps the rows of the answer lines' tokens reduced over key regions (`schemas/attention.py` names
them), and keeps nothing else: the model drops the map as soon as the layer returns, so one layer's map is
held at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

SINK, INSTRUCTIONS, ANSWERS = 0, 1, 2
"""Key regions before the questions' own: region 3 + k - 1 is question k's span."""
QUESTIONS = 3


@dataclass(frozen=True)
class Layout:
    """Where the regions of one teacher-forced sequence lie, and which query rows belong to which line."""

    regions: torch.Tensor
    """Per key token, its region (`SINK`, `INSTRUCTIONS`, `ANSWERS`, or `QUESTIONS + k - 1`)."""
    lines: tuple[tuple[int, tuple[int, ...]], ...]
    """Per answer line: the position it answers and the token indices of its query rows."""
    n_questions: int
    window: int | None
    """The model's sliding window: mass on keys this far back or more is reported apart."""


@dataclass
class LayerMasses:
    """One layer's reduction: per line, per head, the mass on each region, and beyond the window."""

    regions: torch.Tensor
    """(lines, heads, regions)."""
    beyond: torch.Tensor | None
    """(lines, heads); None without a window."""


@dataclass
class Recorder:
    """The reductions of one forward pass, filled by the hooks, and the largest map they were given."""

    layout: Layout | None = None
    layers: dict[int, LayerMasses] = field(default_factory=dict)
    map_bytes_peak: int = 0
    raw: dict[int, torch.Tensor] | None = None
    """When set (the mask canary), each layer's full map is kept here too, for a small prompt only."""


def layout(
    length: int,
    *,
    sink_end: int,
    questions: Sequence[tuple[int, int]],
    answers_start: int,
    lines: Sequence[tuple[int, Sequence[int]]],
    window: int | None,
) -> Layout:
    """The regions of a sequence of `length` tokens: the sink `[0, sink_end)`, question k's span
    `questions[k - 1]`, the answer sheet from `answers_start`, the instructions everything else."""
    regions = torch.full((length,), INSTRUCTIONS, dtype=torch.long)
    regions[: max(sink_end, 1)] = SINK
    for k, (start, end) in enumerate(questions):
        regions[start:end] = QUESTIONS + k
    regions[answers_start:] = ANSWERS
    return Layout(
        regions=regions,
        lines=tuple((position, tuple(rows)) for position, rows in lines),
        n_questions=len(questions),
        window=window,
    )


def attention_modules(model: Any) -> list[Any]:
    """The self-attention module of each decoder layer, in layer order."""
    return [layer.self_attn for layer in model.model.layers]


@contextmanager
def hooked(model: Any, recorder: Recorder) -> Iterator[Recorder]:
    """Hooks on every attention module of `model` that reduce into `recorder` while the block runs."""
    handles = []
    for index, module in enumerate(attention_modules(model)):
        handles.append(module.register_forward_hook(_hook(index, recorder)))
    try:
        yield recorder
    finally:
        for handle in handles:
            handle.remove()


def _hook(index: int, recorder: Recorder) -> Any:
    def reduce(module: Any, args: Any, output: Any) -> None:
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise RuntimeError(
                "the attention module returned no weights; the hf engine needs attn_implementation='eager'"
            )
        recorder.map_bytes_peak = max(recorder.map_bytes_peak, weights.numel() * weights.element_size())
        if recorder.raw is not None:
            recorder.raw[index] = weights[0].detach().float().clone()
        if recorder.layout is not None:
            recorder.layers[index] = reduce_layer(weights[0], recorder.layout)

    return reduce


def reduce_layer(weights: torch.Tensor, layout: Layout) -> LayerMasses:
    """One layer's map `(heads, queries, keys)` reduced per answer line: the mass on each region, averaged
    over the line's query rows, per head; and the mass on keys `window` or more tokens before each row."""
    heads, _, keys = weights.shape
    n_regions = QUESTIONS + layout.n_questions
    onehot = torch.zeros((keys, n_regions), dtype=torch.float32, device=weights.device)
    onehot[torch.arange(keys, device=weights.device), layout.regions[:keys].to(weights.device)] = 1.0
    rows = [row for _, line in layout.lines for row in line]
    index = torch.tensor(rows, dtype=torch.long, device=weights.device)
    picked = weights.index_select(1, index).float()  # (heads, rows, keys)
    masses = picked @ onehot  # (heads, rows, regions)
    beyond = None
    if layout.window is not None:
        cumulative = picked.cumsum(dim=-1)
        # Keys k with row - k >= window, i.e. k <= row - window: the cumulative sum up to that key.
        last = index - layout.window
        gather = last.clamp(min=0).view(1, -1, 1).expand(heads, -1, 1)
        beyond = cumulative.gather(2, gather).squeeze(2) * (last >= 0).float()
    per_line_regions = []
    per_line_beyond = []
    at = 0
    for _, line in layout.lines:
        count = len(line)
        per_line_regions.append(masses[:, at : at + count].mean(dim=1))
        if beyond is not None:
            per_line_beyond.append(beyond[:, at : at + count].mean(dim=1))
        at += count
    return LayerMasses(
        regions=torch.stack(per_line_regions).cpu(),
        beyond=torch.stack(per_line_beyond).cpu() if beyond is not None else None,
    )
