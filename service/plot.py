"""PNG plots of position curves (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posbias.schemas import Curve, PosbiasError


def plot_curves(
    curves: Sequence[Curve],
    *,
    path: str | Path,
    labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """One line per curve (accuracy by position) with its pointwise 95% interval shaded; chance level dashed,
    from the data's number of options. Curves of several variants are overlaid: one colour per batch size,
    one line style per variant.

    `labels` name the lines (default: the batch size, and the variant when there are several).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.suffix.lower() != ".png":
        raise PosbiasError(f"plots are PNG files: give a path ending in .png (got {out})")
    if not curves:
        raise PosbiasError("nothing to plot: no curve has results")
    variants = list(dict.fromkeys(c.variant for c in curves))
    sizes = list(dict.fromkeys(c.batch_size for c in curves))
    overlaid = len(variants) > 1
    if labels is not None:
        names = list(labels)
    else:
        names = [f"N = {c.batch_size}" + (f", {c.variant}" if overlaid else "") for c in curves]
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    by = curves[0].by
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=120)
    for curve, name in zip(curves, names, strict=True):
        points = [p for p in curve.points if p.accuracy is not None]
        if not points:
            continue
        x = [p.x for p in points]
        style: dict[str, Any] = {}
        if overlaid:
            style["color"] = colours[sizes.index(curve.batch_size) % len(colours)]
            style["linestyle"] = styles[variants.index(curve.variant) % len(styles)]
        (line,) = axes.plot(
            x,
            [p.accuracy or 0.0 for p in points],
            marker="o" if len(points) < 30 else None,
            ms=3,
            label=name,
            **style,
        )
        low = [p.ci_low or 0.0 for p in points]
        high = [p.ci_high or 0.0 for p in points]
        if len(points) == 1:  # a band needs two points; one (batch size 1) gets an error bar
            y = points[0].accuracy or 0.0
            axes.errorbar(x, [y], yerr=[[y - low[0]], [high[0] - y]], capsize=4, color=line.get_color())
        else:
            axes.fill_between(x, low, high, alpha=0.18, linewidth=0, color=line.get_color())
    chances = [c.chance for c in curves if c.chance is not None]
    if chances:
        chance = sum(chances) / len(chances)
        options = 1 / chance
        label = (
            f"chance ({options:.0f} options)"
            if abs(options - round(options)) < 0.05
            else f"chance ({chance:.2f})"
        )
        axes.axhline(chance, color="grey", linestyle="--", linewidth=0.8, label=label)
    axes.set_xlabel(
        {
            "position": "question position in the prompt",
            "answer-slot": "answer slot (line of the answer in the output)",
            "filler-length": "filler tokens",
        }.get(by, "tokens from question to answer")
    )
    axes.set_ylabel("accuracy")
    axes.set_ylim(0, 1)
    axes.set_title(title or f"{curves[0].model}: accuracy by {by}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(out)
    except OSError as exc:
        raise PosbiasError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        plt.close(figure)
    return out


def plot_heatmap(curves: Sequence[Curve], *, path: str | Path, title: str | None = None) -> Path:
    """Accuracy by filler length (rows) and position (columns), one panel per batch size, as
    needle-in-a-haystack studies draw depth x length: from the curves by position of a filler sweep (one per
    length; `posbias curve --by position`). Cells without parsed answers are blank."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    out = Path(path)
    if out.suffix.lower() != ".png":
        raise PosbiasError(f"plots are PNG files: give a path ending in .png (got {out})")
    by_size: dict[int, list[Curve]] = {}
    for curve in curves:
        if curve.by == "position":
            by_size.setdefault(curve.batch_size, []).append(curve)
    if not by_size:
        raise PosbiasError("nothing to plot: no curve by position has results")
    figure, panels = plt.subplots(
        1, len(by_size), figsize=(4 + 3.5 * len(by_size), 4.5), dpi=120, squeeze=False
    )
    image = None
    for axes, (n, found) in zip(panels[0], sorted(by_size.items()), strict=True):
        found = sorted(found, key=lambda c: c.filler_tokens or 0)
        grid = np.full((len(found), n), np.nan)
        for row, curve in enumerate(found):
            for point in curve.points:
                if point.accuracy is not None:
                    grid[row, point.position - 1] = point.accuracy
        image = axes.imshow(
            grid, aspect="auto", origin="lower", vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest"
        )
        axes.set_xticks(range(n), [str(p) if n <= 20 or p % 5 == 0 else "" for p in range(1, n + 1)])
        axes.set_yticks(range(len(found)), [f"{c.filler_tokens or 0:,}" for c in found])
        axes.set_xlabel("question position in the prompt")
        axes.set_ylabel("filler tokens")
        axes.set_title(f"N = {n}")
    assert image is not None
    figure.colorbar(image, ax=panels[0].tolist(), label="accuracy (parsed answers)")
    figure.suptitle(title or f"{curves[0].model}: accuracy by filler length x position")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        figure.savefig(out)
    except OSError as exc:
        raise PosbiasError(f"cannot write {out}: {exc.strerror}") from None
    finally:
        plt.close(figure)
    return out
