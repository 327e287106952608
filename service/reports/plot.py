"""Plots of position curves a paper can use (matplotlib, no display needed): PNG, PDF or SVG, the format
checked before any work (`plot_format`).

What a reader needs is on the figure: lines labelled by what differs between them (batch size, filler
length, variant, model), one colour per variant when variants are overlaid, integer ticks on position axes,
a dashed chance line on the accuracy axis, `n` beside points that rest on few answers, and a legend entry
for each kind of shading (the pointwise 95% interval, and with `band` the simultaneous 95% band). Titles
name the model by its short name (a local path's last part). Text stays text in SVG and PDF files
(editable, searchable), not outlines.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posbias.schemas import BASELINE, Curve, PosbiasError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_FORMATS = ("png", "pdf", "svg")
SMALL_N = 20
"""Points resting on fewer answers than this (or than a quarter of the curve's median) show their n."""
_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
_STYLES = ("-", "--", ":", "-.")
_AXES = {
    "position": "question position in the prompt",
    "answer-slot": "answer slot (line of the answer in the output)",
    "filler-length": "filler tokens",
    "token-distance": "tokens from question to answer",
    "rope-distance": "positions (RoPE) from question to answer",
}


def plot_format(path: str | Path) -> str:
    """The format `path`'s suffix names (png, pdf or svg); `PosbiasError` naming the fix otherwise. A
    command checks this before it computes anything."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in PLOT_FORMATS:
        raise PosbiasError(
            f"a plot is a .png, .pdf or .svg file: give a path ending in one of them (got {str(path)[:80]})"
        )
    return suffix


def short_model(name: str) -> str:
    """A model's name for a title: a local folder's or file's last part (no `.gguf`); a hub id as it is."""
    if name.startswith(("/", "~", ".")) or "\\" in name or name.lower().endswith(".gguf"):
        return Path(name.rstrip("/")).name.removesuffix(".gguf").removesuffix(".GGUF") or name
    return name


def line_labels(curves: Sequence[Curve]) -> list[str]:
    """Each curve's legend label, naming only what differs between the curves: batch size, filler length,
    variant, model (the batch size when nothing does)."""
    parts: list[list[str]] = [[] for _ in curves]

    def differs(key: Any) -> bool:
        return len({key(c) for c in curves}) > 1

    if differs(lambda c: (c.model, c.revision)):
        for part, c in zip(parts, curves, strict=True):
            part.append(short_model(c.model) + (f"@{c.revision}" if c.revision else ""))
    if differs(lambda c: c.variant):
        for part, c in zip(parts, curves, strict=True):
            part.append(c.variant)
    if differs(lambda c: c.batch_size):
        for part, c in zip(parts, curves, strict=True):
            part.append(f"N = {c.batch_size}")
    if differs(lambda c: c.filler_tokens or 0):
        for part, c in zip(parts, curves, strict=True):
            part.append(f"filler {c.filler_tokens or 0:,} tokens")
    return [", ".join(p) if p else f"N = {c.batch_size}" for p, c in zip(parts, curves, strict=True)]


def curves_figure(
    curves: Sequence[Curve],
    *,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    band: bool = False,
    chance: float | None = None,
) -> Figure:
    """The figure `plot_curves` writes: one line per curve with its pointwise 95% interval shaded (and with
    `band` its simultaneous band, lighter); `chance` draws the chance line when the curves do not know it
    (curves by token distance)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import MaxNLocator

    if not curves:
        raise PosbiasError("nothing to plot: no curve has results")
    names = list(labels) if labels is not None else line_labels(curves)
    if len(names) != len(curves):
        raise PosbiasError(f"{len(names)} labels for {len(curves)} curves: give one label per curve")
    variants = list(dict.fromkeys(c.variant for c in curves))
    sizes = list(dict.fromkeys(c.batch_size for c in curves))
    by = curves[0].by
    figure = Figure(figsize=(8, 4.5), dpi=120)
    axes = figure.add_subplot()
    drew_band = drew_interval = False
    for index, (curve, name) in enumerate(zip(curves, names, strict=True)):
        points = [p for p in curve.points if p.accuracy is not None]
        if not points:
            continue
        if len(variants) > 1:  # a colour per variant, a line style per batch size
            colour = _PALETTE[variants.index(curve.variant) % len(_PALETTE)]
            style = _STYLES[sizes.index(curve.batch_size) % len(_STYLES)]
        else:
            colour, style = _PALETTE[index % len(_PALETTE)], "-"
        x = [p.x for p in points]
        y = [p.accuracy or 0.0 for p in points]
        axes.plot(
            x, y, color=colour, linestyle=style, marker="o" if len(points) < 30 else None, ms=3, label=name
        )
        low, high = [p.ci_low or 0.0 for p in points], [p.ci_high or 0.0 for p in points]
        if len(points) == 1:  # shading needs two points; one (batch size 1) gets an error bar
            below, above = max(0.0, y[0] - low[0]), max(0.0, high[0] - y[0])
            axes.errorbar(x, y, yerr=[[below], [above]], capsize=4, color=colour)
        else:
            axes.fill_between(x, low, high, alpha=0.25, linewidth=0, color=colour)
            drew_interval = True
            if band and all(p.band_low is not None and p.band_high is not None for p in points):
                band_low = [p.band_low or 0.0 for p in points]
                band_high = [p.band_high or 0.0 for p in points]
                axes.fill_between(x, band_low, band_high, alpha=0.09, linewidth=0, color=colour)
                drew_band = True
        _mark_small(axes, points, colour=colour)
    line = _chance(curves, given=chance)
    if line is not None:
        axes.axhline(line[0], color="grey", linestyle="--", linewidth=0.8, label=line[1])
    handles, texts = axes.get_legend_handles_labels()
    if drew_interval:
        handles.append(Patch(color="grey", alpha=0.35, linewidth=0))
        texts.append("shaded: pointwise 95% interval")
    if drew_band:
        handles.append(Patch(color="grey", alpha=0.12, linewidth=0))
        texts.append("light: simultaneous 95% band")
    elif band:
        texts.append("(no simultaneous band: too few points)")
        handles.append(Patch(alpha=0.0))
    axes.legend(handles, texts, fontsize=8)
    if by not in ("token-distance", "rope-distance"):
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(_AXES.get(by, by))
    axes.set_ylabel("accuracy (parsed answers)")
    axes.set_ylim(0, 1)
    axes.set_title(title or _title(curves))
    axes.grid(alpha=0.3)
    figure.tight_layout()
    return figure


def _title(curves: Sequence[Curve]) -> str:
    models = list(dict.fromkeys(short_model(c.model) for c in curves))
    words = [" vs ".join(models) + f": accuracy by {curves[0].by}"]
    sizes = {c.batch_size for c in curves}
    if len(sizes) == 1:
        words.append(f"N = {curves[0].batch_size}")
    variants = {c.variant for c in curves}
    if len(variants) == 1 and curves[0].variant != BASELINE:
        words.append(f"variant {curves[0].variant}")
    return ", ".join(words)


def _chance(curves: Sequence[Curve], *, given: float | None) -> tuple[float, str] | None:
    chances = [c.chance for c in curves if c.chance is not None]
    chance = sum(chances) / len(chances) if chances else given
    if chance is None or chance <= 0:
        return None
    options = 1 / chance
    if abs(options - round(options)) < 0.05:
        return chance, f"chance ({options:.0f} options)"
    return chance, f"chance ({chance:.2f})"


def _mark_small(axes: Any, points: Sequence[Any], *, colour: str) -> None:
    """Write n beside the points that rest on few answers, so a reader discounts them."""
    middle = statistics.median(p.n for p in points)
    for p in points:
        if p.n < SMALL_N or p.n < middle / 4:
            axes.annotate(
                f"n={p.n}",
                (p.x, p.accuracy or 0.0),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=6,
                color=colour,
            )


def plot_curves(
    curves: Sequence[Curve],
    *,
    path: str | Path,
    labels: Sequence[str] | None = None,
    title: str | None = None,
    band: bool = False,
    chance: float | None = None,
) -> Path:
    """Write `curves_figure(...)` to `path` (.png, .pdf or .svg). Returns the path."""
    plot_format(path)
    return _save(curves_figure(curves, labels=labels, title=title, band=band, chance=chance), Path(path))


def heatmap_figure(curves: Sequence[Curve], *, title: str | None = None) -> Figure:
    """Accuracy by filler length (rows) and position (columns), one panel per batch size, as
    needle-in-a-haystack studies draw depth x length: from the curves by position of a filler sweep (one per
    length; `posbias curve --by position`). Cells without parsed answers are blank."""
    import numpy as np
    from matplotlib.figure import Figure

    by_size: dict[int, list[Curve]] = {}
    for curve in curves:
        if curve.by == "position":
            by_size.setdefault(curve.batch_size, []).append(curve)
    if not by_size:
        raise PosbiasError("nothing to plot: no curve by position has results")
    figure = Figure(figsize=(4 + 3.5 * len(by_size), 4.5), dpi=120)
    panels = figure.subplots(1, len(by_size), squeeze=False)
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
        variants = {c.variant for c in found}
        axes.set_title(
            f"N = {n}"
            + (f", {found[0].variant}" if len(variants) == 1 and found[0].variant != BASELINE else "")
        )
    assert image is not None
    chances = [c.chance for c in curves if c.chance is not None]
    label = "accuracy (parsed answers)"
    if chances:
        label += f"; chance {sum(chances) / len(chances):.2f}"
    bar = figure.colorbar(image, ax=panels[0].tolist(), label=label)
    if chances:  # the chance level marked on the accuracy scale
        bar.ax.axhline(sum(chances) / len(chances), color="white", linestyle="--", linewidth=1.0)
    model = short_model(curves[0].model)
    figure.suptitle(title or f"{model}: accuracy by filler length x position")
    return figure


def plot_heatmap(curves: Sequence[Curve], *, path: str | Path, title: str | None = None) -> Path:
    """Write `heatmap_figure(...)` to `path` (.png, .pdf or .svg). Returns the path."""
    plot_format(path)
    return _save(heatmap_figure(curves, title=title), Path(path))


def _save(figure: Figure, out: Path) -> Path:
    import matplotlib

    # Text as text (editable in a paper's figure, searchable), not glyph outlines; TrueType in PDFs.
    style: dict[Any, Any] = {"svg.fonttype": "none", "pdf.fonttype": 42, "svg.hashsalt": "posbias"}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with matplotlib.rc_context(style):
            figure.savefig(out, format=plot_format(out), metadata=_metadata(out))
    except OSError as exc:
        raise PosbiasError(f"cannot write {out}: {exc.strerror}") from None
    return out


def _metadata(out: Path) -> dict[str, Any] | None:
    # No creation date in PDF and SVG files, so the same curves give the same file.
    return (
        {"CreationDate": None}
        if out.suffix.lower() == ".pdf"
        else {"Date": None}
        if out.suffix.lower() == ".svg"
        else None
    )
