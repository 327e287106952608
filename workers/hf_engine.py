"""`HfEngine`: the `Engine` interface on Hugging Face transformers, for mechanistic jobs. It renders the same
prompts as the vLLM engine (the same `workers/prompts.py`, the model's own tokenizer through `HfTokenizer`)
and scores them by teacher forcing: one forward pass over the prompt and an answer sheet, which gives the
option probabilities at every answer slot and, through the answer-rows attention (`workers/hf_attention.py`:
torch's fused attention for the layers' outputs, the answer lines' rows of weights recomputed in float32),
where each answer line's attention goes, per layer.

The answer sheet (`engine.answer_sheet`) is `gold` (each question's correct option; the default) or `fixed`
(option 1 everywhere) or `{job: N}`: what done job N (a vLLM job of the same trials) answered, read into each
shard's `answers` when it is leased (`service/work/answer_sheets.py`), so that attention pairs with what the
model actually did. Parsed like any answer, a sheet makes every result's `predicted` the sheet's option, so an
`hf` job's accuracy says nothing about the model: its option probabilities and its attention do.

The layers come from the model that was built: each attention module's window (transformers 5 sets one per
layer from `config.layer_types` for Gemma 2 and 3), checked by the mask canary (`workers/hf_canary.py`)
before a prompt is scored. Variants apply their `hf_overrides` to the config before the model is built and
are refused, as on vLLM, when the built layers differ from what they expect.
"""

from __future__ import annotations

import gc
import resource
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from posbias.schemas import (
    EngineInfo,
    EngineOptions,
    PosbiasError,
    ShardResult,
    ShardSpec,
    Variant,
    WorkerConfig,
)
from posbias.schemas.attention import AnswerSheet, AttentionRow, AttentionShard, LayerKind, MaskCanary
from posbias.schemas.variant import merge_overrides
from posbias.workers.engine import EngineBase, Generation, GenerationRequest
from posbias.workers.hf_attention import (
    ANSWERS,
    INSTRUCTIONS,
    QUESTIONS,
    SINK,
    Recorder,
    layout,
    recording,
)
from posbias.workers.hf_build import BuiltModel, build_model
from posbias.workers.hf_canary import describe_failure, run_canary
from posbias.workers.prompts import RenderedPrompt, render_trial
from posbias.workers.tokenizer import HfTokenizer

ATTENTION_BACKEND = "sdpa; answer rows in float32"
"""What the engine info records: torch's fused attention computes the layers, the recorded weights are the
answer rows' own, recomputed in float32 (`workers/hf_attention.py`)."""


@dataclass
class _Scored:
    """What one teacher-forced prompt left: its attention rows by position, without the trial index."""

    rows: list[AttentionRow]
    state_bytes: int


