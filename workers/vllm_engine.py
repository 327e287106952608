"""`VllmEngine`: the `Engine` interface on vLLM, either the GPU package or its CPU build (same module).

On the CPU build the engine runs in-process (no engine-core subprocess, no thread binding), in float32 with
eager execution and a fixed KV cache, which is what starts fast on a small machine. On GPUs it uses the
model's dtype and, for tensor parallelism, vLLM's own multiprocessing executor: this engine lives inside a
Ray actor, and nesting Ray placement groups there is what we must avoid.

On GPUs an engine first waits (bounded by `WorkerConfig.gpu_memory_wait_seconds`) until its GPUs have the
memory vLLM will ask for: an engine that was just closed, or one whose actor was killed, may still be
freeing it. vLLM refuses to start below that ("Free memory on device ... is less than desired GPU memory
utilization"; through its engine-core process only as "Engine core initialization failed"), so a refused
start with the GPUs short of memory is tried again with backoff, and past the bound it is a
`RetryableError` (the shards go back to the queue), not a broken model.

What ran is read back, not guessed: each vLLM worker reports the attention backend of every layer (and
FlashAttention's version) through `AttentionReport`, a worker extension; only if the workers cannot be asked
is the backend vLLM's selector would pick recorded, marked as a guess. The model loads text-only
(`language_model_only`): posbias sends token ids, so a multimodal checkpoint such as Gemma 3 4B+ loads no
vision tower.

A variant's config changes go to vLLM as `hf_overrides`, and the same extension reads back what every
attention layer of the built model attends over (the window its attention kernel was given) and the base of
its rotary embedding. A variant that states what it expects (every intervention does) and gets anything
else is refused before it answers a prompt: overrides fail silently in the field (vLLM issue 49795, an
all-full `layer_types` that left every layer sliding; 9490, a `rope_theta` not applied).

vLLM is imported only when an engine is built, after its environment variables are set.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import re
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posbias.schemas import (
    EngineInfo,
    EngineOptions,
    LayerConfig,
    ModelInfo,
    PosbiasError,
    RetryableError,
    Variant,
    WorkerConfig,
    one_line,
)
from posbias.schemas.variant import merge_overrides
from posbias.workers.engine import Encoding, Generation, GenerationRequest
from posbias.workers.models import ResolvedModel, read_model_info, resolve_model

log = logging.getLogger(__name__)

# Enough candidates for the usual 4-10 options; more only when a question has more options.
_MIN_LOGPROBS = 5
_CONTEXT_TOKENS = 8
_EXTENSION = "posbias.workers.vllm_engine.AttentionReport"
# vLLM's own refusals when a GPU lacks free memory at startup (vllm/v1/worker/utils.py, gpu_worker.py).
_MEMORY_REFUSAL = re.compile(r"Free memory on device|less than desired GPU memory utilization|out of memory")


class HfTokenizer:
    """The `Tokenizer` interface over a Hugging Face fast tokenizer (the one vLLM loaded)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    @property
    def hf(self) -> Any:
        """The wrapped Hugging Face tokenizer."""
        return self._tokenizer

    def has_chat_template(self) -> bool:
        """True when the model defines a chat template."""
        return bool(getattr(self._tokenizer, "chat_template", None))

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn, followed by the assistant's generation prompt."""
        text = self._tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], tokenize=False, add_generation_prompt=True
        )
        if not isinstance(text, str):
            raise PosbiasError("the model's chat template did not render to text; set chat_template: off")
        return text

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Token ids of `text` with each token's character span (special tokens added here span nothing)."""
        try:
            encoded = self._tokenizer(
                text, add_special_tokens=add_special_tokens, return_offsets_mapping=True
            )
        except NotImplementedError:  # slow (Python) tokenizers have no offsets
            raise PosbiasError(
                "the model's tokenizer has no fast version, so token offsets are unknown; give a "
                "`tokenizer` with a tokenizer.json"
            ) from None
        ids = [int(i) for i in encoded["input_ids"]]
        offsets = [(int(start), int(end)) for start, end in encoded["offset_mapping"]]
        return Encoding(ids=ids, offsets=offsets)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens kept."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))


