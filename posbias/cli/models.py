"""`posbias models`: the architecture facts stored for every model with results."""

from __future__ import annotations

import json

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, out, print_json, settings_of, text


def register(app: typer.Typer) -> None:
    """Add `models` to the app."""
    app.command()(models)


def models(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stored model metadata: layers, sliding window and which layers use it, RoPE base, context. A model
    run with config changes (a job's variant) has a row of its own, as vLLM built it.

    Example: posbias models --json
    """
    found = posbias.models(settings=settings_of(ctx))
    if as_json:
        print_json([m.model_dump(mode="json") for m in found])
        return
    table = Table(title="models")
    for column in (
        "model",
        "revision",
        "architecture",
        "layers",
        "sliding window",
        "window layers",
        "RoPE base",
        "context",
        "parameters",
        "config changes",
    ):
        table.add_column(column)
    for m in found:
        layers = ",".join(map(str, m.sliding_window_layers)) if m.sliding_window_layers else ""
        table.add_row(
            m.name,
            m.revision or "",
            m.architecture or "",
            text(m.num_layers),
            text(m.sliding_window),
            layers,
            text(m.rope_theta),
            text(m.context_length),
            f"{m.num_parameters:,}" if m.num_parameters else "",
            json.dumps(m.hf_overrides, separators=(",", ":"))[:80] if m.hf_overrides else "",
        )
    out.print(table if found else "no models yet: they are recorded when a job's first results arrive")
