"""What travels between the driver and a worker: questions, trials, shards and their results.

A `ShardSpec` is self-contained (it carries every question's text, options and gold answer), so a worker
needs nothing but the shard and an engine. A `ShardResult` is everything the driver writes to the store.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pydantic import Field, JsonValue, model_validator

from posbias.schemas.attention import AttentionShard
from posbias.schemas.engine_spec import EngineOptions
from posbias.schemas.fake_spec import FakeSpec
from posbias.schemas.filler_spec import FillerSpec
from posbias.schemas.modes import AnswerMode, ChatTemplateUse
from posbias.schemas.prompt import PromptTemplate
from posbias.schemas.record import Record
from posbias.schemas.sampling import SamplingSpec
from posbias.schemas.variant import BASELINE, LayerConfig, Variant


class Question(Record):
    """One multiple-choice question as loaded from the dataset."""

    id: str = Field(description="Stable id: subject plus a hash of the content, equal across jobs.")
    subject: str = Field(description="Dataset subject (e.g. `anatomy`); `default` when the data has none.")
    question: str = Field(description="Question text.")
    choices: tuple[str, ...] = Field(min_length=2, description="Option texts in the dataset's order.")
    answer: int = Field(ge=0, description="0-based index of the correct option in `choices`.")


class Trial(Record):
    """One rendered prompt: N questions in order, plus how their options are presented."""

    index: int = Field(ge=0, description="0-based index of the trial within its job; unique per job.")
    batch_size: int = Field(ge=1, description="N, the number of questions in the prompt.")
    iteration: int = Field(ge=0, description="0-based iteration number within the batch size.")
    question_ids: tuple[str, ...] = Field(description="Question ids in prompt order (position 1 first).")
    choice_orders: tuple[tuple[int, ...], ...] | None = Field(
        None,
        description="Per position, the dataset indices of the options in the order shown; None when "
        "options are not shuffled.",
    )
    rotation: int = Field(
        0, ge=0, description="Rotation design: how far the sampled set was rotated (0 for `random`)."
    )
    variant: str = Field(
        BASELINE,
        description="The variant (engine configuration) that answers this trial; every variant of a job "
        "answers the same trials.",
    )
    answer_order: tuple[int, ...] | None = Field(
        None,
        description="Positions in the order their answers are asked (the instructions state it); None for "
        "forward order, 1..N.",
    )
    probe: int | None = Field(
        None, ge=1, description="Probe design: the one position whose answer is asked; None otherwise."
    )
    filler_tokens: int = Field(0, ge=0, description="Length of the prompt's filler in tokens (0: none).")

    def asked(self) -> tuple[int, ...]:
        """The positions whose answers the prompt asks for, in the order it asks them."""
        if self.probe is not None:
            return (self.probe,)
        return self.answer_order or tuple(range(1, self.batch_size + 1))


class PlannedShard(Record):
    """A shard as planned: which of the job's trials it holds."""

    index: int = Field(ge=0, description="0-based shard index within the job.")
    trial_indices: tuple[int, ...] = Field(min_length=1, description="Trial indices, in order.")
    variant: str = Field(BASELINE, description="The variant whose engine runs the shard's trials.")


class QuestionPool(Record):
    """The questions a job may sample, sorted by id so that sampling does not depend on load order."""

    questions: tuple[Question, ...] = Field(description="Every question, sorted by id, ids unique.")
    subjects: tuple[str, ...] = Field(description="Subjects present in `questions`, sorted.")
    source: str = Field(description="Where the questions came from, for messages and logs.")

    def __len__(self) -> int:
        return len(self.questions)

    def by_id(self) -> dict[str, Question]:
        """The questions keyed by id."""
        return {question.id: question for question in self.questions}


class Plan(Record):
    """A job spec turned into work: its trials, their grouping into shards, and the questions they use."""

    trials: tuple[Trial, ...] = Field(description="Every trial of the job, by index.")
    shards: tuple[PlannedShard, ...] = Field(description="Shards; each trial is in exactly one.")
    questions: dict[str, Question] = Field(description="Every question some trial uses, by id.")