_OPEN: weakref.WeakSet[VllmEngine] = weakref.WeakSet()
"""Engines of this process not yet closed."""


def _release_with(engine: VllmEngine, llm: Any) -> Callable[[], None]:
    """How `engine`'s vLLM is shut down, on `close()` or when it is collected, whichever comes first.

    An in-process engine core's shutdown also ends the distributed state that every engine of the process
    shares (vLLM keeps it process-wide), and vLLM shuts a collected engine down by itself: with another
    engine still open here that would break the other one. So for an in-process core, vLLM's own finalizer
    is replaced by one that shuts down only when no other engine of this process is open (otherwise the
    memory is left to the collector). An actor holds one engine, so there it always shuts down; a core in
    its own processes (vLLM's multiprocessing) is left to vLLM.
    """
    client = llm.llm_engine.engine_core
    own = getattr(client, "_finalizer", None)
    if type(client).__name__ != "InprocClient" or not isinstance(own, weakref.finalize):
        return weakref.finalize(engine, client.shutdown)
    own.detach()
    return weakref.finalize(engine, _shutdown_unless_shared, client.engine_core)


def _shutdown_unless_shared(core: Any) -> None:
    if not any(True for _ in _OPEN):  # iterating sees only live engines (len() may count a dying one)
        core.shutdown()


