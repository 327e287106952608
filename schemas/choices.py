"""The named choices a job spec and a curve query offer: which engine, which endpoint API, where filler goes,
what a fake engine's or a curve's axis is, which hub revisions a schedule follows, and the baseline
variant's name.

Kept apart from the records that use them, and free of pydantic, so that the `posbias` command can offer
them as a flag's choices (and refuse a wrong one) without importing the records.
"""

from __future__ import annotations

from enum import StrEnum

BASELINE = "baseline"
"""The variant that runs the model as published (with the job's own `engine.hf_overrides`, if any)."""


class EngineName(StrEnum):
    """Which engine answers the prompts."""

    vllm = "vllm"
    fake = "fake"
    openai = "openai"
    """An OpenAI-compatible endpoint: `vllm serve`, SGLang, llama.cpp's server, a hosted API."""
    hf = "hf"
    """Hugging Face transformers: teacher-forced scoring that records where each answer line's attention
    goes, from the answer rows (`workers/hf_engine.py`)."""


class EndpointApi(StrEnum):
    """Which OpenAI API a served job talks to."""

    auto = "auto"
    """Completions when the prompt can be sent as the model's own tokens (or needs no chat template), else
    chat."""
    chat = "chat"
    completions = "completions"


class FakeAxis(StrEnum):
    """What the fake engine's accuracy is a function of."""

    position = "position"
    answer_slot = "answer-slot"
    token_distance = "token-distance"


class FillerPlace(StrEnum):
    """Where filler goes in a prompt."""

    before = "before"
    """Between the instructions and the first question: every question moves away from the prompt's start,
    none from its answer."""
    after = "after"
    """After question k (`FillerSpec.position`): questions 1..k move away from their answers, their
    positions unchanged."""
    end = "end"
    """Between the last question and the answer request: every question moves away from its answer."""


class HubRevisions(StrEnum):
    """Which revisions of a hub repository count as checkpoints."""

    commits = "commits"
    """Each new commit on one branch (from the branch's head when the schedule first looks)."""
    branches = "branches"
    """Each branch or tag other than that branch (e.g. `step1000`), at the commit it names when found."""


class CurveAxis(StrEnum):
    """What a curve's x axis is."""

    position = "position"
    answer_slot = "answer-slot"
    token_distance = "token-distance"
    rope_distance = "rope-distance"
    filler_length = "filler-length"
