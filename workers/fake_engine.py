"""A fake engine whose accuracy follows a configured curve, and a small deterministic tokenizer for it.

`FakeEngine` implements the `Engine` protocol without a model: it reads the gold answers the request carries
and answers each question correctly with the probability `FakeSpec.accuracy_of` gives at its position (or its
answer slot, or its token distance to its answer: `FakeSpec.depends_on`), with answers correlated
through question and prompt effects as a model's are (see `FakeSpec` and `latent_correct`). Unit tests run
the whole worker path on it, and the analysis is checked by recovering the curve it was given
(benchmarks/coverage.py simulates with the same decision rule, `latent_correct`, without the engine).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import re
import time
import zlib
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from posbias.schemas import EngineInfo, FakeSpec, ModelInfo
from posbias.workers.engine import Encoding, EngineBase, Generation, GenerationRequest

if TYPE_CHECKING:  # numpy is imported where it computes: `posbias trial` renders with this tokenizer
    import numpy as np
    import numpy.typing as npt

SPECIAL_TOKENS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
CHAT_TEMPLATE = "<bos><start_of_turn>user\n{text}<end_of_turn>\n<start_of_turn>model\n"
FIRST_WORD_ID = 1000
VOCAB_SIZE = 1_000_000
DEFAULT_MAX_MODEL_LEN = 1_000_000
GARBAGE = "I am not sure"
FAKE_LAYERS = 4
FAKE_SLIDING_LAYERS = (0, 2)

_PIECES = re.compile(
    "|".join(re.escape(token) for token in SPECIAL_TOKENS) + r"|\w+|[^\w\s]|\s+",
)


def _posbias_version() -> str:
    try:
        return version("posbias")
    except PackageNotFoundError:
        return "unknown"


class FakeTokenizer:
    """Words, single punctuation marks and whitespace runs are tokens; ids are stable across processes.

    The chat template is Gemma's shape (one user turn, BOS inside the template).
    """

    token_reach = max(len(special) for special in SPECIAL_TOKENS)
    """Characters on either side of a position that decide whether a token starts there: a word, a mark or a
    whitespace run starts where the character before it differs in kind, unless the position is inside a
    special token, which is at most this long. `workers/prompt_tokens.py` counts prompts from their pieces
    exactly with it."""

    def __init__(self, *, chat_template: bool = True) -> None:
        self._chat_template = chat_template

    def has_chat_template(self) -> bool:
        """True unless constructed with `chat_template=False`."""
        return self._chat_template

    @property
    def prompt_bos_id(self) -> int | None:
        """None: the fake model answers whatever its prompts begin with (tests' tokenizers built on this one
        drop or move BOS on purpose)."""
        return None

    def apply_chat_template(self, user_text: str) -> str:
        """`user_text` as the single user turn, followed by the model's turn."""
        if not self._chat_template:
            raise ValueError("this tokenizer has no chat template")
        return CHAT_TEMPLATE.format(text=user_text)

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        """Tokens of `text` with their character spans; BOS at (0, 0) first with `add_special_tokens`."""
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        if add_special_tokens:
            ids.append(SPECIAL_TOKENS["<bos>"])
            offsets.append((0, 0))
        for match in _PIECES.finditer(text):
            ids.append(self.token_id(match.group()))
            offsets.append(match.span())
        return Encoding(ids=ids, offsets=offsets)

    @staticmethod
    def token_id(piece: str) -> int:
        """The id of one piece: fixed for special tokens, a CRC of the text otherwise."""
        special = SPECIAL_TOKENS.get(piece)
        if special is not None:
            return special
        return FIRST_WORD_ID + zlib.crc32(piece.encode()) % VOCAB_SIZE