class ShardSpec(Record):
    """The unit of work a worker leases: some trials of one job, with all it needs to run them."""

    job_id: int = Field(description="Job the shard belongs to.")
    shard_id: int = Field(description="Shard id in the store.")
    model: str = Field(description="Model to load: hub id, local folder or .gguf file.")
    revision: str | None = Field(None, description="Model revision.")
    tokenizer: str | None = Field(None, description="Tokenizer, when not the model's own.")
    model_key: str = Field(description="Identity of the engine; shards with the same key share an actor.")
    engine: EngineOptions = Field(description="Engine settings.")
    variant: Variant = Field(
        default_factory=lambda: Variant(name=BASELINE),
        description="The engine configuration to run: its hf_overrides and what vLLM must build for it.",
    )
    fake: FakeSpec = Field(
        default_factory=FakeSpec,
        description="Fake engine behaviour (engine `fake`), with the variant's changes.",
    )
    answer_mode: AnswerMode = Field(description="Free or constrained answers.")
    prompt: PromptTemplate = Field(description="Prompt wording.")
    chat_template: ChatTemplateUse = Field(description="Whether to wrap the prompt in a chat template.")
    sampling: SamplingSpec = Field(description="Decoding settings.")
    seed: int = Field(description="Job seed; the fake engine and the filler derive their randomness from it.")
    filler: FillerSpec | None = Field(None, description="The job's filler, when it has one.")
    trials: tuple[Trial, ...] = Field(description="Trials to run, in order.")
    questions: dict[str, Question] = Field(description="Every question the trials use, by id.")
    token_budget: int | None = Field(
        None,
        ge=0,
        description="openai with a cost guard: tokens this shard may spend, its share of the job's "
        "`max_job_tokens`; a shard that would spend more is stopped before sending "
        "(`service/work/costs.py`).",
    )
    answers: dict[int, dict[int, int]] | None = Field(
        None,
        description="hf with `answer_sheet: {job: N}`: per trial index, the 1-based option job N answered at "
        "each position (positions it did not parse are left out), read from the store at lease time.",
    )


class ParseStatus(StrEnum):
    """What the parser made of one position's answer."""

    ok = "ok"
    missing = "missing"
    duplicate = "duplicate"
    out_of_range = "out_of_range"
    unparseable = "unparseable"


class TrialStatus(StrEnum):
    """Where a trial stands: planned at submit, then done or skipped when its shard's result is written."""

    planned = "planned"
    done = "done"
    skipped = "skipped"
    """Not sent to the model, with a reason (e.g. the prompt does not fit the context)."""


