"""`posbias report` (one self-contained HTML file of jobs) and `posbias view` (the same pages served live
from the store, read-only, on this machine)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

import posbias
from posbias.cli.common import err, id_parser, out, settings_of
from posbias.cli.errors import BadUsage


def register(app: typer.Typer) -> None:
    """Add `report` and `view` to the app."""
    app.command()(report)
    app.command()(view)


def report(
    ctx: typer.Context,
    jobs: Annotated[
        list[int],
        typer.Argument(
            help="Job ids; two are also compared.", parser=id_parser("job id"), show_default=False
        ),
    ],
    output: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")],
    force: Annotated[bool, typer.Option("--force", help="Replace --out if it is an existing file.")] = False,
    max_trials: Annotated[
        int,
        typer.Option(
            help="Trials the file shows, a sample spread evenly over each job's variants and batch sizes: "
            "each embedded whole (prompt, output, answers) and listed under its points. The curves count "
            "every answer; `posbias view` lists every trial.",
            min=0,
            max=100_000,
        ),
    ] = 100,
) -> None:
    """Write one HTML file that opens anywhere with no network (scripts, styles and charts inlined): each
    job's summary and spec; accuracy by position per batch size with the pointwise 95% interval or the
    simultaneous band (a toggle), parse rate and strict accuracy; variants overlaid in their own colours (a
    toggle); answer-slot, token-distance and filler views and the filler heatmap where the design has
    them; explain's table and verdict; a schedule's checkpoints as a strip; the comparison of two jobs.
    Click any point for its trials, and a trial for its prompt as sent and its output. The file shows a
    stated sample of a larger job's trials (--max-trials), so its size stays bounded whatever the job's.

    Example: posbias report 3 7 --out report.html
    """
    if output.suffix.lower() not in {".html", ".htm"}:
        raise BadUsage(f"a report is an HTML file: end --out in .html (got {output.name!r})")
    try:
        written = posbias.report(
            jobs, out=output, settings=settings_of(ctx), max_trials=max_trials, overwrite=force
        )
    except posbias.OutputExists as exc:
        raise BadUsage(str(exc)) from None
    out.print(
        f"wrote {written.path} ({written.bytes / 1e6:.1f} MB): job {', '.join(map(str, written.job_ids))}, "
        f"{written.trials_embedded} of {written.trials_total} trials shown"
    )


def view(
    ctx: typer.Context,
    port: Annotated[
        int, typer.Option(help="Port on 127.0.0.1 to listen on (0: a free one).", min=0, max=65535)
    ] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", help="Do not log each request on stderr.")] = False,
) -> None:
    """Serve the store's jobs as web pages on this machine, read-only: the job list with running jobs'
    progress, each job's report (as `posbias report` writes it), and any two jobs compared. Every trial of
    every point is read from the store when clicked, and a page is built once per change of the store,
    however many ask for it. The database is opened read-only and the server answers only GET; Ctrl-C
    stops it.

    Example: posbias view --port 8765   (then open http://127.0.0.1:8765/)
    """
    log = None if quiet else (lambda line: err.print(line, markup=False, highlight=False))
    with posbias.viewer(settings=settings_of(ctx), port=port, log=log) as running:
        out.print(f"posbias view: {running.url} (read-only; Ctrl-C stops)")
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how a viewer is stopped
            running.serve_forever()
