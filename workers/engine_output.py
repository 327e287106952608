"""What vLLM's engine core writes while it starts, kept, so that its failure can name its root cause.

On GPUs vLLM runs its engine core in a subprocess of the actor (`VLLM_ENABLE_V1_MULTIPROCESSING`, on by
default; the CPU build here runs it in-process). When that subprocess fails to start it logs the exception
itself (`EngineCoreProc.run_engine_core` in `vllm/v1/engine/core.py`: `logger.exception("EngineCore failed
to start.")`) and exits, and a tensor-parallel worker process under it does the same first (`WorkerProc
failed to start.`, `vllm/v1/executor/multiproc_executor.py`). The actor only sees `wait_for_engine_startup`
(`vllm/v1/engine/utils.py`) raise `RuntimeError("Engine core initialization failed. See root cause above.
Failed core proc(s): {...}")` with no exception chained: the cause is text on the subprocess's output, which
is the actor's (it inherits file descriptors 1 and 2), in the Ray worker log of a node an autoscaler may
already have taken away.

`EngineOutput` puts a pipe in front of this process's stdout and stderr while an engine starts: what the
engine core writes passes on to where it went before (Ray's worker log keeps it all) and the last lines are
kept here. The pipe's reader runs as long as the engine core holds its end, so a subprocess that lives on
after the start is never blocked by a full pipe.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

KEPT_LINES = 400
"""Lines kept per start: a Python traceback through vLLM's model loader is 50 to 150 lines."""
# `EngineCoreProc.run_engine_core` (vllm/v1/engine/core.py) and `WorkerProc.worker_main`
# (vllm/v1/executor/multiproc_executor.py) log these, then the traceback, when they cannot start.
_FAILED = re.compile(r"(EngineCore|WorkerProc) failed to start\.")
_POINTER = re.compile(r"See root cause above|See stack trace for root cause|in a background process")
# vLLM's log header, `(EngineCore pid=12) ERROR 12-01 10:00:00 [core.py:1510] `, before each message line.
_HEADER = re.compile(r"^.*?\[[\w./-]+:\d+\] ")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$")


class EngineOutput:
    """The last `KEPT_LINES` lines written to this process's stdout and stderr (by it or by a subprocess
    it started) while `capture()` was open."""

    def __init__(self, *, keep: int = KEPT_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []

    @contextmanager
    def capture(self) -> Iterator[EngineOutput]:
        """Tee file descriptors 1 and 2 through pipes while the block runs; subprocesses started in it keep
        writing through the pipes (and on to the original output) for as long as they live."""
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        saved: list[tuple[int, int]] = []
        try:
            for fd in (1, 2):
                read_end, write_end = os.pipe()
                original = os.dup(fd)
                os.dup2(write_end, fd)
                os.close(write_end)
                saved.append((fd, original))
                reader = threading.Thread(
                    target=self._pump,
                    args=(read_end, os.dup(original)),
                    daemon=True,
                    name=f"engine-output-{fd}",
                )
                reader.start()
                self._readers.append(reader)
            yield self
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            for fd, original in saved:
                os.dup2(original, fd)
                os.close(original)

    def drained(self, *, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the pipes' readers to end (every writer, subprocesses included,
        has closed its end); True when they have."""
        for reader in self._readers:
            reader.join(timeout)
        return not any(reader.is_alive() for reader in self._readers)

    def lines(self) -> list[str]:
        """The lines kept, oldest first, without vLLM's log headers."""
        with self._lock:
            return [_HEADER.sub("", line, count=1) for line in self._lines]

    def root_cause(self) -> str | None:
        """The exception the engine core logged when it failed to start (`ValueError: ...`), or None when
        it logged none."""
        return root_cause(self.lines())

    def _pump(self, read_end: int, out: int) -> None:
        pending = b""
        try:
            while chunk := os.read(read_end, 65536):
                with suppress(OSError):  # the original output is gone: keep the lines, never block the writer
                    os.write(out, chunk)
                pending += chunk
                *complete, pending = pending.split(b"\n")
                with self._lock:
                    self._lines.extend(line.decode("utf-8", "replace").rstrip("\r") for line in complete)
        finally:
            os.close(read_end)
            os.close(out)


def root_cause(lines: Sequence[str]) -> str | None:
    """The root cause in `lines`: the first exception (`module.SomeError: message`) logged after the first
    "... failed to start." (a tensor-parallel worker's `WorkerProc failed to start.` comes before the
    engine core's own), or after the start of `lines` when there is none; vLLM's own pointers to it
    ("See root cause above", "See stack trace for root cause") are skipped. None when there is none."""
    starts = [i for i, line in enumerate(lines) if _FAILED.search(line)]
    after = lines[starts[0] + 1 :] if starts else lines
    for line in after:
        text = line.strip()
        if _EXCEPTION.match(text) and not _POINTER.search(text):
            return text
    return None
