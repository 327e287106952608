"""Building a model in transformers for the `hf` engine: resolved as vLLM resolves it (hub id, folder, GGUF
file converted once, `demo`), its config changed by the job's and the variant's `hf_overrides` before the
model is built, the answer-rows attention (`workers/hf_attention.py`), and its layers read back from the
modules that were built.

On CUDA the model goes onto the GPUs its actor reserved: `engine.tensor_parallel_size` of them (Ray shows the
actor exactly those). One GPU takes the whole model; more take its layers spread by accelerate's
`device_map="auto"` (balanced), each GPU's share capped at `engine.gpu_memory_utilization` of its memory,
the rest left for activations. Nothing is offloaded to the CPU or disk: a model that does not fit the GPUs is
refused with the number to raise. This is a split by layers (one GPU computes at a time), not vLLM's tensor
parallelism: it makes a model larger than one GPU run, not run faster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posbias.schemas import EngineOptions, LayerConfig, ModelInfo, PosbiasError, WorkerConfig, one_line
from posbias.workers.hf_attention import register
from posbias.workers.models import read_model_info, resolve_model
from posbias.workers.prompt_bos import bos_fix, prompt_bos_id, stated_bos
from posbias.workers.tokenizer import HfTokenizer
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
    """`cuda` or `cpu`."""
    input_device: str
    """Where the input ids go: the device of the embeddings (the first GPU of a spread model)."""
    gpus: int
    """GPUs the weights lie on (0 on CPU)."""
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
    device: str | None = None,
) -> BuiltModel:
    """Load `model` in transformers with `overrides` applied to its config, on `device` (`cuda` or `cpu`;
    None: `cuda` where torch sees a GPU). Raises `PosbiasError` with the loader's error on one line, and when
    the model does not fit the GPUs it may use."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(model, revision=revision, tokenizer=tokenizer, cache_dir=config.cache_dir)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    placement = _placement(device, gpus=options.tensor_parallel_size, share=options.gpu_memory_utilization)
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
            **placement,
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
    if not placement:
        built.to(device)
    built.eval()
    spread = _gpus_used(built, device=device)
    if spread is None:
        del built
        raise PosbiasError(
            f"{model} does not fit in {options.tensor_parallel_size} GPU(s) at gpu_memory_utilization "
            f"{options.gpu_memory_utilization} in {dtype}: accelerate put part of it on the CPU or disk; "
            "raise engine.tensor_parallel_size (the GPUs its actor reserves) or gpu_memory_utilization"
        )
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
        input_device=str(built.get_input_embeddings().weight.device),
        gpus=spread,
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


def _placement(device: str, *, gpus: int, share: float) -> dict[str, Any]:
    """`from_pretrained`'s placement arguments: none on CPU (the model is moved after), the whole model on
    the one GPU, or spread over `gpus` GPUs, each holding at most `share` of its memory."""
    if device != "cuda":
        return {}
    import torch

    if not torch.cuda.is_available():
        raise PosbiasError("engine hf was asked to run on cuda, but torch sees no GPU here")
    visible = torch.cuda.device_count()
    if gpus > visible:
        raise PosbiasError(
            f"engine.tensor_parallel_size is {gpus}, but this worker sees {visible} GPU(s) "
            "(CUDA_VISIBLE_DEVICES, or the GPUs Ray gave its actor); lower it to the GPUs a node has"
        )
    if gpus == 1:
        return {"device_map": {"": 0}}
    memory: dict[int | str, int] = {
        i: int(torch.cuda.get_device_properties(i).total_memory * share) for i in range(gpus)
    }
    return {"device_map": "auto", "max_memory": memory}


def _gpus_used(model: Any, *, device: str) -> int | None:
    """The GPUs `model`'s weights lie on; None when some lie on the CPU or disk of a CUDA engine."""
    if device != "cuda":
        return 0
    where = set(getattr(model, "hf_device_map", {}).values()) or {next(model.parameters()).device.index}
    if any(not isinstance(place, int) for place in where):
        return None
    return len(where)


def _dtype(asked: str, *, config: Any, device: str) -> str:
    """The dtype to build in: the one asked; for `auto`, float32 on CPU, and on GPU the checkpoint's own when
    it is 16-bit, else bfloat16 (float16 on a GPU without bfloat16), as vLLM's `auto` runs a float32
    checkpoint."""
    if asked in _DTYPES:
        return _DTYPES[asked]
    if asked == "bfloat16":
        return "bfloat16"
    if device == "cpu":
        return "float32"
    stated = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "float32")
    stated = stated.removeprefix("torch.")
    if stated in ("bfloat16", "float16"):
        return stated
    import torch

    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
