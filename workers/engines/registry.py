"""Which engines there are: the built-in ones (one line each below, a folder each beside this module), those
registered in this process, and those installed packages declare under the entry-point group
`posbias.engines` (each a module-level `EngineDeclaration`), found on first use.

A spec names an engine by the declaration's `name` (`engine.name`); an unknown name is refused at submit,
naming the engines there are.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from posbias.schemas import PosbiasError
from posbias.workers.engines.declaration import EngineDeclaration

BUILT_IN = {
    "vllm": "posbias.workers.engines.vllm",
    "hf": "posbias.workers.engines.hf",
    "openai": "posbias.workers.engines.openai",
    "fake": "posbias.workers.engines.fake",
}
"""Built-in engines: each module's `DECLARATION`."""
ENTRY_POINTS = "posbias.engines"
"""The entry-point group an installed package declares its engines under."""

_registered: dict[str, EngineDeclaration] = {}


def register(declaration: EngineDeclaration) -> EngineDeclaration:
    """Make `declaration` an engine a spec can name in this process (its Ray actors are handed the
    declaration, so they need not register it). Returns it, so a module can register what it declares."""
    if declaration.name in BUILT_IN:
        raise PosbiasError(f"engine {declaration.name!r} is built in; give a plug-in engine another name")
    _registered[declaration.name] = declaration
    return declaration


def unregister(name: str) -> None:
    """Forget an engine registered in this process (tests)."""
    _registered.pop(name, None)


def declared(name: str) -> EngineDeclaration:
    """The declaration of the engine named `name`; raises `PosbiasError` naming the engines there are when
    none is."""
    if name in BUILT_IN:
        declaration = importlib.import_module(BUILT_IN[name]).DECLARATION
        assert isinstance(declaration, EngineDeclaration)
        return declaration
    if name not in _registered:
        for point in entry_points(group=ENTRY_POINTS, name=name):
            _registered[name] = point.load()
    if name in _registered:
        return _registered[name]
    raise PosbiasError(
        f"no engine is named {name!r}: the engines are {', '.join(names())}; a plug-in engine is installed "
        f"under the entry-point group {ENTRY_POINTS} or registered with posbias.workers.engines.register"
    )


def names() -> list[str]:
    """The names of the engines known here, sorted."""
    installed = {point.name for point in entry_points(group=ENTRY_POINTS)}
    return sorted({*BUILT_IN, *_registered, *installed})


def every() -> list[EngineDeclaration]:
    """The declarations of the engines known here, by name; an installed plug-in that fails to load is left
    out (naming it in a spec says why)."""
    found = []
    for name in names():
        try:
            found.append(declared(name))
        except Exception:  # a broken plug-in: `declared(name)` raises its error where it is asked for
            continue
    return found