class FakeEngine(EngineBase[FakeTokenizer]):
    """An engine that answers from the gold key with a configured accuracy curve.

    Deterministic like greedy decoding: a request's randomness comes from the engine seed and a digest of its
    prompt tokens, so the same prompt always gets the same answer (sampling settings are ignored).

    It answers the positions the request asks for, in the order asked (as a model following the
    instructions does). Per position p of N: with probability `spec.malformed` (free mode only; constrained
    output always follows the regex) the line is garbage, half the time `p. I am not sure` and half the time
    left out; otherwise the answer is the gold option with probability `spec.accuracy_of(...)` at its
    position, its answer slot or its token distance (`spec.depends_on`; the distance is measured exactly as
    the worker records it), and a uniformly drawn wrong option otherwise, among `len(request.option_labels)`
    options.

    Log-probabilities: at an answer's digit the distribution over the options is half a point mass on the
    option written plus half a "belief" giving the gold option the answer's accuracy and the rest equal
    shares. The written option is always the most probable (as under greedy decoding), and the mean
    probability of the gold option equals the configured accuracy of the answer. Where `spec.collapse`
    applies, that distribution is multiplied by its option prior and renormalised, and the fake writes the
    most probable option (a strong prior: always the favoured one). Every other output token has
    log-probability 0.

    It states itself as engine `fake` at posbias's version, with no dtype or device.
    """

    def __init__(
        self,
        spec: FakeSpec,
        *,
        seed: int = 0,
        model: str = "fake",
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        tokenizer: FakeTokenizer | None = None,
    ) -> None:
        self._spec = spec
        self._seed = seed
        self._model = model
        self._max_model_len = max_model_len
        self._tokenizer = tokenizer or FakeTokenizer()
        self._info = EngineInfo(name="fake", version=_posbias_version(), dtype="none", device="none")
        self._model_info = _model_info(spec, model=model, max_model_len=max_model_len)
        self.calls = 0
        """Number of `generate` calls, so tests can check that a shard is one engine call."""
        self.closed = False
        self._event("load")

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Answer every request, sleeping `spec.delay_s` per prompt."""
        if self.closed:
            raise RuntimeError("the fake engine was closed")
        self.calls += 1
        generations = []
        for request in requests:
            too_long = len(request.prompt_token_ids) + request.max_tokens - self._max_model_len
            if too_long > 0:
                raise ValueError(f"prompt plus max_tokens exceeds max_model_len by {too_long} tokens")
            if self._spec.delay_s:
                time.sleep(self._spec.delay_s)
            generations.append(self._answer(request))
        return generations

    def close(self) -> None:
        """Answer no more; recorded in `spec.events_file` when there is one."""
        if not self.closed:
            self.closed = True
            self._event("close")

    def _event(self, what: str) -> None:
        """One line `<what> <model> pid=<pid> gpus=<CUDA_VISIBLE_DEVICES>` in `spec.events_file`."""
        if self._spec.events_file is None:
            return
        gpus = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        with open(self._spec.events_file, "a") as events:
            events.write(f"{what} {self._model} pid={os.getpid()} gpus={gpus}\n")

    def _answer(self, request: GenerationRequest) -> Generation:
        import numpy as np

        if request.answer_key is None:
            raise ValueError("the fake engine answers from request.answer_key; render with a key")
        rng = np.random.default_rng([abs(self._seed), int(self._seed < 0), _digest(request.prompt_token_ids)])
        labels = request.option_labels
        n_options = len(labels)
        n = len(request.answer_key)
        asked = request.asked or tuple(range(1, n + 1))
        ids = request.question_ids or tuple(f"position-{p}" for p in range(1, n + 1))
        questions = question_latents(ids)
        prompt = prompt_latent(ids)
        # Four draws per position whatever happens (and whichever positions are asked), so the answers do not
        # depend on `malformed` or on the order asked.
        draws = rng.random((n, 4))
        lines: list[str] = []
        answered: list[tuple[int, int]] = []  # (line, position) of answer lines
        for position in asked:
            malformed, kind, _, _ = draws[position - 1]
            if request.regex is None and malformed < self._spec.malformed:
                if kind < 0.5:
                    lines.append(f"{position}. {GARBAGE}")
                continue
            answered.append((len(lines), position))
            lines.append(f"{position}. {labels[0]}")  # the option is chosen below; its token is the same

        # Where each answer's token lands, from the sheet with placeholder options (every label is one token).
        line_starts = np.cumsum([0] + [len(line) + 1 for line in lines])
        sheet = self._tokenizer.encode("\n".join(lines), add_special_tokens=False)
        starts = [start for start, _ in sheet.offsets]
        chosen: dict[int, tuple[int, list[float]]] = {}  # line -> (option, option probabilities)
        for line, position in answered:
            token = starts.index(int(line_starts[line]) + lines[line].index(". ") + 2)
            ends = request.question_token_ends
            distance = (
                len(request.prompt_token_ids) - ends[position - 1] + token if ends is not None else None
            )
            accuracy = float(
                self._spec.accuracy_of(
                    position=position, batch_size=n, slot=line + 1, answers=len(asked), distance=distance
                )
            )
            gold = request.answer_key[position - 1]
            option = gold
            right = latent_correct(
                accuracy,
                question=questions[position - 1],
                prompt=prompt,
                noise=float(ndtri(draws[position - 1, 2])),
                question_effect=self._spec.question_effect,
                prompt_effect=self._spec.prompt_effect,
            )
            if not right:
                others = [i for i in range(n_options) if i != gold]
                option = others[int(draws[position - 1, 3] * len(others))]
            probs = option_probs(n_options, chosen=option, gold=gold, accuracy=accuracy)
            collapse = self._spec.collapse
            if collapse is not None and collapse.applies(position):
                probs = with_prior(probs, collapse.weights(n_options))
                option = int(np.argmax(probs))
            chosen[line] = (option, probs)
            lines[line] = f"{position}. {labels[option]}"
        text = "\n".join(lines)

        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        offsets = [start for start, _ in encoding.offsets]
        logprobs: list[dict[str, float]] = [{text[s:e].strip(): 0.0} for s, e in encoding.offsets]
        for line, _ in answered:
            _, probs = chosen[line]
            digit_at = int(line_starts[line]) + lines[line].index(". ") + 2
            token = offsets.index(digit_at)
            logprobs[token] = {label: math.log(p) for label, p in zip(labels, probs, strict=True) if p > 0}

        if len(encoding.ids) > request.max_tokens:  # a real engine stops at the limit mid-sheet
            cut = offsets[request.max_tokens]
            text = text[:cut]
            del (
                encoding.ids[request.max_tokens :],
                offsets[request.max_tokens :],
                logprobs[request.max_tokens :],
            )
        if request.regex is not None and re.fullmatch(request.regex, text) is None:
            raise ValueError(f"the answer sheet does not match the request's regex: {text[:80]!r}")
        return Generation(
            text=text, token_ids=list(encoding.ids), token_offsets=offsets, top_logprobs=logprobs
        )


def _model_info(spec: FakeSpec, *, model: str, max_model_len: int) -> ModelInfo:
    """The name and the context length; with `spec.window`, a 4-layer model whose layers 0 and 2 slide over
    that window (the shape of Gemma 2), so results are window-aware as a real model's are. With a
    mechanism, its RoPE base too, and no sliding layer under `global-only`.

    A variant that changes these facts (`global-only`, `rope-base:x<f>`) states its change as `hf_overrides`,
    as a real engine's variant does, so that it is a model of its own in the store: under one identity, the
    variant built first would stand for the baseline too (the store keeps the first write), and a diagnosis
    read the behaviour job's window from whichever shard the worker wrote first."""
    mechanism = spec.mechanism
    rope = None if mechanism is None else mechanism.rope_theta * mechanism.rope_factor
    changed: dict[str, Any] = {}
    if mechanism is not None and mechanism.global_only:
        changed["global_only"] = True
    if mechanism is not None and mechanism.rope_factor != 1.0:
        changed["rope_factor"] = mechanism.rope_factor
    if spec.window is None or (mechanism is not None and mechanism.global_only):
        if mechanism is None:
            return ModelInfo(name=model, context_length=max_model_len)
        return ModelInfo(
            name=model,
            architecture="FakeMechanism",
            num_layers=FAKE_LAYERS,
            rope_theta=rope,
            context_length=max_model_len,
            hf_overrides=changed,
        )
    return ModelInfo(
        name=model,
        architecture="FakeSlidingWindow",
        num_layers=FAKE_LAYERS,
        sliding_window=spec.window,
        sliding_window_layers=FAKE_SLIDING_LAYERS,
        rope_theta=rope,
        context_length=max_model_len,
        hf_overrides=changed,
    )


