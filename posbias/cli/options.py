"""The options-by-position section `posbias explain` prints: why answers sit at chance, when they do."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from posbias.cli.common import out, pct

if TYPE_CHECKING:
    from posbias.schemas import OptionsView


def print_options(views: list[OptionsView]) -> None:
    """Per batch size, which options the answers choose at each position: the most chosen option's share
    against its share of gold answers, entropy, confidence, accuracy with the option prior removed, and
    what the positions near chance read as."""
    for v in views:
        table = Table(title=f"options by position - batch size {v.batch_size} ({v.options} options)")
        columns = ["position", "accuracy", "most chosen", "chosen", "gold", "entropy (bits)", "top p"]
        columns += ["prior removed (95% CI)", "reads as"]
        for column in columns:
            table.add_column(column, justify="right")
        for p in v.points:
            top = max(range(len(p.predicted_share)), key=lambda k: p.predicted_share[k])
            d = p.debiased_accuracy
            table.add_row(
                str(p.position),
                pct(p.accuracy),
                f"option {top + 1}",
                pct(p.predicted_share[top]),
                pct(p.gold_share[top]),
                "-" if p.entropy is None else f"{p.entropy:.2f}",
                pct(p.confidence),
                "-" if d is None else f"{pct(d.estimate)} ({pct(d.low)} to {pct(d.high)})",
                p.reading or "",
            )
        out.print(table)
        prior = (
            f"; option prior from {v.prior_trials} of {v.trials} trials (shuffled options)"
            if v.prior_trials
            else ""
        )
        out.print(f"chance {pct(v.chance)}{prior}")
        for line in v.readings:
            out.print(f"options: {line}")
        if v.note:
            out.print(f"note: {v.note}")
