"""`explain`'s attention section on hand-built rows: bands by token distance per layer kind, the decay
within the window, what the global layers carry beyond it, and an AUROC within position whose value is known
by hand (and differs from the AUROC that ignores position)."""

from __future__ import annotations

from typing import Any

import pytest

from posbias.schemas import LayerKind
from posbias.service.stats.attention_explain import Scored, auroc_interval, pooled_auroc, summarise

WINDOW = 8


def row(trial: int, position: int, kind: str, distance: int, own: float, query: int = 1) -> dict[str, Any]:
    return {
        "query_tokens": query,
        "trial": trial,
        "batch_size": 2,
        "position": position,
        "layer_kind": kind,
        "token_distance": distance,
        "own_mean": own,
        "own_max": 2 * own,
    }


def test_the_auroc_is_taken_within_position_and_pooled_by_pairs() -> None:
    # Position 1: correct 0.9, 0.7 against wrong 0.8: 1 of 2 pairs right. Position 2: correct 0.2 against
    # wrong 0.1, 0.3: 1 of 2. Pooled within position: 2/4 = 0.5. Ignoring position it would be 6/9 (the
    # score and correctness both fall with position), which is the confound the stratification removes.
    answers = [
        Scored(0, 2, 1, True, 0.9),
        Scored(1, 2, 1, True, 0.7),
        Scored(2, 2, 1, False, 0.8),
        Scored(0, 2, 2, True, 0.2),
        Scored(1, 2, 2, False, 0.1),
        Scored(2, 2, 2, False, 0.3),
    ]
    assert pooled_auroc(answers) == (0.5, 2, 3, 3)
    assert pooled_auroc([Scored(a.trial, a.batch_size, 1, a.correct, a.score) for a in answers])[0] == (
        pytest.approx(6 / 9)
    )
    # A perfect score, with a tie counted half.
    perfect = [Scored(i, 2, 1, i < 3, float(10 - i)) for i in range(6)]
    assert pooled_auroc(perfect)[0] == 1.0
    tied = [Scored(0, 2, 1, True, 1.0), Scored(1, 2, 1, False, 1.0), Scored(2, 2, 1, False, 0.0)]
    assert pooled_auroc(tied)[0] == 0.75
    # A cell with one class only adds nothing.
    assert pooled_auroc([Scored(0, 2, 1, True, 1.0), Scored(1, 2, 1, True, 0.0)]) == (None, 0, 0, 0)


def test_the_bootstrap_by_trial_interval_holds_the_estimate() -> None:
    answers = [
        Scored(t, 2, p, (t + p) % 3 != 0, ((t * 7 + p * 3) % 10) / 10) for t in range(30) for p in (1, 2)
    ]
    value = pooled_auroc(answers)[0]
    interval = auroc_interval(answers, resamples=300)
    assert value is not None and interval is not None
    low, high = interval
    assert 0.0 <= low <= value <= high <= 1.0 and high - low > 0.05
    # Below 16 trials the cluster bootstrap does not hold its level: no interval.
    assert auroc_interval([a for a in answers if a.trial < 15], resamples=300) is None


def test_the_section_reads_the_decay_in_the_window_and_the_global_layers_beyond_it() -> None:
    rows = [
        # trial 0 answers position 1 correctly and attends to it more, in both kinds; trial 1 does not.
        row(0, 1, "sliding", 1, 0.4),
        row(0, 1, "global", 1, 0.2),
        row(1, 1, "sliding", 2, 0.2),
        row(1, 1, "global", 2, 0.1),
        row(0, 2, "sliding", 5, 0.1),
        row(1, 2, "sliding", 6, 0.1),
        row(0, 2, "sliding", 10, 0.0),
        # Its question ends 9 tokens before the answer token, but the line's first token is only 6 past it:
        # inside the window for part of the line, so not counted as wholly beyond.
        row(1, 2, "sliding", 9, 0.05, query=4),
        row(0, 2, "global", 10, 0.05),
        row(1, 2, "global", 20, 0.03),
    ]
    correct = {(0, 1): True, (1, 1): False, (0, 2): True, (1, 2): True}
    e = summarise(rows, correct, model="m", job_id=2, scored_job_id=1, variant="baseline", window=WINDOW)
    bands = {(b.layer_kind, b.low, b.high): (b.n, b.own_mean) for b in e.bands}
    assert bands[LayerKind.sliding, 0, 4] == (2, pytest.approx(0.3))
    assert bands[LayerKind.sliding, 4, 8] == (2, pytest.approx(0.1))
    assert bands[LayerKind.sliding, 8, 16] == (2, pytest.approx(0.025))
    assert bands[LayerKind.global_, 16, None] == (1, pytest.approx(0.03))
    assert e.decay_within_window == pytest.approx(1 / 3)
    assert e.global_beyond == pytest.approx(0.04) and e.sliding_beyond_max == 0.0
    aurocs = {a.layer_kind: a for a in e.aurocs}
    # Position 1 is the only cell with both classes: the correct trial attends more, in both kinds.
    assert aurocs[LayerKind.sliding].auroc == aurocs[LayerKind.global_].auroc == 1.0
    assert aurocs[LayerKind.global_].strata == 1 and e.note is None

    unscored = summarise(
        rows, None, model="m", job_id=2, scored_job_id=None, variant="baseline", window=WINDOW
    )
    assert unscored.aurocs == () and unscored.note is not None and "answer_sheet" in unscored.note
