"""Attention reduced from the answer rows only: an attention implementation registered with transformers
(`IMPLEMENTATION`) that produces each layer's output with torch's fused attention, and, while a `Recorder`
is active (`recording`), recomputes in float32 the attention weights of just the answer lines' query rows
against every key and reduces them to a few masses per line (`schemas/attention.py` names the regions).

Everything the weights depend on is what the model itself hands its attention function: the query and key
states after the model's projections, norms and RoPE (with the job's position ids), its scaling
(`query_pre_attn_scalar` on Gemma), its logit softcapping (Gemma 2's `attn_logit_softcapping`, passed as
`softcap`), grouped-query heads (query head h reads key head h // groups, as `repeat_kv` does), and its mask.
The mask is the one transformers composes for the layer (causal, the layer's sliding window, padding, a
packed-sequence split where it reads one from the position ids): the mask function registered here keeps
transformers' composed function and evaluates it, through transformers' own `sdpa_mask`, one block of query
rows at a time, so no `L x L` mask is ever made.

Memory per layer: the answer rows' weights, `heads x rows x L` in float32, and for the layer output one
block of query rows at a time (`CHUNK_BYTES`): proportional to rows x L, never to L x L. Eager attention
with `output_attentions` holds `heads x L x L` per layer (about 65 GB for 16 heads at 32k tokens in
float32); it stays the reference the tests compare with (`tests/support/eager_attention.py`).

The layer output: torch's `scaled_dot_product_attention` per block of query rows with that block's mask,
keys outside the block's reach (before the window, after the last row) left out, which changes no weight
(they are masked). A layer with logit softcapping cannot go through a fused kernel (softcapping is a
nonlinearity on the scores), so its blocks are computed as eager attention computes them, in the model's
dtype with the softmax in float32 (transformers' own `sdpa` path drops the softcapping instead).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch

SINK, INSTRUCTIONS, ANSWERS = 0, 1, 2
"""Key regions before the questions' own: region 3 + k - 1 is question k's span."""
QUESTIONS = 3

IMPLEMENTATION = "posbias_answer_rows"
"""The name the implementation is registered under with transformers (`attn_implementation=`)."""

CHUNK_BYTES = 64 * 2**20
"""Bytes of float32 scores one block of query rows may take (`heads x rows x keys x 4`): a layer's output
and the canary's reading are computed a block of rows at a time."""


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

    @property
    def rows(self) -> list[int]:
        """Every line's query rows, line after line."""
        return [row for _, line in self.lines for row in line]


@dataclass
class LayerMasses:
    """One layer's reduction: per line, per head, the mass on each region, and beyond the window."""

    regions: torch.Tensor
    """(lines, heads, regions)."""
    beyond: torch.Tensor | None
    """(lines, heads); None without a window."""


@dataclass
class Recorder:
    """The reductions of one forward pass, filled by the attention function, and the largest map of weights
    it held (bytes)."""

    layout: Layout | None = None
    layers: dict[int, LayerMasses] = field(default_factory=dict)
    map_bytes_peak: int = 0
    raw: dict[int, torch.Tensor] | None = None
    """When set, each layer's full map `(heads, L, L)` is kept here too, for a small prompt only: every
    row's weights are computed."""
    blocks: Callable[[int, int, torch.Tensor], None] | None = None
    """When set (the mask canary), every row's weights are handed to it a block of rows at a time, as
    `(layer, first row, weights (heads, rows, keys))` in float32, and kept nowhere: a check over the whole
    map in the memory of one block (`CHUNK_BYTES`)."""


@dataclass(frozen=True)
class _Active:
    recorder: Recorder
    layers: dict[int, int]
    """id() of each attention module -> its layer index."""


_ACTIVE: ContextVar[_Active | None] = ContextVar("posbias_attention_recorder", default=None)


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


def register() -> str:
    """Register the implementation and its mask with transformers (idempotent); returns its name, for
    `from_pretrained(attn_implementation=...)`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(IMPLEMENTATION, answer_rows_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, RowMask.of)
    return IMPLEMENTATION


@contextmanager
def recording(model: Any, recorder: Recorder) -> Iterator[Recorder]:
    """While the block runs, every attention layer of `model` reduces its answer rows into `recorder` (or
    keeps its whole map, for `recorder.raw`)."""
    layers = {id(module): index for index, module in enumerate(attention_modules(model))}
    token = _ACTIVE.set(_Active(recorder=recorder, layers=layers))
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)


def active(module: Any) -> tuple[Recorder, int] | None:
    """The recorder that `module` (an attention module) reports to now, and its layer index; None when no
    recording is active or the module is not one of the recorded model's layers."""
    current = _ACTIVE.get()
    if current is None or id(module) not in current.layers:
        return None
    return current.recorder, current.layers[id(module)]