def latent_correct(
    accuracy: float | npt.NDArray[np.float64],
    *,
    question: float | npt.NDArray[np.float64],
    prompt: float | npt.NDArray[np.float64],
    noise: float | npt.NDArray[np.float64],
    question_effect: float,
    prompt_effect: float,
) -> Any:
    """The fake's decision rule: an answer is correct when its latent score, `sqrt(question_effect) *
    question + sqrt(prompt_effect) * prompt + sqrt(rest) * noise` (standard normal parts, so the score is
    standard normal), falls below the normal quantile of `accuracy`. So `accuracy` is the exact marginal
    probability of a correct answer, and answers sharing a question or a prompt are correlated. Works on
    floats and on numpy arrays alike."""
    rest = 1.0 - question_effect - prompt_effect
    score = (
        math.sqrt(question_effect) * question + math.sqrt(prompt_effect) * prompt + math.sqrt(rest) * noise
    )
    return score < ndtri(accuracy)


def question_latents(question_ids: Sequence[str]) -> npt.NDArray[np.float64]:
    """Each question's latent difficulty: a standard normal drawn from its id alone, so it is the same in
    every job and for every fake seed."""
    import numpy as np

    return np.array([_normal_of(f"question:{qid}") for qid in question_ids])


def prompt_latent(question_ids: Sequence[str]) -> float:
    """A prompt's latent effect: a standard normal drawn from the set of questions it shows, so the rotations
    of one set share it."""
    return _normal_of("prompt:" + "\x1f".join(sorted(question_ids)))


