"""The API behind a number: one trial as sent and answered (`trial`), and a job's answers and trials as
pandas DataFrames (`results`, `trials`) with the columns and types of its Parquet export; and the check of a
plot's format before any work (`plot_format`).

    import posbias

    answers = posbias.results(3)                    # one row per answer
    answers.groupby(["variant", "position"]).correct.mean()
    prompts = posbias.trials(3, variant="global-only")  # one row per trial, its raw output included
    view = posbias.trial(3, int(answers.trial_id[0]))   # the prompt token for token, spans, answers
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from posbias import edge
from posbias.schemas.bounds import INT64_MAX
from posbias.schemas.trial import TrialView
from posbias.service.settings import Settings

if TYPE_CHECKING:
    import pandas as pd


@edge.public
def trial(
    job: int,
    trial: int,
    *,
    variant: str | None = None,
    tokens: bool = True,
    settings: Settings | None = None,
) -> TrialView:
    """Trial `trial` (its id, `trial_id` in `results(job)`) of job `job`: the prompt exactly as the engine
    was sent it (rebuilt from the stored plan with the model's tokenizer and chat template, and checked
    against the token counts and spans the worker stored: `check`), each question's token span and how far
    its answer's sliding window reaches back, the raw output, and every answer's parse status, prediction,
    gold, correctness and option probabilities. With `variant`, the same trial as that variant answered it;
    `tokens=False` leaves out the prompt's token ids and each token's characters (`prompt_token_ids`,
    `token_offsets`: about 10,000 of each for a 50-question prompt). `NotFoundError` when the job, the
    trial or the variant is not there."""
    from posbias.service.reports import trial_detail

    job_id = edge.job_id(job)
    trial_id = edge.whole(trial, what="trial id", low=1, high=INT64_MAX)
    name = None if variant is None else edge.text(variant, what="variant")
    resolved = edge.resolve_settings(settings)
    with edge.open_store(resolved, read_only=True) as db, db.read() as session:
        return trial_detail(
            session, job_id, trial_id, variant=name, cache_dir=resolved.cache_dir, tokens=tokens
        )


@edge.public
def results(
    job: int,
    *,
    variant: str | None = None,
    batch_size: int | None = None,
    settings: Settings | None = None,
) -> pd.DataFrame:
    """Every answer of job `job` (optionally one variant, one batch size): one row per (trial, position), with
    the job's model, the variant, the design and the filler as columns, typed as in `export_results`'s Parquet
    file (`posbias.service.reports.export.RESULT_COLUMNS`; integers that may be missing are pandas' `Int64`).
    `NotFoundError` when there is no such job."""
    from posbias.service.reports import export

    with edge.open_store(edge.resolve_settings(settings), read_only=True) as db:
        table = export.results_table(
            db, edge.job_id(job), variant=_variant(variant), batch_size=edge.batch_size(batch_size)
        )
    return export.to_pandas(table)


@edge.public
def trials(
    job: int,
    *,
    variant: str | None = None,
    batch_size: int | None = None,
    settings: Settings | None = None,
) -> pd.DataFrame:
    """Every trial of job `job` (optionally one variant, one batch size): one row per trial with its status,
    prompt and output lengths, the model's raw output and its parsed and correct answers, with the job's
    model, the variant, the design and the filler as columns (`posbias.service.reports.export.TRIAL_COLUMNS`).
    `NotFoundError` when there is no such job."""
    from posbias.service.reports import export

    with edge.open_store(edge.resolve_settings(settings), read_only=True) as db:
        table = export.trials_table(
            db, edge.job_id(job), variant=_variant(variant), batch_size=edge.batch_size(batch_size)
        )
    return export.to_pandas(table)


@edge.public
def plot_format(path: str | Path) -> str:
    """The format a plot at `path` is written in (png, pdf or svg, from its suffix); `PosbiasError` naming
    the fix for any other (a check that needs nothing computed, made before the work)."""
    from posbias.service.reports import plot

    return plot.plot_format(edge.path(path, what="path"))


def _variant(value: Any) -> str | None:
    return None if value is None else edge.text(value, what="variant")
