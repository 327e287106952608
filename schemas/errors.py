"""The one error type every part of posbias raises for a problem the user can fix."""

from __future__ import annotations


class PosbiasError(Exception):
    """A problem with the user's input or environment, with a message that names the fix.

    The CLI prints the message as one line and exits non-zero; anything else that escapes is a bug and
    gets a traceback.
    """


class NotFoundError(PosbiasError):
    """A job, shard, model or schedule that the user named does not exist."""


class ConflictError(PosbiasError):
    """The request is valid but the stored state forbids it (e.g. cancelling a finished job)."""


def first_line(exc: BaseException) -> str:
    """The first non-empty line of `exc`'s message, or the exception type's name when it has none: how a
    caught error is quoted inside a one-line message."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def last_line(exc: BaseException) -> str:
    """The last non-empty line of `exc`'s message, or the exception type's name when it has none: the cause,
    when the message carries a remote traceback (as Ray Client's refusals do)."""
    for line in reversed(str(exc).splitlines()):
        if line.strip():
            return line.strip()
    return type(exc).__name__