class VllmEngine:
    """A model loaded in vLLM, answering prompts given as token ids. Implements `workers.engine.Engine`."""

    def __init__(
        self,
        model: str,
        *,
        revision: str | None = None,
        tokenizer: str | None = None,
        options: EngineOptions | None = None,
        variant: Variant | None = None,
        config: WorkerConfig,
    ) -> None:
        """Load `model` (hub id, folder or .gguf file) with the config changes of `options` and `variant`.
        Raises `PosbiasError` with the loader's error as one line when the model cannot be resolved or
        loaded, and when vLLM built other layers than the variant expects (the engine is closed first)."""
        options = options or EngineOptions()
        self._variant = variant
        overrides = merge_overrides(options.hf_overrides, variant.hf_overrides if variant else {})
        self._resolved = resolve_model(
            model, revision=revision, tokenizer=tokenizer, cache_dir=config.cache_dir
        )
        self._llm, device = _start_llm(self._resolved, options=options, config=config, hf_overrides=overrides)
        self._release = _release_with(self, self._llm)
        _OPEN.add(self)
        self._layers = _built_layers(self._llm)
        if variant is not None and variant.expect is not None:
            self._refuse_unless_built(variant, expect=variant.expect)
        model_config = self._llm.llm_engine.model_config
        self._tokenizer = HfTokenizer(self._llm.get_tokenizer())
        self._max_model_len = int(model_config.max_model_len)
        self._max_logprobs = int(model_config.max_logprobs)
        attention = _attention(self._llm)
        self._info = EngineInfo(
            name="vllm",
            version=_vllm_version(),
            dtype=str(model_config.dtype).removeprefix("torch."),
            attention_backend=attention.backend,
            attention_layers=attention.layers,
            flash_attn_version=attention.flash_attn_version,
            attention_backend_guessed=attention.guessed,
            max_model_len=self._max_model_len,
            device=device,
        )
        weights = self._resolved.local_dir or _hub_snapshot(self._resolved.model, revision=revision)
        info = read_model_info(model_config.hf_config, name=model, revision=revision, weights_dir=weights)
        built: dict[str, Any] = {"hf_overrides": overrides, "layers": self._layers}
        if self._layers is not None:  # what the kernels run, not what the config says
            built.update(
                sliding_window=self._layers.sliding_window,
                sliding_window_layers=self._layers.sliding_layers or None,
                rope_theta=self._layers.global_rope_theta,
                num_layers=info.num_layers or len(self._layers.windows),
            )
        self._model_info = info.model_copy(update=built)

    def _refuse_unless_built(self, variant: Variant, *, expect: LayerConfig) -> None:
        built = self._layers
        if built is None:
            problem = "its layers could not be read back from vLLM's workers, so it cannot be checked"
        else:
            differences = expect.differences(built)
            if not differences:
                return
            problem = f"vLLM built {built.describe()}: " + "; ".join(differences)
        self.close()
        raise PosbiasError(
            f"variant {variant.name} asked for {expect.describe()}, but {problem}. vLLM did not apply its "
            "hf_overrides as asked; refusing to run it (set the change where this vLLM reads it, e.g. "
            "rope_parameters rather than rope_theta, layer_types rather than a pattern)"
        )

    @property
    def info(self) -> EngineInfo:
        """Engine name, version, dtype, attention backend, device."""
        return self._info

    @property
    def model_info(self) -> ModelInfo:
        """The model's architecture facts, read from the config vLLM loaded."""
        return self._model_info

    @property
    def tokenizer(self) -> HfTokenizer:
        """The tokenizer vLLM loaded for the model (a `Tokenizer`)."""
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus output vLLM accepts for this model."""
        return self._max_model_len

    @property
    def layers(self) -> LayerConfig | None:
        """Each attention layer's window and RoPE base as vLLM built them; None when they cannot be read."""
        return self._layers

    def prompt_logprobs(self, prompt_token_ids: Sequence[int]) -> list[float | None]:
        """The log-probability the model gives each prompt token after the ones before it (None for the
        first, which has no context): how the model reads a text, which is what a variant changes."""
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        [output] = self._llm.generate(
            [TokensPrompt(prompt_token_ids=list(prompt_token_ids))], params, use_tqdm=False
        )
        found: list[float | None] = []
        for token, entry in zip(prompt_token_ids, output.prompt_logprobs, strict=True):
            found.append(None if entry is None else float(entry[token].logprob))
        return found

    @property
    def resolved(self) -> ResolvedModel:
        """Where the model was loaded from (e.g. the folder a GGUF file was converted into)."""
        return self._resolved

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Answer all requests in one `LLM.generate` call, in order.

        Request i samples with seed `seed + i` (when a seed is given), so prompts of one call draw
        independent randomness and the same call reproduces. Log-probabilities are returned when a request
        names option labels; under a regex they come after the grammar mask, i.e. renormalised over the
        tokens the grammar allows.
        """
        if not requests:
            return []
        from vllm import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_token_ids)) for r in requests]
        params = [
            self._sampling_params(
                r, temperature=temperature, top_p=top_p, seed=None if seed is None else seed + i
            )
            for i, r in enumerate(requests)
        ]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        return [
            self._generation(output.outputs[0], prompt_token_ids=request.prompt_token_ids)
            for output, request in zip(outputs, requests, strict=True)
        ]

    def close(self) -> None:
        """Stop the engine and free its memory: vLLM's engine core shuts its executor down, and with
        multiprocessing its engine-core and worker processes exit, releasing their GPU memory. The actor
        calls this before it is ended; safe to call twice."""
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        _OPEN.discard(self)
        self._release()
        del llm
        gc.collect()

    def _sampling_params(
        self, request: GenerationRequest, *, temperature: float, top_p: float, seed: int | None
    ) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        logprobs = None
        if request.option_labels:
            logprobs = min(max(len(request.option_labels), _MIN_LOGPROBS), self._max_logprobs)
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            max_tokens=request.max_tokens,
            logprobs=logprobs,
            structured_outputs=StructuredOutputsParams(regex=request.regex) if request.regex else None,
        )

    def _generation(self, completion: Any, *, prompt_token_ids: Sequence[int]) -> Generation:
        token_ids = [int(t) for t in completion.token_ids]
        text = str(completion.text)
        top = None
        if completion.logprobs is not None:
            top = [_by_text(candidates) for candidates in completion.logprobs]
        return Generation(
            text=text,
            token_ids=token_ids,
            token_offsets=token_offsets(
                self._tokenizer.hf, token_ids, text=text, prompt_token_ids=prompt_token_ids
            ),
            top_logprobs=top,
        )


def token_offsets(
    tokenizer: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int] = ()
) -> list[int]:
    """Character offset in `text` where each of `token_ids` starts, `text` being their detokenization
    after `prompt_token_ids` (special tokens skipped).

    Decoded pieces do not always concatenate to the text (a character split over byte tokens decodes to
    nothing until its last byte; SentencePiece drops a leading space), so offsets come from streaming
    detokenization primed with the prompt, as vLLM's own detokenizer does, falling back to comparing
    decoded prefixes with `text`. A token that adds no visible text (a special token, or the first bytes of
    a character) starts where the next text begins. Offsets never decrease and never exceed `len(text)`.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        offsets = _stream_offsets(backend, token_ids, text=text, prompt_token_ids=prompt_token_ids)
        if offsets is not None:
            return offsets
    return _prefix_offsets(tokenizer, token_ids, text=text, prompt_token_ids=prompt_token_ids)


