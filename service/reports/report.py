"""`posbias report`: one self-contained HTML file of one or more jobs, that opens anywhere with no network.

It holds each job's summary and spec, its curves on every axis the design varies (each variant overlaid in its
own colour, the pointwise interval or the simultaneous band), explain's fits and verdict, the schedule strip
when a schedule ran it, and a comparison when two jobs are given: every aggregate computed from every answer.
Its trials are a stated sample (`answer_lists.trial_sample`: up to `max_trials`, spread evenly), each embedded
whole (prompt as sent, output, answers) and listed under the points it answered, so that a page's size and
cost do not grow with the job. The viewer (`service/reports/viewer.py`) serves the same pages from the
store, where every trial of every point is read on demand.
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
from posbias.service.reports import answer_lists, report_data, report_page
from posbias.service.reports.export import target
from posbias.service.reports.report_views import SharedReads
from posbias.service.reports.trial_view import prompt_tokenizer, trial_detail
from posbias.service.store import Database
from posbias.service.work import jobs as job_store
from posbias.workers.engine import Encoding, Tokenizer

MAX_TRIALS = 100
"""Trials a report file shows by default: each embedded whole, about 60 kB for a 50-question prompt (its
text, output and answers), so a report's trials stay under about 6 MB whatever the job's size."""


@dataclass(frozen=True)
class ReportFile:
    """What `write_report` wrote."""

    path: Path
    bytes: int
    job_ids: tuple[int, ...]
    trials_embedded: int
    """Trials the file shows (its sample): each embedded whole and listed under the points it answered."""
    trials_total: int
    """Trials with answers in the jobs."""


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
    """Everything one report page shows of `job_ids` (their comparison when there are two). A report file
    (not `live`) carries a sample of each job's trials (`max_trials` shared between the jobs, spread evenly
    over each job's variants and batch sizes): each embedded whole and its answers listed under their
    points. A `live` page (the viewer's) carries none: it reads a point's answers and a trial from the
    viewer when clicked."""
    if not job_ids:
        raise PosbiasError("name a job to report on, e.g. `posbias report 3 --out report.html`")
    ids = list(dict.fromkeys(job_ids))
    records = [job_store.get(db, job_id) for job_id in ids]  # NotFoundError names the fix
    reads = SharedReads()  # every view reads each job's answers once
    jobs = [report_data.job_report(db, job_id, reads=reads) for job_id in ids]
    data: dict[str, Any] = {
        "page": "report",
        "live": live,
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "jobs": jobs,
        "comparisons": report_data.comparisons(db, records[0], records[1], reads=reads)
        if len(ids) == 2
        else [],
        "trials": {},
    }
    del reads  # the answers' arrays are not needed for the trials
    if live:
        return data
    for record, job in zip(records, jobs, strict=True):
        sample = answer_lists.trial_sample(db, record.id, limit=max_trials // len(jobs))
        job["sample"] = {"shown": len(sample.trial_ids), "total": sample.total}
        job["answers"] = {
            "columns": list(answer_lists.ANSWER_COLUMNS),
            "rows": answer_lists.sample_answers(db, sample.trial_ids),
        }
        # One tokenizer for the job's trials (a model's takes seconds to load), each prompt encoded once.
        tokenizer = prompt_tokenizer(record.spec, cache_dir=cache_dir) if sample.trial_ids else None
        once = EncodedOnce(tokenizer) if tokenizer is not None else None
        for trial_id in sample.trial_ids:
            data["trials"][f"{record.id}:{trial_id}"] = trial_page(
                db, record.id, trial_id, cache_dir=cache_dir, tokenizer=once
            )
    return data


class EncodedOnce:
    """`tokenizer`, encoding each prompt once: rendering a trial encodes its prompt for the token ids and
    the spans, and its view encodes the same text again for each token's characters (the fake engine's
    tokenizer takes about 10 ms a 50-question prompt)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._last: tuple[str, bool, Encoding] | None = None

    def has_chat_template(self) -> bool:
        return self._tokenizer.has_chat_template()

    def apply_chat_template(self, user_text: str) -> str:
        return self._tokenizer.apply_chat_template(user_text)

    @property
    def prompt_bos_id(self) -> int | None:
        return self._tokenizer.prompt_bos_id

    def encode(self, text: str, *, add_special_tokens: bool) -> Encoding:
        last = self._last
        if last is not None and last[1] == add_special_tokens and last[0] == text:
            return last[2]
        found = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        self._last = (text, add_special_tokens, found)
        return found


def trial_page(
    db: Database,
    job_id: int,
    trial_id: int,
    *,
    cache_dir: Path | None = None,
    tokenizer: Tokenizer | None = None,
) -> dict[str, Any]:
    """One trial as its page shows it (`posbias trial`'s view without the token ids, which the page does
    not draw: each question's span and the window's reach come as character offsets); rendered with
    `tokenizer`, else the job's model's (see `trial_detail`)."""
    with db.read() as session:
        view = trial_detail(session, job_id, trial_id, tokenizer=tokenizer, cache_dir=cache_dir, tokens=False)
    data = view.model_dump(mode="json", exclude={"prompt_token_ids", "token_offsets"})
    data["prompt_tokens"] = view.check.rebuilt_prompt_tokens
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
    return ReportFile(
        path=path,
        bytes=len(page),
        job_ids=tuple(job["summary"]["id"] for job in data["jobs"]),
        trials_embedded=len(data["trials"]),
        trials_total=sum(job["sample"]["total"] for job in data["jobs"]),
    )
