"""What vLLM actually built, read back from its workers rather than guessed from the config.

`AttentionReport` is a worker extension (vLLM's `worker_extension_cls`) that each vLLM worker answers by
name: the attention backend of every layer (and FlashAttention's version), and what every attention layer of
the built model attends over (the window its attention kernel was given) with the base of its rotary
embedding. `read_attention` and `read_layers` ask the workers; only if they cannot be asked is the backend
vLLM's selector would pick recorded, marked as a guess. The engine compares the layers with what a variant
expects (`workers/vllm_engine.py`): overrides fail silently in the field (vLLM issue 49795, an all-full
`layer_types` that left every layer sliding; 9490, a `rope_theta` not applied).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from posbias.schemas import LayerConfig, one_line

log = logging.getLogger(__name__)


class AttentionReport:
    """Mixed into vLLM's worker class (`worker_extension_cls`), so that the engine can ask every worker what
    its layers run. Called by name through `LLM.collective_rpc`: a name crosses vLLM's process boundaries,
    where a function would need the pickling vLLM allows only with VLLM_ALLOW_INSECURE_SERIALIZATION."""

    def posbias_attention_layers(self) -> list[list[str | int | None]]:
        """`[layer name, backend name, FlashAttention version or None]` for each attention layer of this
        worker's model, in the model's order."""
        model = self.get_model()  # type: ignore[attr-defined]
        layers: list[list[str | int | None]] = []
        for module in model.modules():
            get_backend = getattr(module, "get_attn_backend", None)
            if not callable(get_backend):
                continue
            version = getattr(getattr(module, "impl", None), "vllm_flash_attn_version", None)
            layers.append(
                [
                    str(getattr(module, "layer_name", "")),
                    str(get_backend().get_name()),
                    int(version) if isinstance(version, int) else None,
                ]
            )
        return layers

    def posbias_layer_config(self) -> list[list[Any]]:
        """`[layer name, window the layer holds, window its attention kernel was given, RoPE base]` for each
        attention layer of this worker's model, in the model's order. The kernel's window is read as its
        backend stores it (an int, -1 for none, on CPU; `(left, right)` with left = window - 1 on GPUs); the
        RoPE base is the `base` of the rotary embedding beside the layer (None when there is none)."""
        model = self.get_model()  # type: ignore[attr-defined]
        rows: list[list[Any]] = []
        for name, module in model.named_modules():
            if not callable(getattr(module, "get_attn_backend", None)) or not hasattr(
                module, "sliding_window"
            ):
                continue
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            rotary = getattr(parent, "rotary_emb", None)
            base = getattr(rotary, "base", None)
            kernel = getattr(getattr(module, "impl", None), "sliding_window", None)
            rows.append(
                [
                    name,
                    module.sliding_window,
                    list(kernel) if isinstance(kernel, tuple) else kernel,
                    float(base) if isinstance(base, int | float) else None,
                ]
            )
        return rows


WORKER_EXTENSION = f"{AttentionReport.__module__}.{AttentionReport.__qualname__}"
"""`AttentionReport` by name, as vLLM's workers import it."""


@dataclass(frozen=True)
class Attention:
    """What the engine's attention layers run."""

    backend: str | None
    """Distinct backend names, comma-separated."""
    layers: tuple[str, ...] | None
    """Each attention layer's backend, in layer order (the first worker's; workers of one engine agree)."""
    flash_attn_version: int | None
    guessed: bool
    """True when the workers could not be asked and `backend` is the selector's choice for the config."""


def read_attention(llm: Any) -> Attention:
    """Ask the workers which backend each layer runs; failing that, say what vLLM's selector would pick,
    marked as a guess."""
    try:
        per_worker = llm.collective_rpc("posbias_attention_layers")
        rows = [row for worker in per_worker for row in worker]
        if rows:
            versions = {int(row[2]) for row in rows if row[2] is not None and row[1] == "FLASH_ATTN"}
            return Attention(
                backend=",".join(sorted({str(row[1]) for row in rows})),
                layers=tuple(str(row[1]) for row in per_worker[0]),
                flash_attn_version=max(versions) if versions else None,
                guessed=False,
            )
    except Exception as exc:  # a vLLM without worker extensions, or a worker that cannot answer
        log.warning("vLLM's workers did not report their attention backends (%s)", one_line(exc, typed=True))
    return Attention(backend=_selected_backend(llm), layers=None, flash_attn_version=None, guessed=True)


def read_layers(llm: Any) -> LayerConfig | None:
    """What the first worker's model attends over, layer by layer; None when its workers cannot say."""
    try:
        rows = llm.collective_rpc("posbias_layer_config")[0]
    except Exception as exc:  # a vLLM without worker extensions, or a worker that cannot answer
        log.warning("vLLM's workers did not report their layers (%s)", one_line(exc, typed=True))
        return None
    if not rows:
        return None
    windows = tuple(_window(kernel, held=held) for _, held, kernel, _ in rows)
    return LayerConfig(windows=windows, rope_theta=tuple(row[3] for row in rows))


def _window(kernel: Any, *, held: Any) -> int | None:
    """The window in tokens a layer's attention kernel was given (None: global); the layer's own when the
    kernel stores none that can be read."""
    if isinstance(kernel, int) and not isinstance(kernel, bool):
        return None if kernel < 0 else kernel
    if isinstance(kernel, list) and kernel and isinstance(kernel[0], int):
        return None if kernel[0] < 0 else kernel[0] + 1
    return int(held) if isinstance(held, int) and held > 0 else None


def _selected_backend(llm: Any) -> str | None:
    """The backend vLLM's selector would pick for this model's config, asked in this process: a guess (the
    workers may pick per layer, e.g. for sliding-window layers, or fall back at run time)."""
    try:
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.selector import get_attn_backend

        vllm_config = llm.llm_engine.vllm_config
        model_config = vllm_config.model_config
        with set_current_vllm_config(vllm_config):
            backend = get_attn_backend(
                model_config.get_head_size(),
                model_config.dtype,
                vllm_config.cache_config.cache_dtype,
                use_mla=bool(getattr(model_config, "use_mla", False)),
                has_sliding_window=model_config.get_sliding_window() is not None,
            )
        return str(backend.get_name())
    except Exception:
        return None