class QuestionResult(Record):
    """One answer: a (trial, position) pair."""

    trial_index: int = Field(description="Trial index within the job.")
    position: int = Field(ge=1, description="1-based position of the question in the prompt.")
    question_id: str = Field(description="Question id.")
    subject: str = Field(description="Question subject.")
    gold: int = Field(ge=0, description="0-based index of the correct option as shown in the prompt.")
    predicted: int | None = Field(
        None, description="0-based index of the option the model chose as shown; None if unparsed."
    )
    correct: bool = Field(
        description="The answer parsed (status ok) and predicted == gold. Every other status is a parse "
        "failure, never correct (a position answered twice, too: `predicted` keeps the first answer)."
    )
    parse_status: ParseStatus = Field(description="What the parser made of this position.")
    question_token_start: int | None = Field(
        None, description="Index of the question's first token in the prompt."
    )
    question_token_end: int | None = Field(
        None, description="Index one past the question's last token in the prompt."
    )
    answer_slot: int | None = Field(
        None,
        ge=1,
        description="1-based index of this position's line among the output's answer lines (its first line "
        "when answered twice); equals the position only in forward order. None when no line answers it.",
    )
    answer_token_index: int | None = Field(
        None, description="Index in the output of the token carrying this position's option number."
    )
    token_distance: int | None = Field(
        None,
        description="Tokens from the end of the question to its answer token: (prompt length - "
        "question end) + answer token index.",
    )
    rope_distance: int | None = Field(
        None,
        description="The same distance in position ids, as the rotary embedding sees it: token_distance "
        "plus the hf engine's position_gap where the job has one (the gap moves every answer, never a "
        "question); None where token_distance is.",
    )
    in_window: bool | None = Field(
        None,
        description="The question's last token is inside the model's sliding window as seen from the "
        "position that produced the answer token (token_distance < window); None without a window.",
    )
    visible_layers: int | None = Field(
        None,
        description="Layers that can attend to the question's last token from there: every global layer, "
        "and the sliding ones when in_window; None when the layers or the distance are not known.",
    )
    option_probs: tuple[float, ...] | None = Field(
        None,
        description="Probability of each shown option at the answer slot. Under constrained decoding "
        "these come after the grammar mask, i.e. renormalised over the options; in free mode they are "
        "the raw next-token probabilities of the option tokens (top-k, missing ones are 0).",
    )
    gold_prob: float | None = Field(None, description="option_probs[gold], when known.")


class TrialResult(Record):
    """What happened to one prompt."""

    trial_index: int = Field(description="Trial index within the job.")
    status: Literal[TrialStatus.done, TrialStatus.skipped] = Field(
        description="`done`, or `skipped` with a reason (e.g. prompt too long)."
    )
    skip_reason: str | None = Field(
        None,
        description="Why the trial was skipped; for a done trial, why its answer could not be read (an "
        "endpoint's answers malformed on every try: each position is then `unparseable`).",
    )
    prompt_tokens: int | None = Field(None, description="Prompt length in tokens.")
    output_tokens: int | None = Field(None, description="Output length in tokens.")
    output_text: str | None = Field(None, description="The model's raw output.")
    filler_token_start: int | None = Field(
        None, description="Index of the filler's first token in the prompt; None without filler."
    )
    filler_token_end: int | None = Field(
        None, description="One past the filler's last token (end - start: its length as the model saw it)."
    )


class ModelInfo(Record):
    """A model's architecture facts that bear on position effects, read from its config."""

    name: str = Field(description="Model as given in the job (hub id, folder or file).")
    revision: str | None = Field(None, description="Model revision.")
    architecture: str | None = Field(None, description="Architecture class, e.g. `Gemma2ForCausalLM`.")
    num_layers: int | None = Field(None, description="Number of transformer layers.")
    sliding_window: int | None = Field(None, description="Sliding attention window in tokens, if any.")
    sliding_window_layers: tuple[int, ...] | None = Field(
        None, description="0-based indices of the layers that use the sliding window."
    )
    rope_theta: float | None = Field(None, description="RoPE base frequency.")
    context_length: int | None = Field(None, description="Maximum context length in tokens.")
    num_parameters: int | None = Field(None, description="Parameter count.")
    hf_overrides: dict[str, JsonValue] = Field(
        default_factory=dict,
        description="The config changes the model was built with (a job's and its variant's); empty for the "
        "model as published. Part of the model's identity in the store.",
    )
    layers: LayerConfig | None = Field(
        None,
        description="Each attention layer's window and RoPE base as read back from the model the engine "
        "built (the fields above follow from it when known); None when the engine cannot say (the fake).",
    )


