"""The attention reduction of the `hf` engine on maps written by hand: every key lands in one region, the
masses are averaged over a line's query rows, and the mass beyond the window counts keys `window` or more
back."""

from __future__ import annotations

import torch

from posbias.workers.hf_attention import ANSWERS, INSTRUCTIONS, QUESTIONS, SINK, layout, reduce_layer


def test_each_key_counts_once_in_its_region_and_beyond_the_window() -> None:
    # 10 tokens: sink 0, instructions 1, question 1 at 2-3, question 2 at 4-5, instructions 6, answers 7-9.
    where = layout(
        10, sink_end=1, questions=[(2, 4), (4, 6)], answers_start=7, lines=[(1, [7, 8]), (2, [9])], window=4
    )
    weights = torch.zeros((2, 10, 10))
    weights[0, 7, [0, 2, 5, 7]] = torch.tensor([0.1, 0.2, 0.3, 0.4])
    weights[0, 8, [3, 4]] = torch.tensor([0.5, 0.5])
    weights[0, 9, [1, 6, 9]] = torch.tensor([0.25, 0.25, 0.5])
    weights[1] = weights[0].flip(0).flip(1)  # any second head; only head 0 is checked by value
    masses = reduce_layer(weights, where)
    line1, line2 = masses.regions[0, 0], masses.regions[1, 0]
    assert torch.allclose(line1[SINK], torch.tensor(0.05))
    assert torch.allclose(line1[QUESTIONS], torch.tensor(0.35))  # (0.2 + 0.5) / 2 rows
    assert torch.allclose(line1[QUESTIONS + 1], torch.tensor(0.4))  # (0.3 + 0.5) / 2
    assert torch.allclose(line1[ANSWERS], torch.tensor(0.2))
    assert torch.allclose(line2[INSTRUCTIONS], torch.tensor(0.5)) and torch.allclose(
        line2[ANSWERS], torch.tensor(0.5)
    )
    # Row 7: keys 0..3 are 4+ back (0.1 + 0.2); row 8: keys 0..4 (0.5 + 0.5); row 9: keys 0..5 (0.25).
    assert masses.beyond is not None
    assert torch.allclose(masses.beyond[0, 0], torch.tensor((0.3 + 1.0) / 2))
    assert torch.allclose(masses.beyond[1, 0], torch.tensor(0.25))
