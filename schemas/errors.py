"""The one error type every part of posbias raises for a problem the user can fix."""

from __future__ import annotations

import errno


class PosbiasError(Exception):
    """A problem with the user's input or environment, with a message that names the fix.

    The CLI prints the message as one line and exits non-zero; anything else that escapes is a bug and
    gets a traceback.
    """


class UsageError(PosbiasError):
    """An argument or input the caller must change before anything is tried (the command's exit code 2):
    a value out of range, of the wrong type, or a revision that does not exist."""


class NotFoundError(PosbiasError):
    """A job, shard, model or schedule that the user named does not exist."""


class ModelNotCheckedWarning(UserWarning):
    """Submit could not tell whether the model exists (no hub to ask, not in the local cache): the job goes
    on, and its workers will find out."""


class RotationCostWarning(UserWarning):
    """The rotation design multiplies the number of prompts by the batch size."""


class ConflictError(PosbiasError):
    """The request is valid but the stored state forbids it (e.g. cancelling a finished job)."""


class RetryableError(PosbiasError):
    """A failure that a later attempt may not meet, e.g. GPUs still held by an engine that is shutting
    down: the work goes back to the queue with the message as its reason, and its job is not failed."""


MAX_QUOTE = 500
"""Characters of an error message quoted in a one-line message at most."""


def one_line(exc: BaseException, *, typed: bool = False) -> str:
    """`exc` quoted on one line, the one way posbias quotes a caught error inside its own messages.

    The error a wrapper carries is quoted instead of the wrapper (Ray's task errors keep the worker's
    exception in `cause`); pydantic's report is reduced to its first problem; a message that carries a
    remote traceback (as Ray Client's refusals do) is reduced to its last line, the cause; any other message
    has its lines joined. `typed` puts the exception's type first (`ValueError: ...`), for errors that are
    not posbias's own. Long messages are cut at `MAX_QUOTE` characters; an empty one is the type's name.
    """
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    text = _message(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in text and lines:
        flat = lines[-1]
    else:
        flat = " ".join(" ".join(lines).split())
    if len(flat) > MAX_QUOTE:
        flat = flat[: MAX_QUOTE - 3] + "..."
    name = type(exc).__name__
    if not flat:
        return name
    return f"{name}: {flat}" if typed and not isinstance(exc, PosbiasError) else flat


def _message(exc: BaseException) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":  # pydantic: its first problem
        try:
            first = errors()[0]
            return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
        except (IndexError, KeyError, TypeError):
            pass
    return str(exc)


def foreign_problem(exc: BaseException) -> str | None:
    """What a failure that is not posbias's own but is no bug either means, on one line that names the fix:
    an `OSError` (a full disk, a permission, a missing file), input nested too deeply to read, or no memory
    left. None for anything else. The API raises these as `PosbiasError`s and the command prints them, so
    both say the same."""
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno == errno.ENOSPC:
            return f"no space left on the device{where}: free some space and run the command again"
        if exc.errno in {errno.EACCES, errno.EPERM, errno.EROFS}:
            return f"{exc.strerror}{where}: check its permissions, or choose another path"
        return f"{exc.strerror or one_line(exc, typed=True)}{where}"
    if isinstance(exc, RecursionError):
        return "the input nests too deeply to be read (rerun with --debug to see where)"
    if isinstance(exc, MemoryError):
        return "out of memory: the input or the job is too large for this machine"
    return None
