"""`OpenAIEngine`: the `Engine` interface on an OpenAI-compatible endpoint (`vllm serve`, SGLang, llama.cpp's
server, a hosted API).

At first use (submit, and again in each worker) the engine probes the endpoint (`workers/endpoint_probe.py`)
and chooses how the job uses it (`workers/served_mode.py`), or refuses the job with the reason. Against vLLM
with `/tokenize`, prompts are rendered with the server's tokenizer (`workers/tokenizer.py`) and sent as token
ids to `/completions`, so a job answers exactly as the in-process engine does, token offsets included.
Requests go through the session's limits and retries (`workers/endpoint_session.py`), answers are read back
by `workers/endpoint_answer.py` and kept in `workers/request_cache.py`, and each shard's share of the job's
cost guard is spent here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from posbias.schemas import (
    EndpointApi,
    EndpointCapabilities,
    EngineInfo,
    EngineName,
    JobSpec,
    ModelInfo,
    PosbiasError,
    ServedMode,
    ShardSpec,
    TokenSource,
    WorkerConfig,
)
from posbias.workers.endpoint_answer import (
    answer_schema,
    generation_from,
    reported_tokens,
    sheet_from_json,
    unreadable,
)
from posbias.workers.endpoint_probe import MAX_LOGPROBS, MIN_LOGPROBS, probe
from posbias.workers.endpoint_session import EndpointError, MalformedAnswer, api_key, open_session
from posbias.workers.engine import (
    CostGuardError,
    EngineBase,
    Generation,
    GenerationRequest,
    TokenBudget,
    Tokenizer,
)
from posbias.workers.models import read_model_info
from posbias.workers.request_cache import RequestCache
from posbias.workers.served_mode import choose_mode, engine_api, token_source
from posbias.workers.tokenizer import estimated_prompt_tokens, job_tokenizer


class OpenAIEngine(EngineBase[Tokenizer | None]):
    """An OpenAI-compatible endpoint answering prompts. Implements `workers.engine.Engine`.

    One per endpoint per worker (a Ray actor holding no GPU): its session's limits are that worker's share of
    the endpoint. Answers are cached under the worker's cache folder, so a shard delivered again (its lease
    expired, its worker died) does not pay for what was already answered.

    Its `info` is `openai`, the version the server reports, the model name it answered with and the endpoint;
    its `model_info` the model's facts, read from its config when `model` is a local folder, else its context
    only; its tokenizer the server's, the job's named one, or None (token offsets unknown); its
    `max_model_len` the endpoint's context length (as configured, or as it reports it; unbounded when
    unknown).
    """

    def __init__(self, spec: ShardSpec | JobSpec, *, config: WorkerConfig) -> None:
        """Probe the endpoint `spec.engine` names. Raises `PosbiasError` (one line) when the job cannot run
        there."""
        options = spec.engine
        if options.name is not EngineName.openai:
            raise ValueError("OpenAIEngine serves engine openai only")
        self._options = options
        self._served = options.model or spec.model
        self._session = open_session(options, key=api_key(options.api_key_env))
        try:
            self._capabilities = probe(self._session, model=self._served)
            self._tokens = token_source(self._capabilities, tokenizer=spec.tokenizer)
            self._api = engine_api(self._capabilities, options=options, tokens=self._tokens)
            self._mode = choose_mode(
                self._capabilities,
                options=options,
                answer_mode=spec.answer_mode,
                chat_template=spec.chat_template,
                tokenizer=spec.tokenizer,
            )
            self._tokenizer = job_tokenizer(
                self._capabilities,
                session=self._session,
                model=self._served,
                tokenizer=spec.tokenizer,
                trust_remote_code=options.trust_remote_code,
            )
        except BaseException:
            self._session.close()
            raise
        self._cache = RequestCache(Path(config.cache_dir).expanduser() / "openai" / "answers")
        caps = self._capabilities
        self._max_model_len = options.max_model_len or caps.max_model_len or 1 << 40
        self._info = EngineInfo(
            name="openai",
            version=caps.server_version or "unknown",
            dtype="unknown",
            attention_backend=None,
            device="remote",
            served_model=caps.served_model,
            endpoint=caps.base_url,
        )
        self._model_info = _model_info(spec, context_length=caps.max_model_len)

    @property
    def capabilities(self) -> EndpointCapabilities:
        """What the probe found."""
        return self._capabilities

    @property
    def mode(self) -> ServedMode:
        """How this engine's first job uses the endpoint."""
        return self._mode

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Answer all requests, many at once (the session's concurrency), in order.

        Request i samples with seed `seed + i`, as in the in-process engine. Before anything is sent, each
        shard's requests not in the cache must fit its token budget (else `CostGuardError`); while they
        run, each request reserves its upper bound and settles at what the endpoint reports."""
        if not requests:
            return []
        return self._session.run(self._generate(requests, temperature=temperature, top_p=top_p, seed=seed))

    async def _generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        calls = [
            self._call(r, temperature=temperature, top_p=top_p, seed=None if seed is None else seed + i)
            for i, r in enumerate(requests)
        ]
        cached = [self._cache.get(call.key) for call in calls]
        needs: dict[int, tuple[Any, int]] = {}
        for call, hit in zip(calls, cached, strict=True):
            budget = call.request.budget
            if budget is None:
                continue
            if hit is None:
                held = needs.get(id(budget), (budget, 0))
                needs[id(budget)] = (budget, held[1] + call.bound)
            elif hit.get("paid_by") == budget.label:
                # Paid for by an earlier attempt of this shard: it counts against the same share, so no
                # number of attempts can spend more than the share.
                budget.spent += reported_tokens(hit.get("answer"), default=call.bound)
                budget.bounded += call.bound
                needs.setdefault(id(budget), (budget, 0))
        for budget, need in needs.values():
            if need > budget.left:
                raise CostGuardError(
                    f"cost guard: {budget.label} would spend up to {need:,} tokens, more than its share of "
                    f"the job's engine.max_job_tokens ({budget.left:,} left); nothing was sent"
                )
        outcomes = await asyncio.gather(
            *(self._answer(call, hit) for call, hit in zip(calls, cached, strict=True)),
            return_exceptions=True,
        )
        # Every request has finished (and what came back is cached) before a failure is raised, so a retry
        # of the shard pays only for what is missing.
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [outcome for outcome in outcomes if isinstance(outcome, Generation)]

    def _call(
        self, request: GenerationRequest, *, temperature: float, top_p: float, seed: int | None
    ) -> _Call:
        # A prompt meant to go without a chat template can only go to the completions API: the chat API
        # always applies one (choose_mode refused such jobs where there is no completions API).
        chat = self._api is EndpointApi.chat and not request.chat_template_off
        if not (self._capabilities.chat if chat else self._capabilities.completions):
            api = "chat" if chat else "completions"
            raise EndpointError(f"{self._session.base_url} does not answer the {api} API this prompt needs")
        body: dict[str, Any] = {
            "model": self._served,
            "max_tokens": request.max_tokens,
            "temperature": temperature,
            "top_p": top_p,
        }
        exact = self._tokens is TokenSource.server and bool(request.prompt_token_ids)
        if chat:
            body["messages"] = [{"role": "user", "content": request.user_text}]
        elif exact and self._capabilities.token_prompts:
            body["prompt"] = list(request.prompt_token_ids)
            body["return_token_ids"] = True
        else:
            body["prompt"] = request.prompt_text
        if seed is not None:
            body["seed"] = seed
        alternatives = self._capabilities.logprobs(EndpointApi.chat if chat else EndpointApi.completions)
        if request.option_labels and alternatives and self._options.option_probs is not False:
            wanted = min(max(len(request.option_labels), MIN_LOGPROBS), max(alternatives, MIN_LOGPROBS))
            wanted = min(wanted, MAX_LOGPROBS)
            if chat:
                body["logprobs"] = True
                body["top_logprobs"] = wanted
            else:
                body["logprobs"] = wanted
        json_sheet = False
        if request.regex is not None:
            field = self._capabilities.regex_field
            if field == "structured_outputs":
                body[field] = {"regex": request.regex}
            elif field is not None:
                body[field] = request.regex
            elif self._capabilities.json_schema:
                schema = answer_schema(request.n_options)
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "answer_sheet", "schema": schema, "strict": True},
                }
                json_sheet = True
            else:
                raise EndpointError(f"{self._session.base_url} obeys no constraint; use answer_mode free")
        path = "/chat/completions" if chat else "/completions"
        prompt_tokens = (
            len(request.prompt_token_ids)
            if self._tokens is not TokenSource.none and request.prompt_token_ids
            else estimated_prompt_tokens(request.prompt_text or request.user_text)
        )
        key = RequestCache.key(endpoint=self._session.base_url, path=path, body=body, salt=request.cache_salt)
        return _Call(
            request=request,
            path=path,
            body=body,
            chat=chat,
            json_sheet=json_sheet,
            key=key,
            bound=prompt_tokens + request.max_tokens,
        )

    async def _answer(self, call: _Call, hit: dict[str, Any] | None) -> Generation:
        budget = call.request.budget
        if hit is not None:
            answer = hit.get("answer")
        else:
            admit = None if budget is None else _admission(budget, bound=call.bound)
            try:
                answer = await self._session.request(
                    call.path,
                    call.body,
                    tokens=call.bound,
                    admit=admit,
                    accept=partial(unreadable, chat=call.chat),
                )
            except MalformedAnswer as exc:
                if budget is not None:  # what the bad answers cost is unknown: count the bound
                    budget.spent += call.bound
                    budget.bounded += call.bound
                return Generation(
                    text="", token_ids=[], token_offsets=[], top_logprobs=None, failure=str(exc)
                )
            self._cache.put(call.key, {"answer": answer, "paid_by": None if budget is None else budget.label})
        problem = unreadable(answer, chat=call.chat)  # a cached answer may predate the check
        if problem is not None:
            return Generation(text="", token_ids=[], token_offsets=[], top_logprobs=None, failure=problem)
        generation = generation_from(answer, chat=call.chat)
        if budget is not None and hit is None:
            budget.spent += reported_tokens(answer, default=call.bound)
            budget.bounded += call.bound
        if call.json_sheet:
            text, offsets = sheet_from_json(generation.text, generation.token_offsets)
            generation = Generation(
                text=text,
                token_ids=generation.token_ids,
                token_offsets=offsets,
                top_logprobs=generation.top_logprobs,
                prompt_tokens=generation.prompt_tokens,
                output_tokens=generation.output_tokens,
            )
        if not generation.token_offsets and generation.text and self._tokenizer is not None:
            generation = self._offsets_from_tokenizer(generation)
        return generation

    def _offsets_from_tokenizer(self, generation: Generation) -> Generation:
        """Output offsets by tokenizing the output again, when the endpoint gave no per-token pieces."""
        assert self._tokenizer is not None
        try:
            encoding = self._tokenizer.encode(generation.text, add_special_tokens=False)
        except PosbiasError:
            return generation
        return Generation(
            text=generation.text,
            token_ids=generation.token_ids,
            token_offsets=[start for start, _ in encoding.offsets],
            top_logprobs=generation.top_logprobs,
            prompt_tokens=generation.prompt_tokens,
            output_tokens=generation.output_tokens,
        )

    def close(self) -> None:
        """Close the HTTP client (the actor calls this before loading another model)."""
        self._session.close()


def _admission(budget: TokenBudget, *, bound: int) -> Callable[[], Callable[[], None]]:
    """What lets a request through its shard's cost guard: as it is about to be sent (not when it is queued,
    so what answers have already spent counts), it reserves its bound, scaled by how far the endpoint's counts
    have exceeded the bounds so far, or is stopped."""

    def admit() -> Callable[[], None]:
        reserve = budget.scaled(bound)
        if reserve > budget.left:
            raise CostGuardError(
                f"cost guard: {budget.label} has spent {budget.spent:,} tokens and its next prompt needs up "
                f"to {reserve:,}, more than its share of the job's engine.max_job_tokens leaves; not sent"
            )
        budget.reserved += reserve

        def release() -> None:
            budget.reserved -= reserve

        return release

    return admit


class _Call:
    """One request, ready to send: its body, cache key and upper bound in tokens."""

    __slots__ = ("body", "bound", "chat", "json_sheet", "key", "path", "request")

    def __init__(
        self,
        *,
        request: GenerationRequest,
        path: str,
        body: dict[str, Any],
        chat: bool,
        json_sheet: bool,
        key: str,
        bound: int,
    ) -> None:
        self.request = request
        self.path = path
        self.body = body
        self.chat = chat
        self.json_sheet = json_sheet
        self.key = key
        self.bound = bound


def _model_info(spec: ShardSpec | JobSpec, *, context_length: int | None) -> ModelInfo:
    """The model's facts when its config is on this machine (a local folder), else its name and context."""
    folder = Path(spec.model).expanduser()
    if (folder / "config.json").is_file():
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(folder, trust_remote_code=spec.engine.trust_remote_code)
            return read_model_info(config, name=spec.model, revision=spec.revision, weights_dir=folder)
        except Exception:  # a config transformers cannot read leaves only what the endpoint said
            pass
    return ModelInfo(name=spec.model, revision=spec.revision, context_length=context_length)