def ndtri(p: Any) -> Any:
    """The standard normal quantile of `p` (scipy's `ndtri`; a number or an array)."""
    return _scipy_ndtri()(p)


@functools.cache
def _scipy_ndtri() -> Any:
    # Imported on first use: `posbias trial` loads this module for its tokenizer alone, and scipy.special
    # would cost it a tenth of a second or more.
    from scipy.special import ndtri as quantile

    return quantile


def _normal_of(text: str) -> float:
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return float(ndtri((digest + 0.5) / 2**64))


def option_probs(n_options: int, *, chosen: int, gold: int, accuracy: float) -> list[float]:
    """The fake's probabilities over the shown options: half a point mass on the option it writes and half
    a belief giving the gold option the answer's accuracy and the rest equal shares."""
    n = n_options
    belief = [accuracy if i == gold else (1 - accuracy) / (n - 1) for i in range(n)]
    return [0.5 * (i == chosen) + 0.5 * belief[i] for i in range(n)]


def with_prior(probs: Sequence[float], prior: Sequence[float]) -> list[float]:
    """`probs` times an option prior, renormalised (the observed probabilities of a model with that prior,
    in PriDe's model: Zheng et al. 2024)."""
    weighted = [p * q for p, q in zip(probs, prior, strict=True)]
    total = sum(weighted)
    return [w / total for w in weighted]


def _digest(token_ids: Sequence[int]) -> int:
    import numpy as np

    data = np.asarray(token_ids, dtype=np.int64).tobytes()
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def fake_model_info(spec: FakeSpec, *, model: str) -> ModelInfo:
    """The config facts a fake model of `spec` reports, as its engine would (`posbias diagnose` plans from
    them before any job has run)."""
    return _model_info(spec, model=model, max_model_len=DEFAULT_MAX_MODEL_LEN)
