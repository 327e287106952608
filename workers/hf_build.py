"""Building a model in transformers for the `hf` engine: resolved as vLLM resolves it (hub id, folder, GGUF
file converted once, `demo`), its config changed by the job's and the variant's `hf_overrides` before the
model is built, the answer-rows attention (`workers/hf_attention.py`), and its layers read back from the
modules that were built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posbias.schemas import EngineOptions, LayerConfig, ModelInfo, PosbiasError, WorkerConfig, one_line
from posbias.workers.hf_attention import register
from posbias.workers.models import bos_fix, read_model_info, resolve_model, stated_bos
from posbias.workers.tokenizer import HfTokenizer, prompt_bos_id
from posbias.workers.variants import apply_overrides, layer_config

_DTYPES = {"float32": "float32", "float": "float32", "float16": "float16", "half": "float16"}


@dataclass
class BuiltModel:
    """A model built for the `hf` engine, with what it states about itself."""

    model: Any
    tokenizer: HfTokenizer
    layers: LayerConfig
    model_info: ModelInfo
    device: str
    dtype: str
    version: str
    max_model_len: int
    vocab_size: int
    bos_token_id: int | None


def build_model(
    model: str,
    *,
    revision: str | None,
    tokenizer: str | None,
    options: EngineOptions,
    overrides: dict[str, Any],
    config: WorkerConfig,
) -> BuiltModel:
    """Load `model` in transformers with `overrides` applied to its config. Raises `PosbiasError` with the
    loader's error on one line."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(model, revision=revision, tokenizer=tokenizer, cache_dir=config.cache_dir)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        hf_config = AutoConfig.from_pretrained(
            resolved.model, revision=resolved.revision, trust_remote_code=options.trust_remote_code
        )
        if overrides:
            changed = apply_overrides(hf_config.to_dict(), overrides)
            hf_config = type(hf_config).from_dict(changed)
        dtype = _dtype(options.dtype, config=hf_config, device=device)
        built: Any = AutoModelForCausalLM.from_pretrained(
            resolved.model,
            revision=resolved.revision,
            config=hf_config,
            attn_implementation=register(),
            dtype=getattr(torch, dtype),
            trust_remote_code=options.trust_remote_code,
        )
        loaded = AutoTokenizer.from_pretrained(
            resolved.tokenizer or resolved.model,
            revision=resolved.revision,
            trust_remote_code=options.trust_remote_code,
        )
    except Exception as exc:
        raise PosbiasError(f"transformers could not load {model}: {one_line(exc)}") from None
    try:
        bos = prompt_bos_id(
            loaded, stated=stated_bos(resolved, config=hf_config), model=model, fix=bos_fix(resolved)
        )
    except PosbiasError:
        del built  # the weights go now, not with the traceback that holds this frame
        raise
    built.to(device)
    built.eval()
    text = built.config.get_text_config()
    layers = built_layers(built, text_config=text)
    info = read_model_info(built.config, name=model, revision=revision, weights_dir=resolved.local_dir)
    info = info.model_copy(
        update={
            "hf_overrides": overrides,
            "layers": layers,
            "sliding_window": layers.sliding_window,
            "sliding_window_layers": layers.sliding_layers or None,
            "rope_theta": layers.global_rope_theta,
            "num_layers": len(layers.windows),
        }
    )
    context = int(getattr(text, "max_position_embeddings", 0) or 0) or 4096
    return BuiltModel(
        model=built,
        tokenizer=HfTokenizer(loaded, prompt_bos_id=bos),
        layers=layers,
        model_info=info,
        device=device,
        dtype=dtype,
        version=str(transformers.__version__),
        max_model_len=min(options.max_model_len or context, context),
        vocab_size=int(getattr(text, "vocab_size", 0) or len(loaded)),
        bos_token_id=getattr(loaded, "bos_token_id", None),
    )


def built_layers(model: Any, *, text_config: Any) -> LayerConfig:
    """Each layer's window as its attention module was built (`sliding_window` is set on the sliding
    layers of Gemma 2 and 3, Mistral-likes and others; absent or None on global ones) and its RoPE base
    from the built config."""
    windows: list[int | None] = []
    for layer in model.model.layers:
        window = getattr(layer.self_attn, "sliding_window", None)
        windows.append(int(window) if isinstance(window, int) and window > 0 else None)
    stated = layer_config(text_config.to_dict())
    bases = stated.rope_theta if stated is not None and len(stated.rope_theta) == len(windows) else None
    return LayerConfig(windows=tuple(windows), rope_theta=bases or tuple(None for _ in windows))


def _dtype(asked: str, *, config: Any, device: str) -> str:
    if asked in _DTYPES:
        return _DTYPES[asked]
    if asked == "bfloat16":
        return "bfloat16"
    if device == "cpu":
        return "float32"
    stated = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    return stated.removeprefix("torch.")
