"""Connecting this process to a Ray cluster (`init_ray`), as the API does before it dispatches shards.

A connection that cannot work fails within `POSBIAS_RAY_CONNECT_SECONDS` with a line that says what to do;
only a Ray Client session that the cluster is not ready to set up yet is tried again.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import ray

from posbias.schemas import PosbiasError, one_line
from posbias.service.dispatch import reaper
from posbias.service.settings import Settings

log = logging.getLogger(__name__)

RAY_CLIENT_ATTEMPTS = 3
"""Tries at a Ray Client connection that the cluster answers but cannot set up (see `init_ray`)."""
RAY_PROBE_SECONDS = 5.0
"""How long the TCP connection to a Ray address may take before it counts as unreachable."""
RAY_HINT = "start it with `ray start --head`, or use --ray-address local"
LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}
"""Ray's settings for the local cluster `init_ray` starts. Ray runs its workers at niceness 15 by default, so
that its own daemons stay responsive; but here a worker is the engine actor, posbias's whole workload, and at
15 every ordinary process on the machine comes first: one busy process at niceness 19 halved the engine's
throughput while raw vLLM in the driver lost nothing (`benchmarks/throughput.py --setting tiny`: b/a 0.46
against 0.95 at niceness 0; benchmarks/README.md, "Throughput"). At 0 the actors run at the niceness
posbias was started with (`nice posbias worker` still lowers them). A cluster started by `ray start` keeps
its own setting (`RAY_worker_niceness`; deploy/README.md)."""


def init_ray(settings: Settings, *, num_cpus: int | None = None) -> None:
    """Connect to the Ray cluster named by `settings.ray_address` (`local` starts one in this process),
    within `settings.ray_connect_seconds`.

    An address is first reached over TCP, so one that nothing listens on is an error at once, not a wait: Ray
    itself retries a GCS address for as long as it is given. The Ray processes a local start creates are
    handed to a reaper (`service/dispatch/reaper.py`), so they do not outlive this process however it ends.
    """
    if ray.is_initialized():
        return
    loud = settings.debug or settings.verbose
    if not loud:
        quiet_ray()
    address = settings.ray_address
    if address not in {"local", "auto"}:
        _probe(address, seconds=min(RAY_PROBE_SECONDS, settings.ray_connect_seconds))
    deadline = time.monotonic() + settings.ray_connect_seconds
    for attempt in range(1, RAY_CLIENT_ATTEMPTS + 1):
        try:
            if address == "local":
                before = set(reaper.children())
                ray.init(
                    address="local",
                    num_cpus=num_cpus or os.cpu_count() or 1,
                    include_dashboard=False,
                    log_to_driver=loud,
                    configure_logging=False,
                    _system_config=LOCAL_SYSTEM_CONFIG,
                )
                reaper.watch([pid for pid in reaper.children() if pid not in before])
            elif address == "auto" or address.startswith("ray://"):
                # Ray Client has its own connection timeout; `auto` finds a node on this machine or fails.
                ray.init(address=address, log_to_driver=loud, configure_logging=False)
            else:
                _within(
                    lambda: ray.init(address=address, log_to_driver=loud, configure_logging=False),
                    seconds=deadline - time.monotonic(),
                    address=address,
                    quiet=not loud,
                )
            return
        except ConnectionAbortedError as exc:
            # Ray Client's server answered but could not start this client's session: on a head that has
            # just started, its runtime-env agent may not be up yet (seen under load, and what compose
            # does when it starts the head and a worker together). Worth another try; a wrong address or
            # token (a plain ConnectionError) is not.
            reason = one_line(exc)
            if attempt == RAY_CLIENT_ATTEMPTS:
                raise PosbiasError(
                    f"the Ray cluster at {settings.ray_address!r} refused {attempt} sessions ({reason}); "
                    "see ray_client_server*.err in the head's Ray logs"
                ) from None
            log.warning(
                "Ray Client session refused (%s); trying again (%d of %d)",
                reason,
                attempt + 1,
                RAY_CLIENT_ATTEMPTS,
            )
        except ConnectionError as exc:
            raise PosbiasError(
                f"cannot reach the Ray cluster at {settings.ray_address!r} ({one_line(exc, typed=True)}); "
                f"{RAY_HINT}"
            ) from None
        except (ValueError, RuntimeError) as exc:  # a malformed address, or a cluster Ray cannot join
            raise PosbiasError(
                f"cannot connect to the Ray cluster at {settings.ray_address!r} "
                f"({one_line(exc, typed=True)}); {RAY_HINT}"
            ) from None


RAY_LOGGERS = ("ray",)
"""Where Ray's Python notices come from (token authentication, usage stats, deprecations)."""