def _stream_offsets(
    backend: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int]
) -> list[int] | None:
    from tokenizers.decoders import DecodeStream

    offsets: list[int] = []
    length = 0
    pieces: list[str] = []
    try:
        # Primed with the prompt, so a leading space or a character continued from the prompt decodes as
        # it does in vLLM's own detokenizer.
        stream = DecodeStream(ids=list(prompt_token_ids), skip_special_tokens=True)
        for token in token_ids:
            offsets.append(length)
            piece = stream.step(backend, token)
            if piece:
                pieces.append(piece)
                length += len(piece)
    except Exception:  # tokenizers rejects some byte sequences mid-stream; the slow path copes
        return None
    return offsets if "".join(pieces) == text else None


def _prefix_offsets(
    tokenizer: Any, token_ids: Sequence[int], *, text: str, prompt_token_ids: Sequence[int]
) -> list[int]:
    # A few prompt tokens of context, so the first output token decodes with its leading space.
    context = list(prompt_token_ids[-_CONTEXT_TOKENS:])
    context_text = tokenizer.decode(context, skip_special_tokens=True)
    offsets: list[int] = []
    floor = 0
    for i in range(len(token_ids)):
        decoded = tokenizer.decode(context + list(token_ids[:i]), skip_special_tokens=True)
        prefix = decoded[len(context_text) :] if decoded.startswith(context_text) else decoded
        floor = max(floor, min(_common_prefix(prefix, text), len(text)))
        offsets.append(floor)
    return offsets


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _by_text(candidates: dict[int, Any]) -> dict[str, float]:
    """Log-probabilities keyed by stripped token text; spellings of one text (`2`, ` 2`) add up."""
    merged: dict[str, float] = {}
    for candidate in candidates.values():
        logprob = float(candidate.logprob)
        if math.isinf(logprob) or math.isnan(logprob):  # masked by the grammar
            continue
        key = (candidate.decoded_token or "").strip()
        if key in merged:
            high, low = max(merged[key], logprob), min(merged[key], logprob)
            merged[key] = high + math.log1p(math.exp(low - high))
        else:
            merged[key] = logprob
    return merged


def _start_llm(
    resolved: ResolvedModel, *, options: EngineOptions, config: WorkerConfig, hf_overrides: dict[str, Any]
) -> tuple[Any, str]:
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu and options.tensor_parallel_size > 1:
        raise PosbiasError(
            f"tensor_parallel_size {options.tensor_parallel_size} needs GPUs, but this worker has the CPU "
            "build of vLLM; set engine.tensor_parallel_size: 1 or run the job on GPU workers"
        )
    _set_vllm_environment(config, on_cpu=on_cpu)
    kwargs: dict[str, Any] = {
        "tokenizer": resolved.tokenizer,
        "revision": resolved.revision,
        "dtype": options.dtype,
        "tensor_parallel_size": options.tensor_parallel_size,
        "max_model_len": options.max_model_len,
    }
    # Workers report what they run by method name (see AttentionReport); token ids only, so no vision tower.
    kwargs["worker_extension_cls"] = _EXTENSION
    kwargs["language_model_only"] = True
    if hf_overrides:
        kwargs["hf_overrides"] = hf_overrides
    if on_cpu:
        kwargs["distributed_executor_backend"] = "uni"
        kwargs["enforce_eager"] = True
        if options.dtype == "auto":
            kwargs["dtype"] = "float32"  # bf16 matmuls are ~3.6x slower on CPUs without AMX
    else:
        kwargs["gpu_memory_utilization"] = options.gpu_memory_utilization
        if options.tensor_parallel_size > 1:
            kwargs["distributed_executor_backend"] = "mp"
    kwargs.update(options.extra)

    from vllm import LLM

    measure = not on_cpu and current_platform.is_cuda()
    gpus = options.tensor_parallel_size
    need = options.gpu_memory_utilization
    deadline = time.monotonic() + config.gpu_memory_wait_seconds
    pause = 2.0
    while True:
        short = _short_gpus(gpus, need=need) if measure else []
        if short and time.monotonic() < deadline:
            log.info("waiting for GPU memory: %s", "; ".join(short))
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 30.0)
            continue
        try:
            llm = LLM(resolved.model, **kwargs)
            break
        except Exception as exc:  # vLLM and transformers raise anything from OSError to pydantic errors
            refused = _memory_refusal(exc)
            short = _short_gpus(gpus, need=need) if measure else []
            if not (refused or short):
                raise PosbiasError(f"cannot load model {resolved.source}: {one_line(exc)}") from exc
            if time.monotonic() >= deadline:
                held = "; ".join(short) or one_line(exc)
                waited = config.gpu_memory_wait_seconds
                raise RetryableError(
                    f"the GPUs did not have the memory vLLM asks for within {waited:.0f} s ({held}); another "
                    "engine may still hold it"
                ) from exc
            log.warning("vLLM refused to start for lack of GPU memory; trying again in %.0f s", pause)
            time.sleep(pause)
            pause = min(2 * pause, 30.0)
    device = (
        "cpu" if on_cpu else ("cuda" if current_platform.is_cuda_alike() else current_platform.device_type)
    )
    return llm, device


