"""How a job uses its endpoint: the API, the constraint, whether option probabilities are asked and where
token offsets come from (`ServedMode`), chosen from what the probe found (`workers/endpoint_probe.py`) and the
job's spec; or the reason, with the fix, why the job cannot run there.
"""

from __future__ import annotations

from posbias.schemas import (
    AnswerMode,
    ChatTemplateUse,
    Constraint,
    EndpointApi,
    EndpointCapabilities,
    EngineOptions,
    PosbiasError,
    ServedMode,
    TokenSource,
)


def token_source(capabilities: EndpointCapabilities, *, tokenizer: str | None) -> TokenSource:
    """Where token offsets come from: the server's `/tokenize`, else the job's named tokenizer, else none."""
    if capabilities.tokenize:
        return TokenSource.server
    return TokenSource.named if tokenizer is not None else TokenSource.none


def engine_api(
    capabilities: EndpointCapabilities, *, options: EngineOptions, tokens: TokenSource
) -> EndpointApi:
    """The API an engine talks to: the one the options name, or for `auto` completions when prompts can go
    as the server's own token ids (exact, like the in-process engine), else chat, else completions."""
    wanted = options.api or EndpointApi.auto
    if wanted is not EndpointApi.auto:
        return wanted
    if capabilities.completions and tokens is TokenSource.server and capabilities.token_prompts:
        return EndpointApi.completions
    return EndpointApi.chat if capabilities.chat else EndpointApi.completions


def choose_mode(
    capabilities: EndpointCapabilities,
    *,
    options: EngineOptions,
    answer_mode: AnswerMode,
    chat_template: ChatTemplateUse,
    tokenizer: str | None,
) -> ServedMode:
    """How a job uses its endpoint; `PosbiasError` with the reason (and the fix) when it cannot run there."""
    where = capabilities.base_url
    tokens = token_source(capabilities, tokenizer=tokenizer)
    api = engine_api(capabilities, options=options, tokens=tokens)
    if chat_template is ChatTemplateUse.off and api is EndpointApi.chat:
        if not capabilities.completions:
            raise PosbiasError(
                f"chat_template off needs the completions API, which {where} does not answer (its chat API "
                "always applies the model's chat template): set chat_template to auto"
            )
        api = EndpointApi.completions
    if api is EndpointApi.chat and not capabilities.chat:
        raise PosbiasError(f"{where} does not answer the chat API: set engine.api to completions (or auto)")
    if api is EndpointApi.completions and not capabilities.completions:
        raise PosbiasError(f"{where} does not answer the completions API: set engine.api to chat (or auto)")
    constraint = Constraint.none
    if answer_mode is AnswerMode.constrained:
        if capabilities.regex_field is not None:
            constraint = Constraint.regex
        elif capabilities.json_schema:
            constraint = Constraint.json_schema
        else:
            raise PosbiasError(
                f"answer_mode constrained needs structured output (a regular expression, as vLLM's "
                f"structured_outputs, or a JSON schema), and {where} obeyed neither: use answer_mode free"
            )
    alternatives = capabilities.logprobs(api)
    if options.option_probs and alternatives == 0:
        raise PosbiasError(
            f"option probabilities need log-probabilities, which {where} does not return from its {api} API: "
            "set engine.option_probs to false (or leave it unset)"
        )
    use_logprobs = alternatives > 0 and options.option_probs is not False
    return ServedMode(api=api, constraint=constraint, option_probs=use_logprobs, token_offsets=tokens)
