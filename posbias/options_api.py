"""Options by position, in the public API: which options a job's answers choose at each position, and
whether answers near chance are a collapse onto one option, a guess, or confident and wrong."""

from __future__ import annotations

from collections.abc import Collection

from posbias import edge
from posbias.api import _settings, _store
from posbias.schemas import BASELINE, OptionsView
from posbias.service.reports import curves as curve_reports
from posbias.service.settings import Settings


@edge.public
def options_by_position(
    job_ids: int | Collection[int],
    *,
    settings: Settings | None = None,
    batch_size: int | None = None,
    variant: str = BASELINE,
) -> list[OptionsView]:
    """Which options a job's answers choose at each position, per batch size: the share of each predicted
    option against each gold option, the entropy of the option probabilities, the mean top probability,
    accuracy with the model's option prior removed (PriDe; needs shuffled options), and a reading of
    positions near chance (`a collapse onto option 4`, `a guess`, `confident and wrong`). `NotFoundError`
    when there are no results."""
    given = (
        [job_ids] if isinstance(job_ids, int) else edge.typed(job_ids, Collection, what="job_ids", kind="ids")
    )
    ids = [edge.job_id(i) for i in given]
    batch_size = edge.batch_size(batch_size)
    variant = edge.text(variant, what="variant")
    with _store(_settings(settings), read_only=True) as db:
        return curve_reports.options(db, ids, batch_size=batch_size, variant=variant)
