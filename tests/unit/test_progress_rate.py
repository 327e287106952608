"""The rate `posbias run` shows beside its progress bar is trials done over the time since the start, so a
burst of shards written at once (as the dispatcher writes them) does not show as hundreds of thousands of
trials a second (rich's own `speed` divides by the time between its samples: 586,102 trials/s was seen)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from posbias.cli.submit import _ProgressBar


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_of_shards_shows_the_mean_rate_since_the_start() -> None:
    clock = Clock()
    bar = _ProgressBar(model="demo", quiet=False, clock=clock)
    submitted: Any = SimpleNamespace(job_id=1, trials=48)
    bar.start(submitted)
    try:
        clock.now = 10.0
        bar.advance(SimpleNamespace(trials=[0] * 24))  # type: ignore[arg-type]
        clock.now = 10.000001  # the next shard of the same write, a microsecond later
        bar.advance(SimpleNamespace(trials=[0] * 24))  # type: ignore[arg-type]
        assert bar._bar is not None
        assert bar._bar.tasks[0].fields["rate"] == "4.80 trials/s"
    finally:
        bar.stop()
