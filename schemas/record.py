"""The one base of every posbias record."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """Base of every record posbias stores, sends between the driver and a worker, or returns from its API.

    Unknown keys are errors, so a typo in a spec file or a stale field never passes silently; values are
    immutable, so a record that has been validated stays valid.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
