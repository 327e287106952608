"""The three causes `posbias explain` weighs (position, answer slot and token distance), per parsed answer:
the regression rows that its joint fit (`service/explain.py`) and its window step (`service/window_step.py`)
read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posbias.service.intervals import LEVEL
from posbias.service.regression import difficulty
from posbias.service.trial_data import Floats, Ints, TrialData

ALPHA = 1 - LEVEL
"""The size of every test of `posbias explain`: one minus the level of its intervals."""
PER_TOKENS = 1000.0
NAMES = ("position", "answer slot", "token distance")


@dataclass(frozen=True)
class Answers:
    """The parsed answers of a `TrialData` as regression rows."""

    y: Floats
    causes: dict[str, Floats]
    """Relative position, relative slot, distance per 1,000 tokens (NaN-free)."""
    distance: Floats
    """Token distance (tokens)."""
    cluster: Ints
    difficulty: Floats | None


def answers(data: TrialData) -> Answers:
    """The rows the fits use: every parsed answer with a recorded distance (all of them, for an engine that
    reports token offsets)."""
    rows, cols = np.nonzero(data.parsed > 0)
    n = data.batch_size
    distance = data.distance[rows, cols] if data.distance is not None else np.full(rows.size, np.nan)
    keep = np.isfinite(distance) if np.isfinite(distance).any() else np.ones(rows.size, dtype=bool)
    rows, cols, distance = rows[keep], cols[keep], distance[keep]
    y = data.correct[rows, cols]
    position = cols / (n - 1) if n > 1 else np.zeros(rows.size)
    slot_of = data.slot[rows, cols] if data.slot is not None else cols + 1.0
    lines = data.lines[rows] if data.lines is not None else np.full(rows.size, float(n))
    with np.errstate(invalid="ignore", divide="ignore"):
        slot = np.where(lines > 1, (slot_of - 1) / np.maximum(lines - 1, 1), 0.0)
    slot = np.where(np.isfinite(slot), slot, 0.0)
    adjust = difficulty(data, rows, cols) if data.cluster_unit == "trial" else None
    return Answers(
        y=y,
        causes={
            "position": position.astype(np.float64),
            "answer slot": slot.astype(np.float64),
            "token distance": np.nan_to_num(distance) / PER_TOKENS,
        },
        distance=np.nan_to_num(distance),
        cluster=data.cluster[rows],
        difficulty=adjust if adjust is not None and np.ptp(adjust) > 0 else None,
    )
