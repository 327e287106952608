"""What an engine declares to the control plane: the resources it holds on a device, what it needs at submit,
and how it is built. The control plane asks a declaration and never names an engine (STYLE.md item 15).

A declaration is a frozen dataclass of plain flags and a few functions; each function imports its engine
only when it is called, so declaring an engine costs no import of vLLM, torch or httpx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine, Tokenizer


class DeviceUse(StrEnum):
    """What one actor of an engine holds where it runs."""

    none = "none"
    """Nothing: an endpoint's HTTP client, or an engine that computes nothing heavy (so tests run many actors
    on few cores)."""
    device = "device"
    """The device the dispatcher's engines run on (`POSBIAS_DEVICE`): `tensor_parallel_size` GPUs (and a
    CPU) where engines run on GPUs, one CPU on the CPU build (one engine already uses every core)."""
    gpus = "gpus"
    """`tensor_parallel_size` GPUs wherever it runs: an engine standing in for a GPU model in tests."""


def always(use: DeviceUse) -> Callable[[ShardSpec], DeviceUse]:
    """A `device` function for an engine whose use of the device does not depend on the spec."""

    def device(spec: ShardSpec) -> DeviceUse:
        return use

    return device


def holds_nothing(spec: ShardSpec) -> DeviceUse:
    """The default `device`: an actor that reserves nothing."""
    return DeviceUse.none


@dataclass(frozen=True)
class EngineDeclaration:
    """One engine, as the control plane sees it: what it holds, what submit prepares for it, what it reads."""

    name: str
    """What a spec's `engine.name` says to choose it."""
    load: Callable[[ShardSpec | JobSpec, WorkerConfig], Engine]
    """Builds the engine for a shard (or a job spec's first variant) on a worker; raises `PosbiasError`
    with the loader's error on one line when the model cannot be loaded."""
    device: Callable[[ShardSpec], DeviceUse] = holds_nothing
    """What one of its actors holds, from the shard (its engine options and `fake` block)."""
    local_model: bool = False
    """The workers load the model's own files (a hub id, a folder, a GGUF file): submit checks the model's
    name and resolves its variants against its config, and the model's tokenizer, where it is on this
    machine, counts prompt tokens and renders trial views."""
    served: bool = False
    """It answers through an OpenAI-compatible endpoint: submit probes the endpoint (what it can do, its
    token counts) and checks the job's cost guard."""
    chooses_context: bool = False
    """It starts with a context length (`engine.max_model_len`) that submit chooses from the plan and checks
    against the model's own."""
    tokenizer: Callable[[JobSpec], Tokenizer] | None = None
    """Its own tokenizer, when it renders prompts with one that is not the model's."""
    sliding_window: Callable[[JobSpec], int | None] | None = None
    """The sliding window its spec sets, when the spec does; None: read from the model's config, where it is
    on this machine."""
    records_attention: bool = False
    """It records where each answer's attention goes (the `attention` table)."""
    answer_sheets: bool = False
    """It teacher-forces an answer sheet (`engine.answer_sheet`), which may name a done job whose answers
    each of its shards carries."""
    reads_fake: bool = False
    """Its behaviour is the spec's `fake` block, so a schedule's checkpoint folder may change that block
    (`posbias-fake.json`)."""
