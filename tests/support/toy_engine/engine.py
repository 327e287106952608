"""The toy engine itself: every asked position answered with its first option, in the order asked."""

from __future__ import annotations

from collections.abc import Sequence

from posbias.schemas import EngineInfo, ModelInfo
from posbias.workers.engine import EngineBase, Generation, GenerationRequest
from posbias.workers.fake_engine import FakeTokenizer


class FirstOptionEngine(EngineBase[FakeTokenizer]):
    """Answers `k. <first option>` for every position k the prompt asks for."""

    def __init__(self, *, model: str) -> None:
        self._tokenizer = FakeTokenizer()
        self._max_model_len = 1 << 16
        self._info = EngineInfo(name="toy-first-option", version="1", dtype="none", device="none")
        self._model_info = ModelInfo(name=model, context_length=self._max_model_len)

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """One answer sheet per request."""
        found = []
        for request in requests:
            asked = request.asked or tuple(range(1, len(request.n_options) + 1))
            text = "\n".join(f"{k}. {request.option_labels[0]}" for k in asked)
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
            offsets = [start for start, _ in encoding.offsets]
            found.append(
                Generation(text=text, token_ids=encoding.ids, token_offsets=offsets, top_logprobs=None)
            )
        return found

    def close(self) -> None:
        """Nothing to free."""
