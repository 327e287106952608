"""Plots a paper can use, checked on the figure objects and the SVG text (not pixels): lines labelled by what
differs, a colour per variant, the band drawn only when asked and the legend naming each shading, integer
position ticks, short model names, a chance line on the accuracy axis (given when the curves lack it), n
beside thin points, PNG, PDF and SVG with the format refused before anything is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.collections import PolyCollection

from posbias.schemas import Curve, CurvePoint, PosbiasError
from posbias.service.reports import plot


def _curve(
    *,
    batch_size: int = 5,
    variant: str = "baseline",
    filler: int | None = None,
    model: str = "/home/someone/models/gemma-2-2b-it",
    by: str = "position",
    n: tuple[int, ...] = (40, 40, 40, 40, 3),
    chance: float | None = 0.25,
) -> Curve:
    points = []
    for i, count in enumerate(n, start=1):
        accuracy = 0.3 + 0.1 * i
        points.append(
            CurvePoint(
                batch_size=batch_size,
                position=i,
                x=float(i) if by != "token-distance" else 64.0 * i - 32,
                n=count,
                n_parsed=count,
                n_correct=round(accuracy * count),
                accuracy=accuracy,
                ci_low=accuracy - 0.1,
                ci_high=accuracy + 0.1,
                band_low=accuracy - 0.2,
                band_high=accuracy + 0.2,
                parse_rate=1.0,
                accuracy_strict=accuracy,
            )
        )
    return Curve(
        model=model,
        job_ids=(1,),
        variant=variant,
        batch_size=batch_size,
        by=by,
        filler_tokens=filler,
        points=tuple(points),
        chance=chance,
    )


def _legend(figure: Any) -> list[str]:
    return [t.get_text() for t in figure.axes[0].get_legend().get_texts()]


def test_a_filler_sweep_is_labelled_by_filler_length_not_by_its_one_batch_size() -> None:
    figure = plot.curves_figure([_curve(filler=0), _curve(filler=512), _curve(filler=2048)])
    assert _legend(figure)[:3] == ["filler 0 tokens", "filler 512 tokens", "filler 2,048 tokens"]
    assert figure.axes[0].get_title() == "gemma-2-2b-it: accuracy by position, N = 5"


def test_variants_get_a_colour_each_and_batch_sizes_a_line_style() -> None:
    curves = [_curve(batch_size=n, variant=v) for v in ("baseline", "global-only") for n in (5, 10)]
    figure = plot.curves_figure(curves)
    lines = [line for line in figure.axes[0].get_lines() if line.get_label() in plot.line_labels(curves)]
    assert [line.get_label() for line in lines] == [
        "baseline, N = 5",
        "baseline, N = 10",
        "global-only, N = 5",
        "global-only, N = 10",
    ]
    colours = [line.get_color() for line in lines]
    assert colours[0] == colours[1] != colours[2] == colours[3]
    styles = [line.get_linestyle() for line in lines]
    assert styles[0] == styles[2] != styles[1] == styles[3]


def test_the_band_is_drawn_only_when_asked_and_the_legend_names_each_shading() -> None:
    curves = [_curve()]
    plain = plot.curves_figure(curves)
    banded = plot.curves_figure(curves, band=True)
    shaded = [c for c in plain.axes[0].collections if isinstance(c, PolyCollection)]
    both = [c for c in banded.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(shaded) == 1 and len(both) == 2
    assert "shaded: pointwise 95% interval" in _legend(plain)
    assert "light: simultaneous 95% band" not in _legend(plain)
    assert "light: simultaneous 95% band" in _legend(banded)
    # The band is wider than the interval at every point.
    band = both[1].get_paths()[0].vertices[:, 1]
    interval = both[0].get_paths()[0].vertices[:, 1]
    assert band.max() > interval.max() and band.min() < interval.min()


def test_positions_tick_at_whole_numbers_and_thin_points_show_their_n() -> None:
    figure = plot.curves_figure([_curve(n=(40, 40, 40, 40, 40, 40, 2))])
    ticks = [t for t in figure.axes[0].get_xticks() if 1 <= t <= 7]
    assert ticks and all(float(t).is_integer() for t in ticks)
    notes = [t.get_text() for t in figure.axes[0].texts]
    assert notes == ["n=2"]


def test_a_token_distance_plot_gets_the_chance_line_it_is_given() -> None:
    distance = _curve(by="token-distance", chance=None)
    without = plot.curves_figure([distance])
    assert not any(t.startswith("chance") for t in _legend(without))
    given = plot.curves_figure([distance], chance=0.25)
    assert "chance (4 options)" in _legend(given)
    [line] = [line for line in given.axes[0].get_lines() if line.get_label().startswith("chance")]
    assert set(line.get_ydata()) == {0.25}
    assert given.axes[0].get_xlabel() == "tokens from question to answer"


def test_svg_keeps_its_text_pdf_and_png_are_written(tmp_path: Path) -> None:
    curves = [_curve(variant="baseline"), _curve(variant="global-only")]
    svg = plot.plot_curves(curves, path=tmp_path / "c.svg", band=True).read_text()
    for text in ("global-only", "baseline", "light: simultaneous 95% band", "chance (4 options)", "n=3"):
        assert text in svg
    assert (plot.plot_curves(curves, path=tmp_path / "c.pdf").read_bytes()).startswith(b"%PDF")
    assert (plot.plot_curves(curves, path=tmp_path / "c.png").read_bytes()).startswith(b"\x89PNG")
    heat = plot.plot_heatmap([_curve(filler=0), _curve(filler=512)], path=tmp_path / "h.svg").read_text()
    assert "gemma-2-2b-it: accuracy by filler length x position" in heat and "chance 0.25" in heat


@pytest.mark.parametrize("name", ["c.jpg", "c", "c.png.txt"])
def test_another_format_is_refused_before_anything_is_drawn(tmp_path: Path, name: str) -> None:
    with pytest.raises(PosbiasError, match=r"a plot is a \.png, \.pdf or \.svg file"):
        plot.plot_curves([], path=tmp_path / name)  # no curves: the format is checked first
    assert list(tmp_path.iterdir()) == []


def test_short_model_names() -> None:
    assert plot.short_model("/models/llama/") == "llama"
    assert plot.short_model("~/m/SmolLM2-135M-Instruct-Q8_0.gguf") == "SmolLM2-135M-Instruct-Q8_0"
    assert plot.short_model("google/gemma-2-2b-it") == "google/gemma-2-2b-it"
