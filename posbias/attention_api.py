"""The attention evidence of `hf` jobs, from Python: `attention_curves` reads how much of each answer line's
attention went to its own question (and elsewhere), per layer kind; `plot_attention` draws it."""

from __future__ import annotations

from pathlib import Path

from posbias.api import _settings, _store
from posbias.schemas import BASELINE
from posbias.schemas.attention import AttentionCurve, AttentionExplanation
from posbias.service.settings import Settings
from posbias.service.stats import attention_curve, attention_explain


def attention_curves(
    target: int | str,
    *,
    settings: Settings | None = None,
    batch_size: int | None = None,
    variant: str | None = None,
    by: str = "position",
    bin_width: int = 64,
) -> list[AttentionCurve]:
    """One curve per (job, variant, batch size, layer kind) of a job (an id) or every `hf` job of a model
    (a name): attention masses by position, or by token distance in bins of `bin_width` (`by`:
    `position` or `token-distance`). `NotFoundError` when there are none."""
    job_id, model = (target, None) if isinstance(target, int) else (None, target)
    with _store(_settings(settings), read_only=True) as db:
        return attention_curve.attention_curves(
            db, job_id=job_id, model=model, batch_size=batch_size, variant=variant, by=by, bin_width=bin_width
        )


def plot_attention(curves: list[AttentionCurve], *, path: str | Path) -> None:
    """A PNG of `curves`: own-question attention, one panel per layer kind."""
    attention_curve.plot_attention(curves, path=Path(path))


def attention_explanations(
    job_ids: int | list[int], *, settings: Settings | None = None, variant: str = BASELINE
) -> list[AttentionExplanation]:
    """The attention section of `explain` for each `hf` job among, or paired (same trials) with, `job_ids`:
    own-question attention by token distance per layer kind, and the within-position AUROC of that
    attention for what the paired job answered correctly. `NotFoundError` when there is none."""
    ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
    with _store(_settings(settings), read_only=True) as db:
        return attention_explain.explain_attention(db, ids, variant=variant)
