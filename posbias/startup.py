"""A command's start, as the garbage collector sees it.

A `posbias` command spends its first few tenths of a second importing (typer, pydantic's records,
SQLAlchemy, the store's driver, the analyses): objects that live until the process ends. At CPython's
default pace (a young collection every 700 allocations, a full one each time the heap has grown by a
quarter) the collector walks them again and again and finds no garbage in them: at a million results, about
0.1 s of `trial`'s half second on PostgreSQL and 0.15 s of `curve`'s two (`benchmarks/views.py`). So the
command collects less often while it starts (`begin`, from `posbias.cli.app.main`), and the first store it
opens ends the start (`over`, from `edge.open_store`): what is alive then is set apart from later
collections (`gc.freeze`) and the default pace comes back, so a long command (a worker, the viewer)
collects as any Python program does. A command that opens no store this way (`db`'s, which migrate it;
`models`') collects at the slower pace throughout, and still collects. Python code that imports posbias is
left alone: `over` does nothing unless `begin` was called.
"""

from __future__ import annotations

import gc

STARTING_THRESHOLD = (100_000, 10, 10)
"""The collector's thresholds while a command starts: a young collection every 100,000 allocations."""

_default: tuple[int, int, int] | None = None


def begin() -> None:
    """A command starts: collect at `STARTING_THRESHOLD`'s pace until `over`."""
    global _default
    if _default is None:
        _default = gc.get_threshold()
    gc.set_threshold(*STARTING_THRESHOLD)


def over() -> None:
    """The command's start is over (its store is open): freeze what is alive and collect at the default pace
    again; nothing unless `begin` was called, and nothing the second time."""
    global _default
    if _default is None:
        return
    gc.freeze()
    gc.set_threshold(*_default)
    _default = None