class HfEngine(EngineBase[HfTokenizer]):
    """A model loaded in transformers, scoring prompts by teacher forcing and recording the attention of the
    answer rows. Implements `workers.engine.Engine`; `run_shards` adds the attention figures to each
    result."""

    def __init__(
        self,
        model: str,
        *,
        revision: str | None = None,
        tokenizer: str | None = None,
        options: EngineOptions | None = None,
        variant: Variant | None = None,
        config: WorkerConfig,
        device: str | None = None,
    ) -> None:
        """Load `model` with the config changes of `options` and `variant` on `device` (`cuda`, `cpu`;
        None: `cuda` where there is a GPU), then run the mask canary. Raises `PosbiasError` when the model
        cannot be loaded or does not fit its GPUs, when it built other layers than the variant expects, when
        the canary fails, and when a position gap is asked and the mask moves with it."""
        options = options or EngineOptions(name="hf")
        overrides = merge_overrides(options.hf_overrides, variant.hf_overrides if variant else {})
        self._built: BuiltModel = build_model(
            model,
            revision=revision,
            tokenizer=tokenizer,
            options=options,
            overrides=overrides,
            config=config,
            device=device,
        )
        self._model = self._built.model
        self._tokenizer = self._built.tokenizer
        sheet = options.answer_sheet or AnswerSheet.gold
        self._sheet = sheet if isinstance(sheet, AnswerSheet) else AnswerSheet.job
        self._gap = options.position_gap or None
        layers = self._built.layers
        if variant is not None and variant.expect is not None:
            differences = variant.expect.differences(layers)
            if differences:
                raise PosbiasError(
                    f"variant {variant.name} asked for {variant.expect.describe()}, but transformers built "
                    f"{layers.describe()}: " + "; ".join(differences) + ". Refusing to run it (set the "
                    "change where transformers reads it, e.g. layer_types rather than a pattern)"
                )
        self._canary: MaskCanary = run_canary(
            self._model,
            windows=layers.windows,
            rope_theta=layers.rope_theta,
            vocab_size=self._built.vocab_size,
            first=self._built.bos_token_id,
            gap=self._gap,
        )
        if not self._canary.passed:
            raise PosbiasError(
                "the mask canary failed: the built model does not attend as its layer kinds say ("
                + describe_failure(self._canary)
                + "); refusing to record attention on it"
            )
        if self._gap is not None and not self._canary.position_gap_safe:
            raise PosbiasError(
                f"position_gap is refused on this transformers ({self._built.version}): a gap of {self._gap} "
                "in the position ids moved the attention mask, so the design would change the window too; "
                "run it without position_gap, or on a transformers that keeps the mask in token indices"
            )
        self._max_model_len = self._built.max_model_len
        self._model_info = self._built.model_info
        self._info = EngineInfo(
            name="hf",
            version=self._built.version,
            dtype=self._built.dtype,
            attention_backend=ATTENTION_BACKEND,
            max_model_len=self._max_model_len,
            device=self._built.device,
        )
        self._rendered: dict[tuple[int, ...], RenderedPrompt] = {}
        self._scored: dict[tuple[int, ...], _Scored] = {}
        self._answers: dict[tuple[int, ...], dict[int, int]] = {}
        self._map_bytes = 0

    @property
    def canary(self) -> MaskCanary:
        """The mask canary of the model as built."""
        return self._canary

    def run_shards(
        self, shards: Sequence[ShardSpec], *, answers: Mapping[int, Mapping[int, int]] | None = None
    ) -> list[ShardResult]:
        """`workers.shard.run_shards` on this engine, each result carrying its attention figures.

        `answers` (by trial index: the 1-based option per position) replace the engine's answer sheet for
        those trials, e.g. what a vLLM job answered to the same trials; without them, a shard's own
        `answers` (`engine.answer_sheet: {job: N}`, filled at lease time) do."""
        from posbias.workers.shard import run_shards

        for shard in shards:
            for trial in shard.trials:
                rendered = render_trial(
                    trial, spec=shard, questions=shard.questions, tokenizer=self._tokenizer
                )
                ids = tuple(rendered.token_ids or ())
                self._rendered[ids] = rendered
                given = answers if answers is not None else shard.answers
                if given is not None and trial.index in given:
                    self._answers[ids] = dict(given[trial.index])
        self._map_bytes = 0
        try:
            results = run_shards(shards, engine=self)
            return [
                self._with_attention(shard, result) for shard, result in zip(shards, results, strict=True)
            ]
        finally:
            self._rendered.clear()
            self._scored.clear()
            self._answers.clear()

    def run_shard(self, shard: ShardSpec) -> ShardResult:
        """`run_shards` of one shard."""
        return self.run_shards([shard])[0]

    def _with_attention(self, shard: ShardSpec, result: ShardResult) -> ShardResult:
        distances = {(r.trial_index, r.position): r.token_distance for r in result.results}
        done = {t.trial_index for t in result.trials if t.status == "done"}
        rows: list[AttentionRow] = []
        state = 0
        for trial in shard.trials:
            if trial.index not in done:
                continue
            rendered = render_trial(trial, spec=shard, questions=shard.questions, tokenizer=self._tokenizer)
            scored = self._scored.get(tuple(rendered.token_ids or ()))
            if scored is None:
                continue
            state = max(state, scored.state_bytes)
            rows.extend(
                row.model_copy(
                    update={
                        "trial_index": trial.index,
                        "token_distance": distances.get((trial.index, row.position)),
                    }
                )
                for row in scored.rows
            )
        attention = AttentionShard(
            rows=tuple(rows),
            canary=self._canary,
            answer_sheet=self._sheet,
            state_bytes_per_trial=state,
            map_bytes_peak=self._map_bytes,
            peak_memory_bytes=_peak_memory(self._built.device, gpus=self._built.gpus),
        )
        return result.model_copy(update={"attention": attention})

    def generate(
        self, requests: Sequence[GenerationRequest], *, temperature: float, top_p: float, seed: int | None
    ) -> list[Generation]:
        """Teacher-force the answer sheet after each prompt, one forward pass each; the sampling settings
        do not apply (nothing is sampled). Log-probabilities of the option labels at every sheet token."""
        return [self._score(request) for request in requests]

    def _score(self, request: GenerationRequest) -> Generation:
        import torch

        prompt = list(request.prompt_token_ids)
        asked = (
            list(request.asked) if request.asked is not None else list(range(1, len(request.n_options) + 1))
        )
        key = request.answer_key or tuple(0 for _ in request.n_options)
        # A position the given answers leave out (one job N did not parse) gets the gold answer.
        chosen = {k: (key[k - 1] if self._sheet is not AnswerSheet.fixed else 0) + 1 for k in asked}
        chosen |= self._answers.get(tuple(prompt), {})
        sheet = sheet_text(asked, chosen)
        encoded = self._tokenizer.encode(sheet, add_special_tokens=False)
        sheet_ids, starts = encoded.ids, [start for start, _ in encoded.offsets]
        slots = answer_slots(asked, chosen, starts)
        total = len(prompt) + len(sheet_ids)
        rendered = self._rendered.get(tuple(prompt))
        recorder = Recorder()
        if rendered is not None:
            recorder.layout = layout(
                total,
                sink_end=_sink_end(rendered, tokenizer=self._tokenizer),
                questions=[(q.token_start or 0, q.token_end or 0) for q in rendered.questions],
                answers_start=len(prompt),
                lines=[(k, range(len(prompt) + first, len(prompt) + slot)) for k, first, slot in slots],
                window=self._model_info.sliding_window,
            )
        device = self._built.input_device
        input_ids = torch.tensor([prompt + sheet_ids], dtype=torch.long, device=device)
        positions = torch.arange(total, device=device)
        if self._gap is not None and rendered is not None:
            at = max((q.token_end or 0) for q in rendered.questions)
            positions[at:] += self._gap
        keep = torch.arange(len(prompt) - 1, total - 1, device=device)
        with torch.inference_mode(), recording(self._model, recorder):
            output = self._model(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                position_ids=positions.view(1, -1),
                use_cache=False,
                logits_to_keep=keep,
            )
        logprobs = torch.log_softmax(output.logits[0].float(), dim=-1)
        self._map_bytes = max(self._map_bytes, recorder.map_bytes_peak)
        top = self._top_logprobs(
            logprobs, asked=asked, slots=slots, n_options=request.n_options, sheet_ids=sheet_ids
        )
        if rendered is not None:
            self._scored[tuple(prompt)] = _rows(recorder, kinds=self._kinds())
        del output, logprobs
        return Generation(text=sheet, token_ids=sheet_ids, token_offsets=starts, top_logprobs=top)

    def _kinds(self) -> list[LayerKind]:
        return [LayerKind.sliding if w is not None else LayerKind.global_ for w in self._built.layers.windows]

    def _top_logprobs(
        self,
        logprobs: Any,
        *,
        asked: Sequence[int],
        slots: Sequence[tuple[int, int, int]],
        n_options: Sequence[int],
        sheet_ids: Sequence[int],
    ) -> list[dict[str, float]]:
        """Per sheet token, the log-probability of each option label where that token is an answer."""
        top: list[dict[str, float]] = [{} for _ in sheet_ids]
        for k, _, slot in slots:
            labels = [str(i) for i in range(1, n_options[k - 1] + 1)]
            ids = [self._label_id(k, label) for label in labels]
            top[slot] = {label: float(logprobs[slot, i]) for label, i in zip(labels, ids, strict=True)}
        return top

    def _label_id(self, position: int, label: str) -> int:
        """The token option `label` is in the line of `position` (as the sheet tokenizes it)."""
        line = f"{position}. {label}"
        encoded = self._tokenizer.encode(line, add_special_tokens=False)
        digit = len(line) - len(label)
        found = [
            i for (start, end), i in zip(encoded.offsets, encoded.ids, strict=True) if start <= digit < end
        ]
        return found[0] if found else encoded.ids[-1]

    def close(self) -> None:
        """Drop the model and free its memory, on a GPU too (the caching allocator's blocks are handed back,
        so `torch.cuda.memory_allocated` is where it was before the load); safe to call twice."""
        if getattr(self, "_model", None) is None:
            return
        on_gpu = self._built.device == "cuda"
        self._model = None
        self._built = None  # type: ignore[assignment]
        self._rendered.clear()
        self._scored.clear()
        gc.collect()
        if on_gpu:
            import torch

            torch.cuda.empty_cache()