class EngineInfo(Record):
    """What produced the answers."""

    name: str = Field(description="`vllm`, `openai` or `fake`.")
    version: str = Field(description="Engine package version; for `openai`, what the server reports.")
    dtype: str = Field(description="Dtype the model ran in.")
    attention_backend: str | None = Field(
        None, description="Attention backend(s) the model's layers ran, comma-separated (e.g. `FLASH_ATTN`)."
    )
    attention_layers: tuple[str, ...] | None = Field(
        None,
        description="The attention backend of each attention layer, in layer order, as vLLM's workers "
        "reported it; None when they could not be asked.",
    )
    flash_attn_version: int | None = Field(
        None, description="FlashAttention version (2, 3 or 4) of the FLASH_ATTN layers; None if none run."
    )
    attention_backend_guessed: bool = Field(
        False,
        description="True when the workers could not be asked and `attention_backend` is what vLLM's "
        "selector would pick for this config: a guess, not what ran.",
    )
    max_model_len: int | None = Field(None, description="Context length the engine was started with.")
    device: str = Field(description="`cuda`, `cpu`, `remote` (an endpoint), or `none` for the fake engine.")
    served_model: str | None = Field(
        None, description="openai: the model name the endpoint answered with (e.g. a dated snapshot)."
    )
    endpoint: str | None = Field(None, description="openai: the endpoint's base URL.")


_AtLeastOne = Annotated[int, Field(ge=1)]
_AtLeastZero = Annotated[int, Field(ge=0)]


class ResultColumns(Record):
    """A shard's answers column by column: one tuple per `QuestionResult` field, entry i of every tuple
    being answer i. Answers travel from a worker to the driver this way because a few tuples pickle, unpickle
    and feed the store's bulk insert far faster than a thousand records (benchmarks/store.py)."""

    trial_index: tuple[int, ...] = Field((), description="QuestionResult.trial_index of each answer.")
    position: tuple[_AtLeastOne, ...] = Field((), description="QuestionResult.position of each answer.")
    question_id: tuple[str, ...] = Field((), description="QuestionResult.question_id of each answer.")
    subject: tuple[str, ...] = Field((), description="QuestionResult.subject of each answer.")
    gold: tuple[_AtLeastZero, ...] = Field((), description="QuestionResult.gold of each answer.")
    predicted: tuple[int | None, ...] = Field((), description="QuestionResult.predicted of each answer.")
    correct: tuple[bool, ...] = Field((), description="QuestionResult.correct of each answer.")
    parse_status: tuple[ParseStatus, ...] = Field(
        (), description="QuestionResult.parse_status of each answer."
    )
    question_token_start: tuple[int | None, ...] = Field(
        (), description="QuestionResult.question_token_start of each answer."
    )
    question_token_end: tuple[int | None, ...] = Field(
        (), description="QuestionResult.question_token_end of each answer."
    )
    answer_slot: tuple[_AtLeastOne | None, ...] = Field(
        (), description="QuestionResult.answer_slot of each answer."
    )
    answer_token_index: tuple[int | None, ...] = Field(
        (), description="QuestionResult.answer_token_index of each answer."
    )
    token_distance: tuple[int | None, ...] = Field(
        (), description="QuestionResult.token_distance of each answer."
    )
    rope_distance: tuple[int | None, ...] = Field(
        (), description="QuestionResult.rope_distance of each answer."
    )
    in_window: tuple[bool | None, ...] = Field((), description="QuestionResult.in_window of each answer.")
    visible_layers: tuple[int | None, ...] = Field(
        (), description="QuestionResult.visible_layers of each answer."
    )
    option_probs: tuple[tuple[float, ...] | None, ...] = Field(
        (), description="QuestionResult.option_probs of each answer."
    )
    gold_prob: tuple[float | None, ...] = Field((), description="QuestionResult.gold_prob of each answer.")

    @model_validator(mode="after")
    def _one_length(self) -> Self:
        lengths = {name: len(getattr(self, name)) for name in type(self).model_fields}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"result columns of different lengths: {lengths}")
        return self

    def __len__(self) -> int:
        return len(self.trial_index)

    @classmethod
    def from_results(cls, results: Iterable[QuestionResult | dict[str, Any]]) -> ResultColumns:
        """The columns of `results` (records, or their fields as dicts), in order."""
        rows = [r if isinstance(r, QuestionResult) else QuestionResult.model_validate(r) for r in results]
        return cls(**{name: tuple(getattr(r, name) for r in rows) for name in QuestionResult.model_fields})

    def rows(self) -> tuple[QuestionResult, ...]:
        """One record per answer (built on each call; the columns are already validated)."""
        names = list(QuestionResult.model_fields)
        return tuple(
            QuestionResult.model_construct(**dict(zip(names, values, strict=True)))
            for values in zip(*(getattr(self, name) for name in names), strict=True)
        )


