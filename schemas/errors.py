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
