"""A toy engine from outside posbias, to show that adding an engine is a folder and one registration: this
module declares it, `engine.py` (imported only when the engine is built) answers. A test registers it with
`posbias.workers.engines.register(DECLARATION)`; an installed package would declare it under the entry-point
group `posbias.engines` instead.

It answers every question with its first option and renders with the fake engine's tokenizer; its actors
hold the engine device, as a local model's would.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posbias.workers.engines import DeviceUse, EngineDeclaration, always

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine, Tokenizer

NAME = "toy-first-option"


def load(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """The toy engine for the spec's model."""
    from support.toy_engine.engine import FirstOptionEngine

    return FirstOptionEngine(model=spec.model)


def tokenizer(spec: JobSpec) -> Tokenizer:
    """The tokenizer the toy renders with."""
    from posbias.workers.fake_engine import FakeTokenizer

    return FakeTokenizer()


DECLARATION = EngineDeclaration(name=NAME, load=load, device=always(DeviceUse.device), tokenizer=tokenizer)


DYING_NAME = "toy-dies-at-load"


def die(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """Ends the actor's process while it loads, as a loader that segfaults or runs out of memory does."""
    import os

    os._exit(3)


DYING = EngineDeclaration(name=DYING_NAME, load=die, device=always(DeviceUse.device), tokenizer=tokenizer)
"""A plug-in whose every actor dies while it loads: the job fails with the reason, and the worker ends."""