@dataclass(frozen=True)
class RowMask:
    """The mask transformers composed for one kind of layer, kept as its mask function and evaluated a block
    of query rows at a time by transformers' own `sdpa_mask` (True: the key is attended)."""

    batch_size: int
    q_length: int
    kv_length: int
    q_offset: int
    kv_offset: int
    mask_function: Callable[..., Any]
    attention_mask: torch.Tensor | None
    use_vmap: bool
    device: torch.device | str

    @classmethod
    def of(
        cls,
        batch_size: int,
        q_length: int,
        kv_length: int,
        q_offset: int = 0,
        kv_offset: int = 0,
        mask_function: Callable[..., Any] | None = None,
        attention_mask: torch.Tensor | None = None,
        use_vmap: bool = False,
        device: torch.device | str = "cpu",
        **kwargs: Any,
    ) -> RowMask:
        """The mask interface transformers calls (the arguments of `masking_utils.sdpa_mask`). A padding
        mask of all ones masks nothing and is dropped: evaluating it is a third of the mask's cost."""
        from transformers.masking_utils import causal_mask_function

        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None
        return cls(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=int(q_offset),
            kv_offset=int(kv_offset),
            mask_function=mask_function or causal_mask_function,
            attention_mask=attention_mask,
            use_vmap=use_vmap,
            device=device,
        )

    def block(self, start: int, stop: int) -> torch.Tensor:
        """Query rows `[start, stop)` against every key: `(batch, 1, stop - start, kv_length)`, bool."""
        from transformers.masking_utils import sdpa_mask

        mask = sdpa_mask(
            batch_size=self.batch_size,
            q_length=stop - start,
            kv_length=self.kv_length,
            q_offset=self.q_offset + start,
            kv_offset=self.kv_offset,
            mask_function=self.mask_function,
            attention_mask=self.attention_mask,
            allow_is_causal_skip=False,
            use_vmap=self.use_vmap,
            device=self.device,
        )
        assert mask is not None  # no skip allowed: always a tensor
        return mask

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The shape of the mask it stands for (transformers reads it in places)."""
        return (self.batch_size, 1, self.q_length, self.kv_length)


def _mask_block(mask: Any, start: int, stop: int, *, kv_length: int, device: torch.device) -> torch.Tensor:
    """Rows `[start, stop)` of whatever mask the model passed, as bool `(batch or 1, 1, rows, keys)`."""
    if isinstance(mask, RowMask):
        return mask.block(start, stop).to(device)
    if mask is None:  # transformers passes none where every key is attended
        return torch.ones((1, 1, stop - start, kv_length), dtype=torch.bool, device=device)
    if isinstance(mask, torch.Tensor) and mask.ndim == 4:
        rows = mask[:, :, start:stop, :kv_length]
        return rows if rows.dtype == torch.bool else rows == 0
    raise TypeError(f"the answer-rows attention cannot read a mask of type {type(mask).__name__}")


def _reach(allowed: torch.Tensor) -> tuple[int, int]:
    """The first and one past the last key any row of a mask block attends."""
    columns = allowed.reshape(-1, allowed.shape[-1]).any(dim=0).nonzero()
    if columns.numel() == 0:
        return 0, allowed.shape[-1]
    return int(columns[0]), int(columns[-1]) + 1


def answer_rows_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    softcap: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention function transformers calls per layer: `query` `(batch, heads, q, d)`, `key` and
    `value` `(batch, kv_heads, k, d)` as the model made them. Returns the output `(batch, q, heads, d)` and
    no weights; reduces the answer rows into the active recorder, if any."""
    if module.training and dropout:
        raise RuntimeError("the answer-rows attention is for inference: put the model in eval mode")
    scale = float(module.head_dim**-0.5 if scaling is None else scaling)
    output = _layer_output(query, key, value, attention_mask, scale=scale, softcap=softcap)
    found = active(module)
    if found is not None:
        recorder, index = found
        _record(recorder, index, query=query, key=key, mask=attention_mask, scale=scale, softcap=softcap)
    return output.transpose(1, 2).contiguous(), None


def _grouped(states: torch.Tensor, groups: int) -> torch.Tensor:
    """Key or value heads repeated for their query heads, as transformers' `repeat_kv` does."""
    if groups == 1:
        return states
    batch, heads, length, dim = states.shape
    return (
        states[:, :, None]
        .expand(batch, heads, groups, length, dim)
        .reshape(batch, heads * groups, length, dim)
    )


