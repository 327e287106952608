"""The reference the `hf` engine's answer-rows attention is held to: transformers' own eager attention, whose
attention modules return each layer's whole map `(batch, heads, L, L)`, reduced by forward hooks with the
same `reduce_layer` as before. Used by the tests, `benchmarks/attention_memory.py` and the hf part of
`scripts/gpu-check.sh`; it needs only torch, transformers and posbias."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from posbias.workers.hf_attention import active, attention_modules, reduce_layer


@contextmanager
def eager(model: Any) -> Iterator[None]:
    """While the block runs, `model` attends with transformers' eager attention and its full maps are reduced
    into whatever recorder `recording` made active (`workers/hf_attention.py`), as the engine did before the
    answer-rows reduction; the model's own implementation is put back after."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = [module.register_forward_hook(_reduce) for module in attention_modules(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        model.set_attn_implementation(previous)


def _reduce(module: Any, args: Any, output: Any) -> None:
    found = active(module)
    if found is None:
        return
    recorder, index = found
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None:
        raise RuntimeError("the eager attention module returned no weights")
    recorder.map_bytes_peak = max(recorder.map_bytes_peak, weights.numel() * weights.element_size())
    if recorder.raw is not None:
        recorder.raw[index] = weights[0].detach().float().cpu()
    if recorder.layout is not None:
        recorder.layers[index] = reduce_layer(weights[0], recorder.layout)