class ShardResult(Record):
    """Everything a worker returns for one shard; the driver writes it in one transaction.

    Built with `answers` (columns) by the worker; `results=` (one `QuestionResult` per answer) is accepted
    too and turned into columns, and `results` reads them back as records."""

    job_id: int = Field(description="Job the shard belongs to.")
    shard_id: int = Field(description="Shard id.")
    trials: tuple[TrialResult, ...] = Field(description="One entry per trial of the shard.")
    answers: ResultColumns = Field(
        default_factory=ResultColumns, description="One entry per (done trial, position), as columns."
    )
    model: ModelInfo = Field(description="The model's metadata.")
    engine: EngineInfo = Field(description="The engine that ran it.")
    generate_seconds: float = Field(
        ge=0.0,
        description="The shard's share of its engine call's wall time (a call may answer several shards; "
        "each gets the share of its prompts).",
    )
    attention: AttentionShard | None = Field(
        None, description="Engine `hf`: the shard's attention figures; None for every other engine."
    )

    @model_validator(mode="before")
    @classmethod
    def _columns_from_records(cls, data: Any) -> Any:
        if isinstance(data, dict) and "results" in data:
            if "answers" in data:
                raise ValueError("give a shard result's answers as `results` or as `answers`, not both")
            data = dict(data)
            data["answers"] = ResultColumns.from_results(data.pop("results"))
        return data

    @property
    def results(self) -> tuple[QuestionResult, ...]:
        """The answers, one record each (built from `answers` on each call: the store reads the columns)."""
        return self.answers.rows()


class WorkerConfig(Record):
    """The part of the settings a worker needs, passed to it explicitly (workers read no environment)."""

    cache_dir: str = Field(description="Folder for converted models (GGUF to Hugging Face) and kernels.")
    compile_cache_dir: str | None = Field(
        None,
        description="Folder for vLLM's and torch's compile caches, on the worker's local disk (a shared "
        "network volume is slow for them and they differ by GPU type); unset: `cache_dir`.",
    )
    cpu_kvcache_gib: int = Field(2, ge=1, description="KV cache size for the vLLM CPU build, in GiB.")
    cpu_threads: int | None = Field(
        None, ge=1, description="OpenMP threads for the vLLM CPU build; all cores when not set."
    )
    gpu_memory_wait_seconds: float = Field(
        120.0,
        ge=0.0,
        description="How long a GPU engine waits, before it loads and between refused loads, for the GPU "
        "memory a previous engine held to be freed.",
    )


class LoadReport(Record):
    """What loading a model in an actor cost and produced."""

    engine: EngineInfo = Field(description="The engine that was built.")
    model: ModelInfo = Field(description="The model's architecture facts.")
    seconds: float = Field(ge=0.0, description="Wall time of the load.")
    pid: int = Field(description="The actor's process id.")


class CloseReport(Record):
    """What closing an actor's engine did (before the actor is ended)."""

    pid: int = Field(description="The actor's process id.")
    closed: bool = Field(description="False when the actor held no engine.")
    seconds: float = Field(ge=0.0, description="Wall time of the close.")


class ShardFailure(Record):
    """A shard of a several-shard engine call that raised while the others were answered."""

    shard_id: int = Field(description="The shard that failed.")
    error: str = Field(description="The error, on one line.")
    stop_job: bool = Field(
        False, description="The whole job must stop (its cost guard would be exceeded), not only the shard."
    )
