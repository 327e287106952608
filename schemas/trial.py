"""One trial as `posbias trial` shows it: the prompt as sent, where each question sits in it, the raw output
and what was made of every answer."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import Field

from posbias.schemas.record import Record, records_frame
from posbias.schemas.shard_work import ParseStatus, TrialStatus

if TYPE_CHECKING:
    import pandas as pd


class PromptSource(StrEnum):
    """Where a trial view's prompt comes from."""

    rebuilt = "rebuilt"
    """Rendered again from the stored plan and spec with the model's tokenizer and chat template."""
    text_only = "text_only"
    """Rendered again without a tokenizer (none could be loaded): the text, but no token ids or spans."""


class PromptCheck(Record):
    """How a rebuilt prompt compares with what the worker stored when it sent the trial."""

    matches: bool | None = Field(
        description="True when the rebuilt prompt's token count, every question's token span and the "
        "filler's span equal the stored ones; False when any differs; None when nothing was stored to "
        "compare (a trial not yet run, or skipped before rendering) or no tokenizer was loaded."
    )
    stored_prompt_tokens: int | None = Field(description="Prompt length in tokens as the worker stored it.")
    rebuilt_prompt_tokens: int | None = Field(description="Prompt length in tokens of the rebuilt prompt.")
    compared: int = Field(0, ge=0, description="Stored token spans compared (questions, filler).")
    differences: tuple[str, ...] = Field(
        (), description="One line per stored figure the rebuilt prompt does not reproduce."
    )


class QuestionSpan(Record):
    """One question's place in the prompt, and how far its answer's sliding window reaches back."""

    position: int = Field(ge=1, description="1-based position of the question in the prompt.")
    question_id: str = Field(description="Question id.")
    start_token: int | None = Field(description="Index of the question block's first prompt token.")
    end_token: int | None = Field(description="Index one past the question block's last prompt token.")
    start_char: int = Field(ge=0, description="Offset in `prompt_text` of the block's first character.")
    end_char: int = Field(ge=0, description="Offset in `prompt_text` one past the block's last character.")
    answer_token: int | None = Field(
        description="Index in the output of the token carrying this position's answer; None when it was "
        "not answered."
    )
    window_start_token: int | None = Field(
        description="Earliest prompt token a sliding-window layer can see from the position that produced "
        "the answer token (prompt length + answer token - window, at least 0); None without a sliding "
        "window or an answer. The question is inside the window when end_token - 1 >= this."
    )
    window_start_char: int | None = Field(
        description="Offset in `prompt_text` of the character where `window_start_token` begins."
    )


class AnswerView(Record):
    """One answer: what the parser made of a position, and what it scored."""

    position: int = Field(ge=1, description="1-based position of the question in the prompt.")
    question_id: str = Field(description="Question id.")
    subject: str = Field(description="Question subject.")
    parsed: bool = Field(description="The parser read exactly one valid answer for this position.")
    parse_status: ParseStatus = Field(description="What the parser made of this position.")
    prediction: int | None = Field(
        description="0-based index of the option the model chose, as shown; None if not parsed. The "
        "prompt's label is prediction + 1."
    )
    gold: int = Field(ge=0, description="0-based index of the correct option as shown.")
    correct: bool = Field(description="Parsed and prediction == gold.")
    option_probs: list[float] | None = Field(
        description="Probability of each shown option at the answer token, when the engine reported them."
    )
    gold_prob: float | None = Field(description="option_probs[gold], when known.")
    answer_slot: int | None = Field(description="1-based line of the output that answers this position.")
    answer_token: int | None = Field(description="Index in the output of the token carrying the answer.")
    token_distance: int | None = Field(description="Tokens from the end of the question to its answer token.")
    in_window: bool | None = Field(
        description="The question's last token is inside the sliding window from the answer; None without "
        "a window."
    )


class TrialView(Record):
    """One trial behind a number: the prompt exactly as sent, each question's span in it, the raw output,
    and every answer. Prompts are not stored; they are rebuilt from the stored plan and checked against the
    token counts and spans the worker stored (`check`)."""

    job_id: int = Field(description="The job.")
    trial_id: int = Field(description="The trial's id in the store (`trials.id`).")
    trial_index: int = Field(ge=0, description="The trial's index within its job.")
    batch_size: int = Field(ge=1, description="N, the number of questions in the prompt.")
    iteration: int = Field(ge=0, description="The trial's iteration within its batch size.")
    variant: str = Field(description="The engine variant whose output this view shows.")
    variants: list[str] = Field(description="Every variant of the job that ran this trial, in job order.")
    model: str = Field(description="The job's model as submitted (a hub id or a local path).")
    revision: str | None = Field(description="The model's revision, when one was given.")
    status: TrialStatus = Field(description="Where the trial stands for this variant.")
    skip_reason: str | None = Field(description="Why the trial was skipped, when it was.")
    design: str = Field(description="How the job's trials are built: random, rotation or probe.")
    answer_order: list[int] | None = Field(description="Positions in the order asked; None when forward.")
    probe_position: int | None = Field(description="The position asked (probe design), else None.")
    filler_tokens: int = Field(ge=0, description="The filler's planned length in tokens (0: none).")
    filler_span: tuple[int, int] | None = Field(
        description="Token span of the filler in the prompt (start, one past the end); None without filler."
    )
    chat_template_used: bool = Field(description="The prompt is wrapped in the model's chat template.")
    sliding_window: int | None = Field(description="The variant's sliding window in tokens, if it has one.")
    prompt_source: PromptSource = Field(description="Where `prompt_text` and the token ids come from.")
    prompt_text: str = Field(description="The prompt as sent, chat template included.")
    prompt_token_ids: list[int] | None = Field(
        description="The prompt's token ids as the engine was sent them; None without a tokenizer."
    )
    token_offsets: list[tuple[int, int]] | None = Field(
        description="Per prompt token, its character span in `prompt_text` (special tokens span nothing)."
    )
    check: PromptCheck = Field(description="The rebuilt prompt against what the worker stored.")
    spans: list[QuestionSpan] = Field(description="One entry per position, in prompt order.")
    output_text: str | None = Field(description="The model's raw output (`trials.output_text`).")
    output_tokens: int | None = Field(description="Tokens the model generated.")
    answers: list[AnswerView] = Field(description="One entry per position with a stored result.")

    def answer(self, position: int) -> AnswerView | None:
        """The answer at `position`, if one is stored."""
        return next((a for a in self.answers if a.position == position), None)

    def to_pandas(self) -> pd.DataFrame:
        """One row per position: its span and window (`QuestionSpan`) and its answer (`AnswerView`, empty
        where none is stored), with the job, trial and variant as columns."""
        import pandas as pd

        same = {"job_id": self.job_id, "trial_id": self.trial_id, "variant": self.variant}
        spans = records_frame(self.spans, same=same)
        answers = records_frame(self.answers)
        if answers.empty:
            return spans
        return pd.merge(spans, answers, on=["position", "question_id"], how="left")
