"""Served models: what an OpenAI-compatible endpoint can do, and how a job uses it.

`EndpointCapabilities` is what the probe (`workers/endpoint_probe.py`) found when a job was submitted; the
`ServedMode` is what the job does with it (which API, which constraint, where token offsets come from). Both
are stored with the job (`EndpointReport`, the `jobs.endpoint` column), so a result can be traced to exactly
what the endpoint offered. Nothing here holds or names an API key's value.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from posbias.schemas.choices import EndpointApi as EndpointApi
from posbias.schemas.record import Record


class Constraint(StrEnum):
    """How constrained mode forces the answer sheet."""

    none = "none"
    regex = "regex"
    """A regular expression for exactly N lines `k. i` (vLLM's `structured_outputs`, or `guided_regex` of
    older vLLM), as the in-process engine does."""
    json_schema = "json_schema"
    """A JSON object `{"1": i, "2": i, ...}` (OpenAI's structured outputs), turned into the answer sheet."""


class TokenSource(StrEnum):
    """Where a served job's token offsets come from."""

    server = "server"
    """The endpoint's own tokenizer (`/tokenize`): prompts are sent as token ids, offsets are exact."""
    named = "named"
    """A tokenizer the job names (`tokenizer`): offsets are as exact as that tokenizer is the model's."""
    none = "none"
    """No tokenizer: token offsets and token distances are unknown (null)."""


class EndpointCapabilities(Record):
    """What an OpenAI-compatible endpoint answered to the probe."""

    base_url: str = Field(description="The endpoint, e.g. `http://127.0.0.1:8000/v1` (never credentials).")
    served_model: str = Field(description="The model name the endpoint answered with.")
    server_version: str | None = Field(
        None, description="The version the server reports (vLLM's `/version`), or its system fingerprint."
    )
    max_model_len: int | None = Field(
        None, description="Context length the endpoint reports for the model (vLLM's `/v1/models`)."
    )
    completions: bool = Field(description="`/completions` answers.")
    chat: bool = Field(description="`/chat/completions` answers.")
    completions_logprobs: int = Field(
        0, ge=0, description="Alternatives per token `/completions` returns with log-probabilities; 0: none."
    )
    chat_logprobs: int = Field(
        0, ge=0, description="Alternatives per token `/chat/completions` returns (`top_logprobs`); 0: none."
    )
    regex_field: str | None = Field(
        None,
        description="The request field that constrains output by a regular expression and was obeyed "
        "(`structured_outputs` or `guided_regex`); None when no regex was obeyed.",
    )
    json_schema: bool = Field(False, description="`response_format: json_schema` was obeyed.")
    tokenize: bool = Field(
        False,
        description="`/tokenize` returns token ids with token strings that line up with the text, so token "
        "offsets are exact.",
    )
    chat_template: bool = Field(
        False, description="`/tokenize` renders chat messages (the server has a chat template)."
    )
    token_prompts: bool = Field(
        False, description="`/completions` accepts a prompt given as token ids (checked with `/tokenize`)."
    )

    def logprobs(self, api: EndpointApi) -> int:
        """Alternatives per token that `api` returns; 0 when it returns no log-probabilities."""
        return self.chat_logprobs if api is EndpointApi.chat else self.completions_logprobs


class ServedMode(Record):
    """How a job uses its endpoint, decided at submit from the capabilities and the spec."""

    api: EndpointApi = Field(description="`chat` or `completions` (never `auto` once decided).")
    constraint: Constraint = Field(description="How constrained answers are forced; `none` in free mode.")
    option_probs: bool = Field(description="Log-probabilities are requested for the option probabilities.")
    token_offsets: TokenSource = Field(description="Where prompt and answer token offsets come from.")


class EndpointReport(Record):
    """Everything submit learnt about a served job's endpoint, stored with the job."""

    capabilities: EndpointCapabilities = Field(description="What the probe found.")
    mode: ServedMode = Field(description="How the job uses the endpoint.")
    token_bound: int = Field(
        ge=0,
        description="Tokens the job is expected to spend at most: every prompt (a sample counted with the "
        "endpoint's tokenizer when there is one, else estimated) plus every output budget in full.",
    )
    token_bounds: dict[int, int] = Field(description="`token_bound` by batch size.")
    share_basis: dict[int, int] = Field(
        description="By batch size, its trials' tokens by the per-trial estimate that shards' shares of the "
        "cost guard are measured in (`service/work/costs.py`)."
    )
