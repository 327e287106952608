"""A report's HTML: one self-contained page (style, script and data inlined) that the report file and the
viewer both serve.

The charts are drawn in the browser by a small hand-written SVG renderer (`report_assets/report.js`), not
a vendored chart library: it is a few hundred lines the project owns, needs no build step or package data
beyond two text files, and cannot fetch anything. The page's Content-Security-Policy says so to the
browser too: nothing may be loaded from anywhere (`default-src 'none'`); the viewer's pages may fetch from
the viewer itself (`connect-src 'self'`) for trial pages and progress.
"""

from __future__ import annotations

import html
import json
import math
from functools import cache
from importlib.resources import files
from typing import Any

_FILE_POLICY = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
LIVE_POLICY = _FILE_POLICY + "; connect-src 'self'; form-action 'self'"
"""The viewer's Content-Security-Policy header: its pages may reach the viewer, nothing else."""


@cache
def _asset(name: str) -> str:
    return (files("posbias.service.reports") / "report_assets" / name).read_text(encoding="utf-8")


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity as None: JSON has neither, and the page's parser refuses them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def script_json(data: Any) -> str:
    """`data` as JSON that cannot end a <script> element early (every `<`, `>` and `&` escaped)."""
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:  # a NaN or an infinity somewhere: walk the whole of it (a 1M-result job's: 0.1 s)
        text = json.dumps(_finite(data), separators=(",", ":"), allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def sample_note(data: dict[str, Any]) -> str:
    """The line that says which of its jobs' trials a report file shows (empty for the viewer's pages,
    which read every trial from the store)."""
    samples = [(job["summary"]["id"], job["sample"]) for job in data.get("jobs", []) if job.get("sample")]
    if not samples:
        return ""
    said = "; ".join(
        f"job {job_id}: no answered trials yet"
        if not s["total"]
        else f"job {job_id}: all {s['total']:,} trials shown"
        if s["shown"] == s["total"]
        else f"job {job_id}: {s['shown']:,} of {s['total']:,} trials shown"
        for job_id, s in samples
    )
    if all(s["shown"] == s["total"] for _, s in samples):
        return f'<p class="sample">{html.escape(said)}.</p>'
    return (
        f'<p class="sample">{html.escape(said)} (spread evenly over each variant and batch size; each '
        "embedded whole, and listed under the points it answered). The curves count every answer. "
        "<code>posbias view</code> lists every trial of a point; <code>posbias trial JOB TRIAL</code> shows "
        "one.</p>"
    )


def render(data: dict[str, Any], *, title: str, live: bool = False) -> str:
    """The page for `data` (what `service/reports/report.py` gathers): the viewer's (`live`) pages may fetch
    from it; a report file's may not fetch at all."""
    policy = LIVE_POLICY if live else _FILE_POLICY
    home = '<a href="/">all jobs</a> · ' if live else ""
    made = html.escape(str(data.get("generated_at", "")))
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)}</title><style>{_asset('report.css')}</style></head>\n<body>"
        f"<header><h1>{html.escape(title)}</h1><div>{home}posbias, {made}</div>{sample_note(data)}</header>"
        '<main id="app"></main>'
        '<section id="point-trials" class="panel" hidden></section>'
        '<section id="trial" class="panel" hidden></section>'
        f'<script id="posbias-data" type="application/json">{script_json(data)}</script>'
        f"<script>{_asset('report.js')}</script></body></html>\n"
    )
