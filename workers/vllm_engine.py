"""`VllmEngine`: the `Engine` interface on vLLM, either the GPU package or its CPU build (same module).

vLLM is started by `workers/vllm_start.py` (its environment, its arguments, the wait for GPU memory). What
ran is read back, not guessed (`workers/vllm_readback.py`): each vLLM worker reports the attention backend of
every layer and what each attention layer attends over. A variant's config changes go to vLLM as
`hf_overrides`; a variant that states what it expects (every intervention does) and gets anything else is
refused before it answers a prompt.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from posbias.schemas import (
    EngineInfo,
    EngineOptions,
    LayerConfig,
    PosbiasError,
    Variant,
    WorkerConfig,
)
from posbias.schemas.variant import merge_overrides
from posbias.workers.engine import EngineBase, Generation, GenerationRequest
from posbias.workers.models import ResolvedModel, read_model_info, resolve_model
from posbias.workers.output_tokens import logprobs_by_text, token_offsets
from posbias.workers.prompt_bos import bos_fix, prompt_bos_id, stated_bos
from posbias.workers.tokenizer import HfTokenizer
from posbias.workers.vllm_readback import read_attention, read_layers
from posbias.workers.vllm_start import start_llm

# Enough candidates for the usual 4-10 options; more only when a question has more options.
_MIN_LOGPROBS = 5


_OPEN: weakref.WeakSet[VllmEngine] = weakref.WeakSet()
"""Engines of this process not yet closed."""


def _release_with(engine: VllmEngine, llm: Any) -> Callable[[], None]:
    """How `engine`'s vLLM is shut down, on `close()` or when it is collected, whichever comes first.

    An in-process engine core's shutdown also ends the distributed state that every engine of the process
    shares (vLLM keeps it process-wide), and vLLM shuts a collected engine down by itself: with another
    engine still open here that would break the other one. So for an in-process core, vLLM's own finalizer
    is replaced by one that shuts down only when no other engine of this process is open (otherwise the
    memory is left to the collector, see `_shutdown_unless_shared`). An actor holds one engine, so there it
    always shuts down; a core in its own processes (vLLM's multiprocessing) is left to vLLM.
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
    else:
        # vLLM froze every object of the process out of the collector's reach once the core had started
        # (gc.freeze), and only its shutdown unfreezes them: without this a core left to the collector keeps
        # its weights and KV cache (1 GiB each on CPUs) until the process ends.
        gc.unfreeze()


class VllmEngine(EngineBase[HfTokenizer]):
    """A model loaded in vLLM, answering prompts given as token ids. Implements `workers.engine.Engine`.

    Its `model_info` holds the architecture facts read from the config vLLM loaded, with the layers as vLLM
    built them; its tokenizer is the one vLLM loaded for the model."""

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
        self._llm, device = start_llm(self._resolved, options=options, config=config, hf_overrides=overrides)
        self._release = _release_with(self, self._llm)
        _OPEN.add(self)
        self._layers = read_layers(self._llm)
        if variant is not None and variant.expect is not None:
            self._refuse_unless_built(variant, expect=variant.expect)
        model_config = self._llm.llm_engine.model_config
        self._tokenizer = HfTokenizer(self._llm.get_tokenizer(), prompt_bos_id=self._prompt_bos(model))
        self._max_model_len = int(model_config.max_model_len)
        self._max_logprobs = int(model_config.max_logprobs)
        attention = read_attention(self._llm)
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

    def _prompt_bos(self, model: str) -> int | None:
        """The BOS every prompt must begin with (`prompt_bos_id`); the engine is closed before a refusal."""
        try:
            return prompt_bos_id(
                self._llm.get_tokenizer(),
                stated=stated_bos(self._resolved, config=self._llm.llm_engine.model_config.hf_config),
                model=model,
                fix=bos_fix(self._resolved),
            )
        except PosbiasError:
            self.close()
            raise

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
            top = [
                logprobs_by_text((c.decoded_token or "", float(c.logprob)) for c in candidates.values())
                for candidates in completion.logprobs
            ]
        return Generation(
            text=text,
            token_ids=token_ids,
            token_offsets=token_offsets(
                self._tokenizer.hf, token_ids, text=text, prompt_token_ids=prompt_token_ids
            ),
            top_logprobs=top,
        )


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
