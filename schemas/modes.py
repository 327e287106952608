"""How a job asks its questions: the design, the answer order and mode, and the chat template's use.

The job-level choices of `JobSpec`, kept below it because its parts share them (`SamplingSpec` sizes its
output budget by the answer mode; the workers render and decode by them).
"""

from __future__ import annotations

from enum import StrEnum


class Design(StrEnum):
    """How questions are assigned to positions across iterations, and how many of them are asked."""

    random = "random"
    rotation = "rotation"
    probe = "probe"


class AnswerOrder(StrEnum):
    """The order in which a prompt asks for its answers."""

    forward = "forward"
    reverse = "reverse"
    random = "random"


class AnswerMode(StrEnum):
    """How the model is made to answer."""

    free = "free"
    constrained = "constrained"


class ChatTemplateUse(StrEnum):
    """Whether the prompt is wrapped in the model's chat template."""

    auto = "auto"
    on = "on"
    off = "off"