def _layer_output(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: Any,
    *,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    batch, heads, q_length, _ = query.shape
    kv_length = key.shape[2]
    groups = heads // key.shape[1]
    output = torch.empty_like(query)
    block = max(1, CHUNK_BYTES // (4 * batch * heads * kv_length))
    for start in range(0, q_length, block):
        stop = min(q_length, start + block)
        allowed = _mask_block(mask, start, stop, kv_length=kv_length, device=query.device)
        low, high = _reach(allowed)
        allowed = allowed[..., low:high]
        keys = _grouped(key[:, :, low:high], groups)
        values = _grouped(value[:, :, low:high], groups)
        rows = query[:, :, start:stop]
        if softcap is None:
            output[:, :, start:stop] = torch.nn.functional.scaled_dot_product_attention(
                rows, keys, values, attn_mask=allowed, scale=scale
            )
            continue
        # As transformers' eager_attention_forward computes it (there the mask is added: 0 or the dtype's
        # minimum, which the softmax turns into the same exact zeros as a fill).
        # In place, so a block holds its scores and their softmax, no more.
        scores = torch.matmul(rows, keys.transpose(2, 3)).mul_(scale)
        scores.div_(softcap).tanh_().mul_(softcap)
        scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        output[:, :, start:stop] = torch.matmul(weights, values)
        del scores, weights
    return output


def row_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    mask: Any,
    rows: torch.Tensor,
    *,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """The attention weights of query rows `rows` (of the first sequence) against every key, in float32:
    `(heads, len(rows), keys)`; each query head reads its key head (grouped-query attention)."""
    heads, kv_heads = query.shape[1], key.shape[1]
    groups = heads // kv_heads
    picked = query[0].index_select(1, rows.to(query.device)).float()  # (heads, rows, d)
    count, dim = picked.shape[1], picked.shape[2]
    keys = key[0].float()  # (kv_heads, keys, d)
    scores = torch.matmul(picked.view(kv_heads, groups, count, dim), keys.unsqueeze(1).transpose(-1, -2))
    scores = scores.view(heads, count, keys.shape[1]).mul_(scale)
    if softcap is not None:
        scores.div_(softcap).tanh_().mul_(softcap)
    first, last = int(rows.min()), int(rows.max()) + 1
    span = _mask_block(mask, first, last, kv_length=keys.shape[1], device=scores.device)[0, 0]
    allowed = span.index_select(0, (rows - first).to(span.device))
    scores.masked_fill_(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


def _record(
    recorder: Recorder,
    index: int,
    *,
    query: torch.Tensor,
    key: torch.Tensor,
    mask: Any,
    scale: float,
    softcap: float | None,
) -> None:
    where = recorder.layout
    if recorder.blocks is not None:
        length, heads = query.shape[2], query.shape[1]
        block = max(1, CHUNK_BYTES // (4 * heads * key.shape[2]))
        for start in range(0, length, block):
            rows = torch.arange(start, min(length, start + block))
            weights = row_weights(query, key, mask, rows, scale=scale, softcap=softcap)
            recorder.map_bytes_peak = max(recorder.map_bytes_peak, weights.numel() * weights.element_size())
            recorder.blocks(index, start, weights)
            del weights
    if recorder.raw is not None:
        rows = torch.arange(query.shape[2])
    elif where is not None and where.lines:
        rows = torch.tensor(where.rows, dtype=torch.long)
    else:
        return
    weights = row_weights(query, key, mask, rows, scale=scale, softcap=softcap)
    recorder.map_bytes_peak = max(recorder.map_bytes_peak, weights.numel() * weights.element_size())
    if recorder.raw is not None:
        recorder.raw[index] = weights.detach().cpu()
        if where is not None:
            recorder.layers[index] = reduce_layer(weights, where)
        return
    assert where is not None
    recorder.layers[index] = reduce_rows(weights, where)


def reduce_layer(weights: torch.Tensor, layout: Layout) -> LayerMasses:
    """One layer's whole map `(heads, queries, keys)` reduced per answer line (`reduce_rows` of the lines'
    rows)."""
    index = torch.tensor(layout.rows, dtype=torch.long, device=weights.device)
    return reduce_rows(weights.index_select(1, index).float(), layout)


def reduce_rows(picked: torch.Tensor, layout: Layout) -> LayerMasses:
    """The weights of the lines' query rows `(heads, rows, keys)` (rows in `layout.rows` order) reduced per
    answer line: the mass on each region, averaged over the line's query rows, per head; and the mass on keys
    `window` or more tokens before each row."""
    heads, _, keys = picked.shape
    picked = picked.float()
    n_regions = QUESTIONS + layout.n_questions
    onehot = torch.zeros((keys, n_regions), dtype=torch.float32, device=picked.device)
    onehot[torch.arange(keys, device=picked.device), layout.regions[:keys].to(picked.device)] = 1.0
    index = torch.tensor(layout.rows, dtype=torch.long, device=picked.device)
    masses = picked @ onehot  # (heads, rows, regions)
    beyond = None
    if layout.window is not None:
        # Keys k with row - k >= window, i.e. k <= row - window: the cumulative sum up to that key.
        last = index - layout.window
        gather = last.clamp(min=0).view(1, -1, 1).expand(heads, -1, 1)
        beyond = picked.cumsum(dim=-1).gather(2, gather).squeeze(2) * (last >= 0).float()
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