def sheet_text(asked: Sequence[int], chosen: dict[int, int]) -> str:
    """The answer sheet: one line `k. i` per position asked, in the order asked, as constrained decoding
    writes it (`workers/prompts.py` `answer_regex`)."""
    return "\n".join(f"{k}. {chosen[k]}" for k in asked)


def answer_slots(
    asked: Sequence[int], chosen: dict[int, int], starts: Sequence[int]
) -> list[tuple[int, int, int]]:
    """Per line: its position, the index of its first sheet token, and of its answer token."""
    import bisect

    found = []
    at = 0
    for k in asked:
        line = f"{k}. {chosen[k]}"
        first = bisect.bisect_right(starts, at) - 1
        slot = bisect.bisect_right(starts, at + len(line) - len(str(chosen[k]))) - 1
        found.append((k, max(first, 0), max(slot, first + 1)))
        at += len(line) + 1
    return found


def _sink_end(rendered: RenderedPrompt, *, tokenizer: HfTokenizer) -> int:
    """Tokens before the user's text: the first token and the chat template's prefix."""
    if not rendered.chat_template_used:
        return 1
    shift = rendered.text.find(rendered.user_text)
    offsets = tokenizer.encode(rendered.text, add_special_tokens=False).offsets
    return max(1, sum(1 for start, end in offsets if end <= shift))


