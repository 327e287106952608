"""Attention curves of `hf` jobs: how much of an answer line's attention goes to its own question, by
position or by token distance, per layer kind (sliding or global), read from the `attention` table."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from posbias.schemas import NotFoundError
from posbias.schemas.attention import AttentionCurve, AttentionCurvePoint, LayerKind
from posbias.service.store import Database
from posbias.workers.engines import every

AXES = ("position", "token-distance")
_MASSES = ("own_mean", "own_max", "sink_mean", "other_mean", "instructions_mean", "answers_mean")


def attention_curves(
    db: Database,
    *,
    job_id: int | None = None,
    model: str | None = None,
    batch_size: int | None = None,
    variant: str | None = None,
    by: str = "position",
    bin_width: int = 64,
) -> list[AttentionCurve]:
    """One curve per (job, variant, batch size, layer kind) of the `hf` jobs asked for (a job, or every
    job of a model). `NotFoundError` when there are none."""
    if by not in AXES:
        raise ValueError(f"by must be one of {', '.join(AXES)}")
    x = "a.position" if by == "position" else f"(a.token_distance / {int(bin_width)})"
    filters = ["1 = 1"]
    params: dict[str, object] = {}
    for column, value in (("a.job_id", job_id), ("jobs.model", model), ("a.batch_size", batch_size)):
        if value is not None:
            name = column.split(".")[1]
            filters.append(f"{column} = :{name}")
            params[name] = value
    if variant is not None:
        filters.append("a.variant = :variant")
        params["variant"] = variant
    if by == "token-distance":
        filters.append("a.token_distance IS NOT NULL")
    averages = ", ".join(f"avg(a.{name})" for name in _MASSES)
    query = f"""
        SELECT jobs.model, a.job_id, a.variant, a.batch_size, a.layer_kind, {x} AS x, count(*),
            count(DISTINCT a.trial_id), avg(a.token_distance), {averages},
            avg(a.beyond_window_mean), max(a.beyond_window_max)
        FROM attention AS a JOIN jobs ON jobs.id = a.job_id
        WHERE {" AND ".join(filters)}
        GROUP BY jobs.model, a.job_id, a.variant, a.batch_size, a.layer_kind, x
        ORDER BY a.job_id, a.variant, a.batch_size, a.layer_kind, x
    """
    with db.read() as session:
        rows = session.execute(sa.text(query), params).all()
    if not rows:
        recorders = [engine.name for engine in every() if engine.records_attention]
        raise NotFoundError(
            f"no attention figures for that: run a job with engine {' or '.join(recorders)} "
            f"(engine: {{name: {recorders[0]}}})"
        )
    curves: dict[tuple[str, int, str, int, str], list[AttentionCurvePoint]] = {}
    for row in rows:
        model_name, job, name, size, kind, bucket = row[:6]
        n, trials, distance = row[6:9]
        masses = dict(zip(_MASSES, row[9:15], strict=True))
        centre = float(bucket) if by == "position" else (int(bucket) + 0.5) * bin_width
        curves.setdefault((model_name, job, name, size, kind), []).append(
            AttentionCurvePoint(
                x=centre,
                n=n,
                trials=trials,
                token_distance=None if distance is None else float(distance),
                beyond_window_mean=None if row[15] is None else float(row[15]),
                beyond_window_max=None if row[16] is None else float(row[16]),
                **{key: float(value) for key, value in masses.items()},
            )
        )
    return [
        AttentionCurve(
            model=model_name,
            job_id=job,
            variant=name,
            batch_size=size,
            layer_kind=LayerKind(kind),
            by=by,
            bin_width=bin_width if by == "token-distance" else None,
            points=tuple(points),
        )
        for (model_name, job, name, size, kind), points in curves.items()
    ]


def plot_attention(curves: Sequence[AttentionCurve], *, path: Path) -> None:
    """A PNG: own-question attention (head mean) against position or token distance, one panel per layer
    kind, one line per (job, variant, batch size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = sorted({c.layer_kind for c in curves}, key=lambda k: k.value, reverse=True)
    figure, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4), squeeze=False)
    for axis, kind in zip(axes[0], kinds, strict=True):
        for c in curves:
            if c.layer_kind is kind:
                label = f"job {c.job_id} {c.variant} N={c.batch_size}"
                axis.plot([p.x for p in c.points], [p.own_mean for p in c.points], marker="o", label=label)
        axis.set_title(f"{kind.value} layers")
        axis.set_xlabel("position" if curves[0].by == "position" else "token distance (bin centre)")
        axis.set_ylabel("attention on own question (head mean)")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
