"""The `openai` engine: an OpenAI-compatible endpoint (`workers/openai_engine.py`).

Its actor holds only an HTTP client: no resources. The model is the server's, so neither its files nor its
tokenizer are on the workers; a spec's `tokenizer`, when given, stands in for the server's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from posbias.workers.engines.declaration import EngineDeclaration

if TYPE_CHECKING:
    from posbias.schemas import JobSpec, ShardSpec, WorkerConfig
    from posbias.workers.engine import Engine


def load(spec: ShardSpec | JobSpec, config: WorkerConfig) -> Engine:
    """A client of the spec's endpoint."""
    from posbias.workers.openai_engine import OpenAIEngine

    return OpenAIEngine(spec, config=config)


DECLARATION = EngineDeclaration(name="openai", load=load, served=True)
