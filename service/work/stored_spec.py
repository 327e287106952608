"""A job's stored spec read back. A module of its own, apart from the shards built from it, so that a view
that only reads a job (`posbias trial`, export) does not import the answer sheets and costs a shard needs."""

from __future__ import annotations

import warnings
from typing import Any

from posbias.schemas import JobSpec, RotationCostWarning


def load_spec(data: dict[str, Any]) -> JobSpec:
    """A stored spec back as a `JobSpec`. Its rotation-cost warning was shown at submit; not again here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RotationCostWarning)
        return JobSpec.model_validate(data)
