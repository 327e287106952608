"""posbias.workers.engines: the engines, each a declaration of what it needs (`vllm/`, `hf/`, `openai/`,
`fake/`), and the registry the control plane asks by a spec's `engine.name`.

Adding an engine is a folder here with a `DECLARATION` (see `declaration.py`) and one line in
`registry.BUILT_IN`; a plug-in outside posbias registers its declaration (`register`) or declares it under the
entry-point group `posbias.engines`.
"""

from __future__ import annotations

from posbias.workers.engines.declaration import DeviceUse, EngineDeclaration, always
from posbias.workers.engines.registry import declared, every, names, register, unregister

__all__ = ["DeviceUse", "EngineDeclaration", "always", "declared", "every", "names", "register", "unregister"]
