"""The text around the questions: a job's prompt wording."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from posbias.schemas.bounds import MAX_TEXT
from posbias.schemas.record import Record


class PromptTemplate(Record):
    """The text around the questions. The default is the seed experiment's format, word for word."""

    model_config = ConfigDict(str_max_length=MAX_TEXT)

    instructions: str = Field(
        "Read the following multiple choice questions and answer them one by one. Your answer for each "
        "question should be in following format: <question number>. <the index of the correct option "
        "({options})>",
        description="First paragraph. `{options}` becomes e.g. `1, 2, 3, or 4` for four options.",
    )
    question: str = Field(
        "{number}. Question: {question}\n   Choices:\n{choices}",
        description="One question block. Placeholders: `{number}` (position), `{question}`, `{choices}`.",
    )
    choice: str = Field(
        "   {index}. {text}", description="One option line. Placeholders: `{index}` (1-based), `{text}`."
    )
    answer_intro: str = Field(
        "Here are the answers to the multiple-choice questions, one index per line:",
        description="Last paragraph, after the questions.",
    )
    separator: str = Field("\n\n", description="Text between paragraphs and between questions.")
    order_instruction: str = Field(
        "Answer the questions in this order: {order}.",
        description="Paragraph after the instructions when the answer order is not forward. `{order}` "
        "becomes the question numbers in the order asked, e.g. `3, 1, 2`.",
    )
    probe_instructions: str = Field(
        "Read the following multiple choice questions. You will be asked to answer one of them, in the "
        "following format: <question number>. <the index of the correct option ({options})>",
        description="First paragraph of the probe design, in place of `instructions`.",
    )
    probe_request: str = Field(
        "Answer question {number} only, on one line:",
        description="Last paragraph of the probe design, in place of `answer_intro`. `{number}` is the "
        "position asked.",
    )