def quiet_ray() -> None:
    """Keep Ray's Python notices (e.g. "Token authentication is enabled for this Ray cluster") off the
    terminal: only its errors reach stderr. Its workers' output already stays in Ray's log folder
    (`log_to_driver` off); `--verbose` (`Settings.verbose`) shows both."""
    for name in RAY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.ERROR:
            logger.setLevel(logging.ERROR)
    # The driver's error listener prints the cluster's error notices ("(raylet) A worker died or was killed
    # ...") to stdout whatever `log_to_driver` says, into the middle of `posbias worker --json`'s output. They
    # go to Ray's logger instead (shown with --verbose); what they report reaches the user as the shard's
    # error. The listener looks the function up in its module when it prints, so replacing it there is enough.
    from ray._private import worker as ray_worker

    if hasattr(ray_worker, "print_to_stdstream"):
        ray_worker.print_to_stdstream = _to_ray_logger


def _to_ray_logger(data: dict[str, Any], ignore_prefix: bool = False) -> None:
    """Ray's error notices as records of its logger, not lines on stdout."""
    for line in data.get("lines", ()):
        logging.getLogger("ray").warning("(%s) %s", data.get("pid", "ray"), line)


def _probe(address: str, *, seconds: float) -> None:
    """Raise `PosbiasError` unless a TCP connection to the Ray `address` (`host:port` or `ray://host:port`)
    opens within `seconds`."""
    url = urlparse(address if "://" in address else f"ray://{address}")
    try:
        host, port = url.hostname, url.port
    except ValueError:
        host, port = None, None
    if not host or port is None:
        raise PosbiasError(
            f"{address[:200]!r} is not a Ray address: give local, auto, host:port or ray://host:port"
        )
    try:
        with socket.create_connection((host, port), timeout=seconds):
            return
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else one_line(exc, typed=True)
        raise PosbiasError(f"cannot reach the Ray cluster at {address!r} ({reason}); {RAY_HINT}") from None


def native_stderr_to_log() -> Callable[[], None] | None:
    """Point file descriptor 2 at a log file (`ray/posbias-native-PID.log` in the temporary folder) so that
    native code's writes to stderr stay off the terminal, while Python's `sys.stderr` (posbias's own lines)
    keeps writing to the terminal through a copy of the original descriptor. Returns what puts fd 2 back,
    or None where stderr is not this process's fd 2 (e.g. captured in this process by a test)."""
    import io
    import sys
    import tempfile

    try:
        if sys.stderr is None or sys.stderr.fileno() != 2:
            return None
    except (AttributeError, OSError, ValueError):
        return None
    folder = os.path.join(tempfile.gettempdir(), "ray")
    try:
        os.makedirs(folder, exist_ok=True)
        target = os.open(
            os.path.join(folder, f"posbias-native-{os.getpid()}.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
    except OSError:
        return None
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(target, 2)
    os.close(target)
    python_stderr = sys.stderr
    sys.stderr = io.TextIOWrapper(
        os.fdopen(os.dup(saved), "wb", buffering=0),
        encoding=python_stderr.encoding,
        errors="backslashreplace",
        line_buffering=True,
    )

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        sys.stderr = python_stderr

    return restore


class _RayWorkerWarnings(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "not the main thread" not in record.getMessage()


def _within(connect: Callable[[], object], *, seconds: float, address: str, quiet: bool = False) -> None:
    """Run `connect` (a `ray.init`), giving up after `seconds`: Ray keeps trying a GCS address that
    answers TCP but not as Ray for as long as it is let. The abandoned attempt stays in a daemon thread.

    With `quiet`, what Ray's native code writes to this process's stderr meanwhile (its GCS client's "Failed
    to connect to GCS" lines) goes to a log file instead (`native_stderr_to_log`)."""
    outcome: list[BaseException | None] = []

    def attempt() -> None:
        try:
            connect()
            outcome.append(None)
        except BaseException as exc:  # handed to the calling thread
            outcome.append(exc)

    warnings = _RayWorkerWarnings()
    logger = logging.getLogger("ray._private.worker")
    logger.addFilter(warnings)
    restore = native_stderr_to_log() if quiet else None
    try:
        thread = threading.Thread(target=attempt, name="ray-connect", daemon=True)
        thread.start()
        thread.join(max(seconds, 0.0))
    finally:
        logger.removeFilter(warnings)
    if restore is not None and outcome == [None]:
        restore()  # connected: Ray's native messages from now on are the user's business again
    if not outcome:
        raise PosbiasError(
            f"the Ray cluster at {address!r} did not answer within {max(seconds, 0):.0f} s (is it a Ray GCS "
            f"address?); {RAY_HINT}, or raise POSBIAS_RAY_CONNECT_SECONDS"
        )
    if outcome[0] is not None:
        raise outcome[0]
