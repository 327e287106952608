"""A diagnosis as one self-contained HTML page: the verdict per suspect, each line's finding with its
interval, every number linked to the job it comes from (as `posbias view` serves it: `/job/<id>`, and for
a variant `/compare?a=<id>:baseline&b=<id>:<variant>`)."""

from __future__ import annotations

import html

from posbias.schemas import Interval
from posbias.schemas.diagnosis import Diagnosis, Finding

STYLE = (
    "body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:.3em .6em;vertical-align:top;text-align:left}"
    ".implicated{background:#fde2e1}.ruled-out{background:#e3f4e1}.cannot-tell{background:#fff6d6}"
)


def diagnosis_page(diagnosis: Diagnosis, *, base_url: str = "") -> str:
    """The page's HTML; links are relative to `base_url` (a viewer's address, or empty)."""
    rows = []
    for verdict in diagnosis.suspects:
        span = len(verdict.findings)
        for i, finding in enumerate(verdict.findings):
            head = (
                f'<td rowspan="{span}">{html.escape(verdict.suspect.value)}</td>'
                f'<td rowspan="{span}" class="{_cls(verdict.call.value)}"><b>{verdict.call.value}</b><br>'
                f"{html.escape(verdict.agreement)}</td>"
                if i == 0
                else ""
            )
            rows.append(
                f"<tr>{head}<td>{finding.line.value}</td>"
                f'<td class="{_cls(finding.call.value)}">{finding.call.value}</td>'
                f"<td>{html.escape(finding.measure)}</td><td>{_number(finding, base_url)}</td>"
                f"<td>{html.escape(finding.reason)}</td></tr>"
            )
    jobs = ", ".join(f'<a href="{base_url}/job/{j}">{j}</a>' for j in diagnosis.job_ids)
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>diagnosis of "
        f"{html.escape(diagnosis.model)}</title><style>{STYLE}</style></head><body>"
        f"<h1>Diagnosis of {html.escape(diagnosis.model)}</h1>"
        f"<p>{html.escape(diagnosis.summary)} Batch size {diagnosis.batch_size}; jobs {jobs}.</p>"
        "<table><tr><th>suspect</th><th>verdict</th><th>line</th><th>call</th><th>measure</th>"
        "<th>effect (points, 95%)</th><th>why</th></tr>" + "".join(rows) + "</table></body></html>\n"
    )


def interval_text(effect: Interval | None) -> str:
    """`-29.8 (-35.1 to -24.5)`; empty for none."""
    if effect is None or effect.estimate is None:
        return ""
    if effect.low is None or effect.high is None:
        return f"{effect.estimate:+.1f}"
    return f"{effect.estimate:+.1f} ({effect.low:+.1f} to {effect.high:+.1f})"


def _number(finding: Finding, base_url: str) -> str:
    text = interval_text(finding.effect) or (f"+/-{finding.bound:.1f}" if finding.bound is not None else "")
    if not finding.job_ids or not text:
        return html.escape(text)
    job = finding.job_ids[0]
    href = (
        f"{base_url}/compare?a={job}:baseline&amp;b={job}:{html.escape(finding.variant)}"
        if finding.variant
        else f"{base_url}/job/{job}"
    )
    return f'<a href="{href}">{html.escape(text)}</a> (job {job})'


def _cls(call: str) -> str:
    return call.replace(" ", "-")
