"""`posbias report`: one self-contained HTML file of one or more jobs, that opens anywhere with no network.

It holds each job's summary and spec, its curves on every axis the design varies (each variant overlaid in its
own colour, the pointwise interval or the simultaneous band), explain's fits and verdict, the schedule strip
when a schedule ran it, a comparison when two jobs are given, and every answer, so that each point of each
chart leads to its trials; up to `max_trials` trials are embedded whole (prompt as sent, output, answers), the
others are named with the command that shows them. The viewer (`service/reports/viewer.py`) serves the same
pages from the store.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from posbias.schemas import PosbiasError
from posbias.service.reports import report_data, report_page
from posbias.service.reports.export import target
from posbias.service.reports.trial_view import trial_detail
from posbias.service.store import Database
from posbias.service.work import jobs as job_store

MAX_TRIALS = 200
"""Trials a report file embeds whole by default (a 50-question prompt is about 20 kB of text)."""


@dataclass(frozen=True)
class ReportFile:
    """What `write_report` wrote."""

    path: Path
    bytes: int
    job_ids: tuple[int, ...]
    trials_embedded: int
    """Trials whose prompt, output and answers are in the file."""
    trials_total: int
    """Trials with answers in the jobs: each is listed under its points, embedded or not."""


def check_out(path: Path, *, overwrite: bool) -> None:
    """`PosbiasError` naming the fix, before any work, when a report cannot be written at `path`."""
    if path.suffix.lower() not in {".html", ".htm"}:
        raise PosbiasError(f"a report is an HTML file: end --out in .html (got {path.name!r})")
    target(path, overwrite=overwrite)


def report_data_for(
    db: Database,
    job_ids: Sequence[int],
    *,
    max_trials: int = MAX_TRIALS,
    live: bool = False,
    cache_dir: Path | None = None,
) -> dict[str, Any]:
    """Everything one report page shows of `job_ids` (their comparison when there are two), with up to
    `max_trials` trials embedded whole, chosen evenly over each job's variants and batch sizes."""
    if not job_ids:
        raise PosbiasError("name a job to report on, e.g. `posbias report 3 --out report.html`")
    ids = list(dict.fromkeys(job_ids))
    records = [job_store.get(db, job_id) for job_id in ids]  # NotFoundError names the fix
    jobs = [report_data.job_report(db, job_id) for job_id in ids]
    data: dict[str, Any] = {
        "page": "report",
        "live": live,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "jobs": jobs,
        "comparisons": report_data.comparisons(db, records[0], records[1]) if len(ids) == 2 else [],
        "trials": {},
    }
    if not live:
        for job in jobs:
            picked = _spread(job["answers"]["rows"], limit=max_trials // len(jobs))
            job_id = job["summary"]["id"]
            for trial_id in picked:
                data["trials"][f"{job_id}:{trial_id}"] = trial_page(db, job_id, trial_id, cache_dir=cache_dir)
    return data


def _spread(rows: list[list[Any]], *, limit: int) -> list[int]:
    """Up to `limit` trial ids from answer rows, taken in turn from each (variant, batch size) group so
    that every chart's points lead to some embedded trials."""
    groups: dict[tuple[str, int], list[int]] = {}
    for trial_id, variant, batch_size, *_ in rows:
        group = groups.setdefault((variant, batch_size), [])
        if not group or group[-1] != trial_id:
            group.append(trial_id)
    picked: list[int] = []
    depth = 0
    while len(picked) < limit and any(depth < len(g) for g in groups.values()):
        for group in groups.values():
            if depth < len(group) and len(picked) < limit:
                picked.append(group[depth])
        depth += 1
    return picked


def trial_page(db: Database, job_id: int, trial_id: int, *, cache_dir: Path | None = None) -> dict[str, Any]:
    """One trial as its page shows it (`posbias trial`'s view without the token ids, which the page does
    not draw: each question's span and the window's reach come as character offsets)."""
    with db.read() as session:
        view = trial_detail(session, job_id, trial_id, cache_dir=cache_dir)
    data = view.model_dump(mode="json", exclude={"prompt_token_ids", "token_offsets"})
    data["prompt_tokens"] = None if view.prompt_token_ids is None else len(view.prompt_token_ids)
    return data


def title_of(job_ids: Sequence[int]) -> str:
    """A report page's title."""
    if len(job_ids) == 2:
        return f"posbias report: job {job_ids[0]} and job {job_ids[1]} compared"
    return "posbias report: " + ", ".join(f"job {job_id}" for job_id in job_ids)


def write_report(
    db: Database,
    job_ids: Sequence[int],
    *,
    path: Path,
    max_trials: int = MAX_TRIALS,
    overwrite: bool = False,
    cache_dir: Path | None = None,
) -> ReportFile:
    """Write the report of `job_ids` to `path` (an existing file only with `overwrite`), through a
    temporary file renamed over it, so a reader never sees half a report."""
    check_out(path, overwrite=overwrite)
    data = report_data_for(db, job_ids, max_trials=max_trials, cache_dir=cache_dir)
    page = report_page.render(data, title=title_of(list(dict.fromkeys(job_ids)))).encode("utf-8")
    fd, name = tempfile.mkstemp(dir=path.absolute().parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(page)
        os.chmod(name, 0o644)
        os.replace(name, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    trials = {row[0] for job in data["jobs"] for row in job["answers"]["rows"]}
    return ReportFile(
        path=path,
        bytes=len(page),
        job_ids=tuple(job["summary"]["id"] for job in data["jobs"]),
        trials_embedded=len(data["trials"]),
        trials_total=len(trials),
    )
