"""The public API's reports: a self-contained HTML file of one or more jobs (`report`) and the local,
read-only viewer that serves the same pages from the store (`viewer`). `posbias/__init__.py` exports both.

    import posbias

    posbias.report([3, 7], out="report.html")      # jobs 3 and 7, and their comparison
    with posbias.viewer(port=8765) as view:        # http://127.0.0.1:8765/
        view.serve_forever()
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from posbias.api import _settings, _store
from posbias.service.reports import MAX_TRIALS, ReportFile, Viewer, check_out, open_read_only, write_report
from posbias.service.settings import Settings


def report(
    job_ids: int | Collection[int],
    *,
    out: str | Path,
    settings: Settings | None = None,
    max_trials: int = MAX_TRIALS,
    overwrite: bool = False,
) -> ReportFile:
    """Write one HTML file at `out` that shows `job_ids` (and compares them, when there are two) with no
    network: summary and spec, curves on every axis the design varies with the pointwise interval or the
    band, parse rate and strict accuracy, variants overlaid, the filler heatmap, explain's table and
    verdict, the schedule strip, every one computed from every answer; every point leads to its trials
    among a stated sample of up to `max_trials` (spread evenly over each job's variants and batch sizes),
    each embedded whole, so the file's size does not grow with the jobs'. An existing file is replaced
    only with `overwrite` (else `OutputExists`); `out` is checked before any work."""
    ids = [job_ids] if isinstance(job_ids, int) else list(job_ids)
    path = Path(out)
    check_out(path, overwrite=overwrite)
    settings = _settings(settings)
    with _store(settings, read_only=True) as db:
        return write_report(
            db, ids, path=path, max_trials=max_trials, overwrite=overwrite, cache_dir=settings.cache_dir
        )


def viewer(
    *,
    settings: Settings | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    log: Callable[[str], None] | None = None,
) -> Viewer:
    """A viewer of the store, listening on `host`:`port` (0: a free port; `Viewer.url` says which) on a
    read-only connection; `serve_forever()` answers requests here, `start()` in a thread, `close()` stops.
    Every trial of every point is read from the store on demand; a page is built once per change of the
    store, however many ask for it at once. `log` is called with each request's line."""
    settings = _settings(settings)
    db = open_read_only(settings.database_url)
    try:
        return Viewer(db, host=host, port=port, cache_dir=settings.cache_dir, log=log)
    except BaseException:
        db.close()
        raise