def _rows(recorder: Recorder, *, kinds: Sequence[LayerKind]) -> _Scored:
    assert recorder.layout is not None
    rows = []
    for layer, masses in sorted(recorder.layers.items()):
        for line_index, (position, queries) in enumerate(recorder.layout.lines):
            regions = masses.regions[line_index]  # (heads, regions)
            questions = regions[:, QUESTIONS:]
            own = questions[:, position - 1]
            other = questions.sum(dim=1) - own
            beyond = masses.beyond[line_index] if masses.beyond is not None else None
            rows.append(
                AttentionRow(
                    trial_index=0,
                    position=position,
                    layer=layer,
                    layer_kind=kinds[layer],
                    query_tokens=len(queries),
                    own_mean=float(own.mean()),
                    own_max=float(own.max()),
                    sink_mean=float(regions[:, SINK].mean()),
                    sink_max=float(regions[:, SINK].max()),
                    other_mean=float(other.mean()),
                    other_max=float(other.max()),
                    instructions_mean=float(regions[:, INSTRUCTIONS].mean()),
                    instructions_max=float(regions[:, INSTRUCTIONS].max()),
                    answers_mean=float(regions[:, ANSWERS].mean()),
                    beyond_window_mean=None if beyond is None else float(beyond.mean()),
                    beyond_window_max=None if beyond is None else float(beyond.max()),
                )
            )
    # Fifteen floats and a few integers a row, as the store keeps them.
    return _Scored(rows=rows, state_bytes=len(rows) * 19 * 8)


def _peak_memory(device: str, *, gpus: int) -> int | None:
    if device == "cuda":
        import torch

        return sum(int(torch.cuda.max_memory_allocated(i)) for i in range(max(gpus, 1)))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
