"""The `posbias` command run in this process, through its real entry point and error mapping
(`posbias.cli.app.run`, what the console script calls), set up as a process of its own would be.

A process starts with its own environment, working folder, standard streams, warning filters and logging,
and the command reads its settings then; `run_cli` gives the run the same and puts everything back after:

- the environment: `env` over this process's (variables beginning with `drop_prefix` removed first);
- the working folder;
- stdout and stderr (text buffers, as a pipe is: not a terminal);
- the command's two Rich consoles: their width from `COLUMNS` and no colour, as they are built at a process's
  start with its output on a pipe;
- Python's default warning filters (not the test session's `error`);
- logging as a fresh process has it: no handler on the root logger, so a warning reaches stderr.

Settings are read per run (`posbias.load_settings`, no cache). What stays shared is what a library reads once
per process: an environment variable read at import (`HF_HUB_OFFLINE`, Ray's), Ray once initialised, and
signal handlers while the run holds them. A check that needs those is a subprocess (`run_subprocess` in
tests/support/fuzzcases.py, the `posbias` fixture in tests/e2e/conftest.py).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CliRun:
    """What one in-process run of the command did."""

    code: int | None
    """The exit code; None when it did not finish within the timeout (a hang)."""
    stdout: str
    stderr: str


def run_cli(
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    folder: Path,
    drop_prefix: str | None = None,
    timeout: float | None = None,
) -> CliRun:
    """Run `posbias ARGS...` in this process in `folder` with `env`; its exit code and output.

    With `timeout`, the run is in a daemon thread that is given up after that many seconds (code None; a hang
    is then left running); without, it is in this thread, as a process's main thread runs it (the worker then
    handles SIGINT and SIGTERM itself)."""
    from posbias.cli import app

    out, err = io.StringIO(), io.StringIO()
    result: list[int] = []
    with _isolated(env, folder=folder, drop_prefix=drop_prefix, stdout=out, stderr=err):
        if timeout is None:
            result.append(app.run(list(args)))
        else:
            worker = threading.Thread(target=lambda: result.append(app.run(list(args))), daemon=True)
            worker.start()
            worker.join(timeout)
    return CliRun(code=result[0] if result else None, stdout=out.getvalue(), stderr=err.getvalue())


@contextlib.contextmanager
def _isolated(
    env: Mapping[str, str], *, folder: Path, drop_prefix: str | None, stdout: io.StringIO, stderr: io.StringIO
) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(env, drop_prefix=drop_prefix))
        stack.enter_context(contextlib.chdir(folder))
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        stack.enter_context(_fresh_consoles())
        stack.enter_context(_default_warnings())
        stack.enter_context(_fresh_logging())
        yield


@contextlib.contextmanager
def _environment(env: Mapping[str, str], *, drop_prefix: str | None) -> Iterator[None]:
    saved = dict(os.environ)
    if drop_prefix is not None:
        for key in [k for k in os.environ if k.startswith(drop_prefix)]:
            del os.environ[key]
    os.environ.update(env)
    try:
        yield
    finally:
        for key in [k for k in os.environ if k not in saved]:
            del os.environ[key]
        for key, value in saved.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


@contextlib.contextmanager
def _fresh_consoles() -> Iterator[None]:
    """The command's consoles (`posbias.cli.common`) as a process builds them with output on a pipe: width
    from `COLUMNS` (read when printing, since none is fixed), no colour system."""
    from posbias.cli import common

    consoles = (common.out, common.err)
    saved: list[tuple[Any, Any]] = [(c._width, c._color_system) for c in consoles]
    for console in consoles:
        console._width = None
        console._color_system = None
    try:
        yield
    finally:
        for console, (width, colours) in zip(consoles, saved, strict=True):
            console._width, console._color_system = width, colours


@contextlib.contextmanager
def _default_warnings() -> Iterator[None]:
    """Python's own filters, as a process starts with them (most recent first)."""
    with warnings.catch_warnings():
        warnings.resetwarnings()
        for category in (ResourceWarning, ImportWarning, PendingDeprecationWarning, DeprecationWarning):
            warnings.simplefilter("ignore", category)
        warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
        yield


@contextlib.contextmanager
def _fresh_logging() -> Iterator[None]:
    """No handler on the root logger, at WARNING: a record then goes to `logging.lastResort`, which writes to
    the (redirected) `sys.stderr`, as in a process that configured no logging."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
