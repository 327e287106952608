"""`posbias worker`: run the dispatcher here."""

from __future__ import annotations

from typing import Annotated

import typer

import posbias
from posbias.cli.common import JsonOpt, err, out, print_json, settings_of


def register(app: typer.Typer) -> None:
    """Add `worker` to the app."""
    app.command()(worker)


def worker(
    ctx: typer.Context,
    ray_address: Annotated[
        str | None, typer.Option(help="local (start Ray here), auto (this node's cluster) or an address.")
    ] = None,
    until_empty: Annotated[bool, typer.Option(help="Exit once no job has unfinished work.")] = False,
    max_jobs: Annotated[
        int | None, typer.Option(help="Exit after this many jobs finish.", min=1, max=1_000_000)
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the dispatcher: lease shards from the queue, run them on Ray actors, write the results.

    Example: posbias worker --ray-address auto --until-empty
    """
    settings = settings_of(ctx)
    if ray_address is not None:
        settings = settings.model_copy(update={"ray_address": ray_address})

    def banner(store: str) -> None:
        # Once the store and Ray are reached: a bad one is the command's one line, with no banner before it.
        if not as_json:
            err.print(f"worker: queue {store}, Ray {settings.ray_address}")

    summary = posbias.dispatch(settings=settings, until_empty=until_empty, max_jobs=max_jobs, on_ready=banner)
    if as_json:
        print_json(
            {
                "owner": summary.owner,
                "shards_written": summary.shards_written,
                "shards_failed": summary.shards_failed,
                "shards_discarded": summary.shards_discarded,
                "trials_done": summary.trials_done,
                "results_written": summary.results_written,
                "model_loads": summary.loads,
                "seconds": round(summary.seconds, 3),
                "rates": {
                    "trials_per_second": round(summary.trials_per_second, 3),
                    "results_per_second": round(summary.results_per_second, 3),
                    "engine_seconds": round(summary.engine_seconds, 3),
                    "store_seconds": round(summary.store_seconds, 3),
                    "store_rows_per_second": round(summary.store_rows_per_second, 1),
                },
                "interrupted": summary.interrupted,
            }
        )
        return
    out.print(
        f"worker done: {summary.shards_written} shards written ({summary.trials_done} trials), "
        f"{summary.shards_failed} failed, {summary.shards_discarded} discarded, "
        f"{sum(summary.loads.values())} model loads, {summary.seconds:.1f}s"
    )
    if summary.shards_written:
        out.print(
            f"rates: {summary.trials_per_second:,.2f} trials/s, {summary.results_per_second:,.1f} results "
            f"written/s; {summary.engine_seconds:.1f}s in the engine, {summary.store_seconds:.2f}s in the "
            f"store ({summary.store_rows_per_second:,.0f} rows/s)"
        )