def _memory_refusal(exc: BaseException) -> bool:
    """True when vLLM's error (or one it was raised from) is its refusal for lack of free GPU memory."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if _MEMORY_REFUSAL.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _short_gpus(count: int, *, need: float) -> list[str]:
    """The GPUs of this process (the first `count` it may use) whose free memory is below `need` of their
    total, as vLLM requires at startup, e.g. `GPU 3: 20.1 of 79.6 GiB free`. Read through NVML, so no CUDA
    context is made in this process; empty when NVML cannot say."""
    try:
        from vllm.platforms import current_platform
        from vllm.utils.import_utils import import_pynvml

        pynvml = import_pynvml()  # type: ignore[no-untyped-call]
        pynvml.nvmlInit()
    except Exception:
        return []
    short = []
    try:
        for device in range(count):
            physical = current_platform.device_id_to_physical_device_id(device)
            memory = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(physical))
            if memory.free < need * memory.total:
                free, total = memory.free / 2**30, memory.total / 2**30
                short.append(f"GPU {physical}: {free:.1f} of {total:.1f} GiB free")
    except Exception:
        return []
    finally:
        pynvml.nvmlShutdown()
    return short


def _set_vllm_environment(config: WorkerConfig, *, on_cpu: bool) -> None:
    """vLLM and torch read these from the environment; the worker's config is their only source."""
    import vllm.envs

    cache = Path(config.cache_dir).expanduser()
    os.environ["VLLM_CACHE_ROOT"] = str(cache / "vllm")
    # torch compiles a sampler kernel with g++ on first use (~35 s on CPU); keep it across restarts.
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "inductor")
    if on_cpu:
        import torch

        threads = config.cpu_threads or _usable_cpus()
        # In-process: the engine core shares this process, so startup is seconds, not a subprocess spawn.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # Binding OMP threads to cores needs the multiprocessing executor and would pin the whole actor.
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(config.cpu_kvcache_gib)
        # Without OMP_NUM_THREADS vLLM drops torch to one thread for serving, which with `nobind` would
        # run every matmul on one core.
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    # A previous engine in this process froze vLLM's view of the environment; let it see ours.
    if hasattr(vllm.envs, "disable_envs_cache"):
        vllm.envs.disable_envs_cache()


def _usable_cpus() -> int:
    """Cores this process may run on (a container's cgroup or affinity mask, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


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


def _attention(llm: Any) -> Attention:
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


def _built_layers(llm: Any) -> LayerConfig | None:
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


def _hub_snapshot(repo: str, *, revision: str | None) -> Path | None:
    """The local copy vLLM downloaded of a hub model, for counting its parameters; no network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except Exception:
        return None


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)
